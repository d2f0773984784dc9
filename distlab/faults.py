"""Failures on purpose, and a launch that lets the survivors go on.

    from distlab import faults
    crash = faults.Crash(rank=1, step=5)        # rank 1 dies right after step 5
    ...
    crash.here(step)                             # in the training loop, on every rank
    ...
    outcome = faults.launch(train, crash, world_size=4)
    outcome.dead                                 # [1]
    outcome[0]                                   # what rank 0 returned, after it went on

`distlab.launch` stops every rank as soon as one fails: right for a bug, wrong for a lesson on
fault tolerance, where the survivors must notice the death, regroup and train on. `launch` here
runs the ranks the same way (same start, same output, same errors for anything but a death) and
waits for the survivors instead; the dead rank's process and everything it started are gone when
it returns, as are all the others.

What the survivors do (catch the error, build a new group, heal a replacement) is left to the
learner's code: that is notebook 27's lesson. `reconfigure` is the one call of it that needs
torch's private code (its options have no public name), kept here behind a public door.
"""

from __future__ import annotations

import os
import signal as _signal
import sys
import time
from dataclasses import dataclass

from . import _config, _torch, launcher
from .errors import InputError, InputTypeError, RankFailure, entry_point

#: How a `Crash` ends its rank: an exit code (as abrupt as a crash: no exception, no clean-up,
#: like notebook 17's ``os._exit(13)``), or a signal, as the OOM killer or ``kill -9`` would.
HOW = ("exit", "SIGKILL", "SIGSEGV")


@dataclass(frozen=True)
class Crash:
    """A rank that dies on purpose: ``rank`` ends its own process right after step ``step``.

    Args:
        rank: the rank that dies (int >= 0).
        step: the step after which it dies (int >= 1); `here` is called once per step.
        how: ``"exit"`` (``os._exit(code)``), ``"SIGKILL"`` or ``"SIGSEGV"`` (the process
            sends itself that signal: distlab reports ``killed by signal ...``).
        code: the exit code for ``how="exit"`` (1 to 255; default 13).

    Raises:
        TypeError / ValueError: an argument of the wrong type or out of range (the message says
            which).
    """

    rank: int
    step: int
    how: str = "exit"
    code: int = 13

    def __post_init__(self):
        _config.check_int(self.rank, "rank", low=0, type_error=InputTypeError)
        _config.check_int(self.step, "step", low=1, type_error=InputTypeError)
        if self.how not in HOW:
            raise InputError(f"how={self.how!r}: use one of {', '.join(map(repr, HOW))}")
        _config.check_int(self.code, "code", low=1, high=255, type_error=InputTypeError,
                          hint=" (an exit code)")

    def here(self, step: int, rank: int | None = None) -> None:
        """Die now if this is the chosen rank (default: ``RANK`` of the environment, as
        distlab and torchrun set it) and ``step`` the chosen step; otherwise do nothing."""
        if rank is None:
            rank = int(os.environ.get("RANK", "-1"))
        if rank != self.rank or step != self.step:
            return
        for stream in (sys.stdout, sys.stderr):  # what it printed reaches the notebook first
            try:
                stream.flush()
            except Exception:
                pass
        if self.how == "exit":
            os._exit(self.code)
        os.kill(os.getpid(), getattr(_signal, self.how))
        time.sleep(10)  # the signal is delivered before this returns
        os._exit(self.code)


class Outcome(list):
    """What `launch` returns: one entry per rank, what it returned, or None for a rank that died.

    Attributes: ``dead`` (the ranks that died, in order), ``survivors`` (the others),
    ``failures`` (rank -> its `RankFailure`: ``.message`` says how it ended, ``.exitcode``).
    """

    def __init__(self, values: list):
        self.failures = {r: v for r, v in enumerate(values) if isinstance(v, RankFailure)}
        super().__init__(None if r in self.failures else v for r, v in enumerate(values))
        self.dead = sorted(self.failures)
        self.survivors = [r for r in range(len(values)) if r not in self.failures]

    def __repr__(self) -> str:
        dead = ", ".join(f"rank {r} {self.failures[r].message}" for r in self.dead) or "none"
        finished = f"{len(self.survivors)} of {len(self)} ranks finished"
        return f"<distlab.faults.Outcome: {finished}; died: {dead}>"


@entry_point
def launch(fn, *args, world_size: int = 2, backend: str | None = "auto", timeout: float = 60.0,
           threads: int | None = None, fold: bool = True, start_method: str | None = None,
           env: dict[str, str] | None = None, start_timeout: float = 60.0, **kwargs) -> Outcome:
    """`distlab.launch`, except that a rank that dies does not stop the others.

    The survivors run on until ``fn`` returns on each of them (a survivor waiting in a
    collective with the dead rank gets gloo's error, "Connection closed by peer", which its own
    code may catch). Arguments are those of `distlab.launch`; with ``backend=None`` ``fn`` sets
    up its own process group (on a ``FileStore``, so that survivors can meet again without one).

    Returns:
        An `Outcome`: ``outcome[r]`` is what rank ``r`` returned (None if it died),
        ``outcome.dead`` the ranks that died and ``outcome.failures[r]`` how.

    Raises:
        What `distlab.launch` raises, for everything except a death: `distlab.RankError` if a
        rank raised (a survivor that does not catch the error of a collective with the dead
        rank raises too: catch it, as the notebook does, or use `distlab.launch`);
        `distlab.RankTimeout` (naming the dead ranks too) if a survivor is still running after
        ``timeout`` seconds: it probably waits in a collective that still includes a dead rank
        (a lost *node* closes no socket; with gloo and a live OS the error comes at once).
        Every process is gone when it returns or raises.
    """
    values = launcher.run(
        fn, args, kwargs, world_size=world_size, backend=backend, timeout=timeout,
        threads=threads, stream=False, fold=fold, start_method=start_method, env=env,
        start_timeout=start_timeout, on_failure="survive", grace=timeout)
    return Outcome(values)


__all__ = ["Crash", "HOW", "Outcome", "launch"]


def reconfigure(group, generation: int, handles: list[str]) -> None:
    """Rebuild ``group`` on a new list of members, in place, and wait until it is done:
    ``group.reconfigure(options).wait()`` (torch >= 2.14, experimental; gloo).

    Args:
        group: a process group made by ``init_process_group(..., enable_reconfigure=True)``
            (``group.supports_reconfigure`` is True).
        generation: an int naming this membership: the same on every member, a new one at
            each change (the members must agree on it, as on ``handles``).
        handles: the members' ``group.get_reconfigure_handle()`` strings, in their new rank
            order (the i-th becomes rank i); the members exchange them themselves (a store).

    Raises:
        InputError: torch older than 2.14 (rebuild the group with ``init_process_group`` on a
            new store instead), a group whose backend cannot be reconfigured (NCCL's: use
            ``dist.shrink_group`` there), or no handles. A gloo group made without
            ``enable_reconfigure=True``, or a handle that is not one, is torch's RuntimeError.
    """
    if not handles:
        raise InputError("reconfigure(..., handles=[]): give every member's "
                         "group.get_reconfigure_handle(), in the new rank order")
    if not getattr(group, "supports_reconfigure", False):
        raise InputError(f"{type(group).__name__}'s backend cannot be reconfigured: make a gloo "
                         "group with init_process_group(\"gloo\", ..., enable_reconfigure=True) "
                         "(torch >= 2.14); NCCL's groups shrink with dist.shrink_group instead")
    group.reconfigure(_torch.reconfigure_options(generation, handles)).wait()
