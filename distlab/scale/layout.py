"""The simulator's layout: `distlab.calculators.Layout`, the one Layout every tool reads.

    from distlab import scale
    scale.Layout(dp=8, tp=8, pp=16, seq_len=8192)    # Llama 3 405B's pre-training layout

``scale.Layout`` is ``calculators.Layout``: the same class, the same defaults, the same checks,
so ``scale.Layout(dp=8).memory("Llama-3 8B")`` and ``calculators.memory_per_device("Llama-3 8B",
dp=8)`` are one estimate. What the simulator can run beyond a valid layout (PyTorch's FSDP2:
ZeRO 0 or 3, "bf16-fsdp2" or "fp32", eager, the loss upcast) `simulate` checks when it is asked
to run one (`check_runnable`).
"""

from __future__ import annotations

from ..calculators._text import CalculatorError
from ..calculators.layout import CHECKPOINTING, Layout
from ..calculators.models import stage_layers

__all__ = ["CHECKPOINTING", "PRECISIONS", "Layout", "check_runnable", "stage_layers"]

#: The precisions FSDP2 runs (the calculators name more: `calculators.layout.PRECISIONS`).
PRECISIONS = ("bf16-fsdp2", "fp32")


def check_runnable(layout: Layout) -> None:
    """Raise `CalculatorError` unless PyTorch's FSDP2 can run ``layout``: ZeRO 0 (DDP) or 3
    (FSDP), precision "bf16-fsdp2" or "fp32", ``implementation="eager"``, ``loss="upcast"``."""
    if layout.zero in (1, 2):
        raise CalculatorError(
            f"zero={layout.zero}: FSDP2 has no ZeRO-{layout.zero} (parameters whole on every "
            "rank, the optimizer state sharded), so the simulator cannot run it; lay out "
            "zero=3, with reshard_after_forward=False for FSDP's ZeRO-2-like mode, or zero=0. "
            f"The memory calculator models ZeRO-{layout.zero}: "
            f"calculators.memory_per_device(model, layout)")
    if layout.precision not in PRECISIONS:
        raise CalculatorError(
            f"precision={layout.precision!r} is bf16 weights with an fp32 master copy elsewhere "
            "(2 + 2 + 12 or 2 + 4 + 12 bytes per parameter), which FSDP2 does not keep: its "
            "MixedPrecisionPolicy keeps the fp32 shards as the master weights (4 + 4 + 8): "
            "precision=\"bf16-fsdp2\" (or \"fp32\")")
    for name, runs in (("implementation", "eager"), ("loss", "upcast")):
        if getattr(layout, name) != runs:
            raise CalculatorError(f"{name}={getattr(layout, name)!r}: the simulator runs "
                                  f"PyTorch eager as torchtitan does, {name}={runs!r}; the "
                                  "memory calculator models the other")
