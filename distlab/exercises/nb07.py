"""Graders for notebook 07, groups, barriers and Python objects (see `distlab.exercises`).

Both exercises run on 4 new ranks, so a wrong answer that leaves a group waiting (a collective
only some of its members call) is called a hang in seconds and never touches the notebook's
cluster.
"""

from __future__ import annotations

from . import expect

WORLD = 4



# -- exercise 1: a hierarchical all-reduce ----------------------------------------------------


def _input_1(rank):
    import torch

    g = torch.Generator().manual_seed(7 + rank)
    return torch.randint(-9, 10, (5,), generator=g).float()


def _hierarchical_on_rank(hierarchical_all_reduce):
    import warnings

    import torch.distributed as dist

    rank = dist.get_rank()
    my_pair, _ = dist.new_subgroups(group_size=2)  # [0, 1] and [2, 3]: the "machines"
    g02 = dist.new_group([0, 2])  # the leaders
    t = _input_1(rank)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a collective on a group this rank is not in warns
        got = hierarchical_all_reduce(t, my_pair, g02)
    return got, t


def exercise_1(hierarchical_all_reduce) -> None:
    """``hierarchical_all_reduce(t, my_pair, g02)`` on 4 ranks (pairs [0, 1] and [2, 3], leaders
    0 and 2): t holds the sum over all 4 ranks, in place, and is returned; the collectives each
    rank really called show the three steps (pair, leaders, pair again)."""
    import torch

    expect.not_written(hierarchical_all_reduce, torch.zeros(5), None, None)
    values, calls = expect.collectives(_hierarchical_on_rank, hierarchical_all_reduce,
                                       world_size=WORLD)
    truth = sum(_input_1(r) for r in range(WORLD))
    for rank, (got, t) in enumerate(values):
        expect.close(got, truth, f"what rank {rank} returned (the sum over all 4 ranks)",
                     world_size=WORLD)
        expect.close(t, truth, f"rank {rank}'s t after the call (reduced in place)")
    for rank, names in enumerate(calls):
        used = [n.removeprefix("c10d::").rstrip("_") for n in names]
        if "allreduce" in used and len(used) == 1:
            raise AssertionError(
                f"rank {rank} ran one all_reduce over everyone: use the groups, first "
                "inside the pair (my_pair), then between the leaders (g02), then back"
            )
        want = 3 if rank % 2 == 0 else 2
        if len(used) != want:
            role = "a leader" if rank % 2 == 0 else "not a leader"
            raise AssertionError(
                f"rank {rank} ({role}) should call {want} collectives (the pair's all_reduce, "
                + ("the leaders' all_reduce, " if want == 3 else "")
                + f"the pair's broadcast); it called {len(used)}: {used}"
            )


# -- exercise 2: hand out work ----------------------------------------------------------------

FILES = [f"data-{i}.txt" for i in range(10)]


def _hand_out_on_rank(hand_out):
    import torch.distributed as dist

    files = list(FILES) if dist.get_rank() == 0 else None  # only rank 0 has them
    return hand_out(files)


def exercise_2(hand_out) -> None:
    """``hand_out(files)`` on 4 ranks, ``files`` the ten names on rank 0 and None elsewhere:
    every rank returns ``(its files, counts)``: files r, r + 4, ... (round-robin), and on rank 0
    the characters per rank, ``None`` elsewhere. One verdict for all ranks."""
    expect.not_written(hand_out, list(FILES))
    values = expect.run(_hand_out_on_rank, hand_out, world_size=WORLD)
    for rank, value in enumerate(values):
        if not isinstance(value, tuple) or len(value) != 2:
            raise AssertionError(
                f"hand_out should return a tuple of 2, (my_files, counts); rank {rank} "
                f"returned {expect.describe(value)}"
            )
        mine, counts = value
        expect.same(mine, FILES[rank::WORLD], f"rank {rank}'s files (round-robin: files "
                    f"{rank}, {rank + WORLD}, ...)")
        if rank == 0:
            truth = [sum(len(f) for f in FILES[r::WORLD]) for r in range(WORLD)]
            expect.same(counts, truth, "the counts on rank 0 (characters of each rank's files, "
                        "in rank order)")
        elif counts is not None:
            raise AssertionError(
                f"only rank 0 should get the counts (gather_object, not all_gather_object); "
                f"rank {rank} got {expect.describe(counts)}"
            )
