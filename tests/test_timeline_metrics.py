"""distlab.timeline.metrics: compute, comm, overlap, idle and wait from hand-made traces."""

from __future__ import annotations

import pytest
from synthetic_traces import trace

from distlab import timeline

pytestmark = pytest.mark.quick


def test_compute_comm_overlap_idle_and_wait_from_a_knowntrace():
    # Rank 0: computes 100-300 us, calls all_reduce at 150; gloo runs it 160-500 (rank 1 is
    # late: it calls at 400). Rank 1: computes 300-400, its gloo part runs 410-500.
    r0 = trace(
        0,
        main=[("aten::mm", "cpu_op", 100, 300), ("c10d::allreduce_", "cpu_op", 150, 160)],
        gloo=[("gloo:all_reduce", "user_annotation", 160, 500)],
    )
    r1 = trace(
        1,
        main=[("aten::mm", "cpu_op", 300, 400), ("c10d::allreduce_", "cpu_op", 400, 410)],
        gloo=[("gloo:all_reduce", "user_annotation", 410, 500)],
    )
    tl = timeline.Timeline([r0, r1])
    us = 1e-6
    assert tl.duration == pytest.approx(400 * us)  # from the sync's end (100) to 500
    assert tl.compute(0) == pytest.approx(190 * us)  # 100-300 minus the call 150-160
    assert tl.comm(0) == pytest.approx(350 * us)  # 150-500
    assert tl.overlap(0) == pytest.approx(140 * us)  # 160-300
    assert tl.idle(0) == pytest.approx(0.0)
    assert tl.waits(0) == [("gloo:all_reduce", pytest.approx(250 * us))]  # 160 -> 410
    assert tl.wait(1) == 0.0
    assert tl.idle(1) == pytest.approx(200 * us)  # 100-300
    assert tl.find(0, "gloo:all_reduce")[0].issued_by is None  # no label around the call
    assert (
        repr(tl)
        == "Timeline: 2 ranks, CPU\nranks 0,1:\n  c10d::allreduce_\n  comm: gloo:all_reduce x1"
    )


def test_autograd_wrappers_are_not_compute_they_span_the_hooks_waits():
    # A backward node's wrapper spans an FSDP-style hook that waits 200-400 for a collective.
    main = [
        ("autograd::engine::evaluate_function: AddmmBackward0", "cpu_op", 100, 500),
        ("AddmmBackward0", "cpu_op", 100, 500),
        ("aten::mm", "cpu_op", 110, 190),
        ("c10d::_reduce_scatter_base_", "cpu_op", 195, 200),
    ]
    gloo = [("gloo:all_reduce", "user_annotation", 200, 400)]
    tl = timeline.Timeline([trace(0, main=main, gloo=gloo), trace(1, main=main, gloo=gloo)])
    assert [e.name for e in tl.events(0, "op")] == ["aten::mm"]
    assert tl.compute(0) == pytest.approx(80e-6)
    assert tl.overlap(0) == 0.0
