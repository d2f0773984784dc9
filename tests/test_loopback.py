"""distlab/_ranks/loopback.py: the port rank 0's store gets (MASTER_PORT) is outside the system's
ephemeral range and held, against every other distlab process, until the ranks are gone."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch.distributed as dist

import distlab
from distlab._ranks import loopback


def _master_port():
    return int(os.environ["MASTER_PORT"])


def _store_port():
    """rank 0's env:// store: the port it really listens on."""
    dist.init_process_group("gloo", init_method="env://")
    store = dist.distributed_c10d._get_default_store()
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    port = store.port
    dist.destroy_process_group()
    return port


def test_the_port_lies_outside_the_ephemeral_range_and_is_free():
    first, last = loopback.ephemeral_range()
    ports = []
    for _ in range(20):
        held = loopback.reserve_port()
        ports.append(held.port)
        assert loopback.LOWEST <= held.port < 65536 and not first <= held.port <= last
        with socket.socket() as s:  # free to listen on, as rank 0's store will
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", held.port))
        held.release()
    assert len(set(ports)) > 15  # drawn at random, not one port for everyone


def test_a_held_port_is_never_handed_out_twice(monkeypatch):
    held = loopback.reserve_port()
    monkeypatch.setattr(loopback._random, "randrange", lambda low, high: held.port)
    # Another process (a second kernel, another test worker) asks while it is held: refused.
    code = ("from distlab._ranks import loopback\n"
            f"loopback._random.randrange = lambda a, b: {held.port}\n"
            "try:\n    loopback.reserve_port()\nexcept OSError as e:\n    print('refused:', e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("refused:") and "no free port" in out.stdout, out
    with pytest.raises(OSError, match="close clusters you no longer use"):
        loopback.reserve_port()  # in this process too
    held.release()
    held.release()  # idempotent
    again = loopback.reserve_port()  # released: it can be had again
    assert again.port == held.port
    again.release()


def test_a_port_something_else_listens_on_is_skipped(monkeypatch):
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        taken = other.getsockname()[1]
        candidates = iter([taken, taken, 23456])
        monkeypatch.setattr(loopback._random, "randrange", lambda low, high: next(candidates))
        held = loopback.reserve_port()
        assert held.port == 23456
        held.release()


def test_the_ranks_store_listens_on_the_reserved_port_held_until_they_are_gone(monkeypatch):
    [port, same] = distlab.launch(_master_port, world_size=2, backend=None)
    first, last = loopback.ephemeral_range()
    assert port == same and not first <= port <= last
    assert distlab.launch(_store_port, world_size=2, backend=None) != [port, port]  # a new one

    with distlab.Cluster(2, backend=None) as cluster:
        [port, _] = cluster.run(_master_port, _record=False)
        assert cluster.run(_store_port, _record=False) == [port, port]
        monkeypatch.setattr(loopback._random, "randrange", lambda low, high: port)
        with pytest.raises(OSError):  # held while the cluster lives
            loopback.reserve_port()
    loopback.reserve_port().release()  # and free once it is closed
