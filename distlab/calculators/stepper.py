"""Ring collectives, one step at a time: what every rank holds before and after each step, and
the bytes the step moves.

    from distlab.calculators import ring_steps
    ring = ring_steps("all_reduce", ranks=4, numel=1024)   # 1024 float32 values per rank
    ring.steps[0]              # step 1: who sends which chunk, the bytes, and the picture
    ring.steps[0].picture()    # drawn with distlab.pictures.collective, as notebooks 05 and 08 draw
    ring                       # every step's bytes, and the totals: 2(n-1)/n x 4096 per rank

The ring is notebook 08's: cut the tensor into n chunks with ``torch.tensor_split`` (so lengths
that do not divide evenly give chunks one element apart); in step s of the reduce-scatter, rank r
sends chunk (r - s) mod n to rank r + 1, which adds it to its own; after n - 1 steps rank r owns
the complete sum of chunk (r + 1) mod n. The all-gather then passes the complete chunks round
once more, overwriting (rank r sends chunk (r + 1 - s) mod n). On its own, an all-gather starts
with rank r holding only chunk r, and sends chunk (r - s) mod n. (torch's ``reduce_scatter``
gives rank r chunk r: the same ring, its chunks renumbered.)

The pictures show one cell per chunk, whatever its length: rank r's chunk c starts as
10 r + c + 1 (notebook 08's start), so sums stay readable. The bytes count the real chunk sizes.
Knows nothing about time (`comm` has the alpha-beta model).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from .. import _chart
from ._text import CalculatorError, Printed, choice, positive_int

__all__ = ["OPS", "RingCollective", "RingStep", "StepChart", "ring_steps"]

OPS = ("all_reduce", "reduce_scatter", "all_gather")


@dataclass(frozen=True, repr=False)
class RingStep(Printed):
    """One step of a ring collective. ``before``/``after``: per rank, one value per chunk (None:
    a chunk the rank does not hold yet); ``sends``: ``(src, dst, chunk)``; ``sent``: the bytes
    each rank sends in this step; ``number``: 1-based; ``phase``: "reduce-scatter" or
    "all-gather"."""

    op: str
    phase: str
    number: int
    of: int
    before: tuple
    after: tuple
    sends: tuple
    sent: tuple

    @property
    def total(self) -> int:
        """Bytes all ranks send in this step together."""
        return sum(self.sent)

    def text(self) -> str:
        verb = "adds it to its own" if self.phase == "reduce-scatter" else "keeps it"
        chunks = ", ".join(f"{s}->{d}: chunk {c}" for s, d, c in self.sends)
        sent = _per_rank(self.sent)
        return (
            f"step {self.number} of {self.of} ({self.phase}): each rank sends one chunk to its "
            f"right-hand neighbour, which {verb} ({chunks})\n"
            f"bytes sent in this step: {sent}; {self.total:,} in all"
        )

    def picture(self):
        """This step as a `distlab.pictures.Picture`: before and after, an arrow per send."""
        from .. import pictures

        def cells(state):
            if self.op != "all_gather":
                return [list(row) for row in state]  # notebook 08's rows of values
            return [[[] if v is None else [v] for v in row] for row in state]  # held or not yet

        title = f"step {self.number} of {self.of}: {self.phase}"
        return pictures.collective(
            f"ring {self.op}", cells(self.before), cells(self.after), title=title,
            arrows=[(s, d) for s, d, _ in self.sends],
        )


@dataclass(frozen=True, repr=False)
class RingCollective(Printed):
    """A ring collective as a sequence of `RingStep`\\ s. ``chunks``: elements per chunk;
    ``per_rank``: the bytes each rank sends over all the steps; ``total``: all ranks together;
    ``nbytes``: the tensor's size per rank (all_gather: its output)."""

    op: str
    ranks: int
    numel: int
    element_size: int
    chunks: tuple
    start: tuple
    steps: tuple

    @property
    def nbytes(self) -> int:
        return self.numel * self.element_size

    @property
    def per_rank(self) -> tuple:
        return tuple(sum(s.sent[r] for s in self.steps) for r in range(self.ranks))

    @property
    def total(self) -> int:
        return sum(self.per_rank)

    def text(self) -> str:
        n = self.ranks
        factor = "2(n-1)/n" if self.op == "all_reduce" else "(n-1)/n"
        sizes = [c * self.element_size for c in self.chunks]
        chunks = (f"{n} chunks of {sizes[0]:,} bytes" if len(set(sizes)) == 1 else
                  f"{n} chunks of {' / '.join(f'{b:,}' for b in sizes)} bytes")
        lines = [
            f"ring {self.op} on {n} ranks: {self.numel:,} elements x {self.element_size} bytes "
            f"= {self.nbytes:,} bytes per rank, cut into {chunks}",
        ]
        for s in self.steps:
            lines.append(f"step {s.number} ({s.phase}): sent {_per_rank(s.sent)}")
        lines.append(
            f"sent in all: {_per_rank(self.per_rank)} ({factor} x {self.nbytes:,} = "
            f"{_exact(_factor(self) * self.nbytes)}); {self.total:,} by all ranks together"
        )
        return "\n".join(lines)


class StepChart(_chart.Chart):
    """A `RingStep` as a chart: its `picture` (``distlab.pictures``), for the stepper widget."""

    def __init__(self, step: RingStep):
        self.step = step
        self.key = (step.op, step.number, step.before, step.after)  # what the picture shows

    def __repr__(self) -> str:
        return self.step.text()

    def figure(self):
        return self.step.picture().figure()


def _factor(ring) -> Fraction:
    n = ring.ranks
    return Fraction((2 if ring.op == "all_reduce" else 1) * (n - 1), n)


def _exact(value: Fraction) -> str:
    return f"{int(value):,}" if value.denominator == 1 else f"{float(value):,.2f}"


def _per_rank(sent) -> str:
    if len(set(sent)) == 1:
        return f"{sent[0]:,} bytes per rank"
    return "bytes per rank " + " / ".join(f"{b:,}" for b in sent)


def ring_steps(op="all_reduce", ranks=4, numel=None, element_size=4) -> RingCollective:
    """Every step of a ring ``op`` on ``ranks`` ranks.

    Args:
        op: "all_reduce", "reduce_scatter" or "all_gather".
        ranks: the number of ranks, n >= 2.
        numel: elements of the tensor on each rank (all_gather: of the gathered output);
            default: one per chunk (n), as notebook 08's picture.
        element_size: bytes per element (4 for float32, 2 for bfloat16).

    Returns:
        A `RingCollective`: ``steps`` (2(n - 1) for all_reduce, n - 1 otherwise), each with its
        picture and bytes, and the totals.

    Raises:
        CalculatorError (a ValueError): an unknown op; ranks < 2 (a ring needs two); numel or
            element_size not a whole number >= 1.
    """
    choice(op, "op", OPS)
    positive_int(ranks, "ranks")
    if ranks < 2:
        raise CalculatorError(f"ranks={ranks}: a ring needs at least 2 ranks")
    numel = ranks if numel is None else positive_int(numel, "numel")
    positive_int(element_size, "element_size", " (bytes per element: 4 for float32)")
    n = ranks
    chunks = tuple(numel // n + (1 if c < numel % n else 0) for c in range(n))  # tensor_split
    state = [[10 * r + c + 1 for c in range(n)] for r in range(n)]
    if op == "all_gather":
        state = [[v if c == r else None for c, v in enumerate(row)] for r, row in enumerate(state)]
    start = tuple(tuple(row) for row in state)
    plan = []  # (phase, chunk sent by rank r at this step, as a function of r)
    if op in ("all_reduce", "reduce_scatter"):
        plan += [("reduce-scatter", lambda r, s=s: (r - s) % n) for s in range(n - 1)]
    if op == "all_reduce":
        plan += [("all-gather", lambda r, s=s: (r + 1 - s) % n) for s in range(n - 1)]
    if op == "all_gather":
        plan += [("all-gather", lambda r, s=s: (r - s) % n) for s in range(n - 1)]
    steps = []
    for number, (phase, send) in enumerate(plan, start=1):
        before = tuple(tuple(row) for row in state)
        sends = tuple((r, (r + 1) % n, send(r)) for r in range(n))
        for src, dst, c in sends:  # every rank sends at once: read from `before`
            value = before[src][c]
            state[dst][c] = state[dst][c] + value if phase == "reduce-scatter" else value
        steps.append(RingStep(
            op=op, phase=phase, number=number, of=len(plan), before=before,
            after=tuple(tuple(row) for row in state), sends=sends,
            sent=tuple(chunks[c] * element_size for _, _, c in sends),
        ))
    return RingCollective(op, n, numel, element_size, chunks, start, tuple(steps))
