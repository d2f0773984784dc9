"""distlab.scale against real ranks: notebook 24's 2 x 2 (dp x tp) and notebook 26's 2 x 2 x 2
(pp x dp x tp, 1F1B with 2 microbatches) laid out by `distlab.scale` on real gloo ranks
(`scale.real_ranks`: the simulation's own model, plans and step, with real tensors) and on
simulated ones (`simulate_rank`, a fake process group), for a tiny Llama.

What must agree, on every real rank against the simulated rank of its stage:

- the shards: every parameter's local shape, the bytes of parameters, gradients and Adam's
  state, exactly;
- the collectives: per mesh axis, kind and group size, how many and their bytes, exactly, but
  for the one thing only a real pipeline does: torch >= 2.14's schedule votes on static shapes
  before its first step (one int32 sent to the next stage and the result sent back: one 4-byte
  send and one 4-byte receive per pipeline rank), which it skips on a fake process group;
- microbatches in flight and FLOPs, exactly;
- activations, exactly but for a collective's buffer that gloo's worker thread still holds a
  moment after the rank waited for it and let go: the loss's 128-byte all-reduce, measured
  with the activations right after it, on 4 of 72 rank-steps (six runs of both layouts; right
  after ``wait_tensor``, about one gloo all-reduce in ten still has its buffer alive). The
  fake backend holds nothing; the test allows the largest tensor-parallel buffer (4,096 bytes);
- the peak (MemTracker's, the bytes of live tensors), equal to running every microbatch
  simulated (but for a buffer gloo still holds, as above; 0 bytes on 72 rank-steps, 128 once
  in an earlier run): on the 2 x 2, 891,300 bytes; on the pipeline's first and last stage,
  692,560 and 704,708. That is with gloo's own reduce-scatter buffer set aside
  (`real_ranks.measure_rank`'s ``gloo_buffers``): gloo reduces a copy of the whole input and
  copies this rank's chunk out when it is waited on, an input-sized buffer that NCCL and the
  fake backend do not make; counted, it lifts the 2 x 2's peak to 905,764 bytes (74,240
  bytes, one block's fp32 gradients, during block 3's reduce-scatter). `simulate_rank`'s
  default, three microbatches measured and the schedule replayed (`scale.replay`), is at most
  one residual-stream tensor under running every microbatch (`tests/test_scale_pipeline.py`):
  2,048 bytes on the last stage here (and 4 more when it is not the first step of its
  process: the first step leaves a 4-byte tensor alive that later ones find made).
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

import distlab
from distlab import scale
from distlab.calculators import Transformer
from distlab.scale import real_ranks

TINY = Transformer("tiny", vocab=256, hidden=64, intermediate=128, layers=4, heads=4,
                   kv_heads=2)
L = scale.Layout
LAYOUTS = {
    "notebook 24: dp 2 x tp 2": L(dp=2, tp=2, seq_len=32),
    "notebook 26: pp 2 x dp 2 x tp 2, 1F1B": L(pp=2, dp=2, tp=2, seq_len=32),
}


def _simulate_each(cases):
    """Per case ``(layout, stage)``, in a process of its own: `simulate_rank` (the schedule
    replayed), the same with every microbatch run, and the local shapes of the rank's shards."""

    def run(cases):
        from distlab.scale import simulate_rank, simulated
        from distlab.scale.real_ranks import local_shapes

        layout, stage = cases[int(os.environ["RANK"])]
        with simulated(TINY, layout, stage) as (module, _):
            shapes = local_shapes(module)
        whole = simulate_rank(TINY, layout, stage, every_microbatch=True) if layout.pp > 1 \
            else None
        return simulate_rank(TINY, layout, stage), whole, shapes

    return distlab.launch(run, cases, world_size=len(cases), backend=None, timeout=240,
                          threads=1)


@pytest.fixture(scope="module")
def measured():
    """``{layout name: [(real report, real shapes, simulated, simulated whole, simulated
    shapes) for each real rank]}``."""
    cases = [(layout, stage) for layout in LAYOUTS.values() for stage in range(layout.pp)]
    simulated = dict(zip(cases, _simulate_each(cases), strict=True))
    out = {}
    for name, layout in LAYOUTS.items():
        rows = []
        for report, shapes in real_ranks.run(TINY, layout, timeout=120):
            sim, whole, sim_shapes = simulated[layout, report.stage]
            rows.append((report, shapes, sim, whole or sim, sim_shapes))
        out[name] = rows
    return out


def _calls(report) -> Counter:
    """``{(axis, kind, group size): [calls, bytes]}``."""
    out = Counter()
    for c in report.collectives:
        out[c.axis, c.kind, c.ranks, "calls"] += 1
        out[c.axis, c.kind, c.ranks, "bytes"] += c.nbytes
    return out


def _differ(real: Counter, simulated: Counter) -> dict:
    """``{key: (real, simulated)}`` where the two differ."""
    return {k: (real[k], simulated[k]) for k in sorted(set(real) | set(simulated), key=str)
            if real[k] != simulated[k]}


def _pipeline_vote(layout, stage) -> Counter:
    """What a real pipeline rank sends before its first step and a fake one does not. torch
    2.14: its vote on static shapes, an int32 forward to the last stage and the result back.
    torch 2.15: the vote is an all-reduce (MIN) over the pipeline group, then each pair of
    neighbours connects (the lower rank sends an int32 to the higher) and the group meets in a
    second all-reduce (``pipelining._p2p``); for the 2 pipeline ranks here."""
    if layout.pp == 1:
        return Counter()
    if not distlab.torch_at_least("2.15"):
        return Counter({("pp", kind, layout.pp, what): n for kind in ("send", "recv")
                        for what, n in (("calls", 1), ("bytes", 4))})
    assert layout.pp == 2, "the 2.15 count below is for two pipeline ranks"
    kind = "send" if stage == 0 else "recv"
    return Counter({("pp", "all_reduce", 2, "calls"): 2, ("pp", "all_reduce", 2, "bytes"): 8,
                    ("pp", kind, 2, "calls"): 1, ("pp", kind, 2, "bytes"): 4})


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_real_rank_holds_the_shards_the_simulation_lays_out(measured, name):
    for real, shapes, sim, _, sim_shapes in measured[name]:
        where = f"{name}, rank {real.rank} (stage {real.stage})"
        assert _differ(Counter(shapes), Counter(sim_shapes)) == {}, where
        assert len(shapes) > 0, where
        for field in ("layers", "numel", "params", "grads", "optimizer", "optimizer_other"):
            assert getattr(real, field) == getattr(sim, field), (where, field)


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_real_rank_issues_the_collectives_simulated_per_mesh_axis(measured, name):
    layout = LAYOUTS[name]
    for real, _, sim, whole, _ in measured[name]:
        where = f"{name}, rank {real.rank} (stage {real.stage})"
        assert _differ(_calls(real), _calls(sim) + _pipeline_vote(layout, real.stage)) == {}, where
        assert _differ(_calls(whole), _calls(sim)) == {}, where
        axes = {axis for axis, *_ in _calls(real)}
        assert axes == {axis for axis, size in layout.mesh_shape.items() if size > 1}, where


def _held(real) -> int:
    """The most bytes a real rank's memory may show of a collective it has waited for and let
    go of: gloo's worker thread can still hold its buffer a moment (the largest
    tensor-parallel call's buffer bounds it)."""
    return max(c.nbytes for c in real.collectives if c.axis == "tp")


@pytest.mark.parametrize("name", LAYOUTS)
def test_activations_and_flops_of_every_real_rank_are_the_simulated_ones(measured, name):
    for real, _, sim, _, _ in measured[name]:
        where = f"{name}, rank {real.rank} (stage {real.stage})"
        for field in ("in_flight", "microbatches", "flops", "tokens"):
            assert getattr(real, field) == getattr(sim, field), (where, field)
        assert 0 <= real.activations - sim.activations <= _held(real), (
            where, real.activations, sim.activations)


@pytest.mark.parametrize("name", LAYOUTS)
def test_the_real_peak_is_the_simulated_one(measured, name):
    layout = LAYOUTS[name]
    stream = layout.micro_batch * layout.seq_len // layout.tp * TINY.hidden * 2  # bf16
    for real, _, sim, whole, _ in measured[name]:
        where = f"{name}, rank {real.rank} (stage {real.stage})"
        # torch 2.15's pipeline schedule lets go of two of the first stage's stream-sized buffers
        # earlier on real gloo ranks than on the fake process group (measured: 4,092 bytes below
        # on stage 0, as much above as 2.14 on stage 1; not yet pinned down)
        below = 2 * stream if layout.pp > 1 and distlab.torch_at_least("2.15") else 0
        assert -below <= real.peak - whole.peak <= _held(real), (where, real.peak, whole.peak)
        # one stream tensor, and a few bytes: a scalar that the first step of a process
        # leaves alive (the replayed step runs second here), as tests/test_scale_pipeline.py
        # (on torch 2.15 the replay is 4 bytes above on stage 0: the same scalar, the other way)
        assert -8 <= whole.peak - sim.peak <= stream + 8, (where, whole.peak, sim.peak)
