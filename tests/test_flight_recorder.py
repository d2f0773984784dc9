"""distlab.flight_recorder: a rank's Flight Recorder buffer as records, and who entered last.

The tests with ranks check what torch 2.14's gloo really records (entry times, no progress, no
durations, a ring of TORCH_FR_BUFFER_SIZE entries); the others read dumps written by hand in
torch's format, with the cases real runs rarely give (a tie, a rank that never joined, NCCL's
durations, group "10" after group "2").
"""

from __future__ import annotations

import pickle

import pytest

import distlab
from distlab import flight_recorder as fr

DELAY = 0.15  # the straggler's lateness per step: far above scheduling noise on two busy cores


def _late_rank(slow_rank, steps=4):
    """Each rank calls ``steps`` all_reduces on a group of its own; ``slow_rank`` sleeps first."""
    import time

    import torch
    import torch.distributed as dist

    group = dist.new_group(group_desc="steps")
    dist.all_reduce(torch.ones(3))  # on the default group: left out below
    for _ in range(steps):
        if dist.get_rank() == slow_rank:
            time.sleep(DELAY)
        dist.all_reduce(torch.ones(212), group=group)
    return fr.dump(group), fr.dump(group.group_name)


def test_the_straggler_entered_every_call_last_and_waited_least():
    out = distlab.launch(_late_rank, 2, world_size=3, timeout=60)
    entries = [by_group for by_group, _ in out]
    # a group or its name: the same records (but `retired`, which gloo may set in between)
    assert [[(e.group, e.seq, e.time_created_ns) for e in mine] for mine in entries] == [
        [(e.group, e.seq, e.time_created_ns) for e in mine] for _, mine in out]
    for rank, mine in enumerate(entries):
        assert [(e.rank, e.group_desc, e.seq, e.op, e.input_sizes) for e in mine] == [
            (rank, "steps", seq, "gloo:all_reduce", ((212,),)) for seq in (1, 2, 3, 4)]
        # what gloo records in torch 2.14: when it was called; no progress, no duration
        assert all(e.state == "scheduled" for e in mine)
        assert all(e.time_started_ns is e.time_completed_ns is e.duration_ms is None
                   for e in mine)
    calls = fr.waits(entries)
    assert [(c.seq, sorted(c.entered)) for c in calls] == [(s, [0, 1, 2]) for s in (1, 2, 3, 4)]
    assert [c.last for c in calls].count(2) >= 3  # the straggler entered (nearly) every call last
    waited = fr.median_waits(calls)
    assert min(waited[0], waited[1]) > max(DELAY / 2, 4 * waited[2])
    assert all(c.waits[c.last] == 0.0 for c in calls)


def _calls(n):
    import torch
    import torch.distributed as dist

    for _ in range(n):
        dist.all_reduce(torch.ones(2))
    return fr.dump()


def test_the_buffer_keeps_the_last_TORCH_FR_BUFFER_SIZE_calls_and_zero_turns_it_off():
    kept = distlab.launch(_calls, 5, world_size=2, env={"TORCH_FR_BUFFER_SIZE": "2"})
    # distlab's own start-up collectives come first, so the numbers end at 5 and more
    assert [len(mine) for mine in kept] == [2, 2]
    assert kept[0][1].seq == kept[0][0].seq + 1 and kept[0][1].seq >= 5
    off = distlab.launch(_calls, 5, world_size=2, env={"TORCH_FR_BUFFER_SIZE": "0"})
    assert off == [[], []]


# -- dumps written by hand, in torch's format ----------------------------------------------------

T0 = 1_800_000_000_000_000_000  # a wall clock in ns


def _raw(group="0", seq=1, t=0.0, op="gloo:all_reduce", desc="default_pg", **more):
    """One entry as torch's dump holds it (its fields that `read` uses, and some it does not)."""
    entry = {
        "record_id": 0, "pg_id": int(group) if group.isdigit() else 9,
        "process_group": (group, desc), "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
        "profiling_name": op, "time_created_ns": T0 + int(t * 1e9), "input_sizes": [[4, 2]],
        "input_dtypes": ["Float"], "output_sizes": [[4, 2]], "output_dtypes": ["Float"],
        "state": "scheduled", "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None, "retired": True, "timeout_ms": 1800000,
        "is_p2p": False, "thread_name": "python", "thread_id": "1",
    }
    entry.update(more)
    return entry


def _dump(*entries):
    return {"version": "2.10", "pg_config": {}, "pg_status": {}, "comm_lib_version": "",
            "entries": list(entries)}


def test_read_takes_a_dump_its_pickle_or_its_file(tmp_path):
    dump = _dump(_raw(seq=1, t=0.5), _raw(group="1", desc="tp", seq=7))
    path = tmp_path / "rank_3"
    path.write_bytes(pickle.dumps(dump))
    from_dict = fr.read(dump, 3)
    assert fr.read(pickle.dumps(dump), 3) == from_dict == fr.read(path, 3) == fr.read(str(path), 3)
    first = from_dict[0]
    assert (first.rank, first.group, first.group_desc, first.seq, first.op) == (
        3, "0", "default_pg", 1, "gloo:all_reduce")
    assert first.input_sizes == first.output_sizes == ((4, 2),) and first.dtypes == ("Float",)
    assert first.time_created_ns == T0 + 500_000_000 and first.duration_ms is None
    assert (from_dict[1].group, from_dict[1].group_desc, from_dict[1].seq) == ("1", "tp", 7)


def test_nccls_progress_and_durations_are_kept():
    started, completed = T0 + 10, T0 + 2_000_010
    [e] = fr.read(_dump(_raw(op="nccl:all_reduce", state="completed", duration_ms=2.0,
                             time_discovered_started_ns=started,
                             time_discovered_completed_ns=completed)), 0)
    assert (e.state, e.time_started_ns, e.time_completed_ns, e.duration_ms) == (
        "completed", started, completed, 2.0)
    calls = fr.waits([[e], fr.read(_dump(_raw(op="nccl:all_reduce", duration_ms=0.5)), 1)])
    assert calls[0].durations_ms == {0: 2.0, 1: 0.5}


def test_waits_line_the_ranks_up_by_group_and_call_number():
    # rank 1 is 0.2 s late on call 1, rank 0 0.1 s late on call 2; group "10" sorts after "2"
    dumps = [
        _dump(_raw(seq=1, t=0.0), _raw(seq=2, t=1.1), _raw(group="10", seq=1, t=3.0),
              _raw(group="2", seq=1, t=2.0)),
        _dump(_raw(seq=1, t=0.2), _raw(seq=2, t=1.0), _raw(group="2", seq=1, t=2.0),
              _raw(group="10", seq=1, t=3.0)),
        _dump(_raw(seq=1, t=0.1), _raw(seq=2, t=1.0)),  # rank 2 is not in groups 2 and 10
    ]
    calls = fr.waits([fr.read(d, r) for r, d in enumerate(dumps)])
    assert [(c.group, c.seq, sorted(c.entered)) for c in calls] == [
        ("0", 1, [0, 1, 2]), ("0", 2, [0, 1, 2]), ("2", 1, [0, 1]), ("10", 1, [0, 1])]
    assert [c.last for c in calls] == [1, 0, 0, 0]  # ties: the lowest rank
    assert calls[0].waits == pytest.approx({0: 0.2, 1: 0.0, 2: 0.1})
    assert calls[1].waits == pytest.approx({0: 0.0, 1: 0.1, 2: 0.1})
    assert fr.median_waits(calls[:2]) == pytest.approx({0: 0.1, 1: 0.05, 2: 0.1})


def test_calls_one_rank_alone_recorded_and_point_to_point_calls_are_left_out():
    # both ranks send to each other (an exchange): same op, no call number, nothing to line up
    send = {"seq": 0, "op": "nccl:send", "is_p2p": True, "p2p_seq_id": 1}
    flat = (fr.read(_dump(_raw(seq=1), _raw(seq=2), _raw(**send)), 0)
            + fr.read(_dump(_raw(seq=1, t=0.3), _raw(t=0.5, **send)), 1))
    calls = fr.waits(flat)  # one flat list does as well as a list per rank
    assert [(c.seq, c.last) for c in calls] == [(1, 1)]


def test_a_rank_passed_twice_is_refused():
    mine = fr.read(_dump(_raw()), 0)
    with pytest.raises(ValueError, match="rank 0 recorded gloo:all_reduce #1 of group '0' twice"):
        fr.waits([mine, mine])


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda: fr.read({"entries": [{"state": "scheduled"}]}, 0), ValueError, "entry without"),
        (lambda: fr.read({"traceEvents": []}, 0), ValueError, "no 'entries'"),
        (lambda: fr.read([1, 2], 0), TypeError, "a Flight Recorder dump"),
        (lambda: fr.read(_dump(), "0"), TypeError, "rank must be an int"),
        (lambda: fr.waits([[{"rank": 0}]]), TypeError, "Entry records"),
        (lambda: fr.median_waits([]), ValueError, "no collectives"),
        (lambda: fr.dump(), RuntimeError, "after init_process_group"),
    ],
)
def test_what_cannot_be_read_says_what_to_pass(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_a_group_that_is_not_one_is_refused():
    with pytest.raises(TypeError, match="a process group"):
        fr._group_name(3)


def test_a_torch_without_a_dump_is_named(monkeypatch):
    import torch

    from distlab import _torch

    c10d = torch._C._distributed_c10d
    assert isinstance(_torch.flight_recorder_dump(), dict)  # this process: no group, a dump still
    for name in ("_dump_fr_trace", "_dump_nccl_trace"):
        monkeypatch.delattr(c10d, name, raising=False)
    with pytest.raises(RuntimeError, match="has no Flight Recorder dump"):
        _torch.flight_recorder_dump()
