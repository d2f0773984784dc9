"""The interface both start paths implement (`Starter`), and what they share: the modules every
rank needs imported (`PRELOAD`), a new interpreter's environment and its boot line.

Knows nothing about which path is taken: `distlab._ranks.start_path` chooses.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from abc import ABC, abstractmethod

from .protocol import RankSpec

#: What every rank needs imported before it is given its rank, on both start paths: the fork
#: server imports it once and forks ranks from it; each spare imports it while the learner reads.
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.distributed.distributed_c10d",
    "torch.nn",
    "torch.nn.parallel",
    "torch.optim",
    "distlab._ranks.ship",
    "distlab._ranks.rank",
)


class Starter(ABC):
    """Starts ranks and learns how they exited.

    The kernel creates each rank's channels (``ctrl``, ``dbg``, ``out``; see
    `distlab._ranks.protocol`) and hands the rank's ends over as file descriptors; the starter
    makes a process that runs `distlab._ranks.rank.rank_main` with them and its `RankSpec`.
    """

    #: "forkserver" or "spawn"
    method: str

    @abstractmethod
    def start_many(self, requests: list[tuple[RankSpec, list[int]]]) -> list[int]:
        """Start one rank per ``(spec, [ctrl_fd, dbg_fd, out_fd])``; return their pids, in
        order. The caller closes its copies of the fds afterwards. Raises
        `distlab.errors.StartError` when the ranks cannot be started."""

    @abstractmethod
    def wait_exit(self, pid: int, timeout: float) -> int | None:
        """Exit code of rank ``pid`` (negative: killed by that signal) once it has exited, or
        None if it is still running after ``timeout`` seconds (or is not ours)."""

    def started(self) -> None:  # noqa: B027 -- most starters have nothing to do then
        """The ranks last asked for have all started (or failed to): a starter may now do its
        background work without slowing their start."""

    def stopped(self) -> None:  # noqa: B027 -- most starters have nothing to do then
        """Ranks have exited (a launch returned, a cluster shut down): what they held is free."""


def forkserver_supported() -> bool:
    """Ranks can fork from the helper on Linux, and on macOS under its rules (see
    `forksafety`: a helper that never had a thread, never computed, proven by a canary)."""
    return (sys.platform.startswith("linux") or sys.platform == "darwin") and hasattr(
        socket, "send_fds")


def interpreter_env() -> dict[str, str]:
    """The environment of a new interpreter that will run ranks (the fork server, or a spawned
    rank): the kernel's, with these additions."""
    env = dict(os.environ)
    env["DISTLAB_NO_WARM"] = "1"  # `import distlab` there starts no helper of its own
    env["DISTLAB_SYS_PATH"] = json.dumps([p for p in sys.path if p])  # the kernel's sys.path
    # Import torch with small thread pools; each rank then sets its own budget.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.setdefault(var, "1")
    # torch's Python logging (DTensor's and FSDP's warnings) starts every line with the rank, the
    # time to the microsecond and the pid, so the same warning from four ranks is four different
    # lines. Level, logger and message say what a learner needs, and fold into one line. It is
    # read once, when torch is imported. Set it yourself to keep torch's own.
    env.setdefault("TORCH_LOGS_FORMAT", "%(levelname)s %(name)s: %(message)s")
    return env


#: ``python -c BOOT.format(...)``: put the kernel's sys.path in place, then run distlab's code.
BOOT = (
    "import sys, json, os; sys.path[:0] = json.loads(os.environ.pop('DISTLAB_SYS_PATH'));"
    "{code}"
)
