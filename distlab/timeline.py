"""Per-rank timelines with `torch.profiler`: what each rank computed, communicated, and waited for.

One call profiles a function on every rank and brings the traces back to the notebook:

    from distlab import timeline

    tl = timeline.record(step, world_size=2)          # new ranks, as distlab.launch
    tl = timeline.record(step, cluster=cluster)       # or the live ranks of a Cluster
    tl                                                # one swim-lane per rank (text: the names)
    tl.stats()                                        # per rank: compute, comm, idle, overlap, wait
    tl.save("step.json")                              # one trace, one process per rank: Perfetto

Or profile a block of a ``%%ranks`` cell, then collect it in the kernel:

    %%ranks
    from distlab import timeline
    with timeline.recording():
        loss = model(x).sum()
        loss.backward()

    tl = distlab.timeline.collect(cluster)

It is PyTorch's own profiler underneath (Kineto, the engine of `torch.profiler.profile`; the
same options: ``record_shapes=False``, CPU activity, plus CUDA when the ranks use GPUs; the same
trace file), so your own ``torch.profiler.record_function("...")`` labels show up, and so do the
profiler's own names for collectives: ``c10d::allreduce_`` where the rank *calls* the
collective, and ``gloo:all_reduce`` (or an NCCL kernel) where it *runs*, on gloo's worker thread.
The ranks first meet in a small all_reduce (``sync=True``) so that their lanes start together;
everything before that moment is left out.

What counts as what, per rank (all in seconds, from the moment the ranks met to the end of the
last event on any rank):

- compute: time in PyTorch ops (``aten::...``) that are not communication;
- comm: time in a collective, from when its transport (gloo's thread, the NCCL kernel) starts it
  until it is done, waits for slower ranks included;
- idle: neither (Python code between ops, ``time.sleep``, the profiler itself);
- overlap: compute and comm at the same time (what DDP's buckets and FSDP's prefetch are for);
- wait: in each collective, how long this rank was in it before the last rank arrived.

The text form (``repr``) lists, per rank, the labels and collective calls in order, with counts,
and never a time, so a notebook can compare it strictly; ranks that did the same print once.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass

from . import _output

__all__ = ["Event", "Timeline", "collect", "record", "recording"]

# Names of communication, as the profiler records them: the call (c10d::allreduce_, the
# functional collectives) and the transport running it (gloo:all_reduce on gloo's worker thread,
# nccl:... on the CPU, ncclDevKernel_... / ncclKernel_... on the GPU).
_COMM = re.compile(
    r"^(?:gloo|nccl|mpi|ucc|xccl):|^_?c10d(?:_functional)?::|^record_param_comms$|nccl",
    re.IGNORECASE,
)
# The transport-level events: the ones that last as long as the collective does.
_TRANSPORT = re.compile(r"^(?:gloo|mpi|ucc|xccl):|^nccl(?:Dev)?Kernel", re.IGNORECASE)
# A PyTorch op: "aten::mm", "fsdp::all_gather_copy_in", "torch::autograd::AccumulateGrad". Not
# autograd's wrappers ("autograd::engine::evaluate_function: MmBackward0", "MmBackward0"), which
# run hooks inside them, and so span the time a hook waits for a collective.
_OP = re.compile(r"^\w+(?:::\w+)+$")
_SYNC = "distlab:sync"
_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")

# Colour-blind-safe (Okabe-Ito), as distlab.pictures.
_COMPUTE_COLOUR = "#0072B2"
_COMM_COLOUR = "#E69F00"
_WAIT_COLOUR = "#D55E00"
# Labels: the Okabe-Ito colours left once compute (blue) and communication (orange) have theirs.
# Beyond six, matplotlib's tab20 colours that do not look like those three.
_LABEL_COLOURS = ["#56B4E9", "#009E73", "#F0E442", "#CC79A7", "#999999", "#BBBBBB"] + [
    "#9467BD",
    "#E377C2",
    "#BCBD22",
    "#17BECF",
    "#8C564B",
    "#98DF8A",
    "#C5B0D5",
    "#F7B6D2",
    "#DBDB8D",
    "#9EDAE5",
    "#C49C94",
    "#C7C7C7",
]
_AXES_INCHES = 8.8  # width of the plot area in inches
_CHAR_INCHES = 0.06  # width of a character at 7 pt, roughly
_BACKGROUND = "#F5F5F5"
_INK = "#222222"


@dataclass(frozen=True)
class Event:
    """One event of a rank's timeline. Times in seconds from the moment the ranks met.

    ``kind`` is ``"label"`` (a ``record_function`` region: yours, FSDP's, the optimizer's),
    ``"op"`` (a PyTorch op: compute), ``"comm"`` (communication: a collective's call on the
    rank's own thread, or its transport) or ``"kernel"`` (a GPU kernel that is not NCCL).
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


# ----------------------------------------------------------------------------------------------
# On the ranks
# ----------------------------------------------------------------------------------------------

_active: _Recording | None = None
_last: dict | None = None


class _Recording:
    """The context manager `recording` returns (see there)."""

    def __init__(self, sync: bool, cuda: bool | None):
        self._sync = sync
        self._cuda = cuda
        self._prof = None
        self.trace: dict | None = None

    def __enter__(self) -> _Recording:
        global _active
        import torch
        from torch.autograd import profiler

        if _active is not None:
            raise RuntimeError(
                "timeline.recording() is already recording on this rank: recordings do not "
                "nest. Put the code you want to see inside the one `with` block."
            )
        if torch.autograd._profiler_enabled():
            raise RuntimeError(
                "A torch.profiler is already running on this rank; distlab.timeline uses one "
                "itself. Leave your own `with torch.profiler.profile()` block first (or use "
                "only yours and export its trace with prof.export_chrome_trace)."
            )
        # Kineto prints "USDT: ... profiler_start/stop" on every start and stop unless told not
        # to (it reads this when the profiler first starts in a process). Yours wins if set.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        cuda = self._cuda
        if cuda is None:
            cuda = torch.cuda.is_available() and (torch.cuda.is_initialized() or _uses_nccl())
        self._cuda = cuda
        # The Kineto profiler that torch.profiler.profile wraps, with the same options and the
        # same trace. The wrapper's first start also imports the compiler (torch._inductor, to
        # read a CUDA-graphs setting): 1.5-3 s per rank on two cores, for nothing here.
        self._prof = profiler.profile(
            use_kineto=True,
            use_cpu=True,
            use_device="cuda" if cuda else None,
            record_shapes=False,
            with_stack=False,
            profile_memory=False,
        )
        self._prof.__enter__()
        _active = self
        try:
            if self._sync:
                _meet()
        except BaseException:
            self._finish()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._finish()

    def _finish(self) -> None:
        global _active, _last
        import torch

        try:
            if self._cuda:
                torch.cuda.synchronize()
        finally:
            _active = None
            self._prof.__exit__(None, None, None)
        self.trace = _export(self._prof, self._cuda)
        _last = self.trace


def recording(*, sync: bool = True, cuda: bool | None = None) -> _Recording:
    """Profile a block of code on this rank (use it in a ``%%ranks`` cell, on every rank).

        with timeline.recording():
            ...                             # what you want to see
        # then, in the kernel: tl = distlab.timeline.collect(cluster)

    Args:
        sync: first meet the other ranks in a small all_reduce on the default process group, and
            leave out everything before it, so that every rank's lane starts at the same moment
            (default). Needs every rank of the default group to enter the block; pass
            ``sync=False`` when only some ranks record (their lanes then start when each one
            entered the block, and waits between ranks are not meaningful).
        cuda: also record GPU activity (``ProfilerActivity.CUDA``). Default: when this rank has
            already used CUDA, or its process group has an NCCL backend.

    Returns:
        A context manager. After the block, its ``.trace`` holds this rank's trace (a dict), and
        `collect` fetches it from every rank.

    Raises:
        TypeError: ``sync`` is not True or False.
        RuntimeError: a recording is already running on this rank (they do not nest), or your
            own ``torch.profiler.profile`` is running (only one profiler at a time).
        Errors of the sync all_reduce (a rank that did not enter the block makes it time out:
            run the cell on every rank, or pass ``sync=False``).
    """
    if not isinstance(sync, bool):
        raise TypeError(f"sync must be True or False, got {sync!r}")
    return _Recording(sync, cuda)


def _uses_nccl() -> bool:
    import torch.distributed as dist

    return (
        dist.is_available() and dist.is_initialized() and "nccl" in str(dist.get_backend()).lower()
    )


def _meet() -> None:
    """A tiny all_reduce on the default group, inside a label that marks where lanes start."""
    import torch
    import torch.distributed as dist
    from torch.profiler import record_function

    if not (dist.is_available() and dist.is_initialized()):
        return
    backend = str(dist.get_backend()).lower()
    on_gpu = "gloo" not in backend and torch.cuda.is_available()
    t = torch.zeros(1, device=f"cuda:{torch.cuda.current_device()}" if on_gpu else "cpu")
    with record_function(_SYNC):
        dist.all_reduce(t)
        if on_gpu:
            torch.cuda.synchronize()


def _export(prof, cuda: bool) -> dict:
    """This rank's trace as a dict of plain values (so that it pickles back to the kernel)."""
    fd, path = tempfile.mkstemp(prefix="distlab-trace-", suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    finally:
        os.unlink(path)
    rank = world_size = None
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    threads = {}
    events = []
    for e in raw.get("traceEvents", []):
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[str(e.get("tid"))] = str(e.get("args", {}).get("name", ""))
        elif e.get("ph") == "X" and e.get("cat") != "Trace":
            events.append(e)
    return {
        "rank": rank,
        "world_size": world_size,
        "pid": os.getpid(),
        "main_tid": threading.get_native_id(),
        "base_ns": int(raw.get("baseTimeNanoseconds", 0)),
        "cuda": bool(cuda),
        "threads": threads,
        "events": events,
    }


def _take_last():
    """Run on a rank by `collect`: the trace of its last recording, or None."""
    return _last


def _run_recorded(fn, args, kwargs, sync, cuda):
    """Run on every rank by `record`: ``fn(*args, **kwargs)`` under a recording."""
    rec = _Recording(sync, cuda)
    with rec:
        value = fn(*args, **kwargs)
    return value, rec.trace


# ----------------------------------------------------------------------------------------------
# In the kernel
# ----------------------------------------------------------------------------------------------


def record(
    fn,
    *args,
    cluster=None,
    world_size: int | None = None,
    timeout: float = 60.0,
    sync: bool = True,
    cuda: bool | None = None,
    backend: str | None = "auto",
    threads: int | None = None,
    **kwargs,
) -> Timeline:
    """Run ``fn(*args, **kwargs)`` on every rank under `torch.profiler`; return its `Timeline`.

    Args:
        fn: the function to run on every rank (as for `distlab.launch`). What it returns is in
            the timeline's ``.results`` (one per rank).
        args, kwargs: passed to ``fn``. (So ``fn`` cannot take keyword arguments named like the
            ones below; wrap it in a small function if it must.)
        cluster: a live `distlab.Cluster` to run on. Default: new ranks, as `distlab.launch`.
        world_size: number of new ranks (default 2). With ``cluster``, leave it out or give the
            cluster's own world size.
        timeout: seconds before the run is declared hung (as for `distlab.launch`).
        sync: meet in a small all_reduce first, so that lanes start together (see `recording`).
        cuda: also record GPU activity; default: on ranks that have used CUDA already or have
            an NCCL process group (pass True when ``fn`` is the first to touch the GPU).
        backend, threads: as for `distlab.launch` (new ranks only).

    Returns:
        A `Timeline`: shown as swim-lanes in Jupyter, as the names of events per rank in text.

    Raises:
        TypeError: ``fn`` is not callable, or an argument cannot be pickled (as for launch).
        ValueError: ``world_size`` does not match the cluster's, or is not a valid world size;
            ``backend``/``threads`` given with a cluster (a cluster's ranks are already set up).
        RuntimeError: the cluster has been shut down (start a new one).
        distlab.RankError / distlab.RankTimeout: ``fn`` raised or hung on a rank, as for launch;
            or a profiler was already running on a rank (the RankError shows `recording`'s
            RuntimeError: leave your own ``torch.profiler.profile`` block first).
    """
    from . import _config
    from .launcher import launch

    _config.check_callable(fn, "timeline.record()")
    if not isinstance(sync, bool):
        raise TypeError(f"sync must be True or False, got {sync!r}")
    if cluster is not None:
        if world_size is not None and world_size != cluster.world_size:
            raise ValueError(
                f"world_size={world_size!r} but the cluster has {cluster.world_size} ranks: "
                "leave world_size out when you pass cluster="
            )
        if backend != "auto" or threads is not None:
            raise ValueError(
                "backend= and threads= are for new ranks; a cluster's ranks are already set up "
                "(give them to distlab.Cluster(...) instead)"
            )
        out = cluster.run(_run_recorded, fn, args, kwargs, sync, cuda, timeout=timeout)
    else:
        out = launch(
            _run_recorded,
            fn,
            args,
            kwargs,
            sync,
            cuda,
            world_size=2 if world_size is None else world_size,
            timeout=timeout,
            backend=backend,
            threads=threads,
        )
    results = [value for value, _ in out]
    return Timeline([trace for _, trace in out], results=results)


def collect(cluster=None) -> Timeline:
    """Fetch from every rank of ``cluster`` the trace of its last `recording` block.

    Each rank keeps its own last recording: after a ``sync=False`` recording on some ranks only,
    the others still hand back an older one.

    Args:
        cluster: a live `distlab.Cluster`; default: the current one (the most recent).

    Returns:
        A `Timeline` of those recordings.

    Raises:
        RuntimeError: no cluster is running; or some rank has not recorded anything yet (run a
            ``%%ranks`` cell with ``with timeline.recording(): ...`` on every rank first; the
            message names the ranks).
    """
    from . import cluster as _cluster

    cl = cluster if cluster is not None else _cluster.current()
    traces = cl.run(_take_last)
    missing = [r for r, t in enumerate(traces) if t is None]
    if missing:
        raise RuntimeError(
            f"rank(s) {', '.join(map(str, missing))} have recorded nothing yet. In a %%ranks "
            "cell (on every rank), first run:\n"
            "    from distlab import timeline\n"
            "    with timeline.recording():\n"
            "        ...   # the code to profile\n"
            "then call distlab.timeline.collect(cluster) again."
        )
    return Timeline(traces)


class Timeline:
    """What every rank did during a recording: one lane per rank, from `torch.profiler` traces.

    Build one with `record` or `collect` (or ``Timeline(traces)`` from the dicts a
    `recording`'s ``.trace`` holds, one per rank, in rank order).

    In Jupyter it shows as a picture (``_repr_png_``): per rank, the labels on top, compute in
    the middle and communication below, its waits for other ranks darker. Its ``repr`` is text
    without times (see `text`). Numbers: `stats`, `compute`, `comm`, `idle`, `overlap`, `wait`,
    `waits`. Events: `events`, `names`, `count`, `find`. Files: `save` (Chrome/Perfetto JSON).
    ``results`` holds what the recorded function returned on each rank (`record` only).

    Raises (constructor):
        ValueError: no traces, or a trace that is not one of `recording`'s (a dict with
            "events" and "threads").
    """

    def __init__(self, traces, *, results=None):
        traces = list(traces)
        if not traces:
            raise ValueError("a Timeline needs one trace per rank; got none")
        for r, t in enumerate(traces):
            if not isinstance(t, dict) or "events" not in t or "threads" not in t:
                raise ValueError(
                    f"trace {r} is not a distlab.timeline trace (a dict with 'events' and "
                    f"'threads', as recording().trace holds); got {type(t).__name__}"
                )
        self.traces = traces
        self.results = results
        self.world_size = len(traces)
        self._events, self._end = _build(traces)
        self._png: bytes | None = None

    # -- events ------------------------------------------------------------------------------

    def _rank(self, rank) -> int:
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise TypeError(f"rank must be an int, got {rank!r}")
        if not 0 <= rank < self.world_size:
            raise ValueError(
                f"rank {rank} is not in this timeline (ranks 0..{self.world_size - 1})"
            )
        return rank

    def events(self, rank: int, kind: str | None = None) -> list[Event]:
        """Every `Event` of ``rank`` (of one ``kind``: "label", "op", "comm", "kernel"), by
        start time. Raises ValueError for an unknown rank or kind."""
        rank = self._rank(rank)
        if kind is not None and kind not in ("label", "op", "comm", "kernel"):
            raise ValueError(f"kind must be 'label', 'op', 'comm' or 'kernel', got {kind!r}")
        return [e for e in self._events[rank] if kind is None or e.kind == kind]

    def names(self, rank: int, depth: int | None = 0) -> list[str]:
        """The labels and collective calls of ``rank``'s main thread, in order (what the text
        form shows). ``depth=0``: outermost only (default); ``None``: all, nested ones too."""
        return [
            e.name
            for e in self._events[self._rank(rank)]
            if e.thread == "main"
            and e.kind in ("label", "comm")
            and (depth is None or e.depth <= depth)
        ]

    def transports(self, rank: int) -> list[str]:
        """The collectives as their transport ran them (``gloo:all_reduce``, NCCL kernels), in
        order of start."""
        return [e.name for e in self._transport(self._rank(rank))]

    def find(self, rank: int, name: str) -> list[Event]:
        """The events of ``rank`` named ``name`` exactly, or, for a transport event, issued
        from a label named ``name`` (``find(0, "FSDP::all_gather (1)")`` also returns the
        ``gloo:all_gather`` it started). By start time."""
        return [e for e in self._events[self._rank(rank)] if name in (e.name, e.issued_by)]

    def count(self, name: str, rank: int | None = None):
        """How many events named ``name`` (exactly) ``rank`` has; without ``rank``, a list with
        one count per rank."""
        if rank is None:
            return [self.count(name, r) for r in range(self.world_size)]
        return sum(1 for e in self._events[self._rank(rank)] if e.name == name)

    def _transport(self, rank: int) -> list[Event]:
        return [e for e in self._events[rank] if e.kind == "comm" and _TRANSPORT.search(e.name)]

    # -- numbers -----------------------------------------------------------------------------

    @property
    def duration(self) -> float:
        """Seconds from the moment the ranks met to the end of the last event on any rank."""
        return self._end

    def _device(self, device: str | None) -> str:
        if device is None:
            return "cuda" if any(t.get("cuda") for t in self.traces) else "cpu"
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
        return device

    def _compute(self, rank: int, device: str) -> list[tuple[float, float]]:
        evs = self._events[rank]
        if device == "cuda":
            return _union([(e.start, e.end) for e in evs if e.kind == "kernel"])
        out = []
        by_thread: dict[str, list[Event]] = {}
        for e in evs:
            if e.thread != "gpu":
                by_thread.setdefault(e.thread, []).append(e)
        for thread_events in by_thread.values():
            ops = _union([(e.start, e.end) for e in thread_events if e.kind == "op"])
            comm = _union([(e.start, e.end) for e in thread_events if e.kind == "comm"])
            out.extend(_subtract(ops, comm))
        return _union(out)

    def _comm(self, rank: int, device: str) -> list[tuple[float, float]]:
        evs = self._events[rank]
        if device == "cuda":
            return _union([(e.start, e.end) for e in evs if e.kind == "comm" and e.thread == "gpu"])
        return _union([(e.start, e.end) for e in evs if e.kind == "comm" and e.thread != "gpu"])

    def compute(self, rank: int, device: str | None = None) -> float:
        """Seconds ``rank`` spent in PyTorch ops that are not communication (on the GPU: in
        kernels that are not NCCL). ``device``: "cpu" or "cuda" (default: "cuda" when the
        trace has GPU activity)."""
        return _length(self._compute(self._rank(rank), self._device(device)))

    def comm(self, rank: int, device: str | None = None) -> float:
        """Seconds ``rank`` had a collective under way (its waits included)."""
        return _length(self._comm(self._rank(rank), self._device(device)))

    def overlap(self, rank: int, device: str | None = None) -> float:
        """Seconds in which ``rank`` computed while a collective was under way."""
        rank, device = self._rank(rank), self._device(device)
        return _length(_intersect(self._compute(rank, device), self._comm(rank, device)))

    def idle(self, rank: int, device: str | None = None) -> float:
        """Seconds of the timeline in which ``rank`` did neither compute nor communicate."""
        rank, device = self._rank(rank), self._device(device)
        busy = _union(self._compute(rank, device) + self._comm(rank, device))
        return max(0.0, self._end - _length(busy))

    def waits(self, rank: int) -> list[tuple[str, float]]:
        """For each collective of ``rank`` (as its transport ran it), in order: its name and
        how long this rank was in it before the last rank arrived (0.0 for the last one).

        The k-th collective of a name on one rank is matched with the k-th of that name on the
        others: right for collectives on the default group, which every rank runs in the same
        order. A collective that some rank does not have is left out.
        """
        rank = self._rank(rank)
        return [
            (e.name, w)
            for e, w in zip(self._transport(rank), self._waits(rank), strict=True)
            if w is not None
        ]

    def _waits(self, rank: int) -> list[float | None]:
        """One entry per transport event of ``rank``: its wait, or None if unmatched."""
        lists = [self._transport(r) for r in range(self.world_size)]
        seen: Counter = Counter()
        out: list[float | None] = []
        for e in lists[rank]:
            k = seen[e.name]
            seen[e.name] += 1
            starts = []
            for other in lists:
                same = [x for x in other if x.name == e.name]
                if k < len(same):
                    starts.append(same[k].start)
            if len(starts) < self.world_size:
                out.append(None)
            else:
                out.append(min(max(0.0, max(starts) - e.start), e.duration))
        return out

    def wait(self, rank: int) -> float:
        """Seconds ``rank`` spent in collectives waiting for the last rank to arrive (see
        `waits`): what a straggler costs the others."""
        return sum(w for _, w in self.waits(rank))

    def stats(self, device: str | None = None) -> list[dict[str, float]]:
        """Per rank, a dict of seconds: ``compute``, ``comm``, ``overlap``, ``idle``, ``wait``
        and ``total`` (the timeline's length, the same for every rank)."""
        return [
            {
                "compute": self.compute(r, device),
                "comm": self.comm(r, device),
                "overlap": self.overlap(r, device),
                "idle": self.idle(r, device),
                "wait": self.wait(r),
                "total": self._end,
            }
            for r in range(self.world_size)
        ]

    def table(self, device: str | None = None) -> str:
        """`stats` as a small text table in milliseconds (times vary from run to run)."""
        lines = [
            f"{'rank':>4} {'compute':>10} {'comm':>10} {'overlap':>10} {'idle':>10} {'wait':>10}"
        ]
        for r, s in enumerate(self.stats(device)):
            lines.append(
                f"{r:>4} "
                + " ".join(
                    f"{s[k] * 1e3:>7.1f} ms" for k in ("compute", "comm", "overlap", "idle", "wait")
                )
            )
        return "\n".join(lines)

    # -- text --------------------------------------------------------------------------------

    def text(self) -> str:
        """The timeline as text, without times: per rank, the outermost labels and collective
        calls of its main thread in order (repeats as ``name x3``), then the collectives as the
        transport ran them, with counts. Ranks with the same lines print once (``ranks 0-3``)."""
        device = "CPU+CUDA" if self._device(None) == "cuda" else "CPU"
        header = f"Timeline: {self.world_size} rank{'s' if self.world_size > 1 else ''}, {device}"
        blocks: list[tuple[list[int], list[str]]] = []
        for r in range(self.world_size):
            body = _wrap(_runs(self.names(r)) or ["(no labels)"], " > ")
            body += _wrap(_counts(self.transports(r)) or ["none"], ", ", first="comm: ")
            if blocks and blocks[-1][1] == body:
                blocks[-1][0].append(r)
            else:
                blocks.append(([r], body))
        lines = [header]
        for ranks, body in blocks:
            who = _output.tag(ranks)[1:-1]  # "rank 2", "ranks 0,1", "ranks 0-3", as folded output
            lines.append(who + ":")
            lines.extend(body)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.text()

    __str__ = __repr__

    # -- the Chrome / Perfetto file ----------------------------------------------------------

    def chrome_trace(self) -> dict:
        """The merged trace as a dict in the Chrome trace format: one process per rank (pid =
        rank, named "rank N"), every event of every thread, times in microseconds from the
        moment the ranks met."""
        out = []
        for r, t in enumerate(self.traces):
            shift = self._shifts[r]
            out.append(
                {
                    "ph": "M",
                    "name": "process_name",
                    "pid": r,
                    "tid": 0,
                    "args": {"name": f"rank {r}"},
                }
            )
            out.append(
                {
                    "ph": "M",
                    "name": "process_sort_index",
                    "pid": r,
                    "tid": 0,
                    "args": {"sort_index": r},
                }
            )
            for tid, name in t["threads"].items():
                label = "main" if tid == str(t["main_tid"]) else name
                out.append(
                    {
                        "ph": "M",
                        "name": "thread_name",
                        "pid": r,
                        "tid": _tid(tid),
                        "args": {"name": label},
                    }
                )
            sync_end = _sync_end(t)
            for e in t["events"]:
                if sync_end is not None and float(e["ts"]) < sync_end:
                    continue  # before the ranks met
                ts = float(e["ts"]) - shift
                ev = dict(e)
                ev["pid"], ev["tid"], ev["ts"] = r, _tid(e.get("tid", 0)), ts
                out.append(ev)
        return {"traceEvents": out, "displayTimeUnit": "ms"}

    def save(self, path) -> str:
        """Write the merged trace (`chrome_trace`) as JSON to ``path``; open it in
        https://ui.perfetto.dev (or chrome://tracing). Returns the path as a string.

        Raises OSError (e.g. FileNotFoundError) if the file cannot be written."""
        path = os.fspath(path)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.chrome_trace(), f)
        return path

    @property
    def _shifts(self) -> list[float]:
        return _shifts(self.traces)

    # -- the picture -------------------------------------------------------------------------

    def figure(self, device: str | None = None):
        """A matplotlib ``Figure``: one swim-lane per rank (labels, compute, comm with its
        waits), milliseconds along the bottom. Not shown by pyplot; display or save it."""
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch

        device = self._device(device)
        n = self.world_size
        bases = []  # the kinds of labels, in order of first appearance: one colour each
        for r in range(n):
            for e in self._events[r]:
                if e.kind == "label" and e.thread == "main" and e.depth == 0:
                    if _base(e.name) not in bases:
                        bases.append(_base(e.name))
        label_colours = {b: _LABEL_COLOURS[i % len(_LABEL_COLOURS)] for i, b in enumerate(bases)}
        key_rows = -(-len(bases) // 3)  # the colour key below the plot, three per row
        height = 1.0 + 1.0 * n + 0.2 * key_rows
        fig = Figure(figsize=(10, height), facecolor=_BACKGROUND)
        ax = fig.add_axes((0.1, (0.6 + 0.2 * key_rows) / height, 0.88, n / height))
        ax.set_facecolor(_BACKGROUND)
        scale = 1e3  # seconds -> ms
        yticks, ylabels = [], []
        for r in range(n):
            top = (n - 1 - r) * 1.0
            rows = {"label": top + 0.68, "compute": top + 0.38, "comm": top + 0.08}
            for e in self._events[r]:
                if e.kind == "label" and e.thread == "main" and e.depth == 0:
                    ax.broken_barh(
                        [(e.start * scale, e.duration * scale)],
                        (rows["label"], 0.24),
                        facecolors=label_colours[_base(e.name)],
                        edgecolor=_INK,
                        linewidth=0.4,
                    )
                    self._bar_text(ax, e, e.name, rows["label"], scale)
            compute = self._compute(r, device)
            ax.broken_barh(
                [(a * scale, (b - a) * scale) for a, b in compute],
                (rows["compute"], 0.24),
                facecolors=_COMPUTE_COLOUR,
            )
            transport = (
                [e for e in self._events[r] if e.kind == "comm" and e.thread == "gpu"]
                if device == "cuda"
                else self._transport(r)
            )
            ax.broken_barh(
                [(e.start * scale, e.duration * scale) for e in transport],
                (rows["comm"], 0.24),
                facecolors=_COMM_COLOUR,
                edgecolor=_INK,
                linewidth=0.4,
            )
            for e in transport:
                self._bar_text(
                    ax,
                    e,
                    e.issued_by or e.name,
                    rows["comm"],
                    scale,
                    bbox={"facecolor": _COMM_COLOUR, "edgecolor": "none", "pad": 0.5},
                )
            if device == "cpu":
                for e, w in zip(transport, self._waits(r), strict=True):
                    if w:
                        ax.broken_barh(
                            [(e.start * scale, w * scale)],
                            (rows["comm"], 0.24),
                            facecolors=_WAIT_COLOUR,
                            hatch="///",
                            edgecolor=_INK,
                            linewidth=0.4,
                        )
            yticks += [rows["label"] + 0.12, rows["compute"] + 0.12, rows["comm"] + 0.12]
            ylabels += [f"rank {r}  labels", "compute", "comm"]
        ax.set_yticks(yticks, ylabels, fontsize=8)
        ax.set_ylim(0, n)
        ax.set_xlim(0, max(self._end, 1e-6) * scale)
        ax.set_xlabel("ms since the ranks met", fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
        for r in range(1, n):
            ax.axhline(r, color="#BBBBBB", lw=0.8)
        ax.legend(
            handles=[
                Patch(facecolor=_COMPUTE_COLOUR, label="compute (PyTorch ops)"),
                Patch(facecolor=_COMM_COLOUR, edgecolor=_INK, label="collective under way"),
                Patch(
                    facecolor=_WAIT_COLOUR,
                    hatch="///",
                    edgecolor=_INK,
                    label="waiting for the last rank",
                ),
            ],
            loc="lower center",
            bbox_to_anchor=(0.5, 1.0),
            ncol=3,
            fontsize=8,
            frameon=False,
        )
        if bases:
            fig.legend(
                handles=[Patch(facecolor=label_colours[b], edgecolor=_INK, label=b) for b in bases],
                loc="lower center",
                bbox_to_anchor=(0.5, 0.02),
                ncol=3,
                fontsize=7,
                frameon=False,
                title="labels (record_function)",
                title_fontsize=7,
            )
        return fig

    def _bar_text(self, ax, e: Event, name: str, row: float, scale: float, **style) -> None:
        """``name`` centred on the bar of event ``e`` in lane ``row``, if it fits the bar."""
        text = _shown(name, e.duration, self._end)
        if text:
            ax.text(
                (e.start + e.duration / 2) * scale,
                row + 0.12,
                text,
                ha="center",
                va="center",
                fontsize=7,
                color=_INK,
                clip_on=True,
                **style,
            )

    def png(self) -> bytes:
        """The picture as PNG bytes."""
        if self._png is None:
            from .pictures import png_bytes

            self._png = png_bytes(self.figure())
        return self._png

    def _repr_png_(self):
        from .pictures import png_repr

        return png_repr(self.png())


# ----------------------------------------------------------------------------------------------
# Building events from the raw traces
# ----------------------------------------------------------------------------------------------


def _base(name: str) -> str:
    """A label without its module or layer: "FSDP::pre_forward (1)" -> "FSDP::pre_forward"."""
    return re.sub(r"\s*(?:\(\d+\)|for \S+)$", "", name)


def _shown(text: str, duration: float, total: float) -> str | None:
    """The text to write on a bar: ``text``, else without its "FSDP::"-like prefix, else None."""
    for candidate in (text, re.sub(r"^\w+::", "", text)):
        if _fits(candidate, duration, total):
            return candidate
    return None


def _fits(text: str, duration: float, total: float) -> bool:
    """Whether ``text`` at 7 pt fits inside a bar of ``duration`` on an axis ``total`` long."""
    return total > 0 and len(text) * _CHAR_INCHES * total / _AXES_INCHES < 0.95 * duration


def _tid(tid):
    try:
        return int(tid)
    except (TypeError, ValueError):
        return str(tid)


def _sync_end(trace: dict) -> float | None:
    ends = [
        float(e["ts"]) + float(e.get("dur", 0))
        for e in trace["events"]
        if e.get("name") == _SYNC and str(e.get("tid")) == str(trace["main_tid"])
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


def _build(traces: list[dict]) -> tuple[list[list[Event]], float]:
    shifts = _shifts(traces)
    out: list[list[Event]] = []
    end = 0.0
    for t, shift in zip(traces, shifts, strict=True):
        sync_end = _sync_end(t)
        main = str(t["main_tid"])
        threads = t["threads"]
        raw = []
        for e in t["events"]:
            ts = float(e["ts"])
            if sync_end is not None and ts < sync_end:
                continue  # before the ranks met (the profiler starting, the sync itself)
            name = str(e.get("name", ""))
            cat = str(e.get("cat", ""))
            tid = str(e.get("tid"))
            gpu = cat in _GPU_CATS or cat.startswith("gpu_")
            if gpu:
                if cat == "gpu_user_annotation":
                    continue  # copies of CPU labels on the GPU lane
                kind = "comm" if _COMM.search(name) else "kernel"
                thread = "gpu"
            else:
                if _COMM.search(name):
                    kind = "comm"
                elif cat == "cpu_op":
                    if not _OP.match(name):
                        continue  # autograd's wrappers (they also span the hooks' waits)
                    kind = "op"
                elif cat == "user_annotation":
                    kind = "label"
                else:
                    continue  # python functions, runtime calls, flow events, ...
                thread = "main" if tid == main else _thread_name(threads.get(tid, tid))
            start = (ts - shift) / 1e6
            dur = float(e.get("dur", 0)) / 1e6
            raw.append((start, start + dur, name, kind, thread))
        raw.sort(key=lambda x: (x[0], -(x[1] - x[0])))
        events = _nest(raw)
        events = _attribute(events)
        out.append(events)
        if events:
            end = max(end, max(e.end for e in events))
    return out, end


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
        if e.kind == "comm" and e.thread not in ("main", "gpu") and _TRANSPORT.search(e.name)
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


def _runs(names: list[str]) -> list[str]:
    """["a", "a", "b"] -> ["a x2", "b"]."""
    out: list[list] = []
    for n in names:
        if out and out[-1][0] == n:
            out[-1][1] += 1
        else:
            out.append([n, 1])
    return [n if k == 1 else f"{n} x{k}" for n, k in out]


def _wrap(items: list[str], sep: str, first: str = "", width: int = 96) -> list[str]:
    """``items`` joined by ``sep`` (" > " or ", ") on lines of at most ``width`` characters."""
    lines = ["  " + first + items[0]]
    for item in items[1:]:
        if len(lines[-1]) + len(sep) + len(item) <= width:
            lines[-1] += sep + item
        elif sep.strip() == ",":
            lines[-1] += ","
            lines.append("    " + item)
        else:
            lines.append("    " + sep.lstrip() + item)
    return lines


def _counts(names: list[str]) -> list[str]:
    """["a", "b", "a"] -> ["a x2", "b x1"], in order of first appearance."""
    return [f"{n} x{k}" for n, k in Counter(names).items()]


# -- interval arithmetic (sorted, disjoint lists of (start, end)) -------------------------------


def _union(intervals) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _intersect(xs, ys) -> list[tuple[float, float]]:
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append((a, b))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def _subtract(xs, ys) -> list[tuple[float, float]]:
    out = []
    for a, b in xs:
        cur = a
        for c, d in ys:
            if d <= cur or c >= b:
                continue
            if c > cur:
                out.append((cur, c))
            cur = max(cur, d)
        if cur < b:
            out.append((cur, b))
    return out


def _length(intervals) -> float:
    return sum(b - a for a, b in intervals)
