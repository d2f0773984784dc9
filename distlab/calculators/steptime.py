"""A training step's time and its MFU, from a layout: compute per layer, the collectives that
are exposed and those hidden behind compute, and the pipeline's bubble.

    from distlab.calculators import step_time
    t = step_time("Llama-3 405B", tp=8, pp=16, dp=128, seq_len=8192, microbatches=16,
                  schedule="Interleaved1F1B", virtual_stages=2)
    t.mfu, t.mfu_6n, t.seconds      # and print(t): every term, and every assumption named

A prediction, not a measurement: each number comes from the inputs below, each named.

Compute, per microbatch, on the slowest pipeline stage (`models.stage_layers`):
- matmuls: 2 FLOPs per parameter per token forward, 4 backward (a layer's Linear weights on one
  tensor-parallel rank; the output layer on the last stage), at ``matmul_efficiency`` x
  ``peak_flops``. The default efficiency is MAMF_H100 / H100_PEAK = 792.1 / 989 = 0.80: the
  Maximum Achievable Matmul FLOPS of a dense bf16 matmul on H100 SXM (CUDA 12.1) measured by
  stas00/ml-engineering's mamf-finder.py (its README's "Maximum Achievable Matmul FLOPS
  comparison table"). A measured GEMM ceiling, not fitted to any training run's MFU.
- attention: counted, causal (FlashAttention skips the masked half): forward 2 matmuls of
  2 s_q s_kv d_head FLOPs per head, halved; backward 2.5x forward (FlashAttention's 5 matmuls
  against 2: it recomputes the scores), at ``attention_efficiency`` (default: the matmul's).
- recomputation by ``checkpointing``: "none"; "op-selective" (torchtitan's policy saves every
  other matmul's output, attention's and the reduce-scatters': about half the matmuls' forward
  again); "selective" (Megatron's: attention's core again); "full" (the whole forward again,
  with its tensor- and context-parallel collectives).
- memory-bound kernels (``memory_bound``), at ``hbm_bandwidth`` (default H100 SXM's HBM3 peak,
  3.35 TB/s; torchtitan's 96 GB H100s have HBM2e at 2.4, `H100_HBM2E`), **exposed** (they run
  between the matmuls on the compute stream; FSDP2's copy-in and reduce-scatter copy run on its
  side streams, so for those an upper bound). At the peak, kernels reach less (copies measure
  about 90% of it): a floor for the bytes counted, though eager kernels whose tensors stay in
  the 50 MB L2 cache may beat it:
  "fused": each elementwise region one kernel that reads its inputs and writes its outputs
  once, as Megatron-style fused kernels (and torch.compile) run them. Per layer forward: two
  RMSNorms (read, write), two residual adds (read two, write one), RoPE on q and k, SwiGLU's
  silu-and-product (read two, write one); backward: the norms (read input and gradient, write
  one), the residual stream's gradient sums, RoPE, SwiGLU (read three, write two); the forward
  again where ``checkpointing`` recomputes elementwise ops (torchtitan's op-level policies keep
  only matmul and attention outputs: every elementwise op is recomputed; "selective" only
  attention's core; "full" all). Norms and residuals on a sequence-parallel shard (1/tp of the
  tokens). The last stage's loss as a fused cross-entropy (read the bf16 logits, write their
  gradient). FSDP's copies (each gather's copy-out, bf16; each reduction's copy-in of the
  unsharded gradients at ``grad_bytes``) and the optimizer's step (fused AdamW on the rank's
  fp32 shards: read parameter, gradient and both moments, write three: 28 bytes a parameter),
  per step. Gradient accumulation across microbatches is taken as fused into the weight
  gradients' matmuls (Megatron's gradient_accumulation_fusion): no pass of its own.
  "eager": every op of the simulated rank that is not a matmul, attention, a view or a
  collective, as PyTorch eager runs it (one kernel each): ``report.moved`` per microbatch
  (scaled to the slowest stage's layers) and ``report.optimizer_moved`` per step
  (`distlab.scale.instruments.moved_bytes`); needs ``report``. "none": not timed.

Sustained: the rates above are each kernel's own, timed alone. A training job's SMs sustain
less (power caps, SMs shared with NCCL, launch gaps): ``sustained``, one share applied to the
matmuls' and attention's FLOP/s (default 1, none lost), taken from measured runs by
`bench/steptime_accuracy.py` (its calibration rows declared there, every other row
validation). **Not to the memory-bound kernels**: a power cap lowers the SMs' clock, not the
memory's (NVML's SwPowerCap reason: "SW Power Scaling algorithm is reducing the clocks below
requested clocks", the graphics clocks that `nvidia-smi -q -d CLOCK` shows falling; Chips and
Cheese, "Nvidia's H100: Funny L2, and Tons of Bandwidth", 2023, measuring an H100 at its power
limit: "Memory Clock (Does not change under load)"), and a kernel that streams bytes runs at
the HBM's rate. They stay at ``hbm_bandwidth``, the peak: a floor for the bytes counted (what they
lose below it, launch gaps among them, the calibration puts on the SMs' share).

Communication: each collective's time is `comm.collective_time` (alpha-beta, ring) over a link,
at the bandwidth NCCL measures (``bandwidth="measured"``, `Link.measured`) or the link's peak
(``"peak"``). nccl-tests' busbw is defined so that a ring's time is (N-1)/N S / busbw, the
bandwidth term of `comm`: the two plug together. With sequence parallelism:
- TP (NVLink, inside a node): per layer 2 all-gathers and 2 reduce-scatters of the microbatch's
  activations forward, the same backward: **exposed** (each feeds the next matmul), unless
  ``async_tp`` (then hidden behind the matmuls, the excess exposed). Recomputation runs the
  forward's collectives again: "full" both kinds; torchtitan's op-level policies ("op-selective",
  "op-selective-alternate") the all-gathers only, since their save list keeps the
  reduce-scatters' outputs and not the all-gathers' (`_save_list` in torchtitan's
  parallelize_llama.py, 2024-12, now `torchtitan/distributed/activation_checkpoint.py`:
  "Communication ops whose outputs should be saved to avoid re-communication", a list with
  reduce_scatter_tensor and no all-gather).
- CP (the network): per layer an all-gather of K and V forward, a reduce-scatter of their
  gradients backward (Llama 3's all-gather context parallelism): **exposed**.
- PP (the network): one send of a stage's output forward and of its gradient backward per
  microbatch and stage (2 v a microbatch with v stages per rank), 1/tp of the activations each
  (Megatron's scatter-gather with SP): **hidden** behind the next microbatch's compute; the
  excess of each send over that stage's forward (backward) exposed.
- DP (FSDP, the network or ``dp_link``): the stage's bf16 parameters all-gathered once per
  step with PP (kept for every microbatch; without PP, again in every microbatch's forward and
  backward) and its gradients reduce-scattered once, in fp32 (``grad_bytes=4``, as Llama 3
  does), layer by layer, **hidden** by prefetching one layer ahead: per layer, the excess of
  the collective over one microbatch's forward (all-gather) or backward (reduce-scatter) of a
  layer is exposed.
Given ``report`` (a `distlab.scale.RankReport`, one simulated rank's step), the TP and CP
collectives are those it recorded (kind, group size, bytes), in place of the formulas above.

The bubble: GPipe and 1F1B idle (p-1)/(m+p-1) of the wall time, interleaved 1F1B with v stages
per rank (p-1)/(v m+p-1) (`pipeline.Schedule.formula`). A step is m x (a microbatch's busy
time) / (1 - bubble), plus FSDP's exposed time and the per-step memory-bound work (FSDP's copies,
the optimizer).

MFU: FLOPs of the model per token x tokens per step / (step time x GPUs x peak).
``mfu_6n`` counts 6 N per token (N: every parameter, embeddings included; no attention).
``mfu`` counts 6 N plus causal attention, `attention_flops`: 6 L s d per token (L layers, s the
sequence, d the model width), the very FLOPs the compute term times (its forward, 2 L s d, with
a backward of twice the forward, as 6 N counts a matmul). The convention is PaLM's (arXiv
2204.02311, Appendix B: 6 N + 12 L H Q T, with H Q = d and T = s) with the causal mask's half
left out, because FlashAttention skips the masked blocks and the time counts what runs. PaLM
writes the full square, and so does torchtitan (`get_dense_model_nparams_and_flops`,
torchtitan/models/utils.py: "6 * n_layers * n_heads * head_dims * seq_len" with head_dims the
sum of q and v's, i.e. 12 L s d: "we follow the convention and do not account for sparsity in
causal attention"); the Llama 3 paper reports TFLOPs per GPU / peak (Table 4: 430 / 989 = 43%)
without writing its count. ``mfu_full_square`` is the same step by PaLM's and torchtitan's
count. At 8K tokens causal attention is 4% of 405B's model FLOPs, at 128K 40% (8% and 57% by
the full square): the definition matters there.
``hfu`` counts what the GPU runs: recomputation and attention's 2.5x backward included.

Knows nothing about memory (`memory_estimate`) or drawing.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from ._text import CalculatorError, Printed, choice, positive_int, seconds
from .comm import collective_time
from .layout import CHECKPOINTING, PRECISIONS, SCHEDULES, Layout, as_layout
from .links import get_link
from .models import Transformer, get_model, stage_layers

__all__ = ["CHECKPOINTING", "H100_HBM", "H100_HBM2E", "H100_PEAK", "MAMF_H100", "MATMUL_EFFICIENCY",
           "MEMORY_BOUND", "StepTime", "Term", "attention_flops", "bubble", "step_time"]

H100_PEAK = 989e12  #: H100 SXM dense bf16 FLOP/s (NVIDIA datasheet: 1,979 with sparsity)
MAMF_H100 = 792.1e12  #: measured: stas00/ml-engineering, MAMF table, H100 SXM, bf16, CUDA 12.1
MATMUL_EFFICIENCY = MAMF_H100 / H100_PEAK  #: 0.80, the default ``matmul_efficiency``
H100_HBM = 3.35e12  #: H100 SXM HBM3 bytes/s (NVIDIA datasheet): the peak, not a measurement
#: the 96 GB HBM2e H100s of torchtitan's benchmarks (its benchmark page: 2.4 TB/s peak)
H100_HBM2E = 2.4e12
MEMORY_BOUND = ("fused", "eager", "none")  #: how the memory-bound kernels are counted
#: recomputation of the elementwise forward, by ``checkpointing`` (share of it run again)
_RECOMPUTE_ELEMENTWISE = {"none": 0, "op-selective": 1, "op-selective-alternate": 1,
                          "selective": 0, "full": 1}
_RECOMPUTE = {  # (share of the matmuls' forward, of attention's forward) run again in backward
    "none": (0, 0), "op-selective": (0, 0), "op-selective-alternate": (Fraction(1, 2), 0),
    "selective": (0, 1), "full": (1, 1),
}


def attention_flops(model, seq_len) -> float:
    """Causal self-attention's model FLOPs per token of a ``seq_len``-token sequence, forward and
    backward: 6 L s d (``model``: a `Transformer` or a preset's name). Forward: per layer, two
    matmuls (scores, then values) of 2 s d FLOPs per query token over all heads, halved for the
    causal mask: 2 s d; backward counted as twice the forward, as 6 N counts a matmul
    (FlashAttention's real backward, 2.5x, is in ``hfu``, not here). PaLM's count (Appendix B)
    and torchtitan's without the masked half (see the module)."""
    m = get_model(model)
    hd = m.hidden // m.heads
    return 3 * m.layers * (4 * seq_len * hd * m.heads / 2)


def bubble(p, m, v=1, schedule="1F1B") -> Fraction:
    """The idle share of a pipeline's wall time: (p-1)/(m+p-1) for GPipe and 1F1B,
    (p-1)/(v m+p-1) for Interleaved1F1B with v stages per rank. Raises `CalculatorError` for
    an unknown schedule, or v > 1 with GPipe or 1F1B."""
    choice(schedule, "schedule", SCHEDULES)
    p, m, v = positive_int(p, "p"), positive_int(m, "m"), positive_int(v, "v")
    if schedule != "Interleaved1F1B" and v != 1:
        raise CalculatorError(f"v={v} needs schedule='Interleaved1F1B' ({schedule} puts one "
                              "stage on each rank)")
    return Fraction(p - 1, v * m + p - 1)


@dataclass(frozen=True)
class Term:
    """One line of a step's time: ``what``; ``seconds`` it takes per microbatch (per step for
    ``per="step"``); ``exposed`` the part on the critical path; ``how`` hidden or exposed,
    and why."""

    what: str
    seconds: float
    exposed: float
    how: str
    per: str = "microbatch"


@dataclass(frozen=True, repr=False)
class StepTime(Printed):
    """A step's predicted time and MFU (see the module). ``terms``: compute and communication,
    each a `Term`; ``bubble``: a `Fraction`; ``seconds``: the step; ``tokens``: per step, all
    GPUs; ``gpus``; ``flops_6n`` and ``flops_model`` (6 N + causal attention) per token;
    ``flops_hardware``: what all GPUs run in one step; ``assumptions``: every input, in words."""

    model: object
    layout: str
    microbatches: int
    terms: tuple
    bubble: Fraction
    seconds: float
    tokens: int
    gpus: int
    peak_flops: float
    flops_6n: float
    flops_model: float
    flops_hardware: float
    assumptions: tuple

    def _util(self, flops) -> float:
        return flops / (self.seconds * self.gpus * self.peak_flops)

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation with attention (causal) counted: the Llama 3 paper's."""
        return self._util(self.flops_model * self.tokens)

    @property
    def mfu_6n(self) -> float:
        """Model FLOPs utilisation by 6 N per token (no attention)."""
        return self._util(self.flops_6n * self.tokens)

    @property
    def mfu_full_square(self) -> float:
        """MFU by PaLM's and torchtitan's count: attention's full square, the causal mask not
        halved (12 L s d per token, twice ``mfu``'s attention)."""
        return self._util((2 * self.flops_model - self.flops_6n) * self.tokens)

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation: recomputation and attention's real backward counted."""
        return self._util(self.flops_hardware)

    @property
    def tflops_per_gpu(self) -> float:
        """``mfu`` x peak, in TFLOP/s: the Llama 3 paper's Table 4 column."""
        return self.mfu * self.peak_flops / 1e12

    @property
    def tokens_per_second_per_gpu(self) -> float:
        """torchtitan's TPS/GPU."""
        return self.tokens / self.seconds / self.gpus

    def text(self) -> str:
        lines = [f"{self.model.name}, {self.layout}: {self.microbatches} microbatches per step"]
        for t in self.terms:
            lines.append(f"  {t.what:<34} {seconds(t.seconds):>10} per {t.per}, exposed "
                         f"{seconds(t.exposed):>10}  ({t.how})")
        lines += [
            f"  bubble {float(self.bubble):.1%}; step {self.seconds:.2f} s for "
            f"{self.tokens:,} tokens on {self.gpus:,} GPUs",
            f"  MFU {self.mfu:.1%} (6N + causal attention; {self.tflops_per_gpu:.0f} TFLOP/s "
            f"per GPU), {self.mfu_6n:.1%} by 6N; HFU {self.hfu:.1%}; "
            f"{self.tokens_per_second_per_gpu:,.0f} tokens/s per GPU",
            "  assumes: " + "; ".join(self.assumptions),
        ]
        return "\n".join(lines)


def _link(link, bandwidth):
    link = get_link(link)
    return link.measured() if bandwidth == "measured" else link


def _fused_layer_bytes(m, tp, tokens, recompute) -> int:
    """Bytes one layer's fused elementwise kernels move for one microbatch of ``tokens``
    (forward, backward, and the forward again if ``recompute``): see the module."""
    hd = m.hidden // m.heads
    x = (tokens // tp if tp > 1 else tokens) * m.hidden  # norms, residuals: the SP shard
    qk = tokens * (m.heads + m.kv_heads) // tp * hd
    f = tokens * m.intermediate // tp
    forward = 2 * (2 * x + 2 * x) + 2 * (3 * 2 * x) + 2 * 2 * qk + 3 * 2 * f
    backward = 2 * (3 * 2 * x) + 2 * (3 * 2 * x) + 2 * 2 * qk + 5 * 2 * f
    return forward * (1 + recompute) + backward


def _report_calls(report, axis):
    """``(kind, ranks, nbytes)`` of the report's collectives on ``axis``, per microbatch."""
    calls = [c for c in report.collectives if c.axis == axis]
    # the step's microbatches: a pipeline's schedule, or gradient accumulation's
    per = max(1, getattr(report, "microbatches", None)
              or getattr(report.layout, "accumulate", 1))
    return [(c.kind, c.ranks, c.nbytes) for c in calls[: len(calls) // per]]


def _memory_bound_bytes(m, memory_bound, report, *, layers, tp, tokens, pp, dp, mbs, last,
                        checkpointing, grad_bytes) -> tuple[float, int, str]:
    """``(bytes per microbatch, bytes per step, how)`` of the memory-bound kernels of the
    slowest stage (``layers`` layers, ``last`` if it is the last): see the module."""
    if memory_bound == "eager":
        how = "PyTorch eager: the simulated rank's ops, one kernel each"
        return report.moved * layers / max(1, len(report.layers)), report.optimizer_moved, how
    moved = layers * _fused_layer_bytes(m, tp, tokens, _RECOMPUTE_ELEMENTWISE[checkpointing])
    if last:
        moved += 2 * 2 * tokens * -(-m.vocab // tp)  # fused cross-entropy
    params = m.layer_parameters(tp)[0] * layers
    # each gather's copy-out (bf16 read and written); the reduce-scatter's copy-in reads the
    # unsharded gradients (fp32 when accumulated across microbatches, else bf16) and writes
    # them at grad_bytes
    unsharded = 4 if pp > 1 or mbs > 1 else 2
    copies = (1 if pp > 1 else 2 * mbs) * 2 * 2 * params + (unsharded + grad_bytes) * params
    per_step = (copies if dp > 1 else 0) + 28 * params // dp  # and fused AdamW on the shards
    return moved, per_step, "fused: each elementwise region one kernel"


def _checked(model, layout, knobs, *, grad_bytes, bandwidth, memory_bound, report,
             hbm_bandwidth, matmul_efficiency, attention_efficiency, sustained):
    """``(model, layout, grad_bytes, attention_efficiency, bubble)`` for `step_time`, every
    input checked (its Raises), the defaults filled in."""
    m = get_model(model)
    if not isinstance(m, Transformer) or m.experts > 1:
        raise CalculatorError("step_time models a dense Transformer (a preset such as "
                              "'Llama-3 405B'); mixtures of experts are not modelled")
    lay = as_layout(layout, knobs, "step_time")
    lay.check(m)
    for name in ("replicate", "ep"):
        if getattr(lay, name) > 1:
            raise CalculatorError(f"step_time does not model {name}={getattr(lay, name)}: "
                                  f"use {name}=1")
    if lay.tp > 1 and not lay.sequence_parallel:
        raise CalculatorError("step_time models tensor parallelism with sequence parallelism: "
                              "use sequence_parallel=True")
    if grad_bytes is None:
        grad_bytes = PRECISIONS[lay.precision][1]
    positive_int(grad_bytes, "grad_bytes")
    choice(bandwidth, "bandwidth", ("measured", "peak"))
    choice(memory_bound, "memory_bound", MEMORY_BOUND)
    if memory_bound == "eager" and report is None:
        raise CalculatorError("memory_bound='eager' times the ops a simulated rank ran: give "
                              "report=distlab.scale.simulate_rank(model, layout), or "
                              "memory_bound='fused' for the formula")
    if not hbm_bandwidth > 0:
        raise CalculatorError(f"hbm_bandwidth={hbm_bandwidth!r}: bytes per second, above 0 "
                              "(3.35e12 for an H100 SXM)")
    attention_efficiency = attention_efficiency or matmul_efficiency
    for name, value in (("matmul_efficiency", matmul_efficiency),
                        ("attention_efficiency", attention_efficiency), ("sustained", sustained)):
        if not 0 < value <= 1:
            raise CalculatorError(f"{name}={value!r}: a share of the peak, in (0, 1] (0.80 is "
                                  "80%)")
    idle = bubble(lay.pp, lay.steps, lay.virtual_stages, lay.schedule) if lay.pp > 1 else (
        Fraction(0))
    m.check_tp(lay.tp)
    return m, lay, grad_bytes, attention_efficiency, idle


@dataclass(frozen=True)
class _Stage:
    """The slowest pipeline stage's compute, per microbatch (`_slowest_stage`): FLOPs of one
    layer's matmuls (``matmul_f``) and attention (``attn_f``) forward, of the output layer
    (``out_f``), attention's per token over all layers (``attn_tok``); the rates they run at;
    one layer's forward and backward seconds; its ``layers``, its ``compute`` seconds, and
    whether it is the ``last`` stage."""

    s_q: int
    matmul_f: float
    attn_tok: float
    out_f: float
    matmul_s: float
    layer_fwd: float
    layer_bwd: float
    re_mm: object
    re_at: float
    layers: int
    compute: float
    last: bool


def _slowest_stage(m, lay, matmul_s, attn_s) -> _Stage:
    """The slowest pipeline stage of ``lay``, its matmuls at ``matmul_s`` FLOP/s and attention
    at ``attn_s``, with the recomputation ``lay.checkpointing`` asks for."""
    tp, pp = lay.tp, lay.pp
    s_q = lay.micro_batch * lay.seq_len // lay.cp
    matmul_f = 2 * (m.layer_parameters(tp)[0] - 2 * m.hidden) * s_q  # one layer, forward
    attn_tok = attention_flops(m, lay.seq_len)  # per token, forward and backward, all layers
    attn_f = attn_tok / (3 * m.layers) * s_q / tp  # one layer's forward, this rank's heads
    out_f = 2 * m.hidden * -(-m.vocab // tp) * s_q
    re_mm, re_at = _RECOMPUTE[lay.checkpointing]
    layer_fwd = matmul_f / matmul_s + attn_f / attn_s
    layer_bwd = ((2 + float(re_mm)) * matmul_f / matmul_s
                 + (2.5 + re_at) * attn_f / attn_s)
    stages = [len(r) for r in stage_layers(m.layers, pp)]
    stage_s = [n * (layer_fwd + layer_bwd) + (3 * out_f / matmul_s if i == pp - 1 else 0)
               for i, n in enumerate(stages)]
    slowest = max(range(pp), key=stage_s.__getitem__)
    return _Stage(s_q, matmul_f, attn_tok, out_f, matmul_s, layer_fwd, layer_bwd, re_mm, re_at,
                  stages[slowest], stage_s[slowest], slowest == pp - 1)


def _compute_term(st, lay, matmul_efficiency, attention_efficiency, sustained) -> Term:
    """The slowest stage's compute per microbatch, as a `Term`."""
    return Term(f"compute, {st.layers} layers", st.compute, st.compute,
                f"matmuls at {matmul_efficiency:.0%} of peak, attention at "
                f"{attention_efficiency:.0%}, recompute '{lay.checkpointing}'"
                + (f", x {sustained:.2f} sustained" if sustained != 1 else ""))


def _tp_cp_calls(m, lay, st, report) -> tuple[list, list]:
    """``(kind, ranks, bytes, calls)`` of the TP and of the CP collectives of the slowest
    stage per microbatch: the ``report``'s recorded ones, or the formulas' (see the module)."""
    tp, cp, layers = lay.tp, lay.cp, st.layers
    if report is not None:  # what the simulated rank recorded, per microbatch, its layers
        rl = max(1, len(report.layers))
        return ([(k, n, b, layers / rl) for k, n, b in _report_calls(report, "tp")],
                [(k, n, b, layers / rl) for k, n, b in _report_calls(report, "cp")])
    act = st.s_q * m.hidden * 2  # one microbatch's bf16 activations, whole sequence shard
    redo = 1 if lay.checkpointing == "full" else 0
    regather = redo or lay.checkpointing.startswith("op-selective")  # not saved: run again
    tp_calls = [] if tp == 1 else [("all_gather", tp, act, (4 + 2 * regather) * layers),
                                   ("reduce_scatter", tp, act, (4 + 2 * redo) * layers)]
    hd = m.hidden // m.heads
    kv = 2 * lay.micro_batch * lay.seq_len * (m.kv_heads // tp) * hd * 2  # K and V, bf16
    cp_calls = [] if cp == 1 else [("all_gather", cp, kv, (1 + redo) * layers),
                                   ("reduce_scatter", cp, kv, layers)]
    return tp_calls, cp_calls


def _communication_terms(m, lay, st, report, fast, slow, async_tp) -> list[Term]:
    """The TP, CP and PP terms of a microbatch on the slowest stage (see the module)."""
    terms = []
    tp_calls, cp_calls = _tp_cp_calls(m, lay, st, report)
    tp_time = sum(n * collective_time(k, int(b), r, fast).seconds for k, r, b, n in tp_calls)
    if tp_time:
        matmuls = st.layers * (3 + float(st.re_mm)) * st.matmul_f / st.matmul_s
        exposed = max(0.0, tp_time - matmuls) if async_tp else tp_time
        terms.append(Term("TP all-gathers, reduce-scatters", tp_time, exposed,
                          "async TP: hidden behind the matmuls" if async_tp else
                          f"exposed, on {fast.name}"))
    cp_time = sum(n * collective_time(k, int(b), r, slow).seconds for k, r, b, n in cp_calls)
    if cp_time:
        terms.append(Term("CP all-gather of K/V, reduce-scatter", cp_time, cp_time,
                          f"exposed, on {slow.name}"))
    if lay.pp > 1:
        # each of the rank's v stages sends its output forward and its input's gradient
        # backward once per microbatch; a stage's send hides behind that stage's next forward
        # (backward): per stage, like against like
        v, act = lay.virtual_stages, st.s_q * m.hidden * 2
        one = collective_time("send", act // lay.tp, 2, slow).seconds
        fwd = (st.layers * st.layer_fwd + (st.out_f / st.matmul_s if st.last else 0)) / v
        bwd = (st.compute - v * fwd) / v
        send = 2 * v * one
        terms.append(Term("PP sends, forward and backward", send,
                          v * (max(0.0, one - fwd) + max(0.0, one - bwd)),
                          f"hidden behind the next microbatch, on {slow.name}"))
    return terms


def _memory_bound_terms(m, lay, st, report, memory_bound, grad_bytes, hbm) -> tuple[list, list]:
    """The memory-bound kernels of a microbatch on the slowest stage (on the critical path),
    and those of the step (FSDP's copies, the optimizer's step), at ``hbm`` bytes/s: each a
    list of no `Term` or one."""
    if memory_bound == "none":
        return [], []
    moved, per_step, how = _memory_bound_bytes(
        m, memory_bound, report, layers=st.layers, tp=lay.tp, tokens=st.s_q, pp=lay.pp,
        dp=lay.dp, mbs=lay.steps, last=st.last, checkpointing=lay.checkpointing,
        grad_bytes=grad_bytes)
    kernels = [Term("memory-bound kernels", moved / hbm, moved / hbm,
                    f"{how}, at {hbm / 1e12:.2f} TB/s")]
    if not per_step:
        return kernels, []
    return kernels, [Term("optimizer step" if memory_bound == "eager" else
                          "FSDP copies, optimizer step", per_step / hbm, per_step / hbm,
                          f"memory-bound, at {hbm / 1e12:.2f} TB/s", per="step")]


def _fsdp_term(m, lay, st, grad_bytes, dpl) -> Term:
    """FSDP's all-gathers and reduce-scatters of the slowest stage's layers in one step, the
    excess over a layer's compute exposed (see the module)."""
    pp, mbs = lay.pp, lay.steps
    params = m.layer_parameters(lay.tp)[0]  # one layer's, gathered and reduced layer by layer
    # with PP the gathered layers stay for the step (torchtitan, Llama 3): one gather;
    # without, FSDP reshards after forward and gathers again in backward
    gathers = 1 if pp > 1 else 2 * mbs
    gather = collective_time("all_gather", 2 * params, lay.dp, dpl).seconds
    scatter = collective_time("reduce_scatter", grad_bytes * params, lay.dp, dpl).seconds
    exposed = st.layers * (max(0.0, gather - st.layer_fwd) * (1 if pp > 1 else mbs)
                           + max(0.0, gather - st.layer_bwd) * (0 if pp > 1 else mbs)
                           + max(0.0, scatter - st.layer_bwd))
    return Term(f"FSDP gather, reduce-scatter (fp{8 * grad_bytes})",
                st.layers * (gathers * gather + scatter), exposed,
                "prefetched a layer ahead: the excess over a layer's compute "
                f"exposed, on {dpl.name}", per="step")


def _assumptions(lay, idle, fast, slow, *, matmul_efficiency, peak_flops, sustained, bandwidth,
                 memory_bound, hbm) -> tuple[str, ...]:
    """Every input of a `StepTime`, in words."""
    return (
        f"matmuls at {matmul_efficiency:.1%} of {peak_flops / 1e12:.0f} TFLOP/s",
        *((f"matmuls and attention at {sustained:.1%} of their own rate (sustained in the "
            "job)",)
          if sustained != 1 else ()),
        f"links at their {'NCCL-measured busbw' if bandwidth == 'measured' else 'peak'} "
        f"({fast.bandwidth / 1e9:.0f} and {slow.bandwidth / 1e9:.0f} GB/s)",
        f"recomputation '{lay.checkpointing}'",
        f"bubble {idle} of the wall time",
        "memory-bound kernels not timed" if memory_bound == "none" else
        f"memory-bound kernels {memory_bound} at {hbm / 1e12:.2f} TB/s",
    )


def _step_time(m, lay, st, terms, idle, step, peak_flops, assumptions) -> StepTime:
    """The `StepTime` of ``terms`` and ``step`` seconds: tokens, GPUs and FLOPs counted."""
    tp, cp, pp, dp, v = lay.tp, lay.cp, lay.pp, lay.dp, lay.virtual_stages
    tokens = dp * lay.steps * lay.micro_batch * lay.seq_len
    flops_6n = 6 * m.parameters()
    # what the GPUs run: 6N plus the recomputed forward share (2N each), attention's forward,
    # its 2.5x backward and its recomputation
    hardware = tokens * (flops_6n * (1 + float(st.re_mm) / 3)
                         + st.attn_tok * (3.5 + st.re_at) / 3)
    layout = f"TP {tp} x CP {cp} x PP {pp} x DP {dp}" + (
        f", {lay.schedule}" + (f" v={v}" if v > 1 else "") if pp > 1 else "")
    return StepTime(m, layout, lay.steps, tuple(terms), idle, step, tokens, tp * cp * pp * dp,
                    peak_flops, flops_6n, flops_6n + st.attn_tok, hardware, assumptions)


def step_time(model, layout: Layout | None = None, *, matmul_efficiency=MATMUL_EFFICIENCY,
              attention_efficiency=None, peak_flops=H100_PEAK, bandwidth="measured",
              nvlink="NVLink 4 (H100 SXM)", network="InfiniBand NDR (400 Gb/s)", dp_link=None,
              async_tp=False, grad_bytes=None, memory_bound="fused", hbm_bandwidth=H100_HBM,
              report=None, sustained=1.0, **knobs) -> StepTime:
    """Predict one training step's time and MFU (the module says how).

    Args:
        model: a `Transformer` or a preset's name ("Llama-3 405B").
        layout: a `Layout` (None: ``Layout()``); its knobs may also be given as keywords
            (``step_time("Llama-3 405B", tp=8, pp=16, dp=128)``), as `memory_per_device`
            takes them. Read here: tp, cp, pp, dp (TP inside a node, on ``nvlink``; the others
            across nodes, on ``network``), seq_len, micro_batch, microbatches (per step through
            each pipeline, or accumulated without one; default pp; tokens per step: dp x
            microbatches x micro_batch x seq_len), schedule, virtual_stages, checkpointing and
            precision (the default ``grad_bytes``). The DP collectives are FSDP's (an
            all-gather and a reduce-scatter per layer) for any ``zero``: DDP's all-reduce moves
            the bytes of one of each.
        matmul_efficiency: the share of ``peak_flops`` the matmuls reach (default 0.80, the
            measured H100 MAMF); attention_efficiency: attention's (default: the same).
        peak_flops: one GPU's peak, FLOP/s (default H100 SXM dense bf16, 989e12).
        bandwidth: "measured" (each link's NCCL-measured busbw, `Link.measured`) or "peak".
        nvlink, network: `Link`\\ s or preset names (`LINKS`).
        dp_link: the link FSDP's collectives use (default ``network``; ``nvlink`` for FSDP
            inside one node).
        async_tp: TP's collectives overlapped with the matmuls (async TP), not exposed.
        grad_bytes: bytes per gradient in FSDP's reduce-scatter (default: the layout's
            precision's gradient, 4 for "bf16-fsdp2": fp32, as Llama 3).
        memory_bound: "fused" (each elementwise region one kernel), "eager" (every op of the
            simulated rank one kernel: needs ``report``) or "none" (not timed).
        hbm_bandwidth: the GPU memory's bytes/s for the memory-bound kernels (default H100
            SXM's peak, 3.35e12).
        report: optional `distlab.scale.RankReport`: its recorded TP and CP collectives are
            timed instead of the formulas, and with ``memory_bound="eager"`` the bytes its
            memory-bound ops moved.
        sustained: the share of the matmuls' and attention's own FLOP/s that a training job's
            SMs sustain (default 1: nothing lost). What a job loses that a kernel timed alone
            does not: power (torchtitan's H100s ran at 500 W; MAMF is measured at 700 W), SMs
            shared with NCCL's kernels while collectives overlap, clocks lowered under heat,
            launch gaps and synchronisation between kernels. Not the memory-bound kernels (a
            power cap lowers the SMs' clock, not the HBM's: they stay at ``hbm_bandwidth``),
            not the links (their NCCL-measured busbw is already sustained). Taken from measured
            runs: `bench/steptime_accuracy.py` declares its calibration rows and checks the
            value on the others.

    Returns:
        A `StepTime`.

    Raises:
        CalculatorError (a `distlab.DistlabError` and a ValueError): a knob `Layout` refuses;
            ``replicate`` or ``ep`` above 1, or tp > 1 without ``sequence_parallel`` (not
            modelled); an unknown bandwidth; a model that is not a dense `Transformer` (MoE is
            not modelled); an efficiency outside (0, 1]; a link with
            no measured bandwidth when "measured" is asked (give ``bandwidth="peak"``);
            ``memory_bound="eager"`` without a ``report``; ``hbm_bandwidth`` not above 0;
            ``sustained`` outside (0, 1].
    """
    m, lay, grad_bytes, attention_efficiency, idle = _checked(
        model, layout, knobs, grad_bytes=grad_bytes, bandwidth=bandwidth,
        memory_bound=memory_bound, report=report, hbm_bandwidth=hbm_bandwidth,
        matmul_efficiency=matmul_efficiency, attention_efficiency=attention_efficiency,
        sustained=sustained)
    fast, slow = _link(nvlink, bandwidth), _link(network, bandwidth)
    dpl = slow if dp_link is None else _link(dp_link, bandwidth)
    # the HBM's own clock: a power cap lowers the SMs', not the memory's (see the module)
    hbm = hbm_bandwidth
    st = _slowest_stage(m, lay, peak_flops * matmul_efficiency * sustained,
                        peak_flops * attention_efficiency * sustained)
    terms = [_compute_term(st, lay, matmul_efficiency, attention_efficiency, sustained),
             *_communication_terms(m, lay, st, report, fast, slow, async_tp)]
    kernels, per_step = _memory_bound_terms(m, lay, st, report, memory_bound, grad_bytes, hbm)
    terms += kernels  # per microbatch, on the critical path; per step apart
    step = lay.steps * sum(t.exposed for t in terms) / float(1 - idle)
    for t in [*per_step, *([_fsdp_term(m, lay, st, grad_bytes, dpl)] if lay.dp > 1 else [])]:
        terms.append(t)
        step += t.exposed
    return _step_time(m, lay, st, terms, idle, step, peak_flops, _assumptions(
        lay, idle, fast, slow, matmul_efficiency=matmul_efficiency, peak_flops=peak_flops,
        sustained=sustained, bandwidth=bandwidth, memory_bound=memory_bound, hbm=hbm))
