"""The zygote: one warm Python process, with torch imported, that forks the ranks.

Why not fork the notebook kernel? The kernel runs threads (ZMQ, heartbeats, torch's own pools), and
a fork taken while another thread holds a lock gives a child that hangs forever on that lock.
Why not spawn a fresh interpreter per rank? Each would spend ~1.5 s importing torch.

So the kernel starts this process once, with a clean exec (no inherited threads or locks). It
imports torch, then waits on a Unix socket for "fork" requests. Each request carries the file
descriptors of one rank's pipes (passed with SCM_RIGHTS); the zygote forks, and the child becomes
the rank (see `_child.rank_main`). Forking a single-threaded process that already has torch loaded
takes milliseconds.

While idle, the zygote goes on warming up: it imports the modules DDP, FSDP and RPC need
(`LATE_PRELOAD`), then moves its memory onto huge pages so that forking and exiting cost less
(`_collapse`), and then tells the kernel it has settled.

The zygote also reaps its children and reports their exit status, because the kernel is not their
parent and cannot `waitpid` them. When the kernel goes away the socket closes and the zygote exits.

This module holds both sides: `serve()` runs inside the zygote, `Zygote` is the kernel's handle.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading

#: Modules imported once in the zygote, so that every rank starts with them loaded.
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.distributed.distributed_c10d",
    "torch.nn",
    "torch.nn.parallel",
    "torch.optim",
    "cloudpickle",
    "distlab._child",
)

#: Imported later, once the zygote has been idle for `_IDLE` seconds: one module at a time, until
#: the next request comes in (and after the next idle `_IDLE` seconds, on from there).
#: Constructing DDP, FSDP or a DTensor imports torch._dynamo and friends: ~2 s per rank, and 11 s
#: when four ranks do it at once on two cores (measured). Importing them here, after the zygote has
#: said it is ready, keeps the first launch quick and makes every later DDP rank start warm.
#: torch._dynamo comes first, in one piece (1.8 s): a launch that arrives meanwhile waits for it,
#: and that is the better deal. Importing its parts first instead (sympy, DTensor, FSDP) shortened
#: the longest wait to 0.9 s, but then the six ranks of notebook 13's hybrid model were forked
#: without torch._dynamo and each imported it itself: 4 s -> 9-14 s for that cell (measured).
LATE_PRELOAD = (
    "torch._dynamo",
    "torch.distributed.algorithms.ddp_comm_hooks",
    "torch.distributed.fsdp",
    "torch.distributed.nn",
    "torch.distributed.rpc",
    "torch.distributed.tensor",
    "torch.distributed.tensor.parallel",
)
_IDLE = 0.3

#: Linux 6.1+ `madvise(MADV_COLLAPSE)`: back a range with 2 MiB transparent huge pages, now.
_MADV_COLLAPSE = 25
_HUGE = 2 << 20

_MAX_MSG = 1 << 20
_MAX_FDS = 8


def _send(sock: socket.socket, msg: object, fds: list[int] = ()) -> None:
    data = pickle.dumps(msg)
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.sendall(data)


def _recv(sock: socket.socket):
    data, fds, _flags, _addr = socket.recv_fds(sock, _MAX_MSG, _MAX_FDS)
    if not data:
        for fd in fds:
            os.close(fd)
        raise EOFError
    return pickle.loads(data), fds


# ----------------------------------------------------------------------------------------------
# Inside the zygote
# ----------------------------------------------------------------------------------------------


def serve(sock_fd: int) -> None:
    """Main loop of the zygote process (runs `python -c "...serve(fd)"`)."""
    import traceback

    sock = socket.socket(fileno=sock_fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in a terminal is the kernel's business
    try:
        import importlib

        for name in PRELOAD:
            importlib.import_module(name)
    except BaseException:
        _send(sock, ("error", traceback.format_exc()))
        return

    # SIGCHLD wakes the select loop through a pipe, so exits are reported promptly.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    try:
        _send(sock, ("ready", os.getpid()))
        _loop(sock, wake_r, wake_w)
    except OSError:
        pass  # the kernel went away (e.g. `python -c "import distlab"` exited at once)


def _loop(sock: socket.socket, wake_r: int, wake_w: int) -> None:
    import importlib
    import select
    import traceback

    children: set[int] = set()
    late = list(LATE_PRELOAD)
    huge: list[int] | None = None  # 2 MiB pieces still to collapse; None: not listed yet
    settled = False
    while True:
        readable, _, _ = select.select([sock, wake_r], [], [], None if settled else _IDLE)
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
                _send(sock, ("settled",))
            continue
        if wake_r in readable:
            os.read(wake_r, 4096)
            _reap(sock, children)
        if sock not in readable:
            continue
        try:
            msg, fds = _recv(sock)
        except (EOFError, OSError):
            break  # the kernel is gone; ranks notice on their own pipes and exit too
        kind, token, spec = msg
        if kind != "fork":
            for fd in fds:
                os.close(fd)
            continue
        pid = os.fork()
        if pid == 0:  # the new rank
            code = 70
            try:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                sock.close()
                os.close(wake_r)
                os.close(wake_w)
                from distlab._child import rank_main

                code = rank_main(*fds, spec)
            except BaseException:
                try:
                    traceback.print_exc()
                    sys.stderr.flush()
                except BaseException:
                    pass
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        children.add(pid)
        _send(sock, ("forked", token, pid))
        _reap(sock, children)


def _private_memory() -> list[int]:
    """Start addresses of the 2 MiB-aligned pieces of the zygote's private writable memory."""
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
    """Move the zygote's memory onto huge pages, one 2 MiB piece at a time (~8 ms each), until
    done or a request arrives.

    Forking copies the parent's page tables, and exiting frees the child's: with torch and the
    late modules loaded that is ~200 MiB of 4 KiB pages, 6-9 ms per fork and per exit. On huge
    pages both take 2-3 ms (measured), and a launch does one of each per rank. Where the kernel
    cannot (older than 6.1, or THP turned off), madvise fails and nothing changes.
    """
    import ctypes
    import select

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
                _send(sock, ("exited", pid, status))
            except OSError:
                pass


# ----------------------------------------------------------------------------------------------
# In the kernel
# ----------------------------------------------------------------------------------------------


class ZygoteError(RuntimeError):
    """The zygote could not be started (for example, torch failed to import)."""


class Zygote:
    """Kernel-side handle: start the zygote, ask it to fork ranks, learn how they exited."""

    def __init__(self, env: dict[str, str] | None = None):
        self._sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        boot = (
            "import sys, json, os; sys.path[:0] = json.loads(os.environ.pop('DISTLAB_SYS_PATH'));"
            f"from distlab._zygote import serve; serve({child_sock.fileno()})"
        )
        full_env = dict(os.environ if env is None else env)
        full_env["DISTLAB_SYS_PATH"] = json.dumps([p for p in sys.path if p])
        self.proc = subprocess.Popen(
            [sys.executable, "-c", boot],
            pass_fds=[child_sock.fileno()],
            env=full_env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        child_sock.close()
        self._cond = threading.Condition()
        self._forked: dict[int, int] = {}
        self._exited: dict[int, int] = {}
        self._ready = False
        self._settled = False
        self._error: str | None = None
        self._closed = False
        self._token = 0
        self._send_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read_loop, name="distlab-zygote", daemon=True)
        self._reader.start()

    # The reader thread is the only one that receives, so exit reports never pile up unread.
    def _read_loop(self) -> None:
        while True:
            try:
                msg, fds = _recv(self._sock)
            except (EOFError, OSError):
                break
            for fd in fds:
                os.close(fd)
            with self._cond:
                if msg[0] == "ready":
                    self._ready = True
                elif msg[0] == "settled":
                    self._settled = True
                elif msg[0] == "error":
                    self._error = msg[1]
                elif msg[0] == "forked":
                    self._forked[msg[1]] = msg[2]
                elif msg[0] == "exited":
                    self._exited[msg[1]] = msg[2]
                self._cond.notify_all()
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def alive(self) -> bool:
        return not self._closed and self._error is None and self.proc.poll() is None

    def wait_ready(self, timeout: float = 120.0) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._ready or self._error or self._closed, timeout)
            if self._ready:
                return
            if self._error or self._closed:
                raise ZygoteError(
                    "distlab could not start its helper process (the one that imports torch "
                    "once and forks the ranks):\n"
                    + (self._error or f"it exited with code {self.proc.poll()}")
                    + "\nCheck that `import torch` works in this environment."
                )
            raise ZygoteError(
                f"distlab's helper process did not finish importing torch in {timeout:.0f} s"
            )

    def wait_settled(self, timeout: float = 120.0) -> bool:
        """Wait until the zygote has done its idle-time work (late imports, huge pages), so
        that launches from now on are as fast as they get. Benchmarks and tests use this."""
        self.wait_ready(timeout)
        with self._cond:
            self._cond.wait_for(lambda: self._settled or self._closed, timeout)
            return self._settled

    def fork_many(
        self, requests: list[tuple[dict, list[int]]], timeout: float = 120.0
    ) -> list[int]:
        """Fork one rank per ``(spec, fds)`` request (fds: ctrl, dbg, out); return their pids.

        All requests go out before any answer is awaited, so the zygote forks them back to back.
        """
        self.wait_ready(timeout)
        tokens = []
        with self._send_lock:
            for spec, fds in requests:
                self._token += 1
                tokens.append(self._token)
                _send(self._sock, ("fork", self._token, spec), fds)

        def started() -> bool:
            return all(t in self._forked for t in tokens)

        with self._cond:
            self._cond.wait_for(lambda: started() or self._closed, timeout)
            if not started():
                raise ZygoteError(
                    "distlab's helper process exited while starting a rank"
                    if self._closed
                    else "distlab's helper process did not start a rank in time"
                )
            return [self._forked.pop(t) for t in tokens]

    def wait_exit(self, pid: int, timeout: float) -> int | None:
        """Exit code of rank `pid` (negative: killed by that signal), or None if still running."""
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exited or self._closed, timeout)
            if pid not in self._exited:
                return None
            return os.waitstatus_to_exitcode(self._exited.pop(pid))

    def close(self) -> None:
        try:
            self._sock.close()
        finally:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_lock = threading.Lock()
_zygote: Zygote | None = None


def get() -> Zygote:
    """The shared zygote, started on first use (or restarted if it died)."""
    global _zygote
    with _lock:
        if _zygote is None or not _zygote.alive:
            _zygote = Zygote(_zygote_env())
        return _zygote


def warm() -> None:
    """Start the zygote now so torch is imported by the time the first launch needs it."""
    if supported():
        get()


def supported() -> bool:
    return sys.platform.startswith("linux") and hasattr(socket, "send_fds")


def _zygote_env() -> dict[str, str]:
    env = dict(os.environ)
    env["DISTLAB_NO_WARM"] = "1"  # `import distlab` inside the zygote or a rank starts no zygote
    # Import torch with small thread pools; each rank then sets its own budget.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.setdefault(var, "1")
    # torch's Python logging (DTensor's and FSDP's warnings) starts every line with the rank, the
    # time to the microsecond and the pid, so the same warning from four ranks is four different
    # lines. Level, logger and message say what a learner needs, and fold into one line. It is
    # read once, when torch is imported, which happens here. Set it yourself to keep torch's own.
    env.setdefault("TORCH_LOGS_FORMAT", "%(levelname)s %(name)s: %(message)s")
    return env
