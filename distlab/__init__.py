"""distlab: learn torch.distributed by running it, from a notebook, on your laptop.

    import distlab
    result = distlab.launch(work, world_size=4)   # run work() on 4 ranks, get 4 values back
"""

from __future__ import annotations

import os

from . import errors, memory, timeline
from .cluster import Cluster
from .errors import *  # noqa: F403 -- every error a learner may catch, as distlab.RankError etc.
from .exercises import check
from .launcher import launch
from .magic import load_ipython_extension

__version__ = "0.1.0"

__all__ = [
    "Cluster",
    "check",
    *errors.__all__,
    "launch",
    "memory",
    "timeline",
    "load_ipython_extension",
    "versions",
    "__version__",
]


def versions() -> str:
    """One line naming the versions a notebook ran with (its first cell prints it)."""
    import platform

    import torch

    return f"Python {platform.python_version()}, torch {torch.__version__}, distlab {__version__}"


def _warm_start() -> None:
    # Start the helper that imports torch now, in its own process, so the first launch is quick.
    if os.environ.get("DISTLAB_NO_WARM"):
        return
    try:
        from ._ranks import forkserver, spawn, starter

        if starter.default_method() == "forkserver":
            forkserver.warm()
        elif starter.default_method() == "spawn":
            spawn.warm()
    except Exception:  # never break `import distlab`; launch() reports problems properly
        pass


_warm_start()
