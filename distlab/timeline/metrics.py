"""What the timeline's numbers mean, per rank, as intervals of seconds since the ranks met.

- **compute**: time a thread spent in PyTorch ops, less the time it was blocked inside them: in a
  collective's call (``c10d::allreduce_``) or in a ``wait()`` on a collective or a future
  (``distlab:wait``, recorded by `distlab.timeline.recording`). An op that only wraps a blocking
  all_reduce (``AccumulateGrad`` running a hook that waits) is therefore not compute. The union
  over the rank's CPU threads; on a GPU, kernels that are not NCCL.
- **comm**: time a collective was under way: its call, its transport (gloo's thread, an NCCL
  kernel), its waits included.
- **overlap**: compute and comm at the same time. Overlap is not time saved: it says two things
  ran at once, not that the step got shorter (on two busy cores they also slow each other).
- **idle**: neither (Python between ops, ``time.sleep``, the profiler itself).
- **wait**: time between this rank's arrival at a collective (its call, on its own thread) and
  the last rank's arrival, ended early if the collective ends first; the union over all
  collectives, so two collectives in flight that wait for the same late rank count its lateness
  once.

Pure functions of `Event` lists (`distlab.timeline.trace`), so each definition is tested on a
hand-made trace (tests/test_timeline_metrics.py) as well as on real runs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .intervals import subtract, union
from .trace import TRANSPORT, Event

Intervals = list[tuple[float, float]]

#: The calls a rank makes to start a collective (the profiler's names, on the calling thread).
_CALL_PREFIXES = ("c10d::", "_c10d_functional::", "c10d_functional::")


def transports(events: list[Event]) -> list[Event]:
    """The collectives as their transport ran them (gloo's thread, NCCL kernels), by start."""
    return [e for e in events if e.kind == "comm" and TRANSPORT.search(e.name)]


def calls(events: list[Event]) -> list[Event]:
    """The calls that started collectives, on the rank's own threads, by start (not waits:
    ``wait_tensor`` is a functional collective's wait, not an arrival)."""
    return [
        e
        for e in events
        if e.kind == "comm"
        and e.thread != "gpu"
        and e.name.lower().startswith(_CALL_PREFIXES)
        and not e.name.endswith("wait_tensor")
    ]


def compute(events: list[Event], device: str) -> Intervals:
    """When the rank computed (see the module's docstring)."""
    if device == "cuda":
        return union([(e.start, e.end) for e in events if e.kind == "kernel"])
    out = []
    by_thread: dict[str, list[Event]] = {}
    for e in events:
        if e.thread != "gpu":
            by_thread.setdefault(e.thread, []).append(e)
    for thread_events in by_thread.values():
        ops = union([(e.start, e.end) for e in thread_events if e.kind == "op"])
        blocked = union(
            [(e.start, e.end) for e in thread_events if e.kind in ("comm", "wait")]
        )
        out.extend(subtract(ops, blocked))
    return union(out)


def comm(events: list[Event], device: str) -> Intervals:
    """When a collective was under way on the rank (a call or its transport), waits included."""
    on_gpu = device == "cuda"
    return union(
        [(e.start, e.end) for e in events if e.kind == "comm" and (e.thread == "gpu") == on_gpu]
    )


@dataclass(frozen=True)
class CollectiveOnRank:
    """One collective on one rank: its name, when this rank arrived, when it ended here."""

    name: str
    arrival: float
    end: float


def collectives(events: list[Event]) -> list[CollectiveOnRank]:
    """The rank's collectives in the order it called them. Each call is paired with the k-th
    transport event (gloo runs them in the order they were issued); without a transport (or
    when the counts differ) a collective ends when its call does."""
    cs, ts = calls(events), transports(events)
    if len(ts) != len(cs):
        ts = []
    out = []
    for i, c in enumerate(cs):
        end = max(c.end, ts[i].end) if ts else c.end
        out.append(CollectiveOnRank(c.name, c.start, end))
    return out


def waits(collectives_by_rank: list[list[CollectiveOnRank]],
          rank: int) -> list[tuple[str, Intervals]]:
    """For each collective of ``rank``: its name and the interval it spent waiting for the last
    rank to arrive (empty when it was the last, or some rank has no such collective).

    The k-th collective of a name on one rank is matched with the k-th of that name on the
    others: right for collectives on the default group, which every rank runs in the same order.
    """
    seen: Counter = Counter()
    out = []
    for c in collectives_by_rank[rank]:
        k = seen[c.name]
        seen[c.name] += 1
        arrivals = []
        for other in collectives_by_rank:
            same = [x for x in other if x.name == c.name]
            if k < len(same):
                arrivals.append(same[k].arrival)
        if len(arrivals) < len(collectives_by_rank):
            out.append((c.name, []))
            continue
        until = min(max(arrivals), c.end)
        out.append((c.name, [(c.arrival, until)] if until > c.arrival else []))
    return out
