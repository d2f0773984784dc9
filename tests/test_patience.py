"""distlab._patience: limits that suit a quiet machine, stretched by how busy this one is now."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from distlab import _patience

pytestmark = pytest.mark.quick


@pytest.mark.parametrize(
    ("runnable", "cores", "expected"),
    [(0.2, 2, 1.0), (2.0, 2, 1.0), (4.0, 2, 2.0), (7.0, 2, 3.5), (500.0, 2, _patience.MOST)],
)
def test_slowness_is_the_runnable_tasks_per_core_at_least_1_at_most_MOST(
        monkeypatch, runnable, cores, expected):
    monkeypatch.delenv("DISTLAB_SLOWNESS", raising=False)
    monkeypatch.setattr(_patience, "_runnable", lambda: runnable)
    monkeypatch.setattr(_patience.os, "cpu_count", lambda: cores)
    assert _patience.slowness() == expected
    assert _patience.patience(1.5) == 1.5 * expected


def test_the_runnable_count_is_measured_and_counts_this_process():
    assert _patience._runnable() >= 1  # this process is running while it reads it


def test_distlab_slowness_says_it_and_a_wrong_value_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setenv("DISTLAB_SLOWNESS", "3")
    assert _patience.patience(2) == 6
    for wrong in ("0.5", "fast", "nan"):
        monkeypatch.setenv("DISTLAB_SLOWNESS", wrong)
        with pytest.raises(ValueError, match="at least 1.*unset it"):
            _patience.slowness()


def test_pytests_timeout_is_stretched_on_a_busy_machine(tmp_path):
    # A test marked timeout(1) that needs 2 s: stopped on a quiet machine, passes on one that is
    # 4 times slower (the repository's conftest.py stretches pytest-timeout's limit).
    (tmp_path / "test_slow.py").write_text(textwrap.dedent("""
        import time, pytest
        @pytest.mark.timeout(1)
        def test_needs_two_seconds():
            time.sleep(2)
    """))
    root = Path(__file__).resolve().parents[1]
    (tmp_path / "conftest.py").write_text((root / "conftest.py").read_text())

    def run(slowness: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:nbval",
             "-o", "addopts=", "-o", "timeout_method=thread", str(tmp_path / "test_slow.py")],
            cwd=tmp_path, capture_output=True, text=True, timeout=120,
            env={**os.environ, "DISTLAB_SLOWNESS": slowness})

    start = time.monotonic()
    assert run("4").returncode == 0
    quiet = run("1")
    assert quiet.returncode != 0 and "Timeout" in quiet.stdout + quiet.stderr, quiet.stdout
    assert time.monotonic() - start < 60
