"""The project's set-up files agree with each other.

pyproject.toml's requirements are all locked (requirements/lock.txt) at versions they allow, and
environment.yml (conda, Binder) installs that lock with the Makefile's torch; the README starts
with the two commands a learner needs; CI runs what `make test` runs; notebook outputs are compared
strictly, with only run-to-run noise masked.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from distlab import _torch

pytestmark = pytest.mark.quick

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml needs tomli on 3.10")

yaml = pytest.importorskip("yaml", reason="reading environment.yml needs pyyaml (the [dev] extra)")

ROOT = Path(__file__).resolve().parent.parent

LOCK = ROOT / "requirements" / "lock.txt"
# Where the lock is checked: the course machine's Python (markers are evaluated for it).
COURSE_PYTHON = {"python_version": "3.11", "python_full_version": "3.11.7", "os_name": "posix",
                 "sys_platform": "linux", "platform_system": "Linux"}
MACOS = dict(COURSE_PYTHON, sys_platform="darwin", platform_system="Darwin")


def _pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def _pip_requirements() -> dict[str, Requirement]:
    """Runtime and [dev] requirements from pyproject.toml, by canonical name."""
    project = _pyproject()["project"]
    lines = project["dependencies"] + project["optional-dependencies"]["dev"]
    return {canonicalize_name(Requirement(line).name): Requirement(line) for line in lines}


def _locked(path: Path = LOCK, env: dict | None = None) -> dict[str, str]:
    """name -> exact version, for the lines of a lock whose markers hold in `env`."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split(" #")[0].strip()
        if not line or line.startswith("#") or line.startswith("-"):
            continue
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(env or COURSE_PYTHON):
            (spec,) = req.specifier
            assert spec.operator == "==", f"{path.name}: {line} is not an exact pin"
            pins[canonicalize_name(req.name)] = spec.version
    return pins


def _makefile_value(name: str) -> str:
    match = re.search(rf"^{name}\s*:=\s*(\S+)", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert match, f"Makefile sets no {name}"
    return match.group(1)


def _environment() -> dict:
    with open(ROOT / "environment.yml") as f:
        return yaml.safe_load(f)


def _conda_specs() -> dict[str, str]:
    """Conda packages from environment.yml: name -> version spec ('' when unpinned)."""
    specs = {}
    for entry in _environment()["dependencies"]:
        if isinstance(entry, str):
            name, spec = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(.*)", entry).groups()
            specs[canonicalize_name(name)] = spec.replace(" ", "")
    return specs


def _pip_section() -> list[str]:
    for entry in _environment()["dependencies"]:
        if isinstance(entry, dict) and "pip" in entry:
            return entry["pip"]
    return []


def _code_lines(name: str) -> list[str]:
    """The lines of a Makefile, shell script or TOML file, without blank lines and comments."""
    lines = (line.strip() for line in (ROOT / name).read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _addopts() -> list[str]:
    return shlex.split(_pyproject()["tool"]["pytest"]["ini_options"]["addopts"])


def test_every_pyproject_dependency_is_locked_at_a_version_it_allows():
    locked = _locked()
    for name, req in _pip_requirements().items():
        if name == "torch":  # pinned in the Makefile, installed first
            assert req.specifier.contains(_makefile_value("TORCH").split("==")[1]), req
            continue
        assert name in locked, f"{name} is in pyproject.toml but not in the lock: run make lock"
        assert req.specifier.contains(locked[name], prereleases=True), (
            f"the lock has {name}=={locked[name]}, which pyproject.toml's {req} excludes: "
            "run make lock"
        )


def test_the_lock_leaves_torch_out_and_locks_its_cuda_libraries_for_linux_only():
    text = LOCK.read_text()
    cuda = ("nvidia-", "cuda-", "triton")
    for env in (COURSE_PYTHON, MACOS):
        names = set(_locked(env=env))
        assert "torch" not in names  # the Makefile installs it first, with the lock as constraints
        assert {"sympy", "networkx", "jinja2", "filelock"} <= names  # torch's own, locked
    # torch 2.14.1 from PyPI is a CUDA build on Linux: the CUDA libraries it pins come at the
    # very versions it asks for (so `-c lock` never fights its == pins), and a Mac gets none.
    assert not {n for n in _locked(env=MACOS) if n.startswith(cuda)}
    linux = _locked(env=COURSE_PYTHON)
    for line in (ROOT / "requirements" / "torch.in").read_text().splitlines():
        if line.startswith(cuda) and "==" in line:
            req = Requirement(line)
            assert req.marker and not req.marker.evaluate(MACOS), line
            assert canonicalize_name(req.name) in linux, f"{req.name} is not locked for Linux"
            assert req.specifier.contains(linux[canonicalize_name(req.name)]), (req, linux)
    assert "appnope" in _locked(env=MACOS)  # macOS covered
    assert "requirements/lock.py" in text.splitlines()[1]  # says how it was made


def test_older_releases_tested_beside_the_lock_are_exact_and_older():
    compat = _locked(ROOT / "requirements" / "compat.txt")
    assert compat, "requirements/compat.txt lists nothing"
    locked = _locked()
    for name, version in compat.items():
        assert Version(version) < Version(locked[name]), (name, version, locked[name])


def test_environment_yml_has_the_same_python_torch_and_lock():
    assert _environment()["channels"] == ["conda-forge"]
    specs = _conda_specs()
    assert specs.get("python") == "=3.11"
    assert specs.get("pytorch") == "=" + _makefile_value("TORCH").split("==")[1]
    assert set(specs) == {"python", "pip", "pytorch"}, "everything else comes from the lock"
    pip_lines = [line.strip() for line in _pip_section()]
    assert pip_lines == ["-r requirements/lock.txt", "-e ."], pip_lines


def test_readme_starts_with_make_lab_then_make_test():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"^```[^\n]*\n(.*?)^```", readme, flags=re.MULTILINE | re.DOTALL)
    assert block, "README.md has no fenced code block; the first must hold make lab, make test"
    commands = [line.strip().removeprefix("$ ") for line in block.group(1).splitlines()]
    assert [c for c in commands if c] == ["make lab", "make test"]


def test_ci_runs_make_test():
    commands = _code_lines(".ci/run")
    assert "make test" in commands or "exec make test" in commands, commands
    assert os.access(ROOT / ".ci" / "run", os.X_OK), ".ci/run must be executable: chmod +x .ci/run"


def test_pytest_reruns_notebooks_and_compares_outputs_strictly():
    addopts = _addopts()
    assert "--nbval" in addopts
    # --nbval-lax would only check that cells do not raise; mask noise in sanitize.cfg instead.
    for name in ("pyproject.toml", "Makefile", ".ci/run"):
        assert not [line for line in _code_lines(name) if "--nbval-lax" in line], name


def test_sanitize_file_named_in_pytest_options_exists():
    addopts = _addopts()
    assert "--nbval-sanitize-with" in addopts
    path = addopts[addopts.index("--nbval-sanitize-with") + 1]
    assert (ROOT / path).is_file(), f"pytest is told to sanitize with {path}, which does not exist"


def test_sanitize_file_masks_run_noise_but_keeps_versions():
    nbval_plugin = pytest.importorskip("nbval.plugin")
    text = (ROOT / "notebooks" / "sanitize.cfg").read_text()
    patterns = nbval_plugin.get_sanitize_patterns(text)
    assert patterns, "nbval reads no patterns from notebooks/sanitize.cfg: check its format"

    def sanitize(s: str) -> str:
        for regex, replace in patterns:
            s = re.sub(regex, replace, s)
        return s

    # Two runs of the same cell: everything that differs is noise and must be masked.
    first = (
        'File "/tmp/ipykernel_4242/2811.py", line 3\n'
        "[rank0]:[W1121 14:05:01.123456123 ProcessGroupGloo.cpp:123] Warning: x\n"
        "[W1121 14:05:01.123456 4242 socket.cpp:12] y\n"
        "rank 1 (pid 4243) at 0x7f3a2c1b9d50, pid=4244\n"
        "took 0.123 s (12.3 ms per step)\n"
        "tcp://127.0.0.1:45123 localhost:29500 /tmp/distlab-k3j_x9a2/log\n"
    )
    second = (
        'File "/tmp/ipykernel_977/1337.py", line 3\n'
        "[rank0]:[W1122 09:00:00.000000001 ProcessGroupGloo.cpp:130] Warning: x\n"
        "[W1122 09:00:00.000001 977 socket.cpp:99] y\n"
        "rank 1 (pid 978) at 0x7ffe00000010, pid=979\n"
        "took 4.5 s (9 ms per step)\n"
        "tcp://127.0.0.1:51000 localhost:40001 /tmp/distlab-zz9_q1w2/log\n"
    )
    assert sanitize(first) == sanitize(second)
    assert "[W ProcessGroupGloo.cpp] Warning: x" in sanitize(first)

    # The same stack on two torch releases: torch's and gloo's line numbers moved, nothing else.
    old_torch = (
        'File "/a/.venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", '
        "line 3913, in all_reduce\n"
        "/a/.venv/lib/python3.11/site-packages/torch/jit/_script.py:1488: DeprecationWarning\n"
        "all_reduce (torch/distributed/distributed_c10d.py:3913)\n"
        "[E ProcessGroupGloo.cpp:2948] Rank 1 failed; gloo/transport/tcp/pair.cc:464] op\n"
    )
    new_torch = (
        'File "/b/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", '
        "line 3252, in all_reduce\n"
        "/b/venv/lib/python3.11/site-packages/torch/jit/_script.py:1502: DeprecationWarning\n"
        "all_reduce (torch/distributed/distributed_c10d.py:3252)\n"
        "[E ProcessGroupGloo.cpp:2901] Rank 1 failed; gloo/transport/tcp/pair.cc:456] op\n"
    )
    assert sanitize(old_torch) == sanitize(new_torch)
    # ... but which file and which function are still compared, and so is the learner's line.
    assert sanitize(old_torch) != sanitize(new_torch.replace("in all_reduce", "in broadcast"))
    assert sanitize(old_torch) != sanitize(old_torch.replace("_c10d.py", "_c10d_logger.py"))
    cell = 'File "<cell>", line 4, in lonely_all_reduce\n'
    assert sanitize(cell) == cell
    assert sanitize("distlab/launcher.py:120") == "distlab/launcher.py:120"

    # What a lesson means to show is still compared: versions, counts, ranks, small constants.
    kept = "torch 2.13.0+cpu python 3.11.7 distlab 0.1.0 | 2 steps, 3.5x, rank 3, mask 0xff"
    assert sanitize(kept) == kept


def _makefile_targets() -> set[str]:
    targets = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        # A rule line: "name [name...]:" at the start of the line; not "X := value", not a recipe.
        rule = re.match(r"([^\s#:=][^:=]*):(?![=:])", line)
        if rule:
            targets.update(rule.group(1).split())
    return targets


def test_makefile_has_lab_test_and_notebooks_targets():
    targets = _makefile_targets()
    for target in ("lab", "test", "notebooks"):
        assert target in targets, f"Makefile has no `{target}` target"


def test_makefile_installs_pinned_torch_then_the_lock():
    # Any other torch requirement makes pip fetch gigabytes of CUDA wheels on the course machine.
    makefile = (ROOT / "Makefile").read_text()
    assert re.fullmatch(r"torch==\d+\.\d+\.\d+", _makefile_value("TORCH"))  # exact, no range
    assert _makefile_value("TORCH") == f"torch=={_torch.LOCKED}"  # what the outputs were made with
    torch_rule = re.search(r"^\$\(VENV\)/\.stamp-torch:.*?(?=^\S)", makefile, re.M | re.S)
    assert torch_rule and "$(PIP) install -q $(TORCH) -c $(LOCK)" in torch_rule.group(0)
    deps_rule = re.search(r"^\$\(VENV\)/\.stamp-deps:(.*?)(?=^\S)", makefile, re.M | re.S)
    assert deps_rule, "Makefile has no $(VENV)/.stamp-deps rule"
    assert "$(VENV)/.stamp-torch" in deps_rule.group(1).split("\n")[0].split()
    recipe = deps_rule.group(1)
    assert "install -q -r $(LOCK)" in recipe and "--no-deps" in recipe  # nothing resolved anew
    assert _makefile_value("LOCK") == "requirements/lock.txt"
    assert re.fullmatch(r"\d+(\.\d+)+", _makefile_value("PIP_VERSION"))  # pip pinned too


def test_ruff_is_configured_in_pyproject():
    ruff = _pyproject()["tool"].get("ruff", {})
    assert ruff.get("line-length") == 100
    assert set(ruff.get("lint", {}).get("select", [])) >= {"E", "F", "W", "I", "B", "UP"}
