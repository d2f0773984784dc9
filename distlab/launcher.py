"""`distlab.launch`: run a function on N local ranks, straight from a notebook cell.

Also `on_ranks`, which the other tools that run a function on ranks (`distlab.timeline.record`,
`distlab.memory.record`) use, so they take exactly launch's options, or a live cluster.
"""

from __future__ import annotations

from . import _config
from ._ranks import ship, start_path
from ._ranks.group import RankGroup
from .errors import InputError, entry_point

#: launch's keyword options, with their defaults: what `on_ranks` takes out of a tool's kwargs.
OPTIONS = {
    "world_size": 2,
    "backend": "auto",
    "timeout": 60.0,
    "threads": None,
    "stream": False,
    "fold": True,
    "start_method": None,
    "env": None,
    "start_timeout": 60.0,
}
#: Of those, the ones that also apply to a live cluster's ranks (the others set up new ranks).
CLUSTER_OPTIONS = ("world_size", "timeout", "stream", "fold")


@entry_point
def launch(
    fn,
    *args,
    world_size: int = 2,
    backend: str | None = "auto",
    timeout: float = 60.0,
    threads: int | None = None,
    stream: bool = False,
    fold: bool = True,
    start_method: str | None = None,
    env: dict[str, str] | None = None,
    start_timeout: float = 60.0,
    **kwargs,
) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` new processes ("ranks"); return their values.

    Each rank starts with the default process group initialized (``torch.distributed.get_rank()``
    works) and with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``
    set exactly as ``torchrun`` sets them, so the same function runs unchanged under torchrun.
    Functions and classes defined in notebook cells are sent by value and work in every rank.
    Each rank's printed output (stdout and stderr, C++ warnings included) is shown after the run,
    grouped by rank in rank order, every line prefixed ``[rank N]``. The process group is
    destroyed and every process is gone when ``launch`` returns or raises.

    Args:
        fn: the function to run on every rank. ``args``/``kwargs`` are passed to it (pickled).
        world_size: number of ranks (int >= 1).
        backend: ``"auto"`` (NCCL+gloo if there is one CUDA GPU per rank, else gloo), ``"gloo"``,
            ``"nccl"``, ``"cpu:gloo,cuda:nccl"``, or ``None`` for no process group (to practise
            ``init_process_group`` yourself; the torchrun variables are still set).
        timeout: seconds ``fn`` may run before it is declared hung; then the stack of every rank
            that is still running is shown and all ranks are stopped. It counts from when every
            rank has started (joined the process group), so a short timeout works even where
            ranks take a while to start. The process group's timeout is 3 s longer, so that
            distlab reports a hang, with every rank's stack, before gloo gives up.
        threads: CPU threads per rank (``torch.set_num_threads``, ``OMP_NUM_THREADS``); default
            cores // world_size, at least 1, so ranks do not fight over the cores.
        stream: show output lines live, as the ranks print them (lines of different ranks then
            interleave; the default prints each rank's block after the run, deterministically).
        fold: show lines that every rank printed alike once, as ``[ranks 0-3] ...``, before
            what differs rank by rank (``False``: every rank's full block, ``[rank N]`` lines).
        start_method: ``"forkserver"`` (the default: ranks are forked from a helper process
            that has torch imported, in milliseconds; on macOS only while that is proven safe,
            see README "On a Mac") or ``"spawn"`` (a fresh interpreter per rank; the fallback).
        env: extra environment variables for the ranks.
        start_timeout: seconds the ranks may take to start and meet (default 60: generous, for
            a busy machine and the spawn path, where every rank imports torch itself).

    Returns:
        A list with one entry per rank: ``result[r]`` is what rank ``r`` returned.

    Raises:
        TypeError: ``fn`` is not callable, ``world_size`` is not an int, or an argument cannot be
            pickled (the message names it; create such objects inside ``fn``).
        ValueError: ``world_size < 1``, an unknown ``backend`` or ``start_method``, NCCL without
            a GPU per rank, or a timeout that is not a positive number of seconds.
        distlab.StartError: a rank did not start within ``start_timeout`` (the message says what
            it was doing, with its stack), or distlab's helper process could not start.
        distlab.RankError: a rank raised or died. The root cause comes first, with its traceback
            (including your cell's lines); errors other ranks hit because of it are marked as
            consequences, and ranks still running are stopped.
        distlab.RankTimeout: ranks were still running after ``timeout`` seconds (a hung
            collective, usually). The message shows where each one was stuck.
        KeyboardInterrupt: you pressed stop; every rank is killed first.
    """
    return run(fn, args, kwargs, world_size=world_size, backend=backend, timeout=timeout,
               threads=threads, stream=stream, fold=fold, start_method=start_method, env=env,
               start_timeout=start_timeout, on_failure="kill")


def run(fn, args, kwargs, *, world_size, backend, timeout, threads, stream, fold, start_method,
        env, start_timeout, on_failure, grace=None) -> list:
    """Check launch's options, start the ranks, run ``fn`` on them and stop them all: the body of
    `distlab.launch` (``on_failure="kill"``) and of `distlab.faults.launch` (``"survive"``,
    where a dead rank leaves the others running for ``grace`` seconds)."""
    _config.check_callable(fn)
    world_size = _config.check_world_size(world_size)
    timeout = _config.check_timeout(timeout)
    start_timeout = _config.check_timeout(start_timeout, "start_timeout")
    backend = _config.resolve_backend(backend, world_size)
    start_method = start_path.check_method(start_method)
    payload = ship.dumps_call(fn, args, kwargs)

    group = RankGroup(
        world_size,
        backend,
        threads=threads,
        pg_timeout=timeout,
        start_method=start_method,
        env=env,
        start_timeout=start_timeout,
    )
    extra = {} if grace is None else {"grace": grace}
    ok = False
    try:
        values = group.execute(
            payload, timeout=timeout, stream=stream, on_failure=on_failure, fold=fold, **extra
        )
        ok = True
        return values
    finally:
        if not ok:
            group.kill()
        group.close()


def split_options(kwargs: dict) -> tuple[dict, dict]:
    """``kwargs`` of a tool that runs a function on ranks -> (launch's options among them, the
    function's own keyword arguments), told apart by name as `launch` tells them apart."""
    options = {k: v for k, v in kwargs.items() if k in OPTIONS}
    return options, {k: v for k, v in kwargs.items() if k not in OPTIONS}


def on_ranks(fn, args: tuple, options: dict, *, cluster=None) -> list:
    """``fn(*args)`` on ``cluster``'s live ranks, or on new ranks as `launch` runs it, with
    ``options`` (launch's keyword options, see `OPTIONS`). What `distlab.timeline.record` and
    `distlab.memory.record` run on.

    Raises what `launch` and `distlab.Cluster.run` raise, and ValueError for a ``world_size``
    that differs from the cluster's, or an option that only new ranks take (``backend``,
    ``threads``, ``start_method``, ``env``) given with a cluster.
    """
    if cluster is None:
        return launch(fn, *args, **options)
    options = dict(options)
    world_size = options.pop("world_size", None)
    if world_size is not None and world_size != cluster.world_size:
        raise InputError(
            f"world_size={world_size!r} but the cluster has {cluster.world_size} ranks: "
            "leave world_size out when you pass cluster="
        )
    for_new = sorted(k for k in options if k not in CLUSTER_OPTIONS)
    if for_new:
        raise InputError(
            f"{', '.join(k + '=' for k in for_new)} {'is' if len(for_new) == 1 else 'are'} for "
            "new ranks; a cluster's ranks are already set up (give it to distlab.Cluster(...) "
            "instead)"
        )
    return cluster.run(fn, *args, _record=False, **options)


def from_every_rank(cluster, fetch, *, missing: str) -> list:
    """``fetch()`` on every rank of ``cluster`` (default: the current cluster), one value per
    rank. A rank whose value is None has nothing to give: RuntimeError naming those ranks,
    ``"rank(s) 0, 2 " + missing``."""
    from . import cluster as _cluster

    cl = cluster if cluster is not None else _cluster.current()
    values = cl.run(fetch, _record=False)
    require_every_rank(values, missing)
    return values


def require_every_rank(values: list, missing: str) -> None:
    """RuntimeError ``"rank(s) 0, 2 " + missing`` if some of ``values`` (one per rank) are None."""
    ranks = [r for r, v in enumerate(values) if v is None]
    if ranks:
        raise RuntimeError(f"rank(s) {', '.join(map(str, ranks))} {missing}")
