"""distlab.launch: results, environment, output, failures, clean-up.

Functions here are shipped by value (as notebook cells are); tests that need a real notebook cell
(cell source in tracebacks, classes resolved by name) run code in a real IPython kernel.
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
from distlab._config import check_start_method
from distlab._ranks import forkserver

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
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
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


def _fail_on_rank_1():
    if dist.get_rank() == 1:
        raise ValueError("rank 1 has a bad batch")
    t = torch.ones(1)
    dist.all_reduce(t)  # rank 0 waits here for rank 1, which never comes
    return t


def test_failing_rank_raises_rank_error_with_root_cause_first():
    start = time.monotonic()
    with pytest.raises(distlab.RankError) as info:
        distlab.launch(_fail_on_rank_1, world_size=2, timeout=30)
    assert time.monotonic() - start < 10  # not after the timeout
    err = info.value
    assert err.primary.rank == 1
    assert err.primary.type == "ValueError"
    assert err.primary.message == "rank 1 has a bad batch"
    assert "_fail_on_rank_1" in err.primary.traceback
    assert 'raise ValueError("rank 1 has a bad batch")' in err.primary.traceback
    # rank 0 waits in the all_reduce for rank 1, which is alive but will never call it: distlab
    # stops rank 0 after the grace, and rank 0 has no failure of its own to report
    assert err.stopped == [0] and [f.rank for f in err.failures] == [1]
    assert str(err).startswith("rank 1 raised: ValueError: rank 1 has a bad batch")


def _all_raise():
    raise KeyError(f"missing {dist.get_world_size()}")


def test_same_error_on_every_rank_is_shown_once():
    with pytest.raises(distlab.RankError) as info:
        distlab.launch(_all_raise, world_size=2)
    assert [f.rank for f in info.value.failures] == [0, 1]
    assert "--- ranks 0, 1 ---" in str(info.value)
    assert str(info.value).count("KeyError: 'missing 2'") == 2  # headline + one traceback


def _hang_on_rank_0():
    if dist.get_rank() == 0:
        t = torch.ones(1)
        dist.all_reduce(t)  # rank 1 never joins
    return "done"


def test_hung_rank_is_reported_with_its_stack():
    start = time.monotonic()
    with pytest.raises(distlab.RankTimeout) as info:
        distlab.launch(_hang_on_rank_0, world_size=2, timeout=3)
    elapsed = time.monotonic() - start
    assert 3 <= elapsed < 10
    err = info.value
    assert isinstance(err, TimeoutError)
    assert err.ranks == [0] and err.finished == [1]
    assert "_hang_on_rank_0" in err.stacks[0]
    assert "dist.all_reduce(t)  # rank 1 never joins" in err.stacks[0]
    assert "rank 0 is stuck here" in str(err)


def _die(how):
    # Both ranks past gloo's connection set-up first: a rank that dies while a peer is still
    # connecting makes that peer fail too ("Connection closed by peer"), seen once in CI.
    dist.barrier()
    if dist.get_rank() != 1:
        time.sleep(30)
        return
    if how == "exit":
        os._exit(3)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "segfault":
        import ctypes

        ctypes.string_at(0)


@pytest.mark.parametrize(
    "how, expected",
    [
        ("exit", "exited with code 3"),
        ("kill", "killed by signal SIGKILL"),
        ("segfault", "killed by signal SIGSEGV (segmentation fault"),
    ],
)
def test_dead_rank_is_reported_within_seconds(how, expected, capsys):
    start = time.monotonic()
    with pytest.raises(distlab.RankError) as info:
        distlab.launch(_die, how, world_size=2, timeout=60)
    assert time.monotonic() - start < 5
    err = info.value
    assert err.primary.rank == 1 and err.primary.stage == "died"
    assert expected in err.primary.message
    # rank 0 sleeps in Python (no collective to fail in): distlab stops it
    assert (err.stopped, [f.rank for f in err.failures]) == ([0], [1]), str(err)
    if how == "segfault":  # faulthandler's dump of the crash is kept
        assert "Segmentation fault" in err.primary.output_tail
        assert "_die" in err.primary.output_tail
        # ... without its list of loaded C extensions, which changes from run to run
        shown = capsys.readouterr().out
        assert "[rank 1] Fatal Python error: Segmentation fault" in shown
        assert "Extension modules" not in shown + err.primary.output_tail


def test_bad_input_is_refused_with_clear_errors():
    with pytest.raises(TypeError, match="world_size must be an int"):
        distlab.launch(_rank_info, world_size="2")
    with pytest.raises(TypeError, match="world_size must be an int"):
        distlab.launch(_rank_info, world_size=2.0)
    with pytest.raises(ValueError, match="at least 1"):
        distlab.launch(_rank_info, world_size=0)
    with pytest.raises(ValueError, match="unknown backend 'mpi2'"):
        distlab.launch(_rank_info, backend="mpi2")
    with pytest.raises(ValueError, match="needs one CUDA GPU per rank"):
        distlab.launch(_rank_info, backend="nccl", world_size=torch.cuda.device_count() + 1)
    with pytest.raises(TypeError, match=r"launch\(work\(\)\) instead of launch\(work\)"):
        distlab.launch(None)
    with pytest.raises(TypeError, match="needs a function"):
        distlab.launch(42)
    with pytest.raises(ValueError, match="timeout must be positive"):
        distlab.launch(_rank_info, timeout=0)


def _identity(x=None, **kw):
    return x


def test_unpicklable_argument_is_named_before_anything_starts():
    import threading

    with pytest.raises(distlab.ShipError, match=r"positional argument 0 \(lock\) cannot be sent"):
        distlab.launch(_identity, threading.Lock())
    with pytest.raises(distlab.ShipError, match=r"keyword argument 'log' \(TextIOWrapper\)"):
        with tempfile.TemporaryFile("w") as f:
            distlab.launch(_identity, log=f)


def _returns_a_lock():
    import threading

    return threading.Lock()


def test_unpicklable_return_value_is_an_error_not_a_hang():
    with pytest.raises(distlab.RankError) as info:
        distlab.launch(_returns_a_lock, world_size=2, timeout=30)
    assert info.value.primary.stage == "result"
    assert "cannot be sent back to the notebook" in str(info.value)
    assert "lock" in info.value.primary.message


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
    spawn = check_start_method(None) == "spawn"
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
    deadline = time.monotonic() + 5
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
    deadline = time.monotonic() + 60
    while not all(_waiting_with_torch(s.proc.pid) for s in list(pool._spares)[:2]):
        assert time.monotonic() < deadline, "the spares never finished importing torch"
    began = distlab.launch(_now, world_size=3, start_method="spawn", backend=None, timeout=60)
    assert max(began) - min(began) < 0.5, [round(t - min(began), 3) for t in began]


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


# --- in a real notebook kernel -------------------------------------------------------------------


def test_cell_defined_function_class_and_lambda_just_work(kernel):
    res = kernel.run(
        textwrap.dedent(
            """
            import distlab, torch, torch.distributed as dist
            class Scaled:
                def __init__(self, k): self.k = k
                def __call__(self, t): return t * self.k
            double = lambda t: t * 2
            def work(f):
                t = f(double(torch.ones(2)))
                dist.all_reduce(t)
                return Scaled(t.sum().item())
            out = distlab.launch(work, Scaled(3), world_size=2)
            print([o.k for o in out], type(out[0]).__name__)
            """
        )
    )
    assert res.error is None, res.text
    assert res.stdout == "[24.0, 24.0] Scaled\n"


def test_cell_class_resolves_by_name_when_ranks_pickle_it_to_each_other(kernel):
    # broadcast_object_list pickles with plain pickle: the class travels by *name* __main__.Point.
    res = kernel.run(
        textwrap.dedent(
            """
            import distlab, torch.distributed as dist
            class Point:
                def __init__(self, x): self.x = x
            def share():
                objs = [Point(41) if dist.get_rank() == 0 else None]
                dist.broadcast_object_list(objs, src=0)
                return type(objs[0]).__name__, objs[0].x + 1
            print(distlab.launch(share, world_size=3))
            """
        )
    )
    assert res.error is None, res.text
    assert res.stdout == "[('Point', 42), ('Point', 42), ('Point', 42)]\n"


def test_rpc_with_default_arguments_and_a_cell_function(kernel):
    res = kernel.run(
        textwrap.dedent(
            """
            import distlab, os, torch
            import torch.distributed.rpc as rpc
            def add(a, b):
                return a + b
            def mul(a, b):
                return a * b
            def rpc_work():
                r = int(os.environ["RANK"])
                rpc.init_rpc(f"worker{r}", rank=r, world_size=2)
                got = rpc.rpc_sync(f"worker{1 - r}", add, args=(torch.ones(2), r))
                # `mul` is named only inside a generator expression (its own code object)
                more = sum(rpc.rpc_sync(f"worker{1 - r}", mul, args=(got, k)) for k in (1, 2))
                rpc.shutdown()
                return got.tolist(), more.tolist()
            print(distlab.launch(rpc_work, world_size=2, backend=None, timeout=60))
            """
        ),
        timeout=120,
    )
    assert res.error is None, res.text
    assert res.stdout.splitlines()[-1] == "[([1.0, 1.0], [3.0, 3.0]), ([2.0, 2.0], [6.0, 6.0])]"


def test_rank_error_in_a_cell_shows_the_cells_source_line(kernel):
    res = kernel.run(
        textwrap.dedent(
            """
            import distlab
            def broken():
                x = {"a": 1}
                return x["learner_typo"]
            distlab.launch(broken, world_size=2)
            """
        )
    )
    assert res.ename == "RankError"
    assert 'return x["learner_typo"]' in res.text
    assert "ranks 0, 1" in res.text


def test_hung_rank_stack_shows_the_cells_source_line(kernel):
    res = kernel.run(
        textwrap.dedent(
            """
            import distlab, torch, torch.distributed as dist
            def stuck():
                if dist.get_rank() == 1:
                    dist.barrier()  # only rank 1 arrives
            distlab.launch(stuck, world_size=2, timeout=2)
            """
        )
    )
    assert res.ename == "RankTimeout"
    assert "dist.barrier()  # only rank 1 arrives" in res.text
    assert "rank 1 is stuck here" in res.text


def _write_pid_and_sleep_code(pid_dir: str) -> str:
    return textwrap.dedent(
        f"""
        import distlab, os, time
        def sleeper():
            open(os.path.join({pid_dir!r}, str(os.getpid())), "w").close()
            time.sleep(60)
        distlab.launch(sleeper, world_size=3, timeout=100)
        """
    )


def _wait_for_pids(pid_dir: str, n: int) -> list[int]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pids = [int(p) for p in os.listdir(pid_dir)]
        if len(pids) == n:
            return pids
        time.sleep(0.05)
    raise AssertionError("ranks did not start")


def _alive(pids):
    out = []
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def test_stop_button_kills_every_rank_within_2_seconds(kernel, tmp_path):
    import threading

    pid_dir = str(tmp_path)
    res = {}
    code = _write_pid_and_sleep_code(pid_dir)
    t = threading.Thread(target=lambda: res.update(r=kernel.run(code)))
    t.start()
    pids = _wait_for_pids(pid_dir, 3)
    kernel.km.interrupt_kernel()
    stopped = time.monotonic()
    while _alive(pids) and time.monotonic() - stopped < 2:
        time.sleep(0.02)
    assert not _alive(pids)
    t.join(30)
    assert res["r"].ename == "KeyboardInterrupt"


def test_killed_kernel_takes_its_ranks_down_within_5_seconds(tmp_path):
    import threading

    from kernel import Kernel

    k = Kernel()
    try:
        pid_dir = str(tmp_path)
        def run_quietly():
            try:
                k.run(_write_pid_and_sleep_code(pid_dir))
            except Exception:
                pass  # the kernel is killed under it: that is the point

        threading.Thread(target=run_quietly, daemon=True).start()
        pids = _wait_for_pids(pid_dir, 3)
        os.kill(k.pid, signal.SIGKILL)
        killed = time.monotonic()
        while _alive(pids) and time.monotonic() - killed < 5:
            time.sleep(0.05)
        assert not _alive(pids)
    finally:
        k.kc.stop_channels()
        k.km.cleanup_resources()


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


def test_ranks_that_do_not_start_in_time_are_named_and_nothing_is_left_behind():
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    start = time.monotonic()
    with pytest.raises(distlab.StartError) as info:
        distlab.launch(_pid, world_size=2, start_timeout=0.001)
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert message.startswith("rank 0 did not start within 0.001 s: it was still ")
    assert "rank 1 did not start within 0.001 s" in message
    assert "Pass start_timeout=" in message
    after = {p.pid for p in me.children(recursive=True)} - before - _spare_pids()
    assert not [p for p in after if psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def _spare_pids() -> set[int]:
    """The spawn path's spares: interpreters waiting to become ranks, not anyone's leftovers."""
    from distlab._ranks import spawn

    return {s.proc.pid for s in spawn.get()._spares}


def test_the_timeout_counts_from_the_learners_code_not_from_loading_it(tmp_path, monkeypatch):
    # The function lives in a module that takes 2 s to import: every rank imports it while it
    # loads the task, before its code begins. A 1 s timeout is the function's, not the import's.
    (tmp_path / "slow_to_import.py").write_text(
        "import time\ntime.sleep(2)\n\ndef quick():\n    return 'done'\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    import slow_to_import

    assert distlab.launch(slow_to_import.quick, world_size=2, timeout=1) == ["done", "done"]
