"""The kernel's side of a set of live ranks: start them, send tasks, gather output and results,
notice failures, hangs and deaths, and clean everything up.

`distlab.launch` uses a group for one task; `distlab.Cluster` keeps one alive across cells. Both go
through `RankGroup.execute`, so output, errors and clean-up behave the same everywhere.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

from .. import _config, _output
from .._patience import idle_after, patience
from .._readable import innermost, readable
from ..errors import (
    RESTART,
    ClusterBroken,
    RankError,
    RankFailure,
    RankTimeout,
    StartError,
    exit_text,
    order_failures,
)
from . import forksafety, idle, loopback, protocol, ship, start_path
from .proc import RankProcess
from .protocol import Began, Exit, RankSpec, Reply, Run, Started

_STACK_WAIT = 1.5  #: how long a stuck rank gets to report its stack (then: faulthandler)
#: The process group's timeout is the learner's plus this: a collective waiting for a rank that
#: never comes is reported by distlab, with every rank's stack, before gloo gives up.
PG_MARGIN = 3.0
#: How long interrupted ranks get to stop: Python stops at the next bytecode; a rank blocked in
#: C++ (a collective's wait) never does, and is reported stuck when this runs out.
_INTERRUPT_WAIT = 1.0
#: How long a dead rank's exit status may take (the fork server reports it between warm-up
#: imports). These waits suit a quiet machine; `_patience.patience` stretches them on a busy one.
_EXIT_WAIT = 5.0


@dataclass
class _Task:
    id: int
    targets: list[int]
    pending: set[int]
    marker: dict[int, bytes]
    replies: dict[int, Reply] = field(default_factory=dict)
    failures: list[RankFailure] = field(default_factory=list)  # in time order
    outputs: dict[int, bytes] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    first_failure_at: float | None = None
    unstarted: list[int] = field(default_factory=list)  # ranks that did not start in time
    began: dict[int, float] = field(default_factory=dict)  # rank -> when its code began
    data: bytes = b""  # the encoded Run message
    sent: bool = False  # given to the ranks (once all of them had started)


class RankGroup:
    """``world_size`` rank processes, started together, optionally with a process group."""

    def __init__(
        self,
        world_size: int,
        backend: str | None,
        *,
        threads: int | None = None,
        pg_timeout: float = 60.0,
        start_method: str = "forkserver",
        env: dict[str, str] | None = None,
        start_timeout: float = 60.0,
    ):
        self.world_size = world_size
        self.backend = backend
        self.start_timeout = start_timeout
        self.created = time.monotonic()
        self.threads = threads or _config.default_threads(world_size)
        self.token = secrets.token_hex(6)
        self.tmpdir = tempfile.mkdtemp(prefix="distlab-")  # mode 0700: private to this user
        self.procs: list[RankProcess] = []
        self._next_id = 0
        self._lines = ship.LineShipper()
        self.starter = start_path.get(start_method)
        self.strict_fork = self.starter.method == "forkserver" and forksafety.macos_rules()
        self.port = loopback.reserve_port()  # for rank 0's store, if the learner's code makes one
        base_env = {
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "GROUP_RANK": "0",
            **loopback.env(self.port.port),
            "OMP_NUM_THREADS": str(self.threads),
            "MKL_NUM_THREADS": str(self.threads),
            **(env or {}),
        }
        try:  # (if this raises, the port is let go with this object)
            self.procs = self._start(base_env, pg_timeout)  # all of them, or an error and none
        except forksafety.ForkUnsafe as e:  # macOS's rules: the spawn path takes over, for good
            forksafety.mark_unsafe(str(e))
            self.starter, self.strict_fork = start_path.get("spawn"), False
            self.procs = self._start(base_env, pg_timeout)

    def _start(self, base_env: dict[str, str], pg_timeout: float) -> list[RankProcess]:
        """Create every rank's channels, then ask for all the processes at once."""
        ours, theirs, specs = [], [], []
        try:
            for rank in range(self.world_size):
                ctrl_k, ctrl_c = socket.socketpair()
                dbg_k, dbg_c = socket.socketpair()
                out_r, out_w = os.pipe()
                os.set_blocking(out_r, False)
                ours.append((ctrl_k, dbg_k, out_r))
                theirs.append([ctrl_c.detach(), dbg_c.detach(), out_w])
                env = dict(base_env, RANK=str(rank), LOCAL_RANK=str(rank), ROLE_RANK=str(rank))
                specs.append(
                    RankSpec(
                        rank=rank,
                        world_size=self.world_size,
                        backend=self.backend,
                        store_path=os.path.join(self.tmpdir, "store"),
                        pg_timeout=pg_timeout + PG_MARGIN,
                        threads=self.threads,
                        token=self.token,
                        start_timeout=self.start_timeout,
                        env=env,
                        cwd=os.getcwd(),
                    )
                )
            pids = self.starter.start_many(list(zip(specs, theirs, strict=True)))
        except BaseException:
            for ctrl_k, dbg_k, out_r in ours:
                ctrl_k.close()
                dbg_k.close()
                os.close(out_r)
            raise
        finally:
            for fds in theirs:
                for fd in fds:
                    os.close(fd)
        return [
            RankProcess(
                rank, pid, Connection(ctrl_k.detach()), Connection(dbg_k.detach()), out_r
            )
            for rank, (pid, (ctrl_k, dbg_k, out_r)) in enumerate(zip(pids, ours, strict=True))
        ]

    # -- running a task ---------------------------------------------------------------------------

    def execute(
        self,
        payload: bytes,
        *,
        ranks: list[int] | None = None,
        timeout: float,
        stream: bool = False,
        on_failure: str = "kill",
        grace: float = 0.5,
        fold: bool = False,
        show: bool = True,
    ) -> list:
        """Run ``payload`` (see `ship`) on ``ranks``; print their output; return their values.

        ``timeout`` counts from when the last of ``ranks`` has started (joined the process
        group): new ranks first get ``start_timeout`` seconds, from the group's creation, to
        start. ``on_failure="kill"`` (launch): after the first failure the others get ``grace``
        seconds, then are killed. ``"interrupt"`` (Cluster): they get an interrupt instead, so
        live ranks survive. ``"survive"`` (`distlab.faults`): a rank that dies does not stop the
        others, which run on until they finish (``grace`` should then be ``timeout``), and the
        dead rank's value is its `RankFailure`. ``fold``: print lines that all ranks printed
        alike once (see `_output.render`); ``show=False`` prints nothing of theirs. Raises
        `RankError`, `RankTimeout`, `StartError`, or KeyboardInterrupt (after cleaning up).
        """
        task = self.submit(payload, ranks)
        try:
            if self._waiting_to_start(task):
                deadline = self.created + self.start_timeout
                self.collect(task, deadline, stream, grace, until=self._started(task))
                task.unstarted = self._waiting_to_start(task)
                self.starter.started()
            if not task.unstarted:
                # Only now, so that every rank begins at about the same moment: without a process
                # group to meet in (backend=None), a rank that started first would otherwise run
                # ahead of one still importing torch, and a short timeout in the learner's code
                # would fire on the late one.
                self._send(task)
                # Loading the task (unpickling it imports what the function refers to) is not
                # the learner's code either: the timeout counts from when every rank began.
                self.collect(
                    task, time.monotonic() + self.start_timeout, stream, grace,
                    until=lambda: all(r in task.began for r in task.pending),
                )
                began = max([task.started, *task.began.values()])
                quiet = idle_after()  # a grader's wait: see distlab._ranks.idle
                if quiet is not None and quiet < timeout:
                    self.collect(task, began + quiet, stream, grace)
                    if idle.collect_while_working(self, task, began + timeout, stream, grace):
                        timeout = quiet  # called at the quiet machine's limit: say that one
                else:
                    self.collect(task, began + timeout, stream, grace)
        except KeyboardInterrupt:
            self.after_interrupt(task, on_failure, stream, fold)
            raise
        return self.finish(task, timeout, stream and show, on_failure, fold, show)

    def submit(self, payload: bytes, ranks: list[int] | None = None) -> _Task:
        targets = list(range(self.world_size)) if ranks is None else list(ranks)
        self.recover()
        broken = [self.procs[r] for r in targets if self.procs[r].state in ("stuck", "dead")]
        if broken:
            raise ClusterBroken(
                "; ".join(
                    f"rank {p.rank} is stuck inside C++ since an earlier cell"
                    if p.state == "stuck"
                    else f"rank {p.rank} is dead ({exit_text(p.exitcode)})"
                    for p in broken
                )
                + ". "
                + RESTART
            )
        self._next_id += 1
        task = _Task(
            self._next_id,
            targets,
            set(targets),
            {r: protocol.end_marker(self.token, self._next_id) for r in targets},
        )
        task.data = protocol.encode_task(Run(task.id, payload, self._lines.new()), self.tmpdir)
        for r in targets:
            proc = self.procs[r]
            proc.buf = bytearray()  # from here on its output belongs to this task
            proc.streamed = 0
        return task

    def _send(self, task: _Task) -> None:
        """Give the task to its ranks (all of them have started)."""
        task.sent = True
        for r in task.targets:
            proc = self.procs[r]
            if r not in task.pending:
                continue  # died while the others started
            try:
                proc.ctrl.send_bytes(task.data)
                proc.state = "busy"
            except OSError:
                self._on_death(task, proc)

    def _waiting_to_start(self, task: _Task) -> list[int]:
        return [
            r for r in task.targets if self.procs[r].started_at is None and self.procs[r].alive
        ]

    def _started(self, task: _Task):
        return lambda: not self._waiting_to_start(task)

    def collect(
        self, task: _Task, deadline: float, stream: bool, grace: float, until=None
    ) -> None:
        """Wait for replies until all are in, ``deadline`` passes, the grace after a failure
        ends, or ``until()`` is true."""
        while task.pending and not (until is not None and until()):
            limit = deadline
            if task.first_failure_at is not None:
                limit = min(deadline, task.first_failure_at + grace)
            left = limit - time.monotonic()
            if left <= 0:
                return
            by_conn = {self.procs[r].ctrl: self.procs[r] for r in task.pending}
            by_fd = {p.out_fd: p for p in self.procs if p.out_fd is not None}
            for obj in wait([*by_conn, *by_fd], timeout=left):
                if isinstance(obj, int):
                    by_fd[obj].read(stream)
                else:
                    self._on_reply(task, by_conn[obj], stream)

    def _on_reply(self, task: _Task, proc: RankProcess, stream: bool) -> None:
        try:
            reply = protocol.decode(proc.ctrl.recv_bytes())
        except (EOFError, OSError):
            self._on_death(task, proc)
            return
        if isinstance(reply, Started):
            proc.started_at = time.monotonic()
            return
        if isinstance(reply, Began):
            task.began[proc.rank] = time.monotonic()
            return
        task.outputs[proc.rank] = proc.split_output(task.marker[proc.rank], stream)
        proc.state = "idle"
        proc.last_seconds = time.monotonic() - task.started
        task.pending.discard(proc.rank)
        task.replies[proc.rank] = reply
        if not reply.ok:
            f = reply.failure
            self._fail(
                task,
                RankFailure(proc.rank, f.type, f.message, traceback=f.traceback, stage=f.stage),
            )

    def _on_death(self, task: _Task | None, proc: RankProcess) -> None:
        proc.kill_tree()  # take down anything it started, too
        proc.exitcode = self.starter.wait_exit(proc.pid, patience(_EXIT_WAIT))
        proc.drain()  # everything it printed before dying
        proc.state = "dead"
        if task is None or proc.rank not in task.pending:
            return
        task.pending.discard(proc.rank)
        task.outputs[proc.rank] = bytes(proc.buf)
        lines = _output.tidy(_output.decode(bytes(proc.buf))).rstrip("\n").splitlines()
        tail = "\n".join(lines[-20:])
        marker = forksafety.marker_in(tail) if self.strict_fork else None
        if marker and proc.exitcode is not None and proc.exitcode < 0:
            # killed by a signal inside a system framework, after a fork: never fork again here
            forksafety.mark_unsafe(f"rank {proc.rank} died of a fork in a system framework "
                                   f"({marker})")
        self._fail(
            task,
            RankFailure(
                proc.rank,
                "died",
                exit_text(proc.exitcode),
                stage="died",
                exitcode=proc.exitcode,
                output_tail=tail,
            ),
        )

    def _fail(self, task: _Task, failure: RankFailure) -> None:
        task.failures.append(failure)
        if task.first_failure_at is None:
            task.first_failure_at = time.monotonic()

    # -- after the wait: what happened? -----------------------------------------------------------

    def finish(
        self,
        task: _Task,
        timeout: float,
        stream: bool,
        on_failure: str,
        fold: bool = False,
        show: bool = True,
    ) -> list:
        if task.unstarted and not task.failures:
            raise self._start_error(task)
        stuck: dict[int, str] = {}
        stopped: list[int] = []
        hint = ""
        pending = sorted(task.pending)
        finished = sorted(task.replies)
        if pending and task.failures:  # the others are probably waiting for the failed rank
            if on_failure in ("kill", "survive"):
                self.kill(pending)
                stopped = pending
            else:
                stuck = self._interrupt(task, stream)
                stopped = [r for r in pending if r not in stuck]
        elif pending:  # a time-out
            stuck = self.stacks(pending)  # where they were, before anything is disturbed
            if on_failure in ("kill", "survive"):
                self.kill(pending)
            else:
                still = self._interrupt(task, stream, with_stacks=False)
                hint = _STUCK_HINT if still else _RECOVERED_HINT
        for r in pending:
            task.outputs.setdefault(r, bytes(self.procs[r].buf))
        if show and not stream:
            _output.emit(
                _output.render(
                    {r: _output.decode(task.outputs.get(r, b"")) for r in task.targets}, fold
                )
            )
        dead = {f.rank: f for f in task.failures if f.stage == "died"}
        survived = on_failure == "survive" and not pending and len(dead) == len(task.failures)
        if task.failures and not survived:
            failures = order_failures(task.failures)
            raise RankError(failures, stopped, self.world_size, stuck) from None
        if stuck:
            if task.failures == [] and on_failure != "kill" and not hint:
                hint = _STUCK_HINT
            raise RankTimeout(timeout, stuck, finished, self.world_size, hint)
        values = []
        for r in task.targets:
            if r in dead:  # (survive) a rank that died: its failure in its place
                values.append(dead[r])
                continue
            try:
                values.append(ship.loads(task.replies[r].value))
            except Exception as e:
                raise RankError(
                    [
                        RankFailure(
                            r,
                            type(e).__name__,
                            f"its return value could not be loaded in the notebook: {e}",
                            stage="result",
                        )
                    ],
                    [],
                    self.world_size,
                ) from None
        return values

    def _interrupt(
        self, task: _Task, stream: bool, wait_s: float = _INTERRUPT_WAIT, with_stacks: bool = True
    ) -> dict[int, str]:
        """Interrupt pending ranks (SIGINT) and wait up to ``wait_s`` for them to stop.

        Returns the ranks that stay stuck (with their stacks if ``with_stacks``); those are
        stuck inside C++ and need a restart. KeyboardInterrupts caused here are not reported
        as the learner's errors.
        """
        for r in list(task.pending):
            self.procs[r].signal(signal.SIGINT)
        n_before, first = len(task.failures), task.first_failure_at
        task.first_failure_at = None
        wait_s = patience(wait_s)
        idle.collect_interrupted(self, task, time.monotonic() + wait_s, stream, grace=wait_s)
        task.first_failure_at = first
        task.failures[n_before:] = [
            f for f in task.failures[n_before:] if f.type != "KeyboardInterrupt"
        ]
        still = sorted(task.pending)
        stacks = self.stacks(still) if still and with_stacks else {r: "" for r in still}
        for r in still:
            proc = self.procs[r]
            proc.state = "stuck"
            proc.stale = task.id
            task.pending.discard(r)
            task.outputs[r] = bytes(proc.buf)
            proc.buf.clear()
        return stacks

    def after_interrupt(
        self, task: _Task, on_failure: str, stream: bool, fold: bool = False
    ) -> None:
        """The kernel was interrupted (stop button) while ranks were running ``task``."""
        if on_failure != "interrupt" or not task.sent:  # not sent: stopped while they started
            self.kill()
            return
        stuck = self._interrupt(task, stream)
        if not stream:
            outputs = {r: _output.decode(task.outputs.get(r, b"")) for r in task.targets}
            _output.emit(_output.render(outputs, fold))
        if stuck:
            report = RankTimeout(0, stuck, sorted(task.replies), self.world_size, _STUCK_HINT)
            _output.emit(
                str(report).replace("did not finish within 0 s", "could not be interrupted") + "\n"
            )

    def recover(self) -> None:
        """Ranks marked stuck that have since finished (e.g. a collective timed out in C++)
        become usable again; their late output is dropped."""
        for proc in self.procs:
            while proc.state == "stuck" and proc.ctrl.poll(0):
                try:
                    reply = protocol.decode(proc.ctrl.recv_bytes())
                except (EOFError, OSError):
                    self._on_death(None, proc)
                    break
                if not isinstance(reply, Reply):
                    continue  # the Began of the task it was stuck in
                proc.split_output(protocol.end_marker(self.token, reply.id), stream=False)
                proc.state = "idle"
                proc.stale = None

    def _start_error(self, task: _Task) -> StartError:
        """Ranks that did not start in time: what each was doing, with its stack; all ranks are
        killed (a group whose ranks never met cannot run anything)."""
        phases = self._ask(task.unstarted, protocol.PHASE)
        stacks = self.stacks([r for r in task.unstarted if r in phases])
        self.kill()
        lines = []
        for r in task.unstarted:
            doing = phases.get(r, "starting its Python interpreter (it had not reached distlab's "
                               "code yet)")
            lines.append(f"rank {r} did not start within {self.start_timeout:g} s: it was still "
                         f"{doing}.")
        for ranks, stack in _output.group_alike({r: innermost(s) for r, s in stacks.items()}):
            who = _output.tag(ranks)[1:-1]
            lines += ["", f"--- {who}: innermost calls (most recent call last) ---", stack]
        started = [r for r in task.targets if r not in task.unstarted]
        if started:
            lines += ["", "Started in time: " + ", ".join(f"rank {r}" for r in started) + "."]
        lines += [
            "",
            "Starting takes longer on a busy machine, and where ranks start as fresh interpreters "
            "(macOS, or DISTLAB_START_METHOD=spawn) each imports torch first. Pass "
            f"start_timeout= (now {self.start_timeout:g} s) to launch or Cluster to give them "
            "more time.",
        ]
        return StartError(readable("\n".join(lines)))

    # -- inspecting and stopping ranks ------------------------------------------------------------

    def _ask(self, ranks: list[int], request: bytes) -> dict[int, str]:
        """Send ``request`` to each rank's watch thread; its answers by rank, for those that
        answered within `_STACK_WAIT` seconds (keeping their output flowing meanwhile)."""
        asked = {}
        for r in ranks:
            proc = self.procs[r]
            try:
                proc.dbg.send_bytes(request)
                asked[proc.dbg] = proc
            except OSError:
                pass
        answers: dict[int, str] = {}
        deadline = time.monotonic() + patience(_STACK_WAIT)
        while asked and time.monotonic() < deadline:
            fds = {p.out_fd: p for p in self.procs if p.out_fd is not None}
            for obj in wait([*asked, *fds], timeout=max(0.0, deadline - time.monotonic())):
                if isinstance(obj, int):
                    fds[obj].read(stream=False)
                    continue
                proc = asked.pop(obj)
                try:
                    answers[proc.rank] = _output.decode(obj.recv_bytes())
                except (EOFError, OSError):
                    answers[proc.rank] = "(the rank exited while being asked)"
        return answers

    def stacks(self, ranks: list[int]) -> dict[int, str]:
        """The main-thread Python stack of each rank in ``ranks`` (they must be alive and have
        reached distlab's code: faulthandler answers for a rank whose watch thread cannot)."""
        stacks = self._ask(ranks, protocol.STACK)
        for r in ranks:
            if r not in stacks:
                # The watch thread did not answer: the main thread holds the GIL inside C code.
                stacks[r] = self.procs[r].faulthandler_stack()
        return {r: stacks[r] for r in sorted(stacks)}

    def kill(self, ranks: list[int] | None = None) -> None:
        """SIGKILL ranks (default: all) and everything they started; wait until they are gone."""
        procs = [p for p in self.procs if p.alive and (ranks is None or p.rank in ranks)]
        for p in procs:
            p.kill_tree()
        for p in procs:
            self._reap(p)

    def _reap(self, proc: RankProcess) -> None:
        if proc.exitcode is None:
            proc.exitcode = self.starter.wait_exit(proc.pid, patience(_EXIT_WAIT))
        proc.state = "dead"
        proc.close_channels()

    def close(self, timeout: float = 5.0) -> None:
        """Ask live ranks to exit (destroying their process group), kill stragglers, clean up."""
        live = [p for p in self.procs if p.alive]
        bye = protocol.encode(Exit())
        for p in live:
            try:
                if p.state == "idle":
                    p.ctrl.send_bytes(bye)
                else:
                    p.kill_tree()
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        for p in live:
            if p.state == "idle":
                left = max(0.0, deadline - time.monotonic())
                if not p.ctrl.poll(left):  # EOF (the rank exited) makes the connection readable
                    p.kill_tree()
                else:
                    while p.out_fd is not None and wait([p.out_fd], timeout=0.2):
                        p.read(stream=False)
        for p in live:
            self._reap(p)
        for p in self.procs:  # ranks that died on their own still hold kernel-side ends
            p.close_channels()
        shutil.rmtree(self.tmpdir, ignore_errors=True)
        self.port.release()  # only now: a rank could still have been listening on it
        self.starter.stopped()

    def __del__(self):
        # Last resort (e.g. the object is dropped after an error): never leave ranks behind.
        try:
            if any(p.alive for p in self.procs):
                self.kill()
            shutil.rmtree(self.tmpdir, ignore_errors=True)
        except Exception:
            pass


_RECOVERED_HINT = (
    "distlab interrupted them and the cluster is usable again. A collective that was cut off "
    "halfway can leave the ranks out of step: if the next cell hangs, run `cluster.restart()`."
)

_STUCK_HINT = (
    "These ranks are stuck inside C++ (typically a collective waiting for a rank that will "
    "never join) and cannot be interrupted. " + RESTART
)

