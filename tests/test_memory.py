"""distlab.memory: bytes of parameters, gradients and optimizer state per rank, and their table."""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch

import distlab
from distlab import memory

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))


def _step(model, opt):
    model(torch.ones(4, 8)).sum().backward()
    opt.step()


PSI = 2 * (8 * 8 + 8)  # parameters of _model(): 144


def test_adam_on_one_process_holds_4_4_and_8_bytes_per_parameter():
    model = _model()
    opt = torch.optim.Adam(model.parameters())
    before = memory.measure(model, opt)
    assert (before.params, before.grads, before.optimizer) == (4 * PSI, 0, 0)  # no state yet
    _step(model, opt)
    u = memory.measure(model, opt)
    assert u.rank is None and u.numel == PSI
    assert (u.params, u.grads, u.optimizer) == (4 * PSI, 4 * PSI, 8 * PSI)
    assert u.total == 16 * PSI
    assert u.optimizer_other == 4 * 4  # Adam's step counter: one float32 per parameter tensor
    assert u.peak_rss > 10 * 2**20 and u.cuda_peak is None


def test_two_parameters_over_one_storage_count_once():
    # Tied as a model loaded from a checkpoint ties them: two Parameter objects, one storage
    # (parameters() de-duplicates objects, not storages).
    model = _model()
    model[2].weight = torch.nn.Parameter(model[0].weight.data)
    assert model[2].weight is not model[0].weight
    assert len(list(model.parameters())) == 4
    u = memory.measure(model)
    assert u.params == 4 * (PSI - 64) and u.numel == PSI - 64


def test_activations_measured_by_the_meter_are_a_fourth_part_kept_out_of_the_total():
    from distlab import activations, gpt

    config = gpt.Config()
    model = gpt.GPT(config, seed=0)
    tokens, _ = gpt.batch(step=0, batch_size=2, config=config, seed=0)
    with activations.Meter(model) as meter:
        model(tokens)
    u = memory.measure(model, activations=meter.result)
    assert u.activations == meter.result.total > 0
    assert u.total == u.params  # no grads or optimizer yet: activations are not in the total
    table = memory.Table([u, memory.measure(model, activations=123)], title="GPT")
    lines = table.text().splitlines()
    assert lines[1].split()[:6] == ["rank", "params", "grads", "optimizer", "total", "activations"]
    assert lines[3].split()[5] == "123"
    assert len(table.figure().axes[0].patches) == 2 * 4  # four bars per rank
    with pytest.raises(TypeError, match="activations must be what a distlab.activations.Meter"):
        memory.measure(model, activations="lots")


def test_sgd_without_momentum_has_no_state_and_shared_weights_count_once():
    model = _model()
    model[2].weight = model[0].weight  # tied: one tensor, two places
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _step(model, opt)
    u = memory.measure(model, opt)
    assert u.params == 4 * (PSI - 64) and u.grads == u.params
    assert u.optimizer == u.optimizer_other == 0
    momentum = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _step(model, momentum)
    assert memory.measure(optimizer=momentum).optimizer == u.params


def _ddp_zero_fsdp():
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    out = {}
    ddp = DDP(_model(), gradient_as_bucket_view=True)
    opt = torch.optim.Adam(ddp.parameters())
    _step(ddp, opt)
    out["ddp"] = memory.measure(ddp, opt)

    ddp = DDP(_model(), gradient_as_bucket_view=True)
    zero = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam)
    _step(ddp, zero)
    out["zero"] = memory.measure(ddp, zero)

    for reshard in (True, False):
        model = _model()
        for layer in (model[0], model[2]):
            fully_shard(layer, reshard_after_forward=reshard)
        fully_shard(model, reshard_after_forward=reshard)
        opt = torch.optim.Adam(model.parameters())
        loss = model(torch.ones(4, 8)).sum()
        out[f"between forward and backward, reshard={reshard}"] = memory.measure(model)
        loss.backward()
        opt.step()
        out[f"fsdp reshard={reshard}"] = memory.measure(model, opt)
    assert dist.get_world_size() == 2
    return out


def test_ddp_zero1_and_fsdp_on_two_ranks_follow_the_formulas():
    per_rank = distlab.launch(_ddp_zero_fsdp, world_size=2)
    for r, out in enumerate(per_rank):
        ddp, zero = out["ddp"], out["zero"]
        assert ddp.rank == r
        assert (ddp.params, ddp.grads, ddp.optimizer) == (4 * PSI, 4 * PSI, 8 * PSI)
        # ZeRO-1: whole parameters are shared out, here one Linear (weight + bias) per rank.
        assert (zero.params, zero.grads, zero.optimizer) == (4 * PSI, 4 * PSI, 8 * PSI // 2)
        for reshard in (True, False):
            fsdp = out[f"fsdp reshard={reshard}"]
            assert (fsdp.params, fsdp.grads, fsdp.optimizer) == (2 * PSI, 2 * PSI, 4 * PSI)
        # Between forward and backward: resharded (ZeRO-3) or still gathered (ZeRO-2 style).
        assert out["between forward and backward, reshard=True"].params == 4 * PSI // 2
        assert out["between forward and backward, reshard=False"].params == 4 * PSI
    assert sum(out["zero"].optimizer for out in per_rank) == 8 * PSI


def _adam_step_measured(steps):
    model = _model()
    opt = torch.optim.Adam(model.parameters())
    memory.measure(model, opt)  # before any step: no optimizer state yet
    for _ in range(steps):
        _step(model, opt)
    memory.measure(model, opt)  # the last measure is the one record() keeps
    return steps


def test_record_keeps_each_ranks_last_measure_and_the_functions_results():
    table = memory.record(_adam_step_measured, 2, world_size=2, title="Adam", psi=PSI)
    assert table.results == [2, 2] and table.title == "Adam"
    assert [(u.rank, u.optimizer) for u in table.usages] == [(0, 8 * PSI), (1, 8 * PSI)]
    assert [table.per_param(r) for r in range(2)] == [16.0, 16.0]


def test_record_and_collect_name_the_ranks_that_measured_nothing(cluster):
    with pytest.raises(RuntimeError, match=r"rank\(s\) 0, 1 measured nothing while"):
        memory.record(_model, cluster=cluster)
    cluster.exec("from distlab import memory\nLinear = torch.nn.Linear")
    cluster.exec("memory.measure(Linear(2, 1))", ranks=[0])
    with pytest.raises(RuntimeError, match=r"rank\(s\) 1 have measured nothing yet"):
        memory.collect(cluster)
    cluster.exec("memory.measure(Linear(2, 2))", ranks=[1])
    assert [u.params for u in memory.collect(cluster).usages] == [12, 24]


def _usage(rank, params, grads, opt, other=16, peak=123456789):
    return memory.Usage(rank, params, grads, opt, other, params // 4, peak_rss=peak)


def test_table_text_is_exact_bytes_without_the_measured_peak():
    table = memory.Table(
        [_usage(0, 400, 400, 800, peak=111_111_111), _usage(1, 400, 400, 800, peak=222)],
        title="DDP",
        psi=100,
    )
    assert table.text() == (
        "DDP (Ψ = 100 parameters)\n"
        "rank      params       grads   optimizer       total  total/Ψ  other optimizer state\n"
        "   0         400         400         800       1,600    16.00  16\n"
        "   1         400         400         800       1,600    16.00  16"
    )
    assert "111" not in repr(table) and table.peaks() == [111_111_111, 222]
    assert table.per_param(1, "optimizer") == 8.0 and table.per_param(0) == 16.0
    assert len(table) == 2 and table[1].params == 400


def test_pictures_have_one_group_of_bars_per_rank():
    table = memory.Table([_usage(0, 400, 400, 800), _usage(1, 200, 200, 400)], title="t")
    fig = table.figure()
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["rank 0", "rank 1"]
    assert len(ax.patches) == 6  # 3 bars per rank
    assert table.png().startswith(b"\x89PNG")
    both = memory.compare(table, memory.Table([_usage(0, 4, 4, 8)], title="u", psi=1))
    assert both.text() == (
        "t, rank 0: params 400 + grads 400 + optimizer 800 = 1,600 bytes\n"
        "t, rank 1: params 200 + grads 200 + optimizer 400 = 800 bytes\n"
        "u, rank 0: params 4.00 + grads 4.00 + optimizer 8.00 = 16.00 bytes per parameter"
    )
    assert len(both.figure().axes[0].patches) == 9 and both.png().startswith(b"\x89PNG")


def test_bad_input_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match="needs a model, an optimizer, or both"):
        memory.measure()
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got list"):
        memory.measure([torch.ones(2)])
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer"):
        memory.measure(_model(), {"lr": 0.1})
    with pytest.raises(ValueError, match="needs one Usage per rank"):
        memory.Table([])
    with pytest.raises(TypeError, match="entry 0 is a dict, not a Usage"):
        memory.Table([{"params": 1}])
    with pytest.raises(ValueError, match="psi must be"):
        memory.Table([_usage(0, 4, 4, 8)], psi=0)
    with pytest.raises(ValueError, match="per_param needs psi"):
        memory.Table([_usage(0, 4, 4, 8)]).per_param(0)
    with pytest.raises(TypeError, match="not a memory.Table"):
        memory.compare([_usage(0, 4, 4, 8)])
    with pytest.raises(ValueError, match="at least one"):
        memory.compare()
