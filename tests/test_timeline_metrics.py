"""distlab.timeline.metrics: compute, comm, overlap, idle and wait, each case on a hand-made
trace (times in microseconds; the ranks meet at 100). The same cases run for real in
tests/test_timeline.py."""

from __future__ import annotations

import pytest
from synthetic_traces import trace

from distlab import timeline

pytestmark = pytest.mark.quick

US = 1e-6
OP, LABEL = "cpu_op", "user_annotation"


def test_compute_comm_overlap_idle_and_wait_from_a_known_trace():
    # Rank 0: computes 100-300 us, calls all_reduce at 150; gloo runs it 160-500 (rank 1 is
    # late: it calls at 400). Rank 1: computes 300-400, its gloo part runs 410-500.
    r0 = trace(
        0,
        main=[("aten::mm", OP, 100, 300), ("c10d::allreduce_", OP, 150, 160)],
        gloo=[("gloo:all_reduce", LABEL, 160, 500)],
    )
    r1 = trace(
        1,
        main=[("aten::mm", OP, 300, 400), ("c10d::allreduce_", OP, 400, 410)],
        gloo=[("gloo:all_reduce", LABEL, 410, 500)],
    )
    tl = timeline.Timeline([r0, r1])
    assert tl.duration == pytest.approx(400 * US)  # from the sync's end (100) to 500
    assert tl.compute(0) == pytest.approx(190 * US)  # 100-300 minus the call 150-160
    assert tl.comm(0) == pytest.approx(350 * US)  # 150-500
    assert tl.overlap(0) == pytest.approx(140 * US)  # 160-300: async, the op went on
    assert tl.idle(0) == pytest.approx(0.0)
    # Arrivals are the calls (150 and 400), not gloo's start: rank 0 waited 250 us.
    assert tl.waits(0) == [("c10d::allreduce_", pytest.approx(250 * US))]
    assert tl.wait(1) == 0.0
    assert tl.idle(1) == pytest.approx(200 * US)  # 100-300
    assert tl.find(0, "gloo:all_reduce")[0].issued_by is None  # no label around the call
    assert (
        repr(tl)
        == "Timeline: 2 ranks, CPU\nranks 0,1:\n  c10d::allreduce_\n  comm: gloo:all_reduce x1"
    )


def _blocking_in_hook(rank, late=0):
    """AccumulateGrad (100-500) runs a hook that all-reduces and waits (distlab:wait) until gloo
    is done: the op spans the whole wait."""
    start = 110 + late
    return trace(
        rank,
        main=[
            ("torch::autograd::AccumulateGrad", OP, 100, 500),
            ("aten::add_", OP, 102, 108),
            ("c10d::allreduce_", OP, start, start + 5),
            ("distlab:wait", LABEL, start + 5, 480),
        ],
        gloo=[("gloo:all_reduce", LABEL, start + 5, 480)],
    )


def test_an_op_blocked_in_a_hooks_wait_is_not_compute_and_does_not_overlap():
    tl = timeline.Timeline([_blocking_in_hook(0), _blocking_in_hook(1)])
    for r in range(2):
        assert tl.compute(r) == pytest.approx(30 * US)  # 100-110 and 480-500 only
        assert tl.overlap(r) == 0.0  # nothing computed while the all_reduce ran
        assert tl.comm(r) == pytest.approx(370 * US)  # 110-480
    assert [e.kind for e in tl.events(0) if e.name == "distlab:wait"] == ["wait"]
    assert "distlab:wait" not in tl.names(0, depth=None)  # not a label: not in the text


def test_async_collectives_under_later_ops_overlap():
    # DDP-like: a bucket's all_reduce is issued at 150 and runs on gloo's thread 155-400 while
    # the backward goes on (ops 160-390); the wait at the end (400-420) is short.
    def rank(r):
        return trace(
            r,
            main=[
                ("c10d::allreduce_", OP, 150, 155),
                ("aten::mm", OP, 160, 390),
                ("distlab:wait", LABEL, 400, 420),
            ],
            gloo=[("gloo:all_reduce", LABEL, 155, 420)],
        )

    tl = timeline.Timeline([rank(0), rank(1)])
    assert tl.overlap(0) == pytest.approx(230 * US)  # 160-390
    assert tl.compute(0) == pytest.approx(230 * US)
    assert tl.overlap(0) / tl.comm(0) > 0.8


def test_two_collectives_waiting_for_the_same_late_rank_count_it_once():
    # Rank 0 issues two async all_reduces at 110 and 120; rank 1 calls both 300 us later.
    r0 = trace(
        0,
        main=[("c10d::allreduce_", OP, 110, 112), ("c10d::allreduce_", OP, 120, 122)],
        gloo=[("gloo:all_reduce", LABEL, 112, 420), ("gloo:all_reduce", LABEL, 122, 430)],
    )
    r1 = trace(
        1,
        main=[("c10d::allreduce_", OP, 410, 412), ("c10d::allreduce_", OP, 420, 422)],
        gloo=[("gloo:all_reduce", LABEL, 412, 420), ("gloo:all_reduce", LABEL, 422, 430)],
    )
    tl = timeline.Timeline([r0, r1])
    assert [w for _, w in tl.waits(0)] == [pytest.approx(300 * US)] * 2
    assert tl.wait(0) == pytest.approx(310 * US)  # 110-420 once, not 600
    assert tl.wait(1) == 0.0


def test_a_straggler_makes_every_other_rank_wait_and_waits_nothing_itself():
    def rank(r, arrive):
        return trace(
            r,
            main=[("c10d::allreduce_", OP, arrive, arrive + 5)],
            gloo=[("gloo:all_reduce", LABEL, arrive + 5, 600)],
        )

    tl = timeline.Timeline([rank(0, 110), rank(1, 120), rank(2, 550)])
    assert [round(tl.wait(r) / US) for r in range(3)] == [440, 430, 0]
    stats = tl.stats()
    for s in stats:
        assert s["compute"] + s["comm"] - s["overlap"] + s["idle"] == pytest.approx(s["total"])


def test_fsdp_style_prefetch_overlaps_until_its_wait():
    # The next layer's all_gather is issued (110), the current layer computes 115-300, then the
    # rank waits for the gather (300-350): overlap is the compute under the gather, no more.
    def rank(r):
        return trace(
            r,
            main=[
                ("FSDP::pre_forward", LABEL, 105, 360),
                ("c10d::_allgather_base_", OP, 110, 115),
                ("aten::mm", OP, 115, 300),
                ("distlab:wait", LABEL, 300, 350),
                ("aten::mm", OP, 350, 380),
            ],
            gloo=[("gloo:all_gather", LABEL, 115, 350)],
        )

    tl = timeline.Timeline([rank(0), rank(1)])
    assert tl.overlap(0) == pytest.approx(185 * US)  # 115-300
    assert tl.compute(0) == pytest.approx(215 * US)  # 115-300 and 350-380
    assert tl.find(0, "gloo:all_gather")[0].issued_by == "FSDP::pre_forward"


def test_autograd_wrappers_are_not_compute_they_span_the_hooks_waits():
    # A backward node's wrapper spans an FSDP-style hook that waits 200-400 for a collective.
    main = [
        ("autograd::engine::evaluate_function: AddmmBackward0", OP, 100, 500),
        ("AddmmBackward0", OP, 100, 500),
        ("aten::mm", OP, 110, 190),
        ("c10d::_reduce_scatter_base_", OP, 195, 200),
    ]
    gloo = [("gloo:all_reduce", LABEL, 200, 400)]
    tl = timeline.Timeline([trace(0, main=main, gloo=gloo), trace(1, main=main, gloo=gloo)])
    assert [e.name for e in tl.events(0, "op")] == ["aten::mm"]
    assert tl.compute(0) == pytest.approx(80e-6)
    assert tl.overlap(0) == 0.0
