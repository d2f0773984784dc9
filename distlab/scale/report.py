"""`RankReport`: what one simulated rank holds and does in one step, as `simulate` reads it off."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .layout import Layout

__all__ = ["RankReport"]


@dataclass(frozen=True)
class RankReport:
    """What one simulated rank holds and does in one step (bytes, FLOPs, collectives).

    ``rank`` and ``coords`` (its place on the mesh), ``stage`` (pipeline stage) and ``layers``
    it holds; ``numel`` parameters it holds a shard of; ``params``, ``grads``, ``optimizer``:
    bytes of its local shards after the step (Adam's per-tensor step counters in
    ``optimizer_other``, apart); ``activations``: bytes saved by one microbatch's forward, and
    ``in_flight``: the most microbatches held at once (read off the pipeline schedule's order);
    ``peak``: the most bytes alive at once over the whole step (every microbatch's forward and
    backward in the schedule's order, and the optimizer step), as MemTracker saw it;
    ``flops``: forward and backward of one microbatch; ``tokens``: tokens this rank processes
    per microbatch; ``microbatches``: how many the step ran; ``collectives``: every call of the
    step (all its microbatches), in order; ``moved``: bytes read and written by the
    memory-bound ops (every op but matmuls, attention, views and collectives, each as one
    eager kernel: `instruments.moved_bytes`) of one microbatch's forward and backward, by op
    in ``moved_by_op`` (``{"aten.mul": bytes, ...}``, the largest first), and
    ``optimizer_moved`` by the optimizer's step; ``reserved``: the least the CUDA caching
    allocator must hold reserved for this step (a floor under its ``max_memory_reserved``,
    while nothing empties the cache: no ``empty_cache``, no allocation retried after a
    failure): its blocks are pooled by the stream that made them, so the peak of the bytes
    made on the default stream plus each side stream's own peak (``side_streams``: FSDP2's
    all-gather outputs, and its reduce-scatter outputs, which become the sharded gradients and
    stay reserved after ``zero_grad`` frees them); no block rounding or fragmentation counted.
    A storage resized is charged to the stream that made it (FSDP2 resizes its unsharded
    parameters on the default stream)."""

    model: object
    layout: Layout
    rank: int
    coords: dict
    stage: int
    layers: tuple
    numel: int
    params: int
    grads: int
    optimizer: int
    optimizer_other: int
    activations: int
    in_flight: int
    peak: int
    flops: int
    tokens: int
    microbatches: int = 1
    collectives: tuple = field(default=(), repr=False)
    moved: int = 0
    optimizer_moved: int = 0
    moved_by_op: dict = field(default_factory=dict, repr=False)
    reserved: int = field(default=0, repr=False)
    side_streams: int = field(default=0, repr=False)

    @property
    def states(self) -> int:
        return self.params + self.grads + self.optimizer

    def comm(self) -> dict:
        """``{(axis, kind): (calls, bytes)}`` over the step's collectives."""
        calls, nbytes = Counter(), Counter()
        for c in self.collectives:
            calls[c.axis, c.kind] += 1
            nbytes[c.axis, c.kind] += c.nbytes
        return {key: (calls[key], nbytes[key]) for key in sorted(calls)}
