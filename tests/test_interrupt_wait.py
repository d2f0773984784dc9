"""After a timeout distlab interrupts the ranks and waits for them to stop: a rank blocked inside
C++ (no CPU) is called stuck at once, a rank computing inside C++ is let finish its op
(`distlab._ranks.idle.collect_interrupted`). The wait is stretched by the load, so both are
tested as on a machine 10 times slower than a quiet one (a 10 s wait)."""

from __future__ import annotations

import time

import pytest

import distlab

CLUSTER = {"world_size": 2, "timeout": 60}

#: SIGINT blocked: the rank sleeps on, using no CPU, like one waiting in a collective's C++ code
BLOCKED = (
    "import signal, time\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n"
    "time.sleep(60)"
)


def test_a_rank_blocked_inside_cpp_is_called_stuck_without_waiting_out_the_stretched_wait(
        cluster, monkeypatch):
    monkeypatch.setenv("DISTLAB_SLOWNESS", "10")  # the interrupt's 1 s wait stretched to 10
    start = time.monotonic()
    try:
        with pytest.raises(distlab.RankTimeout):
            cluster.exec(BLOCKED, ranks=[1], timeout=0.5)
        # 0.5 s, then two windows of a quarter second and the stack: not the stretched 10 s
        assert time.monotonic() - start < 6
        assert cluster.states == {0: "idle", 1: "stuck"}
    finally:
        cluster.restart(replay=False)


def test_a_rank_computing_inside_cpp_when_interrupted_is_let_finish_its_op(cluster, monkeypatch):
    # One matmul of 4000 x 4000 (128 GFLOP, about a second or more on one thread) is one C++ call:
    # the interrupt lands at 0.2 s and Python sees it only when the matmul returns. The rank uses
    # a core all along, so it is waited for (up to the stretched 10 s), then stops in Python.
    monkeypatch.setenv("DISTLAB_SLOWNESS", "10")
    cluster.exec("import torch\na = torch.randn(4000, 4000)", ranks=[0])
    with pytest.raises(distlab.RankTimeout):
        cluster.exec("b = a @ a", ranks=[0], timeout=0.2)
    assert cluster.states == {0: "idle", 1: "idle"}  # interrupted, not stuck
    assert cluster.run(_rank, ranks=[0]) == [0]


def _rank():
    import torch.distributed as dist

    return dist.get_rank()
