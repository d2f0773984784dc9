"""distlab.stand_ins: the terminal's stderr collected, the stop button pressed, a function run
under the real torchrun."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from distlab import StartError, stand_ins


@pytest.mark.quick
def test_children_stderr_collects_what_this_process_and_its_children_write():
    before = os.fstat(2)
    # A logger with no handler anywhere up its line (pytest's own sits on the root: skip it),
    # as torch's are in a kernel: the logging module's last resort writes to sys.stderr.
    quiet = logging.getLogger("distlab.test.no_handlers")
    quiet.propagate = False
    with stand_ins.children_stderr() as collected:
        subprocess.run([sys.executable, "-c", "import os; os.write(2, b'from the child\\n')"],
                       check=True)
        os.write(2, b"from this process's descriptor\n")
        print("from sys.stderr", file=sys.stderr)
        quiet.warning("from the logging module")
        assert collected.text == ""  # filled in when the block ends
    assert collected.text.splitlines() == [
        "from the child", "from this process's descriptor", "from sys.stderr",
        "from the logging module"]
    after = os.fstat(2)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)  # fd 2 given back


@pytest.mark.quick
def test_children_stderr_gives_the_descriptor_back_when_the_block_raises():
    before, python_stderr = os.fstat(2), sys.stderr
    with pytest.raises(ZeroDivisionError), stand_ins.children_stderr() as collected:
        os.write(2, b"before the error\n")
        print(1 / 0)
    assert collected.text == "before the error\n"
    assert (os.fstat(2).st_ino, sys.stderr) == (before.st_ino, python_stderr)


@pytest.mark.quick
def test_press_stop_interrupts_the_main_thread_like_the_stop_button():
    # Python's own SIGINT handler, as in a kernel: a pytest-xdist worker ignores SIGINT (the
    # controller's Ctrl-C is for it), and a stop button would do nothing there either
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            stand_ins.press_stop(after=0.2)
            time.sleep(30)
        assert time.monotonic() - started < 10
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.quick
@pytest.mark.parametrize("after", [0, -1, True, "1", None, float("nan")])
def test_press_stop_refuses_a_delay_that_is_not_a_positive_number(after):
    with pytest.raises(ValueError, match="after must be a positive number of seconds"):
        stand_ins.press_stop(after=after)


def _report():
    t = torch.tensor([float(dist.get_rank() + 1)])  # noqa: F821 (the script's imports)
    dist.all_reduce(t)  # noqa: F821
    return {"rank": os.environ["RANK"], "world": os.environ["WORLD_SIZE"], "total": t.item()}


def _uses_a_name_the_script_lacks():
    return math.pi  # noqa: F821 (math is not imported in the script)


@pytest.mark.timeout(240)
def test_torchrun_brings_back_each_ranks_value_in_rank_order():
    run = stand_ins.torchrun(_report, nproc_per_node=3)
    assert run.returned == [{"rank": str(r), "world": "3", "total": 6.0} for r in range(3)]
    assert run.store_listens_on and all(isinstance(ip, str) for ip in run.store_listens_on)
    assert run.command[1:7] == ["-m", "torch.distributed.run", "--standalone",
                                "--nproc-per-node", "3", run.command[6]]
    assert "def _report():" in run.script


@pytest.mark.timeout(240)
def test_torchrun_failure_says_the_script_has_only_os_torch_and_dist():
    with pytest.raises(StartError, match=r"(?s)only os, torch and dist.*NameError: name 'math'"):
        stand_ins.torchrun(_uses_a_name_the_script_lacks, nproc_per_node=1)


@pytest.mark.quick
@pytest.mark.parametrize("fn, nproc, error, match", [
    (lambda: 1, 2, TypeError, "defined with def"),
    (print, 2, TypeError, "defined with def"),
    (_report, 0, ValueError, "nproc_per_node must be an int >= 1"),
    (_report, 1.5, TypeError, "nproc_per_node must be an int >= 1"),
])
def test_torchrun_refuses_what_cannot_run_as_a_script(fn, nproc, error, match):
    with pytest.raises(error, match=match):
        stand_ins.torchrun(fn, nproc_per_node=nproc)
