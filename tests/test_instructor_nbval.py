"""An instructor's own notebook, checked the way a workshop's CI would: written fresh in a folder
outside the project, executed once with nbconvert, then re-run and compared by strict nbval, with
no sanitize file: two runs, each with its own ports, pids, temp paths and times. distlab's output
must compare anywhere: no cell numbers, ports, temp paths, pids or times in what nbval compares.
Every public entry point is in it: launch, Cluster and %%ranks (with --timeout and --no-fold), an
error and hangs on purpose, timeline, memory, check, pictures.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import nbformat

from distlab._patience import patience

CELLS = [
    "import distlab, torch\nimport torch.distributed as dist",
    """
    def work(scale):
        t = torch.ones(2) * (dist.get_rank() + 1) * scale
        dist.all_reduce(t)
        print("after all_reduce:", t.tolist())
        if dist.get_rank() == 1:
            print("only rank 1 says this")
        return t.sum().item()

    distlab.launch(work, 10, world_size=3)
    """,
    """
    # NBVAL_RAISES_EXCEPTION
    def bad_batch():
        if dist.get_rank() == 1:
            raise ValueError("bad batch on rank 1")
        dist.barrier()

    distlab.launch(bad_batch, world_size=2)
    """,
    """
    def lonely():
        if dist.get_rank() == 0:
            dist.all_reduce(torch.ones(1))

    try:
        distlab.launch(lonely, world_size=2, timeout=2)
    except distlab.RankTimeout as e:
        print(e)
    """,
    "%load_ext distlab\ncluster = distlab.Cluster(world_size=2)\ncluster",
    "%%ranks --no-fold\nx = torch.arange(3) * rank\ndist.all_reduce(x)\nprint(x.tolist())\nx",
    """
    %%ranks --timeout 2
    # NBVAL_RAISES_EXCEPTION
    if rank == 0:
        dist.all_reduce(x)
    """,
    "print(cluster.restart(), cluster.states)",
    "%%ranks\nx",
    """
    from distlab import timeline, memory

    def step():
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.Adam(model.parameters())
        with torch.profiler.record_function("forward"):
            loss = model(torch.ones(2, 4)).sum()
        loss.backward()
        with torch.profiler.record_function("sync"):
            for p in model.parameters():
                dist.all_reduce(p.grad)
        opt.step()
        memory.measure(model, opt)

    timeline.record(step, world_size=2)
    """,
    "memory.record(step, cluster=cluster, title='Adam', psi=20)",
    """
    from distlab import check, pictures

    def grader(answer):
        got = answer()
        assert got == [0, 1], f"expected [0, 1], got {got!r}"

    check("Exercise 1", grader, lambda: [0, 2])
    check("Exercise 1", grader, lambda: [0, 1])
    pictures.collective("all_reduce", before=[[1, 2], [3, 4]], after=[[4, 6], [4, 6]])
    """,
    "cluster.shutdown()\ncluster",
]


def _run(args, cwd, timeout=300):
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # as an instructor's CI: distlab from the environment
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=patience(timeout)
    )


def test_an_instructors_notebook_compares_under_strict_nbval_without_a_sanitize_file(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(textwrap.dedent(c).strip()) for c in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    path = tmp_path / "workshop.ipynb"
    nbformat.write(nb, path)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # this folder's own, empty settings
    executed = _run(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
         "--inplace", "--allow-errors", "--ExecutePreprocessor.kernel_name=python3",
         str(path)],
        tmp_path,
    )
    assert executed.returncode == 0, executed.stderr[-3000:]
    saved = nbformat.read(path, as_version=4)
    errors = [o for c in saved.cells for o in c.outputs if o.output_type == "error"]
    assert [e.ename for e in errors] == ["RankError", "RankTimeout"], errors
    shown = "".join(o.get("text", "") + o.get("evalue", "") for c in saved.cells for o in c.outputs)
    assert 'File "<cell>"' in shown and "127.0.0.1:" not in shown  # what could vary, doesn't
    checked = _run(
        [sys.executable, "-m", "pytest", "--nbval", "-p", "no:cacheprovider", "-q",
         "workshop.ipynb"],
        tmp_path,
    )
    assert checked.returncode == 0, f"nbval:\n{checked.stdout[-6000:]}"
