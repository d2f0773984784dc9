"""A simulated pipeline rank's step as PyTorch's pipeline schedules run it: every microbatch's
forward and backward in the schedule's order, with what `PipelineStage` does to FSDP between
them, on the fake process group.

    step = PipelineStep(chunks, layout, pp_rank, pp_group, config)
    step.run(loss_fn)            # ScheduleGPipe / Schedule1F1B / ScheduleInterleaved1F1B.step

What runs is torch's own code (``torch.distributed.pipelining``): the stage objects, the
schedule's order (``schedule.pipeline_order``), its sends and receives (which the fake
backend completes at once, with nothing in them: fake tensors have no values), and
``PipelineStage.backward_maybe_with_nosync``: with FSDP2, every microbatch's backward runs with
``set_requires_gradient_sync(False)`` and ``set_reshard_after_backward(False)``, so the
unsharded gradients (fp32: FSDP2 accumulates them in ``reduce_dtype``) and the gathered
parameters stay for the whole step, and ``perform_reduce_grad`` reduce-scatters once, after the
last backward.

Shapes: a schedule learns the shapes a stage receives from its neighbour (dynamic inference, a
``recv_object_list`` a fake backend cannot fill). Here every stage is given them statically,
``PipelineStage(input_args=..., output_args=...)``: the residual stream, (micro_batch,
tokens / tp with sequence parallelism, hidden), in the compute dtype. That is what a real run
with shape inference would find; torch >= 2.14 decides "static" on a fake process group without
voting. It replaces the old formula ``peak of one microbatch + (in flight - 1) x activations``
(and is what torchtitan's dry runs leave out: they fake the ranks but step no pipeline).

Knows nothing about how a stage is built or what is read off it: `plan_order` and `measure` do.
"""

from __future__ import annotations

import torch

__all__ = ["SCHEDULES", "PipelineStep", "chunk_indices", "in_flight"]

#: The schedules a simulated pipeline rank runs, by the names torch gives them.
SCHEDULES = ("1F1B", "GPipe", "Interleaved1F1B")


def chunk_indices(layout, pp_rank: int) -> list[int]:
    """The pipeline stages (of ``pp x virtual_stages``) pipeline rank ``pp_rank`` holds: one,
    or with interleaving ``pp_rank, pp_rank + pp, ...`` (torch's loop-style placement)."""
    return [pp_rank + k * layout.pp for k in range(layout.virtual_stages)]


def _schedule_class(name: str):
    from torch.distributed import pipelining

    return {"1F1B": pipelining.Schedule1F1B, "GPipe": pipelining.ScheduleGPipe,
            "Interleaved1F1B": pipelining.ScheduleInterleaved1F1B}[name]


def in_flight(order) -> int:
    """The most microbatches whose forward has run and backward not yet, over a rank's part of
    ``schedule.pipeline_order``, counted per stage chunk and added (interleaving holds several
    chunks' microbatches at once)."""
    live, most = 0, 0
    for action in order:
        if action is None:
            continue
        kind = action.computation_type.value  # "F", "B" (full backward), "I" (input's), ...
        live += {"F": 1, "B": -1, "I": -1}.get(kind, 0)
        most = max(most, live)
    return most


class PipelineStep:
    """The pipeline stages ``chunks`` (`model.Llama` modules laid out by `plan_order`, one per
    index of `chunk_indices`) as `PipelineStage` objects, under PyTorch's schedule
    ``layout.schedule`` with ``layout.microbatches`` (default ``pp``) microbatches."""

    def __init__(self, chunks, layout, pp_rank: int, group, config, act_dtype):
        from torch.distributed.pipelining import PipelineStage

        self.layout, self.config = layout, config
        self.microbatches = layout.microbatches or layout.pp
        total = layout.pp * layout.virtual_stages
        b, s = layout.micro_batch, layout.seq_len // layout.cp
        # the residual stream between stages: sharded by sequence with SP
        rows = s // layout.tp if layout.tp > 1 and layout.sequence_parallel else s
        # requires_grad: the metadata says a gradient comes back (without it, none is received)
        stream = torch.empty(b, rows, config.hidden, dtype=act_dtype, requires_grad=True)
        parallel_loss = layout.tp > 1 and layout.loss_parallel
        vocab = config.vocab // layout.tp if parallel_loss else config.vocab
        self.stages = []
        for index, chunk in zip(chunk_indices(layout, pp_rank), chunks, strict=True):
            inputs = torch.empty(b, s, dtype=torch.long) if index == 0 else stream
            # the last stage's output is its logits; it goes to the loss, not to a neighbour
            logits = torch.empty(b, s, vocab, dtype=act_dtype, requires_grad=True)
            outputs = logits if index == total - 1 else stream
            self.stages.append(PipelineStage(chunk, index, total, torch.device("cpu"),
                                             input_args=inputs, output_args=outputs,
                                             group=group))
        self.first = any(st.is_first for st in self.stages)
        self.last = any(st.is_last for st in self.stages)

    def schedule(self, loss_fn):
        cls = _schedule_class(self.layout.schedule)
        if self.layout.schedule == "Interleaved1F1B":
            return cls(self.stages, self.microbatches, loss_fn=loss_fn)
        return cls(self.stages[0], self.microbatches, loss_fn=loss_fn)

    def run(self, loss_fn) -> int:
        """One step: the whole batch (``microbatches x micro_batch`` sequences) through the
        schedule. Returns the most microbatches this rank held in flight, read off the
        schedule's own order."""
        b, s = self.layout.micro_batch, self.layout.seq_len // self.layout.cp
        batch = (b * self.microbatches, s)
        # every rank is given the loss (torchtitan does too): a schedule without one runs
        # forwards only
        schedule = self.schedule(loss_fn)
        args = (torch.randint(0, self.config.vocab, batch),) if self.first else ()
        kwargs = {"target": torch.randint(0, self.config.vocab, batch)} if self.last else {}
        schedule.step(*args, **kwargs)
        return in_flight(schedule.pipeline_order[self.stages[0].group_rank])
