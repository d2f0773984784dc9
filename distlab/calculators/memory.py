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

Adaptations, all ours: context parallelism (cp) keeps s/cp tokens per device, so s becomes s/cp
throughout (ring attention works block by block). A mixture of experts sends each token through
top_k experts, so the MLP's share (19 of the 34: 3 unsplit, 16 split) counts top_k times.
Pipeline parallelism runs 1F1B with at least pp microbatches, so the first stage (the device
reported) holds pp microbatches of its layers, as the paper counts it. The paper counts a GPT
layer (2-byte activations, 1-byte dropout masks, a 4h GELU MLP); we keep its count for Llama's
SwiGLU MLP and grouped-query attention, and double it for fp32. The embedding and output
layer's activations (the logits) and one recomputed layer in the backward are not counted.

For the course's MLPs, activations are what autograd saves: each Linear's input, plus the output
of a final ReLU/tanh/sigmoid, per row (a row is one of micro_batch x seq_len tokens).

Knows nothing about drawing (`charts` draws an estimate) or widgets.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._text import GB, CalculatorError, choice, divisors, one_of, positive_int
from .models import MLP, Params, Transformer, describe, get_model

__all__ = ["CHECKPOINTING", "PARTS", "PRECISIONS", "MemoryEstimate", "memory_per_device"]

#: Bytes per parameter of (parameter, gradient, Adam's optimizer state).
PRECISIONS = {"fp32": (4, 4, 8), "bf16-mixed": (2, 2, 12)}
CHECKPOINTING = ("none", "selective", "full")
PARTS = ("params", "grads", "optimizer", "activations")
_ZERO = {0: "no ZeRO (DDP)", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3 / FSDP"}


@dataclass(frozen=True, repr=False)
class MemoryEstimate:
    """What one device holds, in bytes (``params``, ``grads``, ``optimizer``, ``activations``;
    ``total`` is their sum), with the inputs that gave it. ``numel`` is the number of parameters
    the device holds a share of (its tensor-, pipeline- and expert-parallel shard, before ZeRO).
    The device is the first pipeline stage's. Build one with `memory_per_device`."""

    model: object
    dp: int
    tp: int
    pp: int
    cp: int
    ep: int
    zero: int
    precision: str
    checkpointing: str
    seq_len: int
    micro_batch: int
    sequence_parallel: bool
    numel: int
    params: int
    grads: int
    optimizer: int
    activations: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations

    @property
    def devices(self) -> int:
        """Devices in the whole job: dp x tp x pp x cp (expert parallelism reuses the dp ranks)."""
        return self.dp * self.tp * self.pp * self.cp

    def fits(self, capacity: int = 80 * GB) -> bool:
        """Whether the total fits in ``capacity`` bytes (default 80 GB, an H100's memory)."""
        return self.total <= capacity

    def with_(self, **changes) -> MemoryEstimate:
        """The same estimate with some inputs changed, e.g. ``est.with_(zero=3)``."""
        inputs = {k: getattr(self, k) for k in _INPUTS} | changes
        return memory_per_device(inputs.pop("model"), **inputs)

    def text(self) -> str:
        p, g, k = PRECISIONS[self.precision]
        layout = f"dp {self.dp} x tp {self.tp} x pp {self.pp} x cp {self.cp}"
        lines = [
            f"memory per device: {describe(self.model)}",
            f"{self.devices} devices: {layout} (ep {self.ep}); {_ZERO[self.zero]}; "
            f"{self.precision}: {p} + {g} + {k} bytes per parameter",
        ]
        if isinstance(self.model, Params):
            lines.append("activations: not modelled for a bare parameter count")
        else:
            how = f"{self.checkpointing} checkpointing" if self.checkpointing != "none" else (
                "no checkpointing")
            sp = ", sequence parallel" if self.sequence_parallel and self.tp > 1 else ""
            lines.append(
                f"activations: seq_len {self.seq_len} x micro_batch {self.micro_batch}, {how}{sp}"
            )
        stage = " (first pipeline stage)" if self.pp > 1 else ""
        lines.append(f"this device holds a share of {self.numel:,} parameters{stage}")
        width = max(len(f"{self.total:,}"), 5)
        lines.append(f"{'':12}{'bytes':>{width}}  {'GB':>9}")
        for part in (*PARTS, "total"):
            value = getattr(self, part)
            lines.append(f"{part:12}{value:>{width},}  {value / GB:9.2f}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.text()

    __str__ = __repr__

    def chart(self, capacity: int | None = 80 * GB):
        """A `charts.MemoryChart` of this estimate (``capacity``: a device's bytes, drawn as a
        line; None for none)."""
        from .charts import MemoryChart

        return MemoryChart(self, capacity=capacity)


_INPUTS = ("model", "dp", "tp", "pp", "cp", "ep", "zero", "precision", "checkpointing",
           "seq_len", "micro_batch", "sequence_parallel")


def memory_per_device(
    model,
    *,
    dp=1,
    tp=1,
    pp=1,
    cp=1,
    ep=1,
    zero=0,
    precision="bf16-mixed",
    checkpointing="none",
    seq_len=2048,
    micro_batch=1,
    sequence_parallel=True,
) -> MemoryEstimate:
    """The bytes one device holds when ``model`` trains with Adam on this layout.

    Args:
        model: a preset's name (``"Llama-3 8B"``; see `PRESETS`), a `Transformer`, an `MLP`, or a
            number of parameters (activations are then not modelled).
        dp, tp, pp, cp, ep: data-, tensor-, pipeline-, context- and expert-parallel sizes.
            Expert parallelism shares out a mixture of experts' experts among the data-parallel
            ranks (as Megatron-Core and DeepSpeed-MoE do).
        zero: the ZeRO stage, 0 to 3, sharding over the dp x cp ranks that hold the same
            parameters (the experts' state over dp x cp / ep).
        precision: "fp32" (4 + 4 + 8 bytes per parameter) or "bf16-mixed" (2 + 2 + 12).
        checkpointing: activation recomputation: "none", "selective" or "full".
        seq_len, micro_batch: tokens per sequence and sequences per microbatch.
        sequence_parallel: with tp > 1, also split the norms' and dropouts' activations
            (Megatron-LM's sequence parallelism).

    Returns:
        A `MemoryEstimate` (exact bytes; its text shows them and GB).

    Raises:
        CalculatorError (a ValueError): an unknown preset; a size that is not a whole number
            >= 1; ``tp`` that does not divide the heads, key-value heads or MLP; ``pp`` that does
            not divide the layers; ``seq_len`` not a multiple of ``cp``; ``ep`` > 1 for a dense
            model, or not dividing the experts or ``dp``; ``cp`` > 1, ``tp`` > 1 or checkpointing
            for an MLP; a ``zero``, ``precision`` or ``checkpointing`` not offered. Each message
            lists what would work.
    """
    m = get_model(model)
    for name, value in (("dp", dp), ("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep)):
        positive_int(value, name)
    positive_int(seq_len, "seq_len")
    positive_int(micro_batch, "micro_batch")
    if zero not in _ZERO or isinstance(zero, bool):
        raise CalculatorError(
            f"zero={zero!r} is not a ZeRO stage: choose 0 (none: DDP), 1 (shard the optimizer "
            "state), 2 (and the gradients) or 3 (and the parameters: FSDP)"
        )
    choice(precision, "precision", PRECISIONS)
    choice(checkpointing, "checkpointing", CHECKPOINTING)
    _check_layout(m, dp, cp, ep, seq_len, checkpointing)

    dense, expert = m.shard(tp, pp, stage=0)
    expert //= ep
    shards = {"dense": (dense, dp * cp), "expert": (expert, dp * cp // ep)}
    p_bytes, g_bytes, k_bytes = PRECISIONS[precision]

    def part(per_param: int, sharded: bool) -> int:
        return sum(-(-n // (ways if sharded else 1)) * per_param for n, ways in shards.values())

    return MemoryEstimate(
        model=m, dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero=zero, precision=precision,
        checkpointing=checkpointing, seq_len=seq_len, micro_batch=micro_batch,
        sequence_parallel=bool(sequence_parallel), numel=dense + expert,
        params=part(p_bytes, zero >= 3), grads=part(g_bytes, zero >= 2),
        optimizer=part(k_bytes, zero >= 1),
        activations=_activations(m, tp, pp, cp, seq_len, micro_batch, checkpointing,
                                 bool(sequence_parallel), precision),
    )


def _check_layout(m, dp, cp, ep, seq_len, checkpointing) -> None:
    if cp > 1 and not isinstance(m, Transformer):
        raise CalculatorError(f"context parallelism splits a transformer's sequence: use cp=1 "
                              f"for {m.name or 'a parameter count'}")
    if seq_len % cp:
        raise CalculatorError(
            f"seq_len={seq_len} does not split into cp={cp} equal parts: choose cp in "
            f"{one_of(divisors(seq_len)[:12])}, or a seq_len that is a multiple of {cp}"
        )
    if ep > 1:
        experts = getattr(m, "experts", 1)
        if experts == 1:
            raise CalculatorError(
                f"ep={ep}: {m.name or 'this model'} is dense (no experts), so expert "
                "parallelism has nothing to share out: use ep=1, or a mixture of experts such "
                "as 'Mixtral 8x7B'"
            )
        if experts % ep:
            raise CalculatorError(
                f"ep={ep} does not divide the {experts} experts of {m.name}: choose ep in "
                f"{one_of(divisors(experts))}"
            )
        if dp % ep:
            raise CalculatorError(
                f"ep={ep} must divide dp={dp}: the expert-parallel ranks are data-parallel "
                f"ranks; choose ep in {one_of([e for e in divisors(dp) if experts % e == 0])}"
            )
    if isinstance(m, MLP) and checkpointing != "none":
        raise CalculatorError(
            f"checkpointing is modelled for transformer layers; {m.name} stores its layers' "
            "inputs either way: use checkpointing='none'"
        )


def _activations(m, tp, pp, cp, seq_len, micro_batch, checkpointing, sp, precision) -> int:
    """Bytes of activations on the first pipeline stage (see the module's docstring)."""
    in_flight = pp  # 1F1B: the first stage holds pp microbatches
    if isinstance(m, Params):
        return 0
    if isinstance(m, MLP):
        per_value = PRECISIONS[precision][0]
        return in_flight * seq_len * micro_batch * m.saved_per_row(pp, 0) * per_value
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
    return in_flight * (m.layers // pp) * per_layer * scale
