"""Inside the fork server: import torch once, then fork a rank for each request.

Runs as ``python -c "...serve(fd)"``, started by `distlab._ranks.forkserver.ForkServer`, with a
clean exec (no threads or locks inherited from the kernel). It imports `PRELOAD`, says `Ready`,
and waits on its socket for `Fork` requests; each carries one rank's three file descriptors. The
child of each fork becomes that rank (`distlab._ranks.rank.rank_main`). Forking a
single-threaded process that already has torch loaded takes milliseconds.

While idle it goes on warming up: it imports `LATE_PRELOAD` one module at a time, then moves its
memory onto huge pages (`_collapse`), and says `Settled`; a `Hold` from the kernel pauses that
between two steps, until the kernel lets go. It reaps its children and reports their
exit status (`Exited`), since the kernel is not their parent and cannot ``waitpid`` them. When the
kernel goes away the socket closes and the server exits.
"""

from __future__ import annotations

import importlib
import os
import select
import signal
import socket
import sys
import threading  # importing it starts no thread; a test hook starts one (forksafety)
import time
import traceback

from .._patience import patience
from . import forksafety, protocol
from .protocol import recv, send
from .starter import PRELOAD  # imported before `Ready`, so every rank starts with them loaded

#: Imported once the server has been idle for `_IDLE` seconds, one module at a time, until the
#: next request comes in. Constructing DDP, FSDP or a DTensor imports torch._dynamo and friends:
#: ~2 s per rank, 11 s when four ranks do it at once on two cores. Importing them here, after
#: `Ready`, keeps the first launch quick and makes every later rank start warm. torch._dynamo
#: comes first, in one piece (1.8 s): a launch that arrives meanwhile waits for it, which costs
#: less than ranks that each import it themselves (see the history of this file for the numbers).
LATE_PRELOAD = (
    "torch._dynamo",
    "torch.distributed.algorithms.ddp_comm_hooks",
    "torch.distributed.fsdp",
    "torch.distributed.nn",
    "torch.distributed.rpc",
    "torch.distributed.tensor",
    "torch.distributed.tensor.parallel",
    "torch.distributed.optim",  # ZeroRedundancyOptimizer: ~2.7 s, scripting at import
    "torch.distributed.checkpoint",  # DCP (notebooks 17, 24, 27): ~1 s per rank at first save
)
_IDLE = 0.3

#: Linux 6.1+ `madvise(MADV_COLLAPSE)`: back a range with 2 MiB transparent huge pages, now.
_MADV_COLLAPSE = 25
_HUGE = 2 << 20


def serve(sock_fd: int) -> None:
    """Main loop of the fork server process."""
    sock = socket.socket(fileno=sock_fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in a terminal is the kernel's business
    try:
        for name in PRELOAD:
            importlib.import_module(name)
    except BaseException:
        send(sock, protocol.Failed(traceback.format_exc()))
        return

    # SIGCHLD wakes the select loop through a pipe, so exits are reported promptly.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    if forksafety.strict() and os.environ.get(forksafety.ENV_TEST_THREAD) == "early":
        _test_thread()
    try:
        send(sock, protocol.Ready(os.getpid()))
        _loop(sock, wake_r, wake_w)
    except OSError:
        pass  # the kernel went away (e.g. `python -c "import distlab"` exited at once)


def _loop(sock: socket.socket, wake_r: int, wake_w: int) -> None:
    children: set[int] = set()
    late = list(LATE_PRELOAD)
    huge: list[int] | None = None  # 2 MiB pieces still to collapse; None: not listed yet
    settled = False
    held = False  # the kernel asked for the cores (protocol.Hold)
    while True:
        wait = None if settled or held else _IDLE
        readable, _, _ = select.select([sock, wake_r], [], [], wait)
        if not readable:  # idle: warm up, step by step, until a request comes in
            while late and not select.select([sock, wake_r], [], [], 0)[0]:
                try:  # single-threaded, so forks stay safe
                    importlib.import_module(late.pop(0))
                except Exception:
                    pass  # a rank that needs it will import it itself, and report any error there
            if not late and huge is None:
                huge = _private_memory()  # after the imports: they allocate most of it
            if huge:
                _collapse(huge, [sock, wake_r])
            if not late and huge == []:
                settled = True
                send(sock, protocol.Settled())
            continue
        if wake_r in readable:
            os.read(wake_r, 4096)
            _reap(sock, children)
        if sock not in readable:
            continue
        try:
            msg, fds = recv(sock)
        except (EOFError, OSError):
            break  # the kernel is gone; ranks notice on their own pipes and exit too
        if isinstance(msg, protocol.Canary):
            send(sock, _run_canary(sock, wake_r, wake_w))
            continue
        if isinstance(msg, protocol.Hold):
            held = msg.on
            continue
        if not isinstance(msg, protocol.Fork):
            for fd in fds:
                os.close(fd)
            continue
        threads = forksafety.threads() if forksafety.strict() else 1
        if threads > 1:
            for fd in fds:
                os.close(fd)
            send(sock, protocol.Unsafe(msg.token, f"the helper has {threads} threads "
                                         "(it must never have had more than one)"))
            continue
        pid = os.fork()
        if pid == 0:
            _become_rank(sock, wake_r, wake_w, fds, msg)
        for fd in fds:
            os.close(fd)
        children.add(pid)
        send(sock, protocol.Forked(msg.token, pid))
        _reap(sock, children)


def _test_thread() -> None:
    """A test's doing (``DISTLAB_TEST_HELPER_THREAD``): a helper that is no longer alone."""
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()


def _run_canary(sock, wake_r: int, wake_w: int) -> protocol.CanaryDone:
    """Fork a child that does what ranks do (`forksafety.canary`); judge its exit and stderr."""
    try:
        return _canary_verdict(sock, wake_r, wake_w)
    finally:
        if os.environ.get(forksafety.ENV_TEST_THREAD) == "late":
            _test_thread()


def _canary_verdict(sock, wake_r: int, wake_w: int) -> protocol.CanaryDone:
    if forksafety.threads() > 1:
        return protocol.CanaryDone(
            False, f"the helper has {forksafety.threads()} threads before forking")
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            _leave_server(sock, wake_r, wake_w)
            os.close(err_r)
            os.dup2(err_w, 2)
            code = forksafety.canary()
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(err_w)
    chunks, deadline = [], time.monotonic() + patience(60)  # 60 s on a quiet machine
    while time.monotonic() < deadline:
        if select.select([err_r], [], [], 0.1)[0]:
            chunk = os.read(err_r, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    os.close(err_r)
    status = None
    while time.monotonic() < deadline and status is None:
        done, raw = os.waitpid(pid, os.WNOHANG)
        status = os.waitstatus_to_exitcode(raw) if done else None
        if status is None:
            time.sleep(0.01)
    if status is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    err = b"".join(chunks).decode("utf-8", "replace")
    marker = forksafety.marker_in(err)
    if status != 0 or marker:
        why = marker or (err.strip().splitlines() or ["no message"])[-1]
        how = "did not finish in 60 s" if status is None else f"exited with {status}"
        return protocol.CanaryDone(False, f"a forked test process {how}: {why}")
    return protocol.CanaryDone(True, "a forked child ran a matmul, a NumPy dot, a loopback "
                                     "lookup and a one-rank gloo group cleanly")


def _become_rank(sock, wake_r: int, wake_w: int, fds: list[int], msg: protocol.Fork) -> None:
    """In the child of a fork: drop the server's state and run the rank. Never returns."""
    code = 70
    try:
        _leave_server(sock, wake_r, wake_w)
        from .rank import rank_main

        code = rank_main(*fds, msg.spec)
    except BaseException:
        try:
            traceback.print_exc()
            sys.stderr.flush()
        except BaseException:
            pass
    finally:
        os._exit(code)


def _leave_server(sock, wake_r: int, wake_w: int) -> None:
    """In a forked child: the server's signal handling and descriptors are not the child's."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sock.close()
    os.close(wake_r)
    os.close(wake_w)


def _private_memory() -> list[int]:
    """Start addresses of the 2 MiB-aligned pieces of the server's private writable memory."""
    pieces = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split()
                if "w" not in fields[1] or (len(fields) > 5 and fields[5] != "[heap]"):
                    continue  # read-only, file-backed, the stack, ...
                start, end = (int(x, 16) for x in fields[0].split("-"))
                pieces.extend(range(-(-start // _HUGE) * _HUGE, end // _HUGE * _HUGE, _HUGE))
    except OSError:
        pass
    return pieces


def _collapse(pieces: list[int], wake: list) -> None:
    """Move the server's memory onto huge pages, one 2 MiB piece at a time (~8 ms each), until
    done or a request arrives.

    Forking copies the parent's page tables, and exiting frees the child's: with torch and the
    late modules loaded that is ~200 MiB of 4 KiB pages, 6-9 ms per fork and per exit. On huge
    pages both take 2-3 ms (measured), and a launch does one of each per rank. Where the kernel
    cannot (older than 6.1, or THP turned off), madvise fails and nothing changes.
    """
    import ctypes

    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        pieces.clear()
        return
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    while pieces and not select.select(wake, [], [], 0)[0]:
        madvise(pieces.pop(), _HUGE, _MADV_COLLAPSE)


def _reap(sock: socket.socket, children: set[int]) -> None:
    for pid in list(children):
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            children.discard(pid)
            continue
        if done:
            children.discard(pid)
            try:
                send(sock, protocol.Exited(pid, status))
            except OSError:
                pass
