"""Where the ranks' sockets go: loopback only, so that a learner on conference wifi never exposes
an unauthenticated store or collective to the room."""

from __future__ import annotations

import socket


def env() -> dict[str, str]:
    """The environment that keeps every socket of a rank's process group on loopback: the
    rendezvous address (as under torchrun) and the interface gloo, TensorPipe (RPC) and NCCL use."""
    iface = interface()
    return {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "GLOO_SOCKET_IFNAME": iface,
        "TP_SOCKET_IFNAME": iface,
        "NCCL_SOCKET_IFNAME": iface,
    }


def free_port() -> int:
    """An unused TCP port on loopback (for MASTER_PORT; distlab itself never listens on it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def interface() -> str:
    """The loopback interface's name (``lo`` on Linux, ``lo0`` on macOS)."""
    try:
        for _, name in socket.if_nameindex():
            if name.startswith("lo"):
                return name
    except OSError:
        pass
    return "lo"
