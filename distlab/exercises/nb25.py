"""Graders for notebook 25, at scale on a laptop (see `distlab.exercises`).

Exercise 1 compares the learner's count with the memory calculator, which matches PyTorch's own
code on simulated ranks byte for byte for these parts (tests/test_scale_calculators.py), over
layouts the learner cannot guess. Exercise 2 is arithmetic, checked on values drawn for it.
"""

from __future__ import annotations

import math
import numbers
import random

from . import expect

#: (tp, pp, dp) layouts exercise 1 tries, the paper's first.
LAYOUTS_1 = [(8, 16, 128), (8, 8, 16), (4, 9, 32), (2, 1, 8), (1, 2, 3), (8, 5, 64)]


def exercise_1(state_bytes) -> None:
    """``state_bytes(stage, tp, pp, dp)``: the bytes of parameters, gradients and Adam state one
    rank holds on pipeline ``stage`` of Llama-3 405B with FSDP2 in bf16 mixed precision (16
    bytes per parameter, sharded over dp), for several layouts and every stage kind."""
    from ..calculators import PRESETS, memory_per_device

    model = PRESETS["Llama-3 405B"]
    for tp, pp, dp in LAYOUTS_1:
        for stage in sorted({0, min(1, pp - 1), pp // 2, pp - 1}):
            want = memory_per_device(model, dp=dp, tp=tp, pp=pp, stage=stage, zero=3,
                                     precision="bf16-fsdp2")
            want = want.params + want.grads + want.optimizer
            got = state_bytes(stage, tp, pp, dp)
            what = f"state_bytes({stage}, {tp}, {pp}, {dp})"
            if not isinstance(got, numbers.Integral) or isinstance(got, bool):
                hint = " (bytes are whole numbers: round up each shard with -(-n // dp))" if (
                    isinstance(got, float)) else ""
                raise AssertionError(f"{what} should be an int of bytes, got "
                                     f"{expect.describe(got)}{hint}")
            if got != want:
                raise AssertionError(f"{what} gave {got:,} bytes; a rank of stage {stage} holds "
                                     f"{want:,}{_hint_1(got, want, stage, tp, pp, dp)}")
    return None


def _hint_1(got, want, stage, tp, pp, dp) -> str:
    from ..calculators import PRESETS, stage_layers

    m = PRESETS["Llama-3 405B"]
    dense, _ = m.layer_parameters(tp)
    layers = len(stage_layers(m.layers, pp)[stage])
    ends = m.end_parameters(tp, pp, stage)
    if got == 16 * (dense * layers + ends):
        return " (FSDP shards over the dp ranks too: divide by dp)"
    if pp > 1 and m.layers % pp and got == 16 * -(-(dense * (m.layers // pp) + ends) // dp):
        return (f" ({m.layers} layers do not divide into {pp} equal stages: the Llama 3 paper "
                "gives the first and last stages fewer; calculators.stage_layers says how many)")
    if got == 16 * -(-(dense * layers) // dp):
        return " (the first stage also holds the embedding, the last the norm and output layer)"
    h, d = m.hidden, m.hidden // m.heads
    no_gqa = dense + 2 * (m.heads - m.kv_heads) * d * h // tp  # k and v with every query head
    if got == 16 * -(-(no_gqa * layers + ends) // dp):
        return (f" (grouped-query attention: k and v have {m.kv_heads} heads, the queries "
                f"{m.heads})")
    if abs(got / want - 1) < 0.02:
        return (" (close: check what tensor parallelism leaves whole, the norms, and that "
                "grouped-query attention's k and v have 8 heads, not 128)")
    return ""


def exercise_2(min_tokens) -> None:
    """``min_tokens(dp, flops, bandwidth)``: the fewest tokens per rank at which a layer's
    forward matmuls (2 FLOPs per parameter per token, at ``flops`` FLOP/s) take at least as long
    as FSDP's all-gather of that layer's bf16 parameters over ``dp`` ranks (a ring: each rank
    receives (dp - 1) / dp of them, at ``bandwidth`` bytes/s), so that prefetching hides it."""
    rng = random.Random(25)
    cases = [(8, 989e12 * 0.5, 50e9), (2, 400e12, 25e9), (64, 312e12, 100e9)]
    cases += [(rng.randint(2, 512), rng.uniform(1e14, 2e15), rng.uniform(1e10, 9e11))
              for _ in range(5)]
    for dp, flops, bandwidth in cases:
        want = (dp - 1) / dp * flops / bandwidth
        got = min_tokens(dp, flops, bandwidth)
        what = f"min_tokens({dp}, {flops:.3g}, {bandwidth:.3g})"
        if not isinstance(got, numbers.Real) or isinstance(got, bool) or not math.isfinite(got):
            raise AssertionError(f"{what} should be a number of tokens, got "
                                 f"{expect.describe(got)}")
        if math.isclose(got, want, rel_tol=1e-6):
            continue
        ratio = got / want if want else float("inf")
        hints = {dp / (dp - 1): " (a ring all-gather moves (dp - 1) / dp of the bytes, not all)",
                 2.0: " (both sides count 2 per parameter: 2 bytes in bf16, 2 FLOPs per token)",
                 0.5: " (both sides count 2 per parameter: 2 bytes in bf16, 2 FLOPs per token)",
                 8.0: " (bandwidth is in bytes per second, not bits)",
                 1 / 3: " (the forward only: one all-gather against the forward's matmuls)"}
        hint = next((h for r, h in hints.items() if math.isclose(ratio, r, rel_tol=1e-3)), "")
        raise AssertionError(f"{what} gave {got:.4g}; the all-gather hides behind the forward "
                             f"from {want:.4g} tokens per rank{hint}")
