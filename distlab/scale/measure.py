"""One training step of a simulated rank's stage under fake tensors, and what is read off it
(`RankReport`):

- parameters, gradients and Adam's state: the bytes of the real local shards after the step;
- activations: the bytes one microbatch's forward leaves alive for backward (MemTracker's
  activation memory after the forward: what autograd saved, selective checkpointing's cache,
  the loss), times the microbatches the stage holds at once (1F1B);
- the peak: MemTracker over forward, backward and the optimizer step of one microbatch, plus
  the other microbatches' activations in flight;
- FLOPs of forward and backward (`instruments.LocalFlops`) and every collective with its bytes
  and mesh axis (`instruments.Collectives`).

torch's private pieces (fake tensors, MemTracker, DTensor's shape propagation) are reached
through `distlab._torch_simulation`.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from .. import _torch, _torch_simulation
from .instruments import Collectives, LocalFlops
from .layout import Layout
from .mesh import coords_of, rank_of
from .report import RankReport


def measure_step(config, layout, stage, names, model) -> RankReport:
    """Run one step of ``model`` (stage ``stage`` of ``layout``, built by `plan_order`) under
    fake tensors and read the `RankReport` off it; ``names``: ``{group name: mesh axis}``
    (`mesh.group_names`)."""
    rank, dims = rank_of({"pp": stage}, layout.mesh_shape), layout.mesh_shape

    b, s = layout.micro_batch, layout.seq_len // layout.cp
    first, last = stage == 0, stage == layout.pp - 1
    act_dtype = torch.bfloat16 if layout.precision == "bf16-mixed" else torch.float32
    flops, comms = LocalFlops(), Collectives(names)
    parallel_loss = last and layout.tp > 1 and layout.loss_parallel
    with _torch_simulation.fake_tensors(), _torch_simulation.unseen_shape_propagation():
        model.to_empty(device="cpu")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        _steady_state(model, optimizer)
        if first:
            x = torch.randint(0, config.vocab, (b, s))
        else:  # the previous stage's output: the residual stream, sharded by sequence with SP
            rows = s // layout.tp if layout.tp > 1 and layout.sequence_parallel else s
            x = torch.empty(b, rows, config.hidden, dtype=act_dtype, requires_grad=True)
        tracker = _torch_simulation.rank_peak_tracker()
        tracker.track_external(model, optimizer)
        # The tracker innermost: it runs a DTensor op itself, and the counters must see the
        # local ops inside it (they pass DTensor ops on and count what DTensor runs).
        with tracker, flops, comms:
            for micro in range(layout.accumulate):  # gradient accumulation (data parallel)
                tracker.reset_mod_stats()  # per-module stats of one forward; the peak stays
                if layout.accumulate > 1 and layout.zero == 3:
                    # FSDP2: reduce-scatter only after the last microbatch, unless told to
                    # after every one (then each microbatch's gradients are sharded at once)
                    model.set_requires_gradient_sync(
                        layout.sync_each_microbatch or micro == layout.accumulate - 1)
                with _loss_parallel(parallel_loss):
                    out = model(x)
                    if last:
                        targets = torch.randint(0, config.vocab, (b * s,))
                        out = F.cross_entropy(out.flatten(0, 1).float(), targets)
                    if micro == 0:
                        activations = _activations(tracker, model)
                    out.backward(None if last else torch.empty_like(out))
            optimizer.step()
        peak = tracker.get_tracker_snapshot("peak")
        numel, p_bytes, g_bytes, opt, steps = _state_bytes(model, optimizer)
    peak_bytes = _bytes(peak, "Total")
    return RankReport(
        model=config, layout=layout, rank=rank, coords=coords_of(rank, dims), stage=stage,
        layers=model.layer_ids, numel=numel, params=p_bytes, grads=g_bytes, optimizer=opt,
        optimizer_other=steps, activations=activations, in_flight=_in_flight(layout, stage),
        peak_one_microbatch=int(peak_bytes), flops=flops.total // layout.accumulate, tokens=b * s,
        collectives=tuple(comms.calls),
    )


def _state_bytes(model, optimizer) -> tuple[int, int, int, int, int]:
    def local(t):
        t = _torch.local_tensor(t)
        return t.numel() * t.element_size()

    params = list(model.parameters())
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


def _steady_state(model, optimizer) -> None:
    """A step in the middle of training: Adam's state there already (its first step creates
    it), gradients freed by ``zero_grad()``."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _activations(tracker, model) -> int:
    """What the forward left alive for backward (selective checkpointing's cache too; a
    stage's output, kept for its backward), less the gathered parameters FSDP keeps after
    forward (a module with ``reshard_after_forward=False``): MemTracker files them as
    activations, having seen them made during the forward."""
    params = set()
    for p in model.parameters():  # FSDP's unsharded parameters are registered now
        params.add(id(_torch.local_tensor(p).untyped_storage()))
    return _torch_simulation.activation_bytes(tracker, leave_out=params)


def _bytes(snapshot: dict, kind: str) -> int:
    """The bytes of one kind ("ACT", "Total", ...) in a MemTracker snapshot, over devices."""
    return int(sum(v for per_device in snapshot.values() for k, v in per_device.items()
                   if str(k).rsplit(".", 1)[-1] == kind))


def _in_flight(layout: Layout, stage: int) -> int:
    """Microbatches whose activations stage ``stage`` holds at once under 1F1B."""
    return min(layout.pp - stage, layout.microbatches or layout.pp)
