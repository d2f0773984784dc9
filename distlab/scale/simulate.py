"""Simulate one rank of a layout: a fake process group of the layout's world size in this one
process, the rank's pipeline stage built on the meta device, laid out with PyTorch's parallel
code, then one training step under fake tensors (shapes and dtypes, no values, no memory).

The pieces, each in its module: `mesh` (the device mesh and a rank's place on it), `plan_order`
(the stage built and the plans applied), `measure` (the step, and what is read off it: a
`RankReport`). torch's private code they stand on (the fake process group, fake tensors,
MemTracker, DTensor's caches) is behind `distlab._torch_simulation`.

Knows nothing about the calculators' formulas (it takes their model configs, from
`calculators.models`, and its `Layout`): `calculator_check` sets the two side by side.
"""

from __future__ import annotations

import contextlib
import warnings

import torch

from .. import _torch_simulation
from .._config import check_int
from ..calculators._text import CalculatorError
from ..calculators.models import Transformer, get_model, stage_layers
from . import mesh as meshes
from .layout import Layout, check_runnable
from .measure import measure_step
from .pipeline import chunk_indices
from .plan_order import build_stage
from .report import RankReport

__all__ = ["RankReport", "build_rank", "simulate_rank", "simulated"]


@contextlib.contextmanager
def simulated(model, layout: Layout, stage: int = 0):
    """This process as the first rank of pipeline ``stage`` of ``layout`` (a fake process group
    of the layout's world size), with the stage's module built on the meta device and laid out
    by PyTorch's parallel code: yields ``(module, mesh)`` (with ``virtual_stages`` > 1, an
    ``nn.ModuleList`` of the rank's stages). Its parameters are DTensors with
    their real shapes and placements, and no memory (``to_empty`` under a ``FakeTensorMode``
    gives them fake storage). On leaving, the fake process group is destroyed and DTensor's
    caches are emptied (they hold meshes of the fake group, which the next simulation in this
    process would otherwise be handed).

    Raises: as `simulate_rank`.
    """
    config = get_model(model)
    _check(config, layout, stage)
    rank = meshes.rank_of({"pp": stage}, layout.mesh_shape)
    try:
        with _torch_simulation.fake_world(rank, layout.world_size), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # FSDP's and DTensor's notes about fake/meta tensors
            mesh = meshes.build(layout)
            yield build_rank(config, layout, stage, mesh), mesh
    finally:
        _torch_simulation.forget_dtensor_caches()


def build_rank(config: Transformer, layout: Layout, stage: int, mesh):
    """What pipeline rank ``stage`` holds, built on the meta device and laid out on ``mesh`` (a
    fake process group's, or a real one's: `real_ranks`): its stage's module (with
    ``virtual_stages`` > 1, an ``nn.ModuleList`` of its stages), with ``layer_ids``,
    ``dp_mesh`` (FSDP's mesh) and ``pp_group`` (None without pipelining) set on it.

    Raises: CalculatorError, as `simulate_rank`."""
    _check(config, layout, stage)
    chunks, layers = [], ()
    for index in chunk_indices(layout, stage):
        chunk, chunk_layers, dp_mesh = build_stage(config, layout, index, mesh)
        chunks.append(chunk)
        layers += chunk_layers
    # one stage: its module; interleaved: the rank's stages, in order
    module = chunks[0] if len(chunks) == 1 else torch.nn.ModuleList(chunks)
    module.layer_ids, module.dp_mesh = layers, dp_mesh
    module.pp_group = mesh["pp"].get_group() if layout.pp > 1 else None
    return module


def simulate_rank(model, layout: Layout, stage: int = 0, *,
                  every_microbatch: bool = False) -> RankReport:
    """Lay ``model`` out with ``layout`` and run one step as the first rank of pipeline ``stage``
    (all other coordinates 0), under fake tensors, in this process (which must not be running a
    process group of its own). With pipelining, the step is PyTorch's schedule
    (``layout.schedule``) running every microbatch (see `pipeline`).

    Args:
        model: a preset's name ("Llama-3 405B") or a `calculators.Transformer`.
        layout: a `Layout`.
        stage: the pipeline stage, 0 to ``layout.pp - 1``.
        every_microbatch: with pipelining, run every microbatch of the step (slow at real
            sizes) instead of measuring three and replaying the schedule's order (the same
            numbers; `replay` says why).

    Returns:
        A `RankReport`.

    Raises:
        CalculatorError (a ValueError): a model that is not a transformer; ``tp`` that does not
            divide the heads, key-value heads, MLP or vocabulary; ``ep`` > 1 for a dense model
            or not dividing the experts; a ``stage`` outside the pipeline; ``seq_len`` not
            divisible by ``cp`` or, with sequence parallelism, by ``tp``.
        RuntimeError: a process group already runs in this process.
    """
    config = get_model(model)
    with simulated(config, layout, stage) as (module, mesh):
        names = meshes.group_names(mesh, module.dp_mesh)
        return measure_step(config, layout, stage, names, module, every_microbatch)


def _check(config, layout: Layout, stage: int) -> None:
    if not isinstance(config, Transformer):
        raise CalculatorError(f"the simulation lays out transformers; {config!r} is not one")
    if not isinstance(layout, Layout):
        raise CalculatorError(f"layout must be a scale.Layout (Layout(dp=8, tp=8)), got "
                              f"{type(layout).__name__} {layout!r}")
    check_int(stage, "stage", low=0, high=layout.pp - 1, error=CalculatorError,
              message=f"stage must be 0 to {layout.pp - 1} (pp={layout.pp}), got {stage!r}")
    check_runnable(layout)
    layout.check(config)  # the layout's own check against the model, as the calculators'
    stage_layers(config.layers, layout.pp * layout.virtual_stages)  # says what would split
    if config.vocab % layout.tp:
        raise CalculatorError(f"tp={layout.tp} does not divide the vocabulary of {config.name} "
                              f"({config.vocab})")
    tokens = layout.seq_len // layout.cp
    if layout.tp > 1 and layout.sequence_parallel and tokens % layout.tp:
        raise CalculatorError(f"sequence parallelism splits {tokens} tokens per rank over "
                              f"tp={layout.tp}: choose seq_len divisible by cp x tp")
