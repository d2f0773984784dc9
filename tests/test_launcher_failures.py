"""distlab.launch when a rank fails: it raises, hangs, dies, cannot send or be sent what it was
given, or does not start in time; each is reported with what the learner needs to fix it.

Functions here are shipped by value (as notebook cells are).
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time

import cloudpickle
import psutil
import pytest
import torch
import torch.distributed as dist
from test_launcher import _pid, _rank_info

import distlab
from distlab._patience import patience, slowness

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _fail_on_rank_1():
    if dist.get_rank() == 1:
        raise ValueError("rank 1 has a bad batch")
    t = torch.ones(1)
    dist.all_reduce(t)  # rank 0 waits here for rank 1, which never comes
    return t


def test_failing_rank_raises_rank_error_with_root_cause_first():
    start = time.monotonic()
    with pytest.raises(distlab.RankError) as info:
        distlab.launch(_fail_on_rank_1, world_size=2, timeout=30)
    # not after the timeout (10 s on a quiet machine, more on a busy one)
    assert time.monotonic() - start < min(patience(10), 25)
    err = info.value
    assert err.primary.rank == 1
    assert err.primary.type == "ValueError"
    assert err.primary.message == "rank 1 has a bad batch"
    assert "_fail_on_rank_1" in err.primary.traceback
    assert 'raise ValueError("rank 1 has a bad batch")' in err.primary.traceback
    # rank 0 waits in the all_reduce for rank 1, which is alive but will never call it: distlab
    # stops rank 0 after the grace, and rank 0 has no failure of its own to report
    assert err.stopped == [0] and [f.rank for f in err.failures] == [1]
    assert str(err).startswith("rank 1 raised: ValueError: rank 1 has a bad batch")


def _all_raise():
    raise KeyError(f"missing {dist.get_world_size()}")


def test_same_error_on_every_rank_is_shown_once():
    with pytest.raises(distlab.RankError) as info:
        distlab.launch(_all_raise, world_size=2)
    assert [f.rank for f in info.value.failures] == [0, 1]
    assert "--- ranks 0, 1 ---" in str(info.value)
    assert str(info.value).count("KeyError: 'missing 2'") == 2  # headline + one traceback


def _hang_on_rank_0():
    if dist.get_rank() == 0:
        t = torch.ones(1)
        dist.all_reduce(t)  # rank 1 never joins
    return "done"


def test_hung_rank_is_reported_with_its_stack():
    start, slow = time.monotonic(), slowness()
    with pytest.raises(distlab.RankTimeout) as info:
        distlab.launch(_hang_on_rank_0, world_size=2, timeout=3)
    elapsed = time.monotonic() - start
    assert 3 <= elapsed < 10 * max(slow, slowness())  # the learner's 3 s, then the report
    err = info.value
    assert isinstance(err, TimeoutError)
    assert err.ranks == [0] and err.finished == [1]
    assert "_hang_on_rank_0" in err.stacks[0]
    assert "dist.all_reduce(t)  # rank 1 never joins" in err.stacks[0]
    assert "rank 0 is stuck here" in str(err)


def _die(how):
    # Both ranks past gloo's connection set-up first: a rank that dies while a peer is still
    # connecting makes that peer fail too ("Connection closed by peer"), seen once in CI.
    dist.barrier()
    if dist.get_rank() != 1:
        time.sleep(30)
        return
    if how == "exit":
        os._exit(3)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "segfault":
        import ctypes

        ctypes.string_at(0)


@pytest.mark.parametrize(
    "how, expected",
    [
        ("exit", "exited with code 3"),
        ("kill", "killed by signal SIGKILL"),
        ("segfault", "killed by signal SIGSEGV (segmentation fault"),
    ],
)
def test_dead_rank_is_reported_within_seconds(how, expected, capsys):
    start = time.monotonic()
    with pytest.raises(distlab.RankError) as info:
        distlab.launch(_die, how, world_size=2, timeout=60)
    assert time.monotonic() - start < 5
    err = info.value
    assert err.primary.rank == 1 and err.primary.stage == "died"
    assert expected in err.primary.message
    # rank 0 sleeps in Python (no collective to fail in): distlab stops it
    assert (err.stopped, [f.rank for f in err.failures]) == ([0], [1]), str(err)
    if how == "segfault":  # faulthandler's dump of the crash is kept
        assert "Segmentation fault" in err.primary.output_tail
        assert "_die" in err.primary.output_tail
        # ... without its list of loaded C extensions, which changes from run to run
        shown = capsys.readouterr().out
        assert "[rank 1] Fatal Python error: Segmentation fault" in shown
        assert "Extension modules" not in shown + err.primary.output_tail


def test_bad_input_is_refused_with_clear_errors():
    with pytest.raises(TypeError, match="world_size must be an int"):
        distlab.launch(_rank_info, world_size="2")
    with pytest.raises(TypeError, match="world_size must be an int"):
        distlab.launch(_rank_info, world_size=2.0)
    with pytest.raises(ValueError, match="at least 1"):
        distlab.launch(_rank_info, world_size=0)
    with pytest.raises(ValueError, match="unknown backend 'mpi2'"):
        distlab.launch(_rank_info, backend="mpi2")
    with pytest.raises(ValueError, match="needs one CUDA GPU per rank"):
        distlab.launch(_rank_info, backend="nccl", world_size=torch.cuda.device_count() + 1)
    with pytest.raises(TypeError, match=r"launch\(work\(\)\) instead of launch\(work\)"):
        distlab.launch(None)
    with pytest.raises(TypeError, match="needs a function"):
        distlab.launch(42)
    with pytest.raises(ValueError, match="timeout must be positive"):
        distlab.launch(_rank_info, timeout=0)


def _identity(x=None, **kw):
    return x


def test_unpicklable_argument_is_named_before_anything_starts():
    import threading

    with pytest.raises(distlab.ShipError, match=r"positional argument 0 \(lock\) cannot be sent"):
        distlab.launch(_identity, threading.Lock())
    with pytest.raises(distlab.ShipError, match=r"keyword argument 'log' \(TextIOWrapper\)"):
        with tempfile.TemporaryFile("w") as f:
            distlab.launch(_identity, log=f)


def _returns_a_lock():
    import threading

    return threading.Lock()


def test_unpicklable_return_value_is_an_error_not_a_hang():
    with pytest.raises(distlab.RankError) as info:
        distlab.launch(_returns_a_lock, world_size=2, timeout=30)
    assert info.value.primary.stage == "result"
    assert "cannot be sent back to the notebook" in str(info.value)
    assert "lock" in info.value.primary.message




def test_ranks_that_do_not_start_in_time_are_named_and_nothing_is_left_behind():
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    start = time.monotonic()
    with pytest.raises(distlab.StartError) as info:
        distlab.launch(_pid, world_size=2, start_timeout=0.001)
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert message.startswith("rank 0 did not start within 0.001 s: it was still ")
    assert "rank 1 did not start within 0.001 s" in message
    assert "Pass start_timeout=" in message
    after = {p.pid for p in me.children(recursive=True)} - before - _spare_pids()
    assert not [p for p in after if psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def _spare_pids() -> set[int]:
    """The spawn path's spares: interpreters waiting to become ranks, not anyone's leftovers."""
    from distlab._ranks import spawn

    return {s.proc.pid for s in spawn.get()._spares}


def test_the_timeout_counts_from_the_learners_code_not_from_loading_it(tmp_path, monkeypatch):
    # The function lives in a module that takes 2 s to import: every rank imports it while it
    # loads the task, before its code begins. A 1 s timeout is the function's, not the import's.
    (tmp_path / "slow_to_import.py").write_text(
        "import time\ntime.sleep(2)\n\ndef quick():\n    return 'done'\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    import slow_to_import

    assert distlab.launch(slow_to_import.quick, world_size=2, timeout=1) == ["done", "done"]
