"""distlab.timeline.trace, chrome and drawing: raw traces to events on one clock, the merged
Chrome trace and the picture, from hand-made traces (no ranks)."""

from __future__ import annotations

import pytest
from synthetic_traces import trace

from distlab import timeline
from distlab.timeline import trace as trace_mod

pytestmark = pytest.mark.quick


def _two_ranks():
    r0 = trace(
        0,
        main=[
            ("forward", "user_annotation", 120, 300),
            ("aten::mm", "cpu_op", 130, 290),
            ("sync grads", "user_annotation", 300, 320),
            ("c10d::allreduce_", "cpu_op", 305, 315),
            ("early", "user_annotation", 10, 20),  # before the ranks met: left out
        ],
        gloo=[("gloo:all_reduce", "user_annotation", 315, 500)],
    )
    r1 = trace(
        1,
        main=[
            ("sync grads", "user_annotation", 400, 420),
            ("c10d::allreduce_", "cpu_op", 405, 415),
        ],
        gloo=[("gloo:all_reduce", "user_annotation", 415, 500)],
        sync_end=150.0,  # rank 1 left the sync 50 us later than rank 0
    )
    return [r0, r1]


def test_events_start_where_the_first_rank_left_the_sync_and_share_one_clock():
    aligned = trace_mod.align(_two_ranks())
    starts = [[ts for ts, _ in rank] for rank in aligned]
    assert min(starts[0]) == pytest.approx(20.0)  # forward at 120, origin 100
    assert min(starts[1]) == pytest.approx(300.0)  # sync grads at 400 on the same clock
    names = [e["name"] for _, e in aligned[0]]
    assert "early" not in names and "distlab:sync" not in names


def test_kinds_nesting_and_the_label_that_issued_each_transport():
    tl = timeline.Timeline(_two_ranks())
    assert tl.names(0) == ["forward", "sync grads"]
    assert tl.names(0, depth=None) == ["forward", "sync grads", "c10d::allreduce_"]
    (gloo,) = tl.find(0, "gloo:all_reduce")
    assert gloo.kind == "comm" and gloo.thread == "gloo" and gloo.issued_by == "sync grads"
    assert [e.name for e in tl.events(0, "op")] == ["aten::mm"]
    assert tl.duration == pytest.approx(400e-6)


def test_chrome_trace_has_one_process_per_rank_and_the_same_events_as_the_lanes():
    tl = timeline.Timeline(_two_ranks())
    events = tl.chrome_trace()["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    spans = [e for e in events if e.get("ph") == "X"]
    assert all(e["ts"] >= 0 for e in spans)
    assert sorted(e["name"] for e in spans if e["pid"] == 0) == sorted(
        ["forward", "aten::mm", "sync grads", "c10d::allreduce_", "gloo:all_reduce"]
    )
    (forward,) = [e for e in spans if e["name"] == "forward"]
    assert forward["ts"] == pytest.approx(tl.find(0, "forward")[0].start * 1e6)
    threads = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert "main" in threads


def test_picture_has_three_lanes_per_rank_and_a_key_for_the_labels():
    tl = timeline.Timeline(_two_ranks())
    fig = tl.figure()
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["rank 0  labels", "compute", "comm", "rank 1  labels", "compute", "comm"]
    key = [t.get_text() for t in fig.legends[0].get_texts()]
    assert key == ["forward", "sync grads"]
    assert tl.png().startswith(b"\x89PNG\r\n\x1a\n")
    assert tl.png() is tl.png()  # drawn once


def test_a_label_keeps_its_colour_in_every_picture():
    from distlab.timeline import drawing

    first_alpha = [("alpha", "user_annotation", 110, 200), ("beta", "user_annotation", 200, 300)]
    first_beta = [("beta", "user_annotation", 110, 200), ("alpha", "user_annotation", 200, 300)]
    a, b = trace(0, main=first_alpha), trace(0, main=first_beta)

    def key(tl):
        legend = tl.figure().legends[0]
        return {t.get_text(): h.get_facecolor() for t, h in
                zip(legend.get_texts(), legend.legend_handles, strict=True)}

    first, second = key(timeline.Timeline([a])), key(timeline.Timeline([b]))
    assert first == second and first["alpha"] != first["beta"]
    assert drawing.label_colour("alpha") == drawing.label_colour("alpha")


def test_names_are_written_on_bars_only_where_they_fit_and_comm_bars_name_the_collective():
    from distlab.timeline.drawing import _fits

    assert _fits("backward", 0.5, 1.0)  # half of an 8.8-inch axis
    assert not _fits("backward", 0.03, 1.0)  # 0.26 inch: "backward" at 7 pt does not fit
    tl = timeline.Timeline(_two_ranks())
    texts = [t.get_text() for t in tl.figure().axes[0].texts]
    assert "all_reduce" in texts and "gloo:all_reduce" not in texts
    assert not [t for t in texts if t.startswith("backback")]
