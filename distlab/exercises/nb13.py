"""Graders for notebook 13, the hybrid model (see `distlab.exercises`)."""

from __future__ import annotations

from . import expect
from .nb12 import _run, _start_rpc

_ANSWER: list = [None]  # on each rank: the learner's function, shipped with the launch


# -- exercise 1: the trainers that did not join ------------------------------------------------


def exercise_1(predict_second_microbatch, reported) -> None:
    """``predict_second_microbatch()`` -> ``(fc1_grad, fc2_grad)``: the DDP gradients trainers 2
    and 3 reported for their second micro-batch in the uneven run under ``join()``.
    ``reported`` is what the trainers sent back (the notebook's ``uneven``: per trainer,
    ``(ddp_grads, non_ddp_grads)``); the truth is theirs, not computed from the answer."""
    import torch

    truth = reported[2][0]
    if not all(torch.equal(a, b) for a, b in zip(truth, reported[3][0], strict=True)):
        raise AssertionError("trainers 2 and 3 reported different gradients: re-run the "
                             "uneven run above")  # pragma: no cover -- DDP makes them equal
    guess = predict_second_microbatch()
    if not isinstance(guess, (tuple, list)) or len(guess) != 2:
        raise AssertionError(
            "predict_second_microbatch() should return (fc1_grad, fc2_grad), a tuple of 2 "
            f"tensors; got {expect.describe(guess)}"
        )
    for name, got, want in zip(("fc1", "fc2"), guess, truth, strict=True):
        what = f"your {name} gradient"
        if not isinstance(got, torch.Tensor):
            raise AssertionError(f"{what} should be a tensor like {expect.describe(want)}; got "
                                 f"{expect.describe(got)}")
        if got.shape != want.shape:
            other = "fc2" if name == "fc1" else "fc1"
            swapped = got.shape == truth[1 if name == "fc1" else 0].shape
            raise AssertionError(
                f"{what} should have shape {tuple(want.shape)}; got {tuple(got.shape)}"
                + (f" (that is {other}'s shape: the tuple is (fc1_grad, fc2_grad))" if swapped
                   else "")
            )
        if torch.equal(got, want):
            continue
        hint = ""
        for factor, shown, why in (
            (2.0, "2", "divided by the 2 trainers still running; DDP divides by the initial "
                       "world size, 4, even under join() (divide_by_initial_world_size=True)"),
            (4.0, "4", "summed over the trainers but not divided by DDP's world size, 4"),
            (0.5, "1/2", "divided by 8: DDP divides the sum of the live gradients by 4 once"),
        ):
            if torch.allclose(got.double(), want.double() * factor):
                hint = f": exactly {shown}x what they reported ({why})"
        raise AssertionError(
            f"{what} should be {want.tolist()}, what trainers 2 and 3 reported; got "
            f"{got.tolist()}{hint}"
        )


# -- exercise 2: the remote layers' gradients --------------------------------------------------

#: Each trainer's batch: (sparse features, values), different for the two trainers.
_BATCHES = {1: ([0, 1, 1], [1.0, -2.0, 0.5]), 2: ([1, 0, 0], [-1.0, 0.5, 2.0])}


def _remote_em():
    """The notebook's RemoteEM: an EmbeddingBag(2, 3) of 0.5s under ``.em``, one bag per row."""
    import torch
    from torch import nn

    class RemoteEM(nn.Module):
        def __init__(self):
            super().__init__()
            self.em = nn.EmbeddingBag(2, 3, _weight=torch.full((2, 3), 0.5))

        def forward(self, sparse):
            return self.em(sparse, offsets=torch.arange(sparse.shape[0]))

    return RemoteEM()


def _remote_net():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 2), nn.Tanh())


def _local_forward(rref, x):
    return rref.local_value()(x)


def _loss(em, net, r, forward=lambda module, x: module(x)):
    import torch

    sparse, values = _BATCHES[r]
    out = forward(net, forward(em, torch.tensor(sparse)))
    return (out.sum(1) * torch.tensor(values)).sum()


def _answer_on_owner(em_rref, context_id):
    return _ANSWER[0](em_rref, context_id)


def _train_one(em_rref, net_rref, r):
    """On trainer r: one batch in its own context, then the owner's answer for that context."""
    import torch.distributed.autograd as dist_autograd
    from torch.distributed import rpc

    def remote(rref, x):
        return rpc.rpc_sync(rref.owner(), _local_forward, args=(rref, x))

    with dist_autograd.context() as context_id:
        loss = _loss(em_rref, net_rref, r, forward=remote)
        dist_autograd.backward(context_id, [loss])
        return rpc.rpc_sync(em_rref.owner(), _answer_on_owner, args=(em_rref, context_id))


def _two_contexts(answer):
    from torch.distributed import rpc

    _ANSWER[0] = answer
    rank = _start_rpc()
    try:
        if rank == 0:  # the owner: one table, shared by both trainers
            em, net = rpc.RRef(_remote_em()), rpc.RRef(_remote_net())
            futs = {r: rpc.rpc_async(f"worker{r}", _train_one, args=(em, net, r)) for r in (1, 2)}
            return {r: fut.wait() for r, fut in futs.items()}
    finally:
        rpc.shutdown()


def exercise_2(em_grad_on_owner) -> None:
    """``em_grad_on_owner(remote_em_rref, context_id)`` runs on the owner of a RemoteEM table
    (worker0) and returns its weight's gradient in that distributed autograd context. Two
    trainers (worker1, worker2) run a batch each, at the same time, in contexts of their own;
    each context's answer is checked against one process's autograd."""
    import torch

    expect.not_written(em_grad_on_owner, None, None)
    got = _run(_two_contexts, em_grad_on_owner, world_size=3, backend=None)[0]
    for r in (1, 2):
        em, net = _remote_em(), _remote_net()
        _loss(em, net, r).backward()
        want = em.em.weight.grad
        answer = got[r]
        what = f"the gradient in trainer {r}'s context"
        if answer is None:
            raise AssertionError(
                f"{what} came back as None: distributed autograd leaves .grad alone; read the "
                "context's gradients with dist_autograd.get_gradients(context_id)"
            )
        if isinstance(answer, dict):
            raise AssertionError(
                f"{what} came back as a dict of {len(answer)} (every gradient of the context, "
                "keyed by tensor): return only the EmbeddingBag weight's, "
                "grads[remote_em_rref.local_value().em.weight]"
            )
        if isinstance(answer, torch.Tensor) and answer.shape == want.shape and torch.equal(
            answer, em.em.weight.detach()
        ):
            raise AssertionError(f"{what} is the table's weight itself, not its gradient")
        expect.close(answer, want, what)
