"""The memory calculator against torchtitan's measured H100 runs (bench/memory_vs_torchtitan.py),
and the terms a real run holds that the calculator must count: each test here is the one that
fails when its term is dropped or swapped."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from distlab.calculators import CalculatorError, memory_per_device

_spec = importlib.util.spec_from_file_location(
    "memory_vs_torchtitan", Path(__file__).parent.parent / "bench" / "memory_vs_torchtitan.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench  # dataclasses look their module up
_spec.loader.exec_module(bench)

GIB = 2**30
FSDP2_405B = dict(dp=8, tp=8, pp=8, zero=3, precision="bf16-fsdp2", seq_len=8192,
                  micro_batch=4, microbatches=8, checkpointing="full")


def test_the_table_holds_every_row_of_torchtitans_tables_1_to_6():
    assert [r.table for r in bench.ROWS].count("2") == 4
    assert {r.table for r in bench.ROWS} == {"1", "2", "3", "4", "5", "6"}
    assert len(bench.ROWS) == 18
    measured = {r.label: r.measured_gib for r in bench.ROWS}
    assert measured["8B FSDP 8"] == 82.4 and measured["405B 3D, 1F1B"] == 82.5
    assert [r.label for r in bench.ROWS if r.modelled] == ["8B FSDP 8", "8B FSDP 128"]


def test_every_modelled_row_is_between_80_and_100_percent_of_measured():
    """The issue asks 85-100%; the calculator's allocated peaks are at 0.82 and 0.86 (the
    simulated rank's reserved floor, below, is in the band). Predicted is
    allocated, measured is the caching allocator's max reserved (never below allocated), so
    above 1.0 would be a calculator counting what a real run does not hold. What the 8B rows
    still miss (about 14 GiB at 8 x 8K tokens) is not known here: fragmentation of the loss's
    8.4 GB fp32 blocks between steps, and backward's transients (activation gradients), which
    the calculator leaves out; a GPU run would tell (bench/gpu_step.py)."""
    for row, _, gib, ratio in bench.table():
        if row.modelled:
            assert 0.80 <= ratio <= 1.0, (row.label, gib, row.measured_gib)


@pytest.fixture(scope="module")
def simulated_8b():
    """The two modelled rows' ranks simulated (`bench.reserved`), each in a process of its own."""
    import distlab

    rows = [r for r in bench.ROWS if r.modelled]

    def run(cases):
        import os

        from distlab import scale

        model, layout = cases[int(os.environ["RANK"])]
        return scale.simulate_rank(model, scale.Layout(**layout))

    reports = distlab.launch(run, [(r.model, r.layout) for r in rows], world_size=len(rows),
                             backend=None, timeout=240, threads=1)
    by_label = {r.label: rep for r, rep in zip(rows, reports, strict=True)}
    return rows, by_label


@pytest.mark.timeout(300)
def test_the_modelled_rows_reserved_floor_is_within_85_to_100_percent(simulated_8b):
    """What torchtitan measured is the caching allocator's max reserved: its blocks pooled by
    the stream that made them. FSDP2 makes the reduce-scatters' outputs (they become the
    sharded fp32 gradients) and the all-gathers' outputs on side streams, so those blocks stay
    reserved beside the activations' even when freed: the floor is 72.6 GiB at FSDP 8 (0.88 of
    82.4) and 58.5 at FSDP 128 (0.87 of 67.0), where the allocated peak is 0.82 and 0.85."""
    rows, reports = simulated_8b
    table = bench.reserved(rows, simulate=lambda row, stage: reports[row.label])
    for row in rows:
        report, (_, held, ratio) = reports[row.label], table[row.label]
        assert 0.85 <= ratio <= 1.0, (row.label, held, row.measured_gib)
        # the side streams hold at least the sharded fp32 gradients (4 bytes a parameter
        # shard), made on the reduce-scatter stream; the rest is the all-gathers' outputs,
        # the largest of distlab's units (the embedding, 1.05 GB in bf16) and the next
        assert report.side_streams >= report.grads > 0
        embedding = 128_256 * 4096 * 2
        assert embedding < report.side_streams - report.grads < 2 * embedding
        # the peak (at the loss, gradients freed) holds none of the side streams' bytes
        assert report.reserved == pytest.approx(report.peak + report.side_streams, rel=1e-3)
    fsdp8, fsdp128 = (reports[r.label] for r in rows)
    measured = rows[0].measured_gib - rows[1].measured_gib
    # measured 15.4 GiB apart; the allocated peaks 10.5, the floors 14.1
    assert (fsdp8.reserved - fsdp128.reserved) / GIB == pytest.approx(measured, abs=1.5)


def test_the_calculators_reserved_floor_puts_the_modelled_rows_in_the_band():
    """The calculator's `reserved` (its side-stream part equal to the simulated rank's,
    tests/test_scale_calculators.py): 73.0 GiB at FSDP 8 (0.89), 58.9 at FSDP 128 (0.88)."""
    for row in bench.ROWS:
        est = bench.predict(row)
        if row.modelled:
            assert 0.85 <= est.reserved / GIB / row.measured_gib <= 1.0, row.label
            # the sharded fp32 gradients (on the reduce-scatter stream) are the larger part
            assert est.reserved - est.peak > est.grads
        assert est.reserved >= est.peak


def test_the_8b_rows_difference_points_at_the_sharded_gradients():
    """Measured FSDP 8 less FSDP 128 (the same local batch) is 15.4 GiB; the calculator's peaks
    differ by 10.5, and by 14.0 with the sharded fp32 gradients the loss moment does not hold.
    What is left of each row's gap is then alike (10.9 and 9.5 GiB): shared by both, not a
    sharding term. The note quotes these numbers."""
    d = bench.difference()
    assert d["measured"] == pytest.approx(15.4)
    assert d["predicted"] == pytest.approx(10.5, abs=0.05)
    assert d["grads"] == pytest.approx(4 * 8_030_261_248 * (1 / 8 - 1 / 128) / GIB, rel=0.01)
    assert d["with_grads"] == pytest.approx(14.0, abs=0.05)
    assert d["left"] == pytest.approx((10.9, 9.5), abs=0.05)


def test_the_405b_rows_are_within_their_stated_bounds():
    """The 405B rows ran with torch.compile, Float8 and async TP: predicted as bf16 eager,
    which holds more (compile alone saved 5.4 GiB in Table 1), so a ratio a little above 1 is
    possible there. The 1F1B row was 0.35 before the unsharded fp32 gradients, the loss's
    transients, torchtitan's microbatch size, the pipeline's buffers and the embedding's whole
    gradient were counted (0.78 without the last). The interleaved row was 1.03, a ratio no
    allocated figure can have against a reserved one: the calculator added both of a rank's
    stages' gathered parameters and fp32 gradients as if alive at once, 28-40% above PyTorch's
    schedule run on simulated ranks; walked along torch's order it is within 4% of it, and
    what compile, Float8 and async TP change is then what remains (0.78)."""
    ratios = {row.label: ratio for row, _, _, ratio in bench.table()}
    assert 0.85 <= ratios["405B 3D, 1F1B"] <= 1.0
    assert 0.75 <= ratios["405B 3D, Interleaved1F1B (v=2)"] <= 0.9


def test_reshard_after_forward_false_keeps_every_unit_gathered():
    kept = memory_per_device("Llama-3 8B", dp=8, zero=3, seq_len=4096, precision="bf16-mixed",
                             reshard_after_forward=False)
    freed = kept.with_(reshard_after_forward=True)
    dense, _ = kept.model.layer_parameters(1)
    # every block's bf16 copy and the embedding, against two blocks and the output layer
    more = (30 * dense + 128256 * 4096) * 2
    assert kept.gathered - freed.gathered == more
    assert kept.peak - freed.peak == more
    assert (round(kept.peak / 1e9, 1), round(freed.peak / 1e9, 1)) == (58.6, 44.4)


def test_pipelining_with_fsdp2_accumulates_the_stages_gradients_unsharded_in_fp32():
    est = memory_per_device("Llama-3 405B", stage=0, **FSDP2_405B)
    assert not est.sync_each_microbatch
    assert est.numel == 6_240_043_008
    # 23.2 GiB, not divided by dp; and the embedding's gradient whole over the vocabulary
    whole_embedding = 128256 * 16384 * 7 // 8 * 4
    assert est.unsharded_grads == 6_240_043_008 * 4 + whole_embedding
    assert round((est.unsharded_grads - whole_embedding) / GIB, 1) == 23.2
    synced = est.with_(sync_each_microbatch=True)
    assert synced.unsharded_grads == 0
    assert est.peak - synced.peak == est.unsharded_grads - est.grads
    one = est.with_(microbatches=1, pp=8)  # one microbatch: nothing to accumulate
    assert one.unsharded_grads == 0


def test_plain_gradient_accumulation_without_sync_is_counted_too():
    est = memory_per_device("Llama-3 8B", dp=8, zero=3, precision="bf16-fsdp2",
                            seq_len=4096, microbatches=4)
    assert est.unsharded_grads == est.numel * 4
    assert memory_per_device("Llama-3 8B", dp=8, zero=3, seq_len=4096).unsharded_grads == 0


def test_the_upcast_loss_holds_two_more_fp32_copies_of_the_logits_in_backward():
    est = memory_per_device("Llama-3 8B", dp=8, zero=3, precision="bf16-fsdp2", seq_len=8192,
                            micro_batch=2, checkpointing="op-selective-alternate")
    n = 4 * 8192 * 2 * 128256  # one fp32 copy of the logits: 8.4 GB
    assert dict(est.terms)["log-softmax (fp32)"] == n
    assert est.loss_transient == 2 * n
    # at the loss's moment: no gradient yet, the activations, the gathered units, 2n more
    held = est.params + est.optimizer + est.activations + est.gathered
    assert est.peak == held + 2 * n
    fused = est.with_(loss="fused")
    assert fused.loss_transient == 0 and "log-softmax (fp32)" not in dict(fused.terms)
    # without them, backward's moment decides: the gradients and the recomputed layer
    assert fused.peak == fused.total + fused.gathered + fused.recomputed
    # a pipeline's last stage keeps its bf16 logits until the microbatch's backward
    last = memory_per_device("Llama-3 405B", stage=7, **FSDP2_405B)
    n = 4 * 8192 * 4 * 16032
    assert last.loss_transient == 2 * n
    assert dict(last.terms)["the logits, kept by the stage until backward"] == n // 2
    assert memory_per_device("Llama-3 405B", stage=0, **FSDP2_405B).loss_transient == 0


def test_a_pipeline_stage_holds_receive_buffers_for_every_microbatch_of_the_step():
    """PipelineStage makes one buffer per microbatch for the activations it receives (not on
    the first stage) and one for the gradients (not on the last), kept for the step."""
    stream = 2 * 8192 * 4 * 16384 // 8  # bf16, micro_batch 4, sequence-parallel over tp 8
    first, middle, last = (memory_per_device("Llama-3 405B", stage=s, **FSDP2_405B)
                           for s in (0, 3, 7))
    assert (first.buffers, middle.buffers, last.buffers) == (8 * stream, 16 * stream,
                                                             8 * stream)
    assert middle.with_(microbatches=16).buffers == 32 * stream
    assert dict(middle.terms)["the first layer's input (in a receive buffer, below)"] == -stream


def test_the_interleaved_schedule_holds_torchs_warmup_forwards():
    one = memory_per_device("Llama-3 405B", stage=7, **FSDP2_405B)
    two = one.with_(schedule="Interleaved1F1B", virtual_stages=2)
    # torch's ScheduleInterleaved1F1B: rank 7 of 8 warms up (v - 1) x 8 = 8 forwards, then
    # one more before its first backward: 9 stage-microbatches of half the rank's layers
    assert (one.in_flight, two.in_flight) == (1, 9)
    assert two.activations == 9 * two.per_microbatch // 2
    first = two.with_(stage=0)
    assert first.in_flight == 16  # capped at all 8 x 2
    with pytest.raises(CalculatorError, match="virtual_stages=2"):
        one.with_(schedule="Interleaved1F1B")


def test_eager_and_megatron_differ_where_their_code_does():
    eager = memory_per_device("Llama-3 70B", dp=8, tp=8, zero=1, seq_len=8192)
    mega = eager.with_(implementation="megatron")
    e, m = dict(eager.terms), dict(mega.terms)
    s, h, i, layers = 8192, 8192, 28672, 80
    assert e["SwiGLU"] == layers * 4 * 2 * s * i // 8  # four tensors
    assert m["SwiGLU"] == layers * 3 * 2 * s * i // 8  # fc1's (2i wide) and fc2's input
    assert e["attention and MLP inputs"] == layers * 2 * 2 * s * h  # gathered, kept whole
    assert m["attention and MLP inputs (sharded; re-gathered in backward)"] == (
        layers * 2 * 2 * s * h // 8)
    assert "PyTorch eager" in eager.text() and "Megatron-style" in mega.text()
    assert eager.implementation == "eager"  # the default, named


def test_precision_names_say_whose_bytes_they_are():
    zero = memory_per_device(1_000_000, dp=1, precision="bf16-zero-paper")
    assert (zero.params, zero.grads, zero.optimizer) == (2_000_000, 2_000_000, 12_000_000)
    assert zero.total == memory_per_device(1_000_000, precision="bf16-mixed").total
    fsdp2 = memory_per_device(1_000_000, precision="bf16-fsdp2")
    assert (fsdp2.params, fsdp2.grads, fsdp2.optimizer) == (4_000_000, 4_000_000, 8_000_000)


def test_the_embeddings_gradient_is_whole_over_the_vocabulary_under_tp():
    """torch 2.14's DTensor has no vocabulary-sharded strategy for ``embedding_dense_backward``:
    the gradient of the vocabulary-sharded embedding comes out (vocab x hidden) on every tp rank
    (the simulation holds it: notebook 25's first stage, 8.4 GB in fp32). Under pipelining FSDP2
    accumulates it so; without, it is a transient at the end of backward."""
    first = memory_per_device("Llama-3 405B", stage=0, **FSDP2_405B)
    middle = first.with_(stage=3)
    assert first.embedding_grad == 128256 * 16384 * 2 and middle.embedding_grad == 0
    assert first.with_(tp=1, pp=8, dp=64).embedding_grad == 0  # no tp: sharded as it should be
    accumulated = first.unsharded_grads - first.numel * 4
    assert accumulated == 128256 * 16384 * 7 // 8 * 4
