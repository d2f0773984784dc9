"""Graders for notebook 05, all_gather, reduce_scatter and all_to_all (see `distlab.exercises`).

Each answer runs on 4 new ranks (so a hang or a crash never touches the notebook's cluster), on
data the check draws: several lengths, and values that cannot be guessed from the rank. Which
collectives a rank called is counted where it called them (`nb02.spied`).
"""

from __future__ import annotations

from . import expect
from .nb02 import COLLECTIVES, P2P, each_case, forbid

WORLD_SIZE = 4
REDUCE_SCATTER = ("reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor")
ALL_GATHER = ("all_gather", "all_gather_single", "all_gather_into_tensor")


def _pieces(lengths, seed: int) -> list:
    """One float32 tensor of integers per rank, of the given lengths."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(-9, 10, (n,), generator=gen).float() for n in lengths]


def _uses(calls: dict, names, rank: int, what: str) -> None:
    if not any(calls[n] for n in names):
        raise AssertionError(f"rank {rank} never called {what}")


def _list_of_tensors(got, rank: int, where: str) -> None:
    import torch

    if isinstance(got, torch.Tensor):
        raise AssertionError(
            f"{where}rank {rank} returned a tensor ({expect.describe(got)}); the exercise asks "
            f"for a list of {WORLD_SIZE} tensors, one per rank"
        )


# -- exercise 1 -------------------------------------------------------------------------------

#: The lengths exercise 1 tries: not a multiple of 4, a multiple, shorter than the world.
LENGTHS_1 = (7, 8, 1)


def exercise_1(all_reduce_any) -> None:
    """``all_reduce_any(t)`` on 4 ranks for tensors of 7, 8 and 1 elements (random, different
    on every rank): every rank returns what ``dist.all_reduce`` (SUM) gives, same shape and
    dtype, through reduce_scatter and all_gather and no all_reduce."""
    datas = [_pieces([n] * WORLD_SIZE, seed=n) for n in LENGTHS_1]
    cases = [[(t.clone(),) for t in data] for data in datas]
    names = COLLECTIVES + P2P
    results = expect.run(each_case, all_reduce_any, names, cases, world_size=WORLD_SIZE)
    for rank, per_case in enumerate(results):
        for data, (got, calls) in zip(datas, per_case, strict=True):
            where = f"for a tensor of {data[0].numel()} elements, "
            others = [n for n in names if n not in REDUCE_SCATTER + ALL_GATHER]
            forbid(calls, others, rank, "the exercise builds all_reduce from reduce_scatter "
                   "and all_gather")
            _uses(calls, REDUCE_SCATTER, rank, "reduce_scatter (all_reduce_via_rs_ag does)")
            _uses(calls, ALL_GATHER, rank, "all_gather (all_reduce_via_rs_ag does)")
            expect.same(got, sum(data), f"{where}rank {rank}'s result (what all_reduce gives)")


# -- exercise 2 -------------------------------------------------------------------------------

#: Piece lengths per rank, case by case: uneven (with an empty piece), uneven, all alike.
LENGTHS_2 = ([3, 0, 5, 1], [1, 4, 2, 3], [2, 2, 2, 2])


def exercise_2(all_gather_uneven) -> None:
    """``all_gather_uneven(t)`` on 4 ranks for the piece lengths in `LENGTHS_2` (random
    values): every rank returns the list of every rank's piece, in rank order, each with its
    own length."""
    datas = [_pieces(lengths, seed=i) for i, lengths in enumerate(LENGTHS_2)]
    cases = [[(t.clone(),) for t in data] for data in datas]
    results = expect.run(each_case, all_gather_uneven, (), cases, world_size=WORLD_SIZE)
    for rank, per_case in enumerate(results):
        for lengths, data, (got, _) in zip(LENGTHS_2, datas, per_case, strict=True):
            where = f"with pieces of lengths {lengths}, "
            _list_of_tensors(got, rank, where)
            if isinstance(got, list) and len(got) == len(data):
                for r, (g, want) in enumerate(zip(got, data, strict=True)):
                    if hasattr(g, "numel") and g.numel() != want.numel():
                        raise AssertionError(
                            f"{where}rank {rank}'s piece {r} has {g.numel()} elements; rank "
                            f"{r}'s piece has {want.numel()} (trim the padding: every rank "
                            "learns every length first)"
                        )
            expect.same(got, data, f"{where}rank {rank}'s list")


# -- exercise 3 -------------------------------------------------------------------------------


def exercise_3(all_gather_via_a2a) -> None:
    """``all_gather_via_a2a(x)`` on 4 ranks, x random of 2 and then 3 elements: every rank
    returns what ``all_gather_single`` gives (the pieces end to end), with one
    ``all_to_all_single`` call and nothing else."""
    import torch

    datas = [_pieces([n] * WORLD_SIZE, seed=10 + n) for n in (2, 3)]
    cases = [[(t.clone(),) for t in data] for data in datas]
    names = COLLECTIVES + P2P
    results = expect.run(each_case, all_gather_via_a2a, names, cases, world_size=WORLD_SIZE)
    for rank, per_case in enumerate(results):
        for data, (got, calls) in zip(datas, per_case, strict=True):
            where = f"for pieces of {data[0].numel()} elements, "
            others = [n for n in names if n != "all_to_all_single"]
            forbid(calls, others, rank, "the exercise asks for all_to_all_single only")
            n = len(calls["all_to_all_single"])
            if n != 1:
                raise AssertionError(
                    f"{where}rank {rank} called dist.all_to_all_single {n} times; the exercise "
                    "asks for one call"
                )
            expect.same(got, torch.cat(data), f"{where}rank {rank}'s result (what "
                        "all_gather_single gives)")
