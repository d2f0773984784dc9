"""The accuracy table (bench/steptime_accuracy.py): its rows, its declared calibration, and the
validation errors it prints. Memory floors come from the calculator here (`MemoryEstimate.
reserved`, within 0.1% of the simulated ranks' on these dense rows) to keep the test short; the
eager kernels' bytes from three simulated ranks, as the bench."""

from __future__ import annotations

import dataclasses
import importlib.util
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

_path = Path(__file__).parents[1] / "bench" / "steptime_accuracy.py"
_spec = importlib.util.spec_from_file_location("steptime_accuracy", _path)
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench  # its dataclasses look their module up
_spec.loader.exec_module(bench)


def _calculator_floor(row, stage):
    return SimpleNamespace(reserved=bench.memory_bench.predict(row).reserved)


def _course():
    from distlab.calculators import memory_per_device

    est = memory_per_device(bench.gpu_step.CONFIG, dp=1, zero=3, seq_len=bench.gpu_step.SEQ_LEN,
                            micro_batch=bench.gpu_step.MICRO_BATCH)
    return est.peak / bench.GIB, bench.gpu_step.MEASURED["peak_allocated_gib"], "calculator"


@pytest.fixture(scope="module")
def reports():
    return {r.name: bench.simulate_eager(r.eager_from) for r in bench.RUNS if r.eager_from}


def _table(reports, runs=None):
    old = bench.RUNS
    try:
        if runs is not None:
            bench.RUNS = runs
        return bench.table(simulate_eager=lambda layout: reports[next(
            r.name for r in old if r.eager_from is layout)], simulate=_calculator_floor,
            course=_course)
    finally:
        bench.RUNS = old


def test_fifteen_or_more_runs_each_with_its_source_and_the_calibration_declared():
    assert len(bench.RUNS) >= 15
    names = [r.name for r in bench.RUNS]
    assert len(set(names)) == len(names)
    assert set(bench.CALIBRATION.values()) <= set(names)
    for r in bench.RUNS:
        assert r.source and (r.tps > 0) != (r.mfu > 0), r.name
    # one calibration row per power limit, each run at one of them
    assert {r.power for r in bench.RUNS} == set(bench.CALIBRATION)
    for power, name in bench.CALIBRATION.items():
        run = next(r for r in bench.RUNS if r.name == name)
        assert run.power == power and run.modelled and not {"Float8"} & set(run.marks)


@pytest.mark.timeout(600)
def test_validation_rows_never_move_the_calibration(reports):
    out = _table(reports)
    lines = {x.run.name: x for x in out["lines"]}
    for name in bench.CALIBRATION.values():  # calibrated: the row's time is its measurement
        assert lines[name].calibrates and abs(lines[name].time_err) < 1e-6
    # a validation row measured twice as fast changes neither share nor any other row
    val = next(r for r in bench.RUNS if r.name == "T3 8B FSDP 128")
    runs = tuple(dataclasses.replace(r, tps=2 * r.tps) if r is val else r for r in bench.RUNS)
    moved = _table(reports, runs)
    assert moved["sustained"] == out["sustained"] and moved["reserve"] == out["reserve"]
    assert {x.run.name: x.time_err for x in moved["lines"] if x.run.name != val.name} == {
        x.run.name: x.time_err for x in out["lines"] if x.run.name != val.name}
    assert next(x for x in moved["lines"] if x.run.name == val.name).time_err != next(
        x for x in out["lines"] if x.run.name == val.name).time_err
    # the shares mean what they say: below 1, a 500 W GPU sustaining less than a 700 W one
    assert 0.4 < out["sustained"]["500 W"] < out["sustained"]["700 W"] < 1
    assert 0 < out["reserve"] < 0.2
    # the statistics are over the validation rows only, each row's error as printed
    val_lines = [x for x in out["lines"] if not x.calibrates and x.run.modelled]
    median, worst, n = out["stats"]["time"]
    assert n == len(val_lines) >= 8
    assert median == statistics.median(abs(x.time_err) for x in val_lines)
    assert worst == max(abs(x.time_err) for x in val_lines)


@pytest.mark.timeout(600)
def test_what_the_table_gets_right_and_where_it_is_off(reports):
    out = _table(reports)
    lines = {x.run.name: x for x in out["lines"]}
    # memory: within 5% at the median over the rows run as modelled (bf16, no compile). Over
    # every row the bench's simulated floors give 4.4%; the calculator's, used here, differ
    # from them where full recomputation is modelled (70B: 13%), so that one is not asserted
    assert out["stats"]["memory"][0] <= bench.MEMORY_BAND
    assert out["stats"]["memory"][2] == 2  # T3 8B FSDP 128 and the course's H200 step
    # time: the eager row it was not calibrated on within 5%; the compiled rows (fused
    # kernels, the SMs at the share the eager row gave) within 10%; the paper's rows at the
    # 700 W share taken from the course's own H200 step within 10%, inside their ranges
    assert abs(lines["T3 8B FSDP 128"].time_err) < 0.05
    for name in ("T1 8B FSDP 8 + compile", "T3 8B FSDP 128 + compile",
                 "70B FSDP 32 x TP 8, bf16"):
        assert abs(lines[name].time_err) < bench.TIME_BAND, name
    for name in [n for n in lines if n.startswith("Table 4")]:
        assert abs(lines[name].time_err) < bench.TIME_BAND, name
        low, high = lines[name].ranges["time"]
        assert low <= lines[name].time_err <= high  # the point estimate inside its range
    # where it is off, it is off one way: too fast with TP at 8B, most with async TP (taken as
    # hiding TP's collectives whole, where it won 9-10% measured): the 8B async-TP row is the
    # worst
    for name in ("8B FSDP 8 x TP 8, bf16", "70B FSDP 32 x TP 8, bf16 + async TP"):
        assert -0.2 < lines[name].time_err < -0.1, name
    worst = lines["8B FSDP 8 x TP 8, bf16 + async TP"]
    assert -0.4 < worst.time_err < -0.3
    median, most, n = out["stats"]["time"]
    assert most == abs(worst.time_err)
    # the band is met at the median, with the calibration declared before: planting the power
    # cap's share on the memory-bound kernels too (the old physics) gives 13.9%
    assert 0.05 < median <= bench.TIME_BAND
    # the numbers notebook 25 quotes: the shares, and compile's gain measured and predicted
    assert [round(out["sustained"][p], 2) for p in ("500 W", "700 W")] == [0.58, 0.62]
    eager, compiled = lines["T1 8B FSDP 8"], lines["T1 8B FSDP 8 + compile"]
    assert round(100 * (compiled.run.tps / eager.run.tps - 1)) == 16
    assert round(100 * (eager.t.seconds / compiled.t.seconds - 1)) == 23
