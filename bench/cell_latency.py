"""Round trip of a trivial cell on live ranks (%%ranks) versus a fresh distlab.launch, in one run.

    * %%ranks       -- the magic, through IPython's run_cell_magic, on a warm Cluster
    * cluster.exec  -- the same without IPython's magic machinery
    * cluster.run   -- a trivial function on the live ranks
    * launch        -- distlab.launch of the same trivial function (new processes every time)
    * pipe          -- a bare round trip over one socketpair to a helper process: the floor

Usage:  python bench/cell_latency.py [--ranks 4] [--repeat 300]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import distlab  # noqa: E402
from distlab._ranks import forkserver  # noqa: E402


def trivial():
    return 1


def measure(fn, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def pipe_round_trip(repeat: int) -> list[float]:
    a, b = socket.socketpair()
    pid = os.fork()  # this process has no threads yet, so a plain fork is safe here
    if pid == 0:
        a.close()
        while data := b.recv(64):
            b.sendall(data)
        os._exit(0)
    b.close()
    times = measure(lambda: (a.sendall(b"x"), a.recv(64)), repeat)
    a.close()
    os.waitpid(pid, 0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=300)
    args = ap.parse_args()
    n, rep = args.ranks, args.repeat

    rows = {"pipe (floor)": pipe_round_trip(rep)}
    # The helper imports DDP's modules and moves onto huge pages while idle, for a few seconds of
    # CPU; measuring during that would measure the competition for the two cores.
    assert forkserver.get().wait_settled(), "distlab's helper did not finish warming up"
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "distlab")
    with distlab.Cluster(world_size=n) as cluster:
        for _ in range(20):  # warm-up
            ip.run_cell_magic("ranks", "", "x = 1")
        rows["%%ranks cell"] = measure(lambda: ip.run_cell_magic("ranks", "", "x = 1"), rep)
        rows["cluster.exec"] = measure(lambda: cluster.exec("x = 1"), rep)
        rows["cluster.run"] = measure(lambda: cluster.run(trivial), rep)
    distlab.launch(trivial, world_size=n)
    fresh = max(10, rep // 20)
    rows["distlab.launch"] = measure(lambda: distlab.launch(trivial, world_size=n), fresh)

    base = statistics.median(rows["%%ranks cell"])
    print(f"{n} ranks, {os.cpu_count()} cores; times in ms")
    print(f"{'':16}{'median':>9}{'p10':>9}{'p90':>9}{'vs %%ranks':>11}")
    for name, ts in rows.items():
        ts = sorted(ts)
        med = statistics.median(ts)
        p10, p90 = ts[len(ts) // 10], ts[(len(ts) * 9) // 10]
        print(f"{name:16}{med * 1e3:9.3f}{p10 * 1e3:9.3f}{p90 * 1e3:9.3f}{med / base:10.1f}x")


if __name__ == "__main__":
    main()
