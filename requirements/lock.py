"""Write requirements/lock.txt: the exact version of every package `make lab` and `make test`
install, transitive ones included, for every platform and Python the course supports.

`make lock` runs this on purpose (to take newer releases); nothing else ever resolves versions.
Run it with the .venv's Python, in which torch is already installed.

torch itself is not in the lock. The Makefile installs ``torch==2.14.1`` first (on the course
machine a CUDA build from this machine's disk, which runs on the CPU; from PyPI elsewhere, a CUDA
build on Linux and a CPU build on macOS), with this lock as its constraints, so torch's own
dependencies are locked too: the resolver is told to leave torch out and is given the installed
torch's dependencies (on Linux the ``nvidia-*`` CUDA libraries and triton, marked for Linux) in
its place. ``--keep`` keeps every pin that still fits, so that a new torch moves only what it
needs; without it every package moves to its newest release.

uv resolves (``uv pip compile --universal``): one file with environment markers for Linux, macOS
and Windows (WSL2 is Linux) and Python 3.11 and later (torch 2.15 needs 3.11); pip installs from it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LOCK = HERE / "lock.txt"
HEADER = """\
# The exact version of every package `make lab` / `make test` install (transitive ones too), for
# Linux, macOS and Python >= 3.11: written by `make lock` (requirements/lock.py), never by hand.
# torch is not here: the Makefile installs torch=={torch} first, with this file as constraints.
# Refresh it on purpose: `make test-latest` first (the newest releases pyproject.toml allows),
# then `make lock` and `make test`, and commit the lock with the notebooks it passed with.
"""


def torch_dependencies() -> list[str]:
    """What the installed torch needs at run time, extras left out."""
    reqs = [Requirement(r) for r in importlib.metadata.requires("torch") or []]
    return sorted(str(r) for r in reqs if not (r.marker and "extra" in str(r.marker)))


def locked(path: Path = LOCK) -> dict[str, str]:
    """name -> version, for the lines of the lock whose markers hold for this Python."""
    from packaging.utils import canonicalize_name

    pins = {}
    for line in path.read_text().splitlines():
        line = line.split(" #")[0].strip()
        if line and line[0].isalnum():
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate():
                pins[canonicalize_name(req.name)] = next(iter(req.specifier)).version
    return pins


def diff() -> int:
    """Print how what is installed here differs from the lock (`make test-latest` calls it)."""
    from packaging.utils import canonicalize_name

    pins = locked()
    installed = {canonicalize_name(d.metadata["Name"]): d.version
                 for d in importlib.metadata.distributions()}  # fmt: skip
    rows = [(name, pins[name], installed.get(name, "-")) for name in sorted(pins)
            if installed.get(name) != pins[name]]  # fmt: skip
    rows += [(name, "-", v) for name, v in sorted(installed.items())
             if name not in pins and name not in ("distlab", "torch", "pip", "uv")]  # fmt: skip
    if not rows:
        print("installed = the lock: nothing newer than requirements/lock.txt")
        return 0
    width = max(len(r[0]) for r in rows)
    print(f"{len(rows)} package(s) differ from requirements/lock.txt:")
    print(f"{'package':<{width}}  {'locked':>12}  {'installed':>12}")
    for name, old, new in rows:
        print(f"{name:<{width}}  {old:>12}  {new:>12}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--uv", default="uv", help="the uv executable")
    parser.add_argument("--output", type=Path, default=LOCK)
    parser.add_argument("--diff", action="store_true",
                        help="only print how the installed packages differ from the lock")
    parser.add_argument("--keep", action="store_true",
                        help="keep every pin the lock already has where it still fits (a new "
                             "torch: only its own dependencies move); default: take the newest")
    args = parser.parse_args()
    if args.diff:
        return diff()

    torch_version = importlib.metadata.version("torch").split("+")[0]
    deps = HERE / "torch.in"
    deps.write_text(
        f"# What torch {torch_version} (the build installed by `make setup`) needs at run time,\n"
        "# written by requirements/lock.py: torch's dependencies are locked, torch is pinned in\n"
        "# the Makefile.\n" + "\n".join(torch_dependencies()) + "\n"
    )
    # An override with a marker that never holds takes torch out of the resolution.
    override = HERE / "without-torch.txt"
    override.write_text(
        "# Read by requirements/lock.py: torch is pinned in the Makefile, not resolved.\n"
        f'torch=={torch_version} ; sys_platform == "never"\n'
    )
    command = [
        args.uv, "pip", "compile", "pyproject.toml", "--extra", "dev",
        str(deps.relative_to(ROOT)), "--override", str(override.relative_to(ROOT)),
        "--no-emit-package", "torch", "--universal", "--python-version", "3.11",
        "--no-header", "--quiet", "-o", str(args.output),
    ] + ([] if args.keep else ["--upgrade"])  # fmt: skip
    subprocess.run(command, cwd=ROOT, check=True)
    body = args.output.read_text()
    args.output.write_text(HEADER.format(torch=torch_version) + body)
    pins = [line for line in body.splitlines() if line[:1].isalnum()]
    print(f"wrote {args.output.relative_to(ROOT)}: {len(pins)} pinned versions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
