"""distlab: learn torch.distributed by running it, from a notebook, on your laptop.

    import distlab
    result = distlab.launch(work, world_size=4)   # run work() on 4 ranks, get 4 values back
"""

from __future__ import annotations

import os

from . import memory, timeline
from ._ship import ShipError
from .cluster import Cluster
from .errors import ClusterBroken, RankError, RankFailure, RankTimeout
from .exercises import check
from .launcher import launch
from .magic import load_ipython_extension

__version__ = "0.1.0"

__all__ = [
    "Cluster",
    "check",
    "ClusterBroken",
    "RankError",
    "RankFailure",
    "RankTimeout",
    "ShipError",
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
        from . import _zygote

        _zygote.warm()
    except Exception:  # never break `import distlab`; launch() reports problems properly
        pass


_warm_start()
