"""Communication time from the alpha-beta model: one collective, or one training step.

    from distlab.calculators import collective_time, step_comm
    collective_time("all_reduce", 2**30, ranks=8, link="NVLink 4 (H100 SXM)")   # 1 GiB, 8 GPUs
    step_comm("FSDP", "Llama-3 8B", ranks=64, link="InfiniBand NDR (400 Gb/s)")

A message of S bytes costs alpha + S beta (`links`). A collective of S bytes on N ranks costs
its messages in a row times alpha plus the bytes on its critical path times beta. S is each
rank's buffer: the input of all_reduce, reduce_scatter, broadcast and all_to_all, the output of
all_gather. With L = ceil(log2 N):

    ring (notebook 08's, each rank talks to its neighbours):
      all_reduce      2(N-1) alpha + 2(N-1)/N S beta    reduce-scatter, then all-gather
      reduce_scatter   (N-1) alpha +  (N-1)/N S beta
      all_gather       (N-1) alpha +  (N-1)/N S beta
      all_to_all       (N-1) alpha +  (N-1)/N S beta    pairwise exchange, S/N to each rank
      broadcast   (L + N-1) alpha + 2(N-1)/N S beta    scatter, then a ring all-gather
    tree (log-depth):
      all_reduce          2L (alpha + S beta)          notebook 08's binomial tree, up and down
      broadcast            L (alpha + S beta)          binomial tree
      reduce_scatter       L alpha + (N-1)/N S beta    recursive halving
      all_gather           L alpha + (N-1)/N S beta    recursive doubling
      all_to_all           L alpha + L S/2 beta        Bruck's algorithm

(The ring broadcast and the tree rows other than notebook 08's are Thakur, Rabenseifner and
Gropp, "Optimization of Collective Communication Operations in MPICH", 2005, for N a power of
two.) NCCL's trees differ: two binary trees, each carrying half the data in pipelined chunks, so
the bandwidth term does not grow with log N; NCCL's own cost model (src/graph/tuning.cc) times a
tree all_reduce at about 2 S / busbw, like the ring's 2(N-1)/N S / busbw.

A training step (`step_comm`) adds up the collectives of one layout, one after another (none
overlapped with compute): DDP all-reduces the gradients; FSDP all-gathers the parameters twice
(forward, backward) and reduce-scatters the gradients; tensor parallelism (Megatron-LM) runs 4
all-reduces of one microbatch's activations per layer (2 forward, 2 backward); pipeline
parallelism sends each microbatch's activations forward and their gradients back. Each is
counted as one call of its total size: DDP's buckets and FSDP's per-layer units add
(calls - 1) x their messages x alpha.

Knows nothing about drawing: `charts` draws these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from .._config import check_int
from ._text import CalculatorError, Printed, choice, human_bytes, positive_int, seconds
from .links import Link, get_link
from .memory_estimate import PRECISIONS
from .models import Transformer, get_model

__all__ = ["ALGORITHMS", "COLLECTIVES", "LAYOUTS", "CollectiveTime", "StepComm",
           "collective_time", "step_comm"]

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast")
ALGORITHMS = ("ring", "tree")
LAYOUTS = ("DDP", "FSDP", "TP", "PP")
_FORMULAS = {
    ("ring", "all_reduce"): "2(N-1) alpha + 2(N-1)/N S beta",
    ("ring", "reduce_scatter"): "(N-1) alpha + (N-1)/N S beta",
    ("ring", "all_gather"): "(N-1) alpha + (N-1)/N S beta",
    ("ring", "all_to_all"): "(N-1) alpha + (N-1)/N S beta",
    ("ring", "broadcast"): "(L + N-1) alpha + 2(N-1)/N S beta",
    ("tree", "all_reduce"): "2L (alpha + S beta)",
    ("tree", "broadcast"): "L (alpha + S beta)",
    ("tree", "reduce_scatter"): "L alpha + (N-1)/N S beta",
    ("tree", "all_gather"): "L alpha + (N-1)/N S beta",
    ("tree", "all_to_all"): "L alpha + L S/2 beta",
    ("p2p", "send"): "alpha + S beta",
}


@dataclass(frozen=True, repr=False)
class CollectiveTime(Printed):
    """The alpha-beta time of one collective. ``messages``: messages in a row (times alpha);
    ``critical``: bytes on the critical path (times beta); ``sent``: bytes the busiest rank
    sends (exact `Fraction`\\ s); ``seconds``: the time. ``algbw`` is S / time and ``busbw``
    algbw x 2(N-1)/N for all_reduce, x (N-1)/N for the others (nccl-tests' definitions)."""

    op: str
    algorithm: str
    size: int
    ranks: int
    link: Link
    messages: int
    critical: Fraction
    sent: Fraction

    @property
    def seconds(self) -> float:
        return self.messages * self.link.alpha + float(self.critical) * self.link.beta

    @property
    def algbw(self) -> float:
        return self.size / self.seconds if self.seconds else math.inf

    @property
    def busbw(self) -> float:
        n = self.ranks
        factor = 2 * (n - 1) / n if self.op == "all_reduce" else (n - 1) / n
        return self.algbw * factor

    @property
    def formula(self) -> str:
        return _FORMULAS[self.algorithm, self.op]

    def text(self) -> str:
        return (
            f"{self.op} of {human_bytes(self.size)} on {self.ranks} ranks, {self.algorithm}, "
            f"over {self.link.name}:\n"
            f"  {self.formula} = {self.messages} x {seconds(self.link.alpha)} + "
            f"{human_bytes(self.critical)} / {human_bytes(self.link.bandwidth)}/s "
            f"= {seconds(self.seconds)}\n"
            f"  the busiest rank sends {human_bytes(self.sent)}; "
            f"algbw {human_bytes(self.algbw)}/s, busbw {human_bytes(self.busbw)}/s"
        )

    def at(self, size: int, algorithm: str | None = None) -> CollectiveTime:
        """The same collective on the same ranks and link, of ``size`` bytes (and with
        ``algorithm``, default this one's): `collective_time` with the other arguments kept."""
        return collective_time(self.op, size, self.ranks, self.link, algorithm or self.algorithm)


def collective_time(op, size, ranks, link="NVLink 4 (H100 SXM)", algorithm="ring"):
    """The alpha-beta time of collective ``op`` of ``size`` bytes on ``ranks`` ranks.

    Args:
        op: "all_reduce", "reduce_scatter", "all_gather", "all_to_all" or "broadcast" (or
            "send": one point-to-point message, for `step_comm`).
        size: S, bytes of each rank's buffer (all_gather: its output), an int >= 0.
        ranks: N >= 1.
        link: a `Link`, a preset's name (`LINKS`) or "fit" (your saved fit, `load_fit`).
        algorithm: "ring" or "tree" (see the module's formulas).

    Returns:
        A `CollectiveTime`.

    Raises:
        CalculatorError (a ValueError): an unknown op, algorithm or link; size not a whole
            number of bytes >= 0 (``int(1e9)``, not ``1e9``); ranks not a whole number >= 1.
        FileNotFoundError: link="fit" before any fit was saved.
    """
    if op != "send":
        choice(op, "op", COLLECTIVES)
        choice(algorithm, "algorithm", ALGORITHMS)
    check_int(size, "size", low=0, noun="a whole number of bytes", error=CalculatorError,
              hint=" (e.g. int(1e9) or 2**30)")
    n = positive_int(ranks, "ranks")
    link = get_link(link)
    S, L = Fraction(size), math.ceil(math.log2(n)) if n > 1 else 0
    part = S * (n - 1) / n
    if op == "send":
        algorithm, messages, critical, sent = "p2p", 1, S, S
    elif n == 1:
        messages, critical, sent = 0, Fraction(0), Fraction(0)
    elif algorithm == "ring":
        messages, critical = {
            "all_reduce": (2 * (n - 1), 2 * part), "broadcast": (L + n - 1, 2 * part),
        }.get(op, (n - 1, part))
        sent = critical
    else:
        messages, critical, sent = {
            "all_reduce": (2 * L, 2 * L * S, L * S), "broadcast": (L, L * S, L * S),
            "all_to_all": (L, L * S / 2, L * S / 2),
        }.get(op, (L, part, part))
    return CollectiveTime(op, algorithm, size, n, link, messages, critical, sent)


@dataclass(frozen=True, repr=False)
class StepComm(Printed):
    """The communication of one training step on one rank: ``calls`` are ``(what, count,
    CollectiveTime)``; ``sent`` the bytes this rank sends (an int); ``seconds`` their time,
    one after another."""

    layout: str
    model: object
    ranks: int
    link: Link
    calls: tuple

    @property
    def sent(self) -> int:
        return int(sum(count * t.sent for _, count, t in self.calls))

    @property
    def seconds(self) -> float:
        return sum(count * t.seconds for _, count, t in self.calls)

    def text(self) -> str:
        lines = [f"{self.layout} on {self.ranks} ranks, {self.model.name}, over {self.link.name}"]
        for what, count, t in self.calls:
            lines.append(f"  {count} x {t.op} of {human_bytes(t.size)} ({what}): "
                         f"{count} x {seconds(t.seconds)}")
        lines.append(f"  per step and rank: sends {self.sent:,} bytes "
                     f"({human_bytes(self.sent)}), {seconds(self.seconds)}")
        return "\n".join(lines)


def step_comm(layout, model, ranks, link="NVLink 4 (H100 SXM)", *, precision="bf16-mixed",
              seq_len=2048, micro_batch=1, microbatches=1, algorithm="ring") -> StepComm:
    """The communication one rank does in one training step of ``layout``.

    Args:
        layout: "DDP", "FSDP", "TP" (tensor parallel) or "PP" (pipeline parallel).
        model: a preset's name, a `Transformer`, a `LinearStack` or a number of parameters (TP
            and PP need a `Transformer`: their traffic depends on its hidden size and layers).
        ranks: the size of the group that communicates (dp for DDP and FSDP, tp, pp).
        link, algorithm: as in `collective_time`.
        precision: "fp32" or "bf16-mixed": bytes per parameter, gradient and activation value.
        seq_len, micro_batch, microbatches: the activations' size (TP, PP) and how many
            microbatches a step runs.

    Returns:
        A `StepComm`.

    Raises:
        CalculatorError (a ValueError): an unknown layout, precision or model; TP or PP with a
            model that is not a `Transformer`; and whatever `collective_time` raises.
    """
    choice(layout, "layout", LAYOUTS)
    choice(precision, "precision", PRECISIONS)
    m = get_model(model)
    for name, value in (("seq_len", seq_len), ("micro_batch", micro_batch),
                        ("microbatches", microbatches)):
        positive_int(value, name)
    p_bytes, g_bytes, _ = PRECISIONS[precision]
    psi = m.parameters()
    if layout == "DDP":
        calls = [("gradients", 1, collective_time("all_reduce", psi * g_bytes, ranks, link,
                                                  algorithm))]
    elif layout == "FSDP":
        gather = collective_time("all_gather", psi * p_bytes, ranks, link, algorithm)
        calls = [("parameters, forward and backward", 2, gather),
                 ("gradients", 1, collective_time("reduce_scatter", psi * g_bytes, ranks, link,
                                                  algorithm))]
    else:
        if not isinstance(m, Transformer):
            raise CalculatorError(
                f"{layout} traffic depends on a transformer's hidden size and layers; "
                f"{m.name or 'a parameter count'} has none: choose a Transformer preset"
            )
        act = seq_len * micro_batch * m.hidden * p_bytes  # one microbatch's activations
        if layout == "TP":
            calls = [(f"activations, 4 per layer x {m.layers} layers x {microbatches} "
                      "microbatches", 4 * m.layers * microbatches,
                      collective_time("all_reduce", act, ranks, link, algorithm))]
        else:
            calls = [(f"activations forward, gradients back, x {microbatches} microbatches",
                      2 * microbatches, collective_time("send", act, 2, link))]
    return StepComm(layout, m, positive_int(ranks, "ranks"), get_link(link), tuple(calls))
