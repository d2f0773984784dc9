"""Peak memory of running one notebook, everything included: the kernel, the ranks, the fork
server or the spare interpreters. Sampled every 0.2 s as the sum of the process tree's PSS
(proportional set size: shared pages split between the processes that share them, so that the
sum is what the machine really holds).

    .venv/bin/python bench/notebook_memory.py notebooks/10_data_parallel_and_ddp.ipynb
    DISTLAB_START_METHOD=spawn .venv/bin/python bench/notebook_memory.py notebooks/13_*.ipynb

Prints one line per notebook: its peak in MiB and when it was reached. The notebook is executed
into a temporary copy (the stored one is left alone).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

import psutil


def _tree_pss(root: psutil.Process) -> int:
    total = 0
    for p in [root, *root.children(recursive=True)]:
        try:
            total += p.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def peak(path: str) -> tuple[int, float]:
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, os.path.basename(path))
        shutil.copy(path, copy)
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
             "--inplace", "--ExecutePreprocessor.timeout=600", copy],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        root = psutil.Process(proc.pid)
        start, best, when = time.monotonic(), 0, 0.0
        while proc.poll() is None:
            now = _tree_pss(root)
            if now > best:
                best, when = now, time.monotonic() - start
            time.sleep(0.2)
        if proc.returncode:
            raise SystemExit(f"{path} failed to run")
        return best, when


def main() -> None:
    method = os.environ.get("DISTLAB_START_METHOD", "forkserver")
    for path in sys.argv[1:]:
        best, when = peak(path)
        print(f"{os.path.basename(path):50} {method:10} peak {best / 2**20:7.0f} MiB "
              f"at {when:5.1f} s", flush=True)


if __name__ == "__main__":
    main()
