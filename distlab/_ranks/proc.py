"""One rank process as the kernel sees it: its pid, its three channels, the output it has printed
that no task has claimed yet, and its state. `distlab._ranks.group.RankGroup` holds one per rank.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

from .. import _output
from .._patience import patience

#: How long a rank busy in C code gets to print faulthandler's view of its stack (on a quiet
#: machine; stretched by `distlab._patience.patience` on a busy one).
_FAULTHANDLER_WAIT = 0.5
#: How long a rank's end-of-task marker may trail its reply (likewise stretched).
_MARK_WAIT = 5.0


@dataclass
class RankProcess:
    rank: int
    pid: int
    ctrl: Connection
    dbg: Connection
    out_fd: int | None
    buf: bytearray = field(default_factory=bytearray)  # output not yet assigned to a task
    streamed: int = 0  # bytes of `buf` already shown live (stream mode)
    state: str = "idle"  # idle | busy | stuck | dead
    exitcode: int | None = None
    last_seconds: float | None = None
    stale: int | None = None  # id of the task a stuck rank is still running
    started_at: float | None = None  # when it said it had started (joined the process group)

    @property
    def alive(self) -> bool:
        return self.state != "dead"

    # -- output ------------------------------------------------------------------------------

    def read(self, stream: bool) -> None:
        """Take what the rank has printed since the last read (non-blocking); with ``stream``,
        show its complete lines now."""
        if self.out_fd is None:
            return  # closed while this fd was waiting in a ready-list
        try:
            data = os.read(self.out_fd, 65536)
        except BlockingIOError:
            return  # already drained (reported ready before another read emptied it)
        except OSError:
            data = b""
        if not data:
            os.close(self.out_fd)
            self.out_fd = None
            return
        self.buf += data
        if stream:
            end = self.buf.rfind(b"\n") + 1
            if end > self.streamed:
                text = _output.decode(bytes(self.buf[self.streamed : end]))
                _output.emit(_output.prefix(self.rank, text))
                self.streamed = end

    def drain(self) -> None:
        """Read everything until the rank's output closes (after it has died)."""
        while self.out_fd is not None:
            self.read(stream=False)

    def split_output(self, mark: bytes, stream: bool) -> bytes:
        """Split off one task's output: everything up to the rank's end marker ``mark`` for it
        (waiting up to `_MARK_WAIT` s, stretched on a busy machine, for the marker to arrive after
        the reply)."""
        deadline = time.monotonic() + patience(_MARK_WAIT)
        while mark not in self.buf and self.out_fd is not None and time.monotonic() < deadline:
            if wait([self.out_fd], timeout=0.5):
                self.read(stream=False)
        idx = self.buf.find(mark)
        if idx < 0:
            idx = len(self.buf)
            rest = bytearray()
        else:
            rest = self.buf[idx + len(mark) :]
        out = bytes(self.buf[:idx])
        if stream and self.streamed < len(out):
            _output.emit(_output.prefix(self.rank, _output.decode(out[self.streamed :])))
        self.buf = rest
        self.streamed = 0
        return out

    def faulthandler_stack(self) -> str:
        """The main thread's stack as faulthandler prints it (SIGUSR1): for a rank whose watch
        thread cannot answer because the main thread holds the GIL inside C code."""
        before = len(self.buf)
        self.signal(signal.SIGUSR1)
        deadline = time.monotonic() + patience(_FAULTHANDLER_WAIT)
        while time.monotonic() < deadline and self.out_fd is not None:
            if wait([self.out_fd], timeout=0.1):
                self.read(stream=False)
        dump = _output.decode(bytes(self.buf[before:]))
        del self.buf[before:]
        return (
            "(the rank is busy inside C/C++ code holding the interpreter lock; this is "
            "faulthandler's view, innermost call first)\n" + dump
        )

    # -- signals and clean-up ----------------------------------------------------------------

    def signal(self, sig: int) -> None:
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def kill_tree(self) -> None:
        """SIGKILL the rank and everything it started (it leads its own process group)."""
        for kill in (os.killpg, os.kill):
            try:
                kill(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def close_channels(self) -> None:
        for conn in (self.ctrl, self.dbg):
            conn.close()
        if self.out_fd is not None:
            os.close(self.out_fd)
            self.out_fd = None
