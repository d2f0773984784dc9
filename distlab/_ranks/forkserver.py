"""The kernel's handle on the fork server: one warm Python process, with torch imported, that
forks the ranks (what runs inside it is `distlab._ranks.forkserver_main`).

Why not fork the notebook kernel? The kernel runs threads (ZMQ, heartbeats, torch's own pools),
and a fork taken while another thread holds a lock gives a child that hangs forever on that lock.
Why not spawn a fresh interpreter per rank? Each would spend ~1.5 s importing torch.

So the kernel starts the fork server once, with a clean exec, and asks it for ranks over a Unix
socket (`distlab._ranks.protocol`). A reader thread takes every message the server sends, so
exit reports never pile up unread.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading

from ..errors import StartError
from . import forksafety
from .forksafety import ForkUnsafe
from .protocol import (
    Canary,
    CanaryDone,
    Exited,
    Failed,
    Fork,
    Forked,
    Hold,
    RankSpec,
    Ready,
    Settled,
    Unsafe,
    recv,
    send,
)
from .starter import BOOT, Starter, forkserver_supported, interpreter_env


class ForkServer(Starter):
    """Start the fork server, ask it to fork ranks, learn how they exited."""

    method = "forkserver"

    def __init__(self, env: dict[str, str] | None = None):
        self.strict = forksafety.macos_rules()  # check before forking; prove it with a canary
        env = interpreter_env() if env is None else env
        if self.strict:
            env = forksafety.helper_env(env)
        self._sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        code = f"from distlab._ranks.forkserver_main import serve; serve({child_sock.fileno()})"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", BOOT.format(code=code)],
            pass_fds=[child_sock.fileno()],
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        child_sock.close()
        self._cond = threading.Condition()
        self._forked: dict[int, int] = {}
        self._exited: dict[int, int] = {}
        self._ready = False
        self._canary_asked = False
        self._settled = False
        self._error: str | None = None
        self._closed = False
        self._token = 0
        self._unsafe: dict[int, str] = {}  # token -> why the server would not fork
        self.canary: CanaryDone | None = None  # under macOS's rules, once it has run
        self._send_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read_loop, name="distlab-forkserver",
                                        daemon=True)
        self._reader.start()
        if self.strict:  # the server runs it as soon as it is ready, before any rank
            self._canary_asked = True
            send(self._sock, Canary())

    def _read_loop(self) -> None:
        while True:
            try:
                msg, fds = recv(self._sock)
            except (EOFError, OSError):
                break
            for fd in fds:
                os.close(fd)
            with self._cond:
                if isinstance(msg, Ready):
                    self._ready = True
                elif isinstance(msg, Settled):
                    self._settled = True
                elif isinstance(msg, Failed):
                    self._error = msg.traceback
                elif isinstance(msg, Forked):
                    self._forked[msg.token] = msg.pid
                elif isinstance(msg, Exited):
                    self._exited[msg.pid] = msg.status
                elif isinstance(msg, Unsafe):
                    self._unsafe[msg.token] = msg.reason
                elif isinstance(msg, CanaryDone):
                    self.canary = msg
                self._cond.notify_all()
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def alive(self) -> bool:
        return not self._closed and self._error is None and self.proc.poll() is None

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Wait until the server has imported torch (and, under macOS's rules, its canary has
        passed). Raises `ForkUnsafe` if the canary failed, `StartError` if the server did."""
        with self._cond:
            self._cond.wait_for(lambda: self._ready or self._error or self._closed, timeout)
            if self._ready and self.strict:
                self._cond.wait_for(lambda: self.canary is not None or self._closed, timeout)
                if self.canary is not None and not self.canary.ok:
                    raise ForkUnsafe(self.canary.detail)
            if self._ready and not self._closed:
                return
            if self._error or self._closed:
                raise StartError(
                    "distlab could not start its helper process (the one that imports torch "
                    "once and forks the ranks):\n"
                    + (self._error or f"it exited with code {self.proc.poll()}")
                    + "\nCheck that `import torch` works in this environment."
                )
            raise StartError(
                f"distlab's helper process did not finish importing torch in {timeout:.0f} s"
            )

    def hold(self, on: bool) -> None:
        """Pause (``on``) or resume the server's idle-time warm-up (`protocol.Hold`)."""
        with self._send_lock:
            send(self._sock, Hold(on))

    def wait_settled(self, timeout: float = 120.0) -> bool:
        """Wait until the server has done its idle-time work (late imports, huge pages), so
        that launches from now on are as fast as they get. Benchmarks and tests use this."""
        self.wait_ready(timeout)
        with self._cond:
            self._cond.wait_for(lambda: self._settled or self._closed, timeout)
            return self._settled

    def start_many(
        self, requests: list[tuple[RankSpec, list[int]]], timeout: float = 120.0
    ) -> list[int]:
        """All requests go out before any answer is awaited, so the server forks them back to
        back."""
        self.wait_ready(timeout)
        tokens = []
        with self._send_lock:
            for spec, fds in requests:
                self._token += 1
                tokens.append(self._token)
                send(self._sock, Fork(self._token, spec), fds)

        def started() -> bool:
            return all(t in self._forked or t in self._unsafe for t in tokens)

        with self._cond:
            self._cond.wait_for(lambda: started() or self._closed, timeout)
            refused = [self._unsafe.pop(t) for t in tokens if t in self._unsafe]
            if refused:
                for t in tokens:  # the ranks it did fork: not ours to keep
                    if t in self._forked:
                        os.kill(self._forked.pop(t), 9)
                raise ForkUnsafe(refused[0])
            if not started():
                raise StartError(
                    "distlab's helper process exited while starting a rank"
                    if self._closed
                    else "distlab's helper process did not start a rank in time"
                )
            return [self._forked.pop(t) for t in tokens]

    def wait_exit(self, pid: int, timeout: float) -> int | None:
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exited or self._closed, timeout)
            if pid not in self._exited:
                return None
            return os.waitstatus_to_exitcode(self._exited.pop(pid))

    def close(self) -> None:
        try:
            self._sock.close()
        finally:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_lock = threading.Lock()
_server: ForkServer | None = None


def get() -> ForkServer:
    """The shared fork server, started on first use (or restarted if it died)."""
    global _server
    with _lock:
        if _server is None or not _server.alive:
            _server = ForkServer()
        return _server


@contextlib.contextmanager
def cores_for_the_kernel():
    """While the block runs, the fork server (if one is running) pauses its idle-time warm-up,
    between two of its steps: for processes the kernel starts itself (``mp.spawn``'s
    children, torchrun), which would otherwise share the cores with imports and page moves
    nobody is waiting for. Launches inside the block are served as usual."""
    with _lock:
        server = _server if _server is not None and _server.alive else None
    if server is None:
        yield
        return
    try:
        server.hold(True)
    except OSError:  # it went away: nothing to pause
        server = None
    try:
        yield
    finally:
        if server is not None:
            with contextlib.suppress(OSError):
                server.hold(False)


def warm() -> None:
    """Start the fork server now, so torch is imported by the time the first launch needs it."""
    if forkserver_supported():
        get()
