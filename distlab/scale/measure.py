"""One training step of a simulated rank's stage under fake tensors, and what is read off it
(`RankReport`):

- parameters, gradients and Adam's state: the bytes of the real local shards after the step;
- activations: the bytes one microbatch's forward leaves alive for backward (MemTracker's
  activation memory after the forward: what autograd saved, selective checkpointing's cache,
  the loss), times the microbatches the stage holds at once (1F1B);
- the peak: MemTracker over the whole step (every microbatch's forward and backward and the
  optimizer's step; a pipeline's step replayed in its schedule's order, see `replay`);
- FLOPs of forward and backward (`instruments.LocalFlops`), the bytes its memory-bound ops
  move (forward and backward; the optimizer's step apart), and every collective with its
  bytes and mesh axis (`instruments.Collectives`).

torch's private pieces (fake tensors, MemTracker, DTensor's shape propagation) are reached
through `distlab._torch_simulation`.
"""

from __future__ import annotations

import contextlib
from collections import Counter

import torch
import torch.nn.functional as F

from .. import _torch, _torch_simulation
from .instruments import Collectives, LocalFlops
from .mesh import coords_of, rank_of
from .pipeline import PipelineStep
from .pipeline import in_flight as pipeline_in_flight
from .replay import PartRecorder
from .report import RankReport


def measure_step(config, layout, stage, names, module, every_microbatch=False,
                 real=False) -> RankReport:
    """Run one step of ``module`` (pipeline rank ``stage`` of ``layout``, built by `plan_order`;
    an ``nn.ModuleList`` of its stages when interleaved) under fake tensors and read the
    `RankReport` off it; ``names``: ``{group name: mesh axis}`` (`mesh.group_names`). A
    pipeline's step is measured with a few microbatches and replayed in its schedule's order
    (`replay`), or with ``every_microbatch`` run whole (slow at real sizes; equal to the byte).
    ``real``: the same step with real tensors, on a rank of a real process group (`real_ranks`):
    the parameters get real memory and small random values instead of fake storage."""
    rank, dims = rank_of({"pp": stage}, layout.mesh_shape), layout.mesh_shape
    chunks = list(module) if isinstance(module, torch.nn.ModuleList) else [module]
    b, s = layout.micro_batch, layout.seq_len // layout.cp
    act_dtype = torch.bfloat16 if layout.precision == "bf16-fsdp2" else torch.float32
    flops, comms = LocalFlops(), Collectives(names)
    last = stage == layout.pp - 1
    parallel_loss = last and layout.tp > 1 and layout.loss_parallel
    tensors = contextlib.nullcontext() if real else _torch_simulation.fake_tensors()
    with tensors, _torch_simulation.unseen_shape_propagation():
        module.to_empty(device="cpu")
        if real:  # to_empty's memory holds anything: values a step can compute with
            with torch.no_grad():
                for p in module.parameters():
                    _torch.local_tensor(p).normal_(0.0, 0.02)
        optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4, fused=True)
        _steady_state(module, optimizer)
        tracker = _torch_simulation.rank_peak_tracker()
        tracker.track_external(module, optimizer)
        first_forward = _FirstForward(tracker, module)

        def loss_fn(out, targets):
            loss = F.cross_entropy(out.flatten(0, 1).float(), targets.flatten())
            if layout.pp > 1:  # the schedule keeps the logits too (its output chunks)
                first_forward.done(chunks[-1])  # the loss's activations count with its forward
            return loss

        # The tracker innermost: it runs a DTensor op itself, and the counters must see the
        # local ops inside it (they pass DTensor ops on and count what DTensor runs).
        with tracker, flops, comms, _loss_parallel(parallel_loss), first_forward.hooks(chunks):
            replayed = None
            if layout.pp > 1:
                step = PipelineStep(chunks, layout, stage, module.pp_group, config, act_dtype)
                microbatches = step.microbatches
                order = step.order(loss_fn)  # the schedule built once: counted, then replayed
                in_flight = pipeline_in_flight(order)
                recorder = None if every_microbatch else PartRecorder(tracker, flops, comms)
                replayed = step.run(loss_fn, recorder, order)
            else:
                _accumulate(module, layout, config, loss_fn, first_forward)
                in_flight, microbatches = 1, layout.accumulate
            before_optimizer, moved_before = tracker.open_window(), Counter(flops.moved_by_op)
            home_before = tracker.home_window
            optimizer.step()
            optimizer_rise = tracker.window - before_optimizer
            home_rise = tracker.home_window - home_before
            optimizer_moved = flops.moved - sum(moved_before.values())
        if replayed is None:
            peak = _bytes(tracker.get_tracker_snapshot("peak"), "Total")
            home_peak = tracker.home_peak
            step_flops, calls = flops.total, tuple(comms.calls)
            step_moved = moved_before
        else:  # the step replayed in the schedule's order, then the optimizer's step
            peak = max(replayed.peak, replayed.end + optimizer_rise)
            home_peak = max(replayed.home_peak, replayed.home_end + home_rise)
            step_flops, calls, step_moved = replayed.flops, replayed.calls, replayed.moved
        # the caching allocator's pools: the side streams' blocks are not the default's
        side = sum(tracker.side_peaks.values())
        numel, p_bytes, g_bytes, opt, steps = _state_bytes(module, optimizer)
    by_op = {op: n // microbatches for op, n in step_moved.most_common() if n >= microbatches}
    return RankReport(
        model=config, layout=layout, rank=rank, coords=coords_of(rank, dims), stage=stage,
        layers=module.layer_ids, numel=numel, params=p_bytes, grads=g_bytes, optimizer=opt,
        optimizer_other=steps, activations=first_forward.total, in_flight=in_flight,
        peak=peak, reserved=home_peak + side, side_streams=side,
        flops=step_flops // microbatches, tokens=b * s,
        microbatches=microbatches, collectives=calls,
        moved=sum(step_moved.values()) // microbatches, moved_by_op=by_op,
        optimizer_moved=optimizer_moved,
    )


def _accumulate(module, layout, config, loss_fn, first_forward) -> None:
    """No pipeline: ``layout.accumulate`` microbatches, forward and backward one after another
    (gradient accumulation), as a training loop runs them."""
    b, s = layout.micro_batch, layout.seq_len // layout.cp
    for micro in range(layout.accumulate):
        if layout.accumulate > 1 and layout.zero == 3:
            # FSDP2: reduce-scatter only after the last microbatch, unless told to after every
            # one (then each microbatch's gradients are sharded at once)
            module.set_requires_gradient_sync(
                layout.sync_each_microbatch or micro == layout.accumulate - 1)
        loss = loss_fn(module(torch.randint(0, config.vocab, (b, s))),
                       torch.randint(0, config.vocab, (b, s)))
        first_forward.done(module)  # after the loss, the logits freed: what backward keeps
        loss.backward()


class _FirstForward:
    """The bytes each stage's first forward leaves alive for backward (what autograd saved,
    selective checkpointing's cache, the stage's output; on the last stage the loss too),
    added over the rank's stages: one microbatch's activations. MemTracker's activation
    memory, less the gathered parameters FSDP keeps after forward (it files them as
    activations, having seen them made during the forward)."""

    def __init__(self, tracker, module):
        self.tracker, self.module = tracker, module
        self.before, self.seen, self.total = {}, set(), 0

    def _now(self) -> int:
        params = {id(_torch.local_tensor(p).untyped_storage()) for p in self.module.parameters()}
        return _torch_simulation.activation_bytes(self.tracker, leave_out=params)

    def start(self, chunk) -> None:
        if id(chunk) not in self.seen and id(chunk) not in self.before:
            self.before[id(chunk)] = self._now()

    def done(self, chunk) -> None:
        if id(chunk) in self.before and id(chunk) not in self.seen:
            self.seen.add(id(chunk))
            self.total += self._now() - self.before[id(chunk)]

    @contextlib.contextmanager
    def hooks(self, chunks):
        last = chunks[-1] if chunks[-1].output is not None else None
        handles = []
        for chunk in chunks:
            handles.append(chunk.register_forward_pre_hook(lambda m, args: self.start(m)))
            if chunk is not last:  # the last stage's forward ends with its loss
                handles.append(chunk.register_forward_hook(lambda m, args, out: self.done(m)))
        try:
            yield
        finally:
            for h in handles:
                h.remove()


def _state_bytes(module, optimizer) -> tuple[int, int, int, int, int]:
    def local(t):
        t = _torch.local_tensor(t)
        return t.numel() * t.element_size()

    params = list(module.parameters())
    numel = sum(_torch.local_tensor(p).numel() for p in params)
    p_bytes = sum(local(p) for p in params)
    g_bytes = sum(local(p.grad) for p in params if p.grad is not None)
    opt, steps = 0, 0
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                if key == "step":
                    steps += local(value)
                else:
                    opt += local(value)
    return numel, p_bytes, g_bytes, opt, steps


def _loss_parallel(on: bool):
    if not on:
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


def _steady_state(module, optimizer) -> None:
    """A step in the middle of training: Adam's state there already (its first step creates
    it), gradients freed by ``zero_grad()``."""
    for p in module.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _bytes(snapshot: dict, kind: str) -> int:
    """The bytes of one kind ("ACT", "Total", ...) in a MemTracker snapshot, over devices."""
    return int(sum(v for per_device in snapshot.values() for k, v in per_device.items()
                   if str(k).rsplit(".", 1)[-1] == kind))
