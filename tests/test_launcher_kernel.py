"""distlab.launch from a real notebook kernel: functions, classes and lambdas defined in a cell,
the cell's source line in a rank's traceback and stack, and the stop button or a killed kernel
taking every rank down.
"""

from __future__ import annotations

import os
import signal
import textwrap
import time

from processes import alive

from distlab._patience import patience


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
    deadline = time.monotonic() + patience(30)
    while time.monotonic() < deadline:
        pids = [int(p) for p in os.listdir(pid_dir)]
        if len(pids) == n:
            return pids
        time.sleep(0.05)
    raise AssertionError("ranks did not start")


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
    while alive(pids) and time.monotonic() - stopped < 2:
        time.sleep(0.02)
    assert not alive(pids)
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
        while alive(pids) and time.monotonic() - killed < 5:
            time.sleep(0.05)
        assert not alive(pids)
    finally:
        k.kc.stop_channels()
        k.km.cleanup_resources()
