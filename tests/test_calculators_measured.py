"""distlab.calculators against what ranks really hold: notebook 15's model on two ranks with DDP,
ZeRO-1 (`ZeroRedundancyOptimizer`) and FSDP (`fully_shard`), counted by `distlab.memory.measure`
on each rank, equals `memory_per_device` byte for byte."""

from __future__ import annotations

import sys

import cloudpickle
import torch
import torch.nn as nn

import distlab
from distlab import memory
from distlab.calculators import memory_per_device

cloudpickle.register_pickle_by_value(sys.modules[__name__])

NB15 = "notebook 15: 4 x Linear(64, 64)"


def _notebook_15_on_two_ranks():
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    def make():
        torch.manual_seed(0)
        return nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)])

    def step(model, opt):
        x = torch.randn(8, 64, generator=torch.Generator().manual_seed(dist.get_rank()))
        model(x).square().mean().backward()
        opt.step()

    out = {}
    ddp = DDP(make(), gradient_as_bucket_view=True)
    opt = torch.optim.Adam(ddp.parameters())
    step(ddp, opt)
    out[0] = memory.measure(ddp, opt)
    zero_model = DDP(make(), gradient_as_bucket_view=True)
    zero = ZeroRedundancyOptimizer(zero_model.parameters(), optimizer_class=torch.optim.Adam)
    step(zero_model, zero)
    out[1] = memory.measure(zero_model, zero)
    fsdp = make()
    for layer in fsdp:
        fully_shard(layer)
    fully_shard(fsdp)
    opt = torch.optim.Adam(fsdp.parameters())
    step(fsdp, opt)
    out[3] = memory.measure(fsdp, opt)
    return out


def test_notebook_15_sharded_on_two_ranks_matches_the_calculator():
    measured = distlab.launch(_notebook_15_on_two_ranks, world_size=2, timeout=120)
    for zero in (0, 1, 3):
        e = memory_per_device(NB15, dp=2, zero=zero, precision="fp32")
        for rank in (0, 1):
            u = measured[rank][zero]
            assert (u.params, u.grads, u.optimizer) == (e.params, e.grads, e.optimizer), zero
