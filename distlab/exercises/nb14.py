"""Graders for notebook 14, DeviceMesh, DTensor, FSDP and tensor parallel (see
`distlab.exercises`).

Each grader runs the learner's function on the notebook's live cluster (4 ranks that have
imported DTensor and FSDP already), on a model and a mesh the grader builds there itself: the
notebook's ``SimpleMLP`` (50 -> 32 -> 8) and a 1-D mesh over every rank.
"""

from __future__ import annotations

import numbers

from . import expect

#: Seconds a check may take on the cluster: FSDP's first forward on 4 busy ranks takes a few.
TIMEOUT = 30.0


def _simple_mlp():
    import torch
    from torch import nn

    class SimpleMLP(nn.Module):  # the notebook's
        def __init__(self):
            super().__init__()
            self.net1 = nn.Linear(50, 32)
            self.relu = nn.ReLU()
            self.net2 = nn.Linear(32, 8)

        def forward(self, x):
            return torch.sigmoid(self.net2(self.relu(self.net1(x))))

    torch.manual_seed(0)
    return SimpleMLP()


def _batch():
    import torch
    import torch.distributed as dist

    g = torch.Generator().manual_seed(100 + dist.get_rank())
    return torch.randn(128, 50, generator=g), torch.randn(128, 8, generator=g)


def _mesh():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (dist.get_world_size(),))


def _counts(cm) -> dict[str, int]:
    return {str(op): n for op, n in cm.get_comm_counts().items() if n}


def _comms(cm) -> str:
    """The notebook's ``comms``: "c10d_functional.all_reduce x1", or "-" for nothing."""
    return ", ".join(f"{op} x{n}" for op, n in sorted(_counts(cm).items())) or "-"


def _full(p):
    from torch.distributed.tensor import DTensor

    return p.full_tensor() if isinstance(p, DTensor) else p.detach()


def _placements(p) -> tuple | None:
    """A DTensor's placements as text, ("Replicate()",); None for a plain tensor."""
    from torch.distributed.tensor import DTensor

    return tuple(map(repr, p.placements)) if isinstance(p, DTensor) else None


def _what(p) -> str:
    """A parameter in a few words: "a DTensor (Shard(dim=0),) of shape (32, 50)"."""
    from torch.distributed.tensor import DTensor

    if isinstance(p, DTensor):
        return f"a DTensor {tuple(p.placements)} of shape {tuple(p.shape)}"
    return f"a {type(p).__name__} of shape {tuple(p.shape)}"


def _wrapped(answer, model, mesh):
    from torch import nn

    out = answer(model, mesh)
    if not isinstance(out, nn.Module):
        return None, expect.describe(out)
    return out, None


# -- exercise 1: keep the gathered parameters --------------------------------------------------


def _zero3(model, mesh):
    from torch.distributed.fsdp import fully_shard

    for m in (model.net1, model.net2, model):
        fully_shard(m, mesh=mesh)
    return model


def _forward_backward(make):
    from torch.distributed.tensor.debug import CommDebugMode

    model, returned = _wrapped(make, _simple_mlp(), _mesh())
    if model is None:
        return {"returned": returned}
    if _placements(model.net1.weight) != ("Shard(dim=0)",):
        return {"unsharded": _what(model.net1.weight)}
    inputs, labels = _batch()
    with CommDebugMode() as cm:
        out = model(inputs)
    fwd = _counts(cm)
    held = _what(model.net1.weight)  # between the forward and the backward
    with CommDebugMode() as cm:
        (out - labels).sum().backward()
    grads = [None if p.grad is None else _full(p.grad) for p in model.parameters()]
    return {"forward": fwd, "backward": _counts(cm), "held": held, "grads": grads}


def _gathers(counts: dict[str, int]) -> int:
    return sum(n for op, n in counts.items() if "allgather" in op or "all_gather" in op)


def _scatters(counts: dict[str, int]) -> int:
    return sum(n for op, n in counts.items() if "reduce_scatter" in op)


def exercise_1(keep_gathered, cluster) -> None:
    """``keep_gathered(model, mesh)`` shards the notebook's SimpleMLP (``net1``, ``net2``, then
    the root) with ``fully_shard(..., reshard_after_forward=False)`` and returns it. On the
    cluster, its forward must all-gather each layer once, as the default does, its backward
    gather nothing and reduce-scatter each layer's gradient, and the gradients must be the
    default's."""
    import torch

    def both():
        return _forward_backward(keep_gathered), _forward_backward(_zero3)

    mine, default = expect.run(both, cluster=cluster, timeout=TIMEOUT)[0]
    if "returned" in mine:
        raise AssertionError(
            f"keep_gathered should return the sharded model; it returned {mine['returned']}"
        )
    if "unsharded" in mine:
        raise AssertionError(
            f"net1.weight should be sharded, a DTensor (Shard(dim=0),); after keep_gathered it "
            f"is {mine['unsharded']}. Use fully_shard on net1, net2 and the model"
        )
    fa, fb = _gathers(mine["forward"]), _gathers(mine["backward"])
    if fa != _gathers(default["forward"]):
        raise AssertionError(
            f"the forward all-gathered {fa} time(s); sharding net1 and net2 each as a unit "
            f"gathers once per layer, {_gathers(default['forward'])}"
        )
    if fb:
        raise AssertionError(
            f"the backward still all-gathered {fb} time(s): the forward resharded the "
            "parameters (reshard_after_forward=True, the default; an int reshards to that many "
            "ranks). Pass reshard_after_forward=False to every fully_shard call"
        )
    if _scatters(mine["backward"]) != _scatters(default["backward"]):
        raise AssertionError(
            f"the backward should reduce-scatter each layer's gradients "
            f"({_scatters(default['backward'])} times); it ran {mine['backward']}"
        )
    for i, (a, b) in enumerate(zip(mine["grads"], default["grads"], strict=True)):
        if a is None or not torch.allclose(a, b, atol=1e-5, rtol=1e-5):
            raise AssertionError(f"parameter {i}'s gradient differs from the default sharding's")


# -- exercise 2: uneven shards -----------------------------------------------------------------

#: The sizes the grader distributes: a multiple of 4, fewer numbers than ranks, remainders 1-3.
SIZES = (10, 3, 1, 4, 5, 7, 9, 17)


def _held(sizes):
    import torch
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = _mesh()
    return [distribute_tensor(torch.arange(float(n)), mesh, [Shard(0)]).to_local().numel()
            for n in sizes]


def exercise_2(predicted_local_numel, cluster) -> None:
    """``predicted_local_numel(n, rank, world_size)``: how many of ``n`` numbers rank ``rank``
    holds after ``distribute_tensor(torch.arange(float(n)), mesh, [Shard(0)])`` on a 1-D mesh of
    ``world_size`` ranks. Checked against what each rank of the cluster holds, for several n."""
    world_size = cluster.world_size
    guesses = {(n, r): predicted_local_numel(n, r, world_size) for n in SIZES
               for r in range(world_size)}
    held = expect.run(_held, SIZES, cluster=cluster, timeout=TIMEOUT)
    for i, n in enumerate(SIZES):
        truth = [held[r][i] for r in range(world_size)]
        for r in range(world_size):
            guess = guesses[n, r]
            if not isinstance(guess, numbers.Integral) or isinstance(guess, bool):
                raise AssertionError(
                    f"predicted_local_numel({n}, {r}, {world_size}) should be a count, an int "
                    f"like {truth[r]}; got {expect.describe(guess)}"
                )
            if guess != truth[r]:
                raise AssertionError(
                    f"for n = {n} on {world_size} ranks, rank {r} holds {truth[r]} numbers "
                    f"(ranks 0..{world_size - 1} hold {truth}); your function says {guess}"
                )


# -- exercise 3: the original test's p.to_local() -----------------------------------------------


def _train_two_steps(answer):
    from copy import deepcopy

    import torch
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.nn.parallel import DistributedDataParallel as DDP

    model0 = _simple_mlp()
    model, returned = _wrapped(answer, deepcopy(model0), _mesh())
    if model is None:
        return {"returned": returned}
    for name, p in model.named_parameters():
        if _placements(p) != ("Replicate()",):
            return {"not replicated": (name, _what(p))}
    opt = torch.optim.Adam(model.parameters(), lr=0.1, fused=True)
    ddp = DDP(deepcopy(model0))
    ddp_opt = torch.optim.Adam(ddp.parameters(), lr=0.1, fused=True)
    inputs, labels = _batch()
    counted = []
    for m, o in ((model, opt), (ddp, ddp_opt)) * 2:
        with CommDebugMode() as cm:
            o.zero_grad()
            try:
                (m(inputs) - labels).sum().backward()
            except RuntimeError as e:
                return {"failed": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
            o.step()
        if m is model:
            counted.append(_comms(cm))
    differs = [name for (name, p), q in zip(model.named_parameters(), ddp.parameters(), strict=True)
               if not torch.allclose(p.to_local() if isinstance(p, DTensor) else p.detach(),
                                     q.detach(), atol=1e-5, rtol=1e-5)]
    return {"counted": counted, "differs": differs}


def exercise_3(replicated_with_fsdp, cluster) -> None:
    """``replicated_with_fsdp(model, mesh)`` replicates the model over the mesh with FSDP2's
    ``replicate`` (``torch.distributed._composable.replicate_with_fsdp``) and returns it. On the
    cluster: every parameter a ``Replicate()`` DTensor, one all-reduce per training step for all
    gradients together, and after two steps of fused Adam ``to_local()`` equal to DDP's."""
    got = expect.run(_train_two_steps, replicated_with_fsdp, cluster=cluster, timeout=TIMEOUT)[0]
    if "returned" in got:
        raise AssertionError(
            f"replicated_with_fsdp should return the replicated model; it returned "
            f"{got['returned']}"
        )
    if "not replicated" in got:
        name, held = got["not replicated"]
        raise AssertionError(
            f"{name} should be a DTensor replicated over the mesh, placements (Replicate(),); "
            f"it is {held}"
        )
    if "failed" in got:
        raise AssertionError(
            f"a training step on your model failed ({got['failed']}): FSDP2's replicate takes "
            "plain tensors in and out, as DDP does"
        )
    want = ["c10d.allreduce_ x1"] * 2
    if got["counted"] != want:
        raise AssertionError(
            "each step should all-reduce the 4 gradients together, in one collective "
            f"('c10d.allreduce_ x1', like DDP's bucket); the two steps ran {got['counted']}"
        )
    if got["differs"]:
        raise AssertionError(
            f"after two steps, {', '.join(got['differs'])} differ from DDP's parameters"
        )
