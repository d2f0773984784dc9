"""Start a rank in a fresh interpreter (macOS, or ``start_method="spawn"``).

Slower than the zygote (each rank imports torch itself, ~1.5 s), but needs no fork of a process
that has torch loaded, which macOS does not support safely.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import sys

_BOOT = (
    "import sys, json, os; sys.path[:0] = json.loads(os.environ.pop('DISTLAB_SYS_PATH'));"
    "from distlab._spawn import entry; entry()"
)


class Spawner:
    """Same interface as `distlab._zygote.Zygote`: ``fork_many``, ``wait_exit``."""

    def __init__(self) -> None:
        self._procs: dict[int, subprocess.Popen] = {}

    def fork_many(self, requests: list[tuple[dict, list[int]]]) -> list[int]:
        return [self.fork(spec, fds) for spec, fds in requests]

    def fork(self, spec: dict, fds: list[int]) -> int:
        env = dict(os.environ, DISTLAB_NO_WARM="1")
        env["DISTLAB_SYS_PATH"] = json.dumps([p for p in sys.path if p])
        env["DISTLAB_SPEC"] = base64.b64encode(pickle.dumps((spec, fds))).decode()
        proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT],
            pass_fds=fds,
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._procs[proc.pid] = proc
        return proc.pid

    def wait_exit(self, pid: int, timeout: float) -> int | None:
        proc = self._procs.get(pid)
        if proc is None:
            return None
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        del self._procs[pid]
        return code


def entry() -> None:
    spec, fds = pickle.loads(base64.b64decode(os.environ.pop("DISTLAB_SPEC")))
    from distlab._child import rank_main

    os._exit(rank_main(*fds, spec))
