"""Graders for notebook 00, launching from a notebook (see `distlab.exercises`)."""

from __future__ import annotations

from . import expect


def exercise_1(gather_ranks) -> None:
    """On 4 ranks, ``gather_ranks()`` all-gathers every rank's rank: each returns [0, 1, 2, 3]
    as a list of ints, through a real all_gather (a list it builds itself does not count)."""
    values, calls = expect.collectives(gather_ranks, world_size=4)
    for rank, value in enumerate(values):
        expect.same(value, [0, 1, 2, 3], f"rank {rank}'s list")
    expect.called(calls, ("allgather",), "all_gather (each rank only knows its own rank)")


def _divide_then_barrier():
    import torch.distributed as dist

    if dist.get_rank() == 2:
        print(1 / 0)
    dist.barrier()


def exercise_2(my_prediction) -> None:
    """``my_prediction()`` -> ``(primary_rank, primary_type, stopped)`` for the launch of
    ``divide_then_barrier`` on 3 ranks; the truth comes from running it."""
    from ..errors import RankError
    from ..launcher import launch

    prediction = my_prediction()  # first, so that the real run cannot tell the answer
    if not isinstance(prediction, tuple) or len(prediction) != 3:
        raise AssertionError(
            "my_prediction() should return a tuple of 3: (primary_rank, primary_type, stopped), "
            f"e.g. (0, 'ValueError', [1, 2]); got {expect.describe(prediction)}"
        )
    try:
        launch(_divide_then_barrier, world_size=3, timeout=expect.HANG)
    except RankError as e:
        truth = (e.primary.rank, e.primary.type, e.stopped)
    else:  # pragma: no cover -- the function always raises on rank 2
        raise AssertionError("the launch did not fail: this should not happen")
    rank, kind, stopped = prediction
    if isinstance(kind, type):
        raise AssertionError(
            f"primary_type should be the exception's name as a string, like "
            f"{kind.__name__!r}; got the class {kind!r}"
        )
    for what, guess, real in zip(("primary_rank", "primary_type", "stopped"), prediction, truth,
                                 strict=True):
        expect.same(guess, real, what)


def exercise_3(sum_pushed_values, cluster) -> None:
    """``sum_pushed_values()`` pushes [10.] to rank 0 and [32.] to rank 1 of the live 2-rank
    ``cluster``, all-reduces them there and returns ``cluster.pull("v")``: both hold [42.], a
    float32 tensor.
    A collective on one rank only is called a hang after `expect.HANG` seconds."""
    import torch

    keep = cluster.timeout
    cluster.timeout = min(keep, expect.HANG)  # the learner's own calls use the default
    try:
        pulled = sum_pushed_values()
    finally:
        cluster.timeout = keep
    if not isinstance(pulled, list) or len(pulled) != 2:
        raise AssertionError(
            'sum_pushed_values() should return cluster.pull("v"): a list with one tensor per '
            f"rank; got {expect.describe(pulled)}"
        )
    for rank, v in enumerate(pulled):
        if not isinstance(v, torch.Tensor) or v.dtype != torch.float32:
            kind = (expect._a(str(v.dtype).removeprefix("torch.")) + " tensor"
                    if isinstance(v, torch.Tensor) else expect.describe(v))
            raise AssertionError(
                f"v on rank {rank} should be a float32 tensor like tensor([42.]); it is {kind}: "
                "push the tensors [10.] and [32.], floats (torch.tensor([10.0]); "
                "torch.tensor([10]) holds int64)"
            )
        expect.close(v, torch.tensor([42.0]), f"v on rank {rank}")
