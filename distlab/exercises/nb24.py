"""Graders for notebook 24, the capstone: the tiny GPT on a 2-D mesh (see `distlab.exercises`).

Exercise 1's answer is a formula (which ranks share a data-parallel and a tensor-parallel
group), run in the kernel and compared with the layout ``init_device_mesh`` makes: row-major,
``rank = dp_index * tp + tp_index`` (the notebook asserts that on its live 4-rank mesh).
Exercise 2's answer runs on the notebook's live 4-rank cluster: each rank's share of a batch is
checked row by row on 2x2, 4x1 and 1x4 ("dp", "tp") meshes and on a 2x2 ("tp", "dp") one, then
a 2x2 FSDP x TP run that takes its batches from the answer trains one step and is compared with
one process (`distlab.gradcheck`).
"""

from __future__ import annotations

from .. import _torch
from . import expect

#: Seconds a check may take on the cluster: new meshes and a step of a 2-D model, busy ranks.
TIMEOUT = 30.0

#: (dp, tp) shapes for exercise 1: square, a size-1 axis each way, uneven, larger.
SHAPES_1 = ((2, 2), (4, 1), (1, 4), (2, 4), (4, 2), (3, 2))
#: Meshes of the live 4-rank cluster for exercise 2, as (axis names, shape): dp first in
#: three shapes, then tp first (a rank's first coordinate is then its tp index).
MESHES_2 = ((("dp", "tp"), (2, 2)), (("dp", "tp"), (4, 1)), (("dp", "tp"), (1, 4)),
            (("tp", "dp"), (2, 2)))
BATCH = 8  # sequences in a step's global batch (as in the notebook)
STEPS = 1

_meshes: dict = {}  # on each rank: (names, shape) -> DeviceMesh, made once (it makes groups)


def _mesh(names: tuple = ("dp", "tp"), shape: tuple = (2, 2)):
    if (names, shape) not in _meshes:
        from torch.distributed.device_mesh import init_device_mesh

        _meshes[names, shape] = init_device_mesh("cpu", shape, mesh_dim_names=names)
    return _meshes[names, shape]


# -- exercise 1: which ranks form each group --------------------------------------------------


def expected_groups(dp: int, tp: int) -> dict:
    """What ``init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))`` makes: ranks
    laid out row-major in a dp x tp grid; a tp group is a row, a dp group a column."""
    rows = [[d * tp + t for t in range(tp)] for d in range(dp)]
    return {"dp": [list(col) for col in zip(*rows, strict=True)], "tp": rows}


def _as_groups(value, what: str) -> list:
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(g, (list, tuple)) and all(isinstance(r, int) and not isinstance(r, bool)
                                             for r in g)
        for g in value
    ):
        raise AssertionError(
            f"{what} should be a list of groups, each a list of ranks (ints), like [[0, 1], "
            f"[2, 3]]; got {expect.describe(value)}"
        )
    return [list(g) for g in value]


def exercise_1(mesh_groups) -> None:
    """``mesh_groups(dp, tp)`` -> ``{"dp": [...], "tp": [...]}``: every data-parallel and every
    tensor-parallel group of a ``(dp, tp)`` mesh, each group a list of ranks in mesh order
    (position i is the group's local rank i); the order of the groups does not matter. Tried on
    `SHAPES_1` and one shape drawn at every check."""
    r = expect.rng()  # a table of the shapes above does not pass:
    drawn = r.choice([(dp, tp) for dp in range(1, 7) for tp in range(1, 7)
                      if (dp, tp) not in SHAPES_1 and dp * tp > 1])
    for dp, tp in (*SHAPES_1, drawn):
        got = mesh_groups(dp, tp)
        shape = f"a {dp}x{tp} mesh (dp={dp}, tp={tp}, ranks 0-{dp * tp - 1})"
        if not isinstance(got, dict) or set(got) != {"dp", "tp"}:
            raise AssertionError(
                f'mesh_groups should return a dict with the keys "dp" and "tp"; for {shape} '
                f"it returned {expect.describe(got)}"
            )
        want = expected_groups(dp, tp)
        for axis, size, other in (("dp", dp, tp), ("tp", tp, dp)):
            groups = _as_groups(got[axis], f'for {shape}, mesh_groups(...)["{axis}"]')
            if sorted(groups) != sorted(want[axis]):
                raise AssertionError(
                    f"for {shape} the {axis} groups should be {want[axis]} ({other} groups of "
                    f"{size}: a {'column' if axis == 'dp' else 'row'} of the mesh each, ranks "
                    f"numbered row by row as init_device_mesh does); yours are {groups}"
                )


# -- exercise 2: this rank's share of the batch -----------------------------------------------


def _shares(local_batch):
    """On every rank: for each mesh, what the answer returns for step 0 (or what went wrong),
    and the truth from the mesh itself: this rank's tp group and the size of dp."""
    import torch

    out = {}
    for names, shape in MESHES_2:
        mesh = _mesh(names, shape)
        got = local_batch(0, mesh)
        ok = (isinstance(got, tuple) and len(got) == 2
              and all(isinstance(t, torch.Tensor) for t in got))
        share = tuple(t.detach().clone() for t in got) if ok else _short(got)
        out[names, shape] = (share, mesh["tp"].mesh.tolist(), mesh["dp"].size())
    return out


def _short(value) -> str:
    """One line about a wrong return value: tensors by dtype and shape, not by their values."""
    import torch

    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        return f"{expect._a(dtype)} tensor of shape {tuple(value.shape)}"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_short(v) for v in value[:3]) + (", ..." if len(value) > 3 else "")
        return f"a {type(value).__name__} of {len(value)}: [{inner}]"
    return expect.describe(value).splitlines()[0]


def _check_shares(results, names: tuple, shape: tuple) -> None:
    from .. import gpt

    tokens, targets = gpt.batch(0, BATCH, gpt.Config())
    rows = {tuple(row.tolist()): i for i, row in enumerate(tokens)}
    axes = ", ".join(f"{n}={size}" for n, size in zip(names, shape, strict=True))
    where = f"on the {'x'.join(map(str, shape))} mesh ({axes})"
    taken = []  # per rank: the indices of the batch's sequences it trains on
    for rank, r in enumerate(results):
        got = r[names, shape][0]
        if isinstance(got, str):
            raise AssertionError(
                f"local_batch should return a tuple (tokens, targets) of two tensors; {where} "
                f"rank {rank} got {got}"
            )
        mine, theirs = got
        for what, t in (("tokens", mine), ("targets", theirs)):
            if t.dtype != tokens.dtype:
                dtype = str(t.dtype).removeprefix("torch.")
                raise AssertionError(
                    f"{where} rank {rank}'s {what} are {dtype}; they should be token ids as "
                    "gpt.batch gives them, int64 (an embedding looks rows up by integer id): "
                    "take your share of them as they are, without converting"
                )
        if mine.dim() != 2 or mine.shape[1] != tokens.shape[1]:
            raise AssertionError(
                f"{where} rank {rank}'s tokens should be whole sequences, shape (n, "
                f"{tokens.shape[1]}); got shape {tuple(mine.shape)}"
            )
        if theirs.shape != mine.shape:
            raise AssertionError(
                f"{where} rank {rank}'s targets should be those of its own sequences, shape "
                f"{tuple(mine.shape)} like its tokens; got shape {tuple(theirs.shape)}"
            )
        index = []
        for row, target in zip(mine, theirs, strict=True):
            i = rows.get(tuple(row.tolist()))
            if i is None:
                raise AssertionError(
                    f"{where} rank {rank} got a sequence that is not in gpt.batch(step, "
                    f"{BATCH})'s tokens for this step"
                )
            if not target.equal(targets[i]):
                raise AssertionError(
                    f"{where} rank {rank}'s targets do not belong to its tokens: sequence {i}'s "
                    "targets must come with sequence i"
                )
            index.append(i)
        taken.append(index)
    dp = results[0][names, shape][2]
    want = BATCH // dp
    for rank, index in enumerate(taken):
        if len(index) != want:
            raise AssertionError(
                f"{where} each rank should train on {BATCH} / dp = {want} sequences (its "
                f"data-parallel share); rank {rank} got {len(index)}"
            )
    groups = sorted({tuple(r[names, shape][1]) for r in results})  # the tp groups, from the mesh
    for group in groups:
        for rank in group[1:]:
            if taken[rank] != taken[group[0]]:
                raise AssertionError(
                    f"{where} ranks {list(group)} form a tensor-parallel group: each holds part "
                    "of every weight, so they must train on the same sequences; rank "
                    f"{group[0]} got sequences {taken[group[0]]}, rank {rank} {taken[rank]}"
                )
    every = sorted(i for group in groups for i in taken[group[0]])
    if every != list(range(BATCH)):
        raise AssertionError(
            f"{where} the {dp} data-parallel shares together should cover each of the "
            f"{BATCH} sequences exactly once; they got sequences {every}"
        )


def _train_2d(local_batch):
    """On every rank: FSDP x TP on the 2x2 mesh, batches from the answer; the recorder."""
    import logging

    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import loss_parallel, parallelize_module

    from .. import gpt, gradcheck

    logging.getLogger(_torch.REDISTRIBUTE_LOGGER).setLevel(logging.ERROR)
    mesh = _mesh()
    model = parallelize_module(gpt.GPT(gpt.Config(), seed=0), mesh["tp"], gpt.tp_plan())
    for layer in model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = gpt.make_optimizer(model.parameters())
    recorder = gradcheck.Recorder(loss_group=mesh["dp"])
    for step in range(STEPS):
        tokens, targets = local_batch(step, mesh)
        with loss_parallel():
            loss = gpt.loss(model(tokens), targets)
            loss.backward()
        opt.step()
        recorder.record(step, loss, model, opt)
        opt.zero_grad()
    return recorder


def _on_ranks(fn, local_batch, cluster):
    """`expect.run` of ``fn(local_batch)`` on the cluster; a name the answer uses that the
    ranks do not have is explained: a function written in the kernel takes the kernel's
    names with it, not those that ``%%ranks`` cells defined on the ranks."""
    import sys

    from ..errors import RankError
    from . import _not_written_on_ranks

    try:
        return expect.run(fn, local_batch, cluster=cluster, timeout=TIMEOUT)
    except RankError as e:
        if _not_written_on_ranks(e) or e.primary.type != "NameError":
            raise
        print(str(e), file=sys.stderr)
        raise AssertionError(
            f"your code failed on the ranks ({e.primary.headline()}; the report is above). "
            "local_batch is written in the notebook (the kernel) and runs on the ranks: it "
            "takes the kernel's names with it, not those of %%ranks cells (dist, mesh_of... "
            "exist only on the ranks). Import what it needs inside it, e.g. import "
            "torch.distributed as dist, or use only the mesh it is given"
        ) from None


def exercise_2(local_batch, cluster) -> None:
    """``local_batch(step, mesh)`` -> ``(tokens, targets)``: this rank's share of
    ``gpt.batch(step, 8)`` on a mesh with a "dp" and a "tp" axis, in either order: 8 / dp
    whole sequences with their targets, the same on every rank of a tensor-parallel group, each
    sequence in exactly one data-parallel share. Checked on 2x2, 4x1 and 1x4 ("dp", "tp") meshes
    and a 2x2 ("tp", "dp") one (a rank's first coordinate is then its tp index) of the live
    cluster, then a 2x2 FSDP x TP run fed by it must equal one process for a step."""
    from .. import gpt, gradcheck

    expect.not_written(local_batch, 0, None)
    results = _on_ranks(_shares, local_batch, cluster)
    for names, shape in MESHES_2:
        _check_shares(results, names, shape)
    records = _on_ranks(_train_2d, local_batch, cluster)
    # One process's run, on rank 0 (its optimizer machinery is imported; the kernel's may not be).
    reference = cluster.run(gpt.reference_run, steps=STEPS, ranks=0, timeout=TIMEOUT,
                            _record=False)[0]
    gradcheck.compare(records, reference).check()
