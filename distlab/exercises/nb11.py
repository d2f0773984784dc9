"""Graders for notebook 11, DDP and the parameters it waits for (see `distlab.exercises`).

Each grader trains on 2 new ranks for several iterations (a used set that changes with the
data shows only from the second one), with the data and the truth of its own; DDP's errors and
hangs come back as verdicts that name the parameter or the flag. A hang is called one after
`expect.HANG` seconds.
"""

from __future__ import annotations

from .. import _torch
from . import expect

WORLD = 2
#: Seconds for the grader's own runs of the real thing (exercise 3).
TRUTH_TIMEOUT = 30.0



def _first_line(e) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


# -- exercise 1: freeze it --------------------------------------------------------------------

ITERATIONS_1 = 3


def _frozen_on_rank(model_class):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(model_class())  # plain DDP, no flags
    x = torch.full((1, 2), rank + 1.0)  # different data on each rank
    grads = []
    for it in range(ITERATIONS_1):
        model.zero_grad()
        try:
            model(x).sum().backward()
        except RuntimeError as e:
            return grads, (it, _first_line(e)), None
        grads.append(model.module.used.weight.grad.clone())
    return grads, None, _torch.ddp_parameter_tensors(model)


def exercise_1(model_class) -> None:
    """``UsedAndFrozen`` (a ``UsedAndUnused`` whose ``unused`` layer is frozen) under plain DDP
    on 2 ranks, x = rank + 1, 3 iterations: no error, ``used.weight.grad`` averaged (1.5) every
    iteration, ``unused`` still in the model with no parameter that wants a gradient, and DDP
    managing only ``used``'s 2 parameter tensors."""
    import torch

    model = model_class()  # here first: a skeleton stops in this process
    unused = getattr(model, "unused", None)
    if not isinstance(unused, torch.nn.Module) or not list(unused.parameters()):
        raise AssertionError(
            "keep the unused layer in the model (self.unused, a Linear(2, 2)) and make its "
            f"parameters untrainable; it is {expect.describe(unused)}"
        )
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    if not set(frozen) <= {"unused.weight", "unused.bias"}:
        raise AssertionError(
            f"only unused should be frozen; these no longer train: {frozen}"
        )
    wanting = [n for n, p in model.named_parameters() if p.requires_grad]
    if any(n.startswith("unused.") for n in wanting):
        raise AssertionError(
            f"these parameters of unused still want a gradient: "
            f"{[n for n in wanting if n.startswith('unused.')]}. requires_grad_(False) on the "
            "whole layer freezes them all"
        )
    for rank, (grads, error, managed) in enumerate(
        expect.run(_frozen_on_rank, model_class, world_size=WORLD)
    ):
        if error is not None:
            it, message = error
            raise AssertionError(
                f"DDP raised on rank {rank} in iteration {it}: {message[:120]}"
            )
        for it, g in enumerate(grads):
            expect.close(g, torch.full((2, 2), 1.5), f"rank {rank}'s used.weight.grad in "
                         f"iteration {it} (the average of 1 and 2)", world_size=WORLD)
        if managed != 2:
            raise AssertionError(
                f"DDP manages {managed} parameter tensors; with unused frozen it manages only "
                "used.weight and used.bias (2)"
            )


# -- exercise 2: a data-dependent branch ------------------------------------------------------

#: The sign of each rank's data, per iteration: extra is used where the data is positive, so
#: the used set changes between iterations and ranks (and in iteration 3 nobody uses extra).
SIGNS = [(1, -1), (-1, 1), (1, 1), (-1, -1), (1, -1)]


def _data(rank, it):
    import torch

    return (torch.arange(6.0).reshape(3, 2) * 0.1 + 1) * SIGNS[it][rank]


class _WithSpare:
    """The learner's model inside one with a parameter no rank ever uses, so that with
    find_unused_parameters=True every rank finds something unused in every iteration: DDP then
    never prints its "did not find any unused parameters" warning (a C++ warning that nothing on
    the Python side can catch), and the solution's verdict stays alone."""

    @staticmethod
    def build(model_class):
        from torch import nn

        class WithSpare(nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = model_class()
                self.spare = nn.Linear(1, 1)  # never used

            def forward(self, x):
                return self.inner(x)

        return WithSpare()


def _branchy_on_rank(model_class, ddp_kwargs):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(_WithSpare.build(model_class), **ddp_kwargs)
    grads = []
    for it in range(len(SIGNS)):
        model.zero_grad(set_to_none=True)
        try:
            model(_data(rank, it)).sum().backward()
        except RuntimeError as e:
            return grads, (it, _first_line(e))
        g = model.module.inner.extra.weight.grad
        grads.append(None if g is None else g.clone())
    return grads, None


def _truth_2(model_class):
    """Per iteration: extra.weight's gradient averaged over the ranks, a rank that did not use
    extra counting as zeros (None when no rank used it), and each rank's own gradient. One
    process, every rank's data."""
    import torch

    out = []
    for it in range(len(SIGNS)):
        local = []
        for rank in range(WORLD):
            torch.manual_seed(0)
            net = model_class()
            g = torch.autograd.grad(net(_data(rank, it)).sum(), net.extra.weight,
                                    allow_unused=True)[0]
            local.append(g)
        used = [g for g in local if g is not None]
        out.append((sum(used) / WORLD if used else None, local))
    return out


def exercise_2(model_class, ddp_kwargs) -> None:
    """``Branchy`` adds ``extra(x)`` only when ``x.sum() > 0``; ``ddp_kwargs`` is the DDP flag it
    needs. 5 iterations on 2 ranks, the data's sign changing per rank and iteration: every
    iteration's extra.weight.grad equals the average over the ranks (zeros from a rank that did
    not use extra; None when no rank did)."""
    import torch

    from ..errors import RankTimeout

    torch.manual_seed(0)
    net = model_class()
    net(torch.ones(1, 2))  # here first: a skeleton stops in this process
    for sign, used in ((1.0, True), (-1.0, False)):
        x = torch.ones(3, 2) * sign
        g = torch.autograd.grad(net(x).sum(), net.extra.weight, allow_unused=True)[0]
        if (g is not None) != used:
            raise AssertionError(
                f"Branchy should {'use' if used else 'skip'} extra when x.sum() "
                f"{'> 0' if used else '<= 0'}; with x = {sign:+g} everywhere it "
                f"{'does not' if used else 'does'}"
            )
    if not isinstance(ddp_kwargs, dict):
        raise AssertionError(
            "BRANCHY_DDP_KWARGS should be a dict of DDP's keyword arguments, e.g. "
            f"{{'name': True}}; got {expect.describe(ddp_kwargs)}"
        )
    try:
        results = expect.run(_branchy_on_rank, model_class, ddp_kwargs, world_size=WORLD)
    except RankTimeout as e:
        raise AssertionError(
            f"your answer hangs: rank(s) {e.ranks} waited {e.timeout:g} s in the backward. The "
            "rank that used extra waits for extra's gradient from the rank that did not: DDP "
            "needs to be told that some parameters may get no gradient in an iteration"
        ) from None
    truth = _truth_2(model_class)
    for it, (want, local) in enumerate(truth):  # the first iteration that went wrong, any rank
        for rank, (grads, error) in enumerate(results):
            if error is not None and error[0] == it:
                before = f"the data's signs were {SIGNS[it - 1]}, now {SIGNS[it]}" if it else (
                    f"signs {SIGNS[it]}")
                raise AssertionError(
                    f"DDP raised on rank {rank} in iteration {it} ({before}): {error[1][:140]}"
                )
            g = grads[it]
            what = f"rank {rank}'s extra.weight.grad in iteration {it} (signs {SIGNS[it]})"
            if want is None or g is None:
                if (want is None) != (g is None):
                    should = "None (no rank used extra)" if want is None else want.tolist()
                    got = None if g is None else g.tolist()
                    raise AssertionError(f"{what} should be {should}; got {got}")
                continue
            if local[rank] is not None and torch.allclose(g, local[rank]) and not torch.allclose(
                g, want
            ):
                raise AssertionError(
                    f"{what} is rank {rank}'s own gradient, not the average over the ranks: DDP "
                    "never all-reduced it. The bucket of a parameter that some rank did not use "
                    "waits for its gradient; DDP must be told to look for unused parameters"
                )
            expect.close(g, want, what, world_size=WORLD)


# -- exercise 3: divide by whom? --------------------------------------------------------------


def _uneven_on_rank(divide_by_initial_world_size):
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Linear(2, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1 + rank)
    batches = [torch.randn(4, 2) for _ in range(3 + rank)]  # rank 0: 3 batches, rank 1: 4
    with model.join(divide_by_initial_world_size=divide_by_initial_world_size):
        for x in batches:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
    return [p.detach() for p in model.parameters()]


def exercise_3(my_prediction) -> None:
    """``my_prediction()`` -> ``[weight, bias]`` (tensors), predicted in the kernel for notebook
    11's ``uneven`` under ``model.join(divide_by_initial_world_size=False)``; the truth is the
    real run on 2 new ranks."""
    import torch

    predicted = my_prediction()
    # The grader's own runs (no learner code on the ranks: nothing can hang), given time enough
    # for a DDP join on a busy machine.
    truth = expect.run(_uneven_on_rank, False, world_size=WORLD, timeout=TRUTH_TIMEOUT)
    expect.ranks_agree([[p.tolist() for p in r] for r in truth], "the two ranks' parameters")
    if not isinstance(predicted, (list, tuple)) or len(predicted) != 2:
        raise AssertionError(
            "my_prediction() should return a list of 2 tensors, [weight, bias]; got "
            f"{expect.describe(predicted)}"
        )
    default = expect.run(_uneven_on_rank, True, world_size=WORLD, timeout=TRUTH_TIMEOUT)[0]
    if all(isinstance(p, torch.Tensor) and p.shape == d.shape and torch.allclose(p, d)
           for p, d in zip(predicted, default, strict=True)):
        raise AssertionError(
            "that is the default's result (divide_by_initial_world_size=True): in the fourth "
            "step only rank 1 has data, and with False its gradient is divided by the ranks "
            "that have not joined (1), not by 2"
        )
    for name, p, t in zip(("weight", "bias"), predicted, truth[0], strict=True):
        expect.close(p, t, f"your {name}", rtol=1e-4, atol=1e-6)
