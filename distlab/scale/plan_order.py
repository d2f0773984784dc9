"""One pipeline stage of a layout, built on the meta device and laid out on its mesh, the plans
applied in this order: expert parallelism, tensor (and sequence) parallelism, context
parallelism, activation checkpointing, then FSDP (or DDP, or HSDP) around it all.

Knows nothing about measuring: `measure` steps the stage built here.
"""

from __future__ import annotations

import torch

from ..calculators.models import Transformer
from . import mesh as meshes
from .layout import Layout, stage_layers
from .model import Llama
from .plans import (
    apply_checkpointing,
    apply_context_parallel,
    apply_expert_parallel,
    apply_fsdp,
    apply_tensor_parallel,
)


def build_stage(config: Transformer, layout: Layout, stage: int, mesh):
    """Pipeline stage ``stage`` of ``layout.pp x layout.virtual_stages`` (a pipeline rank holds
    ``virtual_stages`` of them), laid out on ``mesh`` (see `plans`): ``(module, layer ids,
    FSDP's mesh)``."""
    total = layout.pp * layout.virtual_stages
    layers = stage_layers(config.layers, total)[stage]
    with torch.device("meta"):
        module = Llama(config, layers, first=stage == 0, last=stage == total - 1,
                       attention=layout.attention)
    if layout.ep > 1:
        apply_expert_parallel(module, mesh["ep"])
    if layout.tp > 1:
        apply_tensor_parallel(module, mesh["tp"], sequence_parallel=layout.sequence_parallel,
                              loss_parallel=layout.loss_parallel)
    if layout.cp > 1:
        apply_context_parallel(module, mesh["cp"], layout.seq_len)
    apply_checkpointing(module, layout.checkpointing)
    expert_mesh = None
    if layout.ep > 1:
        expert_mesh = mesh["dp_mod_ep"] if layout.cp == 1 else mesh[("dp_mod_ep", "cp")]
    dp_mesh = meshes.data_parallel_mesh(mesh, layout)
    apply_fsdp(module, dp_mesh, reshard=layout.reshard_after_forward and layout.pp == 1,
               precision=layout.precision, expert_mesh=expert_mesh)
    return module, tuple(layers), dp_mesh
