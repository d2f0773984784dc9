"""distlab._ranks.ship: what the ranks run keeps the learner's file and line.

A rank's traceback and a stuck rank's stack must show the learner's own lines, whatever the
pickler does to code objects: cloudpickle 3.1.3 renames the file of every function it ships by
value to ``<dynamic-code>`` (3.1.2 kept it). Every test here runs once per cloudpickle under test:
the installed one (requirements/lock.txt) and each older release in requirements/compat.txt, which
`make setup` unpacks into .venv/compat/; the tests run a script or a kernel of their own with that
folder first on its path, and check that the ranks really imported that release.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import cloudpickle
import pytest

from distlab._patience import patience

ROOT = Path(__file__).resolve().parents[1]
COMPAT = ROOT / ".venv" / "compat"


def _pickler_versions() -> list:
    """(version, folder to put first on the path, or None for the installed one)."""
    installed = cloudpickle.__version__
    out = [pytest.param((installed, None), id=f"cloudpickle-{installed}")]
    for line in (ROOT / "requirements" / "compat.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        name, version = line.split("==")
        folder = COMPAT / f"{name}-{version}"
        marks = []
        if not (folder / name).is_dir():
            marks = [pytest.mark.skip(reason=f"{folder} is missing: `make setup` installs it")]
        out.append(pytest.param((version, folder), id=f"{name}-{version}", marks=marks))
    return out


PICKLERS = _pickler_versions()

#: A learner's module next to the notebook: its functions travel by reference and are imported.
LEARNER_MODULE = '''
import torch.distributed as dist


def train_step():
    if dist.get_rank() == 1:
        raise RuntimeError("bad batch in learner_mod")  # learner_mod's line
'''

#: The learner's code, as a notebook cell or a script: every kind of function a rank can run.
CASES = '''
import cloudpickle, distlab, torch, torch.distributed as dist
import learner_mod


def outer():
    def inner():
        raise ValueError("nested function fails")  # nested's line
    inner()


divide = lambda: 1 / 0  # the lambda's line


class Trainer:
    def step(self):
        raise KeyError("method fails")  # the method's line


def stuck():
    if dist.get_rank() == 0:
        dist.barrier()  # the stuck rank's line


def shown(fn, **options):
    try:
        distlab.launch(fn, world_size=2, **options)
    except distlab.RankError as e:
        return e.primary.traceback
    except distlab.RankTimeout as e:
        return e.stacks[0]
    return "no error"


print("ranks use cloudpickle", distlab.launch(lambda: cloudpickle.__version__, world_size=2))
for name, fn, options in [
    ("nested", outer, {}),
    ("lambda", divide, {}),
    ("method", Trainer().step, {}),
    ("module", learner_mod.train_step, {}),
    ("stuck", stuck, {"timeout": 2}),
]:
    print(f"=== {name}")
    print(shown(fn, **options))
'''

#: The line each case must show, and the file it must name.
EXPECTED = {
    "nested": ('raise ValueError("nested function fails")  # nested\'s line', "main"),
    "lambda": ("divide = lambda: 1 / 0  # the lambda's line", "main"),
    "method": ('raise KeyError("method fails")  # the method\'s line', "main"),
    "module": ('raise RuntimeError("bad batch in learner_mod")  # learner_mod\'s line', "module"),
    "stuck": ("dist.barrier()  # the stuck rank's line", "main"),
}


def _sections(text: str) -> dict[str, str]:
    parts = text.split("=== ")
    return {p.split("\n", 1)[0]: p.split("\n", 1)[1] for p in parts[1:]}


def _check(output: str, version: str, main_file: str, module_file: str) -> None:
    assert f"ranks use cloudpickle ['{version}', '{version}']" in output, output
    sections = _sections(output)
    assert sorted(sections) == sorted(EXPECTED), output
    for name, (line, where) in EXPECTED.items():
        shown = sections[name]
        file = main_file if where == "main" else module_file
        assert line in shown, f"{name}: the learner's line is missing from\n{shown}"
        assert f'File "{file}"' in shown, f"{name}: {file} is not named in\n{shown}"
        assert "<dynamic-code>" not in shown


def _env(folder: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (folder, ROOT) if p)
    return env


@pytest.mark.parametrize("pickler", PICKLERS)
def test_code_objects_travel_whole_with_their_file_and_lines(pickler, tmp_path):
    version, folder = pickler
    script = tmp_path / "roundtrip.py"
    script.write_text(
        textwrap.dedent(
            """
            import cloudpickle
            from distlab._ranks import ship

            def outer(k):
                def inner(x):
                    return [y * k for y in x]  # a comprehension: code inside code
                return inner

            class Net:
                def forward(self, x):
                    return x + 1

            def codes(code):
                yield code
                for c in code.co_consts:
                    if hasattr(c, "co_filename"):
                        yield from codes(c)

            print(cloudpickle.__version__)
            for fn in (outer, outer(2), lambda: 0, Net.forward):
                back = ship.loads(ship.pickle(fn))
                assert back is not fn
                for sent, got in zip(codes(fn.__code__), codes(back.__code__), strict=True):
                    # == compares the bytecode, constants, names and line table, not the file
                    print(got.co_qualname, got.co_firstlineno, got.co_filename, got == sent)
            """
        )
    )
    out = subprocess.run(
        [sys.executable, str(script)], env=_env(folder), capture_output=True, text=True,
        timeout=patience(60),
    )
    assert out.returncode == 0, out.stderr
    shipped_with, *lines = out.stdout.splitlines()
    assert shipped_with == version
    # a comprehension has a code object of its own before Python 3.12 (PEP 709 inlined it)
    comprehension = [("outer.<locals>.inner.<locals>.<listcomp>", 7)][: sys.version_info < (3, 12)]
    assert lines == [
        f"{qualname} {line} {script} True"
        for qualname, line in [
            ("outer", 5),
            ("outer.<locals>.inner", 6),
            *comprehension,
            ("outer.<locals>.inner", 6),
            *comprehension,
            ("<lambda>", 21),
            ("Net.forward", 11),
        ]
    ]


@pytest.mark.parametrize("pickler", PICKLERS)
def test_a_script_shows_the_learners_lines_in_tracebacks_and_stacks(pickler, tmp_path):
    version, folder = pickler
    (tmp_path / "learner_mod.py").write_text(LEARNER_MODULE)
    script = tmp_path / "train.py"
    script.write_text(CASES)
    out = subprocess.run(
        [sys.executable, str(script)],
        env=_env(folder),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=patience(240),
    )
    assert out.returncode == 0, out.stderr
    _check(out.stdout, version, str(script), str(tmp_path / "learner_mod.py"))


@pytest.mark.parametrize("pickler", PICKLERS)
def test_a_notebook_cell_shows_the_learners_lines_in_tracebacks_and_stacks(pickler, tmp_path):
    from kernel import Kernel

    version, folder = pickler
    (tmp_path / "learner_mod.py").write_text(LEARNER_MODULE)
    env = {"PYTHONPATH": str(folder)} if folder else {}
    kernel = Kernel(env=env, cwd=tmp_path)
    try:
        res = kernel.run(CASES + "\nimport inspect; print('cell file', inspect.getfile(outer))")
    finally:
        kernel.shutdown()
    assert res.error is None, res.text
    cell_file = res.stdout.rsplit("cell file ", 1)[1].strip()
    assert "ipykernel" in cell_file  # IPython's name for the cell, as in a notebook
    _check(res.stdout, version, cell_file, str(tmp_path / "learner_mod.py"))


def test_a_function_that_uses_a_module_subclass_travels(tmp_path):
    # torch.backends.mps is a module of a module subclass: plain cloudpickle refuses any
    # function that uses it ("cannot pickle 'GenericModule' object")
    import torch

    from distlab._ranks import ship

    def uses_backends():
        return torch.backends.mps.is_built(), torch.backends.cpu.get_cpu_capability() != ""

    back = ship.loads(ship.pickle(uses_backends))
    assert back() == uses_backends()
    assert ship.loads(ship.pickle(torch.backends.mps)) is torch.backends.mps


def test_only_the_notebooks_cells_travel_not_every_file_in_the_line_cache(tmp_path, monkeypatch):
    import linecache

    from distlab._ranks.ship import LineShipper

    monkeypatch.setattr(linecache, "cache", {})
    module = tmp_path / "helper.py"
    module.write_text("x = 1\n")
    assert linecache.getlines(str(module)) == ["x = 1\n"]  # a file on disk: cached with its mtime
    cell = "/tmp/ipykernel_4242/123.py"  # IPython keeps a cell's lines with mtime None
    linecache.cache[cell] = (6, None, ["y = 2\n"], cell)
    shipper = LineShipper()
    assert shipper.new() == {cell: ["y = 2\n"]}
    assert shipper.new() == {}  # sent once
    linecache.cache[cell] = (6, None, ["y = 3\n"], cell)
    assert shipper.new() == {cell: ["y = 3\n"]}  # and again when the cell changes
