"""Every error distlab raises, written for whoever reads them. All derive from `DistlabError`, so
``except distlab.DistlabError`` catches any of them:

- `RankError`: one or more ranks raised, or died. The root cause comes first; errors that other
  ranks hit *because* of it (a peer's connection closed, a collective timed out) are marked as
  consequences.
- `RankTimeout`: ranks did not finish in time. Shows the Python stack of every stuck rank, with the
  notebook's own source lines, so the learner sees the exact line each rank is waiting on.
- `ClusterBroken`: a cluster's rank is stuck or dead, so the cluster needs a restart.
- `ShipError`: something given to distlab cannot be sent to the ranks (it does not pickle).
- `StartError`: the ranks (or the helper that starts them) could not be started.
- `InputError` (a ValueError) and `InputTypeError` (a TypeError): an argument that cannot work.
- `distlab.calculators.CalculatorError` (defined with the calculators): a calculator's or a
  simulation's input that cannot work.

Each also derives from the built-in error a learner would expect (RuntimeError, TimeoutError,
TypeError, ValueError), so existing ``except`` clauses keep working.

How they are shown: every public entry point is wrapped in `entry_point`, which drops distlab's
own frames from the traceback, and IPython draws them with `DistlabError._render_traceback_`,
which leaves out the entry point's frame too. The learner sees their cell's line, then the
message.
"""

from __future__ import annotations

import functools
import os
import re
import signal
import types
from dataclasses import dataclass

from ._readable import readable

# Messages that mean "a peer went away" or "a collective waited too long" rather than a bug of
# their own. A failure like this that happens after another rank's failure is a consequence.
_CONSEQUENCE = re.compile(
    r"Connection closed by peer|Connection reset|Broken pipe|ECONNRESET|Connection refused"
    r"|timed out|Timeout|timeout|DistBackendError|DistNetworkError|communicator was aborted"
    r"|Socket closed|closed by peer|Read error|recv.*failed|Connection was likely closed",
)


_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep

# One frame of a formatted stack: its file, line, function and source line.
_FRAME = re.compile(r'File "([^"]*)", line (\d+), in (\S+)\n[ \t]+(.*)')
_STDLIB = os.path.dirname(os.__file__) + os.sep


def _library_file(file: str) -> bool:
    """Whether a frame's file is torch's, distlab's or Python's own, not the learner's."""
    return ("site-packages" in file or file.startswith((_HERE, _STDLIB, "<frozen"))
            or file.startswith("<") and file not in ("<cell>", "<string>", "<stdin>")
            and not file.startswith("<ipython-input"))


def _user_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """A copy of the traceback ``tb`` without distlab's and IPython's own frames."""
    frames = []
    while tb is not None:
        filename = os.path.abspath(tb.tb_frame.f_code.co_filename)
        internal = filename.startswith(_HERE) or f"{os.sep}IPython{os.sep}" in filename
        if not internal:
            frames.append((tb.tb_frame, tb.tb_lasti, tb.tb_lineno))
        tb = tb.tb_next
    new = None
    for frame, lasti, lineno in reversed(frames):
        new = types.TracebackType(new, frame, lasti, lineno)
    return new


class DistlabError(Exception):
    """Base class of every error distlab raises (see the module's docstring for the list)."""

    def _render_traceback_(self) -> list[str]:
        """How IPython shows a distlab error (it calls this method when an exception has it):
        the notebook's own frames, as usual, but none of distlab's, which only pass it on."""
        from IPython import get_ipython

        ip = get_ipython()
        if ip is None:  # not in IPython after all: the standard formatting
            import traceback

            return traceback.format_exception(type(self), self, self.__traceback__)
        tb = _user_frames(self.__traceback__)
        raw = getattr(self, "_raw", None)
        if raw is None:
            return ip.InteractiveTB.structured_traceback(type(self), self, tb, tb_offset=0)
        stable = self.args
        self.args = (readable(raw, numbered=True),)  # cells named as IPython names them
        try:
            return ip.InteractiveTB.structured_traceback(type(self), self, tb, tb_offset=0)
        finally:
            self.args = stable


def entry_point(fn):
    """Decorate a public function or method: a `DistlabError` it raises leaves it without
    distlab's inner frames (its message says everything), and without the chained exceptions
    that led to it inside distlab."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except DistlabError as e:
            raise e.with_traceback(_user_frames(e.__traceback__)) from None

    return wrapper


def signal_name(exitcode: int | None) -> str | None:
    """``-11`` -> ``"SIGSEGV"``: the signal that killed a process, from its exit code."""
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


_SIGNAL_MEANING = {
    "SIGSEGV": " (segmentation fault: a crash inside C/C++ code)",
    "SIGKILL": " (killed: out of memory, or someone ran kill -9)",
    "SIGABRT": " (aborted: usually a C++ exception or assertion)",
    "SIGBUS": " (bus error)",
}


def exit_text(exitcode: int | None) -> str:
    """How a rank's process ended, in words."""
    if exitcode is None:
        return "its process ended (exit status unknown)"
    name = signal_name(exitcode)
    if name:
        return f"killed by signal {name}{_SIGNAL_MEANING.get(name, '')}"
    return f"exited with code {exitcode} before finishing its task"


#: What brings a cluster back, in every message that needs it.
RESTART = (
    "Run `cluster.restart()`: it starts fresh ranks and re-runs the cells that set up the old "
    "ones, so your variables come back."
)


@dataclass
class RankFailure:
    """What went wrong on one rank."""

    rank: int
    type: str  #: exception class name, e.g. "ValueError"; "died" if the process died
    message: str
    traceback: str = ""
    stage: str = "raised"  #: raised | init | load | result | died
    exitcode: int | None = None  #: for a rank that died: its exit code (negative: signal)
    consequence: bool = False
    output_tail: str = ""

    @property
    def signal(self) -> str | None:
        return signal_name(self.exitcode)

    def headline(self) -> str:
        if self.stage == "died":
            return f"rank {self.rank} died: {self.message}"
        what = {
            "init": "could not initialize the process group",
            "load": "could not load the function sent to it",
            "result": "returned a value that cannot be sent back to the notebook",
        }.get(self.stage, "raised")
        return f"rank {self.rank} {what}: {self.type}: {self.message}".rstrip(": ")


class RankError(DistlabError, RuntimeError):
    """One or more ranks failed. ``failures[0]`` (also ``primary``) is the root cause.

    Attributes: ``failures`` (list of `RankFailure`, root causes first, then consequences),
    ``stopped`` (ranks distlab stopped because another failed), ``stuck`` (Cluster only: ranks
    left stuck inside C++, with their stacks), ``world_size``.
    """

    def __init__(
        self,
        failures: list[RankFailure],
        stopped: list[int],
        world_size: int,
        stuck: dict[int, str] | None = None,
    ):
        self.failures = failures
        self.stopped = stopped
        self.world_size = world_size
        self.stuck = stuck or {}  #: (Cluster) ranks left stuck inside C++: rank -> stack
        self._raw = self._render()
        super().__init__(readable(self._raw))

    @property
    def primary(self) -> RankFailure:
        return self.failures[0]

    @property
    def ranks(self) -> list[int]:
        return [f.rank for f in self.failures]

    def _render(self) -> str:
        lines = [self.primary.headline()]
        shown: dict[str, list[int]] = {}  # identical tracebacks are shown once
        for f in self.failures:
            key = f"{f.type}\n{f.message}\n{f.traceback}\n{f.stage}\n{f.consequence}"
            shown.setdefault(key, []).append(f.rank)
        for ranks in shown.values():
            f = next(x for x in self.failures if x.rank == ranks[0])
            who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
            lines.append("")
            if f.consequence:
                lines.append(f"--- {who}: failed as a consequence of the error above ---")
            else:
                lines.append(f"--- {who} ---")
            if f.stage == "died":
                lines.append(f"{who} died: {f.message}")
                if f.output_tail:
                    lines.append("last output:")
                    lines.extend("  " + x for x in f.output_tail.rstrip("\n").splitlines())
            else:
                lines.append(f.traceback.rstrip("\n") or f"{f.type}: {f.message}")
        for r in sorted(self.stuck):
            lines.append("")
            lines.append(f"--- rank {r} is stuck inside C++, waiting for the failed rank(s) ---")
            lines.append(self.stuck[r].rstrip("\n") or "(no Python stack available)")
        if self.stuck:
            lines.append("")
            lines.append("A rank stuck in a collective cannot be interrupted. " + RESTART)
        if self.stopped:
            lines.append("")
            lines.append(
                "distlab stopped rank(s) "
                + ", ".join(map(str, self.stopped))
                + " after the failure above (they were still running)."
            )
        return "\n".join(lines)


class RankTimeout(DistlabError, TimeoutError):
    """Ranks did not finish within the timeout. ``stacks[rank]`` is where each stuck rank waits.

    Attributes: ``timeout`` (seconds), ``stacks`` (dict rank -> formatted Python stack),
    ``finished`` (ranks that did finish), ``world_size``.
    """

    def __init__(
        self,
        timeout: float,
        stacks: dict[int, str],
        finished: list[int],
        world_size: int,
        hint: str = "",
    ):
        self.timeout = timeout
        self.stacks = stacks
        self.finished = finished
        self.world_size = world_size
        self.hint = hint
        self._raw = self._render()
        super().__init__(readable(self._raw))

    @property
    def ranks(self) -> list[int]:
        return sorted(self.stacks)

    def where(self, rank: int) -> tuple[str, int, str]:
        """Where stuck ``rank`` waits in *your* code: ``(function, line, source)`` of the
        innermost frame of its stack that is neither torch's, distlab's nor Python's own (in a
        notebook: your cell's function, its line number in the cell, and that line).

        Raises:
            ValueError: ``rank`` is not one of the stuck ranks (``.ranks`` lists them), or its
                stack has no frame of your code (it was stuck inside a library only).
        """
        if rank not in self.stacks:
            raise InputError(f"rank {rank!r} is not stuck: the stuck ranks are {self.ranks}")
        frames = _FRAME.findall(self.stacks[rank])
        mine = [(fn, int(line), src.strip()) for file, line, fn, src in frames
                if not _library_file(file)]
        if not mine:
            raise InputError(f"rank {rank}'s stack has no frame of your code: it waits inside "
                             "a library only; print the error to see its whole stack")
        return mine[-1]

    def _render(self) -> str:
        stuck = self.ranks
        lines = [
            f"{len(stuck)} of {self.world_size} ranks did not finish within {self.timeout:g} s: "
            + ", ".join(f"rank {r}" for r in stuck)
            + "."
        ]
        for r in stuck:
            lines.append("")
            lines.append(f"--- rank {r} is stuck here (most recent call last) ---")
            lines.append(self.stacks[r].rstrip("\n") or "(no Python stack available)")
        if self.finished:
            lines.append("")
            lines.append("Finished: " + ", ".join(f"rank {r}" for r in self.finished) + ".")
        lines.append("")
        lines.append(
            self.hint
            or "A collective (all_reduce, barrier, ...) waits until every rank of the group calls "
            "it. Look for a rank that skipped it, called a different one, or is waiting for a "
            "message nobody sends."
        )
        return "\n".join(lines)


class ClusterBroken(DistlabError, RuntimeError):
    """A cluster's rank is stuck inside C++ or dead, so it cannot run cells until restarted."""


class ShipError(DistlabError, TypeError):
    """Something given to distlab cannot be sent to the ranks (it cannot be pickled)."""


class StartError(DistlabError, RuntimeError):
    """The ranks, or distlab's helper process that starts them, could not be started."""


class InputError(DistlabError, ValueError):
    """An argument given to distlab that cannot work (a size, a timeout, a backend's name); the
    message says what to give instead."""


class InputTypeError(DistlabError, TypeError):
    """An argument given to distlab of the wrong kind (a string where a number goes); the
    message says what to give instead."""


def looks_like_consequence(type_name: str, message: str) -> bool:
    return bool(_CONSEQUENCE.search(type_name) or _CONSEQUENCE.search(message))


def order_failures(failures: list[RankFailure]) -> list[RankFailure]:
    """Root causes first, then consequences, each in rank order (so the report is deterministic).

    A failure that looks like a reaction to a peer going away (connection closed, timed out) is a
    consequence when some other failure does not look like that. If *every* failure looks like
    that, the earliest one (``failures`` arrives in time order) is taken as the root cause.
    """
    if not failures:
        return []
    for f in failures:
        f.consequence = f.stage != "died" and looks_like_consequence(f.type, f.message)
    roots = sorted((f for f in failures if not f.consequence), key=lambda f: f.rank)
    if not roots:
        failures[0].consequence = False
        roots = [failures[0]]
    rest = sorted((f for f in failures if f.consequence), key=lambda f: f.rank)
    return roots + rest


__all__ = [
    "ClusterBroken",
    "DistlabError",
    "RankError",
    "RankFailure",
    "RankTimeout",
    "ShipError",
    "StartError",
]
