"""The README's numbers that the package computes are recomputed here: a change to the formulas
that moves one fails until the README says the new number."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from distlab.calculators import Layout, memory_per_device

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.quick
def test_the_gpu_tables_formulas_column_is_what_the_formulas_give_for_the_layout_it_ran():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import gpu_step
    finally:
        sys.path.remove(str(ROOT / "bench"))
    row = next(line for line in (ROOT / "README.md").read_text().splitlines()
               if line.startswith("| peak allocated memory |"))
    measured, _, formulas = (re.match(r"\s*([\d.]+) GiB(?: \(([\d.]+)\))?", cell)
                             for cell in row.split("|")[2:5])
    layout = Layout(dp=1, seq_len=gpu_step.SEQ_LEN, micro_batch=gpu_step.MICRO_BATCH)
    peak = memory_per_device(gpu_step.CONFIG, layout).peak / 2**30
    assert formulas.group(1) == f"{peak:.2f}"
    assert formulas.group(2) == f"{peak / float(measured.group(1)):.2f}"
