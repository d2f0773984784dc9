"""Shared by every test run here, notebooks included.

nbval reports a cell that raised with its traceback only. What the cell printed before it
raised (often the very values an assert compared) is lost, and a failure seen once on a busy CI
machine cannot be diagnosed afterwards. This hook adds it to the failure's report, as a section
"printed by the cell", next to pytest's own "Captured ..." sections.

And at the end of a run that compared notebooks, each notebook's time under nbval (its cells'
set-up, run and tear-down, the kernel's start included), against the course's budget: 10 s on
average, none over 15 s, on a 2-core machine. A report, never a verdict: how long a run takes
depends on the machine and on what else it is doing (`distlab._patience.slowness`, printed beside).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import defaultdict

import pytest

#: The course's time budget per notebook under nbval on a quiet 2-core machine (the brief's).
NOTEBOOK_MEAN, NOTEBOOK_MOST = 10.0, 15.0
_notebook_seconds: dict[str, float] = defaultdict(float)


def printed_by(outputs: list[dict]) -> str:
    """The text a cell wrote (streams, text results, errors), in order, as nbval collected it."""
    parts = []
    for out in outputs:
        kind = out.get("output_type")
        if kind == "stream":
            parts.append(out.get("text", ""))
        elif kind in ("execute_result", "display_data"):
            text = out.get("data", {}).get("text/plain")
            if text is not None:
                parts.append(text + "\n")
        elif kind == "error":
            parts.append(f"{out.get('ename', '')}: {out.get('evalue', '')}\n")
    return "".join(parts)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    outputs = getattr(item, "test_outputs", None)  # nbval's cell items keep what they collected
    if report.failed and call.when == "call" and outputs:
        text = printed_by(outputs)
        if text.strip():
            report.sections.append(("printed by the cell", text))


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item, settings):
    """pytest-timeout's limit (pyproject.toml's 300 s, or a test's own mark) suits a quiet
    machine; on a busy one (a laptop in a video call, CI beside other jobs) every test is slower
    by the same factor, so the limit is stretched by it (`distlab._patience.slowness`, measured as
    the test starts). A hang is still stopped, only later."""
    import pytest_timeout

    from distlab._patience import patience

    return pytest_timeout.pytest_timeout_set_timer(
        item, settings._replace(timeout=patience(settings.timeout)))


def pytest_configure(config):
    """Under pytest-xdist (`make test` runs two workers) each worker gets a temporary folder of
    its own (TMPDIR, inherited by its kernels and ranks): a test that checks that launches leave
    no files behind (tests/test_launcher.py) then sees only its own worker's."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    _share_the_cores()
    if worker and not hasattr(config, "_distlab_tmp"):
        config._distlab_tmp = tempfile.mkdtemp(prefix=f"xdist-{worker}-")
        os.environ["TMPDIR"] = config._distlab_tmp
        tempfile.tempdir = None  # gettempdir() reads TMPDIR again


def _share_the_cores() -> None:
    """Each of N workers gets cores // N threads (at least 1) for torch in the worker and in the
    kernels it starts (OMP_NUM_THREADS, read by torch at import), unless OMP_NUM_THREADS is set
    already (`make test-cpu-threads` sets it on purpose). Two workers of two torch threads each on
    two cores, beside their ranks, make every parallel region wait on a thread that has no core:
    a tiny fp16 GPT's 10 steps took 3.7 s instead of 1.1 s at a load of 7 (notebook 19's
    exercise 2, whose check runs 20 of them, took 10 s a row in `make test`). Ranks are not
    touched: distlab gives each its own share (distlab.launch's ``threads``)."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    threads = max(1, (os.cpu_count() or 1) // max(1, workers))
    if threads >= (os.cpu_count() or 1):
        return  # one worker: torch's own default
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)


def pytest_unconfigure(config):
    tmp = getattr(config, "_distlab_tmp", None)
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)


def pytest_runtest_logreport(report):
    """Adds up each notebook's time (on the controller under xdist: every report comes here)."""
    path = report.nodeid.split("::", 1)[0]
    if path.endswith(".ipynb"):
        _notebook_seconds[path] += report.duration


def notebook_times(seconds: dict[str, float], slowness: float) -> list[str]:
    """The lines of the notebook-time report: the mean, the slowest, those over the budget."""
    if not seconds:
        return []
    mean = sum(seconds.values()) / len(seconds)
    over = {p: s for p, s in seconds.items() if s > NOTEBOOK_MOST}
    slowest = sorted(seconds.items(), key=lambda kv: -kv[1])[:5]
    lines = [f"{len(seconds)} notebooks: mean {mean:.1f} s (budget {NOTEBOOK_MEAN:.0f} s), "
             f"machine's slowness now {slowness:.1f}x",
             "slowest: " + ", ".join(f"{os.path.basename(p)[:2]} {s:.1f} s" for p, s in slowest)]
    if over:
        lines.append(f"over {NOTEBOOK_MOST:.0f} s: " + ", ".join(
            f"{os.path.basename(p)} {s:.1f} s" for p, s in sorted(over.items())))
    return lines


def pytest_terminal_summary(terminalreporter):
    from distlab._patience import slowness

    lines = notebook_times(_notebook_seconds, slowness())
    if lines:
        terminalreporter.section("notebook times under nbval")
        for line in lines:
            terminalreporter.write_line(line)
