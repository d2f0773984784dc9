"""Graders for notebook 02, point-to-point (see `distlab.exercises`).

Also the rank-side spy the graders of notebooks 02-05 share: `spied` runs the learner's function
with some of ``torch.distributed``'s functions wrapped, so that a check knows which calls a rank
really made, and how big their tensors were, without trusting a count the answer computed.
(The profiler, `expect.collectives`, sees every collective too, but not whether a send was
blocking, nor sizes, and it starts slowly in a fresh interpreter.)
"""

from __future__ import annotations

from . import expect

#: The collectives a "build it from send and recv" answer must not call.
COLLECTIVES = (
    "all_reduce", "reduce", "broadcast", "all_gather", "all_gather_single",
    "all_gather_into_tensor", "all_gather_object", "gather", "scatter", "reduce_scatter",
    "reduce_scatter_single", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
)


def spied(fn, names, *args):
    """On a rank: ``fn(*args)`` with each ``torch.distributed.<name>`` in ``names`` wrapped.

    Returns ``(value, calls)``: ``calls[name]`` lists, for each call the answer made, the size
    of its first argument (a tensor's ``numel()``, a list's ``len()``); calls that a watched
    call makes itself are not counted. The originals are put back after.
    ``isend``/``irecv`` are also replaced inside ``distributed_c10d``, where
    ``batch_isend_irecv`` recognizes them by identity.
    """
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    calls: dict[str, list] = {name: [] for name in names}
    saved = []
    inside = [0]  # a call made by a watched call (dist.send calls isend) is not the answer's

    def wrapped(name, original):
        def call(*a, **kw):
            if inside[0]:
                return original(*a, **kw)
            first = a[0] if a else next(iter(kw.values()), None)
            size = first.numel() if hasattr(first, "numel") else (
                len(first) if isinstance(first, (list, tuple)) else None
            )
            calls[name].append(size)
            inside[0] += 1
            try:
                return original(*a, **kw)
            finally:
                inside[0] -= 1

        call.__name__ = original.__name__
        return call

    for name in names:
        original = getattr(dist, name)
        modules = [dist] + ([c10d] if name in ("isend", "irecv") else [])
        spy = wrapped(name, original)
        for module in modules:
            saved.append((module, name, getattr(module, name)))
            setattr(module, name, spy)
    try:
        value = fn(*args)
    finally:
        for module, name, original in saved:
            setattr(module, name, original)
    return value, calls


def each_case(fn, names, cases):
    """On a rank: `spied` ``fn(*case[rank])`` for each case (``case[r]``: rank r's arguments,
    a tuple); a list of ``(value, calls)``."""
    import torch.distributed as dist

    rank = dist.get_rank()
    return [spied(fn, names, *case[rank]) for case in cases]


def forbid(calls: dict, names, rank: int, what: str) -> None:
    """No call of ``names`` in a rank's `spied` ``calls``; else say which, and ``what`` to do."""
    used = [n for n in names if calls.get(n)]
    if used:
        listed = ", ".join(f"dist.{n}" for n in used)
        raise AssertionError(f"rank {rank} called {listed}: {what}")


def how_often(n: int) -> str:
    """1 -> "once", 3 -> "3 times"."""
    return "once" if n == 1 else f"{n} times"


# -- exercise 1 -------------------------------------------------------------------------------


def exercise_1(ring_shift_blocking) -> None:
    """``ring_shift_blocking()`` on 4 ranks, then on 3: each rank sends its rank to the right
    with a blocking ``dist.send`` and returns what it received from the left (a float) with a
    blocking ``dist.recv``."""
    for world_size in (4, 3):
        results = expect.run(spied, ring_shift_blocking, ("send", "recv"), world_size=world_size)
        for rank, (value, calls) in enumerate(results):
            sends, recvs = len(calls["send"]), len(calls["recv"])
            if (sends, recvs) != (1, 1):
                raise AssertionError(
                    f"on {world_size} ranks, rank {rank} called the blocking dist.send "
                    f"{how_often(sends)} and dist.recv {how_often(recvs)}; the exercise asks "
                    "for one of each per rank (isend, irecv and batch_isend_irecv return at "
                    "once: they do not count here)"
                )
            expect.same(
                value, float((rank - 1) % world_size),
                f"on {world_size} ranks, rank {rank}'s answer (its left neighbour's rank)",
            )


# -- exercise 2 -------------------------------------------------------------------------------


def exercise_2(ring_all_gather) -> None:
    """``ring_all_gather(mine)`` on 4 ranks, ``mine`` a one-element tensor of a random value:
    every rank returns the list of every rank's tensor, in rank order, through
    ``world_size - 1`` steps of ``batch_isend_irecv`` and no collective."""
    import torch

    world_size = 4
    gen = torch.Generator().manual_seed(2)
    values = [torch.randint(-99, 100, (1,), generator=gen).float() for _ in range(world_size)]
    case = [(v,) for v in values]
    names = ("batch_isend_irecv",) + COLLECTIVES
    results = expect.run(each_case, ring_all_gather, names, [case], world_size=world_size)
    for rank, [(got, calls)] in enumerate(results):
        forbid(calls, COLLECTIVES, rank, "the exercise builds all_gather from "
               "batch_isend_irecv around the ring, without a collective")
        steps = len(calls["batch_isend_irecv"])
        if steps < world_size - 1:
            raise AssertionError(
                f"rank {rank} called dist.batch_isend_irecv {how_often(steps)}; a ring of "
                f"{world_size} ranks needs world_size - 1 = {world_size - 1} steps, each "
                "passing one value to the right"
            )
        if steps > world_size - 1:
            raise AssertionError(
                f"rank {rank} called dist.batch_isend_irecv {how_often(steps)}; a ring of "
                f"{world_size} ranks needs world_size - 1 = {world_size - 1} steps: after "
                f"them every rank holds every value, and step {world_size} only sends each "
                "rank its own value back (one send per rank, for nothing)"
            )
        if isinstance(got, torch.Tensor):
            raise AssertionError(
                f"rank {rank} returned a tensor ({expect.describe(got)}); the exercise asks "
                f"for a list of {world_size} one-element tensors, one per rank"
            )
        expect.same(got, values, f"rank {rank}'s list")


# -- exercise 3 -------------------------------------------------------------------------------

P2P = ("send", "recv", "isend", "irecv")


def _reference(world_size: int) -> list[float]:
    """What the last rank returns, computed in one process."""
    import torch

    x = torch.arange(3.0)
    for r in range(1, world_size):
        x = x * (r + 1)
    return x.tolist()


def exercise_3(pipeline, my_prediction) -> None:
    """``my_prediction()`` is what the last of 4 ranks returns; ``pipeline()`` on 4 ranks:
    rank 0 starts from ``arange(3.0)``, rank r receives from r - 1, multiplies by r + 1 and
    sends to r + 1; the last rank returns a list of floats, the others None. The messages each
    rank sends and receives are counted, so a product computed without them does not pass."""
    prediction = my_prediction()  # first: the real run cannot tell the answer
    world_size = 4
    results = expect.run(spied, pipeline, P2P, world_size=world_size)
    last = world_size - 1
    for rank, (value, calls) in enumerate(results):
        sent = len(calls["send"]) + len(calls["isend"])
        received = len(calls["recv"]) + len(calls["irecv"])
        if (received, sent) != (0 if rank == 0 else 1, 0 if rank == last else 1):
            if rank == 0:
                should = "send x to rank 1 (and receive nothing)"
            elif rank == last:
                should = f"receive x from rank {rank - 1} (and send nothing)"
            else:
                should = f"receive x from rank {rank - 1} and send it to rank {rank + 1}"
            raise AssertionError(
                f"rank {rank} received {received} and sent {sent} messages; it should "
                f"{should}: x travels down the pipeline, from rank to rank"
            )
        if rank != last and value is not None:
            raise AssertionError(
                f"rank {rank} returned {expect.describe(value)}; only the last rank returns "
                "the result, the others return None"
            )
    expect.same(results[last][0], _reference(world_size), "the last rank's answer")
    truth = _reference(4)
    if isinstance(prediction, list) and len(prediction) == len(truth) and all(
        isinstance(p, int) and not isinstance(p, bool) for p in prediction
    ) and [float(p) for p in prediction] == truth:
        return  # the right numbers, written as ints: a prediction, not a type exercise
    expect.same(prediction, truth, "your prediction (the list the last of 4 ranks returns)")
