"""The memory calculator's answer beside the simulated rank's, part by part.

    laid = scale.lay_out("Llama-3 70B", scale.Layout(dp=8, tp=8, checkpointing="full"))
    scale.against_calculator(laid)      # a table: simulated, calculator, calculator / simulated

The calculator is asked the same question the simulation answered: the same model, sizes,
checkpointing, schedule and pipeline stage (`Layout.memory`: the one mapping from a layout
to the calculator's arguments; the precisions carry the same names in both). Knows nothing
about how either is computed.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..calculators._text import GB
from ..calculators.memory_estimate import MemoryEstimate
from .lay_out import LaidOut
from .report import RankReport

__all__ = ["PARTS", "CalculatorCheck", "against_calculator", "calculator_for"]

#: What is compared: (label, RankReport attribute, MemoryEstimate attribute).
PARTS = (("parameters", "params", "params"), ("gradients", "grads", "grads"),
         ("Adam state", "optimizer", "optimizer"),
         ("activations, one microbatch", "activations", "per_microbatch"),
         ("peak", "peak", "peak"))


def calculator_for(report: RankReport) -> MemoryEstimate:
    """`memory_per_device` asked about the rank ``report`` simulated (`Layout.memory`)."""
    return report.layout.memory(report.model, stage=report.stage)


@dataclass(frozen=True)
class CalculatorCheck:
    """``rows``: (rank's stage, part, simulated bytes, calculator bytes), in `PARTS` order."""

    laid: LaidOut
    rows: tuple

    def worst(self) -> float:
        """The largest relative difference, |calculator / simulated - 1|, over every row."""
        return max(abs(calc / sim - 1) if sim else float(calc != 0)
                   for _, _, sim, calc in self.rows)

    def text(self) -> str:
        lines = [f"{self.laid.model.name} on {self.laid.layout.text()}",
                 f"{'pp rank':>7}  {'':28}{'simulated GB':>13}{'calculator GB':>15}"
                 f"{'calc/sim':>10}"]
        for stage, part, sim, calc in self.rows:
            ratio = f"{calc / sim:.4f}" if sim else "-"
            lines.append(f"{stage:>7}  {part:28}{sim / GB:>13.3f}{calc / GB:>15.3f}{ratio:>10}")
        return "\n".join(lines)

    __repr__ = __str__ = text


def against_calculator(laid: LaidOut) -> CalculatorCheck:
    """Every simulated rank of ``laid`` beside `calculator_for` it, part by part."""
    rows = []
    for report in laid.ranks:
        est = calculator_for(report)
        for label, sim_attr, calc_attr in PARTS:
            rows.append((report.stage, label, getattr(report, sim_attr), getattr(est, calc_attr)))
    return CalculatorCheck(laid, tuple(rows))
