"""distlab._config: the facts of this machine that defaults depend on, here the CPU cores a
shared server really gives (a cgroup quota, as JupyterHub and Kubernetes set it)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from distlab import _config
from distlab._config import cgroup_cpu_limit
from distlab._patience import patience

ROOT = Path(__file__).resolve().parents[1]


def _tree(tmp_path, cgroup_lines, mount_lines, files):
    """A fake /proc/self/cgroup, /proc/self/mountinfo and cgroup files under tmp_path."""
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    cg, mi = tmp_path / "cgroup", tmp_path / "mountinfo"
    cg.write_text("".join(line + "\n" for line in cgroup_lines))
    mi.write_text("".join(line.format(root=tmp_path) + "\n" for line in mount_lines))
    return str(cg), str(mi)


V2_MOUNT = "41 31 0:38 / {root}/sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw"
V1_MOUNT = "32 31 0:29 / {root}/cpu rw,relatime - cgroup cgroup rw,cpu,cpuacct"


@pytest.mark.quick
def test_v2_quota_is_the_smallest_along_the_path_to_the_root(tmp_path):
    files = {
        "sys/fs/cgroup/cpu.max": "max 100000\n",
        "sys/fs/cgroup/hub/cpu.max": "400000 100000\n",  # the hub gives all users 4 CPUs
        "sys/fs/cgroup/hub/user-ada/cpu.max": "150000 100000\n",  # each learner 1.5
        "sys/fs/cgroup/hub/user-ada/kernel/cpu.max": "max 100000\n",
    }
    args = _tree(tmp_path, ["0::/hub/user-ada/kernel"], [V2_MOUNT], files)
    assert cgroup_cpu_limit(*args) == 1.5


@pytest.mark.quick
def test_v1_quota_over_period_and_no_quota_is_none(tmp_path):
    files = {"cpu/pod/cpu.cfs_quota_us": "50000\n", "cpu/pod/cpu.cfs_period_us": "100000\n",
             "cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}
    lines = ["4:memory:/pod", "2:cpu,cpuacct:/pod", "0::/"]
    assert cgroup_cpu_limit(*_tree(tmp_path, lines, [V1_MOUNT], files)) == 0.5
    files["cpu/pod/cpu.cfs_quota_us"] = "-1\n"
    assert cgroup_cpu_limit(*_tree(tmp_path, lines, [V1_MOUNT], files)) is None


@pytest.mark.quick
def test_no_cgroups_or_unreadable_files_mean_no_quota(tmp_path):
    assert cgroup_cpu_limit(str(tmp_path / "absent"), str(tmp_path / "absent")) is None
    files = {"sys/fs/cgroup/cpu.max": "garbage\n"}
    assert cgroup_cpu_limit(*_tree(tmp_path, ["0::/"], [V2_MOUNT], files)) is None
    # a mount of another part of the hierarchy says nothing about this process's cgroup
    other = "41 31 0:38 /elsewhere {root}/sys/fs/cgroup rw - cgroup2 cgroup2 rw"
    files = {"sys/fs/cgroup/cpu.max": "100000 100000\n"}
    assert cgroup_cpu_limit(*_tree(tmp_path, ["0::/mine"], [other], files)) is None


def _quota_cgroup(cpus: float) -> Path:
    """A real cgroup with a CPU quota (v1 cpu controller or v2 with cpu enabled), or skip."""
    name = f"distlab-test-{uuid.uuid4().hex[:8]}"
    for base, write in (
        (Path("/sys/fs/cgroup/cpu"), {"cpu.cfs_period_us": "100000",
                                      "cpu.cfs_quota_us": str(int(cpus * 100000))}),
        (Path("/sys/fs/cgroup"), {"cpu.max": f"{int(cpus * 100000)} 100000"}),
    ):
        if not base.is_dir() or ("cpu.max" in write and not (base / "cgroup.procs").exists()):
            continue
        folder = base / name
        try:
            folder.mkdir()
            for file, value in write.items():
                (folder / file).write_text(value)
            return folder
        except OSError:
            if folder.exists():
                folder.rmdir()
    pytest.skip("cannot create a cgroup with a CPU quota here (root and a writable cgroup fs)")


def test_threads_and_doctor_follow_a_real_cgroup_quota():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores to show that a quota of 1 CPU lowers them")
    folder = _quota_cgroup(1.0)
    script = textwrap.dedent(
        """
        import distlab, torch
        from distlab import doctor
        from distlab._config import cpu_cores
        print(cpu_cores(), distlab.launch(lambda: torch.get_num_threads(), world_size=1))
        print(doctor.check_cores().text)
        """
    )
    try:
        out = subprocess.run(
            ["sh", "-c", f'echo $$ > "{folder}/cgroup.procs" && exec "$0" -c "$1"',
             sys.executable, script],
            capture_output=True, text=True, timeout=patience(120), cwd=ROOT,
        )
    finally:
        for pid in (folder / "cgroup.procs").read_text().split():  # leftovers: none expected
            subprocess.run(["kill", "-9", pid])
        for _ in range(50):
            try:
                folder.rmdir()
                break
            except OSError:  # a rank that exited a moment ago may still be in it
                time.sleep(0.1)
    assert out.returncode == 0, out.stderr
    cores_and_threads, doctor_line = out.stdout.splitlines()[-2:]
    assert cores_and_threads == "1 [1]"  # 2 cores, but a quota of 1 CPU: one thread per rank
    assert doctor_line.startswith("1 CPU core(s) (a cgroup quota of 1 CPUs")


def test_distlab_threads_says_the_threads_per_rank_and_a_wrong_value_is_refused(monkeypatch):
    monkeypatch.delenv("DISTLAB_THREADS", raising=False)
    shared = _config.default_threads(2)
    assert shared == max(1, _config.cpu_cores() // 2)
    monkeypatch.setenv("DISTLAB_THREADS", "4")
    assert _config.default_threads(2) == _config.default_threads(4) == 4
    for wrong in ("0", "two", "1.5", "-1"):
        monkeypatch.setenv("DISTLAB_THREADS", wrong)
        with pytest.raises(ValueError, match="whole number >= 1.*unset it"):
            _config.default_threads(2)


def _threads():
    import torch

    return torch.get_num_threads()


def test_ranks_run_with_the_threads_distlab_threads_says(monkeypatch):
    import distlab

    monkeypatch.setenv("DISTLAB_THREADS", "3")
    assert distlab.launch(_threads, world_size=2, backend=None, timeout=60) == [3, 3]
