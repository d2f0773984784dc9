"""distlab.scale: a real model laid out by PyTorch's parallel code on simulated ranks.

The FLOPs, collectives and bytes a simulated rank reports are checked against counts by hand
for a small Llama (vocab 1024, hidden 256, 4 layers, 8 heads, 2 key-value heads), and against
each other across layouts (a tensor-parallel rank does half the matmul work of a data-parallel
one; a pipeline's first and last stages differ as they should).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import distlab
from distlab import scale
from distlab.calculators import CalculatorError, Transformer
from distlab.calculators.models import stage_layers

SMALL = Transformer("small", vocab=1024, hidden=256, intermediate=896, layers=4, heads=8,
                    kv_heads=2)


def _simulate_each(cases):
    """One simulated rank per case, ``(model, layout, stage)``, each in a process of its own."""

    def run(cases):
        from distlab.scale import simulate_rank

        model, layout, stage = cases[int(os.environ["RANK"])]
        return simulate_rank(model, layout, stage)

    return distlab.launch(run, cases, world_size=len(cases), backend=None, timeout=240,
                          threads=1)


@pytest.fixture(scope="module")
def small():
    L = scale.Layout
    cases = {
        "dp": (SMALL, L(dp=2, seq_len=128), 0),
        "tp": (SMALL, L(dp=2, tp=2, seq_len=128), 0),
        "tp no sp": (SMALL, L(dp=2, tp=2, seq_len=128, sequence_parallel=False), 0),
        "pp first": (SMALL, L(dp=2, pp=2, seq_len=128), 0),
        "pp last": (SMALL, L(dp=2, pp=2, seq_len=128), 1),
        "hsdp": (SMALL, L(replicate=2, dp=2, seq_len=128), 0),
        "ddp": (SMALL, L(dp=2, zero=0, seq_len=128), 0),
        "cp": (SMALL, L(dp=2, cp=2, seq_len=256), 0),
    }
    return dict(zip(cases, _simulate_each(list(cases.values())), strict=True))


@pytest.mark.quick
def test_stages_split_126_layers_on_16_as_the_llama3_paper():
    sizes = [len(r) for r in stage_layers(126, 16)]
    assert sizes == [7] + [8] * 14 + [7]
    assert [len(r) for r in stage_layers(32, 4)] == [8] * 4
    assert [len(r) for r in stage_layers(10, 4)] == [2, 3, 3, 2]
    assert stage_layers(126, 16)[0] == range(0, 7) and stage_layers(126, 16)[-1] == range(119, 126)
    assert scale.distinct_stages(126, 16) == [0, 1, 15]
    assert scale.distinct_stages(10, 4) == [0, 1, 3] and scale.distinct_stages(8, 1) == [0]
    with pytest.raises(CalculatorError, match="at least one layer each"):
        stage_layers(4, 7)
    # a layer a stage: the first and last may hold only the embedding and the output layer,
    # as the paper's 126 layers on 16 ranks x 8 stages; not when a stage holds more
    assert [len(r) for r in stage_layers(126, 128)] == [0] + [1] * 126 + [0]
    assert [len(r) for r in stage_layers(4, 5)] == [0, 1, 1, 1, 1]
    with pytest.raises(CalculatorError, match="do not fill pp=6"):
        stage_layers(8, 6)  # [0, 2, 2, 2, 2, 0] would leave the ends two layers lighter


@pytest.mark.quick
@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(dp=4, ep=3), "ep=3 must divide dp=4"),
        (dict(cp=3, seq_len=8192), "does not split into cp=3"),
        (dict(checkpointing="some"), "checkpointing='some' is not one of"),
        (dict(tp=0), "tp must be a whole number >= 1"),
        # one stage per rank is not interleaving: torch's schedule would run it as 1F1B's
        # warm-up of a two-stage rank (issue 52)
        (dict(pp=2, schedule="Interleaved1F1B"), "set virtual_stages=2 .or more., or "
                                                 "schedule='1F1B'"),
        (dict(pp=2, virtual_stages=2), "set schedule='Interleaved1F1B', or virtual_stages=1"),
    ],
)
def test_a_layout_that_cannot_work_says_why(kwargs, message):
    with pytest.raises(CalculatorError, match=message):
        scale.Layout(**kwargs)


@pytest.mark.quick
@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(zero=1), "FSDP2 has no ZeRO-1"),
        (dict(zero=2), "reshard_after_forward=False"),
        (dict(precision="bf16-mixed"), "precision=.bf16-fsdp2."),
        (dict(loss="fused"), "loss='upcast'"),
    ],
)
def test_a_layout_the_calculators_model_but_fsdp2_does_not_run_is_refused_by_the_simulator(
        kwargs, message):
    layout = scale.Layout(seq_len=128, **kwargs)  # a layout: the calculators take it
    assert layout.memory(SMALL).peak > 0
    with pytest.raises(CalculatorError, match=message):
        scale.simulate_rank(SMALL, layout)


@pytest.mark.quick
def test_an_interleaved_layout_takes_only_what_torchs_schedule_runs():
    """torch's ScheduleInterleaved1F1B runs microbatches // pp rounds and refuses a count that
    does not fill them (its own ValueError, deep in a simulation); the layout says so first and
    what to choose instead, each of which it takes."""
    interleaved = dict(pp=2, seq_len=128, schedule="Interleaved1F1B", virtual_stages=2)
    with pytest.raises(CalculatorError, match=r"microbatches=5: .* 2 rounds .* in 3, 4, 6$"):
        scale.Layout(microbatches=5, **interleaved)
    for m in (1, 2, 3, 4, 6, 8):
        assert scale.Layout(microbatches=m, **interleaved).microbatches == m
    scale.Layout(microbatches=5, pp=2, seq_len=128)  # 1F1B takes any count


@pytest.mark.quick
def test_what_the_model_does_not_allow_is_refused_before_any_process_starts():
    with pytest.raises(CalculatorError, match="does not divide the 8 key-value heads"):
        scale.lay_out("Llama-3 8B", scale.Layout(tp=16))
    with pytest.raises(CalculatorError, match="Llama-3 8B is dense .no experts."):
        scale.lay_out("Llama-3 8B", scale.Layout(dp=8, ep=8))
    with pytest.raises(CalculatorError, match="choose seq_len divisible by cp x tp"):
        scale.lay_out(SMALL, scale.Layout(tp=2, cp=2, seq_len=130))


def _matmul_flops(model, tokens: int, tp: int, *, output: bool) -> int:
    """Forward + backward matmul FLOPs by hand: 2 per multiply-add, backward twice forward."""
    dense, _ = model.layer_parameters(tp)
    dense -= 2 * model.hidden  # the norms multiply nothing
    per_token = dense * model.layers + (model.vocab // tp * model.hidden if output else 0)
    return 3 * 2 * per_token * tokens


def test_flops_are_the_ranks_own_work_counted_by_hand(small):
    s, h, a = 128, 256, 8
    # attention: q k^T and p v, 2 s^2 d per head each, over the whole causal square (as torch's
    # formula counts it); backward: 5 such matmuls
    attention = lambda heads, q, k: (2 + 5) * 2 * heads * q * k * (h // a) * 4  # noqa: E731
    assert small["dp"].flops == _matmul_flops(SMALL, s, 1, output=True) + attention(8, s, s)
    # tensor parallelism: every matmul split by 2, the output layer too (loss parallelism)
    assert small["tp"].flops == _matmul_flops(SMALL, s, 2, output=True) + attention(4, s, s)
    assert small["tp"].flops * 2 == small["dp"].flops
    # context parallelism: half the queries against every key
    assert small["cp"].flops == _matmul_flops(SMALL, s, 1, output=True) + attention(8, s, 2 * s)
    # a pipeline's first stage has half the layers and no output layer
    first = 3 * 2 * (SMALL.layer_parameters(1)[0] - 2 * h) * 2 * s + attention(8, s, s) // 2
    assert small["pp first"].flops == first


def test_collectives_are_counted_with_their_bytes_on_the_right_mesh_dimension(small):
    dense, _ = SMALL.layer_parameters(1)
    embedding = output = SMALL.vocab * SMALL.hidden
    units = [embedding] + [dense] * 4 + [output + SMALL.hidden]  # FSDP's units, whole
    dp = small["dp"].comm()
    # forward gathers every unit; backward those freed after forward (not the last block, not
    # the output layer); every gathered unit is bf16 on the wire; gradients reduce in fp32
    assert dp["dp", "all_gather"] == (6 + 4, 2 * (sum(units) + sum(units[:4])))
    assert dp["dp", "reduce_scatter"] == (6, 4 * sum(units))
    assert set(dp) == {("dp", "all_gather"), ("dp", "reduce_scatter")}
    tp = small["tp"].comm()
    sbh = 128 * 256 * 2  # one microbatch's activations in bf16
    # sequence parallelism: per layer 2 all-gathers and 2 reduce-scatters of sbh forward and as
    # many backward; the embedding reduce-scatters its output, the output layer gathers its input
    assert tp["tp", "all_gather"] == (4 * 4 + 2, (4 * 4 + 2) * sbh)
    assert tp["tp", "reduce_scatter"] == (4 * 4 + 2, (4 * 4 + 2) * sbh)
    # all-reduces: the 9 norms' weight gradients (sequence shards each hold part of them) and
    # loss parallelism's 3 (max, sum of exponentials, the targets' logits)
    assert tp["tp", "all_reduce"][0] == 9 + 3
    no_sp = small["tp no sp"].comm()
    # without sequence parallelism: Megatron's f and g, one all-reduce of sbh per column-row
    # pair forward and one backward, 2 pairs per layer, plus the embedding's and the output's
    assert no_sp["tp", "all_reduce"][0] == 4 * 4 + 2 + 3
    assert ("tp", "all_gather") not in no_sp
    hsdp = small["hsdp"].comm()
    assert hsdp["replicate", "all_reduce"] == (6, 2 * sum(units))  # fp32, over replicas
    assert small["ddp"].comm() == {("dp", "all_reduce"): (6, 4 * sum(units))}
    cp = small["cp"].comm()
    kv = 128 * 64 * 2  # one rank's k (or v): its tokens x kv heads x head dim, bf16
    # k and v of both ranks gathered in every layer; their gradients reduce-scattered back
    assert cp["cp", "all_gather"] == cp["cp", "reduce_scatter"] == (2 * 4, 2 * 4 * 2 * kv)


def test_state_bytes_are_the_real_shards(small):
    whole = SMALL.parameters()
    assert small["dp"].numel == whole // 2
    assert (small["dp"].params, small["dp"].grads, small["dp"].optimizer) == (
        4 * whole // 2, 4 * whole // 2, 8 * whole // 2)
    assert small["ddp"].numel == whole and small["ddp"].params == 4 * whole  # DDP: all of it
    first, last = small["pp first"], small["pp last"]
    assert first.layers == (0, 1) and last.layers == (2, 3)
    assert first.numel + last.numel == whole // 2
    assert (first.in_flight, last.in_flight) == (2, 1)  # 1F1B, read off torch's schedule


def test_pipelining_with_fsdp_keeps_unsharded_fp32_gradients_for_the_whole_step(small):
    """PipelineStage turns FSDP's gradient sync and reshard-after-backward off for every
    microbatch: the stage's gradients stay unsharded, in fp32 (FSDP2's reduce_dtype), until
    the reduce-scatter after the last backward. The peak holds them, the sharded states and
    every microbatch in flight at once."""
    for key, dp in (("pp first", 2), ("pp last", 2)):
        r = small[key]
        unsharded_fp32_grads = 4 * dp * r.numel
        floor = r.params + r.optimizer + unsharded_fp32_grads + r.in_flight * r.activations
        assert r.peak >= floor, (key, r.peak, floor)
        assert r.microbatches == 2


def test_simulations_one_after_another_in_one_process_equal_those_in_processes_of_their_own(
    small,
):
    # DTensor caches sharding decisions by mesh shape: without emptying them after each
    # simulation, the second one is handed the first one's meshes ("Could not resolve the
    # process group registered under the name ...", or a crash)
    code = textwrap.dedent(
        """
        from distlab import scale
        from distlab.calculators import Transformer
        m = Transformer("small", vocab=1024, hidden=256, intermediate=896, layers=4, heads=8,
                        kv_heads=2)
        for layout in (scale.Layout(dp=2, tp=2, seq_len=128), scale.Layout(dp=2, seq_len=128),
                       scale.Layout(dp=2, tp=2, seq_len=128)):
            r = scale.simulate_rank(m, layout)
            print(r.flops, r.activations, sorted(r.comm().items()))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line[:1].isdigit()]
    expected = [small[k] for k in ("tp", "dp", "tp")]
    assert lines == [f"{r.flops} {r.activations} {sorted(r.comm().items())}" for r in expected]


def test_lay_out_shows_every_distinct_stage_side_by_side():
    laid = scale.lay_out(SMALL, scale.Layout(dp=2, pp=4, seq_len=64), processes=2)
    assert [r.stage for r in laid.ranks] == [0, 1, 3]
    text = str(laid)
    # columns are pipeline ranks (with an interleaved schedule a rank holds several stages)
    assert text.splitlines()[1].split() == ["pp", "rank", "0", "(of", "4)", "pp", "rank", "1",
                                            "pp", "rank", "3"]
    assert "layers" in text and "0-0" in text and "3-3" in text
    assert laid[3].layers == (3,)
    with pytest.raises(KeyError, match="pipeline rank 2 was not simulated"):
        laid[2]
    with pytest.raises(ValueError, match="processes must be an int >= 1"):
        scale.lay_out(SMALL, scale.Layout(dp=2, seq_len=64), processes=0)


def test_simulate_apart_gives_each_layout_its_own_report_in_order():
    # three layouts on two processes: process 0 takes the first and the third, process 1 the
    # second; the reports must come back in the layouts' order (that a launched simulation equals
    # one run here is the test of one after another, above). A one-block model keeps it quick;
    # its microbatches tell the reports apart.
    tiny = Transformer("tiny", vocab=256, hidden=64, intermediate=128, layers=1, heads=4,
                       kv_heads=2)
    layouts = [scale.Layout(dp=2, seq_len=32, microbatches=m) for m in (1, 2, 3)]
    apart = scale.simulate_apart(tiny, layouts, processes=2)
    assert [r.layout for r in apart] == layouts
    gathers = [r.comm()["dp", "all_gather"][0] for r in apart]
    assert gathers[0] < gathers[1] < gathers[2], gathers


def test_simulate_apart_refuses_bad_input_before_it_launches_anything():
    with pytest.raises(ValueError, match="at least one Layout"):
        scale.simulate_apart(SMALL, [])
    with pytest.raises(ValueError, match="processes must be an int >= 1"):
        scale.simulate_apart(SMALL, [scale.Layout(dp=2, seq_len=64)], processes=0)
    with pytest.raises(ValueError, match="tp=16"):
        scale.simulate_apart("Llama-3 8B", [scale.Layout(dp=2), scale.Layout(tp=16)])
