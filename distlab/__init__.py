"""distlab: learn torch.distributed by running it, from a notebook, on your laptop.

    import distlab
    result = distlab.launch(work, world_size=4)   # run work() on 4 ranks, get 4 values back
"""

from __future__ import annotations

import os

from . import errors, memory, timeline
from .bounds import above, below
from .cluster import Cluster
from .errors import *  # noqa: F403 -- every error a learner may catch, as distlab.RankError etc.
from .exercises import check
from .launcher import launch
from .magic import load_ipython_extension

__version__ = "0.1.0"

__all__ = [
    "Cluster",
    "above",
    "below",
    "check",
    *errors.__all__,
    "launch",
    "memory",
    "timeline",
    "load_ipython_extension",
    "torch_at_least",
    "versions",
    "__version__",
]


def versions() -> str:
    """One line naming the versions a notebook ran with (its first cell prints it).

    What changes a lesson's output, and no more: Python's minor version (tracebacks are drawn
    differently from one to the next), torch's release and distlab's. Not Python's patch release,
    nor torch's build tag (``+cpu``, ``+cu128``): a Mac, a CUDA machine and this course's CPU
    machine print the same line, and a notebook saved with another torch release is stale."""
    import sys

    import torch

    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    return f"Python {python}, torch {torch.__version__.split('+')[0]}, distlab {__version__}"


def torch_at_least(version: str) -> bool:
    """Whether the installed torch is ``version`` (e.g. ``"2.14"``) or newer.

    Where a lesson's behaviour changed between torch releases, the notebook shows what the
    locked release does and, behind this check, what an older one did, so that a learner on
    either can follow. Raises ValueError for a version that is not dotted numbers."""
    from . import _torch

    return _torch.at_least(version)


def _warm_start() -> None:
    # Start the helper that imports torch now, in its own process, so the first launch is quick.
    if os.environ.get("DISTLAB_NO_WARM"):
        return
    try:
        from ._ranks import forkserver, spawn, start_path

        if start_path.default_method() == "forkserver":
            forkserver.warm()
        elif start_path.default_method() == "spawn":
            spawn.warm()
    except Exception:  # never break `import distlab`; launch() reports problems properly
        pass


_warm_start()
