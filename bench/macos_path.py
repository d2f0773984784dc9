"""The macOS start path, on its Linux stand-in, against Linux's and the spawn path, in one run.

Each path runs in a process of its own (the rules are chosen when distlab starts its helper):

* Linux forkserver  -- ranks forked from a warm helper (Linux's default).
* macOS rules       -- the same helper under macOS's rules (``DISTLAB_AS_MACOS=1``): started by
                       exec with single-threaded BLAS, checked single-threaded before each fork,
                       proven by a canary at start (what a Mac runs now).
* spawn             -- a fresh interpreter per rank from a pool of spares (the fallback).

For each: the first 4-rank launch after ``import distlab`` (the helper's start and, under macOS's
rules, its canary included), then launches one second after the previous one (a learner running
cells), each launch -> all_reduce -> results back. Prints medians and the ratio to Linux.

    .venv/bin/python bench/macos_path.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

MEASURE = r"""
import json, statistics, sys, time
t0 = time.perf_counter()
import distlab, torch, torch.distributed as dist

def work():
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()

first = distlab.launch(work, world_size=4)
first_s = time.perf_counter() - t0
times = []
for _ in range(int(sys.argv[1])):
    time.sleep(1.0)
    t1 = time.perf_counter()
    assert distlab.launch(work, world_size=4) == [4.0] * 4
    times.append(time.perf_counter() - t1)
print(json.dumps({"first": first_s, "median": statistics.median(times), "max": max(times)}))
"""

PATHS = {
    "Linux forkserver": {},
    "macOS rules": {"DISTLAB_AS_MACOS": "1"},
    "spawn": {"DISTLAB_START_METHOD": "spawn"},
}


def measure(extra: dict, repeat: int) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DISTLAB_AS_MACOS", "DISTLAB_START_METHOD")}
    env.update(extra)
    out = subprocess.run([sys.executable, "-c", MEASURE, str(repeat)], env=env,
                         capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    rows = {name: measure(extra, args.repeat) for name, extra in PATHS.items()}
    base = rows["Linux forkserver"]["median"]
    print(f"{'path':18} {'first launch':>13} {'1 s later (median)':>19} {'max':>8} {'x Linux':>8}")
    for name, r in rows.items():
        print(f"{name:18} {r['first']:>11.2f} s {r['median']:>17.3f} s {r['max']:>6.3f} s "
              f"{r['median'] / base:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
