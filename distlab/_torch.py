"""The one door to torch's private and version-dependent APIs.

torch changes its private code every release, and sometimes renames public calls. Everything
distlab uses that is private (a leading underscore), or that differs between the torch releases
the course supports (2.13, 2.14, 2.15), is reached through a function here, so that a torch
upgrade touches this module and nothing else. Each entry says what it is, since when torch has
it, and what replaces it.

Knows nothing about ranks, notebooks or the learner: it only finds the right torch call.
"""

from __future__ import annotations

import datetime


def release() -> tuple[int, ...]:
    """The installed torch's release as numbers: ``(2, 14, 1)`` for ``2.14.1+cu130``."""
    import torch

    return _numbers(torch.__version__.split("+")[0])


def at_least(version: str) -> bool:
    """Whether the installed torch is ``version`` (``"2.14"``, ``"2.14.1"``) or newer."""
    wanted = _numbers(version)
    return release()[: len(wanted)] >= wanted


def _numbers(version: str) -> tuple[int, ...]:
    import re

    match = re.match(r"(\d+(?:\.\d+)*)", version) if isinstance(version, str) else None
    if not match:
        raise ValueError(
            f"{version!r} is not a torch release: write it as dotted numbers, e.g. '2.14'"
        )
    return tuple(int(part) for part in match.group(1).split("."))


def sac_options() -> dict:
    """Keyword arguments for ``torch.utils.checkpoint.checkpoint`` with a selective policy.

    - ``respect_saved_tensors_hooks``: new in torch 2.14. SAC's cache bypasses saved-tensor
      hooks (an activation meter's, ``save_on_cpu``); 2.14 warns (FutureWarning) when such a
      hook is active around SAC unless the caller chooses, since a later release will route the
      cache through the hooks. ``False`` keeps what 2.13 did, without the warning; on 2.13 the
      argument does not exist and nothing is passed.
    """
    import inspect

    from torch.utils.checkpoint import checkpoint

    if "respect_saved_tensors_hooks" in inspect.signature(checkpoint).parameters:
        return {"respect_saved_tensors_hooks": False}
    return {}


def set_pg_timeout(timeout: datetime.timedelta, group=None) -> bool:
    """Change a process group's timeout after ``init_process_group``; False where torch cannot.

    - ``torch.distributed.set_timeout(timeout, group)``: public since torch 2.14.
    - ``torch.distributed.distributed_c10d._set_pg_timeout``: private, torch 2.2 to 2.13; in
      2.14 it still works but warns (a FutureWarning that every rank would print into the
      learner's cell), so it is used only where the public call is missing.
    """
    import torch.distributed as dist

    setter = getattr(dist, "set_timeout", None)
    if setter is None:
        setter = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    if setter is None:
        return False
    setter(timeout, group)
    return True


# The torch releases the course is run on. LOCKED made every stored output (the Makefile's pin);
# the others are tried on purpose (`make test-torch TORCH_VERSION=2.13.0`, `make test-latest`), and
# the README's "Which torch" table says what differs on each. tests/test_project_files.py keeps
# LOCKED equal to the Makefile's pin.
LOCKED = "2.14.1"
TRIED = ("2.13.0", "2.14.1", "2.15.0")
