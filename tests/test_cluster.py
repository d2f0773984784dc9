"""distlab.Cluster: persistent ranks, push/pull, errors that leave the cluster usable, clean-up."""

from __future__ import annotations

import os
import sys
import time

import cloudpickle
import psutil
import pytest
import torch
import torch.distributed as dist

import distlab

cloudpickle.register_pickle_by_value(sys.modules[__name__])


CLUSTER = {"world_size": 3, "timeout": 30}


def _rank_and_pid():
    return dist.get_rank(), os.getpid()


def test_run_returns_one_value_per_live_rank_and_the_processes_persist(cluster):
    first = cluster.run(_rank_and_pid)
    second = cluster.run(_rank_and_pid)
    assert [r for r, _ in first] == [0, 1, 2]
    assert first == second  # same processes: nothing was restarted
    assert cluster.run(_rank_and_pid, ranks=[0, 2]) == [first[0], first[2]]


def test_push_and_pull_move_values_between_kernel_and_ranks(cluster):
    cluster.push(lr=0.5, t=torch.arange(3))
    assert cluster.pull("lr") == [0.5, 0.5, 0.5]
    cluster.exec("import torch.distributed as dist\nt = t * (dist.get_rank() + 1)")
    assert [x.tolist() for x in cluster.pull("t")] == [[0, 1, 2], [0, 2, 4], [0, 3, 6]]
    with pytest.raises(distlab.RankError, match="name 'nope' is not defined on this rank"):
        cluster.pull("nope")
    with pytest.raises(TypeError, match="needs name=value pairs"):
        cluster.push()


def test_exec_keeps_a_namespace_per_rank_and_returns_the_last_expression(cluster):
    cluster.exec("import torch.distributed as dist\nmine = 10 * dist.get_rank()")
    out = cluster.exec("mine + 1")
    assert list(out) == ["1", "11", "21"]
    assert repr(out) == "[rank 0] 1\n[rank 1] 11\n[rank 2] 21"
    assert list(cluster.exec("y = 1")) == [None, None, None]


def _raise_on_rank_1():
    if dist.get_rank() == 1:
        raise ZeroDivisionError("oops on 1")
    return "fine"


def test_python_error_raises_and_the_cluster_stays_usable(cluster):
    with pytest.raises(distlab.RankError) as info:
        cluster.run(_raise_on_rank_1)
    assert info.value.primary.rank == 1 and info.value.primary.type == "ZeroDivisionError"
    assert cluster.states == {0: "idle", 1: "idle", 2: "idle"}
    assert cluster.run(_rank_and_pid)[1][0] == 1


def _fail_while_others_wait():
    if dist.get_rank() == 1:
        raise ValueError("rank 1 gives up")
    dist.barrier()


def test_failure_while_others_wait_in_a_collective_interrupts_them(cluster):
    start = time.monotonic()
    with pytest.raises(distlab.RankError) as info:
        cluster.run(_fail_while_others_wait)
    assert time.monotonic() - start < 10
    assert info.value.primary.rank == 1
    err = info.value
    # ranks 0 and 2 wait inside gloo's barrier (C++): they are reported stuck, with their line
    # ranks 0 and 2 sit in gloo's barrier (C++), where an interrupt cannot reach them
    assert sorted(err.stuck) == [0, 2] and err.stopped == []
    assert [f.rank for f in err.failures] == [1]
    for r in err.stuck:
        assert "dist.barrier()" in err.stuck[r] and cluster.states[r] == "stuck"
    assert "cluster.restart()" in str(err)
    cluster.restart()  # the barrier was cut halfway: start clean for the next tests
    assert cluster.states == {0: "idle", 1: "idle", 2: "idle"}


def _sleep_long():
    time.sleep(60)


def test_a_per_call_timeout_wins_over_the_clusters(cluster):
    assert cluster.timeout == 30
    for call in (
        lambda: cluster.run(_sleep_long, ranks=[0], timeout=1),
        lambda: cluster.exec("import time\ntime.sleep(60)", ranks=[0], timeout=1),
    ):
        start = time.monotonic()
        with pytest.raises(distlab.RankTimeout, match=r"did not finish within 1 s"):
            call()
        assert time.monotonic() - start < 10  # 1 s, then the interrupt: not the cluster's 30
    assert cluster.states == {0: "idle", 1: "idle", 2: "idle"}


def test_timeout_shows_the_stacks_and_interrupts_the_ranks(cluster):
    with pytest.raises(distlab.RankTimeout) as info:
        cluster.exec("import time\ntime.sleep(60)  # a long wait", ranks=[0, 1], timeout=1)
    err = info.value
    assert err.ranks == [0, 1]
    assert "time.sleep(60)  # a long wait" in err.stacks[0]
    assert "usable again" in str(err)
    assert cluster.states == {0: "idle", 1: "idle", 2: "idle"}
    assert cluster.run(_rank_and_pid)[0][0] == 0


def test_a_rank_that_cannot_be_interrupted_is_reported_stuck_until_restart(cluster):
    code = (
        "import signal, time\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # like C++ ignoring Ctrl-C\n"
        "time.sleep(60)"
    )
    with pytest.raises(distlab.RankTimeout) as info:
        cluster.exec(code, ranks=[2], timeout=1)
    assert "cluster.restart()" in str(info.value)
    assert cluster.states[2] == "stuck"
    with pytest.raises(distlab.ClusterBroken, match="rank 2 is stuck"):
        cluster.run(_rank_and_pid)
    old = cluster.run(_rank_and_pid, ranks=[0])
    cluster.restart()
    assert cluster.states == {0: "idle", 1: "idle", 2: "idle"}
    assert cluster.run(_rank_and_pid, ranks=[0]) != old


def test_restart_replays_what_set_the_ranks_up_and_nothing_that_failed():
    with distlab.Cluster(world_size=2, timeout=30) as c:
        c.exec("x = torch.tensor([rank * 10])")
        c.push(y=5)
        c.exec("z = int(x) + y", ranks=[1])
        with pytest.raises(distlab.RankError):
            c.exec("w = 1 / 0")
        old = c.run(_rank_and_pid)
        assert c.restart() == 4  # two execs, a push and a run; not the one that failed
        assert c.run(_rank_and_pid) != old  # new processes ...
        assert [t.tolist() for t in c.pull("x")] == [[0], [10]]  # ... that have x, y and z back
        assert c.pull("y") == [5, 5] and c.pull("z", ranks=[1]) == [15]
        assert c.restart(replay=False) == 0
        assert c.exec("'x' in globals()") == ["False", "False"]


def test_bad_ranks_are_refused(cluster):
    with pytest.raises(ValueError, match="between 0 and 2"):
        cluster.run(_rank_and_pid, ranks=[3])
    with pytest.raises(ValueError, match="non-empty"):
        cluster.run(_rank_and_pid, ranks=[])


def test_shutdown_leaves_no_processes_and_is_idempotent():
    with distlab.Cluster(world_size=2) as c:
        pids = [p for _, p in c.run(_rank_and_pid)]
        assert all(psutil.pid_exists(p) for p in pids)
    assert c.closed
    gone = [p for p in pids if not psutil.pid_exists(p) or psutil.Process(p).status() == "zombie"]
    assert gone == pids
    c.shutdown()
    with pytest.raises(RuntimeError, match="has been shut down"):
        c.run(_rank_and_pid)
    assert "shut down" in repr(c)


def test_the_most_recent_cluster_is_current():
    from distlab import cluster as cluster_mod

    with distlab.Cluster(world_size=1) as a:
        with distlab.Cluster(world_size=2) as b:
            assert cluster_mod.current() is b
        assert cluster_mod.current() is a


def test_status_view_text_names_each_rank_state(cluster):
    view = cluster.widget()
    assert repr(view) == "cluster (gloo): rank 0 idle, rank 1 idle, rank 2 idle"
    assert "rank 2" in view.widget.value and "ms" in view.widget.value
