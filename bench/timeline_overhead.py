"""What recording a timeline costs: DDP training steps with and without `distlab.timeline`.

The same ranks run the same steps three ways, in one run:

    * plain     -- the steps alone
    * profiled  -- the steps inside `distlab.timeline.recording()` (torch.profiler underneath),
                   the trace exported on the rank, as a notebook cell does
    * collected -- as profiled, plus the kernel collecting every rank's trace (`timeline.collect`)

A lesson promises that a profiled cell answers in about the time of the plain one (issue 16's
budget: no profiled cell over ~2 s on 2 cores). Each row is the median over --repeat cells.

Usage:  python bench/timeline_overhead.py [--ranks 2 4] [--steps 5] [--repeat 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import distlab  # noqa: E402
from distlab import timeline  # noqa: E402
from distlab._ranks import forkserver  # noqa: E402


def setup(width: int = 256, depth: int = 4):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = DDP(torch.nn.Sequential(*layers), bucket_cap_mb=0.25)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, width, generator=torch.Generator().manual_seed(dist.get_rank()))
    # The rank's __main__ keeps them between calls (each call's function arrives with globals
    # of its own), as a %%ranks cell's variables stay.
    vars(sys.modules["__main__"]).update(model=model, opt=opt, x=x)


def steps(n: int, profiled: bool) -> float:
    import contextlib

    from distlab import timeline as tl

    ns = vars(sys.modules["__main__"])  # set by setup() on this rank
    model, opt, x = ns["model"], ns["opt"], ns["x"]
    t0 = time.perf_counter()
    with tl.recording() if profiled else contextlib.nullcontext():
        for _ in range(n):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    forkserver.get().wait_settled()

    print(f"{args.steps} DDP steps per cell (4 x Linear(256, 256)); median of {args.repeat} cells")
    print(f"{'ranks':>6} {'plain':>10} {'profiled':>10} {'collected':>10} {'ratio':>7}")
    for ranks in args.ranks:
        with distlab.Cluster(world_size=ranks) as cluster:
            cluster.run(setup)
            cluster.run(steps, 1, False)  # warm-up: DDP's first backward builds its buckets
            rows = {"plain": [], "profiled": [], "collected": []}
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                cluster.run(steps, args.steps, False)
                rows["plain"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                cluster.run(steps, args.steps, True)
                rows["profiled"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                cluster.run(steps, args.steps, True)
                timeline.collect(cluster)
                rows["collected"].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in rows.items()}
        print(
            f"{ranks:>6} {med['plain'] * 1e3:>8.1f}ms {med['profiled'] * 1e3:>8.1f}ms "
            f"{med['collected'] * 1e3:>8.1f}ms {med['collected'] / med['plain']:>6.2f}x"
        )


if __name__ == "__main__":
    main()
