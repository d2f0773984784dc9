"""The NCCL paths, on real GPUs. Skipped where no CUDA GPU is visible (a laptop, CI).

They run on a GPU machine with plain ``pytest tests/test_gpu.py``; each one uses as many ranks as
there are GPUs (one GPU per rank, as NCCL needs), and one more rank where the point is that there
are too few GPUs.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import distlab

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0

pytestmark = pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU (the NCCL backend)")


def _all_reduce_on_both_devices():
    rank = dist.get_rank()
    gpu = torch.full((3,), float(rank + 1), device="cuda")
    cpu = torch.full((3,), float(rank + 1))
    dist.all_reduce(gpu)  # NCCL
    dist.all_reduce(cpu)  # gloo
    return torch.cuda.current_device(), gpu.cpu().tolist(), cpu.tolist()


def test_auto_uses_nccl_for_cuda_and_gloo_for_cpu_tensors_with_one_gpu_per_rank():
    result = distlab.launch(_all_reduce_on_both_devices, world_size=GPUS, timeout=120)
    total = float(sum(range(1, GPUS + 1)))
    assert result == [(r, [total] * 3, [total] * 3) for r in range(GPUS)]


def _backend_and_sum():
    t = torch.ones(2, device="cuda")
    dist.all_reduce(t)
    return dist.get_backend(), t.sum().item()


def test_plain_nccl_backend_all_reduces_on_each_rank_s_own_gpu():
    result = distlab.launch(_backend_and_sum, world_size=GPUS, backend="nccl", timeout=120)
    assert result == [("nccl", 2.0 * GPUS)] * GPUS


def test_nccl_with_more_ranks_than_gpus_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"one CUDA GPU per rank.*backend='gloo'"):
        distlab.launch(_backend_and_sum, world_size=GPUS + 1, backend="nccl")


def _cpu_backend():
    t = torch.ones(1)
    dist.all_reduce(t)
    return dist.get_backend(), t.item()


def test_auto_falls_back_to_gloo_when_there_are_fewer_gpus_than_ranks():
    result = distlab.launch(_cpu_backend, world_size=GPUS + 1, timeout=120)
    assert result == [("gloo", float(GPUS + 1))] * (GPUS + 1)


def test_cuda_used_in_the_kernel_first_does_not_break_the_ranks():
    # A learner who ran a GPU cell before launching: the ranks are forked from distlab's helper,
    # which never touches CUDA, so they can still initialize it.
    x = torch.ones(4, device="cuda") * 2
    assert x.sum().item() == 8.0
    result = distlab.launch(_backend_and_sum, world_size=GPUS, backend="nccl", timeout=120)
    assert [s for _, s in result] == [2.0 * GPUS] * GPUS


def _ddp_step():
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Linear(4, 2).cuda()
    ddp = DistributedDataParallel(model, device_ids=[rank])
    torch.manual_seed(rank)
    ddp(torch.randn(8, 4).cuda()).sum().backward()  # CPU generator: same numbers as below
    return model.weight.grad.cpu()


def test_ddp_on_gpus_gives_every_rank_the_same_averaged_gradient():
    grads = distlab.launch(_ddp_step, world_size=GPUS, timeout=120)
    # The same step by hand, on one device: the mean of every rank's local gradient.
    expected = []
    for rank in range(GPUS):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        torch.manual_seed(rank)
        model(torch.randn(8, 4)).sum().backward()
        expected.append(model.weight.grad)
    mean = torch.stack(expected).mean(0)
    for g in grads:
        torch.testing.assert_close(g, mean)


def test_a_cluster_keeps_nccl_ranks_across_cells():
    with distlab.Cluster(world_size=GPUS, timeout=120) as cluster:
        cluster.exec("t = torch.full((2,), float(rank + 1), device='cuda')")
        out = cluster.exec("dist.all_reduce(t); t.tolist()")
        total = float(sum(range(1, GPUS + 1)))
        assert list(out) == [repr([total, total])] * GPUS
        assert cluster.pull("rank") == list(range(GPUS))
