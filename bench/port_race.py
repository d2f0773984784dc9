"""Several kernels launching at once, each rendezvousing through env:// (rank 0's TCPStore on
MASTER_PORT), as two test workers or two learners' kernels on one machine do: how many launches
fail. Before distlab reserved MASTER_PORT, it was an ephemeral port chosen by bind(0) and closed,
which any other bind(0) (gloo's listeners) could take before rank 0 listened on it.

    python bench/port_race.py --jobs 3 --launches 40
    python bench/port_race.py --old      # the same, with the old bind(0)-and-close port

Prints one row per way of choosing the port: launches, failures, the first failure's last line.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time


def _rendezvous():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://")
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return int(t[0])


def _old_reserve():
    from distlab._ranks import loopback

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return loopback.Port(s.getsockname()[1], None)


def _job(old: bool, launches: int, world_size: int) -> None:
    """One kernel's launches (run as this script with --job, so _rendezvous lives in __main__
    as a cell's function does); prints its failures and the first one's last line."""
    import distlab
    from distlab._ranks import loopback

    if old:
        loopback.reserve_port = _old_reserve
    failures, first = 0, ""
    for _ in range(launches):
        try:
            assert distlab.launch(_rendezvous, world_size=world_size, backend=None,
                                  timeout=60) == [world_size] * world_size
        except Exception as e:  # noqa: BLE001 - counted and shown
            failures += 1
            first = first or str(e).strip().splitlines()[-1][:150]
    print(json.dumps([failures, first]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=3, help="kernels launching at once")
    ap.add_argument("--launches", type=int, default=40, help="launches per kernel")
    ap.add_argument("--world-size", type=int, default=4)
    ap.add_argument("--old", action="store_true", help="only the old bind(0)-and-close port")
    ap.add_argument("--new", action="store_true", help="only distlab's reserved port")
    ap.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.job:
        return _job(a.old, a.launches, a.world_size)
    ways = [w for w, on in (("bind(0), closed (old)", not a.new), ("reserved (distlab)", not a.old))
            if on]
    print(f"{a.jobs} kernels x {a.launches} launches of {a.world_size} ranks, env:// rendezvous")
    print(f"{'MASTER_PORT':<24}{'launches':>9}{'failed':>8}{'seconds':>9}  first failure")
    for way in ways:
        t0 = time.monotonic()
        cmd = [sys.executable, __file__, "--job", "--launches", str(a.launches),
               "--world-size", str(a.world_size)] + (["--old"] if way.endswith("(old)") else [])
        jobs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                for _ in range(a.jobs)]
        results = [json.loads(j.communicate()[0].strip().splitlines()[-1]) for j in jobs]
        failed = sum(f for f, _ in results)
        first = next((m for _, m in results if m), "")
        print(f"{way:<24}{a.jobs * a.launches:>9}{failed:>8}{time.monotonic() - t0:>9.0f}  {first}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
