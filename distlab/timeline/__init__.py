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

Where things are: `recording` runs on the ranks (`distlab.timeline.recording`); the kernel turns
the raw traces into events (`trace`), numbers (`metrics`, on `intervals`), text (`text`), a
Chrome trace (`chrome`) and a picture (`drawing`), all reached through `Timeline`.
"""

from __future__ import annotations

from ..errors import InputTypeError, entry_point
from .recording import recording
from .recording import run_recorded as _run_recorded
from .recording import take_last as _take_last
from .timeline import Timeline
from .trace import Event

__all__ = ["Event", "Timeline", "collect", "record", "recording"]


@entry_point
def record(fn, *args, cluster=None, sync: bool = True, cuda: bool | None = None, **kwargs):
    """Run ``fn(*args, **kwargs)`` on every rank under `torch.profiler`; return its `Timeline`.

    Args:
        fn: the function to run on every rank (as for `distlab.launch`). What it returns is in
            the timeline's ``.results`` (one per rank).
        args, kwargs: passed to ``fn``, except keyword arguments named like `distlab.launch`'s
            options (``world_size``, ``timeout``, ``backend``, ``threads``, ``stream``,
            ``fold``, ``start_method``, ``env``), which set up the ranks as for launch (so
            ``fn`` cannot take keyword arguments with those names; wrap it if it must).
        cluster: a live `distlab.Cluster` to run on. Default: new ranks, as `distlab.launch`
            (``world_size`` 2 unless given). With a cluster, leave ``world_size`` out or give
            the cluster's own; ``timeout``, ``stream`` and ``fold`` still apply.
        sync: meet in a small all_reduce first, so that lanes start together (see `recording`).
        cuda: also record GPU activity; default: on ranks that have used CUDA already or have
            an NCCL process group (pass True when ``fn`` is the first to touch the GPU).

    Returns:
        A `Timeline`: shown as swim-lanes in Jupyter, as the names of events per rank in text.

    Raises:
        TypeError: ``fn`` is not callable, ``sync`` is not a bool, or an argument cannot be
            pickled (as for launch).
        ValueError: ``world_size`` does not match the cluster's, or is not a valid world size;
            ``backend``/``threads``/``start_method``/``env`` given with a cluster (a cluster's
            ranks are already set up).
        RuntimeError: the cluster has been shut down (start a new one).
        distlab.RankError / distlab.RankTimeout: ``fn`` raised or hung on a rank, as for launch;
            or a profiler was already running on a rank (the RankError shows `recording`'s
            RuntimeError: leave your own ``torch.profiler.profile`` block first).
    """
    from .. import _config
    from ..launcher import on_ranks, split_options

    _config.check_callable(fn, "timeline.record()")
    if not isinstance(sync, bool):
        raise InputTypeError(f"sync must be True or False, got {sync!r}")
    options, fn_kwargs = split_options(kwargs)
    out = on_ranks(_run_recorded, (fn, args, fn_kwargs, sync, cuda), options, cluster=cluster)
    return Timeline([trace for _, trace in out], results=[value for value, _ in out])


@entry_point
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
    from ..launcher import from_every_rank

    traces = from_every_rank(
        cluster,
        _take_last,
        missing="have recorded nothing yet. In a %%ranks cell (on every rank), first run:\n"
        "    from distlab import timeline\n"
        "    with timeline.recording():\n"
        "        ...   # the code to profile\n"
        "then call distlab.timeline.collect(cluster) again.",
    )
    return Timeline(traces)
