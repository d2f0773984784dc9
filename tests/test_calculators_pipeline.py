"""distlab.calculators.pipeline_schedule: the orders torch's schedules ran in notebook 16, and
the bubbles and peaks the notebook asserts."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from distlab.calculators import CalculatorError, Schedule, pipeline_schedule

pytestmark = pytest.mark.quick

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "16_pipeline_parallelism.ipynb"


def _recorded():
    """Rank 0's and rank 3's orders as notebook 16 printed them (from torch's real schedules,
    p = 4, m = 8): {schedule: {rank: "F0 F1 ..."}}."""
    nb = json.loads(NOTEBOOK.read_text())
    for cell in nb["cells"]:
        text = "".join(o.get("text", "") if isinstance(o.get("text"), str) else "".join(
            o.get("text", [])) for o in cell.get("outputs", []))
        if "  rank 0: F0" in text:
            out, name = {}, None
            for line in text.splitlines():
                if not line.startswith(" "):  # "Interleaved1F1B (F3:s4 is ...)": the name
                    name = line.split()[0]
                else:
                    rank, order = line.strip().split(": ")
                    out.setdefault(name, {})[int(rank.split()[1])] = order
            return out
    raise AssertionError("notebook 16 no longer prints the recorded orders")


def _text(order, v=1):
    """As notebook 16 prints an order: ``F0 F1 ...``, with the stage when a rank holds several
    (``F0:s0 ... F0:s4``)."""
    return " ".join(f"{kind}{mb}" + (f":s{stage}" if v > 1 else "") for kind, stage, mb in order)


@pytest.mark.parametrize("name, v", [("GPipe", 1), ("1F1B", 1), ("Interleaved1F1B", 2)])
def test_orders_equal_what_torch_ran_in_notebook_16(name, v):
    recorded = _recorded()[name]
    s = pipeline_schedule(p=4, m=8, v=v, schedule=name)
    for rank in (0, 3):
        assert _text(s.orders[rank], v) == recorded[rank]


def test_bubbles_are_notebook_16s():
    assert pipeline_schedule(4, 8, 1, "GPipe").bubble == Fraction(3, 11)
    assert pipeline_schedule(4, 8, 1, "1F1B").bubble == Fraction(3, 11)
    assert pipeline_schedule(4, 8, 2, "Interleaved1F1B").bubble == Fraction(3, 19)
    # the notebook's first picture: one batch, then four microbatches
    assert pipeline_schedule(4, 1, 1, "GPipe").bubble == Fraction(3, 4)
    assert pipeline_schedule(4, 4, 1, "GPipe").bubble == Fraction(3, 7)
    assert isinstance(pipeline_schedule().bubble, Fraction)


def test_peaks_in_flight_are_notebook_16s():
    assert pipeline_schedule(4, 8, 1, "GPipe").peaks == (8, 8, 8, 8)
    assert pipeline_schedule(4, 8, 1, "1F1B").peaks == (4, 3, 2, 1)
    # Megatron's warm-up, (p - r - 1) * 2 + (v - 1) * p forwards, then one more
    assert pipeline_schedule(4, 8, 2, "Interleaved1F1B").peaks == (11, 9, 7, 5)


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("m", [1, 5, 8, 27])
def test_gpipe_bubble_is_p_minus_1_over_m_plus_p_minus_1(p, m):
    assert pipeline_schedule(p, m, schedule="GPipe").bubble == Fraction(p - 1, m + p - 1)
    if m >= p:
        s = pipeline_schedule(p, m, schedule="1F1B")
        assert s.bubble == Fraction(p - 1, m + p - 1)
        assert s.peaks == tuple(p - r for r in range(p))


def test_interleaving_shrinks_the_bubble_to_the_formula_when_m_is_a_multiple_of_p():
    for p, m, v in [(2, 4, 2), (4, 8, 2), (4, 8, 4), (8, 16, 2)]:
        s = pipeline_schedule(p, m, v, "Interleaved1F1B")
        assert s.bubble == s.formula() == Fraction(p - 1, v * m + p - 1), (p, m, v)


def test_every_schedule_accepted_plays_out_without_deadlock_and_runs_every_action_once():
    for p in range(1, 7):
        for m in range(1, 13):
            for name, vs in (("GPipe", [1]), ("1F1B", [1]), ("Interleaved1F1B", [2, 3])):
                for v in vs:
                    try:
                        s = pipeline_schedule(p, m, v, name)
                    except CalculatorError:
                        continue
                    runs = sorted((k, st, mb) for o in s.orders for k, st, mb in o)
                    assert runs == sorted((k, st, mb) for k in "FB" for st in range(p * v)
                                          for mb in range(m)), (p, m, v, name)


def test_text_is_the_grid_and_the_numbers():
    s = pipeline_schedule(4, 8, 1, "1F1B")
    assert isinstance(s, Schedule) and repr(s) == s.text()
    lines = s.text().splitlines()
    assert "bubble 3/11 = 27.3%" in lines[2]
    assert lines[3] == "in flight at the peak, ranks 0..3: [4, 3, 2, 1]"
    assert lines[-1] == ("rank 3: .  .  .  F0 B0 -  F1 B1 -  F2 B2 -  F3 B3 -  F4 B4 -  F5 B5 -  "
                         "F6 B6 -  F7 B7 -  .  .  .  .  .  .")
    grid = s.grid()
    assert len(grid) == 4 and len(grid[0]) == s.span == 33  # (m + p - 1) x 3 time units
    assert sum(cell is None for row in grid for cell in row) == 4 * 33 - 4 * 8 * 3


def test_interleaved_grid_names_each_ranks_stages():
    s = pipeline_schedule(4, 8, 2, "Interleaved1F1B")
    assert s.slot == Fraction(1, 2)
    assert s.text().splitlines()[-4].startswith("rank 0: F0a F1a F2a F3a F0b F1b")


def test_chart_is_a_png_that_changes_with_the_schedule():
    a, b = pipeline_schedule(4, 8).chart().png(), pipeline_schedule(4, 9).chart().png()
    assert a[:4] == b"\x89PNG" and a != b
    assert a == pipeline_schedule(4, 8).chart().png()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(p=4, m=2, schedule="1F1B"), "1F1B needs at least as many microbatches as ranks "
                                          "(m=2 < p=4)"),
        (dict(p=4, m=8, v=2, schedule="1F1B"), "needs schedule='Interleaved1F1B'"),
        (dict(p=4, m=8, v=1, schedule="Interleaved1F1B"), "choose v=2 or more"),
        (dict(p=4, m=9, v=2, schedule="Interleaved1F1B"),
         "m=9 is not; choose m in 5, 6, 7, 8, 10, 12"),
        (dict(p=0), "p must be a whole number >= 1, got 0"),
        (dict(m=2.5), "m must be a whole number >= 1, got 2.5"),
        (dict(schedule="ZeroBubble"), "schedule='ZeroBubble' is not one of"),
        (dict(backward=0), "backward must be a positive number"),
    ],
)
def test_bad_input_says_what_to_choose(kwargs, message):
    with pytest.raises(CalculatorError, match=None) as info:
        pipeline_schedule(**kwargs)
    assert message in str(info.value)
