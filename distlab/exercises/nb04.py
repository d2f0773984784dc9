"""Graders for notebook 04, reduce and all_reduce (see `distlab.exercises`).

Which collectives a rank called is counted where it called them (`nb02.spied`).
"""

from __future__ import annotations

from . import expect
from .nb02 import COLLECTIVES, P2P, each_case, forbid, spied

#: Everything but all_reduce: what "using only all_reduce" rules out.
NOT_ALL_REDUCE = tuple(n for n in COLLECTIVES + P2P if n != "all_reduce")


def _only_all_reduce(calls: dict, rank: int, where: str) -> None:
    forbid(calls, NOT_ALL_REDUCE, rank, "the exercise asks for all_reduce only")
    if not calls["all_reduce"]:
        raise AssertionError(
            f"{where}rank {rank} never called dist.all_reduce: it cannot know the other ranks' "
            "values without it"
        )


# -- exercise 1 -------------------------------------------------------------------------------

#: The ranks that are done, case by case: some, one (not rank 0), all, none.
DONE = ({0, 2}, {3}, {0, 1, 2, 3}, set())


def exercise_1(agree) -> None:
    """``agree(done)`` on 4 ranks, for the cases in `DONE`: every rank returns
    ``(everyone_done, anyone_done)`` as Python bools, through all_reduce."""
    world_size = 4
    cases = [[(r in done,) for r in range(world_size)] for done in DONE]
    names = ("all_reduce",) + NOT_ALL_REDUCE
    results = expect.run(each_case, agree, names, cases, world_size=world_size)
    for rank, per_case in enumerate(results):
        for done, (got, calls) in zip(DONE, per_case, strict=True):
            where = f"with ranks {sorted(done)} done, " if done else "with no rank done, "
            _only_all_reduce(calls, rank, where)
            flags = [r in done for r in range(world_size)]
            want = (all(flags), any(flags))
            expect.same(got, want, f"{where}rank {rank}'s (everyone, anyone)")


# -- exercise 2 -------------------------------------------------------------------------------

#: Scores per rank, case by case (exact in float32): a tie for the best between ranks 1 and 3,
#: a tie between ranks 0 and 2, one best on the last rank, all equal.
SCORES = (
    [0.25, 0.75, 0.5, 0.75],
    [0.5, 0.125, 0.5, 0.25],
    [0.125, 0.25, 0.375, 0.5],
    [0.625] * 4,
)


def exercise_2(best_score) -> None:
    """``best_score(score)`` on 4 ranks, ``score`` this rank's one-element float32 tensor, for
    the cases in `SCORES` (ties among them): every rank returns ``(best score as a float, the
    lowest rank holding it as an int)``, through all_reduce only."""
    import torch

    world_size = 4
    cases = [[(torch.tensor([s]),) for s in scores] for scores in SCORES]
    names = ("all_reduce",) + NOT_ALL_REDUCE
    results = expect.run(each_case, best_score, names, cases, world_size=world_size)
    for rank, per_case in enumerate(results):
        for scores, (got, calls) in zip(SCORES, per_case, strict=True):
            where = f"with scores {scores}, "
            _only_all_reduce(calls, rank, where)
            best = max(scores)
            want = (best, scores.index(best))
            try:
                expect.same(got, want, f"{where}rank {rank}'s (score, rank)")
            except AssertionError as e:
                holders = [r for r, s in enumerate(scores) if s == best]
                if len(holders) > 1:
                    raise AssertionError(
                        f"{e} (a tie: ranks {holders} hold the best score; the lowest of them "
                        "is the answer)"
                    ) from None
                raise


# -- exercise 3 -------------------------------------------------------------------------------


def exercise_3(shared_all_reduce) -> None:
    """``shared_all_reduce(paths)`` on 2 ranks: rank r maps ``paths[r]`` (2x2 float32, random
    values written by the check) and all-reduces it in place with SUM; the check then reads the
    notebook's own mappings of the files."""
    import os
    import tempfile

    import torch

    world_size = 2
    gen = torch.Generator().manual_seed(4)
    start = [torch.randint(-9, 10, (2, 2), generator=gen).float() for _ in range(world_size)]
    want = sum(start)
    with tempfile.TemporaryDirectory(prefix="distlab-") as shared_dir:
        paths = [os.path.join(shared_dir, f"rank{r}.bin") for r in range(world_size)]
        shared = [
            torch.from_file(p, shared=True, size=4, dtype=torch.float32).view(2, 2) for p in paths
        ]
        for t, values in zip(shared, start, strict=True):
            t.copy_(values)
        results = expect.run(spied, shared_all_reduce, ("all_reduce",), paths,
                             world_size=world_size)
        seen = [t.clone() for t in shared]  # the notebook's tensors, never sent back
    for rank, (_, calls) in enumerate(results):
        if not calls["all_reduce"]:
            raise AssertionError(f"rank {rank} never called dist.all_reduce")
    for r, t in enumerate(seen):
        if torch.equal(t, start[r]):
            raise AssertionError(
                f"the notebook's tensor of rank {r}'s file still holds what it held before "
                f"({t.tolist()}): the all_reduce wrote into other memory (a copy, or another "
                "file). Map the file with shared=True and all-reduce that tensor itself"
            )
        expect.close(t, want, f"the notebook's tensor of rank {r}'s file", world_size=world_size)
