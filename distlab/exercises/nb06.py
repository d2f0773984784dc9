"""Graders for notebook 06, async work and coalescing (see `distlab.exercises`).

"Asynchronous" is checked by what the ranks really did, not by an ``async_op=True`` in the
source: the grader makes the last rank arrive `LATE` seconds after the others. An answer that
starts every all-reduce before it waits for any issues them all on rank 0 within milliseconds,
whatever the load; an answer that waits for each one (a blocking call, or ``.wait()`` right
after each start) cannot issue the next before the late rank has arrived.
"""

from __future__ import annotations

from .. import _torch
from . import expect

#: How late the last rank arrives (seconds).
LATE = 0.5
#: Calls that rank 0 issues within this many seconds were in flight together: an answer that
#: waits for each needs at least `LATE` between two of them.
TOGETHER = 0.25



def _late_last_rank() -> None:
    """Every rank meets, then the last one sleeps `LATE` seconds."""
    import time

    import torch.distributed as dist

    dist.barrier()
    if dist.get_rank() == dist.get_world_size() - 1:
        time.sleep(LATE)


def _all_reduce_calls(fn):
    """Run ``fn()`` with ``dist.all_reduce`` watched: ``(value, calls, seconds fn took)``, where
    ``calls`` is ``[(seconds since fn started, numel, async_op)]`` for every all_reduce it made."""
    import time

    import torch.distributed as dist

    calls, real = [], dist.all_reduce
    start = time.perf_counter()

    def watched(tensor, *args, **kwargs):
        async_op = kwargs.get("async_op", args[2] if len(args) > 2 else False)
        calls.append((time.perf_counter() - start, tensor.numel(), bool(async_op)))
        return real(tensor, *args, **kwargs)

    dist.all_reduce = watched
    try:
        value = fn()
    finally:
        dist.all_reduce = real
    return value, calls, time.perf_counter() - start


def _spread(calls) -> float:
    return calls[-1][0] - calls[0][0] if calls else 0.0


# -- exercise 1: average several tensors asynchronously ---------------------------------------

SHAPES_1 = [(2,), (3, 2), (1,)]


def _inputs_1(rank):
    import torch

    return [(torch.arange(float(torch.Size(s).numel())).reshape(s) + 1) * (rank + 1) + i
            for i, s in enumerate(SHAPES_1)]


def _mean_async_on_rank(mean_async):
    import torch
    import torch.distributed as dist

    tensors = _inputs_1(dist.get_rank())
    _late_last_rank()
    fut, calls, took = _all_reduce_calls(lambda: mean_async(tensors))
    future = _torch.future_type()  # what get_future(), then() and collect_all give
    if not isinstance(fut, future):
        return ("not a future", expect.describe(fut)), calls, took
    value = fut.wait()
    if isinstance(value, list) and value and all(isinstance(v, future) for v in value):
        return ("futures", None), calls, took  # collect_all's own value: futures do not pickle
    if not (isinstance(value, list) and all(isinstance(v, torch.Tensor) for v in value)):
        value = expect.describe(value)
    return ("future", value), calls, took


def exercise_1(mean_async) -> None:  # noqa: C901 -- one message per mistake
    """``mean_async(tensors)`` on 3 ranks, for three tensors of different shapes: one
    ``all_reduce(..., async_op=True)`` per tensor, all started before it returns, and ONE future
    whose value is the list of averages (in order, same shapes). The last rank comes `LATE`
    seconds late: an answer that waits for its all-reduces returns only after it came."""
    world_size = 3
    expect.not_written(mean_async, _inputs_1(0))
    results = expect.run(_mean_async_on_rank, mean_async, world_size=world_size)
    truth = [sum(_inputs_1(r)[i] for r in range(world_size)) / world_size
             for i in range(len(SHAPES_1))]
    for rank, ((kind, value), calls, took) in enumerate(results):
        if kind == "not a future":
            raise AssertionError(
                "mean_async should return ONE future (torch.futures.collect_all(futures) "
                f"turns a list of futures into one); on rank {rank} it returned {value}"
            )
        if len(calls) != len(SHAPES_1):
            raise AssertionError(
                f"mean_async should start one dist.all_reduce per tensor ({len(SHAPES_1)}); "
                f"rank {rank} started {len(calls)}"
            )
        if not all(async_op for _, _, async_op in calls):
            raise AssertionError(
                "the all-reduces should be started with async_op=True: a blocking one waits "
                "for the slowest rank before mean_async can go on"
            )
        if rank < world_size - 1 and took >= TOGETHER:
            raise AssertionError(
                f"mean_async waited for the all-reduces: on rank {rank} it returned only after "
                f"the late rank arrived ({took:.2f} s). Return the future at once; whoever "
                "needs the averages calls .wait() on it"
            )
        if kind == "futures":
            raise AssertionError(
                "the future's value should be the list of averaged tensors; it is a list of "
                "futures (collect_all's own value): chain .then(lambda f: [g.value()[0] / "
                "world_size for g in f.value()])"
            )
        if not isinstance(value, list) or len(value) != len(truth):
            shown = value if isinstance(value, str) else expect.describe(value)
            raise AssertionError(
                f"the future's value should be a list of {len(truth)} tensors (the averages, "
                f"in order); on rank {rank} it is {shown}"
            )
        for i, (got, want) in enumerate(zip(value, truth, strict=True)):
            expect.close(got, want, f"rank {rank}'s average of tensor {i}",
                         world_size=world_size)


# -- exercise 2: buckets ----------------------------------------------------------------------

SHAPES_2 = [(3,), (5,), (2,), (11,), (1,), (2, 2)]  # 11 > CAP: a bucket of its own
CAP = 8
BUCKETS = [8, 2, 11, 5]  # in order, each at most CAP unless one tensor is larger


def _inputs_2(rank):
    import torch

    return [(torch.arange(float(torch.Size(s).numel())).reshape(s) + 1) * (rank + 1)
            for s in SHAPES_2]


def _buckets_on_rank(all_reduce_buckets):
    import torch.distributed as dist

    tensors = _inputs_2(dist.get_rank())
    _late_last_rank()
    value, calls, _ = _all_reduce_calls(lambda: all_reduce_buckets(tensors, CAP))
    return tensors, value, calls


def exercise_2(all_reduce_buckets) -> None:
    """``all_reduce_buckets(tensors, cap)`` on 2 ranks, with tensors of 3, 5, 2, 11, 1 and 2x2
    elements and cap 8: the sums, in place; one all-reduce per bucket, the buckets packed in
    order (8, 2, 11 and 5 elements), all in flight together (the second rank arrives `LATE`
    seconds late: waiting for each bucket before starting the next shows)."""
    world_size = 2
    expect.not_written(all_reduce_buckets, _inputs_2(0), CAP)
    results = expect.run(_buckets_on_rank, all_reduce_buckets, world_size=world_size)
    truth = [sum(_inputs_2(r)[i] for r in range(world_size)) for i in range(len(SHAPES_2))]
    for rank, (tensors, _, calls) in enumerate(results):
        for i, (got, want) in enumerate(zip(tensors, truth, strict=True)):
            expect.close(got, want, f"rank {rank}'s tensor {i} after all_reduce_buckets (the "
                         "sum over the ranks, in place)", world_size=world_size)
        sizes = [numel for _, numel, _ in calls]
        if not calls:
            raise AssertionError(
                "all_reduce_buckets made no dist.all_reduce: start one per bucket, "
                "dist.all_reduce(flat, async_op=True)"
            )
        if sizes != BUCKETS:
            why = ("one all-reduce per tensor: no buckets" if len(sizes) == len(SHAPES_2) else
                   "one all-reduce for everything" if len(sizes) == 1 else
                   "the buckets are packed differently")
            raise AssertionError(
                f"the all-reduces should carry buckets of {BUCKETS} elements (walk the tensors "
                f"in order; close a bucket when the next tensor would take it over cap={CAP}; "
                f"a tensor bigger than cap gets its own); rank {rank}'s carried {sizes}: {why}"
            )
        if not all(async_op for _, _, async_op in calls):
            raise AssertionError(
                "start each bucket's all-reduce with async_op=True: a blocking one makes the "
                "next bucket wait for the slowest rank"
            )
        if rank < world_size - 1 and _spread(calls) >= TOGETHER:
            raise AssertionError(
                "the buckets' all-reduces ran one after another: rank 0 started the last one "
                f"{_spread(calls):.2f} s after the first, after waiting for the late rank. "
                "Start every bucket first, then wait for all of them"
            )


# -- exercise 3: predict a sparse sum ---------------------------------------------------------


def _sparse_sum():
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    s = torch.sparse_coo_tensor([[rank, rank + 2]], [1.0, 1.0], (6,), check_invariants=True)
    dist.all_reduce(s)
    s = s.coalesce()
    return s.to_dense().tolist(), s.values().numel()


def exercise_3(predicted_dense, predicted_nnz) -> None:
    """``predicted_dense()`` (a list of 6 floats) and ``predicted_nnz()`` (an int) against a
    real sparse all_reduce on 4 ranks (rank r: ones at positions r and r + 2), coalesced."""
    dense, nnz = predicted_dense(), predicted_nnz()
    truth_dense, truth_nnz = expect.run(_sparse_sum, world_size=4)[0]
    expect.same(dense, truth_dense, "predicted_dense()")
    expect.same(nnz, truth_nnz, "predicted_nnz() (entries stored after coalesce())")
