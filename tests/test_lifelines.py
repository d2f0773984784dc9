"""No rank outlives its kernel, by each lifeline alone.

A rank has three lifelines: its task loop, which returns when the kernel's end of ``ctrl``
closes (an idle rank); its watch thread, which kills the rank when the kernel's end of ``dbg``
closes (a rank busy in Python or torch, or stuck in C++ with the GIL released); and, on Linux
only, ``PR_SET_PDEATHSIG`` (the OS sends it SIGKILL when its parent dies). macOS has only the
first two, so they are tested here without the third (``DISTLAB_NO_PDEATHSIG=1``), on both start
paths. Break the watch thread and the busy and stuck cases fail. The "kernel" is a plain Python
process that starts the ranks and is then killed with SIGKILL: nothing of it runs any more.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from processes import alive

DRIVER = textwrap.dedent(
    """
    import json, sys, threading, time
    import distlab

    state = sys.argv[1]
    cluster = distlab.Cluster(world_size=2, timeout=600)

    def pdeathsig():
        import ctypes, os
        out = ctypes.c_int(-1)
        ctypes.CDLL(None).prctl(2, ctypes.byref(out))  # PR_GET_PDEATHSIG
        return os.getpid(), out.value

    info = cluster.run(pdeathsig)
    print(json.dumps(info), flush=True)
    body = {
        "idle": None,
        "busy": "x = torch.ones(64, 64)\\nwhile True:\\n    x = (x @ x).clamp(-1, 1)",
        "stuck": "if rank == 0:\\n    dist.all_reduce(torch.ones(1))\\nelse:\\n    time.sleep(600)",
    }[state]
    if body:
        cluster.exec("import time")
        threading.Thread(target=cluster.exec, args=(body,), daemon=True).start()
        time.sleep(1.0)  # let the ranks get into that state
    print("ready", flush=True)
    time.sleep(600)
    """
)


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
@pytest.mark.parametrize("state", ["idle", "busy", "stuck"])
def test_without_pdeathsig_ranks_end_when_the_kernel_is_killed(method, state):
    env = dict(os.environ, DISTLAB_NO_PDEATHSIG="1", DISTLAB_START_METHOD=method)
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, state],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pids = []
    try:
        info = json.loads(driver.stdout.readline() or "null")
        assert info, driver.stderr.read()
        pids = [pid for pid, _ in info]
        assert [sig for _, sig in info] == [0, 0], "PDEATHSIG was on: the test would prove nothing"
        assert driver.stdout.readline().strip() == "ready"
        assert alive(pids) == pids
        os.kill(driver.pid, signal.SIGKILL)
        killed = time.monotonic()
        while alive(pids) and time.monotonic() - killed < 10:
            time.sleep(0.05)
        assert not alive(pids), f"{state} ranks outlived their kernel ({method})"
        assert time.monotonic() - killed < 5
    finally:
        driver.kill()
        driver.wait()
        for pid in alive(pids):  # a failed test leaves no rank behind either
            os.kill(pid, signal.SIGKILL)
