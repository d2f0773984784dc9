"""When forking ranks from the helper is safe on macOS, and the checks that prove it.

What Apple's open-source runtime says (objc4, libdispatch, CoreFoundation, libpthread), and what
follows for distlab's helper (the fork server), which is started by exec, never forked:

- the Objective-C runtime aborts a forked child that runs a class's ``+initialize`` only if the
  parent had ever been multi-threaded (``pthread_is_threaded_np()``): the helper must never have
  had a second thread. It checks that before every fork (on Linux the same code path counts
  ``/proc/self/task``);
- libdispatch (GCD) and CoreFoundation poison a child only if the parent used them: the helper
  never computes (Accelerate's BLAS runs on GCD), never resolves a host name (mDNSResponder),
  never reads proxy settings (SystemConfiguration: ``no_proxy=*``), never touches Metal (MPS is
  enumerated lazily; a forked rank that asks for it is told to spawn instead);
- NumPy with OpenBLAS starts threads at import unless ``OPENBLAS_NUM_THREADS=1``: the helper's
  environment sets it, and Accelerate's ``VECLIB_MAXIMUM_THREADS=1``, before it starts.

A canary proves it at start: one forked child does a torch matmul, a NumPy dot, a loopback
lookup and a one-rank gloo group, and must exit cleanly with nothing like ``objc[`` on its
stderr. A failure then, or later (a forked rank that dies with Apple's fork-safety message),
switches the kernel to the spawn path for good, with one line saying why.

``DISTLAB_AS_MACOS=1`` applies all of this on Linux, where it can be tested. ``DISTLAB_TEST_*``
variables simulate what only a Mac would do (a helper with a thread, a canary that complains).
"""

from __future__ import annotations

import os
import sys
import threading

from ..errors import StartError

#: Set (to 1) to follow macOS's rules on Linux: the stand-in the tests and benchmarks use.
ENV_AS_MACOS = "DISTLAB_AS_MACOS"
#: Set by the kernel in the helper's environment: check before forking, run the canary.
ENV_STRICT = "DISTLAB_FORK_STRICT"
#: Test hooks: a thread in the helper ("early": as it is ready; "late": after the canary);
#: text the canary writes to stderr.
ENV_TEST_THREAD = "DISTLAB_TEST_HELPER_THREAD"
ENV_TEST_CANARY = "DISTLAB_TEST_CANARY_STDERR"

#: What Apple's frameworks print when a forked child trips over them.
MARKERS = (
    "objc[",
    "may have been in progress in another thread when fork() was called",
    "__THE_PROCESS_HAS_FORKED_AND_YOU_CANNOT_USE_THIS_COREFOUNDATION_FUNCTIONALITY",
    "You MUST exec()",
)


class ForkUnsafe(StartError):
    """Forking ranks from the helper was found unsafe here; the spawn path takes over."""


def macos_rules() -> bool:
    """Follow macOS's fork rules: on a Mac, or on Linux with ``DISTLAB_AS_MACOS=1``."""
    return sys.platform == "darwin" or os.environ.get(ENV_AS_MACOS, "").strip() not in ("", "0")


def helper_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a helper that will fork ranks under macOS's rules."""
    env = dict(env)
    for var in ("OPENBLAS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "OMP_NUM_THREADS",
                "MKL_NUM_THREADS"):
        env[var] = "1"  # no BLAS thread pool at import (ranks set their own budget)
    env["no_proxy"] = env["NO_PROXY"] = "*"  # urllib never asks SystemConfiguration
    env[ENV_STRICT] = "1"
    return env


def strict() -> bool:
    """In the helper or a rank forked from it: are macOS's rules in force?"""
    return os.environ.get(ENV_STRICT) == "1"


def threads() -> int:
    """Threads this process has (has ever had, on macOS, where that is what matters)."""
    if sys.platform == "darwin":
        import ctypes

        libc = ctypes.CDLL(None)
        return 2 if libc.pthread_is_threaded_np() else 1
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def marker_in(text: str) -> str | None:
    """The first line of ``text`` that shows Apple's fork-safety failure, or None."""
    for line in text.splitlines():
        if any(m in line for m in MARKERS):
            return line.strip()
    return None


def canary() -> int:
    """In a child forked from the helper: everything a rank will do that a bad fork would break.
    Returns the exit code (0: all went well); anything alarming goes to stderr."""
    import socket

    import numpy
    import torch
    import torch.distributed as dist

    if os.environ.get(ENV_TEST_CANARY):
        sys.stderr.write(os.environ[ENV_TEST_CANARY] + "\n")
    a = torch.ones(64, 64)
    assert float((a @ a).sum()) == 64 * 64 * 64
    assert float(numpy.ones(64) @ numpy.ones(64)) == 64.0
    socket.getaddrinfo("localhost", None)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    t = torch.ones(2)
    dist.all_reduce(t)
    dist.destroy_process_group()
    assert t.tolist() == [1.0, 1.0]
    return 0


def guard_mps() -> None:
    """In a rank forked under macOS's rules: asking for MPS (Metal) says what to do instead of
    crashing inside Metal."""
    try:
        import torch.backends.mps as mps
    except ImportError:
        return

    def refuse(*args, **kwargs):
        raise RuntimeError(
            "this rank was forked from distlab's helper, and Metal (MPS) is not safe in a "
            "forked process on macOS: launch with start_method='spawn' for ranks that use MPS"
        )

    mps.is_available = refuse
    mps.is_built = refuse


# -- the kernel's side: once unsafe, unsafe for good ---------------------------------------------

_unsafe: str | None = None
_lock = threading.Lock()


def unsafe_reason() -> str | None:
    """Why forking was found unsafe in this kernel (None: it was not)."""
    return _unsafe


def mark_unsafe(reason: str) -> None:
    """From now on this kernel's ranks are fresh interpreters; say so once, on stderr."""
    global _unsafe
    with _lock:
        if _unsafe is not None:
            return
        _unsafe = reason
    sys.stderr.write(
        f"distlab: ranks start as fresh interpreters from now on in this kernel (slower), "
        f"because forking them from the helper is not safe here: {reason}\n"
    )
    sys.stderr.flush()
