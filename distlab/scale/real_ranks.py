"""The simulation's own step on real ranks: a layout small enough for a laptop's CPU, built by
the same code as `simulate_rank` (`mesh`, `plan_order`, `plans`, `model`) on a real gloo
process group of the layout's world size, stepped by the same `measure.measure_step` with real
tensors, and read off the same way (a `RankReport` per rank). What the simulation claims for a
rank can then be held against what a real rank measured:

    tiny = Transformer("tiny", vocab=256, hidden=64, intermediate=128, layers=4, heads=4,
                       kv_heads=2)
    layout = Layout(dp=2, tp=2, seq_len=32)
    (report, shapes), *others = real_ranks.run(tiny, layout)      # one per rank
    report.comm() == simulate_rank(tiny, layout).comm()           # True

On a real rank every microbatch of a pipeline's step runs (the schedule's own step: nothing is
replayed), and its memory is read by the same MemTracker (CPU memory has no allocator
statistics): the bytes of the tensors alive, as the simulation counts them.

What a real gloo rank does that a simulated one does not (`tests/test_scale_vs_real.py`
holds the two equal but for these, for notebook 24's 2 x 2 and notebook 26's 2 x 2 x 2):

- a pipeline's schedule (torch >= 2.14) votes on static shapes before its first step: one
  4-byte send and one 4-byte receive per pipeline rank, skipped on a fake process group;
- gloo's reduce-scatter reduces a copy of its whole input and copies this rank's chunk out
  when waited on: for that moment an input-sized buffer is alive (NCCL makes none). Set
  aside unless ``gloo_buffers=True`` (on notebook 24's 2 x 2 it is what the peak differs by:
  905,764 bytes with it, 891,300 without, as simulated);
- gloo's worker thread may hold a collective's buffer a moment after the rank waited for it
  and dropped it (the fake backend holds nothing): a few hundred bytes more, now and then.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings

import torch

from .. import _torch, _torch_simulation
from ..calculators.models import get_model
from . import mesh as meshes
from .layout import Layout
from .measure import measure_step
from .report import RankReport
from .simulate import build_rank

__all__ = ["local_shapes", "measure_rank", "run"]


def local_shapes(module) -> dict[str, tuple]:
    """``{parameter name: the shape of this rank's local shard}`` of a stage's module."""
    return {name: tuple(_torch.local_tensor(p).shape)
            for name, p in module.named_parameters()}


def measure_rank(model, layout: Layout, seed: int = 0, *,
                 gloo_buffers: bool = False) -> tuple[RankReport, dict]:
    """On a rank of a real process group (a rank of ``distlab.launch(..., backend="gloo")``):
    build this rank's stage of ``layout`` as `simulate_rank` does, run one training step with
    real tensors (every microbatch of the step), and read it off as `simulate_rank` does.

    Args:
        model: a preset's name or a `calculators.Transformer` (small enough to run on a CPU).
        layout: a `Layout` whose world size is the process group's.
        seed: the seed of the parameters' values and the tokens; ranks with the same
            data-parallel coordinates draw the same tokens, as tensor-parallel peers must.
        gloo_buffers: count the buffer gloo's reduce-scatter copies this rank's chunk out of
            (the memory of this gloo rank) instead of setting it aside (what an NCCL rank,
            and the simulation, hold; the default).

    Returns:
        ``(report, shapes)``: the rank's `RankReport` (with its own ``rank`` and ``coords``)
        and its parameters' local shapes (`local_shapes`).

    Raises:
        RuntimeError: no process group, or one of another size than ``layout.world_size``: run
            it on the ranks of ``distlab.launch(..., world_size=layout.world_size)``.
        CalculatorError: as `simulate_rank`.
    """
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() != layout.world_size:
        have = dist.get_world_size() if dist.is_initialized() else "no process group"
        raise RuntimeError(
            f"measure_rank runs on the {layout.world_size} ranks of the layout ({have} here): "
            f"call it inside distlab.launch(..., world_size={layout.world_size}, "
            'backend="gloo")')
    config = get_model(model)
    rank = dist.get_rank()
    coords = meshes.coords_of(rank, layout.mesh_shape)
    mesh = meshes.build(layout)
    stage = coords["pp"]
    module = build_rank(config, layout, stage, mesh)
    names = meshes.group_names(mesh, module.dp_mesh)
    # tensor- and pipeline-parallel peers read the same batch: the seed of their first rank
    torch.manual_seed(seed * layout.world_size
                      + meshes.rank_of(coords | {"pp": 0, "tp": 0}, layout.mesh_shape))
    waits = contextlib.nullcontext() if gloo_buffers else _torch_simulation.waits_unseen()
    with waits, warnings.catch_warnings():
        # torch 2.14's FSDP2 notes that the embedding returns a view (an in-place op on it
        # would skip the all-gather; the model adds out of place): the simulation hides its
        # notes about fake and meta tensors the same way
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
        report = measure_step(config, layout, stage, names, module,
                              every_microbatch=True, real=True)
    return dataclasses.replace(report, rank=rank, coords=coords), local_shapes(module)


def run(model, layout: Layout, *, gloo_buffers: bool = False, timeout: float = 120.0,
        threads: int = 1) -> list:
    """`measure_rank` on ``layout.world_size`` gloo ranks started by `distlab.launch`: a list
    of ``(report, shapes)``, one per rank, in rank order.

    Args:
        model, layout, gloo_buffers: as `measure_rank`.
        timeout: seconds the step may take (`distlab.launch`'s ``timeout``).
        threads: CPU threads per rank.

    Raises:
        distlab.RankError: a rank failed (its traceback says where); as `distlab.launch`.
    """
    from .. import launcher

    return launcher.launch(measure_rank, get_model(model), layout, world_size=layout.world_size,
                           backend="gloo", timeout=timeout, threads=threads,
                           gloo_buffers=gloo_buffers)
