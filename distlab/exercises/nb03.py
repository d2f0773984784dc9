"""Graders for notebook 03, broadcast, scatter and gather (see `distlab.exercises`).

The messages and bytes a rank sends are counted where it sends them (`nb02.spied`), never taken
from what the answer says it sent.
"""

from __future__ import annotations

import functools
import math

from . import expect
from .nb02 import COLLECTIVES, P2P, each_case, forbid, how_often, spied


def _random_rows(world_size: int, shape, dtype, seed: int) -> list:
    """One random tensor per rank (integers in a float or int dtype: exact to compare)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(-99, 100, shape, generator=gen).to(dtype) for _ in range(world_size)]


def _not_a_list(got, rank: int, n: int) -> None:
    import torch

    if isinstance(got, torch.Tensor):
        raise AssertionError(
            f"rank {rank} returned a tensor ({expect.describe(got)}); the exercise asks for a "
            f"list of {n} tensors, one per rank (list(stacked.unbind(0)) turns a stacked "
            "tensor into one)"
        )


def _same_values(got, want, what: str) -> None:
    """Tensors equal; for a long one, the message names the first element that differs."""
    import torch

    if not isinstance(got, torch.Tensor) or got.shape != want.shape or want.numel() <= 16:
        expect.same(got, want, what)
        return
    if not torch.equal(got, want):
        i = int((got != want).flatten().nonzero()[0])
        raise AssertionError(
            f"{what} differs from the expected at element {i}: {got.flatten()[i].item()} "
            f"instead of {want.flatten()[i].item()} (expected {expect.describe(want)})"
        )


# -- exercise 1 -------------------------------------------------------------------------------


def _and_the_tensor(fn, tensor):
    """On a rank: what ``fn(tensor)`` returns, and the tensor after it."""
    return fn(tensor), tensor


def exercise_1(tree_broadcast) -> None:
    """``tree_broadcast(tensor)`` on 4 ranks, then on 3, each rank's tensor random: every rank
    ends with rank 0's tensor; in round k every rank r < 2**k sends to r + 2**k (if it exists),
    so rank 0 sends ceil(log2 p) messages, every other rank receives exactly one, and each
    rank's return value is the number of messages it really sent."""
    import torch

    for world_size in (4, 3):
        data = _random_rows(world_size, (2,), torch.float32, seed=world_size)
        case = [(t.clone(),) for t in data]
        names = P2P + COLLECTIVES
        tree = functools.partial(_and_the_tensor, tree_broadcast)
        results = expect.run(each_case, tree, names, [case], world_size=world_size)
        rounds = math.ceil(math.log2(world_size))
        for rank, [((_, tensor), calls)] in enumerate(results):
            forbid(calls, COLLECTIVES, rank, "the exercise builds broadcast from send and recv")
            expect.same(tensor, data[0], f"on {world_size} ranks, rank {rank}'s tensor after "
                        "the broadcast (rank 0's tensor)")
        for rank, [((said, _), calls)] in enumerate(results):
            sent = len(calls["send"]) + len(calls["isend"])
            received = len(calls["recv"]) + len(calls["irecv"])
            want_sent = sum(
                1 for k in range(rounds) if rank < 2**k and rank + 2**k < world_size
            )
            want_received = 0 if rank == 0 else 1
            if (sent, received) != (want_sent, want_received):
                raise AssertionError(
                    f"on {world_size} ranks, rank {rank} sent {sent} and received {received} "
                    f"messages; along the tree it sends {want_sent} and receives "
                    f"{want_received} (rank 0 sends one per round: ceil(log2 {world_size}) = "
                    f"{rounds}; each other rank receives the data once)"
                )
            expect.same(said, sent, f"on {world_size} ranks, rank {rank}'s return value (the "
                        f"number of messages it sent: it sent {how_often(sent)})")


# -- exercise 2 -------------------------------------------------------------------------------


def exercise_2(all_gather_by_hand) -> None:
    """``all_gather_by_hand(tensor)`` on 3 ranks, once with random int64 tensors of shape (2,)
    and once with float32 tensors of shape (2, 3): every rank returns the list of every rank's
    tensor (dtype and shape kept), from one gather and one broadcast."""
    import torch

    world_size = 3
    datas = [
        _random_rows(world_size, (2,), torch.int64, seed=1),
        _random_rows(world_size, (2, 3), torch.float32, seed=2),
    ]
    cases = [[(t.clone(),) for t in data] for data in datas]
    names = ("gather", "broadcast") + tuple(n for n in COLLECTIVES + P2P if n not in (
        "gather", "broadcast"))
    results = expect.run(each_case, all_gather_by_hand, names, cases, world_size=world_size)
    for rank, per_case in enumerate(results):
        for data, (got, calls) in zip(datas, per_case, strict=True):
            others = [n for n in names if n not in ("gather", "broadcast")]
            forbid(calls, others, rank, "the exercise asks for one dist.gather and one "
                   "dist.broadcast, nothing else")
            counts = (len(calls["gather"]), len(calls["broadcast"]))
            if counts != (1, 1):
                raise AssertionError(
                    f"rank {rank} called dist.gather {counts[0]} and dist.broadcast "
                    f"{counts[1]} times; the exercise asks for one of each"
                )
            _not_a_list(got, rank, world_size)
            kind = f"{data[0].dtype} tensors of shape {tuple(data[0].shape)}"
            expect.same(got, data, f"rank {rank}'s list, for {kind}")


# -- exercise 3 -------------------------------------------------------------------------------


def _scatter_both(fn, piece_sizes):
    """On a rank: `spied` ``fn(output, scatter_list, 0)`` for each piece size; per size, what
    ``output`` holds, what fn returned, and the calls."""
    import torch
    import torch.distributed as dist

    rank, world_size = dist.get_rank(), dist.get_world_size()
    out = []
    for size in piece_sizes:
        gen = torch.Generator().manual_seed(size)
        pieces = [torch.randint(-99, 100, (size,), generator=gen).float()
                  for _ in range(world_size)]
        output = torch.full((size,), float("nan"))
        said, calls = spied(fn, ("broadcast", "scatter"), output, pieces if rank == 0 else None, 0)
        out.append((output, pieces[rank], said, calls))
    return out


def exercise_3(scatter_via_broadcast, my_prediction) -> None:
    """``my_prediction()`` -> (elements a non-root rank receives via broadcast, via scatter) for
    4 ranks and pieces of 1000; ``scatter_via_broadcast(output, scatter_list, src)`` on 4 ranks,
    with pieces of 1000 and of 5: ``output`` is what ``dist.scatter`` gives, through
    ``dist.broadcast`` only, and the return value is the number of elements its broadcast
    delivered, counted where it was called."""
    prediction = my_prediction()  # first: the real run cannot tell the answer
    sizes = (1000, 5)
    results = expect.run(_scatter_both, scatter_via_broadcast, sizes, world_size=4)
    delivered = None
    for rank, per_size in enumerate(results):
        for size, (output, piece, said, calls) in zip(sizes, per_size, strict=True):
            if calls["scatter"]:
                raise AssertionError(
                    f"rank {rank} called dist.scatter: the exercise builds scatter from "
                    "dist.broadcast"
                )
            if not calls["broadcast"]:
                raise AssertionError(f"rank {rank} never called dist.broadcast")
            _same_values(output, piece, f"with pieces of {size}, rank {rank}'s output (what "
                         "dist.scatter gives it)")
            really = sum(calls["broadcast"])
            expect.same(said, really, f"with pieces of {size}, rank {rank}'s return value (its "
                        f"broadcast of {really} elements)")
            if rank == 1 and size == 1000:
                delivered = really
    truth = (delivered, 1000)
    if isinstance(prediction, tuple) and len(prediction) == 2 and prediction == tuple(
        4 * n for n in truth
    ):
        raise AssertionError(
            f"your prediction {prediction} counts bytes (4 per float32); the exercise asks for "
            f"elements: {truth}"
        )
    expect.same(prediction, truth, "your prediction (elements via broadcast, via scatter)")
