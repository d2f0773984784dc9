"""Start each rank in a fresh interpreter (macOS, or ``start_method="spawn"``), from a pool of
spares that have imported torch already.

A fresh interpreter spends about a second importing torch, which the fork server avoids by
forking ranks from one process that has imported it. macOS does not support forking a process
that has loaded its system libraries (torch loads Accelerate and Metal), so there every rank is a
new interpreter. To keep a launch quick anyway, distlab keeps *spares*: interpreters started
ahead of time that import torch and then wait on a Unix socket. A launch hands each rank's
`RankSpec` and its three file descriptors to a spare (the same SCM_RIGHTS passing the fork server
uses), which becomes that rank; new spares are started as soon as those ranks have met, and
more when they exit, so they are ready again by the time a learner has read the next cell.
Unlike the fork server, a spare does not go on to import what DDP, FSDP and RPC need: each spare
holds its imports in memory of its own (~145 MiB with torch, ~215 MiB with those), and a rank that
needs them imports them while it loads its task, before its timeout starts. A spare is used once:
a process that has run a rank is never reused (torch and Python keep state a fresh rank must not
see, warnings shown once among it). Without a spare ready, a new interpreter is started and given
its rank at once.

The pool holds as many spares as the largest launch asked for lately, at most `MAX_SPARES`, and
fewer while many ranks are alive (`MAX_SPAWNED`); they exit when the kernel does (their socket
closes).
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import threading
from collections import deque

from ..errors import StartError
from .protocol import Become, RankSpec, recv, send
from .starter import BOOT, PRELOAD, Starter, interpreter_env

#: Most spares kept ready: each holds torch in memory (~145 MiB of its own).
MAX_SPARES = 4
#: Spares are only kept while ranks and spares together stay within this many interpreters: a
#: notebook's six-rank cluster then keeps none, and the notebook stays under 2 GB.
MAX_SPAWNED = 6
#: Spares kept before any launch has asked for more (a notebook's first launch).
FIRST_SPARES = 2


class _Spare:
    """One interpreter waiting to become a rank, and the kernel's end of its socket."""

    def __init__(self) -> None:
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        code = f"from distlab._ranks.spawn import spare_main; spare_main({theirs.fileno()})"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", BOOT.format(code=code)],
            pass_fds=[theirs.fileno()],
            env=interpreter_env(),
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        theirs.close()

    def give(self, spec: RankSpec, fds: list[int]) -> None:
        """Make it rank ``spec.rank`` (it may still be importing: it reads this afterwards)."""
        send(self.sock, Become(spec), fds)
        self.sock.close()


class Spawner(Starter):
    method = "spawn"

    def __init__(self) -> None:
        self._spares: deque[_Spare] = deque()
        self._procs: dict[int, subprocess.Popen] = {}
        self._want = FIRST_SPARES
        self._lock = threading.Lock()

    def warm(self) -> None:
        """Start spares up to the pool's size (``import distlab`` does, on the spawn path)."""
        with self._lock:
            self._refill()

    def start_many(self, requests: list[tuple[RankSpec, list[int]]]) -> list[int]:
        with self._lock:
            self._want = min(MAX_SPARES, max(self._want, len(requests)))
            pids = []
            for spec, fds in requests:
                spare = self._take()
                try:
                    spare.give(spec, fds)
                except OSError as e:
                    spare.proc.kill()
                    raise StartError(
                        f"distlab could not start rank {spec.rank} in a new Python interpreter: "
                        f"{e}"
                    ) from None
                self._procs[spare.proc.pid] = spare.proc
                pids.append(spare.proc.pid)
            return pids

    def started(self) -> None:
        """New spares import torch once the ranks have met, so they do not slow them down."""
        with self._lock:
            self._refill()

    def stopped(self) -> None:
        """Top the pool up again: while the ranks lived, fewer spares fitted in `MAX_SPAWNED`
        (a launch at 4 ranks leaves 2), and the learner now reads the output."""
        with self._lock:
            self._refill()

    def _take(self) -> _Spare:
        while self._spares:
            spare = self._spares.popleft()
            if spare.proc.poll() is None:
                return spare
            spare.sock.close()  # it died (killed from outside): never mind it
        return _Spare()

    def _refill(self) -> None:
        live = sum(proc.poll() is None for proc in self._procs.values())
        while len(self._spares) < min(self._want, MAX_SPAWNED - live):
            self._spares.append(_Spare())

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

    def close(self) -> None:
        """Stop the spares (they hold nothing yet: no need to wait for their imports)."""
        with self._lock:
            while self._spares:
                spare = self._spares.popleft()
                spare.sock.close()
                spare.proc.kill()
                spare.proc.wait()


_lock = threading.Lock()
_spawner: Spawner | None = None


def get() -> Spawner:
    """The shared pool of spares (created on first use)."""
    global _spawner
    with _lock:
        if _spawner is None:
            _spawner = Spawner()
            atexit.register(_spawner.close)
        return _spawner


def warm() -> None:
    """Start the first spares now, so the first launch finds torch imported."""
    get().warm()


def spare_main(sock_fd: int) -> None:
    """In a spare: import what every rank needs, wait to be given a rank, then be it."""
    import importlib
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in a terminal is the kernel's
    sock = socket.socket(fileno=sock_fd)
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:
            break  # the rank will import it itself and report the error where it is seen
    try:
        become, fds = recv(sock)
    except (EOFError, OSError):
        os._exit(0)  # the kernel has gone, or let the spare go
    sock.close()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from .rank import rank_main

    os._exit(rank_main(*fds, become.spec))
