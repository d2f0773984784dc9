"""Where the ranks' sockets go: loopback only, so that a learner on conference wifi never exposes
an unauthenticated store or collective to the room.

And which port rank 0's store gets (``MASTER_PORT``, for ``env://``, ``tcp://`` and RPC): one
that nothing else can take between the kernel choosing it and rank 0 listening on it, even with
several kernels (or test workers) launching at once. The usual trick, binding port 0 and closing
the socket, hands out an *ephemeral* port: the pool the system also draws from for every other
``bind(0)`` (gloo's own listeners) and outgoing connection, so in the second or two before rank 0
listens another job's ranks can take it, and two jobs can end up meeting in one store (seen as
gloo's "connectFullMesh failed ... Connection closed by peer"). Here the port comes from outside
the ephemeral range, at random, and a lock file held until the ranks are gone keeps every other
distlab process off it. Knows nothing of ranks or process groups.
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import socket
import sys

#: Where the port locks live: one fixed folder for every user and every test worker (TMPDIR may
#: differ between them), sticky like /tmp so nobody removes another's lock.
LOCK_DIR = os.path.join("/tmp" if os.path.isdir("/tmp") else os.path.sep, "distlab-ports")
#: Ports below this are left alone (well-known and registered services crowd them).
LOWEST = 20000
_TRIES = 200
#: Never the learner's `random`: seeded alike in two kernels, it would draw them the same ports.
_random = random.Random(os.urandom(16))


def env(port: int) -> dict[str, str]:
    """The environment that keeps every socket of a rank's process group on loopback: the
    rendezvous address (as under torchrun) on ``port`` and the interface gloo, TensorPipe (RPC) and
    NCCL use."""
    iface = interface()
    return {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "GLOO_SOCKET_IFNAME": iface,
        "TP_SOCKET_IFNAME": iface,
        "NCCL_SOCKET_IFNAME": iface,
    }


class Port:
    """A loopback port held for one group of ranks: ``.port``; ``release()`` when they are gone."""

    def __init__(self, port: int, lock_fd: int | None):
        self.port = port
        self._lock_fd = lock_fd

    def release(self) -> None:
        """Let other distlab processes have the port again (idempotent)."""
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor drops the flock

    def __del__(self):
        self.release()


def reserve_port() -> Port:
    """A port on 127.0.0.1 outside the ephemeral range, free to listen on now and locked against
    every other distlab process until ``release()``.

    Raises:
        OSError: no such port after many tries (every candidate in use or locked): close other
            clusters (``cluster.close()``) or restart idle kernels.
    """
    low, high = candidate_range()
    for _ in range(_TRIES):
        port = _random.randrange(low, high)
        fd = _lock(port)
        if fd is False:  # another distlab process holds it
            continue
        if _bindable(port):
            return Port(port, fd)
        if fd is not None:
            os.close(fd)
    raise OSError(
        errno.EADDRINUSE,
        f"distlab found no free port for the ranks' store in {low}-{high - 1} after {_TRIES} "
        "tries: close clusters you no longer use (cluster.close()) or restart idle kernels",
    )


def candidate_range() -> tuple[int, int]:
    """``[low, high)``: the ports below the system's ephemeral range (Linux and WSL2: read from
    /proc; macOS and BSD: IANA's dynamic range 49152-65535), from ``LOWEST`` up."""
    first, last = ephemeral_range()
    if first - LOWEST >= 4096:
        return LOWEST, first
    return last + 1, 65536  # an unusual system whose ephemeral range starts low: the ports above it


def ephemeral_range() -> tuple[int, int]:
    """The ports the system hands out for ``bind(0)`` and outgoing connections."""
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
                first, last = (int(x) for x in f.read().split())
            return first, last
        except (OSError, ValueError):
            pass
    return 49152, 65535


def _lock(port: int) -> int | None | bool:
    """The descriptor holding ``port``'s lock; ``False`` when another process holds it; ``None``
    when locks cannot be kept here (then the bind check alone guards the port)."""
    try:
        os.makedirs(LOCK_DIR, exist_ok=True)
        if os.stat(LOCK_DIR).st_uid == os.getuid():
            os.chmod(LOCK_DIR, 0o1777)  # shared by every user of the machine, like /tmp
        fd = os.open(os.path.join(LOCK_DIR, f"{port}.lock"), os.O_RDONLY | os.O_CREAT, 0o644)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    return fd


def _bindable(port: int) -> bool:
    """Whether a listener could bind ``port`` on loopback now (as the store does: SO_REUSEADDR,
    so a port whose last connections linger in TIME_WAIT still counts as free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def interface() -> str:
    """The loopback interface's name (``lo`` on Linux, ``lo0`` on macOS)."""
    try:
        for _, name in socket.if_nameindex():
            if name.startswith("lo"):
                return name
    except OSError:
        pass
    return "lo"
