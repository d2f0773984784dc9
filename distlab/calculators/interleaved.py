"""An interleaved pipeline rank's memory: its stages' estimates and its peak along torch's order.

Under ``Interleaved1F1B`` a pipeline rank r of ``pp`` holds ``virtual_stages`` stages (r,
r + pp, ...). The memory calculator (`memory_estimate`) asks here for the estimate of each of
the rank's stages (as a stage of a pp x v pipeline, as `distlab.scale` lays an interleaved
pipeline out), for how many stage-microbatches the rank holds at once, and for its peak: a walk
moment by moment along the order torch's ``ScheduleInterleaved1F1B`` runs (`pipeline`'s
``_interleaved``), stage by stage.

The one home of an interleaved rank's bytes; `pipeline` knows the order only, never bytes.
"""

from __future__ import annotations

import dataclasses

from .pipeline import _interleaved, _peak

__all__ = ["chunks", "in_flight", "peak"]


def chunks(m, layout, stage: int, estimate) -> tuple:
    """The estimates (``estimate(model, layout, stage)``, the calculator's) of each of the
    stages pipeline rank ``stage`` holds, each as a stage of a ``pp x v`` pipeline with one
    stage per rank and the rank's microbatches."""
    total = layout.pp * layout.virtual_stages
    flat = dataclasses.replace(layout, pp=total, virtual_stages=1, schedule="1F1B",
                               microbatches=layout.steps)
    return tuple(estimate(m, flat, g) for g in range(stage, total, layout.pp))


def in_flight(layout, stage: int) -> int:
    """Stage-microbatches (each 1/v of the rank's layers) rank ``stage`` holds at once."""
    return _peak(_interleaved(stage, layout.pp, layout.steps, layout.virtual_stages))


def peak(est, sharded_grads: bool = True) -> int:
    """The peak of an interleaved rank (a `MemoryEstimate` with ``chunks``, the calculator's
    estimates of the rank's stages), moment by moment along torch's order: each stage holds its
    parameters gathered from its first forward to its last backward, its unsharded gradients
    from its first backward to its last (then reduce-scattered to its own shard, the stage's
    ``grads``), and a microbatch's activations from that forward to its backward. Adding the
    largest parts (the formula for one stage per rank) would count every stage's gathered
    parameters and gradients as alive at once, which the schedule never holds: on Llama-3 405B
    at PP 8 x v 2 that overestimated PyTorch's own schedule (simulated) by 28-40%. Without
    ``sharded_grads``: the peak of all but the sharded gradients (FSDP2 makes them on its
    reduce-scatter stream: `MemoryEstimate.reserved`)."""
    p, parts = est.pp, est.chunks
    order = _interleaved(est.stage, p, est.layout.steps, est.virtual_stages)
    last_b = {stage // p: i for i, (kind, stage, _) in enumerate(order) if kind == "B"}
    # each stage's share of the rank's sharded gradients, in proportion to its unsharded ones
    # (the rank's whole shard, est.grads, as FSDP2 pads and shards it)
    unsharded = sum(c.unsharded_grads for c in parts) or 1
    shard = [est.grads * c.unsharded_grads // unsharded for c in parts]
    started, backward = set(), set()
    activations = most = 0
    base = est.params + est.optimizer + est.buffers
    for i, (kind, stage, _) in enumerate(order):
        c = stage // p
        chunk = parts[c]
        if kind == "F":
            started.add(c)
            activations += chunk.per_microbatch
        else:
            backward.add(c)
        done = {k for k in backward if last_b[k] < i}
        gathered = sum(parts[k].gathered for k in started - done)
        grads = est.grads if sharded_grads else 0
        if est.unsharded_grads:  # a finished stage holds its own shard of the gradients
            grads = (sum(parts[k].unsharded_grads for k in backward - done)
                     + sharded_grads * sum(shard[k] for k in done))
        now = base + gathered + grads + activations
        if kind == "F":
            most = max(most, now + chunk.loss_transient)
        else:
            late = max(est.recomputed, chunk.embedding_grad - chunk.per_microbatch, 0)
            most = max(most, now + late)
            activations -= chunk.per_microbatch
    return most
