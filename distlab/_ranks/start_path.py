"""Which start path makes the ranks: the default, and the `Starter` for a method.

* ``"forkserver"`` (`distlab._ranks.forkserver`): a warm helper process that has imported torch
  forks each rank in milliseconds (Linux; macOS under its rules, see `forksafety`).
* ``"spawn"`` (`distlab._ranks.spawn`): each rank is a fresh interpreter, taken from a pool of
  spares that have imported torch while the learner read.

The only module that knows both: each start path knows only the interface (`starter`).
"""

from __future__ import annotations

import os
import sys

from ..errors import InputError
from . import forksafety
from .starter import Starter, forkserver_supported

METHODS = ("forkserver", "spawn")

#: Set to "spawn" (or "forkserver") to choose the start path for every launch and cluster that
#: does not name one: ``DISTLAB_START_METHOD=spawn make test`` runs the course as a Mac would.
ENV_VAR = "DISTLAB_START_METHOD"


def default_method() -> str:
    """The start path when none is named: ``$DISTLAB_START_METHOD`` if set, else the fork
    server where it is supported and has not been found unsafe in this kernel, else spawn."""
    chosen = os.environ.get(ENV_VAR, "").strip()
    if chosen:
        return chosen
    if forkserver_supported() and forksafety.unsafe_reason() is None:
        return "forkserver"
    return "spawn"


def check_method(method) -> str:
    """``method`` checked (``None``: `default_method`): a name in `METHODS` that this machine
    can start ranks with.

    Raises:
        OSError: on Windows (distlab runs ranks on Linux and macOS; use WSL2).
        InputError (a ValueError): an unknown method (``$DISTLAB_START_METHOD`` included), or
            "forkserver" where it is not supported (use "spawn")."""
    if sys.platform == "win32":
        raise OSError("distlab runs ranks on Linux and macOS. On Windows, use WSL2.")
    where = ""
    if method is None:
        method = default_method()
        if os.environ.get(ENV_VAR, "").strip():
            where = f" (from ${ENV_VAR})"
    if method not in METHODS:
        raise InputError(f"start_method must be one of {METHODS}, got {method!r}{where}.")
    if method == "forkserver" and not forkserver_supported():
        raise InputError(
            f"start_method='forkserver'{where} is available on Linux and macOS only (it needs "
            "socket.send_fds); use 'spawn'."
        )
    return method


def get(method: str) -> Starter:
    """The starter for ``method`` (already checked by `check_method`).
    Once forking has been found unsafe in this kernel (`forksafety`), "forkserver" gets the
    spawn starter: a cluster made before the switch restarts on the spawn path too."""
    if method == "forkserver" and forksafety.unsafe_reason() is None:
        from . import forkserver

        return forkserver.get()
    from . import spawn

    return spawn.get()
