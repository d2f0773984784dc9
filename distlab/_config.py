"""Checking what the learner asked for, with errors that say how to fix it; and the facts of this
machine those checks and defaults depend on (cores, GPUs)."""

from __future__ import annotations

import numbers
import os
import sys

BACKENDS = ("auto", "gloo", "nccl", "cpu:gloo,cuda:nccl", None)


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity, where the OS says)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def process_group_rank() -> tuple[int | None, int | None]:
    """(rank, world size) of this process in the default process group; (None, None) when no
    process group runs (or torch.distributed is not available)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    return None, None


def default_threads(world_size: int) -> int:
    """Threads per rank when none are asked for: the cores shared out, at least one each."""
    return max(1, cpu_cores() // world_size)


def check_world_size(world_size) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral):
        raise TypeError(
            f"world_size must be an int (the number of ranks to start), got "
            f"{type(world_size).__name__} {world_size!r}. Example: world_size=4."
        )
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}.")
    return int(world_size)


def check_timeout(timeout, name: str = "timeout") -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"{name} must be a number of seconds, got {type(timeout).__name__}.")
    if not timeout > 0:
        raise ValueError(f"{name} must be positive (seconds), got {timeout}.")
    return float(timeout)


def check_callable(fn, what: str = "launch()") -> None:
    if not callable(fn):
        hint = ""
        if fn is None:
            hint = " Did you write launch(work()) instead of launch(work)?"
        raise TypeError(
            f"{what} needs a function to run on every rank, got {type(fn).__name__}.{hint} "
            "Pass the function itself: distlab.launch(work, world_size=2)."
        )


def cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_backend(backend, world_size: int) -> str | None:
    """``"auto"`` becomes NCCL (for CUDA tensors, with gloo for CPU tensors) when there is one GPU
    per rank, else gloo. ``None`` means: start the ranks without a process group."""
    if backend not in BACKENDS:
        raise ValueError(
            f"unknown backend {backend!r}. Choose one of: 'auto' (NCCL if every rank gets its own "
            "GPU, else gloo), 'gloo' (CPU), 'nccl' (one GPU per rank), 'cpu:gloo,cuda:nccl', or "
            "None (no process group: initialize it yourself)."
        )
    if backend is None or backend == "gloo":
        return backend
    gpus = cuda_device_count()
    if backend == "auto":
        return "cpu:gloo,cuda:nccl" if gpus >= world_size else "gloo"
    if gpus < world_size:
        raise ValueError(
            f"backend={backend!r} needs one CUDA GPU per rank: world_size={world_size} but "
            f"{gpus} GPU(s) are visible. Use backend='gloo' (runs on CPU) or "
            f"world_size<={gpus}." if gpus else
            f"backend={backend!r} needs one CUDA GPU per rank, but no GPU is visible. "
            "Use backend='gloo' (runs on CPU)."
        )
    return backend


def check_start_method(method) -> str:
    """``None`` -> the default (`distlab._ranks.starter.default_method`); else checked."""
    from ._ranks import starter

    if sys.platform == "win32":
        raise OSError("distlab runs ranks on Linux and macOS. On Windows, use WSL2.")
    where = ""
    if method is None:
        method = starter.default_method()
        if os.environ.get(starter.ENV_VAR, "").strip():
            where = f" (from ${starter.ENV_VAR})"
    if method not in starter.METHODS:
        raise ValueError(f"start_method must be one of {starter.METHODS}, got {method!r}{where}.")
    if method == "forkserver" and not starter.forkserver_supported():
        raise ValueError(
            f"start_method='forkserver'{where} is available on Linux only; use 'spawn'."
        )
    return method
