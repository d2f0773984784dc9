"""Pipeline schedules, explored: who runs which forward and backward when, the bubble, and how
many microbatches each rank holds at once.

    from distlab.calculators import pipeline_schedule
    s = pipeline_schedule(p=4, m=8, schedule="1F1B")
    s.bubble, s.peaks           # Fraction(3, 11), (4, 3, 2, 1)
    s                           # the grid as text: one row per rank, one column per time slot
    s.chart()                   # the same grid drawn, F light and B dark

The orders are those torch 2.13's schedules run (notebook 16 records them): GPipe runs every
forward, then every backward; 1F1B fills the pipeline with p - 1 - rank forwards, then alternates
one forward and one backward; Interleaved1F1B puts v stages on each rank (rank r holds stages
r, r + p, ...) and follows torch's ``ScheduleInterleaved1F1B`` (Megatron-LM's warm-up of
(v - 1) x rounds + 2 (p - 1 - rank) forwards). The timing is notebook 16's ``simulate``: a rank
runs its actions in order, each as soon as the rank is free and its input exists (the previous
stage's forward; the next stage's backward, or for the last stage its own forward); sending is
free; a forward of a rank's layers costs 1 and a backward 2, split evenly among its v stages.

Knows nothing about models or memory in bytes. Draws nothing itself: `Schedule.chart` hands the
schedule to `charts`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from ._text import CalculatorError, Printed, choice, fraction, positive_int

__all__ = ["SCHEDULES", "Action", "Schedule", "pipeline_schedule"]

SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B")
_CHUNK = "abcdefgh"

@dataclass(frozen=True)
class Action:
    """One forward (``kind`` "F") or backward ("B") of ``microbatch`` through ``stage``, on
    ``rank``, from ``start`` to ``end`` (time units: a rank's whole forward is 1)."""

    kind: str
    stage: int
    microbatch: int
    rank: int
    start: Fraction
    end: Fraction


@dataclass(frozen=True, repr=False)
class Schedule(Printed):
    """A schedule played out. ``orders[r]``: rank r's ``(kind, stage, microbatch)`` in order;
    ``actions[r]``: the same with start and end times; ``bubble``: the idle fraction of
    rank-time (a `Fraction`); ``peaks[r]``: the most stage-microbatches rank r holds activations
    for at once (forward done, backward not yet). Build one with `pipeline_schedule`."""

    name: str
    p: int
    m: int
    v: int
    forward: Fraction
    backward: Fraction
    orders: tuple
    actions: tuple
    bubble: Fraction
    peaks: tuple

    @property
    def span(self) -> Fraction:
        """When the last action ends."""
        return max(a.end for acts in self.actions for a in acts)

    @property
    def slot(self) -> Fraction:
        """The grid's column width: the largest time that divides every action's length."""
        f, b = self.forward / self.v, self.backward / self.v
        return Fraction(math.gcd(f.numerator * b.denominator, b.numerator * f.denominator),
                        f.denominator * b.denominator)

    def formula(self) -> Fraction:
        """The textbook bubble (p - 1) / (v m + p - 1), to compare with `bubble`."""
        return Fraction(self.p - 1, self.v * self.m + self.p - 1)

    def label(self, action: Action) -> str:
        """``"F3"``: kind and microbatch, plus the rank's stage letter when v > 1 (``"F3b"``)."""
        chunk = _CHUNK[action.stage // self.p] if self.v > 1 else ""
        return f"{action.kind}{action.microbatch}{chunk}"

    def grid(self) -> tuple:
        """One row per rank, one entry per time slot: the `Action` running then, or None."""
        n = int(self.span / self.slot)
        rows = []
        for acts in self.actions:
            row = [None] * n
            for a in acts:
                for i in range(int(a.start / self.slot), int(a.end / self.slot)):
                    row[i] = a
            rows.append(tuple(row))
        return tuple(rows)

    def text(self) -> str:
        per = "" if self.v == 1 else f" (split over its {self.v} stages)"
        lines = [
            f"{self.name}: p = {self.p} ranks, m = {self.m} microbatches, v = {self.v} "
            f"stage{'s' if self.v > 1 else ''} per rank",
            f"a microbatch's forward through a rank's layers takes {self.forward} time unit"
            f"{'s' if self.forward != 1 else ''}, its backward {self.backward}{per}",
            f"bubble {fraction(self.bubble)}   (p-1)/(v*m+p-1) = {self.formula()}",
            f"in flight at the peak, ranks 0..{self.p - 1}: {list(self.peaks)}",
            f"grid: one column = {self.slot} time unit{'s' if self.slot != 1 else ''}; "
            "'-' continues the action before, '.' is idle",
        ]
        width = max(len(self.label(a)) for acts in self.actions for a in acts) + 1
        for r, row in enumerate(self.grid()):
            cells = []
            for i, a in enumerate(row):
                if a is None:
                    cells.append(".".ljust(width))
                elif i > 0 and row[i - 1] is a:
                    cells.append("-".ljust(width))
                else:
                    cells.append(self.label(a).ljust(width))
            lines.append(f"rank {r}: " + "".join(cells).rstrip())
        return "\n".join(lines)

    def chart(self):
        """A `charts.ScheduleChart` of this schedule."""
        from .charts import ScheduleChart

        return ScheduleChart(self)


def pipeline_schedule(p=4, m=8, v=1, schedule="1F1B", *, forward=1, backward=2) -> Schedule:
    """Play a pipeline schedule out on ``p`` ranks.

    Args:
        p: pipeline ranks.
        m: microbatches per training step.
        v: stages per rank (``Interleaved1F1B`` only; 1 otherwise).
        schedule: "GPipe", "1F1B" or "Interleaved1F1B".
        forward, backward: the time of one microbatch's forward and backward through a rank's
            layers (an int, a `Fraction` or a string such as "3/2"); split evenly over its v
            stages.

    Returns:
        A `Schedule`: orders, timed actions, ``bubble`` (a `Fraction`), ``peaks`` per rank.

    Raises:
        CalculatorError (a ValueError): p, m or v not a whole number >= 1; an unknown
            schedule; v > 1 with GPipe or 1F1B, or v = 1 with Interleaved1F1B; 1F1B with fewer
            microbatches than ranks (torch's ``Schedule1F1B`` refuses them too); Interleaved1F1B
            with an m torch's ``ScheduleInterleaved1F1B`` refuses (not a multiple of its rounds,
            max(1, m // p)); forward or backward not a positive number.
    """
    for name, value in (("p", p), ("m", m), ("v", v)):
        positive_int(value, name)
    choice(schedule, "schedule", SCHEDULES)
    f, b = _positive_fraction(forward, "forward"), _positive_fraction(backward, "backward")
    if schedule != "Interleaved1F1B" and v != 1:
        raise CalculatorError(
            f"v={v} stages per rank needs schedule='Interleaved1F1B' ({schedule} puts one "
            "stage on each rank): set v=1, or choose Interleaved1F1B"
        )
    if schedule == "Interleaved1F1B" and v < 2:
        raise CalculatorError(
            "Interleaved1F1B puts v >= 2 stages on each rank: choose v=2 or more, or "
            "schedule='1F1B' for one stage per rank"
        )
    if schedule == "1F1B" and m < p:
        raise CalculatorError(
            f"1F1B needs at least as many microbatches as ranks (m={m} < p={p}), as torch's "
            f"Schedule1F1B does: choose m >= {p}, or GPipe"
        )
    if schedule == "Interleaved1F1B" and m % max(1, m // p):
        ok = [n for n in range(max(1, m - p), m + p + 1) if n % max(1, n // p) == 0]
        raise CalculatorError(
            f"Interleaved1F1B needs m to be a multiple of its rounds, max(1, m // p) = "
            f"{m // p}, as torch's ScheduleInterleaved1F1B does: m={m} is not; choose m in "
            f"{', '.join(map(str, ok))}"
        )
    if schedule == "GPipe":
        orders = [[("F", r, i) for i in range(m)] + [("B", r, i) for i in range(m)]
                  for r in range(p)]
    elif schedule == "1F1B":
        orders = [_one_f_one_b(r, p, m) for r in range(p)]
    else:
        orders = [_interleaved(r, p, m, v) for r in range(p)]
    actions = _simulate(orders, p * v, f / v, b / v)
    span = max(a.end for acts in actions for a in acts)
    busy = sum(a.end - a.start for acts in actions for a in acts)
    return Schedule(
        name=schedule, p=p, m=m, v=v, forward=f, backward=b,
        orders=tuple(tuple(o) for o in orders), actions=actions,
        bubble=1 - busy / (p * span), peaks=tuple(_peak(o) for o in orders),
    )


def _positive_fraction(value, name) -> Fraction:
    try:
        f = Fraction(value)
    except (TypeError, ValueError):
        f = Fraction(-1)
    if f <= 0:
        raise CalculatorError(f"{name} must be a positive number of time units, got {value!r}")
    return f


def _one_f_one_b(rank, p, m):
    warmup = min(p - 1 - rank, m)  # fill the pipeline: the last rank needs none
    order = [("F", rank, i) for i in range(warmup)]
    for i in range(m - warmup):  # steady state: one forward, one backward
        order += [("F", rank, warmup + i), ("B", rank, i)]
    return order + [("B", rank, i) for i in range(m - warmup, m)]  # drain


def _interleaved(rank, p, m, v):
    """torch 2.13's ScheduleInterleaved1F1B order for ``rank`` (its no-op padding left out)."""
    per_round = m // max(1, m // p)
    warmup = min((v - 1) * per_round + 2 * (p - 1 - rank), m * v)
    ops = m * v
    next_mb = {}
    order = []

    def take(kind, local):
        stage = local * p + rank
        mb = next_mb.get((kind, stage), 0)
        next_mb[kind, stage] = mb + 1
        order.append((kind, stage, mb))

    for op in range(ops):  # op-th forward; a backward follows each once warm-up is over
        take("F", (op // per_round) % v)
        if op >= warmup:
            take("B", v - 1 - ((op - warmup) // per_round) % v)
    for op in range(ops, ops + warmup):  # cool-down: the backwards left
        take("B", v - 1 - ((op - warmup) // per_round) % v)
    return order


def _simulate(orders, stages, f, b):
    """Notebook 16's ``simulate``: each action starts when its rank is free and its input done."""
    done, free, pos = {}, [Fraction(0)] * len(orders), [0] * len(orders)
    timed = [[] for _ in orders]
    while any(pos[r] < len(o) for r, o in enumerate(orders)):
        progressed = False
        for r, order in enumerate(orders):
            while pos[r] < len(order):
                kind, s, mb = order[pos[r]]
                if kind == "F":
                    need = ("F", s - 1, mb) if s > 0 else None
                else:
                    need = ("B", s + 1, mb) if s < stages - 1 else ("F", s, mb)
                if need is not None and need not in done:
                    break
                start = max(free[r], done.get(need, Fraction(0)))
                done[kind, s, mb] = free[r] = start + (f if kind == "F" else b)
                timed[r].append(Action(kind, s, mb, r, start, free[r]))
                pos[r] += 1
                progressed = True
        if not progressed:  # pragma: no cover - the orders above never deadlock
            raise RuntimeError("deadlock: every rank waits for an action no rank has run")
    return tuple(tuple(t) for t in timed)


def _peak(order) -> int:
    held = peak = 0
    for kind, *_ in order:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak
