"""`distlab.Cluster`: ranks that stay alive across cells, so you can poke at a process group.

    cluster = distlab.Cluster(world_size=4)
    cluster.run(fn)              # like distlab.launch, on the live ranks
    %%ranks                      # (after %load_ext distlab) run a cell on every rank

Uses the same machinery as `distlab.launch` (`distlab._ranks.group.RankGroup`): same output, same
errors.
The difference is what happens after a failure: the other ranks are interrupted, not killed, so the
cluster stays usable after an ordinary Python error.
"""

from __future__ import annotations

import atexit
import re
import threading
import weakref
from dataclasses import dataclass

from . import _config, _output, _readable
from ._ranks import ship, start_path
from ._ranks.group import RankGroup
from .errors import DistlabError, InputError, InputTypeError, RankTimeout, entry_point

_current: weakref.ref | None = None
_all: weakref.WeakSet = weakref.WeakSet()
_lock = threading.Lock()


def current() -> Cluster:
    """The most recently started cluster that is still running."""
    cluster = _current() if _current is not None else None
    if cluster is None or cluster.closed:
        live = [c for c in _all if not c.closed]
        if not live:
            raise RuntimeError(
                "No distlab cluster is running. Start one first:\n"
                "    cluster = distlab.Cluster(world_size=4)"
            )
        cluster = max(live, key=lambda c: c._serial)
    return cluster


@dataclass(frozen=True)
class _Step:
    """One thing the learner ran on the ranks that succeeded: replayed by `Cluster.restart`."""

    what: str  #: for messages: "the cell Cell In[5]", "push(lr=...)", "run(setup)"
    payload: bytes
    ranks: list[int]


class PerRank(list):
    """One value per rank that prints as ``[rank N] value`` lines (a cell's last expression).

    With ``fold`` (the cluster's setting), ranks whose values print alike share one
    ``[ranks 0-3] value`` block."""

    def __repr__(self) -> str:
        texts = {r: text if text else "\n" for r, text in self.items()}
        return _output.render(texts, self.fold).rstrip("\n")

    def items(self):
        return [(r, v) for r, v in zip(self.ranks, self, strict=True) if v is not None]

    def __init__(self, values, ranks, fold: bool = False):
        super().__init__(values)
        self.ranks = list(ranks)
        self.fold = fold

    def _repr_pretty_(self, p, cycle):
        p.text(repr(self))


class Cluster:
    """``world_size`` live ranks with the default process group initialized, kept across cells.

    Args:
        world_size: number of ranks (int >= 1).
        backend: as for `distlab.launch` (``"auto"``, ``"gloo"``, ``"nccl"``, ..., or None).
        timeout: default seconds a cell may run before it is declared hung (per call, override
            with ``run(..., timeout=)`` or ``%%ranks --timeout``). The process group's timeout
            is 3 s longer: a collective stuck in C++ gives up after that long.
        threads: CPU threads per rank (default: cores // world_size, at least 1).
        fold: show lines that every rank printed alike once, as ``[ranks 0-3] ...`` (default);
            ``False`` shows every rank's full block. Per call: ``run(..., fold=)``,
            ``%%ranks --no-fold``; for the cluster: ``cluster.fold = False``.
        start_method, env, start_timeout: as for `distlab.launch`.

    Raises:
        TypeError / ValueError: bad ``world_size``, ``backend`` or ``timeout`` (see launch).
        distlab.RankError: a rank failed while starting (for example NCCL could not start).
        distlab.StartError: a rank did not start within ``start_timeout`` seconds.

    Each rank's namespace (used by ``%%ranks`` cells, `exec`, `push` and `pull`) starts with
    ``torch``, ``dist`` (``torch.distributed``), ``rank`` and ``world_size``.

    ``hung`` is True once a call has timed out (until `restart`): even where every rank was
    interrupted, a collective cut off halfway can leave the ranks out of step.

    Use it as a context manager, or call `shutdown()`; ranks also die with the kernel.
    """

    _serial_counter = 0

    @entry_point
    def __init__(
        self,
        world_size: int = 2,
        backend: str | None = "auto",
        *,
        timeout: float = 60.0,
        threads: int | None = None,
        fold: bool = True,
        start_method: str | None = None,
        env: dict[str, str] | None = None,
        start_timeout: float = 60.0,
    ):
        self.fold = fold
        self.world_size = _config.check_world_size(world_size)
        self.timeout = _config.check_timeout(timeout)
        self.backend = _config.resolve_backend(backend, self.world_size)
        self._start_method = start_path.check_method(start_method)
        self._threads = threads
        self._env = env
        self._start_timeout = _config.check_timeout(start_timeout, "start_timeout")
        self._widget = None
        self._group: RankGroup | None = None
        self._history: list[_Step] = []
        #: A run timed out since the ranks started: its collective may have been cut off halfway
        #: on some ranks only (they stopped when interrupted, or when gloo gave up just after),
        #: leaving the ranks out of step; `distlab.check` restarts such a cluster.
        self.hung = False
        self._start()

    # -- life cycle -----------------------------------------------------------------------------

    def _start(self) -> None:
        global _current
        self._group = RankGroup(
            self.world_size,
            self.backend,
            threads=self._threads,
            pg_timeout=self.timeout,
            start_method=self._start_method,
            env=self._env,
            start_timeout=self._start_timeout,
        )
        try:  # initialize the process group now, so a failure shows up here
            self._group.execute(ship.dumps("call", _noop, (), {}), timeout=self.timeout)
        except BaseException:
            self._group.kill()
            self._group.close()
            raise
        with _lock:
            Cluster._serial_counter += 1
            self._serial = Cluster._serial_counter
            _all.add(self)
            _current = weakref.ref(self)
        self.hung = False
        self._refresh()

    @property
    def closed(self) -> bool:
        return self._group is None

    def shutdown(self) -> None:
        """Stop every rank (destroying the process group) and free everything. Idempotent."""
        group, self._group = self._group, None
        if group is not None:
            group.close()
        self._refresh()

    @entry_point
    def restart(self, replay: bool = True) -> int:
        """Start fresh ranks (the old ones are killed), and by default put back what you had
        set up on the old ones: every ``%%ranks`` cell, `exec`, `push` and `run` that
        succeeded is run again, in order, with its output hidden.

        Args:
            replay: False starts clean (every rank's variables are lost).

        Returns:
            How many cells and calls were run again.

        Raises:
            RuntimeError: one of them fails now (the message names it and shows why); the
                ranks keep what the ones before it set up.
        """
        history = self._history if replay else []
        group, self._group = self._group, None
        if group is not None:
            group.kill()
            group.close()
        self._history = []
        self._start()
        for n, step in enumerate(history, start=1):
            try:
                self._group.execute(
                    step.payload,
                    ranks=step.ranks,
                    timeout=self.timeout,
                    on_failure="interrupt",
                    show=False,
                )
            except DistlabError as e:
                raise RuntimeError(
                    f"restart() re-ran {n - 1} of {len(history)} cells and calls; {step.what} "
                    f"failed this time:\n{e}"
                ) from None
            self._history.append(step)
        self._refresh()
        return len(history)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def __del__(self):
        try:
            if self._group is not None:
                self._group.kill()
                self._group.close()
        except Exception:
            pass

    # -- running things -------------------------------------------------------------------------

    def _require_group(self) -> RankGroup:
        if self._group is None:
            raise RuntimeError(
                "This cluster has been shut down. Start a new one: "
                "cluster = distlab.Cluster(world_size=...)"
            )
        return self._group

    def _ranks(self, ranks) -> list[int]:
        if ranks is None:
            return list(range(self.world_size))
        if isinstance(ranks, int):
            ranks = [ranks]
        out = sorted(set(ranks))
        bad = [r for r in out if not isinstance(r, int) or not 0 <= r < self.world_size]
        if bad or not out:
            raise InputError(
                f"ranks must be a non-empty list of ranks between 0 and {self.world_size - 1}, "
                f"got {ranks!r}"
            )
        return out

    def _execute(
        self, payload: bytes, ranks, timeout, stream: bool, fold=None, what: str | None = None
    ) -> list:
        """Run ``payload``; with ``what`` (a description), remember it for `restart` if it
        succeeds."""
        group = self._require_group()
        fold = self.fold if fold is None else fold
        targets = self._ranks(ranks)
        timeout = self.timeout if timeout is None else _config.check_timeout(timeout)
        self._refresh(busy=targets)
        try:
            values = group.execute(
                payload,
                ranks=targets,
                timeout=timeout,
                stream=stream,
                on_failure="interrupt",
                fold=fold,
            )
        except RankTimeout:
            self.hung = True
            raise
        finally:
            self._refresh()
        if what is not None:
            self._history.append(_Step(what, payload, targets))
        return values

    @entry_point
    def run(
        self,
        fn,
        *args,
        ranks=None,
        timeout: float | None = None,
        stream=False,
        fold: bool | None = None,
        _record: bool = True,
        **kwargs,
    ):
        """Run ``fn(*args, **kwargs)`` on the live ranks; return one value per rank.

        ``ranks`` (a rank or a list) runs it on some ranks only; the result then has one entry
        per chosen rank. Errors are those of `distlab.launch`. After a Python error the cluster
        stays usable; a rank stuck inside C++ raises `distlab.ClusterBroken` until `restart()`.
        ``fold`` overrides the cluster's setting for this call. (``_record=False``: distlab's
        own tools, whose runs `restart` does not replay.)
        """
        _config.check_callable(fn, "Cluster.run()")
        what = f"run({getattr(fn, '__name__', 'fn')})" if _record else None
        payload = ship.dumps_call(fn, args, kwargs)
        return self._execute(payload, ranks, timeout, stream, fold, what)

    @entry_point
    def exec(
        self,
        source: str,
        ranks=None,
        timeout: float | None = None,
        stream=False,
        fold: bool | None = None,
    ):
        """Run ``source`` as a cell in every rank's own namespace (what ``%%ranks`` does).

        Returns a `PerRank` list with the repr of the cell's last expression on each rank
        (None where there is none). ``fold`` overrides the cluster's setting for this call.
        """
        filename = _readable.ranks_cell_name()  # "<%%ranks cell 3>": see distlab._readable
        payload = ship.dumps("exec", source, filename)
        targets = self._ranks(ranks)
        fold = self.fold if fold is None else fold
        what = f"the cell {filename}"
        values = self._execute(payload, targets, timeout, stream, fold, what)
        return PerRank(values, targets, fold)

    @entry_point
    def push(self, ranks=None, **values) -> None:
        """Set variables in every rank's namespace: ``cluster.push(lr=0.1, model=net)``."""
        if not values:
            raise InputTypeError("push() needs name=value pairs, e.g. cluster.push(lr=0.1)")
        try:
            payload = ship.dumps("push", values)
        except Exception:
            ship.dumps_call(_noop, (), values)  # raises an error naming the culprit
            raise
        self._execute(payload, ranks, None, False, what=f"push({', '.join(values)}=...)")

    @entry_point
    def pull(self, name: str, ranks=None) -> list:
        """Get variable ``name`` from every rank's namespace: one value per rank."""
        if not isinstance(name, str) or not name.isidentifier():
            raise InputTypeError(f"pull() needs a variable name as a string, got {name!r}")
        return self._execute(ship.dumps("pull", name), ranks, None, False)

    # -- looking at it ----------------------------------------------------------------------------

    @property
    def states(self) -> dict[int, str]:
        """Each rank's state: idle, busy, stuck or dead."""
        if self._group is None:
            return dict.fromkeys(range(self.world_size), "dead")
        return {p.rank: p.state for p in self._group.procs}

    def __repr__(self) -> str:
        if self.closed:
            return f"<distlab.Cluster world_size={self.world_size}: shut down>"
        states = ", ".join(f"{r}:{s}" for r, s in self.states.items())
        return (
            f"<distlab.Cluster world_size={self.world_size} backend={self.backend!r} "
            f"ranks {states}>"
        )

    def widget(self):
        """A small live status view (ipywidgets): each rank's state and its last cell's time."""
        from ._status import StatusView

        if self._widget is None:
            self._widget = StatusView()
            self._refresh()
        return self._widget

    def _refresh(self, busy=()) -> None:
        if self._widget is None:
            return
        rows = []
        for r in range(self.world_size):
            state = self.states.get(r, "dead")
            if r in busy and state == "idle":
                state = "busy"
            seconds = None
            if self._group is not None:
                seconds = self._group.procs[r].last_seconds
            rows.append((r, state, seconds))
        self._widget.update(self.backend, rows)


def _noop():
    return None


_COLLECTIVE = re.compile(
    r"\b(all_reduce|all_gather\w*|reduce_scatter\w*|all_to_all\w*|broadcast\w*|barrier|"
    r"reduce|gather\w*|scatter\w*|new_group|new_subgroups|monitored_barrier)\s*\("
)


def collective_warning(source: str, ranks: list[int], world_size: int) -> str | None:
    """A warning if a cell for a subset of ranks calls a collective of the whole group."""
    if len(ranks) == world_size or "group=" in source:
        return None
    m = _COLLECTIVE.search(source)
    if not m:
        return None
    others = [r for r in range(world_size) if r not in ranks]
    return (
        f"warning: this cell runs on rank(s) {', '.join(map(str, ranks))} only, but calls "
        f"{m.group(1)}(). A collective waits for every rank of its group, so it will wait for "
        f"rank(s) {', '.join(map(str, others))} until the timeout. Run it on all ranks, or "
        "pass group= a subgroup made (on all ranks) with dist.new_group()."
    )


@atexit.register
def _shutdown_all() -> None:
    for cluster in list(_all):
        try:
            cluster.shutdown()
        except Exception:
            pass
