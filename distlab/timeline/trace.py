r"""From the raw profiler traces the ranks send back to events on one clock.

Each rank's trace is the dict `distlab.timeline.recording` exports (its Chrome trace events, its
thread names, its clock base). Here they become `Event`\ s: what kind each one is (label, op,
comm, kernel), on which thread, nested how deep, with times in seconds since the ranks met. The
ranks met in a small all_reduce (``distlab:sync``); everything a rank recorded before it left
that all_reduce is dropped (`align`), here and in the Chrome export alike.

Knows nothing about what the numbers mean (`distlab.timeline.metrics`) or how they are drawn.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Names of communication, as the profiler records them: the call (c10d::allreduce_, the
# functional collectives) and the transport running it (gloo:all_reduce on gloo's worker thread,
# nccl:... on the CPU, ncclDevKernel_... / ncclKernel_... on the GPU).
COMM = re.compile(
    r"^(?:gloo|nccl|mpi|ucc|xccl):|^_?c10d(?:_functional)?::|^record_param_comms$|nccl",
    re.IGNORECASE,
)
# The transport-level events: the ones that last as long as the collective does.
TRANSPORT = re.compile(r"^(?:gloo|mpi|ucc|xccl):|^nccl(?:Dev)?Kernel", re.IGNORECASE)
# A PyTorch op: "aten::mm", "fsdp::all_gather_copy_in", "torch::autograd::AccumulateGrad". Not
# autograd's wrappers ("autograd::engine::evaluate_function: MmBackward0", "MmBackward0"), which
# run hooks inside them, and so span the time a hook waits for a collective.
_OP = re.compile(r"^\w+(?:::\w+)+$")
SYNC = "distlab:sync"
WAIT = "distlab:wait"
_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


@dataclass(frozen=True)
class Event:
    """One event of a rank's timeline. Times in seconds from the moment the ranks met.

    ``kind`` is ``"label"`` (a ``record_function`` region: yours, FSDP's, the optimizer's),
    ``"op"`` (a PyTorch op), ``"comm"`` (communication: a collective's call on the rank's own
    thread, or its transport), ``"wait"`` (a thread blocked in ``wait()`` on a collective or a
    future: ``distlab:wait``) or ``"kernel"`` (a GPU kernel that is not NCCL).
    ``thread`` is ``"main"`` (the thread that recorded), ``"gpu"``, or another thread's name
    (``"pt_gloo_runloop"``: where gloo runs collectives). ``depth`` is the nesting depth among
    labels and comm calls of its thread (0: outermost). ``issued_by`` names, for a transport event
    (``gloo:all_gather``), the innermost label around the call that issued it, e.g.
    ``"FSDP::all_gather (1)"``; None when there is none.
    """

    name: str
    kind: str
    start: float
    end: float
    thread: str
    depth: int = 0
    issued_by: str | None = None

    @property
    def duration(self) -> float:
        return self.end - self.start



def tid_value(tid):
    """A thread id as the Chrome format wants it: an int where it is one."""
    try:
        return int(tid)
    except (TypeError, ValueError):
        return str(tid)


def _sync_end(trace: dict) -> float | None:
    ends = [
        float(e["ts"]) + float(e.get("dur", 0))
        for e in trace["events"]
        if e.get("name") == SYNC and str(e.get("tid")) == str(trace["main_tid"])
    ]
    return max(ends) if ends else None


def _shifts(traces: list[dict]) -> list[float]:
    """Per rank, the value to subtract from its ``ts`` to get microseconds since the ranks met.

    Ranks on one machine share a clock: ``baseTimeNanoseconds + ts`` is comparable across them.
    The origin is where the first rank left the sync all_reduce (or, without one, where the
    first rank's first event starts).
    """
    bases = [int(t.get("base_ns", 0)) for t in traces]
    b0 = min(bases)
    offsets = [(b - b0) / 1e3 for b in bases]  # us, exact enough: the bases are whole seconds
    starts = []
    for t, off in zip(traces, offsets, strict=True):
        s = _sync_end(t)
        if s is None:
            s = min((float(e["ts"]) for e in t["events"]), default=0.0)
        starts.append(s + off)
    origin = min(starts)
    return [origin - off for off in offsets]


def align(traces: list[dict]) -> list[list[tuple[float, dict]]]:
    """Per rank, its raw events from the moment it left the sync all_reduce on, each with its
    start in microseconds since the ranks met (the same clock for every rank)."""
    out = []
    for t, shift in zip(traces, _shifts(traces), strict=True):
        sync_end = _sync_end(t)
        out.append(
            [
                (float(e["ts"]) - shift, e)
                for e in t["events"]
                if sync_end is None or float(e["ts"]) >= sync_end
            ]
        )
    return out


def build(traces: list[dict], aligned: list[list[tuple[float, dict]]]) -> list[list[Event]]:
    r"""Per rank, its `Event`\ s (see there for the kinds), by start time. ``aligned`` is
    `align` of ``traces``."""
    out: list[list[Event]] = []
    for t, events_of_rank in zip(traces, aligned, strict=True):
        main = str(t["main_tid"])
        threads = t["threads"]
        raw = []
        for ts, e in events_of_rank:
            name = str(e.get("name", ""))
            cat = str(e.get("cat", ""))
            tid = str(e.get("tid"))
            gpu = cat in _GPU_CATS or cat.startswith("gpu_")
            if gpu:
                if cat == "gpu_user_annotation":
                    continue  # copies of CPU labels on the GPU lane
                kind = "comm" if COMM.search(name) else "kernel"
                thread = "gpu"
            else:
                if COMM.search(name):
                    kind = "comm"
                elif cat == "cpu_op":
                    if not _OP.match(name):
                        continue  # autograd's wrappers (they also span the hooks' waits)
                    kind = "op"
                elif name == WAIT:
                    kind = "wait"
                elif cat == "user_annotation":
                    kind = "label"
                else:
                    continue  # python functions, runtime calls, flow events, ...
                thread = "main" if tid == main else _thread_name(threads.get(tid, tid))
            start = ts / 1e6
            dur = float(e.get("dur", 0)) / 1e6
            raw.append((start, start + dur, name, kind, thread))
        raw.sort(key=lambda x: (x[0], -(x[1] - x[0])))
        out.append(_attribute(_nest(raw)))
    return out


def _thread_name(name: str) -> str:
    m = re.match(r"thread \d+ \((.*)\)$", str(name))
    return m.group(1) if m else str(name)


def _nest(raw) -> list[Event]:
    """Events with the depth of each label/comm call among its thread's labels and comm calls."""
    stacks: dict[str, list[float]] = {}
    out = []
    for start, end, name, kind, thread in raw:
        depth = 0
        if kind in ("label", "comm"):
            stack = stacks.setdefault(thread, [])
            while stack and stack[-1] <= start:
                stack.pop()
            depth = len(stack)
            stack.append(end)
        out.append(Event(name, kind, start, end, thread, depth))
    return out


def _attribute(events: list[Event]) -> list[Event]:
    """Name, on each transport event, the label around the call that issued it.

    The k-th collective call on the main thread (``c10d::...``) issued the k-th transport event
    (gloo's thread runs them in the order they were issued). Left alone if the counts differ.
    """
    calls = [
        e
        for e in events
        if e.thread == "main"
        and e.kind == "comm"
        and e.name.lower().startswith(("c10d::", "_c10d_functional::", "c10d_functional::"))
    ]
    transports = [
        e
        for e in events
        if e.kind == "comm" and e.thread not in ("main", "gpu") and TRANSPORT.search(e.name)
    ]
    if not calls or len(calls) != len(transports):
        return events
    labels = [e for e in events if e.thread == "main" and e.kind == "label"]
    issued = {}
    for call, tr in zip(calls, transports, strict=True):
        around = [lb for lb in labels if lb.start <= call.start and call.end <= lb.end]
        if around:
            issued[id(tr)] = max(around, key=lambda lb: lb.start).name
    return [
        Event(e.name, e.kind, e.start, e.end, e.thread, e.depth, issued[id(e)])
        if id(e) in issued
        else e
        for e in events
    ]
