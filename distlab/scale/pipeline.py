"""A simulated pipeline rank's step as PyTorch's pipeline schedules run it: every microbatch's
forward and backward in the schedule's order, with what `PipelineStage` does to FSDP between
them, on the fake process group.

    step = PipelineStep(chunks, layout, pp_rank, pp_group, config, act_dtype)
    step.run(loss_fn, recorder)  # 3 microbatches measured, the schedule's order replayed
    step.run(loss_fn)            # every microbatch: ScheduleGPipe / Schedule1F1B /
                                 # ScheduleInterleaved1F1B.step, as a training loop calls it

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

Time: every microbatch of Llama-3 405B's first stage costs about 1.3 s of fake-tensor dispatch
on a laptop's core, so a step of 16 or 32 microbatches is measured with 3 and replayed in the
schedule's order (`replay`: the same peak, to the byte, as running them all; a test checks).

Knows nothing about how a stage is built or what is read off it: `plan_order` and `measure` do.
"""

from __future__ import annotations

import contextlib

import torch

from .. import _torch_simulation
from .replay import Part, PartRecorder, replay, which

__all__ = ["FSDP", "NOT_RUN", "NO_OPS", "REPLAYED", "SCHEDULES", "SEND_WAITS", "PipelineStep",
           "chunk_indices", "in_flight", "order_of"]

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


def in_flight(actions) -> int:
    """The most microbatches whose forward has run and backward not yet, over a rank's
    `order_of` actions, counted per stage chunk and added (interleaving holds several chunks'
    microbatches at once)."""
    live, most = 0, 0
    for _, kind, _ in actions:
        live += {"F": 1, "B": -1}.get(kind, 0)
        most = max(most, live)
    return most


#: What the replay does with each kind of action torch's schedules emit (``_ComputationType``
#: names, torch 2.14 and 2.15, for the `SCHEDULES`): the kinds replayed from a measured part, by
#: the letter `order_of` gives them ...
REPLAYED = {"FORWARD": "F", "FULL_BACKWARD": "B", "REDUCE_GRAD": "R"}
#: ... FSDP's gathers and reshards: replayed ("U", "X") only between two of a stage's
#: computations; the first gather and the last reshard are in the measured parts ...
FSDP = {"UNSHARD": "U", "RESHARD": "X"}
#: ... torch 2.15's waits on sends: a runtime schedule keeps a backward send's tensors (the
#: input's gradient) until its WAIT_SEND_B, which it defers to the end of the step, where GPipe,
#: which the parts are measured under, lets go of them at once. So the bytes one such send holds
#: (measured, per stage) are replayed as held from the SEND_B ("HB") to its wait ("WB"). A
#: WAIT_SEND_F lets go of an output that the stage's cache holds until its backward, which has
#: consumed it when the wait comes later (measured: equal to running every microbatch) ...
SEND_WAITS = {"WAIT_SEND_F": "F", "WAIT_SEND_B": "B"}
#: ... and the kinds that change neither memory nor FLOPs here, with why. A kind in none of the
#: three stops the simulation with its name: a torch that adds one is caught by a test
#: (`tests/test_scale_pipeline.py`), not by a wrong peak.
NO_OPS = {
    "SEND_F": "the fake backend completes a send at once and moves nothing; the activation "
              "sent stays in the stage's cache for its backward anyway",
    "SEND_B": "likewise, where no WAIT_SEND_B follows it (torch 2.14): the input's gradient it "
              "sends is freed with the measured backward part",
    "RECV_F": "the receive buffers are made once, when the schedule first runs (measured with "
              "the stage's first part, one per microbatch of the step)",
    "RECV_B": "likewise",
    "WAIT_REDUCE_GRAD": "torch 2.15: waits for the stage's gradient reduction; no computation "
                        "comes between it and its REDUCE_GRAD (only receives: "
                        "``defer_reduce_grad_wait`` off, torch's default and the simulation's), "
                        "and the measured R part (``perform_reduce_grad``: start and wait) holds "
                        "both",
}
#: The kinds only the schedules the simulator does not run emit (zero-bubble and DualPipe
#: schedules split a backward into its input and weight halves, or overlap a forward with a
#: backward): met in an order, they stop it like an unknown kind.
NOT_RUN = ("BACKWARD_INPUT", "BACKWARD_WEIGHT", "OVERLAP_F_B")


def order_of(schedule, rank: int) -> list[tuple[int, str, int]]:
    """Rank ``rank``'s computations in the order its schedule runs them, as ``(stage index,
    kind, microbatch)`` with kind "F" (forward), "B" (full backward) or "R" (the stage's
    gradient reduction, once, after its last backward; microbatch -1). A runtime schedule
    (interleaved) runs ``pipeline_order_with_comms``: its sends, receives and (torch 2.15) waits
    on sends are left out here (`NO_OPS` says why each changes nothing; the measured parts hold
    what they do); so are FSDP's unshard before a stage's first computation (the first
    forward's part holds the gather) and its reshard after the last. With more stages on a
    rank than it keeps gathered at once (torch keeps 3), the schedule reshards a stage between
    two of its computations and gathers it again before the next: those are kinds "X"
    (reshard) and "U" (unshard), microbatch -1.

    torch 2.15's waits on sends (`SEND_WAITS`) add kinds "HB" (a backward send's tensors held
    from here) and "WB" (its wait lets them go), with the microbatch.

    Raises NotImplementedError for a kind of action in none of `REPLAYED`, `FSDP`,
    `SEND_WAITS`, `NO_OPS` (a newer torch's, or a schedule the simulator does not run)."""
    order = [a for a in (getattr(schedule, "pipeline_order_with_comms", None)
                         or schedule.pipeline_order)[rank] if a is not None]
    last = {a.stage_index: i for i, a in enumerate(order)
            if a.computation_type.name in REPLAYED}
    waited = {(a.stage_index, SEND_WAITS[a.computation_type.name], a.microbatch_index): i
              for i, a in enumerate(order) if a.computation_type.name in SEND_WAITS}
    actions, used, previous = [], set(), None  # previous: the last action that is no send/recv
    for i, action in enumerate(order):
        name, index = action.computation_type.name, action.stage_index
        if name in FSDP:
            if index in used and i < last.get(index, -1):  # between two of its computations
                actions.append((index, FSDP[name], -1))
            continue
        if name == "WAIT_REDUCE_GRAD" and previous != ("REDUCE_GRAD", index):
            raise NotImplementedError(
                f"{action} does not follow its REDUCE_GRAD: a deferred gradient-reduction wait "
                "(defer_reduce_grad_wait=True) holds the reduction's buffers longer than the "
                "measured part does; the simulation runs torch's default (off)")
        if not name.startswith(("SEND_", "RECV_", "WAIT_SEND_")):
            previous = (name, index)
        if name == "WAIT_SEND_B":
            actions.append((index, "WB", action.microbatch_index))
            continue
        if name == "WAIT_SEND_F":  # its output: the backward has consumed it (measured)
            continue
        if name == "SEND_B" and (index, "B", action.microbatch_index) in waited:
            actions.append((index, "HB", action.microbatch_index))
        if name in NO_OPS:
            continue
        if name not in REPLAYED:
            raise NotImplementedError(
                f"{action} ({name}) in the schedule's order: the simulation replays "
                f"{', '.join(REPLAYED)} and FSDP's {' and '.join(FSDP)}, and knows "
                f"{', '.join(NO_OPS)} change nothing it measures. A new kind of action (a newer "
                "torch, or a schedule outside distlab.scale.pipeline.SCHEDULES) needs a line in "
                "distlab/scale/pipeline.py saying what it does to memory and FLOPs")
        used.add(index)
        micro = action.microbatch_index if action.microbatch_index is not None else -1
        actions.append((index, REPLAYED[name], micro))
    return actions


class PipelineStep:
    """The pipeline stages ``chunks`` (`model.Llama` modules laid out by `plan_order`, one per
    index of `chunk_indices`) as `PipelineStage` objects, under PyTorch's schedule
    ``layout.schedule`` with ``layout.microbatches`` (default ``pp``) microbatches."""

    #: microbatches measured before a replay: a first, a middle and a last
    MEASURED = 3

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
        self.rank = self.stages[0].group_rank

    def schedule(self, loss_fn, microbatches=None):
        cls = _schedule_class(self.layout.schedule)
        microbatches = microbatches or self.microbatches
        if self.layout.schedule == "Interleaved1F1B":
            return cls(self.stages, microbatches, loss_fn=loss_fn)
        return cls(self.stages[0], microbatches, loss_fn=loss_fn)

    def _batch(self, microbatches, is_first, is_last):
        b, s = self.layout.micro_batch, self.layout.seq_len // self.layout.cp
        batch = (b * microbatches, s)
        args = (torch.randint(0, self.config.vocab, batch),) if is_first else ()
        kwargs = {"target": torch.randint(0, self.config.vocab, batch)} if is_last else {}
        return args, kwargs

    def order(self, loss_fn):
        """This rank's actions in the schedule's order, for the step's microbatches (the
        schedule is built, not run)."""
        return order_of(self.schedule(loss_fn), self.rank)

    def run(self, loss_fn, recorder: PartRecorder | None = None, order=None):
        """One step: the whole batch (``microbatches x micro_batch`` sequences) through the
        schedule. Every rank is given the loss (torchtitan does too: a schedule without one
        runs forwards only); outputs are not kept for the caller (``return_outputs=False``,
        as torchtitan steps).

        Without ``recorder``: every microbatch runs, in the schedule's order; returns None.
        With one: the step is measured with `MEASURED` microbatches (fewer if the step has
        fewer), each stage under GPipe (all forwards, then all backwards: the same
        `PipelineStage` calls a schedule makes, and what they do to FSDP), and the schedule's
        own order (``order``: this rank's, if the caller has it already) is replayed from them;
        returns the `replay.Replayed` step."""
        if recorder is None:
            args, kwargs = self._batch(self.microbatches, self.first, self.last)
            self.schedule(loss_fn).step(*args, **kwargs, return_outputs=False)
            return None
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.pipelining import ScheduleGPipe

        order = self.order(loss_fn) if order is None else order
        measured = min(self.microbatches, self.MEASURED)
        # the whole step's batch, as the real step holds it; each stage measured on its first
        # microbatches (views: nothing more allocated)
        args, kwargs = self._batch(self.microbatches, self.first, self.last)
        rows = self.layout.micro_batch * measured
        start, home_start = recorder.tracker.total_now(), recorder.tracker.home_now()
        sent = {}  # (stage index, "F" | "B") -> the bytes one send of it holds
        with self._recorded(recorder, loss_fn, sent) as recorded_loss:
            ahead = _torch_simulation.unshards_ahead(_schedule_class(self.layout.schedule))
            for stage in self.stages:
                recorder.begin()  # the schedule's set-up (its buffers) goes with the first part
                # the schedule's all-gathers on the stream its UNSHARD actions use
                gathers = (_torch_simulation.gathers_on_current_stream(stage.submod)
                           if ahead and isinstance(stage.submod, FSDPModule)
                           else contextlib.nullcontext())
                with gathers:
                    ScheduleGPipe(stage, measured, loss_fn=recorded_loss).step(
                        *[a[:rows] for a in args] if stage.is_first else (),
                        **{k: v[:rows] for k, v in kwargs.items()} if stage.is_last else {},
                        return_outputs=False)
                recorder.end((stage.stage_index, "tail", "last"))
            if any(kind in ("U", "X") for _, kind, _ in order):
                for stage in self.stages:  # one gather again and one reshard, each measured
                    modules = [m for m in stage.submod.modules() if isinstance(m, FSDPModule)]
                    recorder.begin()
                    for handle in [m.unshard(async_op=True) for m in modules]:
                        handle.wait()
                    recorder.end((stage.stage_index, "U", "last"))
                    for m in modules:
                        m.reshard()
                    recorder.end((stage.stage_index, "X", "last"))

        def parts_of(index, kind, place):
            if kind in ("HB", "WB"):  # a send's tensors held, or let go
                held = sent[index, kind[1]]
                before, after = (0, held) if kind[0] == "H" else (held, 0)
                return [Part(before, max(before, after), after, home=(before, held, after))]
            found = list(recorder.parts.get((index, kind, place), [])[:1])
            if kind == "F":
                found += recorder.parts.get((index, "loss", place), [])[:1]
            return found

        # The i-th forward (backward) of a stage in the order is its microbatch i: schedules
        # run a stage's microbatches in order. (torch 2.14's Schedule1F1B labels the last
        # rank's forwards from 1 in its pipeline_order; the count is right.)
        seen, actions = {}, []
        for index, kind, _ in order:
            count = seen[index, kind] = seen.get((index, kind), -1) + 1
            place = "last" if kind in ("R", "U", "X") else which(count, self.microbatches)
            actions.append((index, kind, place))
        actions += [(st.stage_index, "tail", "last") for st in self.stages]
        return replay(actions, parts_of, start, home_start)

    @contextlib.contextmanager
    def _recorded(self, recorder: PartRecorder, loss_fn, sent: dict):
        """The stages' forward, backward and reduction, and the loss, each measured as a part
        keyed ``(stage index, "F" | "B" | "R" | "loss", which microbatch)``; ``sent`` is given
        the bytes of the tensors one send of each stage holds, by ``(stage index, "F" | "B")``
        (none when the stage sends nothing that way)."""
        measured = min(self.microbatches, self.MEASURED)
        current = {}

        def wrap(stage, name, kind):
            original = getattr(stage, name)

            def recorded(*args, **kwargs):
                micro = args[0] if args else kwargs.get(
                    "fwd_chunk_id", kwargs.get("bwd_chunk_id"))
                place = "last" if kind == "R" else which(micro, measured)
                if kind == "F":
                    current["place"] = place
                with recorder.part((stage.stage_index, kind, place)):
                    return original(*args, **kwargs)

            setattr(stage, name, recorded)

        def recorded_loss(out, target):
            with recorder.part((self.stages[-1].stage_index, "loss", current["place"])):
                return loss_fn(out, target)

        def sends(stage, name, direction):
            original = getattr(stage, name)

            def measured(*args, **kwargs):
                ops = original(*args, **kwargs)
                storages = {op.tensor.untyped_storage().data_ptr():
                            op.tensor.untyped_storage().nbytes() for op in ops}
                sent[stage.stage_index, direction] = sum(storages.values())
                return ops

            setattr(stage, name, measured)

        def whole_step(stage, name):
            # The stage's receive buffers, made when a schedule first runs: one per microbatch
            # of the step, not of the measurement (they stay for the whole step)
            original = getattr(stage, name)

            def prepare(num_microbatches, *args, **kwargs):
                return original(self.microbatches, *args, **kwargs)

            setattr(stage, name, prepare)

        names = ("forward_one_chunk", "backward_one_chunk", "perform_reduce_grad",
                 "get_fwd_send_ops", "get_bwd_send_ops", *_torch_simulation.PIPELINE_STAGE_SETUP)
        for stage in self.stages:
            sent[stage.stage_index, "F"] = sent[stage.stage_index, "B"] = 0
            sends(stage, "get_fwd_send_ops", "F")
            sends(stage, "get_bwd_send_ops", "B")
            wrap(stage, "forward_one_chunk", "F")
            wrap(stage, "backward_one_chunk", "B")
            wrap(stage, "perform_reduce_grad", "R")
            for name in _torch_simulation.PIPELINE_STAGE_SETUP:
                whole_step(stage, name)
        try:
            yield recorded_loss
        finally:
            for stage in self.stages:
                for name in names:
                    stage.__dict__.pop(name, None)
