"""Launch latency on the spawn path (what a Mac runs), against the fork server, in one run.

For each start path, a learner-like sequence at world size 4: a launch, then an idle pause (the
learner reads), then a timed launch -> all_reduce -> results back. Paths:

* forkserver            -- Linux's default: ranks forked from a warm helper.
* spawn, spares         -- a fresh interpreter per rank, taken from the pool of spares that
                           imported torch during the pause (distlab's spawn path).
* spawn, no spares      -- a fresh interpreter per rank that imports torch when asked (the
                           spawn path before the pool; the pool's size set to 0).

Run:  .venv/bin/python bench/spawn_latency.py [--pauses 1 3] [--repeat 3]
Prints the median of ``--repeat`` timed launches per pause, and the ratio to the fork server.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import distlab  # noqa: E402
from distlab._ranks import forkserver, spawn  # noqa: E402


def _work():
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def _timed(method: str, world_size: int, pause: float, repeat: int) -> float:
    times = []
    distlab.launch(_work, world_size=world_size, start_method=method)  # the pool at this size
    for _ in range(repeat):
        time.sleep(pause)
        t0 = time.perf_counter()
        out = distlab.launch(_work, world_size=world_size, start_method=method)
        times.append(time.perf_counter() - t0)
        assert out == [float(world_size)] * world_size
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world-size", type=int, default=4)
    ap.add_argument("--pauses", type=float, nargs="+", default=[1.0, 3.0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    forkserver.get().wait_settled()
    rows = []
    for pause in args.pauses:
        fork = _timed("forkserver", args.world_size, pause, args.repeat)
        spares = _timed("spawn", args.world_size, pause, args.repeat)
        spawn.get().close()
        keep = spawn.MAX_SPARES, spawn.FIRST_SPARES
        spawn.MAX_SPARES = spawn.FIRST_SPARES = 0
        spawn.get()._want = 0
        try:
            bare = _timed("spawn", args.world_size, pause, args.repeat)
        finally:
            spawn.MAX_SPARES, spawn.FIRST_SPARES = keep
            spawn.get()._want = spawn.FIRST_SPARES
        rows.append((pause, fork, spares, bare))
    print(f"launch -> all_reduce -> results at {args.world_size} ranks, after an idle pause "
          f"(median of {args.repeat}), {os.cpu_count()} cores")
    print(f"{'pause':>6} {'forkserver':>11} {'spawn+spares':>13} {'spawn bare':>11} "
          f"{'spares/fork':>12} {'bare/fork':>10}")
    for pause, fork, spares, bare in rows:
        print(f"{pause:>5.1f}s {fork:>10.3f}s {spares:>12.3f}s {bare:>10.3f}s "
              f"{spares / fork:>11.1f}x {bare / fork:>9.1f}x")


if __name__ == "__main__":
    main()
