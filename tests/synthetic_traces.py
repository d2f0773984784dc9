"""Hand-made timeline traces, in the shape `distlab.timeline.recording` exports, for tests that
need no ranks (`pytest -m quick`)."""

from __future__ import annotations


def trace(rank, *, main=(), gloo=(), sync_end=100.0):
    """A trace as `recording` returns it; events as (name, cat, start_us, end_us)."""
    events = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "distlab:sync",
            "tid": 1,
            "ts": sync_end - 10,
            "dur": 10.0,
        }
    ]
    for tid, evs in ((1, main), (2, gloo)):
        for name, cat, a, b in evs:
            events.append({"ph": "X", "cat": cat, "name": name, "tid": tid, "ts": a, "dur": b - a})
    return {
        "rank": rank,
        "world_size": 2,
        "pid": 10 + rank,
        "main_tid": 1,
        "base_ns": 0,
        "cuda": False,
        "threads": {"1": "thread 1 (python)", "2": "thread 2 (gloo)"},
        "events": events,
    }
