"""Graders for notebook 12, RPC basics (see `distlab.exercises`).

RPC sends a function by its *name*, so a grader cannot hand the learner's function to
``rpc_sync`` directly: a function defined in a test's namespace has no name another process can
import. Each grader therefore ships the answer to every rank with the launch (cloudpickle, by
value), keeps it in `_ANSWER` there, and sends RPCs to this module's functions, which call it.
"""

from __future__ import annotations

import time

from . import expect

#: Seconds the RPC graders give an answer: starting RPC on 3 ranks of a busy laptop takes a few.
RPC_TIMEOUT = 30.0
#: How long one worker's ``square`` waits to see the other's running too (exercise 1): calls
#: made one after the other never overlap, whatever the load; calls made together meet in
#: milliseconds.
MEET_WITHIN = 2.0

_ANSWER: list = [None]  # on each rank: the learner's function, shipped with the launch
_CALLS: list = []  # on each rank: the calls of `square` it served
_RUNNING = [0]  # on each rank: how many calls of `square` are running now


def _start_rpc() -> int:
    import os
    import warnings

    from torch.distributed import rpc

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # torch's own start-up handshake warns about itself (pytorch/pytorch#149393)
    warnings.filterwarnings("ignore", "You are using a Backend .* as a ProcessGroup")
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world_size)
    return rank


def _run(fn, *args, **kwargs) -> list:
    """`expect.run`, except that an error RPC carried from one rank to another (its message
    spans lines: "On WorkerInfo(...):", the remote traceback...) is reported like `check`
    reports any rank's error, the report first, then one line."""
    import sys

    from ..errors import RankError

    try:
        return expect.run(fn, *args, timeout=RPC_TIMEOUT, **kwargs)
    except RankError as e:
        lines = e.primary.headline().splitlines()
        if len(lines) == 1 or e.primary.type == "NotImplementedError":
            raise
        print(str(e), file=sys.stderr)
        remote = next((x for x in lines[1:] if x.strip() and not x.startswith(" ")), "")
        raise AssertionError(
            f"your code failed on the ranks ({lines[0].rstrip(':')} {remote}; the report is "
            "above)"
        ) from None



# -- exercise 1: fan out ----------------------------------------------------------------------


def square(x):
    """The ``square`` the grader hands to ``fan_out``: it runs on the callee, notes which worker
    it ran on, and waits (up to `MEET_WITHIN` seconds) to see the other worker's call running
    at the same time: two calls in flight at once meet at once, two calls made one after the
    other never do."""
    from torch.distributed import rpc

    me = rpc.get_worker_info().id
    call = {"worker": me, "x": x, "met": False}
    _CALLS.append(call)
    _RUNNING[0] += 1
    try:
        other = {1: "worker2", 2: "worker1"}.get(me)
        deadline = time.monotonic() + MEET_WITHIN
        while other is not None and time.monotonic() < deadline:
            if rpc.rpc_sync(other, _is_running):
                call["met"] = True
                break
            time.sleep(0.005)
        return x * x
    finally:
        _RUNNING[0] -= 1


def _is_running() -> bool:
    return _RUNNING[0] > 0


def _calls() -> list:
    return list(_CALLS)


def _fan_out_on_worker0(answer):
    from torch.distributed import rpc

    rank = _start_rpc()
    try:
        if rank == 0:
            total = answer(square)
            return total, {w: rpc.rpc_sync(f"worker{w}", _calls) for w in (1, 2)}
    finally:
        rpc.shutdown()


def exercise_1(fan_out) -> None:
    """``fan_out(square)`` runs on worker0 of 3 RPC workers: ``square(3)`` on worker1 and
    ``square(4)`` on worker2, both in flight at once, and returns the sum, 25. The grader's
    ``square`` notes where it ran and whether the other call was running at the same time."""
    import torch

    expect.not_written(fan_out, square)
    total, calls = _run(_fan_out_on_worker0, fan_out, world_size=3, backend=None)[0]
    for worker, x in ((1, 3.0), (2, 4.0)):
        if not calls[worker]:
            raise AssertionError(
                f"worker{worker} never ran square: call it there with rpc.rpc_async("
                f'"worker{worker}", square, args=(torch.tensor({x}),))'
            )
    for worker, x in ((1, 3.0), (2, 4.0)):
        served = [c["x"] for c in calls[worker]]
        got = [v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v for v in served]
        if got != [x]:
            raise AssertionError(
                f"worker{worker} should run square once, on {x} (a tensor); it ran it on {got}"
            )
        if not isinstance(served[0], torch.Tensor) or served[0].dtype != torch.float32:
            raise AssertionError(
                f"worker{worker} ran square on {expect.describe(served[0])}; give it the float "
                f"tensor torch.tensor({x}) (a float32 tensor, as every value in this course)"
            )
    if not any(c["met"] for w in (1, 2) for c in calls[w]):
        raise AssertionError(
            "the two calls ran one after the other: worker1's square had finished before "
            "worker2's began. Start both with rpc.rpc_async before you wait for either "
            "(torch.futures.wait_all(futures) waits for both)"
        )
    if not isinstance(total, torch.Tensor) or total.dtype != torch.float32:
        raise AssertionError(
            "fan_out should return the sum of the two results, the float32 tensor "
            f"tensor(25.); it returned {expect.describe(total)} (the results are tensors: add "
            "them as they are, without .item() or int())"
        )
    expect.close(total, torch.tensor(25.0), "fan_out's result (square(3) + square(4))")


# -- exercise 2: an optimizer step on the owner -----------------------------------------------


def _step_on_owner(module_rref, context_id, lr):
    """On the owner: the learner's ``sgd_step_on_owner``, with every warning it causes noted
    (any thread's: ``catch_warnings`` swaps the module-wide hooks)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _ANSWER[0](module_rref, context_id, lr)
    return [f"{w.category.__name__}: {w.message}" for w in caught
            if issubclass(w.category, (DeprecationWarning, FutureWarning))]


def _step_by_hand(answer, lr):
    import warnings

    import torch
    import torch.distributed.autograd as dist_autograd
    from torch import nn
    from torch.distributed import rpc
    from torch.distributed.nn import RemoteModule

    _ANSWER[0] = answer
    rank = _start_rpc()
    try:
        if rank == 1:
            torch.manual_seed(1)
            remote_layer = RemoteModule("worker0/cpu", nn.Linear, args=(10, 5, False))
            layer = nn.Linear(10, 5, bias=False)
            layer.weight = remote_layer.module_rref.to_here().weight  # a copy, same numbers
            inputs = torch.rand(10, 10)
            layer(inputs).square().sum().backward()  # the reference gradient, locally
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with dist_autograd.context() as context_id:
                    dist_autograd.backward(context_id, [remote_layer(inputs).square().sum()])
                    on_owner = rpc.rpc_sync(
                        "worker0", _step_on_owner, args=(remote_layer.module_rref, context_id, lr))
            here = [f"{w.category.__name__}: {w.message}" for w in caught
                    if issubclass(w.category, (DeprecationWarning, FutureWarning))]
            new_w = remote_layer.module_rref.to_here().weight.detach()
            before = layer.weight.detach()
            return new_w, before, layer.weight.grad, on_owner + here
    finally:
        rpc.shutdown()


def exercise_2(sgd_step_on_owner) -> None:
    """``sgd_step_on_owner(module_rref, context_id, lr)`` runs on the owner of a RemoteModule
    (worker0) after ``dist_autograd.backward`` on worker1: the weight must become
    ``w - lr * g`` (g from a local copy of the layer), with no DeprecationWarning on either
    worker (so no ``DistributedOptimizer``)."""
    import torch

    expect.not_written(sgd_step_on_owner, None, None, 0.1)
    lr = 0.1
    new_w, before, grad, warned = _run(_step_by_hand, sgd_step_on_owner, lr, world_size=2,
                                       backend=None)[1]
    if warned:
        raise AssertionError(
            f"your step caused a deprecation warning: {warned[0]} Step a plain "
            "torch.optim.SGD on the owner instead of DistributedOptimizer"
        )
    if torch.equal(new_w, before):
        raise AssertionError(
            "the remote weight did not change: the context's gradients "
            "(dist_autograd.get_gradients(context_id)) must reach .grad of the module's own "
            "parameters (module_rref.local_value()) before the optimizer steps"
        )
    want = before - lr * grad
    if torch.allclose(new_w, before + lr * grad):
        raise AssertionError("the weight moved up the gradient: w + lr * g instead of w - lr * g")
    if torch.allclose(new_w, before - grad):
        raise AssertionError(f"the step ignored lr: w - g instead of w - {lr} * g")
    expect.close(new_w, want, "the remote weight after your step")
