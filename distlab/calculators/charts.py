"""The calculators' charts: memory per device, pipeline schedules, collective times and a
training step's communication. Each is a `distlab._chart.Chart` (one palette, one way to PNG):
``figure(fig=None)`` draws on a new figure, or on a widget's figure emptied for a redraw.

Colours mean what they mean everywhere in distlab: `_chart.PARTS` for parameters, gradients,
optimizer state and activations, `_chart.COMM` for communication, `_chart.COMPUTE` (light for a
forward, dark for a backward) for a pipeline's work.

Knows nothing about the formulas: the calculator modules compute, this draws what they return
(their results' ``chart()`` methods hand themselves over; a `CollectiveTime` computes its own
curve, with ``at``).
"""

from __future__ import annotations

import math

from .. import _chart
from ..errors import InputTypeError
from ._axes import axes, labels
from ._text import GB, fraction, gb, human_bytes, seconds
from .models import describe

__all__ = ["CollectiveChart", "MemoryChart", "ScheduleChart", "StepCommChart"]


class MemoryChart(_chart.Chart):
    """An estimate drawn: one stacked bar (params, grads, optimizer, activations) per ZeRO stage
    at the same layout, the estimate's own stage outlined, and a device's capacity as a dashed
    line. Text: the estimate's.

    Args:
        estimate: a `MemoryEstimate`.
        capacity: a device's memory in bytes (default 80 GB, an H100), or None for no line.
    """

    def __init__(self, estimate, capacity: int | None = 80 * GB):
        self.estimate = estimate
        self.capacity = capacity

    def __repr__(self) -> str:
        return self.estimate.text()

    def figure(self, fig=None):
        """A matplotlib ``Figure`` (``fig``: an existing one to draw on, cleared first)."""
        from matplotlib.colors import to_rgba

        est = self.estimate
        stages = [est.with_(zero=z) for z in range(4)]
        fig, ax = axes(fig, (6.4, 3.4), (0.1, 0.14, 0.6, 0.7))
        bottom = [0.0] * 4
        alpha = [1.0 if z == est.zero else 0.45 for z in range(4)]
        for part in _chart.PARTS:  # the estimate's parts, bottom up, each in its colour
            values = [getattr(e, part) / GB for e in stages]
            colours = [to_rgba(_chart.PARTS[part], a) for a in alpha]
            ax.bar(range(4), values, 0.62, bottom=bottom, color=colours, edgecolor=_chart.INK,
                   linewidth=[1.6 if a == 1.0 else 0.4 for a in alpha])
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        for z, e in enumerate(stages):
            ax.text(z, bottom[z], gb(e.total), ha="center", va="bottom", fontsize=7,
                    color=_chart.INK, fontweight="bold" if z == est.zero else "normal")
        top = max(e.total for e in stages) / GB
        if self.capacity is not None:
            ax.axhline(self.capacity / GB, color=_chart.WAIT, linestyle="--", linewidth=1.2)
            ax.text(3.45, self.capacity / GB, f"{self.capacity / GB:g} GB device", ha="right",
                    va="bottom", fontsize=7, color=_chart.WAIT)
            top = max(top, self.capacity / GB)
        ax.set_ylim(0, top * 1.15 or 1)
        ax.set_xlim(-0.5, 3.5)
        ax.set_xticks(range(4), ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"], fontsize=8)
        ax.set_ylabel("GB per device", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        name = est.model.name or describe(est.model)
        ax.set_title(f"{name}: dp {est.dp} x tp {est.tp} x pp {est.pp} x cp {est.cp}, "
                     f"{est.precision}", fontsize=9, color=_chart.INK, loc="left")
        _chart.key(ax, [(p, _chart.PARTS[p]) for p in reversed(_chart.PARTS)], loc="center left",
                   bbox_to_anchor=(1.03, 0.5), ncol=1)
        return fig


#: (forward, backward) fills per stage of a rank: blue, green, purple, grey (Okabe-Ito).
_FILLS = (("#56B4E9", "#0072B2"), ("#7FD1B0", "#009E73"), ("#E3A5CC", "#CC79A7"),
          ("#C8C8C8", "#777777"))


class ScheduleChart(_chart.Chart):
    """A `Schedule` drawn: ranks down, time across; each forward a light bar, each backward a
    dark one, numbered with its microbatch (when there is room); with v > 1, each of a rank's
    stages in its own colour. Text: the schedule's."""

    def __init__(self, schedule):
        self.schedule = schedule

    def __repr__(self) -> str:
        return self.schedule.text()

    def figure(self, fig=None):
        """A matplotlib ``Figure`` (``fig``: an existing one to draw on, cleared first)."""
        s = self.schedule
        height = 1.1 + 0.32 * s.p
        fig, ax = axes(fig, (7.2, height), (0.09, 0.5 / height, 0.89, 1 - 1.05 / height))
        span = float(s.span)
        count = sum(len(acts) for acts in s.actions)
        numbers = count <= 400 and float(s.forward / s.v) / span * 7.2 * 72 >= 9
        for r, acts in enumerate(s.actions):
            for kind in ("F", "B"):
                for chunk in range(s.v):
                    bars = [(float(a.start), float(a.end - a.start)) for a in acts
                            if a.kind == kind and a.stage // s.p == chunk]
                    fill = _FILLS[chunk % len(_FILLS)][kind == "B"]
                    ax.broken_barh(bars, (r - 0.4, 0.8), facecolors=fill,
                                   edgecolor=_chart.BACKGROUND, linewidth=0.6)
            if numbers:
                for kind, ink in (("F", _chart.INK), ("B", "white")):
                    mine = [a for a in acts if a.kind == kind]
                    labels(ax, [(float(a.start + a.end) / 2, r) for a in mine],
                           [str(a.microbatch) for a in mine], ink)
        ax.set_xlim(0, span)
        ax.set_ylim(s.p - 0.5, -0.5)
        ax.set_yticks(range(s.p), [f"rank {r}" for r in range(s.p)], fontsize=7)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_xlabel(f"time (a rank's forward = {s.forward}, backward = {s.backward})",
                      fontsize=7)
        ax.set_title(f"{s.name}, p = {s.p}, m = {s.m}, v = {s.v}: bubble {fraction(s.bubble)}",
                     fontsize=9, loc="left", color=_chart.INK, pad=16)
        entries = [("F: forward", _FILLS[0][0]), ("B: backward", _FILLS[0][1])]
        for chunk in range(1, min(s.v, len(_FILLS))):
            entries.append((f"stage r + {chunk * s.p}", _FILLS[chunk][1]))
        _chart.key(ax, entries, loc="lower right", bbox_to_anchor=(1.0, 0.99),
                   ncol=len(entries), fontsize=7, borderaxespad=0.1)
        return fig


_SIZES = [2**k for k in range(0, 37)]  # 1 B to 64 GiB
_STYLE = {"ring": ("-", _chart.COMM), "tree": ("--", _chart.COMPUTE)}


class CollectiveChart(_chart.Chart):
    """A `CollectiveTime` drawn: time against size, log-log, for the ring and the tree of the
    same collective on the same ranks and link; a dot at this size and algorithm. Text: the
    time's."""

    def __init__(self, time):
        self.time = time

    def __repr__(self) -> str:
        return self.time.text()

    def figure(self, fig=None):
        """A matplotlib ``Figure`` (``fig``: an existing one to draw on, cleared first)."""
        t = self.time
        fig, ax = axes(fig, (6.4, 3.4), (0.12, 0.15, 0.84, 0.72))
        low = high = t.seconds
        for algorithm in _STYLE:  # comm.ALGORITHMS
            times = [t.at(s, algorithm).seconds for s in _SIZES]
            style, colour = _STYLE[algorithm]
            ax.plot(_SIZES, times, style, color=colour, linewidth=1.5, label=algorithm)
            low, high = min(low, *times), max(high, *times)
        ax.plot([t.size or 1], [t.seconds], "o", color=_STYLE[t.algorithm][1],
                markeredgecolor=_chart.INK, markersize=7, zorder=3)
        ax.annotate(f" {seconds(t.seconds)}", (t.size or 1, t.seconds), fontsize=8,
                    color=_chart.INK, va="top")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.minorticks_off()  # plain labels, few ticks: quick to redraw
        ax.set_xticks([2**k for k in range(0, 37, 6)],
                      [human_bytes(2**k) for k in range(0, 37, 6)], fontsize=7)
        low = max(low, 1e-9)
        decades = [10.0**k for k in range(math.floor(math.log10(low)),
                                           math.ceil(math.log10(high)) + 1)]
        ax.set_yticks(decades, [seconds(d) for d in decades], fontsize=7)
        ax.set_ylim(low / 1.5, high * 1.5)
        ax.set_xlim(_SIZES[0] / 1.5, _SIZES[-1] * 1.5)
        ax.set_xlabel("size S per rank", fontsize=8)
        ax.set_ylabel("seconds", fontsize=8)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8, frameon=False, loc="upper left")
        ax.set_title(f"{t.op} on {t.ranks} ranks, {t.link.name}", fontsize=9, loc="left",
                     color=_chart.INK)
        return fig


class StepCommChart(_chart.Chart):
    """Several `StepComm`\\ s side by side (one per layout): a bar of the step's communication
    time each, labelled with the bytes a rank sends. Text: theirs, one after another."""

    def __init__(self, steps):
        self.steps = list(steps)
        for s in self.steps:
            if not all(hasattr(s, a) for a in ("layout", "calls", "seconds", "sent")):
                raise InputTypeError(
                    f"StepCommChart takes StepComm objects, got {type(s).__name__}")

    def __repr__(self) -> str:
        return "\n".join(s.text() for s in self.steps)

    def figure(self, fig=None):
        """A matplotlib ``Figure`` (``fig``: an existing one to draw on, cleared first)."""
        height = 0.9 + 0.45 * len(self.steps)
        fig, ax = axes(fig, (6.4, height), (0.12, 0.55 / height, 0.84, 1 - 0.85 / height))
        longest = max(s.seconds for s in self.steps) or 1.0
        for i, s in enumerate(self.steps):
            ax.barh(i, s.seconds * 1e3, 0.6, color=_chart.COMM, edgecolor=_chart.INK,
                    linewidth=0.5)
            ax.text(s.seconds * 1e3 + longest * 1e3 * 0.01, i,
                    f"{seconds(s.seconds)}, sends {human_bytes(s.sent)}", va="center",
                    fontsize=7, color=_chart.INK)
        ax.set_yticks(range(len(self.steps)), [s.layout for s in self.steps], fontsize=8)
        ax.set_ylim(len(self.steps) - 0.5, -0.5)
        ax.set_xlim(0, longest * 1e3 * 1.35)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_xlabel("ms of communication per step and rank (not overlapped)", fontsize=8)
        first = self.steps[0]
        ax.set_title(f"{first.model.name} on {first.ranks} ranks, {first.link.name}", fontsize=9,
                     loc="left", color=_chart.INK)
        return fig
