"""The %%ranks magic, in a real IPython kernel (as a learner uses it)."""

from __future__ import annotations

import re
import textwrap
import time

import psutil
import pytest

from distlab._patience import patience
from distlab.magic import parse_line


def test_parse_line_reads_ranks_timeout_stream_and_fold():
    assert parse_line("", 4) == (None, None, False, None)
    assert parse_line("all", 4) == (None, None, False, None)
    assert parse_line("0,2 --timeout 5 --stream", 4) == ([0, 2], 5.0, True, None)
    assert parse_line("--no-fold", 4) == (None, None, False, False)
    with pytest.raises(ValueError, match="out of range"):
        parse_line("0,4", 4)
    with pytest.raises(ValueError, match="must look like 0,2"):
        parse_line("a,b", 4)
    with pytest.raises(ValueError, match="usage: %%ranks"):
        parse_line("--bogus", 4)


@pytest.fixture(scope="module")
def nb(kernel):
    res = kernel.run(
        "import distlab, torch, torch.distributed as dist\n"
        "%load_ext distlab\n"
        "cluster = distlab.Cluster(world_size=3, timeout=30)"
    )
    assert res.error is None, res.text
    yield kernel
    kernel.run("cluster.shutdown()")


def cell(body: str, line: str = "") -> str:
    return f"%%ranks {line}\n" + textwrap.dedent(body).strip("\n")


def test_namespace_persists_across_cells_and_differs_per_rank(nb):
    assert nb.run(cell("x = dist.get_rank() * 10")).error is None
    res = nb.run(cell("print('x is', x)\nx + 1"))
    assert res.error is None, res.text
    assert res.stdout == "[rank 0] x is 0\n[rank 1] x is 10\n[rank 2] x is 20\n"
    assert res.results == ["[rank 0] 1\n[rank 1] 11\n[rank 2] 21"]


def test_a_trailing_semicolon_hides_the_last_value_as_in_ipython(nb):
    res = nb.run(cell("41 + 1;"))
    assert res.error is None and res.results == []


def test_class_defined_in_a_cell_is_used_in_a_collective(nb):
    res = nb.run(
        cell(
            """
            class Message:
                def __init__(self, text): self.text = text
            objs = [Message(f"from rank {dist.get_rank()}")]
            dist.broadcast_object_list(objs, src=2)   # plain pickle: __main__.Message by name
            print(type(objs[0]).__name__, objs[0].text)
            """
        )
    )
    assert res.error is None, res.text
    assert res.stdout == "[ranks 0-2] Message from rank 2\n"  # folded: all ranks print it alike


def test_no_fold_shows_every_ranks_own_block(nb):
    res = nb.run(cell("print('same')\nprint('mine', dist.get_rank())", "--no-fold"))
    assert res.stdout == "".join(f"[rank {r}] same\n[rank {r}] mine {r}\n" for r in range(3))
    res = nb.run(cell("print('same')\nprint('mine', dist.get_rank())"))
    assert res.stdout == "[ranks 0-2] same\n[rank 0] mine 0\n[rank 1] mine 1\n[rank 2] mine 2\n"


def test_a_subset_of_ranks_runs_alone(nb):
    res = nb.run(cell("print('here', dist.get_rank())", "0,2"))
    assert res.stdout == "[rank 0] here 0\n[rank 2] here 2\n"


def test_subset_calling_a_collective_gets_a_clear_warning(nb):
    start = time.monotonic()
    res = nb.run(cell("dist.all_reduce(torch.ones(1))", "0 --timeout 1"))
    # --timeout 1, not the cluster's 30 s (10 s on a quiet machine, more on a busy one)
    assert time.monotonic() - start < min(patience(10), 25)
    assert "runs on rank(s) 0 only, but calls all_reduce()" in res.stderr
    assert res.ename == "RankTimeout" and "did not finish within 1 s" in res.error["evalue"]
    nb.run("cluster.restart()")


def test_errors_raise_in_the_kernel_with_the_cells_line_and_the_cluster_stays_usable(nb):
    nb.run(cell("y = 5"))
    res = nb.run(cell("if dist.get_rank() == 1:\n    raise RuntimeError('only rank 1')"))
    assert res.ename == "RankError"
    assert "rank 1 raised: RuntimeError: only rank 1" in res.text
    assert "raise RuntimeError('only rank 1')" in res.text  # the cell's own source line
    res = nb.run(cell("y"))
    assert res.error is None and res.results == ["[ranks 0-2] 5"]


def test_errors_show_cell_names_and_no_distlab_frames(nb):
    code = cell("if dist.get_rank() == 1:\n    raise ValueError('bad batch')")
    res = nb.run(code)
    assert res.ename == "RankError", res.text
    # the traceback IPython shows names the %%ranks cell as IPython names cells
    assert re.search(r"Cell In\[\d+\], line 2", res.text), res.text
    # the message itself (what nbval compares) has no cell number: the same on every run
    assert 'File "<cell>", line 2' in res.error["evalue"], res.error["evalue"]
    assert "Cell In[" not in res.error["evalue"], res.error["evalue"]
    # no distlab frame (magic.py, cluster.py, group.py) in the kernel's traceback
    assert not re.search(r"distlab[/\\]\w+\.py", res.text), res.text
    # a plain cell's function, launched: its frame is "Cell In[N]", not the kernel's temp file
    nb.run("def boom():\n    raise KeyError('no such shard')")
    res = nb.run("distlab.launch(boom, world_size=2)")
    assert res.ename == "RankError"
    assert re.search(r"Cell In\[\d+\], line 2, in boom", res.text), res.text
    assert 'File "<cell>", line 2, in boom' in res.error["evalue"]
    assert "ipykernel_" not in res.text and "launcher.py" not in res.text, res.text
    assert "distlab.launch(boom, world_size=2)" in res.text  # the notebook's own line stays


def test_stop_button_interrupts_a_cell_without_killing_the_cluster(nb):
    nb.run(cell("keep = dist.get_rank()"))
    start = time.monotonic()
    res = nb.run(cell("import time\ntime.sleep(30)"), interrupt_after=1.0)
    assert time.monotonic() - start < 10
    assert res.ename == "KeyboardInterrupt"
    res = nb.run(cell("keep"))
    assert res.results == ["[rank 0] 0\n[rank 1] 1\n[rank 2] 2"]


def test_stop_button_on_a_rank_stuck_in_cpp_says_so_and_points_to_restart(nb):
    code = cell(
        """
        import signal, time
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        time.sleep(30)  # stands in for C++ that does not check for Ctrl-C
        """,
        "1",
    )
    res = nb.run(code, interrupt_after=1.0)
    assert res.ename == "KeyboardInterrupt"
    assert "could not be interrupted" in res.text
    assert "time.sleep(30)  # stands in for C++" in res.text
    assert "cluster.restart()" in res.text and "variables come back" in res.text
    res = nb.run(cell("1"))
    assert res.ename == "ClusterBroken"
    assert nb.run("cluster.restart()").error is None
    assert nb.run(cell("1")).results == ["[ranks 0-2] 1"]


def test_no_cluster_gives_a_clear_error(nb):
    assert nb.run("cluster.shutdown()").error is None
    res = nb.run("%%ranks\n1")
    assert res.ename == "RuntimeError" and "distlab.Cluster(world_size=4)" in res.text


def test_ranks_die_when_the_kernel_restarts(tmp_path):
    from kernel import Kernel

    k = Kernel()
    try:
        res = k.run(
            "import distlab, os\nc = distlab.Cluster(world_size=2)\nprint(c.run(os.getpid))"
        )
        pids = eval(res.stdout)
        k.km.restart_kernel(now=True)
        deadline = time.monotonic() + patience(5)
        while time.monotonic() < deadline:
            alive = [p for p in pids if psutil.pid_exists(p)
                     and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
            if not alive:
                break
            time.sleep(0.05)
        assert not alive
    finally:
        k.shutdown()

