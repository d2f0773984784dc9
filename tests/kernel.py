"""A real IPython kernel for tests: code runs exactly as in a notebook cell (``__main__`` is the
kernel's namespace, cells are compiled under ipykernel's temp file names)."""

from __future__ import annotations

import os
import queue
import time
from dataclasses import dataclass, field
from pathlib import Path

from jupyter_client import KernelManager

from distlab._patience import patience

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class CellResult:
    stdout: str = ""
    stderr: str = ""
    error: dict | None = None  # {"ename", "evalue", "traceback"}
    results: list[str] = field(default_factory=list)  # execute_result / display text/plain

    @property
    def ename(self) -> str | None:
        return self.error["ename"] if self.error else None

    @property
    def text(self) -> str:
        """Everything shown, error traceback included (ANSI colours stripped)."""
        import re

        tb = "\n".join(self.error["traceback"]) if self.error else ""
        return re.sub(r"\x1b\[[0-9;]*m", "", self.stdout + self.stderr + tb)


class Kernel:
    def __init__(self, env: dict[str, str] | None = None, cwd: str | os.PathLike = ROOT):
        """`env` is added to this process's environment (a PYTHONPATH given there comes before
        this checkout's); the kernel starts in `cwd`, as a notebook's kernel in its folder."""
        kernel_env = dict(os.environ, **(env or {}))
        kernel_env["PYTHONPATH"] = os.pathsep.join(
            p for p in ((env or {}).get("PYTHONPATH"), str(ROOT)) if p
        )
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(cwd=str(cwd), env=kernel_env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=patience(60))

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid

    def run(
        self, code: str, timeout: float = 120, interrupt_after: float | None = None
    ) -> CellResult:
        msg_id = self.kc.execute(code)
        res = CellResult()
        start = time.monotonic()
        interrupted = False
        while True:
            if interrupt_after is not None and not interrupted:
                if time.monotonic() - start > interrupt_after:
                    self.km.interrupt_kernel()
                    interrupted = True
            try:
                msg = self.kc.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                if time.monotonic() - start > patience(timeout):  # stretched on a busy machine
                    msg = f"cell did not finish in {timeout} s: {code[:200]}"
                    raise TimeoutError(msg) from None
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                if content["name"] == "stdout":
                    res.stdout += content["text"]
                else:
                    res.stderr += content["text"]
            elif kind == "error":
                res.error = content
            elif kind in ("execute_result", "display_data"):
                res.results.append(content["data"].get("text/plain", ""))
            elif kind == "status" and content["execution_state"] == "idle":
                return res

    def shutdown(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)
