"""One Layout, every tool: the memory formulas, the step-time model and the simulator read the
same `calculators.Layout` (``scale.Layout`` is that class), with one set of defaults."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest

from distlab import scale
from distlab.calculators import (
    CalculatorError,
    Layout,
    Transformer,
    bubble,
    memory_per_device,
    step_time,
)

SMALL = Transformer("small", vocab=1024, hidden=256, intermediate=896, layers=4, heads=8,
                    kv_heads=2)

FIVE = {
    "DDP": Layout(dp=4, zero=0, seq_len=128),
    "FSDP": Layout(dp=4, seq_len=128),
    "TP x FSDP": Layout(dp=2, tp=2, seq_len=128),
    "PP interleaved": Layout(dp=2, pp=2, seq_len=128, microbatches=4,
                             schedule="Interleaved1F1B", virtual_stages=2),
    "CP": Layout(dp=2, cp=2, seq_len=128),
}


@pytest.mark.quick
def test_scale_and_the_calculators_share_one_layout_and_its_defaults():
    assert scale.Layout is Layout
    # the example: 70.9 GB from the layout, 140.6 GB from the calculator's own defaults
    # (zero 0, "bf16-mixed", 2,048 tokens) before there was one Layout
    via_layout = scale.Layout(dp=8).memory("Llama-3 8B").peak
    assert via_layout == memory_per_device("Llama-3 8B", dp=8).peak
    assert round(via_layout / 1e9, 1) == 70.9


@pytest.mark.quick
@pytest.mark.parametrize("name", FIVE)
def test_one_layout_gives_one_answer_in_the_formulas_and_the_step_time_model(name):
    layout = FIVE[name]
    knobs = dataclasses.asdict(layout)
    for stage in range(layout.pp):
        est = memory_per_device(SMALL, layout, stage=stage)
        assert est.layout == layout and est.text() == layout.memory(SMALL, stage).text()
        assert est.text() == memory_per_device(SMALL, stage=stage, **knobs).text()
        assert est.devices == layout.world_size
    t = step_time(SMALL, layout)
    assert t.text() == step_time(SMALL, **knobs).text()
    assert t.gpus == layout.world_size and t.microbatches == layout.steps
    assert t.tokens == layout.dp * layout.steps * layout.micro_batch * layout.seq_len
    expected = (bubble(layout.pp, layout.steps, layout.virtual_stages, layout.schedule)
                if layout.pp > 1 else Fraction(0))
    assert t.bubble == expected


@pytest.mark.parametrize("name", FIVE)
def test_one_layout_gives_one_answer_in_the_simulators_report(name, request):
    layout = FIVE[name]
    report = scale.simulate_rank(SMALL, layout)
    assert report.layout == layout and report.microbatches == layout.steps
    est = scale.calculator_for(report)
    assert est.text() == memory_per_device(SMALL, layout, stage=report.stage).text()
    assert 0.75 < est.peak / report.peak < 1.25, (est.peak, report.peak)


@pytest.mark.quick
@pytest.mark.parametrize("tool", [memory_per_device, step_time])
def test_a_knob_under_its_old_name_is_refused_with_its_new_one(tool):
    for old, new in (("v", "virtual_stages"), ("accumulate", "microbatches"),
                     ("grad_sync", "sync_each_microbatch")):
        with pytest.raises(CalculatorError, match=f"no argument '{old}': a Layout calls it {new}"):
            tool("Llama-3 8B", **{old: 2})
    with pytest.raises(CalculatorError, match="layout must be a distlab Layout"):
        tool("Llama-3 8B", {"dp": 8})
