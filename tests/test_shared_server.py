"""Three learners on one shared server, as a workshop's JupyterHub runs them.

Three kernels, each running a course notebook with a 4-rank cluster, at the same time, as one
user with one temp folder and one DISTLAB_HOME (the hardest case: a hub that gives every learner
their own account separates more). Every cell must pass strict nbval in all three; nothing may
collide (ports, temp folders, the ranks' helper processes) and nothing may be left behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil

from distlab._patience import patience

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "notebooks/07_groups_barriers_objects.ipynb"  # a 4-rank Cluster, subgroups, barriers
# On torch 2.13 notebook 07 prints other group names by design (2.14 changed how local groups are
# named): there the same three learners run notebook 03, whose 4-rank launches print alike on
# every release the course is tried on.
OLDER_TORCH_NOTEBOOK = "notebooks/03_broadcast_scatter_gather.ipynb"


def _tagged(tag: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("DISTLAB_TEST_LEARNERS") == tag and p.status() != "zombie":
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def test_three_kernels_run_a_four_rank_notebook_at_once(tmp_path, pytestconfig):
    import distlab

    notebook = NOTEBOOK if distlab.torch_at_least("2.14") else OLDER_TORCH_NOTEBOOK
    # The sanitize file this run compares with (another torch's runs add a line to it).
    sanitize = Path(pytestconfig.getoption("nbval_sanitize_with")).resolve()
    tag = uuid.uuid4().hex
    shared_tmp = tmp_path / "tmp"
    shared_tmp.mkdir()
    env = dict(
        os.environ,
        TMPDIR=str(shared_tmp),
        DISTLAB_HOME=str(tmp_path / "home"),
        DISTLAB_TEST_LEARNERS=tag,  # every process of the three runs carries it
    )
    learners = []
    for _ in range(3):
        learners.append(subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "--no-header", "-p", "no:randomly",
             "--nbval-sanitize-with", str(sanitize), notebook],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        ))
        # Learners open the notebook a moment apart, as in a room: three Jupyter kernels
        # started in the same instant as one user once lost one before its first reply
        # ("Kernel died before replying to kernel_info", before any course code ran). The
        # notebooks themselves, their 4-rank clusters and helpers, still run at the same time.
        time.sleep(1.0)
    outputs = [p.communicate(timeout=patience(280))[0] for p in learners]
    for i, (p, out) in enumerate(zip(learners, outputs, strict=True)):
        assert p.returncode == 0, f"learner {i}:\n{out[:2000]}\n...\n{out[-3000:]}"
        assert " passed" in out and "failed" not in out, out[-2000:]
    deadline = time.monotonic() + 10
    while _tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _tagged(tag)
    for p in left:
        p.kill()
    assert not left, [" ".join(p.cmdline())[:120] for p in left]
    # distlab's own temp folders (ranks' rendezvous files, spawned ranks' scripts); ipykernel's
    # folders for cell files are its own business
    assert [n for n in os.listdir(shared_tmp) if n.startswith("distlab")] == []
