"""The step-time and MFU model (`calculators.steptime`), the links' measured bandwidths, and
the bench that sets the model beside the Llama 3 paper (bench/mfu_vs_llama3.py)."""

from __future__ import annotations

import importlib.util
import os
import sys
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import pytest

import distlab
from distlab import scale
from distlab.calculators import (
    LINKS,
    PRESETS,
    CalculatorError,
    Link,
    bubble,
    collective_time,
    pipeline_schedule,
    ring_steps,
    step_time,
)
from distlab.calculators.models import stage_layers
from distlab.calculators.steptime import H100_PEAK, MATMUL_EFFICIENCY

NVLINK, NET = "NVLink 4 (H100 SXM)", "InfiniBand NDR (400 Gb/s)"
PAPER_16K = dict(tp=8, pp=16, dp=128, seq_len=8192, microbatches=16)


@pytest.mark.parametrize("p, m, v, schedule, expected", [
    (16, 16, 1, "1F1B", Fraction(15, 31)),
    (16, 16, 1, "GPipe", Fraction(15, 31)),
    (16, 16, 2, "Interleaved1F1B", Fraction(15, 47)),
    (4, 8, 3, "Interleaved1F1B", Fraction(3, 27)),
])
def test_bubble_is_p_minus_1_over_v_m_plus_p_minus_1(p, m, v, schedule, expected):
    assert bubble(p, m, v, schedule) == expected


def test_bubble_agrees_with_the_played_out_schedules():
    assert bubble(4, 8) == pipeline_schedule(p=4, m=8, schedule="1F1B").bubble == Fraction(3, 11)
    s = pipeline_schedule(p=4, m=8, v=2, schedule="Interleaved1F1B")
    assert bubble(4, 8, 2, "Interleaved1F1B") == s.formula()
    with pytest.raises(CalculatorError, match="Interleaved1F1B"):
        bubble(4, 8, 2, "1F1B")


def test_the_step_uses_its_schedules_bubble():
    plain = step_time("Llama-3 405B", **PAPER_16K, schedule="1F1B")
    inter = step_time("Llama-3 405B", **PAPER_16K, schedule="Interleaved1F1B", virtual_stages=2)
    assert plain.bubble == Fraction(15, 31) and inter.bubble == Fraction(15, 47)
    busy = sum(t.exposed for t in inter.terms if t.per == "microbatch")
    fsdp = sum(t.exposed for t in inter.terms if t.per == "step")
    assert inter.seconds == pytest.approx(16 * busy / (1 - 15 / 47) + fsdp, rel=1e-12)


def test_compute_counts_matmuls_and_causal_attention_by_hand():
    m = PRESETS["Llama-3 8B"]
    s, eff = 32768, 0.5
    t = step_time(m, seq_len=s, matmul_efficiency=eff)  # one GPU: every layer, the output layer
    matmul = (m.layer_parameters(1)[0] - 2 * m.hidden) * m.layers + m.hidden * m.vocab
    attention_fwd = 2 * s * s * m.hidden * m.layers  # 4 s^2 d per layer, causal half
    flops = 6 * matmul * s + 3.5 * attention_fwd  # FlashAttention's backward: 2.5x forward
    assert t.terms[0].seconds == pytest.approx(flops / (H100_PEAK * eff), rel=1e-12)


def test_recomputation_adds_its_forward():
    m = PRESETS["Llama-3 8B"]
    base, full = (step_time(m, checkpointing=c).terms[0].seconds for c in ("none", "full"))
    sel = step_time(m, checkpointing="op-selective-alternate").terms[0].seconds
    assert base < sel < full
    # keeping every matmul's output recomputes none of them (the memory calculator's name)
    assert step_time(m, checkpointing="op-selective").terms[0].seconds == base
    # full recomputation runs every layer's forward once more: 1/3 of 6N's layers, plus
    # attention's forward (1 of its 3.5)
    assert full / base == pytest.approx(1.33, abs=0.03)


def test_mfu_by_the_paper_counts_causal_attention_and_6n_does_not():
    t = step_time("Llama-3 405B", **PAPER_16K, schedule="Interleaved1F1B", virtual_stages=2)
    m = PRESETS["Llama-3 405B"]
    six_n = 6 * m.parameters()
    attention = 6 * m.layers * 8192 * m.hidden  # causal: half of PaLM's 12 L s d
    assert t.tokens == 128 * 16 * 8192
    assert t.mfu_6n == pytest.approx(six_n * t.tokens / (t.seconds * 16384 * H100_PEAK))
    assert t.mfu / t.mfu_6n == pytest.approx((six_n + attention) / six_n, rel=1e-12)
    assert t.tflops_per_gpu == pytest.approx(t.mfu * 989)
    assert t.hfu >= t.mfu  # the GPUs also run attention's larger backward


def test_mfu_counts_the_attention_the_step_is_timed_for():
    # the attention the compute term times, found from the time alone: slowing attention's
    # kernels by 2x adds its forward and FlashAttention's 2.5x backward once more
    m = PRESETS["Llama-3 8B"]
    for s, layout in ((8192, dict(tp=8, dp=4)), (131072, dict(tp=8, cp=16, pp=4, dp=2))):
        fast, slow = (step_time(m, seq_len=s, **layout, attention_efficiency=e,
                                matmul_efficiency=0.5, memory_bound="none") for e in (0.5, 0.25))
        layers = max(len(r) for r in stage_layers(m.layers, layout.get("pp", 1)))
        timed = (slow.terms[0].seconds - fast.terms[0].seconds) * 0.5 * H100_PEAK  # 2.5x + 1x
        # forward x 3, every layer, per token of the rank's s / cp, every rank's heads
        per_token = timed / 3.5 * 3 * m.layers / layers / (s / layout.get("cp", 1)) * 8
        assert fast.flops_model - fast.flops_6n == pytest.approx(per_token, rel=1e-9)
        assert per_token == pytest.approx(6 * m.layers * s * m.hidden, rel=1e-12)
        assert fast.mfu_full_square - fast.mfu_6n == pytest.approx(
            2 * (fast.mfu - fast.mfu_6n), rel=1e-9)


def test_selective_recomputation_runs_attentions_forward_again():
    m = PRESETS["Llama-3 8B"]
    s, eff = 8192, 0.5
    none, sel = (step_time(m, seq_len=s, matmul_efficiency=eff, memory_bound="none",
                           checkpointing=c) for c in ("none", "selective"))
    attention_fwd = 2 * s * s * m.hidden * m.layers  # one sequence: 4 s^2 d per layer, halved
    assert sel.terms[0].seconds - none.terms[0].seconds == pytest.approx(
        attention_fwd / (H100_PEAK * eff), rel=1e-9)
    assert sel.hfu * sel.seconds > none.hfu * none.seconds  # the GPUs run more FLOPs
    assert sel.mfu * sel.seconds == pytest.approx(none.mfu * none.seconds)  # the model's same


def _tp_term(t):
    return next(term for term in t.terms if term.what.startswith("TP"))


def test_exposed_tp_time_grows_when_the_link_is_slower():
    fast = Link("fast", 3.4e-6, 1 / 450e9)
    slow = Link("slow", 3.4e-6, 1 / 50e9)
    a = step_time("Llama-3 405B", **PAPER_16K, nvlink=fast, bandwidth="peak")
    b = step_time("Llama-3 405B", **PAPER_16K, nvlink=slow, bandwidth="peak")
    assert _tp_term(b).exposed > 8 * _tp_term(a).exposed > 0
    assert b.seconds > a.seconds and b.mfu < a.mfu
    hidden = step_time("Llama-3 405B", **PAPER_16K, nvlink=fast, bandwidth="peak",
                       async_tp=True)
    assert _tp_term(hidden).exposed == 0 and hidden.mfu > a.mfu


def test_pipeline_sends_are_hidden_stage_by_stage():
    # each of a rank's v stages sends twice a microbatch (output forward, gradient backward),
    # each hidden behind that stage's own compute: on a slow network the exposed part is the
    # sends' total less the rank's compute, whatever v (all 2v sends against one stage's compute
    # exposed 2v sends less compute / v, more for every extra stage)
    for v in (1, 2, 4):
        layout = dict(PAPER_16K, schedule="Interleaved1F1B" if v > 1 else "1F1B", virtual_stages=v)
        crawl = Link("crawl", 1e-5, 1 / 2e8)
        t = step_time("Llama-3 405B", **layout, network=crawl, bandwidth="peak",
                      memory_bound="none")
        pp = next(term for term in t.terms if term.what.startswith("PP"))
        act = 8192 * PRESETS["Llama-3 405B"].hidden * 2 // 8
        one = collective_time("send", act, 2, crawl).seconds
        assert pp.seconds == pytest.approx(2 * v * one, rel=1e-12)
        assert pp.exposed == pytest.approx(2 * v * one - t.terms[0].seconds, rel=1e-9)
        fast = step_time("Llama-3 405B", **layout, memory_bound="none")
        assert next(x for x in fast.terms if x.what.startswith("PP")).exposed == 0


def test_sustained_slows_the_sms_kernels_not_the_hbms_nor_any_link():
    layout = dict(tp=8, dp=16, seq_len=8192)
    full, half = (step_time("Llama-3 70B", **layout, sustained=x) for x in (1.0, 0.5))
    by = {t.what: t for t in full.terms}
    assert {t.what for t in half.terms} == set(by) >= {"memory-bound kernels",
                                                       "FSDP copies, optimizer step"}
    for t in half.terms:  # matmuls and attention take twice as long; a power cap lowers the
        # SMs' clock, not the memory's: bytes stream at the HBM's rate; links as before
        ratio = t.seconds / by[t.what].seconds
        expected = 2 if t.what.startswith("compute") else 1
        assert ratio == pytest.approx(expected, rel=1e-12), t.what
    assert "sustained" in half.terms[0].how and "sustained" in " ".join(half.assumptions)
    for bad in (0, 1.2, -0.5):
        with pytest.raises(CalculatorError, match="sustained"):
            step_time("Llama-3 70B", **layout, sustained=bad)


def test_recomputation_runs_the_tp_collectives_it_does_not_save_again():
    # per layer and microbatch: 2 all-gathers and 2 reduce-scatters forward, as many backward;
    # "full" runs the forward's again, torchtitan's op-level policies its all-gathers only
    # (their save list keeps the reduce-scatters' outputs), Megatron's "selective" neither
    act = 8192 * PRESETS["Llama-3 70B"].hidden * 2
    link = LINKS[NVLINK].measured()
    gather, scatter = (collective_time(k, act, 8, link).seconds
                       for k in ("all_gather", "reduce_scatter"))
    for checkpointing, gathers, scatters in (("none", 4, 4), ("selective", 4, 4),
                                             ("op-selective", 6, 4),
                                             ("op-selective-alternate", 6, 4), ("full", 6, 6)):
        t = step_time("Llama-3 70B", tp=8, dp=16, seq_len=8192, checkpointing=checkpointing)
        expected = 80 * (gathers * gather + scatters * scatter)
        assert _tp_term(t).seconds == pytest.approx(expected, rel=1e-12), checkpointing


def test_measured_bandwidth_is_used_when_asked_and_says_so():
    nv = LINKS[NVLINK]
    assert nv.bandwidth == 450e9 and nv.measured().bandwidth == 360e9
    assert LINKS[NET].measured().bandwidth == 46e9
    t = step_time("Llama-3 405B", **PAPER_16K)  # default: measured
    act = 8192 * PRESETS["Llama-3 405B"].hidden * 2
    one = collective_time("all_gather", act, 8, nv.measured()).seconds
    assert _tp_term(t).seconds == pytest.approx(8 * 8 * one, rel=1e-12)  # 8 per layer, 8 layers
    assert "NCCL-measured" in _tp_term(t).how
    peak = step_time("Llama-3 405B", **PAPER_16K, bandwidth="peak")
    assert _tp_term(peak).seconds < _tp_term(t).seconds
    with pytest.raises(CalculatorError, match="no NCCL-measured"):
        LINKS["loopback, gloo (notebook 08)"].measured()


def test_a_ring_all_reduce_sends_every_byte_twice():
    # comm's formula against the stepper's played-out ring: 2 (n-1)/n S per rank
    for n in (2, 3, 8):
        size = 4 * 1200
        t = collective_time("all_reduce", size, n, NVLINK)
        assert t.sent == Fraction(2 * (n - 1) * size, n)
        assert t.sent == ring_steps("all_reduce", ranks=n, numel=1200).per_rank[0]
        assert collective_time("reduce_scatter", size, n, NVLINK).sent == t.sent / 2


def test_a_simulated_ranks_collectives_time_as_the_formulas():
    act = 8192 * PRESETS["Llama-3 405B"].hidden * 2
    calls = [SimpleNamespace(kind=k, axis="tp", ranks=8, nbytes=act)
             for _ in range(8) for k in ("all_gather", "reduce_scatter")]
    report = SimpleNamespace(collectives=calls * 4, layers=tuple(range(8)),
                             layout=SimpleNamespace(accumulate=1))
    a = step_time("Llama-3 405B", **PAPER_16K)
    b = step_time("Llama-3 405B", **PAPER_16K, report=report)
    assert _tp_term(b).seconds == pytest.approx(_tp_term(a).seconds, rel=1e-12)
    # a pipeline rank's report holds its whole step's calls: 3 microbatches of them
    step = SimpleNamespace(collectives=calls * 4 * 3, layers=tuple(range(8)), microbatches=3,
                           layout=SimpleNamespace(accumulate=1))
    c = step_time("Llama-3 405B", **PAPER_16K, report=step)
    assert _tp_term(c).seconds == pytest.approx(_tp_term(a).seconds, rel=1e-12)


def test_bad_inputs_say_what_to_choose():
    with pytest.raises(CalculatorError, match="share of the peak"):
        step_time("Llama-3 8B", matmul_efficiency=80)
    with pytest.raises(CalculatorError, match="mixtures of experts"):
        step_time("Mixtral 8x7B")
    with pytest.raises(CalculatorError, match="checkpointing"):
        step_time("Llama-3 8B", checkpointing="some")


def _simulate_each(cases):
    def run(cases):
        from distlab.scale import simulate_rank

        return simulate_rank(*cases[int(os.environ["RANK"])])

    return distlab.launch(run, cases, world_size=len(cases), backend=None, timeout=240,
                          threads=1)


@pytest.mark.timeout(300)
def test_a_simulated_ranks_flops_are_one_microbatchs_whatever_it_accumulates():
    small = PRESETS["Llama-3 8B"].__class__(
        "small", vocab=1024, hidden=256, intermediate=896, layers=4, heads=8, kv_heads=2)
    one, three = _simulate_each([(small, scale.Layout(dp=2, seq_len=128)),
                                 (small, scale.Layout(dp=2, seq_len=128, microbatches=3))])
    assert one.flops > 0 and three.flops == one.flops


def _bench():
    path = Path(__file__).parents[1] / "bench" / "mfu_vs_llama3.py"
    spec = importlib.util.spec_from_file_location("mfu_vs_llama3", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_bench_rows_stay_where_the_note_says():
    bench = _bench()
    rows = bench.paper_rows()
    gaps = [100 * bench.final(row).mfu - row[1] for row in rows]
    # 16K GPUs (8K and 128K tokens) within the 5-point band; 8K GPUs overshoots (+7.0 points
    # with v=2): the model's bubble falls faster with more microbatches than the paper's did
    assert abs(gaps[1]) <= bench.BAND and abs(gaps[2]) <= bench.BAND
    assert 0 < gaps[0] <= 9
    for _, _, steps in rows:  # each step moves the way its assumption says
        mfus = [t.mfu for _, _, t in steps]
        assert mfus[1] > mfus[0] and mfus[2] > mfus[1] and mfus[3] < mfus[2] < mfus[4]
    assert bench.final(rows[0]).assumptions[0].startswith(f"matmuls at {MATMUL_EFFICIENCY:.1%}")


@pytest.mark.timeout(300)
def test_the_unpublished_inputs_span_the_16k_gpu_8k_row_and_come_closest_at_v2_eager():
    bench = _bench()
    layouts = {name: layout for name, layout, _, _ in bench.PAPER}
    reports = dict(zip(layouts, _simulate_each([
        ("Llama-3 405B", scale.Layout(**layout, schedule="Interleaved1F1B", virtual_stages=2),
         1) for layout in layouts.values()]), strict=True))
    by_layout = {id(layout): reports[name] for name, layout in layouts.items()}
    rows = bench.unpublished(lambda layout: by_layout[id(layout)])
    for name, measured, cells in rows:
        for v in (2, 4, 8):  # eager kernels only add time; more stages per rank, less bubble
            assert cells[v, "eager"].mfu < cells[v, "fused"].mfu, (name, v)
        assert cells[2, "fused"].mfu < cells[4, "fused"].mfu < cells[8, "fused"].mfu
        # a middle rank: 8 layers, whose eager bytes scale to the slowest stage's
        kernels = next(t for t in cells[2, "eager"].terms if t.what == "memory-bound kernels")
        assert kernels.how.startswith("PyTorch eager")
        mfus = [100 * t.mfu for t in cells.values()]
        inside = min(mfus) <= measured <= max(mfus)
        # the 8K-GPU row lies below every pairing: the model's 8K and 16K rows differ by 4-9
        # points where the paper's differ by 2; the 128K row just below (38.5% at v=2 eager,
        # with causal attention counted once: `attention_flops`)
        assert inside == (name == "16,384 GPUs, 8K"), name
    assert bench.closest(rows)[0] == (2, "eager") and 3 < bench.closest(rows)[1] < 4.5


@pytest.mark.timeout(300)
def test_torchtitans_eager_rows_are_timed_from_the_simulated_ranks_ops():
    bench = _bench()
    layouts = {layout["dp"]: layout for _, layout, _, _ in bench.TORCHTITAN if layout}

    def simulate(layout):
        return reports[layout["dp"]]

    reports = dict(zip(layouts, _simulate_each([
        ("Llama-3 8B", scale.Layout(dp=dp, seq_len=8192, micro_batch=2,
                                    checkpointing="op-selective-alternate"))
        for dp in layouts]), strict=True))
    rows = {name: (t, tps) for name, t, tps, _ in bench.torchtitan_rows(simulate)}
    eager, tps = rows["T1 8B FSDP 8, selective AC"]
    compiled, compiled_tps = rows["T1 8B FSDP 8 + compile"]
    # the eager kernels' bytes are the simulated rank's: a third of the step at 8B
    kernels = next(x for x in eager.terms if x.what == "memory-bound kernels")
    assert kernels.how.startswith("PyTorch eager")
    assert 0.25 < kernels.exposed / eager.seconds < 0.4
    # what is not modelled (500 W GPUs, launches, HBM below its peak) only adds time: the model
    # stays faster than measured: 1.45-1.72x at the HBM2e of its GPUs (2.3x before)
    for name, (t, measured) in rows.items():
        if t is not None:
            assert 1.0 < t.tokens_per_second_per_gpu / measured < 1.85, name
    assert compiled.tokens_per_second_per_gpu > eager.tokens_per_second_per_gpu
    assert compiled_tps > tps
