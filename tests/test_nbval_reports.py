"""The project's own pytest set-up (the root conftest.py) as a CI maintainer sees it."""

from __future__ import annotations

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
