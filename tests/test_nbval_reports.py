"""The project's own pytest set-up (the root conftest.py) as a CI maintainer sees it."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

from distlab._patience import patience

ROOT = Path(__file__).resolve().parent.parent


def test_a_failing_cell_shows_what_it_printed(tmp_path):
    # nbval alone reports only the traceback; the project's conftest adds what the cell printed,
    # so that a failure seen once on a busy CI machine can be diagnosed from the log.
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell('errors = ["late", "missing"]\nprint("got:", errors)\n'
                                     'assert errors == ["missing"] * 2')
    cell.execution_count = 1
    nb.cells = [cell]
    nbformat.write(nb, tmp_path / "failing.ipynb")
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--nbval",
         "--nbval-current-env", "failing.ipynb"],
        cwd=tmp_path, capture_output=True, text=True, timeout=patience(120),
    )
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "printed by the cell" in proc.stdout
    assert "got: ['late', 'missing']" in proc.stdout
    # and the notebook's time, with the machine's slowness beside it
    times = proc.stdout.split("notebook times under nbval", 1)[1]
    assert "1 notebooks: mean" in times and "slowness now" in times and "slowest: fa " in times


def test_the_notebook_times_name_each_one_over_the_budget():
    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)  # the root one (tests/ has its own)
    spec.loader.exec_module(conftest)

    seconds = {"notebooks/00_a.ipynb": 9.0, "notebooks/25_b.ipynb": 15.5,
               "notebooks/26_c.ipynb": 15.0, "notebooks/03_d.ipynb": 4.0}
    lines = conftest.notebook_times(seconds, 1.3)
    assert lines[0] == "4 notebooks: mean 10.9 s (budget 10 s), machine's slowness now 1.3x"
    assert lines[1] == "slowest: 25 15.5 s, 26 15.0 s, 00 9.0 s, 03 4.0 s"
    assert lines[2] == "over 15 s: 25_b.ipynb 15.5 s"  # 15.0 is within
    assert conftest.notebook_times({}, 1.0) == []
