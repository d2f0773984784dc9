"""`distlab.launch`: run a function on N local ranks, straight from a notebook cell."""

from __future__ import annotations

from . import _config, _ship
from ._group import RankGroup
from .errors import RankError, RankTimeout


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
        timeout: seconds before the run is declared hung; then the stack of every rank that is
            still running is shown and all ranks are stopped. Also the process group's timeout.
        threads: CPU threads per rank (``torch.set_num_threads``, ``OMP_NUM_THREADS``); default
            cores // world_size, at least 1, so ranks do not fight over the cores.
        stream: show output lines live, as the ranks print them (lines of different ranks then
            interleave; the default prints each rank's block after the run, deterministically).
        fold: show lines that every rank printed alike once, as ``[ranks 0-3] ...``, before
            what differs rank by rank (``False``: every rank's full block, ``[rank N]`` lines).
        start_method: ``"forkserver"`` (Linux default: ranks are forked from a helper process
            that has torch imported, in milliseconds) or ``"spawn"`` (a fresh interpreter per
            rank; macOS default).
        env: extra environment variables for the ranks.

    Returns:
        A list with one entry per rank: ``result[r]`` is what rank ``r`` returned.

    Raises:
        TypeError: ``fn`` is not callable, ``world_size`` is not an int, or an argument cannot be
            pickled (the message names it; create such objects inside ``fn``).
        ValueError: ``world_size < 1``, an unknown ``backend``, or NCCL without a GPU per rank.
        distlab.RankError: a rank raised or died. The root cause comes first, with its traceback
            (including your cell's lines); errors other ranks hit because of it are marked as
            consequences, and ranks still running are stopped.
        distlab.RankTimeout: ranks were still running after ``timeout`` seconds (a hung
            collective, usually). The message shows where each one was stuck.
        KeyboardInterrupt: you pressed stop; every rank is killed first.
    """
    _config.check_callable(fn)
    world_size = _config.check_world_size(world_size)
    timeout = _config.check_timeout(timeout)
    backend = _config.resolve_backend(backend, world_size)
    start_method = _config.check_start_method(start_method)
    payload = _ship.dumps_call(fn, args, kwargs)

    group = RankGroup(
        world_size,
        backend,
        threads=threads,
        pg_timeout=timeout,
        start_method=start_method,
        env=env,
    )
    ok = False
    try:
        values = group.execute(
            payload, timeout=timeout, stream=stream, on_failure="kill", fold=fold
        )
        ok = True
        return values
    except (RankError, RankTimeout) as e:
        raise e.with_traceback(None) from None  # the message says it all; skip distlab's frames
    finally:
        if ok:
            group.close()
        else:
            group.kill()
            group.close()
