"""Every message that passes between the kernel, the fork server and the ranks, in one place.

Kernel <-> rank, over the rank's ``ctrl`` connection (`multiprocessing.connection.Connection`,
one pickled message per ``send_bytes``):

    kernel -> rank   Run(id, payload, lines)   run a task (payload: see `distlab._ranks.ship`)
                     RunFile(path)             the same, too large for the socket: read the file
                     Exit()                    destroy the process group and exit
    rank -> kernel   Started()                 once, when it is set up (process group joined,
                                               or failed to: the first Reply then says why)
                     Began(id)                 once it has loaded a task and runs its code
                     Reply(id, ok, value | error)   after every task

After each task the rank also writes `end_marker(token, id)` to its output pipe (fds 1 and 2), so
the kernel knows where that task's printed output ends. Over the ``dbg`` connection the kernel
sends `STACK` and the rank's watch thread answers with its main thread's stack (text), or
`PHASE` and it answers what the rank is doing while it starts ("importing torch", ...).

Kernel <-> fork server, over a ``SOCK_SEQPACKET`` Unix socket (`send` / `recv`; a rank's three
file descriptors travel with `Fork` as SCM_RIGHTS):

    kernel -> server   Fork(token, spec)       fork a rank
                       Canary()                under macOS's rules: fork a child that proves
                                               forking is safe (`forksafety.canary`)
    server -> kernel   Ready(pid)              torch imported: it takes requests
                       Settled()               its idle-time imports and huge pages are done
                       Failed(traceback)       it could not start
                       Forked(token, pid)      the rank of that `Fork` runs
                       Unsafe(token, reason)   under macOS's rules it did not fork, and why
                       CanaryDone(ok, detail)  the canary's verdict
                       Exited(pid, status)     a rank it forked has exited

Kernel -> a spare interpreter (the spawn path), over its ``SOCK_SEQPACKET`` Unix socket, once:

    kernel -> spare    Become(spec)            be this rank (its three fds travel with it)

`RankSpec` is what a new rank needs to know, whichever way it was started.
"""

from __future__ import annotations

import os
import pickle
import socket
from dataclasses import dataclass, field

# -- what a rank is started with -----------------------------------------------------------------


@dataclass(frozen=True)
class RankSpec:
    rank: int
    world_size: int
    backend: str | None  #: None: no process group (the learner initializes it)
    store_path: str  #: the FileStore the ranks meet in (a private temp directory)
    pg_timeout: float  #: seconds, the process group's timeout
    threads: int  #: torch threads (and OMP/MKL) for this rank
    token: str  #: this group's secret, part of every end marker
    start_timeout: float = 60.0  #: seconds the ranks may take to meet (init_process_group)
    env: dict[str, str] = field(default_factory=dict)  #: set in os.environ before anything runs
    cwd: str = "."


# -- kernel <-> rank -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    id: int
    payload: bytes
    lines: dict[str, list[str]]  #: notebook cells' source, for tracebacks (see ship.LineShipper)


@dataclass(frozen=True)
class RunFile:
    path: str


@dataclass(frozen=True)
class Exit:
    pass


@dataclass(frozen=True)
class Started:
    pass


@dataclass(frozen=True)
class Began:
    id: int


@dataclass(frozen=True)
class Failure:
    """What went wrong on a rank while running a task, as plain strings."""

    stage: str  #: raised | init | load | result (see `distlab.errors.RankFailure`)
    type: str
    module: str
    message: str
    traceback: str


@dataclass(frozen=True)
class Reply:
    id: int
    value: bytes | None = None  #: the return value, cloudpickled (None when it failed)
    failure: Failure | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None


STACK = b"stack"  #: kernel -> rank's watch thread: "where is your main thread?"
PHASE = b"phase"  #: kernel -> rank's watch thread: "what are you doing while you start?"

#: A task message bigger than this goes through a file (a socket write could otherwise block).
INLINE_LIMIT = 64 * 1024


def end_marker(token: str, task_id: int) -> bytes:
    """Written to a rank's output after task ``task_id``: everything before it is that task's."""
    return f"\x00distlab:{token}:{task_id}\x00".encode()


def encode(msg: object) -> bytes:
    return pickle.dumps(msg)


def decode(data: bytes):
    return pickle.loads(data)


def encode_task(msg: Run, spill_dir: str) -> bytes:
    """`msg` ready for ``send_bytes``; a large one is written to a file in ``spill_dir`` (the
    group's private temp directory) and a `RunFile` naming it goes instead."""
    data = encode(msg)
    if len(data) <= INLINE_LIMIT:
        return data
    path = os.path.join(spill_dir, f"task-{msg.id}.pkl")
    with open(path, "wb") as f:
        f.write(data)
    return encode(RunFile(path))


def decode_task(data: bytes) -> Run | Exit:
    msg = decode(data)
    if isinstance(msg, RunFile):
        with open(msg.path, "rb") as f:
            msg = pickle.load(f)
    return msg


# -- kernel <-> fork server ----------------------------------------------------------------------


@dataclass(frozen=True)
class Fork:
    token: int
    spec: RankSpec


@dataclass(frozen=True)
class Ready:
    pid: int


@dataclass(frozen=True)
class Settled:
    pass


@dataclass(frozen=True)
class Failed:
    traceback: str


@dataclass(frozen=True)
class Forked:
    token: int
    pid: int


@dataclass(frozen=True)
class Exited:
    pid: int
    status: int  #: as os.waitpid returns it


@dataclass(frozen=True)
class Unsafe:
    """The server did not fork for ``token``: under macOS's rules it was not safe (``reason``)."""

    token: int
    reason: str


@dataclass(frozen=True)
class Hold:
    """Kernel -> server: pause (``on``) or resume the idle-time warm-up. The kernel holds it
    while it runs processes of its own that want the cores (``mp.spawn``'s children, a
    torchrun), so that they do not share them with imports nobody is waiting for."""

    on: bool


@dataclass(frozen=True)
class Canary:
    """Kernel -> server: fork a child that proves forking is safe (`forksafety.canary`)."""


@dataclass(frozen=True)
class CanaryDone:
    ok: bool
    detail: str  #: what failed (exit status, Apple's message), or what passed


# -- kernel -> spare ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Become:
    """Kernel -> a spare interpreter: be rank ``spec.rank`` (its fds travel with the message)."""

    spec: RankSpec


_MAX_MSG = 1 << 20
_MAX_FDS = 8


def send(sock: socket.socket, msg: object, fds=()) -> None:
    """One message on a SOCK_SEQPACKET socket, with file descriptors if any."""
    data = encode(msg)
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.sendall(data)


def recv(sock: socket.socket):
    """``(message, fds)``; raises EOFError when the other end has closed."""
    data, fds, _flags, _addr = socket.recv_fds(sock, _MAX_MSG, _MAX_FDS)
    if not data:
        for fd in fds:
            os.close(fd)
        raise EOFError
    return decode(data), fds
