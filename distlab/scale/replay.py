"""A long pipeline step from a short one: each part of a stage's step measured once, then
replayed in the order PyTorch's schedule runs them.

A pipeline rank's step is a sequence of actions (``schedule.pipeline_order``): each
microbatch's forward (on the last stage, and its loss), its backward, and once per stage the
gradient reduction. What one action does to memory, FLOPs and collectives depends on the
stage and on whether it is the stage's first, a middle or the last of its kind, not on which
middle microbatch it is: the first forward gathers FSDP's parameters (which pipelining keeps
until the end of the step), the first backward makes the unsharded gradients, the middle ones
add to them, the last one (and the reduction) reduce-scatters and frees. So a step of 32
microbatches is measured with 3 (GPipe: forwards, then backwards, as `PartRecorder` sees them), and
the 32 are replayed in the schedule's own order: each action starts at the level the previous
one left, its own peak above that start is the one measured. The peak of the step is read off
the replay, as it would be off the whole run; `tests/test_scale_pipeline.py` checks the two
equal, to the byte, against running every microbatch.

Knows nothing about models or layouts: `pipeline` records, this module replays.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["Part", "PartRecorder", "replay", "which"]


@dataclass(frozen=True)
class Part:
    """One measured part of a step: the bytes tracked when it starts (``before``), the most
    while it runs (``top``) and when it ends (``after``); the FLOPs it computed and the
    collectives it issued; the bytes its memory-bound ops moved, by op (a `Counter`);
    ``home``: ``(before, top, after)`` of the bytes made on the default stream alone (the
    caching allocator's pool that activations share: the tracker's ``home_now``)."""

    before: int
    top: int
    after: int
    flops: int = 0
    calls: tuple = ()
    moved: Counter = field(default_factory=Counter)
    home: tuple = (0, 0, 0)


@dataclass
class PartRecorder:
    """Measures parts of a step while the tracker (`_torch_simulation.rank_peak_tracker`) and
    the counters (`instruments.LocalFlops`, `instruments.Collectives`) are active. A part
    runs from the end of the previous one (`begin` starts the first): what a schedule does
    between two stage calls (its sends and receives, the references it drops) belongs to the
    part that follows."""

    tracker: object
    flops: object
    comms: object
    parts: dict = field(default_factory=dict)
    _mark: tuple | None = None

    def begin(self) -> None:
        """The next part starts here."""
        self._mark = (self.tracker.open_window(), self.flops.total, len(self.comms.calls),
                      Counter(self.flops.moved_by_op), self.tracker.home_window)

    def end(self, key) -> None:
        """The part since the last `begin` or `end` ends here, as ``key``."""
        before, flops, calls, moved, home = self._mark
        self.parts.setdefault(key, []).append(Part(
            before, self.tracker.window, self.tracker.total_now(), self.flops.total - flops,
            tuple(self.comms.calls[calls:]), self.flops.moved_by_op - moved,
            (home, self.tracker.home_window, self.tracker.home_now())))
        self.begin()

    @contextlib.contextmanager
    def part(self, key):
        if self._mark is None:
            self.begin()
        yield
        self.end(key)


def which(index: int, count: int) -> str:
    """A microbatch's place among ``count``: "first", "middle" or "last" ("first" when alone)."""
    if index == 0:
        return "first"
    return "last" if index == count - 1 else "middle"


@dataclass(frozen=True)
class Replayed:
    """A replayed step: its ``peak`` bytes, the bytes at its ``end``, its ``flops`` and
    ``calls`` (the collectives in order), the bytes its memory-bound ops ``moved``, by op;
    ``home_peak`` and ``home_end``: the same of the default stream's bytes alone."""

    peak: int
    end: int
    flops: int
    calls: tuple
    moved: Counter = field(default_factory=Counter)
    home_peak: int = 0
    home_end: int = 0


def replay(actions, parts_of, start: int, home_start: int = 0) -> Replayed:
    """Walk ``actions`` (``(stage, kind, microbatch)``), each standing for the measured parts
    ``parts_of(stage, kind, microbatch)`` (a list of `Part`, run one after another), from
    ``start`` bytes (``home_start`` of them made on the default stream)."""
    level = peak = start
    home = home_peak = home_start
    flops, moved, calls = 0, Counter(), []
    for stage, kind, micro in actions:
        for part in parts_of(stage, kind, micro):
            peak = max(peak, level + part.top - part.before)
            level += part.after - part.before
            before, top, after = part.home
            home_peak = max(home_peak, home + top - before)
            home += after - before
            flops += part.flops
            moved.update(part.moved)
            calls.extend(part.calls)
    return Replayed(peak, level, flops, tuple(calls), moved, home_peak, home)
