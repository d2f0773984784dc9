"""``python -m distlab doctor``: a checklist to run before a workshop.

Each line is ✓ (fine) or ✗ (with what to do). Exit status 0 when everything needed is fine.
"""

from __future__ import annotations

import platform
import sys
import time
from dataclasses import dataclass
from importlib import metadata


@dataclass
class Check:
    """One line of the checklist. ``ok=None``: the check could not look (shown ``?``, never
    ``✓``); ``required=False``: a failure is information (``–``), not a problem."""

    ok: bool | None
    text: str
    fix: str = ""
    required: bool = True

    def line(self) -> str:
        if self.ok is None:
            mark = "?"
        else:
            mark = "✓" if self.ok else ("✗" if self.required else "–")
        return f"{mark} {self.text}" + ("" if self.ok or not self.fix else f"\n    fix: {self.fix}")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def check_python() -> Check:
    v = platform.python_version()
    return Check(
        sys.version_info >= (3, 11),
        f"Python {v}",
        "install Python 3.11 or newer (torch 2.15 needs it; make lab uses python3 from your PATH)",
    )


def check_torch() -> Check:
    from . import _torch

    try:
        import torch
    except ImportError:
        fix = f"run `make lab` (installs torch=={_torch.LOCKED})"
        return Check(False, "torch is not installed", fix)
    version = torch.__version__.split("+")[0]
    major, minor = (int(x) for x in version.split(".")[:2])
    if (major, minor) < (2, 4):
        return Check(False, f"torch {torch.__version__}",
                     f"upgrade torch to 2.4 or newer (the course is tested on {_torch.LOCKED})")
    tried = ", ".join(_torch.TRIED)
    note = "" if version == _torch.LOCKED else (
        f" (the notebooks' outputs were made with {_torch.LOCKED}; tried on {tried}: the "
        "README's 'Which torch' says what prints differently on yours)")
    return Check(True, f"torch {torch.__version__}{note}", "")


def check_gloo() -> Check:
    try:
        import torch.distributed as dist
    except ImportError:
        return Check(False, "torch.distributed is missing", "install a torch build with it")
    ok = dist.is_available() and dist.is_gloo_available()
    return Check(ok, "torch.distributed with the gloo backend", "install the official torch wheel")


def check_cores() -> Check:
    from ._config import cgroup_cpu_limit, cpu_cores

    cores, quota = cpu_cores(), cgroup_cpu_limit()
    where = f" (a cgroup quota of {quota:g} CPUs: a JupyterHub or container limit)" if quota else ""
    return Check(
        True,
        f"{cores} CPU core(s){where}: world sizes up to {max(2, cores)} run at full speed; up to "
        f"{max(6, 2 * cores)} work (oversubscribed: each rank then gets 1 thread)",
    )


_PATHS = {
    "forkserver": "forkserver: ranks forked from a helper that has imported torch",
    "spawn": "spawn: a fresh interpreter per rank, from a pool of spares that import torch ahead",
}


def check_launch(world_size: int = 4) -> tuple[Check, Check]:
    """Two real launches with an all_reduce (the first starts the ranks' helper, the second,
    after a pause, is what a learner's launch costs); also checks every listening socket is on
    loopback."""
    from . import launch
    from ._ranks import start_path

    try:
        method = start_path.check_method(None)
        t0 = time.perf_counter()
        launch(_doctor_rank, world_size=world_size, backend="gloo", timeout=60)
        first = time.perf_counter() - t0
        time.sleep(3.0)  # what a learner spends reading: the helper (or the spares) warm up
        t0 = time.perf_counter()
        result = launch(_doctor_rank, world_size=world_size, backend="gloo", timeout=60)
        warm = time.perf_counter() - t0
    except Exception as e:  # report, never crash the checklist
        head = str(e).splitlines()[0] if str(e) else type(e).__name__
        fail = Check(False, f"{world_size}-rank launch failed: {head}",
                     "run `python -m distlab doctor` in a terminal and read the full error")
        return fail, Check(None, "loopback-only sockets: not checked (the launch failed)")
    expected = float(sum(range(1, world_size + 1)))
    ok = [r["sum"] for r in result] == [expected] * world_size
    launched = Check(
        ok,
        f"{world_size}-rank launch with all_reduce, result {'correct' if ok else 'WRONG'}: "
        f"{warm:.2f} s (the first {first:.2f} s); start path {_PATHS[method]}",
        "a rank computed a wrong all_reduce: please report this with the output above",
    )
    return launched, loopback_check([r["listening"] for r in result])


def loopback_check(listening: list[list[str] | None]) -> Check:
    """The verdict on the addresses each rank listened on (None: that rank could not list
    them)."""
    if any(x is None for x in listening):
        blind = [r for r, x in enumerate(listening) if x is None]
        return Check(
            None,
            "could not list the sockets the ranks listen on (rank(s) "
            f"{', '.join(map(str, blind))}): loopback-only not checked",
            "install psutil (`make lab` does); on macOS, run the doctor as the user who runs "
            "the course",
        )
    addrs = sorted({a for x in listening for a in x})
    public = [a for a in addrs if not (a.startswith("127.") or a == "::1")]
    return Check(
        not public,
        "every socket the ranks listen on is on loopback ("
        + (", ".join(addrs) if addrs else "none")
        + ")"
        if not public
        else f"ranks listen on {', '.join(public)}: reachable from the network",
        "set GLOO_SOCKET_IFNAME=lo (and report this: distlab should have)",
    )


def _doctor_rank():
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    listening = _listening_addresses()
    dist.barrier()
    return {"sum": t.item(), "listening": listening}


def _listening_addresses() -> list[str] | None:
    """IP addresses this process listens on (TCP), or None if they cannot be listed."""
    try:
        import psutil

        conns = psutil.Process().net_connections(kind="inet")
    except Exception:  # psutil missing, or not allowed to look (psutil.AccessDenied)
        return None
    return sorted({c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN})


def check_package(dist: str, what: str) -> Check:
    v = _version(dist)
    return Check(v is not None, f"{what} {v or 'is not installed'}", "run `make lab`")


def check_gpus() -> Check:
    try:
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        n = 0
    if n:
        return Check(True, f"{n} CUDA GPU(s): backend='auto' uses NCCL for up to {n} ranks")
    return Check(False, "no CUDA GPU: every notebook runs on CPU with gloo (that is fine)",
                 required=False)


def check_fork_safety() -> Check:
    """Which start path ranks take, and under macOS's rules the canary's verdict."""
    from ._ranks import forksafety, forkserver, start_path

    method = start_path.default_method()
    reason = forksafety.unsafe_reason()
    if reason is not None:
        return Check(False, f"ranks spawn (fresh interpreters, slower): forking was found "
                            f"unsafe here: {reason}", "report this, with the line above",
                     required=False)
    if method != "forkserver":
        return Check(True, f"start path: {_PATHS.get(method, method)}")
    if not forksafety.macos_rules():
        return Check(True, f"start path: {_PATHS['forkserver']} (Linux)")
    server = forkserver.get()
    try:
        server.wait_ready(120)
    except forksafety.ForkUnsafe as e:
        forksafety.mark_unsafe(str(e))
        return Check(False, f"ranks spawn (fresh interpreters, slower): the fork canary failed: "
                            f"{e}", "report this, with the line above", required=False)
    return Check(True, f"start path: {_PATHS['forkserver']}, under macOS's rules (a helper that "
                       f"never had a thread); canary passed: {server.canary.detail}")


def run() -> int:
    checks = [check_python(), check_torch(), check_gloo(), check_cores()]
    if all(c.ok for c in checks[:3]):
        checks.append(check_fork_safety())
        checks.extend(check_launch())
    checks += [
        check_package("jupyterlab", "JupyterLab"),
        check_package("ipywidgets", "ipywidgets"),
        check_package("matplotlib", "matplotlib"),
        check_package("cloudpickle", "cloudpickle"),
        check_gpus(),
    ]
    from . import __version__

    print(f"distlab {__version__} doctor")
    for c in checks:
        print(c.line())
    bad = [c for c in checks if c.required and c.ok is False]
    blind = [c for c in checks if c.ok is None]
    if bad:
        print(f"{len(bad)} problem(s) above")
    elif blind:
        print(f"no problem found, but {len(blind)} check(s) could not look (marked ?)")
    else:
        print("all good: you are ready for the workshop")
    return 0 if not bad else 1
