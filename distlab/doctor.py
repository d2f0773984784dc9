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
    ok: bool
    text: str
    fix: str = ""
    required: bool = True

    def line(self) -> str:
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
        sys.version_info >= (3, 10),
        f"Python {v}",
        "install Python 3.10 or newer (make lab uses python3 from your PATH)",
    )


def check_torch() -> Check:
    try:
        import torch
    except ImportError:
        return Check(False, "torch is not installed", "run `make lab` (installs torch==2.13.0)")
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    return Check(
        (major, minor) >= (2, 4),
        f"torch {torch.__version__}",
        "upgrade torch to 2.4 or newer (the course is tested on 2.13.0)",
    )


def check_gloo() -> Check:
    try:
        import torch.distributed as dist
    except ImportError:
        return Check(False, "torch.distributed is missing", "install a torch build with it")
    ok = dist.is_available() and dist.is_gloo_available()
    return Check(ok, "torch.distributed with the gloo backend", "install the official torch wheel")


def check_cores() -> Check:
    from ._config import cpu_cores

    cores = cpu_cores()
    return Check(
        True,
        f"{cores} CPU core(s): world sizes up to {max(2, cores)} run at full speed; up to "
        f"{max(6, 2 * cores)} work (oversubscribed: each rank then gets 1 thread)",
    )


def check_launch(world_size: int = 4) -> tuple[Check, Check]:
    """A real launch with an all_reduce; also checks every listening socket is on loopback."""
    from . import launch

    t0 = time.perf_counter()
    try:
        result = launch(_doctor_rank, world_size=world_size, backend="gloo", timeout=60)
    except Exception as e:  # report, never crash the checklist
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        fail = Check(False, f"{world_size}-rank launch failed: {first}",
                     "run `python -m distlab doctor` in a terminal and read the full error")
        return fail, Check(False, "loopback-only sockets: not checked (launch failed)")
    seconds = time.perf_counter() - t0
    expected = float(sum(range(1, world_size + 1)))
    ok = [r["sum"] for r in result] == [expected] * world_size
    launched = Check(
        ok,
        f"{world_size}-rank launch with all_reduce: {seconds:.2f} s, result "
        f"{'correct' if ok else 'WRONG'}",
        "a rank computed a wrong all_reduce: please report this with the output above",
    )
    addrs = sorted({a for r in result for a in r["listening"]})
    public = [a for a in addrs if not (a.startswith("127.") or a == "::1")]
    loop = Check(
        not public and result[0]["listening"] is not None,
        "every socket the ranks listen on is on loopback ("
        + (", ".join(addrs) if addrs else "none")
        + ")",
        f"ranks listen on {', '.join(public)}: set GLOO_SOCKET_IFNAME=lo and report this",
    )
    return launched, loop


def _doctor_rank():
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    listening = _listening_addresses()
    dist.barrier()
    return {"sum": t.item(), "listening": listening}


def _listening_addresses() -> list[str]:
    """IP addresses this process listens on (TCP), from /proc (Linux) or psutil."""
    try:
        import psutil

        return sorted(
            {
                c.laddr.ip
                for c in psutil.Process().net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN
            }
        )
    except ImportError:
        return []


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


def run() -> int:
    checks = [check_python(), check_torch(), check_gloo(), check_cores()]
    if all(c.ok for c in checks[:3]):
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
    bad = [c for c in checks if c.required and not c.ok]
    print("all good: you are ready for the workshop" if not bad else f"{len(bad)} problem(s) above")
    return 0 if not bad else 1
