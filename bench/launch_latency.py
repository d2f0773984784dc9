"""Launch latency: start N ranks -> first all_reduce -> results back in the caller.

Compares, in one run, for world sizes 2, 4, 8:

* distlab cold  -- the first launch in a fresh Python process that has just run
                   ``import distlab, torch`` (what a notebook's first cell does); the fork
                   server warms up in the background during ``import torch``.
* distlab cold+import -- the same fresh process, timed from before ``import distlab, torch``.
* distlab warm  -- later launches in the same process, once the fork server has finished its
                   idle-time warm-up (late imports, huge pages: a few seconds after the first
                   launch, as between a learner's cells). ``--no-settle`` measures straight
                   away instead.
* mp fork / mp spawn -- ``torch.multiprocessing.start_processes`` of a function defined in this
                   script (a script, not a notebook: spawn cannot run notebook functions at all),
                   with the same FileStore rendezvous, all_reduce and a queue for the results.

Usage:  python bench/launch_latency.py [--sizes 2 4 8] [--warm 30] [--cold 3] [--no-settle]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import distlab  # noqa: E402
from distlab._ranks import forkserver  # noqa: E402


def work():
    t = torch.ones(4) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return t.sum().item()


def _mp_worker(rank, world_size, path, queue):
    torch.set_num_threads(1)
    store = dist.FileStore(path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    queue.put((rank, work()))
    dist.destroy_process_group()


def mp_launch(world_size: int, method: str) -> list:
    ctx = mp.get_context(method)
    queue = ctx.SimpleQueue()
    # Spawned workers import this script, hence distlab: keep them from starting fork servers of
    # their own, which would import torch in the background and slow down whatever is measured next.
    os.environ["DISTLAB_NO_WARM"] = "1"
    with tempfile.TemporaryDirectory() as d:
        try:
            procs = mp.start_processes(
                _mp_worker,
                args=(world_size, os.path.join(d, "store"), queue),
                nprocs=world_size,
                start_method=method,
                join=False,
            )
        finally:
            del os.environ["DISTLAB_NO_WARM"]
        results = dict(queue.get() for _ in range(world_size))
        procs.join()
    return [results[r] for r in range(world_size)]


_COLD = """
import time, sys
t0 = time.perf_counter()
sys.path.insert(0, {root!r})
import distlab, torch  # distlab first: its helper imports torch while we do
import torch.distributed as dist
def work():
    t = torch.ones(4) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return t.sum().item()
t1 = time.perf_counter()
distlab.launch(work, world_size={n})
t2 = time.perf_counter()
print(t2 - t1, t2 - t0)
"""


def cold(world_size: int) -> tuple[float, float]:
    out = subprocess.run(
        [sys.executable, "-c", _COLD.format(root=ROOT, n=world_size)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return float(out[-2]), float(out[-1])


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--warm", type=int, default=30)
    ap.add_argument("--cold", type=int, default=3)
    ap.add_argument("--spawn", type=int, default=2)
    ap.add_argument(
        "--no-settle", action="store_true", help="do not wait for the fork server's warm-up"
    )
    args = ap.parse_args()

    print(f"torch {torch.__version__}, {os.cpu_count()} cores, medians in seconds")
    header = ("ranks", "distlab warm", "distlab cold", "cold+import", "mp fork", "mp spawn")
    rows = []
    for n in args.sizes:
        expected = [sum(range(1, n + 1)) * 4.0] * n
        assert distlab.launch(work, world_size=n) == expected
        assert mp_launch(n, "fork") == expected
        if not args.no_settle:
            assert forkserver.get().wait_settled(), "the fork server did not finish warming up"
        warm = timed(lambda n=n: distlab.launch(work, world_size=n), args.warm)
        colds = [cold(n) for _ in range(args.cold)]
        fork = timed(lambda n=n: mp_launch(n, "fork"), args.warm)
        spawn = timed(lambda n=n: mp_launch(n, "spawn"), args.spawn)
        c = statistics.median(x[0] for x in colds)
        ci = statistics.median(x[1] for x in colds)
        rows.append((n, warm, c, ci, fork, spawn))

    widths = [max(len(h), 12) for h in header]
    print("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    for row in rows:
        cells = [str(row[0])] + [f"{v:.3f}" for v in row[1:]]
        print("  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)))
    print()
    print("ratios (baseline / distlab warm):")
    for n, warm, _c, _ci, fork, spawn in rows:
        print(f"  {n} ranks: mp fork {fork / warm:.2f}x, mp spawn {spawn / warm:.1f}x")


if __name__ == "__main__":
    main()
