"""Notebook 26's exercise 3 counts the collectives of one step of its 3-D composition; its
grader's counts (`nb26.expected_collectives`) are checked here against 8 real gloo ranks on a
case the notebook does not run: 2 blocks a stage and 3 microbatches (the notebook runs 1 and 2,
and asserts that case in its cell 7)."""

from __future__ import annotations

from collections import Counter

import pytest

import distlab
from distlab.exercises import nb26

BLOCKS, MICRO = 2, 3


def _three_d_counts(blocks, microbatches):
    import contextlib

    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    from torch.distributed.tensor.parallel import loss_parallel, parallelize_module

    from distlab import gpt
    from distlab.scale.instruments import Collectives

    config = gpt.Config(layers=2 * blocks)
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"))
    pp, dp = mesh.get_local_rank("pp"), mesh.get_local_rank("dp")
    model = gpt.GPT(config, seed=0)  # notebook 26's cell 5, without the recorders
    model.layers = torch.nn.ModuleList(model.layers[pp * blocks:(pp + 1) * blocks])
    if pp == 0:
        model.norm = model.head = None
    else:
        model.tok = model.pos = None
    plan = {k: v for k, v in gpt.tp_plan().items() if getattr(model, k.split(".")[0]) is not None}
    parallelize_module(model, mesh["tp"], plan)
    for block in model.layers:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    stage = PipelineStage(model, pp, 2, torch.device("cpu"), group=mesh["pp"].get_group())
    schedule = ScheduleGPipe(stage, n_microbatches=microbatches, loss_fn=gpt.loss)
    opt = gpt.make_optimizer(model.parameters())
    counted = Collectives({mesh.get_group(d).group_name: d for d in ("pp", "dp", "tp")})
    per = 2 * microbatches  # sequences per dp rank: 2 per microbatch
    for step in range(2):
        tokens, targets = gpt.batch(step, 2 * per, config)
        mine = slice(dp * per, (dp + 1) * per)
        with counted if step == 1 else contextlib.nullcontext(), loss_parallel():
            if pp == 0:
                schedule.step(tokens[mine])
            else:
                schedule.step(target=targets[mine], losses=[])
        opt.step()
        opt.zero_grad()
    return pp, dict(Counter((c.axis, c.kind) for c in counted.calls))


@pytest.mark.timeout(300)
def test_exercise_3s_counts_are_what_8_ranks_call_with_2_blocks_and_3_microbatches():
    results = distlab.launch(_three_d_counts, BLOCKS, MICRO, world_size=8, timeout=240)
    for rank, (stage, counts) in enumerate(results):
        assert stage == rank // 4
        assert counts == nb26.expected_collectives(stage, BLOCKS, MICRO), (rank, counts)
