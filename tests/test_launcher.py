"""distlab.launch: results, environment, output, clean-up, the helper process.

Functions here are shipped by value (as notebook cells are). A rank that fails, hangs, dies or
does not start: tests/test_launcher_failures.py; launches from a real notebook cell (cell source
in tracebacks, classes resolved by name, the stop button, a killed kernel):
tests/test_launcher_kernel.py.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import cloudpickle
import psutil
import pytest
import torch
import torch.distributed as dist

import distlab
from distlab._patience import patience
from distlab._ranks import forkserver
from distlab._ranks.start_path import check_method

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _rank_info():
    return {
        "rank": dist.get_rank(),
        "world": dist.get_world_size(),
        "backend": dist.get_backend(),
        "env": {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")},
        "port": os.environ["MASTER_PORT"],
        "threads": torch.get_num_threads(),
        "omp": os.environ["OMP_NUM_THREADS"],
        "gloo_if": os.environ["GLOO_SOCKET_IFNAME"],
    }


def test_returns_one_value_per_rank_in_rank_order_with_torchrun_environment():
    result = distlab.launch(_rank_info, world_size=3)
    assert len(result) == 3
    for r, info in enumerate(result):
        assert info["rank"] == r and info["world"] == 3 and info["backend"] == "gloo"
        assert info["env"] == {
            "RANK": str(r),
            "WORLD_SIZE": "3",
            "LOCAL_RANK": str(r),
            "MASTER_ADDR": "127.0.0.1",
        }
        assert info["gloo_if"].startswith("lo")
    assert len({info["port"] for info in result}) == 1
    assert int(result[0]["port"]) > 0


def test_each_rank_gets_a_thread_budget():
    cores = len(os.sched_getaffinity(0))
    result = distlab.launch(_rank_info, world_size=4)
    expected = max(1, cores // 4)
    assert [i["threads"] for i in result] == [expected] * 4
    assert [i["omp"] for i in result] == [str(expected)] * 4
    assert distlab.launch(_rank_info, world_size=1, threads=3)[0]["threads"] == 3


def _all_reduce_sum(n):
    t = torch.arange(n, dtype=torch.float32) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return t


def test_arguments_are_passed_and_collectives_work():
    result = distlab.launch(_all_reduce_sum, 4, world_size=4)
    for t in result:
        assert torch.equal(t, torch.arange(4, dtype=torch.float32) * 10)


def _noisy():
    import ctypes

    rank = dist.get_rank()
    print(f"hello from {rank}")
    print("second line")
    os.write(2, f"raw stderr {rank}\n".encode())  # below Python: the fd itself
    libc = ctypes.CDLL(None)
    libc.printf(b"printf %d\n", rank)  # C stdio, as C++ extensions print
    libc.fflush(None)
    print("no newline at the end", end="")


def test_output_is_grouped_by_rank_in_order_with_prefixes_and_c_level_writes(capsys):
    distlab.launch(_noisy, world_size=3)
    out = capsys.readouterr().out
    expected = "".join(
        f"[rank {r}] hello from {r}\n[rank {r}] second line\n[rank {r}] raw stderr {r}\n"
        f"[rank {r}] printf {r}\n[rank {r}] no newline at the end\n"
        for r in range(3)
    )
    assert out == expected


def test_same_code_prints_the_same_text_every_run(capsys):
    runs = []
    for _ in range(3):
        distlab.launch(_noisy, world_size=2)
        runs.append(capsys.readouterr().out)
    assert runs[0] == runs[1] == runs[2]


def _countdown():
    for i in range(3):
        print(f"step {i}", flush=True)
        time.sleep(0.05)


def test_stream_mode_prints_every_line_live_with_prefixes(capsys):
    distlab.launch(_countdown, world_size=2, stream=True)
    lines = capsys.readouterr().out.splitlines()
    assert sorted(lines) == sorted(f"[rank {r}] step {i}" for r in range(2) for i in range(3))
    for r in range(2):  # each rank's own lines stay in order
        assert [x for x in lines if x.startswith(f"[rank {r}]")] == [
            f"[rank {r}] step {i}" for i in range(3)
        ]


def test_silent_run_prints_nothing_so_the_process_group_was_destroyed_cleanly(capsys):
    distlab.launch(_all_reduce_sum, 2, world_size=2)
    assert capsys.readouterr().out == ""


def _no_group():
    import torch.distributed as d

    before = d.is_initialized()
    d.init_process_group("gloo")  # env:// from the torchrun variables
    t = torch.ones(1)
    d.all_reduce(t)
    d.destroy_process_group()
    return before, t.item()


def test_a_finished_rank_leaves_its_gloo_sockets_for_exit_to_close(tmp_path):
    # destroy_process_group() drops the group; if that was the last reference, gloo's destructor
    # closes the sockets one peer at a time (~10 ms per rank, measured), on every launch. A rank
    # keeps the group alive until os._exit, which closes them all at once.
    code = textwrap.dedent(
        f"""
        import torch.distributed as dist
        from distlab._ranks import rank as rank_side
        from distlab._ranks.protocol import RankSpec
        this = rank_side._Rank(  # not `rank`: setup() sets __main__.rank, as %%ranks cells do
            RankSpec(rank=0, world_size=1, backend="gloo", threads=1, token="t",
                     store_path={str(tmp_path / "store")!r}, pg_timeout=30),
            None,
        )
        this.setup()
        world = dist.group.WORLD
        this.finish()
        assert not dist.is_initialized()
        assert [type(g).__name__ for g in rank_side._KEEP] == ["ProcessGroup"]
        assert rank_side._KEEP[0] is world
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True,
        timeout=patience(120),
    )
    assert out.stdout.strip() == "ok", out.stderr


def _debug_level():
    import torch.distributed as dist

    return str(dist.get_debug_level())


def test_torch_distributed_debug_from_env_reaches_the_ranks():
    # torch reads the variable when torch.distributed is imported, which happens in the helper
    # before a rank's env= arrives; the rank must read it again, as a torchrun process would.
    got = distlab.launch(_debug_level, world_size=2, env={"TORCH_DISTRIBUTED_DEBUG": "INFO"})
    assert got == ["DebugLevel.INFO"] * 2
    assert distlab.launch(_debug_level, world_size=2) == ["DebugLevel.OFF"] * 2


def test_backend_none_leaves_initialization_to_the_learner():
    assert distlab.launch(_no_group, world_size=2, backend=None) == [(False, 2.0)] * 2



def _listening_sockets():
    # Any socket this rank listens on (gloo's pair listeners included) must be loopback.
    t = torch.ones(1)
    dist.all_reduce(t)
    me = psutil.Process()
    addrs = sorted(
        {c.laddr.ip for c in me.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
    )
    dist.barrier()
    return addrs


def test_every_listening_socket_is_on_loopback():
    for addrs in distlab.launch(_listening_sockets, world_size=3):
        assert addrs, "expected gloo to listen somewhere"
        assert all(a.startswith("127.") or a == "::1" for a in addrs), addrs


def _pid():
    return os.getpid()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _distlab_tmp() -> set[str]:
    tmp = tempfile.gettempdir()
    return {n for n in os.listdir(tmp) if n.startswith("distlab-")}


def test_100_launches_leave_no_processes_fds_or_temp_files():
    # On the spawn path the pool's spares are replaced as they are used: the same number of
    # children and descriptors, never a rank's.
    spawn = check_method(None) == "spawn"
    distlab.launch(_pid, world_size=2)  # the helper (or the spares) exist from here on
    me = psutil.Process()
    fds, children, tmp = _open_fds(), me.children(recursive=True), _distlab_tmp()
    pids = set()
    for _ in range(10 if spawn else 100):
        pids.update(distlab.launch(_pid, world_size=2))
    now = me.children(recursive=True)
    assert not pids & {p.pid for p in now}, "a rank outlived its launch"
    assert _open_fds() == fds
    assert len(now) == len(children) if spawn else now == children
    assert _distlab_tmp() == tmp
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def test_spawn_start_method_gives_the_same_result():
    result = distlab.launch(_all_reduce_sum, 3, world_size=2, start_method="spawn", timeout=60)
    assert [t.tolist() for t in result] == [[0.0, 3.0, 6.0]] * 2


def _child_then_fail(path):
    import subprocess

    if dist.get_rank() == 1:
        while not os.path.exists(path):  # once rank 0 has started its child
            time.sleep(0.01)
        raise ValueError("rank 1 gives up")
    child = subprocess.Popen(["sleep", "60"])  # something rank 0 started (a data loader ...)
    with open(path + ".tmp", "w") as f:
        f.write(str(child.pid))
    os.rename(path + ".tmp", path)
    time.sleep(60)


def test_a_stopped_rank_takes_what_it_started_with_it(tmp_path):
    path = tmp_path / "child.pid"
    with pytest.raises(distlab.RankError, match="rank 1 gives up"):
        distlab.launch(_child_then_fail, str(path), world_size=2, timeout=60)
    child = int(path.read_text())
    deadline = time.monotonic() + patience(5)
    while time.monotonic() < deadline:
        if not psutil.pid_exists(child) or psutil.Process(child).status() == "zombie":
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        raise AssertionError("the rank was stopped but the process it started still runs")


def test_spares_are_topped_up_when_a_launch_returns():
    # While 4 ranks live, only MAX_SPAWNED - 4 spares fit; once they exit, the pool grows back
    # to the 4 the launch asked for, so the next 4-rank launch starts no interpreter.
    from distlab._ranks import spawn

    pool = spawn.get()
    distlab.launch(_pid, world_size=4, start_method="spawn", timeout=60)
    assert len(pool._spares) == min(4, spawn.MAX_SPARES)
    alive = [s.proc.pid for s in pool._spares]
    assert set(distlab.launch(_pid, world_size=4, start_method="spawn", timeout=60)) == set(alive)


def _now():
    return time.time()


def test_ranks_without_a_process_group_begin_together():
    # backend=None: no init_process_group to meet in. On the spawn path two warm spares and a
    # fresh interpreter (still importing torch) make one launch; without a meeting the spares
    # began the function about a second before the fresh rank, and a short timeout in the
    # learner's code (notebook 01's missing rank) fired on the late one.
    from distlab._ranks import spawn

    pool = spawn.get()
    distlab.launch(_pid, world_size=2, start_method="spawn", backend=None, timeout=60)
    deadline = time.monotonic() + patience(60)
    while not all(_waiting_with_torch(s.proc.pid) for s in list(pool._spares)[:2]):
        assert time.monotonic() < deadline, "the spares never finished importing torch"
    began = distlab.launch(_now, world_size=3, start_method="spawn", backend=None, timeout=60)
    assert max(began) - min(began) < patience(0.5), [round(t - min(began), 3) for t in began]


def _waiting_with_torch(pid: int) -> bool:
    """Has this spare imported torch and gone idle (waiting to be given a rank)?"""
    try:
        proc = psutil.Process(pid)
        before = sum(proc.cpu_times()[:2])
        time.sleep(0.3)
        idle = sum(proc.cpu_times()[:2]) == before
        return idle and any("libtorch_cpu" in m.path for m in proc.memory_maps())
    except psutil.Error:
        return False




def _heavy_modules_loaded():
    import sys

    return [name for name in ("torch._dynamo", "torch.distributed.rpc") if name in sys.modules]


def test_ranks_start_with_ddps_imports_done_once_the_helper_has_been_idle():
    # DDP, FSDP, DTensor and RPC import torch._dynamo (~2 s per rank). The fork server imports them
    # while it has nothing else to do, so ranks forked afterwards start with them loaded.
    fork = {"backend": None, "start_method": "forkserver"}
    distlab.launch(_pid, world_size=1, **fork)
    assert forkserver.get().wait_settled(timeout=120)
    loaded = distlab.launch(_heavy_modules_loaded, world_size=1, **fork)[0]
    assert loaded == ["torch._dynamo", "torch.distributed.rpc"]



def test_a_hold_pauses_the_helpers_warm_up_until_it_is_let_go():
    # stand_ins.children_stderr and stand_ins.torchrun hold the warm-up while the processes they
    # start import torch: on two cores those imports would otherwise share them with it. Held from
    # before Ready (the message waits on the socket), the server starts no warm-up step; let go,
    # it settles. Settling takes ~3 s on a quiet machine, so a server that ignored the hold would
    # settle inside the window below.
    server = forkserver.ForkServer()
    try:
        server.hold(True)
        server.wait_ready(timeout=patience(120))
        assert not server.wait_settled(timeout=patience(4))
        server.hold(False)
        assert server.wait_settled(timeout=patience(120))
    finally:
        server.close()


def _huge_pages_kib() -> int:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0


def _can_collapse() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            enabled = f.read()
    except OSError:
        return False
    release = tuple(int(x) for x in re.findall(r"\d+", os.uname().release)[:2])
    return "[never]" not in enabled and release >= (6, 1)


@pytest.mark.skipif(not _can_collapse(), reason="needs Linux >= 6.1 with transparent huge pages")
def test_ranks_start_on_huge_pages_once_the_helper_has_been_idle():
    # Forking copies the fork server's page tables and exiting frees the rank's: on 4 KiB pages that
    # is 6-9 ms per rank each way. Once idle, the fork server moves its memory onto 2 MiB pages.
    fork = {"backend": None, "start_method": "forkserver"}
    distlab.launch(_pid, world_size=1, **fork)
    assert forkserver.get().wait_settled(timeout=120)
    huge = distlab.launch(_huge_pages_kib, world_size=2, **fork)
    assert all(kib >= 32 * 1024 for kib in huge), huge
