"""A timeline as one Chrome / Perfetto trace: one process per rank (pid = rank, named "rank N"),
every event of every thread, times in microseconds from the moment the ranks met. Uses the events
`distlab.timeline.trace.align` kept and shifted, so it starts where the lanes start."""

from __future__ import annotations

from .trace import tid_value


def chrome_trace(timeline) -> dict:
    """`distlab.timeline.Timeline.chrome_trace` (see there)."""
    out = []
    for r, (t, events) in enumerate(zip(timeline.traces, timeline._aligned, strict=True)):
        out.append(_meta("process_name", r, 0, name=f"rank {r}"))
        out.append(_meta("process_sort_index", r, 0, sort_index=r))
        for tid, name in t["threads"].items():
            label = "main" if tid == str(t["main_tid"]) else name
            out.append(_meta("thread_name", r, tid_value(tid), name=label))
        for ts, e in events:
            ev = dict(e)
            ev["pid"], ev["tid"], ev["ts"] = r, tid_value(e.get("tid", 0)), ts
            out.append(ev)
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def _meta(what: str, pid: int, tid, **args) -> dict:
    return {"ph": "M", "name": what, "pid": pid, "tid": tid, "args": args}
