"""distlab.faults: a rank that dies on purpose, and a launch whose survivors go on."""

from __future__ import annotations

import os

import pytest
from processes import alive

import distlab
from distlab import faults


def _survive_a_death(crash, path):
    """Every rank writes its pid (and a child's), rank 1 dies after step 1 as `crash` says, the
    others catch gloo's error and return what it said."""
    import subprocess
    import sys

    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with open(os.path.join(path, f"pids-{rank}"), "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    dist.barrier()
    crash.here(1)
    try:
        dist.all_reduce(torch.ones(1))
    except RuntimeError as e:
        return f"rank {rank} caught {type(e).__name__}"
    finally:
        if rank != crash.rank:
            child.kill()
            child.wait()
    return "no error"


def _pids(path, world_size):
    pids = []
    for r in range(world_size):
        with open(os.path.join(path, f"pids-{r}")) as f:
            pids += [int(p) for p in f.read().split()]
    return pids


@pytest.mark.parametrize("how, exitcode", [("exit", 13), ("SIGKILL", -9)])
def test_survivors_go_on_after_a_rank_dies_and_nothing_is_left_behind(tmp_path, how, exitcode):
    crash = faults.Crash(rank=1, step=1, how=how)
    outcome = faults.launch(_survive_a_death, crash, str(tmp_path), world_size=3, timeout=30)
    assert outcome.dead == [1] and outcome.survivors == [0, 2]
    assert outcome == ["rank 0 caught RuntimeError", None, "rank 2 caught RuntimeError"]
    assert outcome.failures[1].exitcode == exitcode and outcome.failures[1].stage == "died"
    assert "2 of 3 ranks finished" in repr(outcome)
    # every rank, and the child the dead rank started, is gone
    assert alive(_pids(tmp_path, 3)) == []


def _uncaught(crash):
    import torch
    import torch.distributed as dist

    dist.barrier()
    crash.here(1)
    dist.all_reduce(torch.ones(1))


def test_a_survivor_that_does_not_catch_the_error_is_a_rank_error():
    with pytest.raises(distlab.RankError) as info:
        faults.launch(_uncaught, faults.Crash(rank=0, step=1), world_size=2, timeout=30)
    assert info.value.primary.rank == 0 and info.value.primary.stage == "died"
    assert [f.rank for f in info.value.failures] == [0, 1] and info.value.failures[1].consequence


def _survivor_hangs(crash):
    import time

    crash.here(1)
    time.sleep(60)


def test_a_survivor_still_running_at_the_timeout_is_stopped():
    with pytest.raises(distlab.RankError) as info:
        faults.launch(_survivor_hangs, faults.Crash(rank=1, step=1), world_size=2, timeout=2)
    assert info.value.primary.rank == 1 and info.value.stopped == [0]


def _nothing():
    return "fine"


def test_without_a_death_it_is_launch():
    outcome = faults.launch(_nothing, world_size=2)
    assert outcome == ["fine", "fine"] and outcome.dead == [] and outcome.survivors == [0, 1]


def test_crash_happens_only_on_its_rank_and_step():
    crash = faults.Crash(rank=1, step=3)
    crash.here(3, rank=0)  # another rank: nothing
    crash.here(2, rank=1)  # another step: nothing
    crash.here(3)  # this process's RANK is not 1 (unset here): nothing


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"rank": -1, "step": 1}, ValueError, "rank must be"),
        ({"rank": 0, "step": 0}, ValueError, "step must be"),
        ({"rank": 1.5, "step": 1}, TypeError, "rank must be"),
        ({"rank": 0, "step": 1, "how": "SIGTERM"}, ValueError, "use one of"),
        ({"rank": 0, "step": 1, "code": 256}, ValueError, "an exit code"),
    ],
)
def test_a_crash_that_cannot_happen_is_refused(kwargs, error, words):
    with pytest.raises(error, match=words):
        faults.Crash(**kwargs)


def _die_at_step_1(crash):
    crash.here(1)
    return "lived"


@pytest.mark.parametrize(
    "how, code, exitcode, words",
    [
        ("exit", 3, 3, "exited with code 3"),
        ("SIGSEGV", 13, -11, "killed by signal SIGSEGV"),
        ("SIGKILL", 13, -9, "killed by signal SIGKILL"),
    ],
)
def test_a_crash_ends_its_rank_the_way_it_says(how, code, exitcode, words):
    # Not the defaults: an exit code other than 13, each signal (what the learner reads in the
    # outcome is how the rank died).
    crash = faults.Crash(rank=1, step=1, how=how, code=code)
    outcome = faults.launch(_die_at_step_1, crash, world_size=2, backend=None, timeout=60)
    assert outcome == ["lived", None] and outcome.dead == [1]
    assert outcome.failures[1].exitcode == exitcode
    assert words in outcome.failures[1].message and words in repr(outcome)


def _survivor_needs_3_seconds(crash):
    import time

    crash.here(1)
    time.sleep(3)
    return "finished"


def test_survivors_get_the_timeout_after_a_death_not_a_moment():
    # distlab.launch gives the others half a second after a failure; faults.launch gives them
    # the whole timeout: a survivor that needs 3 s after rank 1 died still finishes.
    outcome = faults.launch(_survivor_needs_3_seconds, faults.Crash(rank=1, step=1),
                            world_size=2, backend=None, timeout=60)
    assert outcome == ["finished", None] and outcome.dead == [1] and outcome.survivors == [0]


def _regroup_without_rank_1(path, reverse):
    """3 ranks meet and all-reduce; rank 1 leaves; 0 and 2 exchange handles through the store
    and reconfigure (in ``reverse`` order: 2 becomes rank 0), then all-reduce again."""
    import datetime

    import torch
    import torch.distributed as dist

    me = int(os.environ["RANK"])
    store = dist.FileStore(os.path.join(path, "store"), 3)
    dist.init_process_group("gloo", store=store, rank=me, world_size=3, enable_reconfigure=True,
                            timeout=datetime.timedelta(seconds=20))
    group = dist.group.WORLD

    def meet(generation, members):
        here = dist.PrefixStore(f"generation-{generation}", store)
        here.set(str(me), group.get_reconfigure_handle())
        faults.reconfigure(group, generation, [here.get(str(m)).decode() for m in members])

    meet(1, [0, 1, 2])  # no members until the first reconfigure
    x = torch.tensor([10.0 ** me])
    dist.all_reduce(x)
    if me == 1:
        return x.item(), None
    meet(2, [2, 0] if reverse else [0, 2])
    y = torch.tensor([10.0 ** me])
    dist.all_reduce(y, group=group)
    return x.item(), (group.rank(), group.size(), y.item())


@pytest.mark.parametrize("reverse", [False, True])
def test_reconfigure_rebuilds_the_group_on_the_members_in_the_handles_order(tmp_path, reverse):
    results = distlab.launch(_regroup_without_rank_1, str(tmp_path), reverse, world_size=3,
                             backend=None, timeout=60)
    assert [x for x, _ in results] == [111.0] * 3
    ranks = (1, 0) if reverse else (0, 1)
    assert [after for _, after in results] == [(ranks[0], 2, 101.0), None, (ranks[1], 2, 101.0)]


def test_reconfigure_refuses_a_group_that_cannot_and_no_handles():
    from types import SimpleNamespace

    from distlab.errors import InputError

    with pytest.raises(InputError, match="shrink_group"):  # NCCL's, or a backend without it
        faults.reconfigure(SimpleNamespace(supports_reconfigure=False), 1, ["handle"])
    with pytest.raises(InputError, match="get_reconfigure_handle"):
        faults.reconfigure(SimpleNamespace(supports_reconfigure=True), 1, [])
