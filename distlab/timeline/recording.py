"""The ranks' side of a timeline: profile a block of code with PyTorch's own profiler (Kineto)
and keep the trace as plain data that pickles back to the kernel.

`recording` is what a learner writes in a ``%%ranks`` cell; `run_recorded` and `take_last` are
what `distlab.timeline.record` and `collect` run on the ranks. Nothing here parses the trace
(`distlab.timeline.trace` does that, in the kernel).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading

from .. import _torch
from .._config import process_group_rank
from ..errors import InputTypeError
from .trace import SYNC, WAIT

_active: _Recording | None = None  #: the recording running on this rank, if any
_last: dict | None = None  #: the trace of this rank's last recording (what `collect` fetches)


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
        if _torch.profiler_enabled():
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
        _record_waits(True)
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
            _record_waits(False)
            self._prof.__exit__(None, None, None)
        self.trace = _export(self._prof, self._cuda)
        _last = self.trace


_UNPATCHED: dict = {}


def _record_waits(on: bool) -> None:
    """While recording, every ``wait()`` on a collective's `Work` or a `torch.futures.Future`
    called from Python is recorded as a ``distlab:wait`` region. The profiler does not record
    them itself, and without them the time a thread sits blocked inside an op (a hook doing a
    blocking all_reduce inside ``AccumulateGrad``) would count as compute. Waits in C++ (DDP's
    Reducer) happen outside any op and need no marking."""
    import torch.distributed as dist
    from torch.autograd.profiler import record_function

    # torch._C.Future: what get_future(), then() and collect_all return; torch.futures.Future
    # subclasses it and only calls up, so patching the base records every future's wait once.
    classes = [_torch.future_type()]
    if dist.is_available():
        classes.append(dist.distributed_c10d.Work)
    for cls in classes:
        if not on:
            if cls in _UNPATCHED:
                cls.wait = _UNPATCHED.pop(cls)
            continue
        original = cls.wait
        _UNPATCHED[cls] = original

        def wait(self, *args, _original=original, **kwargs):
            with record_function(WAIT):
                return _original(self, *args, **kwargs)

        cls.wait = wait


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
        raise InputTypeError(f"sync must be True or False, got {sync!r}")
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
    with record_function(SYNC):
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
    rank, world_size = process_group_rank()
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


def take_last():
    """Run on a rank by `collect`: the trace of its last recording, or None."""
    return _last


def run_recorded(fn, args, kwargs, sync, cuda):
    """Run on every rank by `record`: ``fn(*args, **kwargs)`` under a recording."""
    rec = _Recording(sync, cuda)
    with rec:
        value = fn(*args, **kwargs)
    return value, rec.trace
