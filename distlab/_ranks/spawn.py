"""Start each rank in a fresh interpreter (macOS, or ``start_method="spawn"``).

Slower than the fork server (each rank imports torch itself, ~1.5 s), but needs no fork of a
process that has torch loaded, which macOS does not support safely.
"""

from __future__ import annotations

import base64
import os
import pickle
import subprocess
import sys

from .protocol import RankSpec
from .starter import BOOT, Starter, interpreter_env


class Spawner(Starter):
    method = "spawn"

    def __init__(self) -> None:
        self._procs: dict[int, subprocess.Popen] = {}

    def start_many(self, requests: list[tuple[RankSpec, list[int]]]) -> list[int]:
        return [self._start(spec, fds) for spec, fds in requests]

    def _start(self, spec: RankSpec, fds: list[int]) -> int:
        env = interpreter_env()
        env["DISTLAB_SPEC"] = base64.b64encode(pickle.dumps((spec, fds))).decode()
        code = "from distlab._ranks.spawn import entry; entry()"
        proc = subprocess.Popen(
            [sys.executable, "-c", BOOT.format(code=code)],
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
    """In the new interpreter: run the rank described by ``$DISTLAB_SPEC``."""
    spec, fds = pickle.loads(base64.b64decode(os.environ.pop("DISTLAB_SPEC")))
    from .rank import rank_main

    os._exit(rank_main(*fds, spec))
