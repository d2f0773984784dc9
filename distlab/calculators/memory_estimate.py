"""Memory per device: parameters, gradients, optimizer state and activations, from the formulas.

    from distlab.calculators import memory_per_device
    est = memory_per_device("Llama-3 70B", dp=8, tp=8, zero=1, checkpointing="selective",
                            seq_len=8192)
    est                  # exact bytes per part, and GB (10^9 bytes, as the ZeRO paper counts)
    est.chart()          # the four ZeRO stages side by side, this one outlined, a device's 80 GB

The model state follows the ZeRO paper (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations
Toward Training Trillion Parameter Models", Section 3 and Figure 1): with Adam, fp32 training
keeps 4 + 4 + 8 bytes per parameter (parameter, gradient, m and v) and bf16 mixed precision
2 + 2 + 12 (bf16 parameter and gradient; fp32 master weights, m and v: K = 12). ZeRO stage 1
shards the optimizer state over the data-parallel ranks, stage 2 the gradients too, stage 3 (FSDP)
the parameters too. A shard is rounded up to whole elements (FSDP and DeepSpeed pad theirs too).
Adam's per-tensor ``step`` counters are left out, as `distlab.memory` counts them apart.

Activations follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models" (Table 2), per layer, in bytes, for sequence length s, micro-batch b, hidden
size h, a heads and tensor-parallel size t:

    no recomputation, sequence parallel (or t = 1):   sbh (34 + 5as/h) / t
    no recomputation, tensor parallel only:           sbh (10 + 24/t + 5as/(ht))
    selective recomputation (the attention scores):   34 sbh / t     (sbh (10 + 24/t) without SP)
    full recomputation (keep each layer's input):     2 sbh          (2 sbh / t with SP: the
                                                                      input is sharded with it)

and, not in the paper, torchtitan's op-level modes: "op-selective" (keep the outputs of matmuls,
attention and collectives, recompute the rest) and "op-selective-alternate" (every other
matmul's output kept): five modes in all (`layout.CHECKPOINTING`; `activation_terms.llama_terms`
lists what each keeps).

Adaptations, all ours: context parallelism (cp) keeps s/cp tokens per device, so s becomes s/cp
throughout (ring attention works block by block). A mixture of experts sends each token through
top_k experts, so the MLP's share (19 of the 34: 3 unsplit, 16 split) counts top_k times.
With 1F1B, stage r holds min(pp - r, microbatches) microbatches of its layers at once: the first
stage (reported unless ``stage`` says otherwise) holds pp of them, as the paper counts it. The
paper counts a GPT layer (2-byte activations, 1-byte dropout masks, a 4h GELU MLP); for a Llama
architecture `activation_terms` counts each tensor PyTorch keeps instead, the output layer's
logits and the loss's copies included (below).

What a real run holds beyond those, each counted in ``peak`` and each a named choice:

- ``implementation``: "eager" (PyTorch eager, as torchtitan and `distlab.scale` run it: the
  default) or "megatron" (Megatron-LM: sequence-parallel inputs re-gathered in backward, a fused
  SwiGLU); `activation_terms` lists what each keeps.
- ``loss``: "upcast" (torchtitan's ``cross_entropy(pred.flatten(0, 1).float(), ...)``: the
  default) or "fused" (a chunked or fused cross-entropy); `activation_terms.loss_transient`.
- ``sync_each_microbatch`` (False by default): with pipelining,
  `torch.distributed.pipelining.stage`'s ``backward_maybe_with_nosync`` calls
  ``set_requires_gradient_sync(False)`` and ``set_reshard_after_backward(False)`` on an FSDP2
  stage for every microbatch but the last, so
  FSDP2 accumulates each parameter's unsharded gradient, upcast to its ``reduce_dtype``
  (``FSDPParam.to_accumulated_grad_if_needed``), for the whole step: the stage's parameters x
  the gradient's bytes (4 with "bf16-fsdp2"), not divided by dp. Llama 3.1 405B at tp 8 x pp 8:
  6.24 B parameters x 4 bytes = 25.0 GB (23.2 GiB) per GPU. Plain gradient accumulation with
  ``no_sync`` / ``set_requires_gradient_sync(False)`` does the same (``microbatches`` with
  pp = 1). The sharded gradients only appear with the last reduce-scatter (torchtitan
  zeroes gradients to None each step), so the peak counts the unsharded ones instead.
- ``schedule``: "1F1B" (stage r holds min(pp - r, microbatches) microbatches), "GPipe" (all of
  them) or "Interleaved1F1B" with ``virtual_stages`` v: rank r runs warm-up forwards of its v
  stages as torch's ``ScheduleInterleaved1F1B`` orders them, each holding 1/v of the rank's
  layers; its peak is walked along that order (`interleaved`).

For the course's MLPs, activations are what autograd saves: each Linear's input, plus the output
of a final ReLU/tanh/sigmoid, per row (a row is one of micro_batch x seq_len tokens).

Draws nothing itself: `MemoryEstimate.chart` hands the estimate to `charts`. Knows nothing about
widgets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._config import check_int
from . import fsdp_units, interleaved
from . import layout as _layout
from ._text import GB, CalculatorError, Printed
from .activation_terms import IMPLEMENTATIONS, LOSSES, llama_terms, loss_transient
from .layout import (
    ACTIVATION_BYTES,
    ATTENTIONS,
    CHECKPOINTING,
    FIELDS,
    PRECISIONS,
    SCHEDULES,
    ZERO,
    Layout,
    as_layout,
)
from .models import LinearStack, Params, Transformer, describe, get_model, stage_layers

__all__ = ["ATTENTIONS", "CHECKPOINTING", "IMPLEMENTATIONS", "LOSSES", "PARTS", "PRECISIONS",
           "SCHEDULES", "Layout", "MemoryEstimate", "memory_per_device"]

PARTS = ("params", "grads", "optimizer", "activations")


@dataclass(frozen=True, repr=False)
class MemoryEstimate(Printed):
    """What one device holds, in bytes (``params``, ``grads``, ``optimizer``, ``activations``;
    ``total`` is their sum), with the inputs that gave it. ``numel`` is the number of parameters
    the device holds a share of (its tensor-, pipeline- and expert-parallel shard, before ZeRO).
    The device is pipeline stage ``stage``'s (0, the first, unless asked otherwise). Build one
    with `memory_per_device`."""

    model: object
    layout: Layout
    stage: int
    numel: int
    params: int
    grads: int
    optimizer: int
    activations: int
    in_flight: int = 1
    per_microbatch: int = 0
    gathered: int = 0
    recomputed: int = 0
    terms: tuple = ()
    unsharded_grads: int = 0
    loss_transient: int = 0
    buffers: int = 0
    embedding_grad: int = 0
    chunks: tuple = field(default=(), repr=False)

    def __getattr__(self, name):  # the layout's knobs read as the estimate's: ``est.dp``
        if name in FIELDS and "layout" in self.__dict__:
            return getattr(self.layout, name)
        raise AttributeError(f"MemoryEstimate has no attribute {name!r}")

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations

    @property
    def devices(self) -> int:
        """Devices in the whole job: replicate x dp x tp x pp x cp (expert parallelism reuses
        the dp ranks)."""
        return self.replicate * self.dp * self.tp * self.pp * self.cp

    @property
    def peak(self) -> int:
        """The most bytes alive during a step: ``total`` (the parameters', gradients' and
        optimizer's shards, and the activations of ``in_flight`` microbatches) plus
        ``gathered``, the parameters FSDP has all-gathered for computing (ZeRO-3 without
        pipelining: the unit computing and the one prefetched; ZeRO-2, or any ZeRO with
        pipelining, keeps every unit of the stage gathered from its forward to its backward);
        ``unsharded_grads`` in place of the sharded gradients when FSDP accumulates without
        syncing (pipelining); and the larger of two moments: the loss's, as backward starts
        (``loss_transient``, the loss's fp32 copies on the last stage, with no gradient yet
        unless accumulated unsharded from earlier microbatches), and backward's (the gradients,
        and with checkpointing ``recomputed``: the layer running again holds its whole
        activations meanwhile; on the first stage with TP, the embedding's gradient, which
        torch makes whole over the vocabulary: ``embedding_grad``). An estimate: it adds the
        largest parts as if they were alive at the same moment, and leaves out the gradients
        of activations in backward, the gradients not yet reduce-scattered, the optimizer's
        temporaries (fused AdamW has none) and allocator fragmentation (a measured "max
        reserved" is above it).
        Against PyTorch's own code on simulated ranks (bench/calculator_vs_simulation.py,
        notebook 25) it is within 4% without checkpointing and within 13% with it; against
        torchtitan's measured H100 runs, bench/memory_vs_torchtitan.py."""
        return self._peak(sharded_grads=True)

    def _peak(self, sharded_grads: bool) -> int:
        """``peak``; without ``sharded_grads``, of all but the sharded gradients."""
        if self.virtual_stages > 1:  # moment by moment along torch's order, stage by stage
            return interleaved.peak(self, sharded_grads)
        grads = self.unsharded_grads or (self.grads if sharded_grads else 0)
        held = (self.params + self.optimizer + self.activations + self.gathered
                + self.buffers)
        # backward: the gradients there (as if all at once), and a layer recomputed or, at
        # the first stage's end with TP, the embedding's whole gradient (by then that
        # microbatch's activations are freed)
        backward = held + grads + self._late
        # the loss, as backward starts: no gradient yet (``zero_grad(set_to_none=True)``
        # freed the last step's), unless accumulated unsharded from earlier microbatches
        loss = held + self.unsharded_grads + self.loss_transient
        return max(backward, loss)

    @property
    def side_streams(self) -> int:
        """The bytes FSDP2 makes on its side streams at their most: its reduce-scatters'
        outputs, which become the sharded gradients (``grads``), and, where FSDP's own hooks
        gather (not an interleaved schedule: its UNSHARD actions gather on the current
        stream), the all-gathers' outputs in flight: a unit's and the next one's, prefetched,
        with the first's copy-in (its shard cast to the compute dtype). 0 without FSDP.
        Against PyTorch's own code on simulated ranks: equal for dense models (FSDP's padding
        aside), within 1% for a mixture of experts (whose blocks FSDP gathers in more units)."""
        return fsdp_units.side_streams(self, ACTIVATION_BYTES[self.precision])

    @property
    def reserved(self) -> int:
        """The least the CUDA caching allocator holds reserved for the step: a floor under a
        measured ``max_memory_reserved``. The allocator pools blocks by the stream that made
        them (a freed block is reused only on its stream), so what FSDP2 makes on its side
        streams (``side_streams``) stays apart from the default stream's blocks: the peak of
        everything else plus ``side_streams``. No block rounding or fragmentation counted.
        `distlab.scale`'s simulated ranks report the same (``RankReport.reserved``), read off
        PyTorch's own code."""
        side = self.side_streams
        if not side:
            return self.peak
        return max(self.peak, self._peak(sharded_grads=False) + side)

    @property
    def _late(self) -> int:
        return max(self.recomputed, self.embedding_grad - self.per_microbatch, 0)

    def fits(self, capacity: int = 80 * GB) -> bool:
        """Whether the ``peak`` fits in ``capacity`` bytes (default 80 GB, an H100's memory)."""
        return self.peak <= capacity

    def with_(self, **changes) -> MemoryEstimate:
        """The same estimate with some inputs changed, e.g. ``est.with_(zero=3)``: the layout's
        knobs, ``model`` or ``stage``."""
        model, stage = changes.pop("model", self.model), changes.pop("stage", self.stage)
        return memory_per_device(model, as_layout(self.layout, changes, "with_"), stage=stage)

    def text(self) -> str:
        p, g, k = PRECISIONS[self.precision]
        layout = f"dp {self.dp} x tp {self.tp} x pp {self.pp} x cp {self.cp}"
        lines = [
            f"memory per device: {describe(self.model)}",
            f"{self.devices} devices: {layout} (ep {self.ep}); {ZERO[self.zero]}; "
            f"{self.precision}: {p} + {g} + {k} bytes per parameter",
        ]
        if not isinstance(self.model, (Params, LinearStack)):
            impl = ("PyTorch eager (gathered inputs kept whole, unfused SwiGLU)"
                    if self.implementation == "eager" else
                    "Megatron-style (inputs re-gathered in backward, fused SwiGLU)")
            lines.append(f"implementation: {impl}; loss: {self.loss}")
        if isinstance(self.model, Params):
            lines.append("activations: not modelled for a bare parameter count")
        else:
            how = f"{self.checkpointing} checkpointing" if self.checkpointing != "none" else (
                "no checkpointing")
            sp = ", sequence parallel" if self.sequence_parallel and self.tp > 1 else ""
            lines.append(
                f"activations: seq_len {self.seq_len} x micro_batch {self.micro_batch}, {how}{sp}"
            )
        stage = ""
        if self.pp > 1:
            stage = " (first pipeline stage)" if self.stage == 0 else (
                f" (pipeline stage {self.stage} of 0 to {self.pp - 1})")
        lines.append(f"this device holds a share of {self.numel:,} parameters{stage}")
        width = max(len(f"{self.total:,}"), 5)
        lines.append(f"{'':12}{'bytes':>{width}}  {'GB':>9}")
        for part in (*PARTS, "total"):
            value = getattr(self, part)
            lines.append(f"{part:12}{value:>{width},}  {value / GB:9.2f}")
        if self.unsharded_grads:
            lines.append(f"{'grads, whole':12}{self.unsharded_grads:>{width},}  "
                         f"{self.unsharded_grads / GB:9.2f}  (accumulated unsharded across "
                         f"microbatches, in place of grads)")
        if self.peak != self.total:
            late = self._late
            at_loss = self.peak > (self.params + self.optimizer + self.activations
                                   + self.gathered + self.buffers
                                   + (self.unsharded_grads or self.grads) + late)
            added = [what for what, n in (
                ("gathered parameters", self.gathered),
                ("the pipeline's receive buffers", self.buffers),
                ("unsharded gradients - grads", self.unsharded_grads),
                ("the loss's fp32 copies - grads", self.loss_transient if at_loss else 0),
                ("a recomputed layer" if self.recomputed >= late else
                 "the embedding's whole gradient", 0 if at_loss else late)) if n]
            lines.append(f"{'peak':12}{self.peak:>{width},}  {self.peak / GB:9.2f}  "
                         f"(estimate: total + {' + '.join(added)})")
        return "\n".join(lines)

    def chart(self, capacity: int | None = 80 * GB):
        """A `charts.MemoryChart` of this estimate (``capacity``: a device's bytes, drawn as a
        line; None for none)."""
        from .charts import MemoryChart

        return MemoryChart(self, capacity=capacity)


def memory_per_device(model, layout: Layout | None = None, *, stage: int = 0,
                      **knobs) -> MemoryEstimate:
    """The bytes one device holds when ``model`` trains with Adam on ``layout``.

    Args:
        model: a preset's name (``"Llama-3 8B"``; see `PRESETS`), a `Transformer`, a
            `LinearStack`, or a number of parameters (activations are then not modelled).
        layout: a `Layout` (its docstring names every knob and its default); None for
            ``Layout()``.
        stage: the pipeline stage whose device is reported (0: the first, which holds the most
            microbatches in flight; ``pp - 1`` holds the logits).
        knobs: a Layout's knobs as keywords, changing ``layout``'s (or the defaults'):
            ``memory_per_device("Llama-3 8B", dp=8)`` is
            ``memory_per_device("Llama-3 8B", Layout(dp=8))``.

    How the knobs count: ZeRO shards over the dp x cp ranks that hold the same parameters (the
    experts' state over dp x cp / ep); with pipelining stage ``r`` holds ``min(pp - r,
    microbatches)`` microbatches at once under 1F1B, all of them under GPipe, and torch's
    order under Interleaved1F1B (`interleaved`); with ``sync_each_microbatch=False`` (the
    default) and ZeRO 2 or 3, the unsharded gradients accumulate over the step's microbatches
    (as `PipelineStage` runs FSDP2).

    Returns:
        A `MemoryEstimate` (exact bytes; its text shows them and GB).

    Raises:
        CalculatorError (a `distlab.DistlabError` and a ValueError): an unknown preset; a knob
            `Layout` refuses; ``tp`` that does not divide the heads, key-value heads or MLP;
            ``pp`` x ``virtual_stages`` that does not divide the layers; ``ep`` > 1 for a dense
            model or not dividing the experts; ``cp`` > 1, ``tp`` > 1 or checkpointing for a
            `LinearStack`; a ``stage`` outside 0 to pp - 1. Each message lists what would work.
    """
    m = get_model(model)
    layout = as_layout(layout, knobs, "memory_per_device")
    check_int(stage, "stage", low=0, high=layout.pp - 1, noun="a pipeline stage",
              error=CalculatorError)
    layout.check(m)
    return _estimate(m, layout, stage)


def _estimate(m, layout: Layout, stage: int) -> MemoryEstimate:
    """`memory_per_device` of a model object on a checked layout."""
    lay = layout
    tp, pp, zero, precision = lay.tp, lay.pp, lay.zero, lay.precision
    dense, expert = m.shard(tp, pp, stage=stage)
    expert //= lay.ep
    shards = {"dense": (dense, lay.dp * lay.cp), "expert": (expert, lay.dp * lay.cp // lay.ep)}
    p_bytes, g_bytes, k_bytes = PRECISIONS[precision]

    def part(per_param: int, sharded: bool) -> int:
        return sum(-(-n // (ways if sharded else 1)) * per_param for n, ways in shards.values())

    kw = _term_inputs(lay, stage)
    terms = _activation_terms(m, checkpointing=lay.checkpointing, **kw)
    buffers = 0
    if isinstance(m, Transformer) and pp > 1:
        terms, buffers = _pipeline_terms(m, terms, microbatches=lay.steps, **kw)
    per_microbatch = sum(b for _, b in terms)
    accumulating = zero >= 2 and not lay.sync_each_microbatch and lay.steps > 1
    unsharded = (dense + expert) * g_bytes if accumulating else 0
    embedding_grad = 0
    if isinstance(m, Transformer) and stage == 0 and tp > 1:
        # torch's DTensor has no vocabulary-sharded embedding backward: the gradient of the
        # vocabulary-sharded embedding comes out whole (vocab x hidden), the tp ranks' parts
        # partial (``embedding_dense_backward``'s strategies: column-wise or partial), in bf16
        whole, mine = m.vocab * m.hidden, m.vocab // tp * m.hidden
        embedding_grad = whole * ACTIVATION_BYTES[precision]
        if accumulating:  # and FSDP2 accumulates it so, in fp32, for the step
            unsharded += (whole - mine) * g_bytes
    transient = 0
    if isinstance(m, Transformer) and stage == pp - 1:
        transient = loss_transient(m, seq_len=lay.seq_len, micro_batch=lay.micro_batch, tp=tp,
                                   cp=lay.cp, loss=lay.loss, loss_parallel=lay.loss_parallel)
    chunks = ()
    if lay.virtual_stages > 1 and isinstance(m, Transformer):
        chunks = interleaved.chunks(m, lay, stage, _estimate)
        buffers = sum(c.buffers for c in chunks)  # each of the rank's stages receives its own
    in_flight = _in_flight(lay, stage)
    return MemoryEstimate(
        model=m, layout=lay, stage=stage, numel=dense + expert,
        params=part(p_bytes, zero >= 3), grads=part(g_bytes, zero >= 2),
        optimizer=part(k_bytes, zero >= 1),
        activations=in_flight * per_microbatch // lay.virtual_stages,
        in_flight=in_flight, per_microbatch=per_microbatch, terms=tuple(terms),
        gathered=fsdp_units.gathered(m, tp, pp, stage, zero, ACTIVATION_BYTES[precision],
                                     lay.ep, bool(lay.reshard_after_forward)),
        recomputed=_recomputed(m, lay.checkpointing, **kw),
        unsharded_grads=unsharded, loss_transient=transient, buffers=buffers,
        embedding_grad=embedding_grad, chunks=chunks,
    )


def _term_inputs(lay: Layout, stage: int) -> dict:
    """The layout's knobs the activation terms read."""
    return dict(tp=lay.tp, pp=lay.pp, cp=lay.cp, ep=lay.ep, seq_len=lay.seq_len,
                micro_batch=lay.micro_batch, sp=bool(lay.sequence_parallel),
                precision=lay.precision, attention=lay.attention, stage=stage,
                loss_parallel=lay.loss_parallel, implementation=lay.implementation,
                loss=lay.loss)


def _pipeline_terms(m, terms, *, stage, microbatches, tp, pp, cp, seq_len, micro_batch, sp,
                    precision, loss_parallel, **_):
    """What `torch.distributed.pipelining`'s ``PipelineStage`` adds: receive buffers for the
    activations from the previous stage and for the gradients from the next, one per
    microbatch of the step, made when the schedule first runs and kept (so the stage's first
    layer's input is in a buffer, not a new activation); and on the last stage each
    microbatch's output (the bf16 logits) kept until its backward (``fwd_cache``)."""
    e = ACTIVATION_BYTES[precision]
    s, b = seq_len // cp, micro_batch
    stream = e * s * b * m.hidden // (tp if sp and tp > 1 else 1)
    terms = list(terms)
    if stage > 0:
        terms.append(("the first layer's input (in a receive buffer, below)", -stream))
    if stage == pp - 1:
        vocab = m.vocab // tp if loss_parallel and tp > 1 else m.vocab
        terms.append(("the logits, kept by the stage until backward", e * s * b * vocab))
    buffers = microbatches * stream * ((stage > 0) + (stage < pp - 1))
    return terms, buffers


def _in_flight(lay: Layout, stage: int) -> int:
    """Microbatches (with v > 1: stage-microbatches, each 1/v of the rank's layers) whose
    activations stage ``stage``'s rank holds at once."""
    if lay.schedule == "GPipe":
        return lay.steps
    if lay.schedule == "1F1B":
        return min(lay.pp - stage, lay.steps)
    return interleaved.in_flight(lay, stage)


def _recomputed(m, checkpointing, **kw) -> int:
    """With checkpointing, the one layer whose forward runs again in backward holds its whole
    activations meanwhile."""
    if checkpointing == "none" or not isinstance(m, Transformer):
        return 0
    whole = _activation_terms(m, checkpointing="none", **kw)
    kept = _activation_terms(m, checkpointing=checkpointing, **kw)
    layers = len(stage_layers(m.layers, kw["pp"])[kw["stage"]])
    return (sum(b for _, b in whole) - sum(b for _, b in kept)) // layers


def _activation_terms(m, *, tp, pp, cp, ep, seq_len, micro_batch, checkpointing, sp, precision,
                      attention, stage, loss_parallel, implementation="eager",
                      loss="upcast") -> list:
    """``[(what, bytes)]`` one microbatch leaves alive on the stage's device (see the module's
    docstring)."""
    e = ACTIVATION_BYTES[precision]
    if isinstance(m, Params):
        return []
    if isinstance(m, LinearStack):
        saved = seq_len * micro_batch * m.saved_per_row(pp, stage) * e
        return [("each Linear's input (and the last activation's output)", saved)]
    layers = len(stage_layers(m.layers, pp)[stage])
    if m.gated:
        return llama_terms(m, seq_len=seq_len, micro_batch=micro_batch, tp=tp, cp=cp, sp=sp, e=e,
                           attention=attention, checkpointing=checkpointing, layers=layers,
                           first=stage == 0, last=stage == pp - 1, ep=ep,
                           loss_parallel=loss_parallel, implementation=implementation,
                           loss=loss)
    s, b, h, a, t, k = seq_len // cp, micro_batch, m.hidden, m.heads, tp, m.top_k
    sbh = s * b * h
    unsplit, split = 10 + 3 * (k - 1), 24 + 16 * (k - 1)  # 10 + 24 = the paper's 34
    scores = 0 if checkpointing == "selective" else 5 * a * s * s * b // t
    sp = sp and t > 1
    if checkpointing == "full":
        per_layer = 2 * sbh // (t if sp else 1)
    elif sp:
        per_layer = (unsplit + split) * sbh // t + scores
    else:
        per_layer = unsplit * sbh + split * sbh // t + scores
    scale = 2 if precision == "fp32" else 1  # the paper counts 2-byte activations
    return [("Korthikanti et al.'s count of a GPT layer (with dropout)",
             layers * per_layer * scale)]


_layout._MEMORY_PER_DEVICE[:] = [memory_per_device]  # Layout.memory's formulas (see there)
