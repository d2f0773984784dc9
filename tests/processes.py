"""Processes seen from a test: which of some pids still run."""

from __future__ import annotations

import psutil


def alive(pids) -> list[int]:
    """Those of ``pids`` still running (a zombie, dead but not yet reaped, is not)."""
    out = []
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out
