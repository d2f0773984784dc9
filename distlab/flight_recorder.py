"""Read the Flight Recorder: what each rank's collectives were, and who entered each one last.

    from distlab import flight_recorder
    entries = cluster.run(flight_recorder.dump)          # on every rank: its own records
    entries = cluster.run(flight_recorder.dump, "1")     # ...of one group (by its group_name)
    calls = flight_recorder.waits(entries)               # per collective, across the ranks
    calls[0].last, calls[0].waits                        # who entered last; how long each waited
    flight_recorder.median_waits(calls)                  # per rank: the straggler waits least

The Flight Recorder keeps, in every process, a ring buffer of the collectives it called
(notebook 18): group, call number, op, sizes, dtypes, and the moment it was called. `dump` reads
this rank's buffer into `Entry` records, plain values that pickle back to the kernel; `read`
does the same for a dump already unpickled or written to a file. `waits` lines the ranks'
records up by group and call number and answers the straggler question: every rank waits in a
collective until the last rank arrives, so the rank that enters last is the one the others
wait for (notebook 27).

What torch records depends on the backend (gloo: measured on torch 2.14.1; NCCL: as PyTorch's
Flight Recorder tutorial describes it, not measured here):

- gloo records every collective (not ``send``/``recv``), by default (``TORCH_FR_BUFFER_SIZE``:
  2000 entries unless set, read once per process before its first group is made; 0 turns it
  off), with ``time_created_ns``, the wall clock when the rank *called* it. It tracks no
  progress: ``state`` stays ``"scheduled"``, ``time_started_ns``/``time_completed_ns``/
  ``duration_ms`` stay None, and only ``retired`` says that the collective finished. So on gloo
  a wait is read off the entry times (the last rank's entry minus this rank's), and the time
  *inside* a collective is not in the dump: time it by hand (``time.perf_counter()`` around the
  call) or with `distlab.timeline` (its ``comm`` and ``wait`` columns).
- NCCL tracks progress from its watchdog; with ``TORCH_NCCL_ENABLE_TIMING=1`` an entry has
  ``duration_ms``, the kernel's time on the GPU (measured by CUDA events), waits for late ranks
  included. NCCL's CPU side returns before the kernel runs, so there the entry time says when a
  rank *enqueued* the call, not when its GPU got to it: read the durations first.

Entry times come from each host's wall clock: across machines they are as good as the clocks'
agreement (NTP: often a millisecond or better, sometimes much worse), so a straggler must be
late by much more than that to be read off them. Ranks on one machine share one clock.

It reads what torch recorded; starting the ranks and running `dump` on them is left to
`distlab.launch` and `distlab.Cluster`.
"""

from __future__ import annotations

import pickle
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from . import _torch
from .errors import InputError, InputTypeError

__all__ = ["CollectiveAcrossRanks", "Entry", "dump", "median_waits", "read", "waits"]


@dataclass(frozen=True)
class Entry:
    """One collective as one rank's Flight Recorder saw it.

    Attributes:
        rank: the rank whose buffer this came from (its rank in the default group).
        group: the process group's name as torch numbers them (``"0"``: the default group,
            then ``"1"``, ``"2"``, ... in the order groups were made; ``group.group_name``).
        group_desc: its description (``"default_pg"``, or ``new_group(group_desc=...)``).
        seq: the call number in that group (``collective_seq_id``, from 1): the same number
            means the same call on every rank, which is what lines the ranks up.
        p2p: a point-to-point call (``send``/``recv``), numbered apart (``p2p_seq_id``) and
            left out by `waits`: its two sides are different ops.
        op: the backend's name for it (``"gloo:all_reduce"``, ``"nccl:all_reduce"``).
        input_sizes, output_sizes: the tensors' shapes (a list per tensor).
        dtypes: the input tensors' element types (``"Float"``).
        state: ``"scheduled"``, ``"started"`` or ``"completed"`` (gloo: always ``"scheduled"``).
        retired: the collective finished (gloo sets it a moment after the call returns, so the
            last call of a dump may not show it yet; a hung call stays False).
        time_created_ns: the wall clock (ns since 1970) when the rank called it.
        time_started_ns, time_completed_ns: when a watchdog saw it start and end (NCCL);
            None where not tracked (gloo).
        duration_ms: its time on the device (NCCL with ``TORCH_NCCL_ENABLE_TIMING=1``); None
            where not recorded (gloo, NCCL without timing).
    """

    rank: int
    group: str
    group_desc: str
    seq: int
    p2p: bool
    op: str
    input_sizes: tuple
    output_sizes: tuple
    dtypes: tuple
    state: str
    retired: bool
    time_created_ns: int
    time_started_ns: int | None = None
    time_completed_ns: int | None = None
    duration_ms: float | None = None


def dump(group=None, *, stacks: bool = False) -> list[Entry]:
    """This rank's Flight Recorder buffer as `Entry` records, oldest first (run it on the ranks:
    ``cluster.run(flight_recorder.dump)``).

    Args:
        group: keep only this process group's calls (a ``ProcessGroup``, or its name as a
            string); default: every group's.
        stacks: ask torch for each call's Python stack too (slow the first time: torch imports
            its compiler to read them). `Entry` keeps none of it; read the raw dump
            (``torch._C._distributed_c10d._dump_fr_trace()``) for stacks.

    Returns:
        A list of `Entry`, empty if ``TORCH_FR_BUFFER_SIZE`` is 0 in this process.

    Raises:
        RuntimeError: no default process group here (call it on a rank, after
            ``init_process_group``), or this torch has no Flight Recorder dump (torch 2.8 and
            later have one; install the course's torch).
        TypeError: ``group`` is neither a ProcessGroup nor a string.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "flight_recorder.dump() reads a rank's record of its collectives: call it on a rank "
            "after init_process_group (cluster.run(flight_recorder.dump), or inside the function "
            "you launch)")
    name = _group_name(group)
    entries = read(_torch.flight_recorder_dump(stacks=stacks), dist.get_rank())
    return [e for e in entries if name is None or e.group == name]


def _group_name(group) -> str | None:
    if group is None or isinstance(group, str):
        return group
    name = getattr(group, "group_name", None)
    if not isinstance(name, str):
        raise InputTypeError(
            f"group must be a process group (dist.new_group(...)) or its name, got {group!r}")
    return name


def read(raw, rank: int) -> list[Entry]:
    """The `Entry` records of one rank's dump.

    Args:
        raw: the dump: the dict torch's ``_dump_fr_trace`` unpickles to, its pickled bytes, or
            the path of a file holding them (what ``TORCH_FR_DUMP_TEMP_FILE`` makes NCCL write
            on a timeout).
        rank: the rank it came from (a dump does not say).

    Returns:
        A list of `Entry`, in the buffer's order (oldest first).

    Raises:
        ValueError: ``raw`` is not a Flight Recorder dump (no ``entries``), or an entry lacks a
            field that `Entry` needs (the message names it and shows the entry).
        TypeError: ``raw`` is none of the above, or ``rank`` is not an int.
    """
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise InputTypeError(f"rank must be an int (the rank the dump came from), got {rank!r}")
    if isinstance(raw, (str, Path)):
        raw = Path(raw).read_bytes()
    if isinstance(raw, (bytes, bytearray)):
        raw = pickle.loads(raw)
    if not isinstance(raw, Mapping):
        raise InputTypeError(
            f"raw must be a Flight Recorder dump (a dict, its pickle, or a file), got {raw!r}")
    if "entries" not in raw:
        raise InputError(
            f"not a Flight Recorder dump: it has {sorted(raw)}, no 'entries' (a dump holds "
            "'version', 'pg_config', 'pg_status' and 'entries')")
    return [_entry(e, rank) for e in raw["entries"]]


def _entry(e: Mapping, rank: int) -> Entry:
    try:
        name, desc = e["process_group"]
        return Entry(
            rank=rank, group=str(name), group_desc=str(desc),
            seq=int(e["collective_seq_id"]), p2p=bool(e.get("is_p2p", False)),
            op=str(e["profiling_name"]),
            input_sizes=tuple(tuple(s) for s in e["input_sizes"]),
            output_sizes=tuple(tuple(s) for s in e["output_sizes"]),
            dtypes=tuple(e.get("input_dtypes", ())), state=str(e["state"]),
            retired=bool(e.get("retired", False)), time_created_ns=int(e["time_created_ns"]),
            time_started_ns=e.get("time_discovered_started_ns"),
            time_completed_ns=e.get("time_discovered_completed_ns"),
            duration_ms=e.get("duration_ms"),
        )
    except KeyError as missing:
        raise InputError(f"a Flight Recorder entry without {missing}: {dict(e)!r}") from None


@dataclass(frozen=True)
class CollectiveAcrossRanks:
    """One call of one group, as every rank that recorded it saw it.

    Attributes:
        group, seq, op: which call (see `Entry`).
        entered: rank -> when it called it (``time_created_ns``), for the ranks that did.
        last: the rank that entered last (the one the others waited for); on a tie, the
            lowest of them.
        waits: rank -> seconds between its entry and the last rank's: how long it sat in the
            collective waiting for the others (0.0 for ``last``). A lower bound of its time
            inside: the transfer itself comes on top.
        durations_ms: rank -> its recorded ``duration_ms`` (None on gloo: not recorded).
    """

    group: str
    seq: int
    op: str
    entered: dict[int, int]
    last: int
    waits: dict[int, float]
    durations_ms: dict[int, float | None]


def waits(entries: Iterable) -> list[CollectiveAcrossRanks]:
    """Every collective that two or more ranks recorded, lined up across the ranks by group, call
    number and op, in call order (point-to-point calls are left out).

    Args:
        entries: the ranks' `Entry` records: a list per rank (what ``cluster.run(dump)``
            returns) or one flat list.

    Returns:
        A list of `CollectiveAcrossRanks`, sorted by group and call number. A call that only
        one rank recorded (a rank that never joined, or whose buffer already forgot it) is left
        out: ask `torch.distributed.flight_recorder`'s analyzer (``torchfrtrace``, notebook 18)
        which ranks are missing.

    Raises:
        TypeError: something other than `Entry` records was passed.
        ValueError: one rank recorded the same call twice (two dumps of one rank passed).
    """
    by_call: dict[tuple, dict[int, Entry]] = {}
    for e in _flat(entries):
        if e.p2p:
            continue
        seen = by_call.setdefault((e.group, e.seq, e.op), {})
        if e.rank in seen:
            raise InputError(
                f"rank {e.rank} recorded {e.op} #{e.seq} of group {e.group!r} twice: pass each "
                "rank's dump once")
        seen[e.rank] = e
    out = []
    for (group, seq, op), ranks in sorted(by_call.items(), key=_call_order):
        if len(ranks) < 2:
            continue
        entered = {r: ranks[r].time_created_ns for r in sorted(ranks)}
        latest = max(entered.values())
        last = min(r for r, t in entered.items() if t == latest)
        out.append(CollectiveAcrossRanks(
            group=group, seq=seq, op=op, entered=entered, last=last,
            waits={r: (latest - t) / 1e9 for r, t in entered.items()},
            durations_ms={r: ranks[r].duration_ms for r in entered}))
    return out


def _call_order(item) -> tuple:
    (group, seq, op), _ = item
    return (int(group) if group.isdigit() else float("inf"), group, seq, op)


def _flat(entries) -> list[Entry]:
    flat = []
    for item in entries:
        for e in (item if isinstance(item, (list, tuple)) else [item]):
            if not isinstance(e, Entry):
                raise InputTypeError(
                    "waits() takes the Entry records of flight_recorder.dump (a list per rank), "
                    f"got {e!r}")
            flat.append(e)
    return flat


def median_waits(collectives: Iterable[CollectiveAcrossRanks]) -> dict[int, float]:
    """rank -> its median wait (seconds) over ``collectives``: the straggler's is the smallest,
    the others' about its lateness. Medians, so that one slow call (a first call's warm-up, a
    garbage collection) does not move them.

    Raises:
        ValueError: no collectives (nothing to take a median of).
    """
    per_rank: dict[int, list[float]] = {}
    for c in collectives:
        for r, w in c.waits.items():
            per_rank.setdefault(r, []).append(w)
    if not per_rank:
        raise InputError("median_waits() got no collectives: did two ranks record any?")
    return {r: statistics.median(per_rank[r]) for r in sorted(per_rank)}
