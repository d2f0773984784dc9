"""Graders for notebook 09, autograd through collectives (see `distlab.exercises`).

Each grader runs the answer on new ranks and compares every rank's values and gradients with a
reference computed here, in one process, where "the ranks" are just tensors side by side and
autograd sees the whole computation: the gradient of the sum of every rank's loss.
"""

from __future__ import annotations

import numbers

from .. import _torch
from . import expect


def _seeded(rank, n=4, seed=0):
    import torch

    return torch.randn(n, generator=torch.Generator().manual_seed(seed + rank))


# -- exercise 1: your own all-reduce ----------------------------------------------------------

WORLD_1 = 3


def _my_all_reduce_on_rank(apply):
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    data, weight = _seeded(rank), _seeded(rank, seed=100)
    x = data.clone().requires_grad_()
    y = apply(x)
    (weight * y).sum().backward()
    return x.detach(), y.detach() if isinstance(y, torch.Tensor) else y, x.grad


def exercise_1(my_all_reduce_class) -> None:
    """``MyAllReduce`` (an ``autograd.Function``) on 3 ranks, with random inputs x_r and a
    weighted loss z_r = (w_r * y).sum(): y is the sum of the x's on every rank, x is left
    unchanged, and x.grad on every rank is dL/dx = sum of the w_r (L = the sum of the losses)."""
    import torch

    expect.not_written(my_all_reduce_class.apply, torch.ones(4, requires_grad=True))
    results = expect.run(_my_all_reduce_on_rank, my_all_reduce_class.apply, world_size=WORLD_1)
    y_truth = sum(_seeded(r) for r in range(WORLD_1))
    grad_truth = sum(_seeded(r, seed=100) for r in range(WORLD_1))  # every loss used every x
    for rank, (x, y, grad) in enumerate(results):
        expect.same(x, _seeded(rank), f"rank {rank}'s x after the forward (all-reduce a copy; "
                    "never change the caller's tensor)")
        expect.close(y, y_truth, f"rank {rank}'s forward result", world_size=WORLD_1)
        if grad is None:
            raise AssertionError(
                f"rank {rank}: no gradient reached x (does forward return a tensor that "
                "autograd connects to x, and does backward return the gradient?)"
            )
        local = _seeded(rank, seed=100)
        if torch.allclose(grad, local):
            raise AssertionError(
                f"rank {rank}'s x.grad is its own loss's gradient only ({grad.tolist()}): the "
                "other ranks' losses used this x too. The backward of an all-reduce sums the "
                "incoming gradients over the ranks: another all-reduce"
            )
        expect.close(grad, grad_truth, f"rank {rank}'s x.grad", world_size=WORLD_1)


# -- exercise 2: a correct MAX ----------------------------------------------------------------

#: Per rank; position 0: one maximum (rank 1); 1: a tie of ranks 0 and 2; 2: all three tie;
#: 3: ranks 0 and 1 tie.
INPUTS_2 = [[1.0, 5.0, 3.0, 7.0], [4.0, 2.0, 3.0, 7.0], [0.0, 5.0, 3.0, 1.0]]


def _max_on_rank(apply):
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    x = torch.tensor(INPUTS_2[rank], requires_grad=True)
    y = apply(x)
    ((rank + 1) * y.sum()).backward()  # a different loss on every rank
    return x.detach(), y.detach() if isinstance(y, torch.Tensor) else y, x.grad


def exercise_2(all_reduce_max_class) -> None:
    """``AllReduceMax`` on 3 ranks with ties (two and three ranks holding the maximum) and
    z_r = (r + 1) * sum(y): y and every rank's x.grad equal a one-process reference built with
    ``torch.stack(xs).amax(0)``, which splits the gradient evenly between tied ranks."""
    import torch

    expect.not_written(all_reduce_max_class.apply, torch.ones(4, requires_grad=True))
    world_size = len(INPUTS_2)
    results = expect.run(_max_on_rank, all_reduce_max_class.apply, world_size=world_size)
    xs = [torch.tensor(v, requires_grad=True) for v in INPUTS_2]  # one process, every rank
    ref = torch.stack(xs).amax(0)
    sum((r + 1) * ref.sum() for r in range(world_size)).backward()
    for rank, (x, y, grad) in enumerate(results):
        expect.same(x, torch.tensor(INPUTS_2[rank]), f"rank {rank}'s x after the forward")
        expect.close(y, ref.detach(), f"rank {rank}'s forward result (the maximum)")
        if grad is None:
            raise AssertionError(f"rank {rank}: no gradient reached x")
        want = xs[rank].grad
        if not torch.allclose(grad, want):
            holds = (torch.tensor(INPUTS_2[rank]) == ref.detach()).to(want.dtype)
            count = sum((torch.tensor(v) == ref.detach()).to(want.dtype) for v in INPUTS_2)
            upstream = sum(r + 1 for r in range(world_size))
            hints = [
                (upstream * holds, "a tied maximum got the whole gradient on every rank that "
                 "holds it: split it evenly between them (count them with an all_reduce)"),
                ((rank + 1) * holds / count, "only this rank's own upstream gradient: every "
                 "rank's loss used y, so sum the upstream gradients over the ranks first"),
                ((rank + 1) * holds, "only this rank's own upstream gradient, and not split "
                 "between tied ranks"),
            ]
            hint = next((f": {why}" for g, why in hints if torch.allclose(grad, g)), "")
            raise AssertionError(
                f"rank {rank}'s x.grad should be {want.tolist()} (the sum of every rank's "
                f"upstream gradient, 1 + 2 + 3 = {upstream}, shared by the ranks that hold the "
                f"maximum); got {grad.tolist()}{hint}"
            )


# -- exercise 3: only rank 0 has a loss -------------------------------------------------------


def _loss_on_rank_0(backward_with_loss_on_rank_0):
    import torch
    import torch.distributed as dist

    funcol = _torch.functional_collectives()
    x = (torch.ones(5, 5) + dist.get_rank()).requires_grad_()
    backward_with_loss_on_rank_0(funcol.all_reduce(x, "sum", dist.group.WORLD))
    return x.grad


def exercise_3(predicted_grads, backward_with_loss_on_rank_0) -> None:
    """``predicted_grads()``: [rank 0's, rank 1's] value of every entry of x.grad, numbers;
    ``backward_with_loss_on_rank_0(y)`` on 2 ranks, y = funcol.all_reduce(ones(5, 5) + rank): only
    rank 0 has the loss y.sin().sum(), both ranks run the backward. The truth: one process,
    L = z_0 only."""
    import torch

    from ..errors import RankTimeout

    prediction = predicted_grads()
    xs = [(torch.ones(5, 5) + r).requires_grad_() for r in range(2)]
    (xs[0] + xs[1]).sin().sum().backward()  # L = z_0: rank 0's loss, of everyone's x
    truth = [x.grad for x in xs]
    if not isinstance(prediction, (list, tuple)) or len(prediction) != 2:
        raise AssertionError(
            "predicted_grads() should return a list of 2 numbers: the value of every entry of "
            f"x.grad on rank 0, then on rank 1; got {expect.describe(prediction)}"
        )
    for rank, p in enumerate(prediction):
        if isinstance(p, bool) or not isinstance(p, numbers.Real):
            raise AssertionError(
                f"predicted_grads()[{rank}] should be a number (a float, or math.cos(...)); "
                f"got {expect.describe(p)}"
            )
        if abs(p - truth[rank][0, 0].item()) > 1e-4:
            raise AssertionError(
                f"you predicted {p:.4g} for rank {rank}; the true gradient of L = z_0 is "
                f"{truth[rank][0, 0].item():.4g} on every entry (rank {rank}'s x reached rank "
                "0's loss through the all-reduce)"
            )
    expect.not_written(backward_with_loss_on_rank_0, torch.ones(1, requires_grad=True))
    try:
        grads = expect.run(_loss_on_rank_0, backward_with_loss_on_rank_0, world_size=2)
    except RankTimeout as e:
        waiting = ", ".join(f"rank {r}" for r in e.ranks)
        raise AssertionError(
            f"your answer hangs: {waiting} still waited after {e.timeout:g} s. The backward of "
            "the all-reduce is an all-reduce, so every rank must run a backward, even one with "
            "no loss: y.backward(torch.zeros_like(y))"
        ) from None
    for rank, grad in enumerate(grads):
        if grad is None:
            raise AssertionError(f"rank {rank}: no gradient reached x")
        if torch.allclose(grad, 2 * truth[rank]):  # L = z_0 + z_1: every rank had a loss
            raise AssertionError(
                f"rank {rank}'s x.grad is {grad[0, 0].item():.4g} on every entry, twice the "
                f"true {truth[rank][0, 0].item():.4g}: rank 1 ran a loss of its own "
                "(y.sin().sum()), so the backward added both losses' gradients. Only rank 0 "
                "has a loss; rank 1 takes part in the backward with a zero gradient: "
                "y.backward(torch.zeros_like(y))"
            )
        expect.close(grad, truth[rank], f"rank {rank}'s x.grad", world_size=2)
