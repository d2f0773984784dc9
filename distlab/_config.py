"""Checking what the learner asked for, with errors that say how to fix it; and the facts of this
machine those checks and defaults depend on (cores, GPUs).

Knows nothing about ranks: the start method is checked where the start paths are
(`distlab._ranks.start_path.check_method`)."""

from __future__ import annotations

import math
import numbers
import os

from .errors import InputError, InputTypeError

BACKENDS = ("auto", "gloo", "nccl", "cpu:gloo,cuda:nccl", None)


def cpu_cores() -> int:
    """The CPU cores this process may use: its affinity (where the OS says), capped by a cgroup
    CPU quota (a JupyterHub or Kubernetes limit of 1.5 CPUs counts as 2 cores) when there is
    one. The threads each rank gets and doctor's comfortable world sizes follow it."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_limit()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota - 1e-9)))
    return cores


def cgroup_cpu_limit(
    cgroups: str = "/proc/self/cgroup", mountinfo: str = "/proc/self/mountinfo"
) -> float | None:
    """The CPUs this process's cgroups allow it (quota / period, the smallest along the path to
    the root), or None when no quota is set or none can be read (macOS, no cgroups).

    cgroup v2: ``cpu.max`` ("max 100000" or "150000 100000"); v1: ``cpu.cfs_quota_us`` (-1: none)
    over ``cpu.cfs_period_us``. Both are found through the mounts this process sees, so a
    container's own view (cgroup namespaces) is read as it is."""
    try:
        with open(cgroups) as f:
            memberships = [line.rstrip("\n").split(":", 2) for line in f if line.count(":") >= 2]
        with open(mountinfo) as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    limits = []
    for fields in mounts:
        if "-" not in fields:
            continue
        sep = fields.index("-")
        root, point, fstype = fields[3], fields[4], fields[sep + 1]
        options = fields[sep + 3].split(",") if len(fields) > sep + 3 else []
        if fstype == "cgroup2":
            paths = [path for hid, ctrls, path in memberships if hid == "0" and ctrls == ""]
            files = ("cpu.max",)
        elif fstype == "cgroup" and "cpu" in options:
            paths = [path for _, ctrls, path in memberships if "cpu" in ctrls.split(",")]
            files = ("cpu.cfs_quota_us", "cpu.cfs_period_us")
        else:
            continue
        for path in paths:
            if not (path + "/").startswith(root.rstrip("/") + "/"):
                continue  # this mount shows another part of the hierarchy
            here = os.path.join(point, path[len(root.rstrip("/")):].lstrip("/"))
            while True:
                limit = _read_cpu_limit(here, files)
                if limit is not None:
                    limits.append(limit)
                if os.path.normpath(here) == os.path.normpath(point):
                    break
                here = os.path.dirname(os.path.normpath(here))
    return min(limits) if limits else None


def _read_cpu_limit(folder: str, files: tuple[str, ...]) -> float | None:
    try:
        if files == ("cpu.max",):
            with open(os.path.join(folder, "cpu.max")) as f:
                quota, period = f.read().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        with open(os.path.join(folder, files[0])) as f:
            quota = int(f.read())
        with open(os.path.join(folder, files[1])) as f:
            period = int(f.read())
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None


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
    """Threads per rank when none are asked for: the cores shared out, at least one each; or
    ``DISTLAB_THREADS`` from the environment (a whole number >= 1), to see what ranks print on a
    machine with more cores (`make test-cpu-kernels` runs the notebooks so).

    Raises ValueError if ``DISTLAB_THREADS`` is set to anything but a whole number >= 1."""
    said = os.environ.get("DISTLAB_THREADS")
    if said:
        if not said.strip().isdigit() or int(said) < 1:
            raise ValueError(f"DISTLAB_THREADS={said!r}: it must be a whole number >= 1 (threads "
                             "per rank); unset it to share this machine's cores out")
        return int(said)
    return max(1, cpu_cores() // world_size)


def check_int(value, name: str, *, low: int | None = None, high: int | None = None,
              noun: str = "an int", hint: str = "", error: type[Exception] = InputError,
              type_error: type[Exception] | None = None, message: str | None = None) -> int:
    """``value`` as an int if it is a whole number (not a bool: ``True`` is an int to Python, never
    to a learner) from ``low`` to ``high`` (either may be None: no limit); else an error that
    says what ``name`` must be and what came.

    The message reads ``"{name} must be {noun} >= {low}, got {value!r}{hint}"`` (``<= {high}``
    with only a high limit, ``", {low} to {high}"`` with both), or ``message`` where the caller
    has a better sentence. ``error`` is raised for a value out of range, ``type_error`` (default:
    ``error``) for one that is not a whole number. Every "an int, not a bool, in range" check in
    distlab is this one."""
    whole = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if whole and (low is None or value >= low) and (high is None or value <= high):
        return int(value)
    if message is None:
        if low is not None and high is not None:
            limits = f", {low} to {high}"
        elif low is not None:
            limits = f" >= {low}"
        else:
            limits = "" if high is None else f" <= {high}"
        message = f"{name} must be {noun}{limits}, got {value!r}{hint}"
    raise (error if whole else (type_error or error))(message)


def check_world_size(world_size) -> int:
    return check_int(world_size, "world_size", low=1, type_error=InputTypeError, message=(
        f"world_size must be an int, at least 1 (the number of ranks to start), got "
        f"{type(world_size).__name__} {world_size!r}. Example: world_size=4."))


def check_timeout(timeout, name: str = "timeout") -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise InputTypeError(f"{name} must be a number of seconds, got "
                             f"{type(timeout).__name__}. Example: {name}=60.")
    if not timeout > 0:
        raise InputError(f"{name} must be positive (seconds), got {timeout}. Example: "
                         f"{name}=60.")
    return float(timeout)


def check_callable(fn, what: str = "launch()") -> None:
    if not callable(fn):
        hint = ""
        if fn is None:
            hint = " Did you write launch(work()) instead of launch(work)?"
        raise InputTypeError(
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
        raise InputError(
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
        raise InputError(
            f"backend={backend!r} needs one CUDA GPU per rank: world_size={world_size} but "
            f"{gpus} GPU(s) are visible. Use backend='gloo' (runs on CPU) or "
            f"world_size<={gpus}." if gpus else
            f"backend={backend!r} needs one CUDA GPU per rank, but no GPU is visible. "
            "Use backend='gloo' (runs on CPU)."
        )
    return backend

