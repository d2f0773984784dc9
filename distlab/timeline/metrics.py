"""What the timeline's numbers mean: compute, comm, overlap, idle and wait of one rank, as
intervals of seconds since the ranks met.

Pure functions of `Event` lists (`distlab.timeline.trace`), so each definition can be tested on
a hand-made trace. `distlab.timeline.Timeline.stats` documents them for the learner.
"""

from __future__ import annotations

from collections import Counter

from .intervals import subtract, union
from .trace import TRANSPORT, Event

Intervals = list[tuple[float, float]]


def transports(events: list[Event]) -> list[Event]:
    """The collectives as their transport ran them (gloo's thread, NCCL kernels), by start."""
    return [e for e in events if e.kind == "comm" and TRANSPORT.search(e.name)]


def compute(events: list[Event], device: str) -> Intervals:
    """When the rank computed: on the CPU, time in PyTorch ops, less the time those ops spent
    inside a collective call on the same thread; on the GPU, time in kernels that are not NCCL."""
    if device == "cuda":
        return union([(e.start, e.end) for e in events if e.kind == "kernel"])
    out = []
    by_thread: dict[str, list[Event]] = {}
    for e in events:
        if e.thread != "gpu":
            by_thread.setdefault(e.thread, []).append(e)
    for thread_events in by_thread.values():
        ops = union([(e.start, e.end) for e in thread_events if e.kind == "op"])
        comm_calls = union([(e.start, e.end) for e in thread_events if e.kind == "comm"])
        out.extend(subtract(ops, comm_calls))
    return union(out)


def comm(events: list[Event], device: str) -> Intervals:
    """When a collective was under way on the rank (a call or its transport), waits included."""
    on_gpu = device == "cuda"
    return union(
        [(e.start, e.end) for e in events if e.kind == "comm" and (e.thread == "gpu") == on_gpu]
    )


def waits(transports_by_rank: list[list[Event]], rank: int) -> list[float | None]:
    """One entry per transport event of ``rank``: how long it was in that collective before the
    last rank arrived, or None when some rank has no such collective.

    The k-th collective of a name on one rank is matched with the k-th of that name on the
    others: right for collectives on the default group, which every rank runs in the same order.
    """
    world_size = len(transports_by_rank)
    seen: Counter = Counter()
    out: list[float | None] = []
    for e in transports_by_rank[rank]:
        k = seen[e.name]
        seen[e.name] += 1
        starts = []
        for other in transports_by_rank:
            same = [x for x in other if x.name == e.name]
            if k < len(same):
                starts.append(same[k].start)
        if len(starts) < world_size:
            out.append(None)
        else:
            out.append(min(max(0.0, max(starts) - e.start), e.duration))
    return out
