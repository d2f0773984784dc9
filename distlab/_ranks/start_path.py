"""Which start path makes the ranks: the default, and the `Starter` for a method.

* ``"forkserver"`` (`distlab._ranks.forkserver`): a warm helper process that has imported torch
  forks each rank in milliseconds (Linux; macOS under its rules, see `forksafety`).
* ``"spawn"`` (`distlab._ranks.spawn`): each rank is a fresh interpreter, taken from a pool of
  spares that have imported torch while the learner read.

The only module that knows both: each start path knows only the interface (`starter`).
"""

from __future__ import annotations

import os

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


def get(method: str) -> Starter:
    """The starter for ``method`` (already checked by `distlab._config.check_start_method`).
    Once forking has been found unsafe in this kernel (`forksafety`), "forkserver" gets the
    spawn starter: a cluster made before the switch restarts on the spawn path too."""
    if method == "forkserver" and forksafety.unsafe_reason() is None:
        from . import forkserver

        return forkserver.get()
    from . import spawn

    return spawn.get()
