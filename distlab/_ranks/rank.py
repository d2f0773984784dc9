"""The rank's side: set up output capture, the environment and the process group, then serve
tasks from the kernel until told to stop (or until the kernel disappears).

A rank talks to the kernel over three channels, all created by the kernel (the messages are in
`distlab._ranks.protocol`):

* ``ctrl`` -- tasks in, replies out (the main thread).
* ``dbg``  -- a watch thread: answers "where are you stuck?" with the main thread's Python stack,
  and kills the rank the moment the kernel's end closes (kernel restarted or killed).
* ``out``  -- fds 1 and 2 are redirected here, so prints *and* C++ warnings (gloo, c10d) are caught.
  After each task the rank writes an end marker, so the kernel knows the task's output is complete.
"""

from __future__ import annotations

import ast
import io
import linecache
import os
import signal
import sys
import threading
import traceback
import types
from multiprocessing.connection import Connection

from .. import _torch
from . import protocol
from .protocol import Began, Exit, Failure, RankSpec, Reply, Run, Started

#: Objects that must outlive `rank_main` until os._exit (see `_Rank.finish`).
_KEEP: list = []

_THIS_FILE = __file__.removesuffix("c") if __file__.endswith(".pyc") else __file__

#: What the rank is doing while it starts, for the kernel's "did not start in time" report.
_phase = "starting"


def rank_main(ctrl_fd: int, dbg_fd: int, out_fd: int, spec: RankSpec) -> int:
    """Entry point of a rank. Returns the process exit code."""
    try:
        os.setsid()  # own process group: the kernel can kill the rank and whatever it started
    except OSError:
        pass
    _die_with_parent()
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    os.close(out_fd)
    sys.stdout = sys.__stdout__ = _text_stream(1)
    sys.stderr = sys.__stderr__ = _text_stream(2)

    import faulthandler

    # A segfault prints the Python stack into the rank's output.
    faulthandler.enable(file=sys.stderr, all_threads=False)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=False)
    signal.signal(signal.SIGINT, signal.default_int_handler)

    os.environ.update(spec.env)
    try:
        os.chdir(spec.cwd)
    except OSError:
        pass
    ctrl = Connection(ctrl_fd)
    dbg = Connection(dbg_fd)
    watch = threading.Thread(
        target=_watch, args=(dbg, threading.main_thread().ident), name="distlab-watch", daemon=True
    )
    watch.start()

    rank = _Rank(spec, ctrl)
    try:
        rank.start()
        ctrl.send_bytes(protocol.encode(Started()))
        rank.serve()
    finally:
        rank.finish()
        _flush()
    return 0


def _text_stream(fd: int) -> io.TextIOWrapper:
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(
        raw, encoding="utf-8", errors="backslashreplace", line_buffering=True, write_through=True
    )


def _die_with_parent() -> None:
    """Linux: get SIGKILL when our parent (the fork server, or on the spawn path the kernel)
    dies. A backstop for the watch thread, which macOS does not have.
    ``DISTLAB_NO_PDEATHSIG=1`` leaves the watch thread as the only lifeline, as on macOS (the
    tests use it to check that lifeline alone)."""
    if not sys.platform.startswith("linux") or os.environ.get("DISTLAB_NO_PDEATHSIG"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)  # C stdio buffers (printf from extensions)
    except (OSError, AttributeError):
        pass


def _watch(dbg: Connection, main_ident: int) -> None:
    while True:
        try:
            request = dbg.recv_bytes()
        except (EOFError, OSError):
            # The kernel closed our lifeline: it shut us down, restarted, or was killed.
            try:
                os.killpg(0, signal.SIGKILL)
            finally:
                os._exit(1)
        if request == protocol.PHASE:
            try:
                dbg.send_bytes(_phase.encode())
            except OSError:
                pass
        elif request == protocol.STACK:
            frame = sys._current_frames().get(main_ident)
            text = format_stack(frame) if frame is not None else "(no Python frame)\n"
            try:
                dbg.send_bytes(text.encode())
            except OSError:
                pass


_HERE = os.path.dirname(_THIS_FILE) + os.sep


def _is_internal(filename: str) -> bool:
    """distlab's machinery (this package: the rank's loop, the fork server), and the ``-c``
    command that started the interpreter."""
    return filename.startswith(_HERE) or filename == "<string>"


def format_stack(frame: types.FrameType) -> str:
    """The stack of ``frame``, outermost first, without distlab's frames and the import
    machinery's (``<frozen importlib._bootstrap>``: a rank importing torch shows the modules)."""
    entries = [
        fs
        for fs in traceback.extract_stack(frame)
        if not _is_internal(fs.filename) and not fs.filename.startswith("<frozen ")
    ]
    return "".join(traceback.format_list(entries))


def format_exception(exc: BaseException) -> str:
    """The traceback of `exc` without distlab's own frames, with cell sources where known."""
    tb = exc.__traceback__
    while tb is not None and _is_internal(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def install_sources(lines: dict[str, list[str]]) -> None:
    """Register notebook-cell sources so tracebacks and stacks show the cell's lines."""
    for name, src in lines.items():
        linecache.cache[name] = (sum(map(len, src)), None, src, name)


def adopt_into_main(*objs: object) -> None:
    """Make classes and functions that arrived by value resolvable as ``__main__.<name>``.

    cloudpickle rebuilds a notebook-defined class in the rank, but plain pickle (used by RPC and by
    torch.save) refers to it by name, ``__main__.Net``. Publishing every such object in the rank's
    ``__main__`` makes those lookups succeed, exactly as in the notebook.
    """
    main = sys.modules["__main__"]
    seen: set[int] = set()
    todo = list(objs)
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, (list, tuple, set, frozenset)):
            todo.extend(obj)
        elif isinstance(obj, dict):
            todo.extend(obj.values())
        elif isinstance(obj, (staticmethod, classmethod)):
            todo.append(obj.__func__)
        elif isinstance(obj, property):
            todo.extend(f for f in (obj.fget, obj.fset, obj.fdel) if f is not None)
        elif isinstance(obj, types.FunctionType):
            if obj.__module__ != "__main__":
                continue
            if "." not in obj.__qualname__ and "<" not in obj.__qualname__:
                setattr(main, obj.__name__, obj)
            names = _global_names(obj.__code__)
            todo.extend(v for k, v in obj.__globals__.items() if k in names)
            todo.extend(c.cell_contents for c in obj.__closure__ or () if _has_contents(c))
            todo.extend(obj.__defaults__ or ())
        elif isinstance(obj, type):
            if obj.__module__ != "__main__":
                continue
            if "." not in obj.__qualname__ and "<" not in obj.__qualname__:
                setattr(main, obj.__name__, obj)
            todo.extend(vars(obj).values())
            todo.extend(obj.__bases__)
        elif not isinstance(obj, (types.ModuleType, str, bytes, int, float, bool)):
            todo.append(type(obj))


def _global_names(code: types.CodeType) -> set[str]:
    """Global names a function's code uses, including inside its lambdas, comprehensions and
    generator expressions (each of those is a code object of its own, in ``co_consts``)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _has_contents(cell) -> bool:
    try:
        _ = cell.cell_contents
    except ValueError:
        return False
    return True


class _Rank:
    def __init__(self, spec: RankSpec, ctrl: Connection):
        self.spec = spec
        self.ctrl = ctrl
        self.token = spec.token
        self.init_error: BaseException | None = None

    # -- set-up ------------------------------------------------------------------------------

    def start(self) -> None:
        """Set up; an error is kept and reported in the reply to every task (stage "init")."""
        global _phase
        try:
            self.setup()
        except BaseException as e:
            self.init_error = e
        _phase = "running"

    def setup(self) -> None:
        global _phase
        _phase = "importing torch"
        import torch
        import torch.distributed as dist

        from . import forksafety

        if forksafety.strict():  # forked under macOS's rules: Metal would crash here
            forksafety.guard_mps()

        # What a %%ranks cell can use without importing anything.
        vars(sys.modules["__main__"]).update(
            torch=torch, dist=dist, rank=self.spec.rank, world_size=self.spec.world_size
        )
        threads = self.spec.threads
        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(threads)
        except RuntimeError:
            pass  # already set (the pool starts on first use); harmless
        # torch reads TORCH_DISTRIBUTED_DEBUG once, when torch.distributed is imported: in the
        # fork server, before this rank's env= arrived. Read it again, so env= works as under
        # torchrun.
        dist.set_debug_level_from_env()
        backend = self.spec.backend
        if backend is None:
            return
        import datetime

        rank, world_size = self.spec.rank, self.spec.world_size
        kwargs = {}
        if "nccl" in backend:
            torch.cuda.set_device(rank)
            kwargs["device_id"] = torch.device("cuda", rank)
        # A FileStore in a private directory: no listening socket for the rendezvous at all.
        store = dist.FileStore(self.spec.store_path, world_size)
        _phase = "waiting for the other ranks in init_process_group"
        # Meeting may take longer than the learner's timeout (a fresh interpreter imports torch
        # while the others wait): meet with the start limit, then use the learner's timeout.
        timeout = datetime.timedelta(seconds=self.spec.pg_timeout)
        meet = max(timeout, datetime.timedelta(seconds=self.spec.start_timeout))
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=meet, **kwargs
        )
        if meet != timeout and _torch.set_pg_timeout(timeout):
            store.set_timeout(timeout)

    def finish(self) -> None:
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                # Keep a reference so the C++ object outlives destroy_process_group(): its
                # destructor closes gloo's sockets one peer at a time (~10 ms per rank), and the
                # process exits right after this anyway, which closes them all at once. Module
                # level, not `self`: this object is freed when rank_main returns, before os._exit.
                _KEEP.append(dist.group.WORLD)
                dist.destroy_process_group()
        except BaseException:
            traceback.print_exc()

    # -- the task loop -------------------------------------------------------------------------

    def serve(self) -> None:
        while True:
            try:
                msg = protocol.decode_task(self.ctrl.recv_bytes())
            except (EOFError, OSError):
                return
            except KeyboardInterrupt:
                continue  # an interrupt that arrived between tasks
            if isinstance(msg, Exit):
                return
            reply = self.run(msg)
            _flush()
            os.write(1, protocol.end_marker(self.token, msg.id))
            self.ctrl.send_bytes(protocol.encode(reply))

    def run(self, msg: Run) -> Reply:
        try:
            if self.init_error is not None:
                return self.error(msg, self.init_error, "init")
            install_sources(msg.lines)
            try:
                from . import ship

                kind, *body = ship.loads(msg.payload)
            except BaseException as e:
                return self.error(msg, e, "load")
            self.ctrl.send_bytes(protocol.encode(Began(msg.id)))
            value = getattr(self, "op_" + kind)(*body)
        except BaseException as e:  # noqa: BLE001 -- the learner's error, KeyboardInterrupt too
            return self.error(msg, e, "raised")
        try:
            from . import ship

            data = ship.pickle(value)
        except BaseException as e:
            return self.error(msg, e, "result")
        return Reply(msg.id, value=data)

    def error(self, msg: Run, exc: BaseException, stage: str) -> Reply:
        failure = Failure(
            stage=stage,
            type=type(exc).__qualname__,
            module=type(exc).__module__,
            message=str(exc),
            traceback=format_exception(exc),
        )
        return Reply(msg.id, failure=failure)

    # -- operations (what a task can ask for) --------------------------------------------------

    def op_call(self, fn, args, kwargs):
        adopt_into_main(fn, args, kwargs)
        return fn(*args, **kwargs)

    def op_exec(self, source: str, filename: str):
        """Run a cell in the rank's ``__main__`` namespace; return the repr of its last
        expression's value (like IPython's ``Out``), or None."""
        main = sys.modules["__main__"]
        install_sources({filename: source.splitlines(keepends=True)})
        tree = ast.parse(source, filename=filename)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        ns = main.__dict__
        exec(compile(tree, filename, "exec"), ns)
        if last is not None:
            value = eval(compile(last, filename, "eval"), ns)
            if value is not None:
                ns["_"] = value
                return repr(value)  # shown in the notebook; the object itself may not pickle
        return None

    def op_push(self, values: dict):
        adopt_into_main(values)
        vars(sys.modules["__main__"]).update(values)

    def op_pull(self, name: str):
        ns = vars(sys.modules["__main__"])
        if name not in ns:
            raise NameError(f"name {name!r} is not defined on this rank")
        return ns[name]
