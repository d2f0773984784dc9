"""The bytes a simulated rank's memory-bound ops move (`scale.instruments.moved_bytes`, counted
by `LocalFlops` beside the FLOPs) and the step-time term that times them
(`calculators.step_time(memory_bound=...)`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from distlab.calculators import PRESETS, CalculatorError, Transformer, step_time
from distlab.calculators.steptime import H100_HBM
from distlab.scale.instruments import LocalFlops
from distlab.scale.model import RMSNorm


def _moved(fn, *args):
    with LocalFlops() as counter:
        fn(*args)
    return counter.moved, counter.total, dict(counter.moved_by_op)


def test_an_elementwise_op_reads_its_inputs_and_writes_its_output():
    x = torch.ones(4, 8, dtype=torch.bfloat16)  # 64 bytes
    assert _moved(F.silu, x)[0] == 2 * 64
    assert _moved(torch.add, x, x)[0] == 3 * 64
    assert _moved(lambda t: t.float(), x)[0] == 64 + 128  # a cast: 2 bytes in, 4 out


def test_views_allocations_and_matmuls_move_nothing_here():
    x = torch.ones(8, 8)
    moved, flops, _ = _moved(lambda t: (t.t(), t.view(64), t[2:], torch.empty(3, 3)), x)
    assert moved == 0 and flops == 0
    moved, flops, _ = _moved(torch.mm, x, x)
    assert moved == 0 and flops == 2 * 8 * 8 * 8  # a matmul is timed by its FLOPs


def test_a_gather_reads_the_rows_it_picks_not_the_table():
    table = torch.ones(1000, 16)  # 64,000 bytes
    ids = torch.tensor([1, 2, 3])  # 24 bytes
    moved, _, by_op = _moved(F.embedding, ids, table)
    assert moved == 24 + 2 * 3 * 16 * 4 and set(by_op) == {"aten.embedding"}


def test_copy_reads_its_source_once_and_an_in_place_update_writes_its_tensors():
    dst, src = torch.zeros(10), torch.ones(10)
    assert _moved(dst.copy_, src)[0] == 2 * 40
    assert _moved(dst.copy_, src.bfloat16())[0] == 20 + 40  # bf16 read, fp32 written
    assert _moved(dst.zero_)[0] == 40  # a fill writes, reads nothing
    assert _moved(torch.zeros_like, src)[0] == 40
    big = torch.zeros(1000)
    assert _moved(big.index_put_, (torch.tensor([3, 5]),), torch.ones(2))[0] == 16 + 2 * 8
    p, g = torch.nn.Parameter(torch.ones(100)), torch.ones(100)
    p.grad = g
    opt = torch.optim.AdamW([p], fused=True)
    opt.step()  # the moments made
    moved, _, by_op = _moved(opt.step)
    # reads parameter, gradient, both moments and the 4-byte step counter; writes parameter and
    # moments (the gradient only when it unscales it: no grad_scale here; the step is counted
    # up by another op): 28 bytes a parameter, as the fused formula counts
    assert by_op["aten._fused_adamw_"] == (4 * 400 + 4) + 3 * 400


def test_rmsnorm_forward_moves_what_its_eager_ops_read_and_write():
    norm = RMSNorm(16).to(torch.bfloat16)  # as FSDP's mixed precision hands it: weight 32 B
    x = torch.ones(2, 16, dtype=torch.bfloat16)  # 64 bytes; fp32 copies 128
    moved, _, by_op = _moved(norm, x)
    # x.float(), pow, mean, + eps, rsqrt, x32 * rstd, type_as, * weight
    rows = 2 * 4  # one fp32 value per row
    expected = ((64 + 128) + (128 + 128) + (128 + rows) + (rows + rows) + (rows + rows)
                + (128 + rows + 128) + (128 + 64) + (64 + 32 + 64))
    assert moved == expected, by_op


SMALL = Transformer("small", vocab=512, hidden=64, intermediate=192, layers=4, heads=4,
                    kv_heads=2)


def test_the_fused_term_counts_each_elementwise_region_once():
    tokens, tp = 256, 2
    t = step_time(SMALL, tp=tp, seq_len=tokens, checkpointing="none")
    x, hd = tokens // tp * 64, 64 // 4
    qk, f = tokens * (4 + 2) // tp * hd, tokens * 192 // tp
    forward = 2 * 4 * x + 2 * 6 * x + 4 * qk + 6 * f  # norms, residual adds, RoPE, SwiGLU
    backward = 2 * 6 * x + 2 * 6 * x + 4 * qk + 10 * f
    loss = 4 * tokens * 512 // tp  # fused cross-entropy on the (only, last) stage
    term = next(x for x in t.terms if x.what == "memory-bound kernels")
    assert term.seconds == pytest.approx((4 * (forward + backward) + loss) / H100_HBM)
    # recomputing the elementwise forward (torchtitan's op-level policy) adds one forward
    again = step_time(SMALL, tp=tp, seq_len=tokens, checkpointing="op-selective")
    term2 = next(x for x in again.terms if x.what == "memory-bound kernels")
    assert term2.seconds - term.seconds == pytest.approx(4 * forward / H100_HBM)


def test_the_eager_term_times_the_simulated_ranks_bytes_per_layer():
    report = SimpleNamespace(moved=10**12, optimizer_moved=3 * 10**10, layers=tuple(range(4)),
                             collectives=(), layout=SimpleNamespace(accumulate=1))
    m = PRESETS["Llama-3 405B"]
    t = step_time(m, tp=8, pp=16, dp=128, microbatches=16, memory_bound="eager",
                  report=report, hbm_bandwidth=2e12)
    terms = {x.what: x for x in t.terms}
    # the report's 4 layers moved 1e12 bytes; the slowest stage has 8
    assert "compute, 8 layers" in terms
    assert terms["memory-bound kernels"].seconds == pytest.approx(2 * 1e12 / 2e12)
    assert terms["optimizer step"].seconds == pytest.approx(3e10 / 2e12)
    none = step_time(m, tp=8, pp=16, dp=128, microbatches=16, memory_bound="none")
    assert not any("memory-bound" in x.what or "optimizer" in x.what for x in none.terms)
    assert none.seconds < step_time(m, tp=8, pp=16, dp=128, microbatches=16).seconds


def test_eager_without_a_simulated_rank_and_a_bad_bandwidth_say_what_to_give():
    with pytest.raises(CalculatorError, match="report=distlab.scale.simulate_rank"):
        step_time("Llama-3 8B", memory_bound="eager")
    with pytest.raises(CalculatorError, match="memory_bound"):
        step_time("Llama-3 8B", memory_bound="fast")
    with pytest.raises(CalculatorError, match="3.35e12"):
        step_time("Llama-3 8B", hbm_bandwidth=0)
