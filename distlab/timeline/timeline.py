"""`Timeline`: what every rank did during a recording, and the questions a learner can ask of
it (events, names, counts; compute, comm, overlap, idle, wait). The text form, the Chrome export
and the picture live in their own modules; this class ties them together."""

from __future__ import annotations

import json
import os

from .._chart import Chart
from .._config import check_int
from ..errors import InputError
from . import chrome as _chrome
from . import drawing as _drawing
from . import metrics, trace
from . import text as _text
from .intervals import intersect, length, union
from .trace import Event


class Timeline(Chart):
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
            raise InputError("a Timeline needs one trace per rank; got none")
        for r, t in enumerate(traces):
            if not isinstance(t, dict) or "events" not in t or "threads" not in t:
                raise InputError(
                    f"trace {r} is not a distlab.timeline trace (a dict with 'events' and "
                    f"'threads', as recording().trace holds); got {type(t).__name__}"
                )
        self.traces = traces
        self.results = results
        self.world_size = len(traces)
        self._aligned = trace.align(traces)
        self._events = trace.build(traces, self._aligned)
        self._end = max((e.end for events in self._events for e in events), default=0.0)

    # -- events ------------------------------------------------------------------------------

    def _rank(self, rank) -> int:
        check_int(rank, "rank", error=TypeError)
        return check_int(rank, "rank", low=0, high=self.world_size - 1, message=(
            f"rank {rank} is not in this timeline (ranks 0..{self.world_size - 1})"))

    def events(self, rank: int, kind: str | None = None) -> list[Event]:
        """Every `Event` of ``rank`` (of one ``kind``: "label", "op", "comm", "kernel"), by
        start time. Raises ValueError for an unknown rank or kind."""
        rank = self._rank(rank)
        if kind is not None and kind not in ("label", "op", "comm", "kernel"):
            raise InputError(f"kind must be 'label', 'op', 'comm' or 'kernel', got {kind!r}")
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
        return metrics.transports(self._events[rank])

    # -- numbers -----------------------------------------------------------------------------

    @property
    def duration(self) -> float:
        """Seconds from the moment the ranks met to the end of the last event on any rank."""
        return self._end

    def _device(self, device: str | None) -> str:
        if device is None:
            return "cuda" if any(t.get("cuda") for t in self.traces) else "cpu"
        if device not in ("cpu", "cuda"):
            raise InputError(f"device must be 'cpu' or 'cuda', got {device!r}")
        return device

    def _compute(self, rank: int, device: str) -> list[tuple[float, float]]:
        return metrics.compute(self._events[rank], device)

    def _comm(self, rank: int, device: str) -> list[tuple[float, float]]:
        return metrics.comm(self._events[rank], device)

    def compute(self, rank: int, device: str | None = None) -> float:
        """Seconds ``rank`` spent computing: in PyTorch ops, less the time it was blocked in
        them by a collective or a ``wait()`` (on the GPU: in kernels that are not NCCL). See
        `stats` for every definition. ``device``: "cpu" or "cuda" (default: "cuda" when the
        trace has GPU activity)."""
        return length(self._compute(self._rank(rank), self._device(device)))

    def comm(self, rank: int, device: str | None = None) -> float:
        """Seconds ``rank`` had a collective under way (its waits included)."""
        return length(self._comm(self._rank(rank), self._device(device)))

    def overlap(self, rank: int, device: str | None = None) -> float:
        """Seconds in which ``rank`` computed while a collective was under way. Not time saved:
        compare the step's wall time with and without overlap for that."""
        rank, device = self._rank(rank), self._device(device)
        return length(intersect(self._compute(rank, device), self._comm(rank, device)))

    def idle(self, rank: int, device: str | None = None) -> float:
        """Seconds of the timeline in which ``rank`` did neither compute nor communicate."""
        rank, device = self._rank(rank), self._device(device)
        busy = union(self._compute(rank, device) + self._comm(rank, device))
        return max(0.0, self._end - length(busy))

    def _collectives(self) -> list[list[metrics.CollectiveOnRank]]:
        return [metrics.collectives(self._events[r]) for r in range(self.world_size)]

    def _wait_intervals(self, rank: int) -> list[tuple[str, list[tuple[float, float]]]]:
        return metrics.waits(self._collectives(), rank)

    def waits(self, rank: int) -> list[tuple[str, float]]:
        """For each collective ``rank`` called, in order: its call's name (``c10d::allreduce_``)
        and the seconds from this rank's arrival to the last rank's (0.0 for the last to come).

        The k-th collective of a name on one rank is matched with the k-th of that name on the
        others: right for collectives on the default group, which every rank runs in the same
        order.
        """
        return [(name, length(iv)) for name, iv in self._wait_intervals(self._rank(rank))]

    def wait(self, rank: int) -> float:
        """Seconds ``rank`` spent waiting for the last rank to arrive at a collective: what a
        straggler costs the others. Two collectives in flight at once that wait for the same
        late rank count that time once (the union of the `waits`' intervals)."""
        rank = self._rank(rank)
        return length(union([x for _, iv in self._wait_intervals(rank) for x in iv]))

    def stats(self, device: str | None = None) -> list[dict[str, float]]:
        """Per rank, a dict of seconds: ``compute``, ``comm``, ``overlap``, ``idle``, ``wait``
        and ``total`` (the timeline's length, the same for every rank). What they mean:

        - compute: time in PyTorch ops, less the time the thread was blocked inside them (in a
          collective's call, or a ``wait()`` on a collective or a future). An op that only wraps
          a blocking all_reduce (``AccumulateGrad`` running a hook that waits) is not compute.
        - comm: time a collective was under way (its call and its transport), waits included.
        - overlap: compute and comm at once. It is not time saved: on two busy cores the two
          also slow each other; compare the step's wall time with and without it.
        - idle: neither (Python between ops, ``time.sleep``, the profiler itself).
        - wait: from this rank's arrival at a collective (its call) to the last rank's arrival,
          as one union over all collectives.

        On a GPU (``device="cuda"``), compute and comm are kernels (NCCL's or not).
        """
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
        return _text.text(self)

    def __repr__(self) -> str:
        return self.text()

    __str__ = __repr__

    # -- the Chrome / Perfetto file ----------------------------------------------------------

    def chrome_trace(self) -> dict:
        """The merged trace as a dict in the Chrome trace format: one process per rank (pid =
        rank, named "rank N"), every event of every thread, times in microseconds from the
        moment the ranks met."""
        return _chrome.chrome_trace(self)

    def save(self, path) -> str:
        """Write the merged trace (`chrome_trace`) as JSON to ``path``; open it in
        https://ui.perfetto.dev (or chrome://tracing). Returns the path as a string.

        Raises OSError (e.g. FileNotFoundError) if the file cannot be written."""
        path = os.fspath(path)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.chrome_trace(), f)
        return path

    # -- the picture -------------------------------------------------------------------------

    def figure(self, device: str | None = None):
        """A matplotlib ``Figure``: one swim-lane per rank (labels, compute, comm with its
        waits), milliseconds along the bottom. Not shown by pyplot; display or save it."""
        return _drawing.figure(self, device)
