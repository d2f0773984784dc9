"""The project's set-up files agree with each other.

pyproject.toml (pip) and environment.yml (conda, Binder) list the same packages; the README starts
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

pytestmark = pytest.mark.quick

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml needs tomli on 3.10")

yaml = pytest.importorskip("yaml", reason="reading environment.yml needs pyyaml (the [dev] extra)")

ROOT = Path(__file__).resolve().parent.parent

# pip name -> conda-forge name, only where they differ.
PIP_TO_CONDA = {
    "torch": "pytorch",
    "matplotlib": "matplotlib-base",  # matplotlib without the Qt GUI
}
# Conda packages that are the environment itself, not one of the project's dependencies.
CONDA_ONLY = {"python", "pip"}


def _pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def _pip_requirements() -> dict[str, Requirement]:
    """Runtime and [dev] requirements from pyproject.toml, by conda-forge name."""
    project = _pyproject()["project"]
    lines = project["dependencies"] + project["optional-dependencies"]["dev"]
    requirements = {}
    for line in lines:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        requirements[PIP_TO_CONDA.get(name, name)] = req
    return requirements


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


def test_every_pyproject_dependency_is_in_environment_yml():
    missing = sorted(set(_pip_requirements()) - set(_conda_specs()))
    assert not missing, (
        f"environment.yml lacks {missing}, which pyproject.toml needs. Add them to environment.yml"
        " (if the conda-forge name differs, add it to PIP_TO_CONDA in this test)."
    )


def test_every_environment_yml_package_is_in_pyproject():
    extra = sorted(set(_conda_specs()) - set(_pip_requirements()) - CONDA_ONLY)
    assert not extra, (
        f"environment.yml installs {extra}, which pyproject.toml does not list. Add them to"
        " pyproject.toml (dependencies or the dev extra) or remove them from environment.yml."
    )


def test_environment_yml_asks_for_the_same_minimum_versions_as_pyproject():
    conda = _conda_specs()
    differing = {
        name: (str(req.specifier), conda[name])
        for name, req in _pip_requirements().items()
        if name in conda and str(req.specifier) != conda[name]
    }
    assert not differing, f"version specs differ, as (pyproject, environment.yml): {differing}"


def test_environment_yml_pins_python_and_uses_conda_forge():
    assert _environment()["channels"] == ["conda-forge"]
    assert _conda_specs().get("python") == "=3.11"


def test_environment_yml_installs_the_project_itself_with_pip():
    pip_lines = [line.strip() for line in _pip_section()]
    assert "-e ." in pip_lines or "." in pip_lines, (
        f"environment.yml's pip section is {pip_lines}; it must install distlab itself ('-e .')."
    )


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


def test_makefile_installs_pinned_torch_before_the_rest():
    # Any other torch requirement makes pip fetch gigabytes of CUDA wheels on the course machine.
    makefile = (ROOT / "Makefile").read_text()
    assert "pip install -q torch==2.13.0" in makefile, "Makefile must install torch==2.13.0 alone"
    # The [dev] install depends on the torch stamp, so pip finds torch already there.
    deps_rule = re.search(r"^\$\(VENV\)/\.stamp-deps:(.*)$", makefile, flags=re.MULTILINE)
    assert deps_rule, "Makefile has no $(VENV)/.stamp-deps rule"
    assert "$(VENV)/.stamp-torch" in deps_rule.group(1).split()


def test_ruff_is_configured_in_pyproject():
    ruff = _pyproject()["tool"].get("ruff", {})
    assert ruff.get("line-length") == 100
    assert set(ruff.get("lint", {}).get("select", [])) >= {"E", "F", "W", "I", "B", "UP"}
