"""distlab.timeline: per-rank torch.profiler traces, their numbers, the merged file, and errors."""

from __future__ import annotations

import json
import sys
import time

import cloudpickle
import pytest

import distlab
from distlab import timeline

cloudpickle.register_pickle_by_value(sys.modules[__name__])


# -- functions the ranks run ------------------------------------------------------------------


def _known_program():
    import torch
    import torch.distributed as dist
    from torch.profiler import record_function

    with record_function("forward"):
        x = torch.ones(32, 32) @ torch.ones(32, 32)
    with record_function("sync grads"):
        dist.all_reduce(x)
    return x[0, 0].item()


def _straggler():
    import torch
    import torch.distributed as dist

    if dist.get_rank() == 1:
        time.sleep(0.3)  # rank 1 is late: rank 0 waits for it inside the all_reduce
    dist.all_reduce(torch.ones(4))


def _trivial():
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(4))


@pytest.fixture(scope="module")
def cluster():
    c = distlab.Cluster(world_size=2, timeout=60)
    yield c
    c.shutdown()


# -- with new ranks (distlab.launch) ----------------------------------------------------------


def test_known_program_shows_its_labels_and_collective_in_order():
    tl = timeline.record(_known_program, world_size=2)
    assert tl.results == [64.0, 64.0]
    for r in range(2):
        assert tl.names(r) == ["forward", "sync grads"]
        assert tl.names(r, depth=None) == ["forward", "sync grads", "c10d::allreduce_"]
        assert tl.transports(r) == ["gloo:all_reduce"]
        (gloo,) = tl.find(r, "gloo:all_reduce")
        assert gloo.issued_by == "sync grads"  # the label around the call that issued it
        assert tl.find(r, "sync grads")[-1] == gloo
        assert tl.count("forward", r) == 1
        forward, sync = tl.find(r, "forward")[0], tl.find(r, "sync grads")[0]
        assert 0 <= forward.start < forward.end <= sync.start < gloo.start < gloo.end
        assert [e.name for e in tl.events(r, "op")][:1] == ["aten::ones"]
    assert tl.count("distlab:sync") == [0, 0]  # the ranks' meeting is left out
    assert repr(tl) == (
        "Timeline: 2 ranks, CPU\nranks 0,1:\n  forward > sync grads\n  comm: gloo:all_reduce x1"
    )


def test_straggler_makes_the_other_rank_wait_in_the_collective():
    tl = timeline.record(_straggler, world_size=2)
    assert tl.wait(0) >= 0.2, tl.table()  # rank 0 sat in the all_reduce for rank 1's 0.3 s
    assert tl.wait(1) < 0.1, tl.table()  # rank 1 arrived last: no wait
    assert [name for name, _ in tl.waits(0)] == ["gloo:all_reduce"]
    stats = tl.stats()
    assert stats[0]["comm"] >= 0.2 and stats[1]["idle"] >= 0.2, tl.table()
    assert stats[0]["total"] == stats[1]["total"] == tl.duration >= 0.3
    for s in stats:
        assert s["compute"] + s["comm"] - s["overlap"] + s["idle"] == pytest.approx(s["total"])


def test_merged_trace_file_is_json_with_one_process_per_rank(tmp_path):
    tl = timeline.record(_known_program, world_size=2)
    path = tl.save(tmp_path / "trace.json")
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    events = data["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    spans = [e for e in events if e.get("ph") == "X"]
    assert {e["pid"] for e in spans} == {0, 1}
    assert all(e["ts"] >= 0 for e in spans)
    for r in (0, 1):
        mine = [e["name"] for e in spans if e["pid"] == r]
        assert {"forward", "sync grads", "gloo:all_reduce"} <= set(mine)
        assert "distlab:sync" not in mine
        threads = {
            e["args"]["name"] for e in events if e.get("name") == "thread_name" and e["pid"] == r
        }
        assert "main" in threads


def test_picture_has_a_lane_per_rank_and_png_bytes():
    tl = timeline.record(_straggler, world_size=2)
    fig = tl.figure()
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["rank 0  labels", "compute", "comm", "rank 1  labels", "compute", "comm"]
    assert tl.png().startswith(b"\x89PNG\r\n\x1a\n")
    png, meta = tl._repr_png_()
    assert meta["width"] > 0


def test_recording_costs_little_time():
    start = time.perf_counter()
    distlab.launch(_trivial, world_size=2)
    plain = time.perf_counter() - start
    start = time.perf_counter()
    timeline.record(_trivial, world_size=2)
    profiled = time.perf_counter() - start
    assert profiled - plain < 1.0, (plain, profiled)


# -- with a live cluster ----------------------------------------------------------------------


def test_record_on_a_cluster_and_world_size_must_match(cluster):
    tl = timeline.record(_known_program, cluster=cluster)
    assert tl.world_size == 2 and tl.results == [64.0, 64.0]
    assert tl.names(1) == ["forward", "sync grads"]
    with pytest.raises(ValueError, match="the cluster has 2 ranks"):
        timeline.record(_known_program, cluster=cluster, world_size=4)
    with pytest.raises(ValueError, match="for new ranks"):
        timeline.record(_known_program, cluster=cluster, threads=1)


def test_recording_in_a_ranks_cell_then_collect_in_the_kernel(cluster):
    cluster.exec(
        "from distlab import timeline\n"
        "from torch.profiler import record_function\n"
        "with timeline.recording():\n"
        "    with record_function('step'):\n"
        "        y = torch.ones(8) * (rank + 1)\n"
        "        dist.all_reduce(y)\n"
        "        dist.all_reduce(y)\n"
    )
    tl = timeline.collect(cluster)
    assert tl.names(0) == tl.names(1) == ["step"]
    assert tl.names(0, depth=None) == ["step", "c10d::allreduce_", "c10d::allreduce_"]
    assert tl.transports(0) == ["gloo:all_reduce"] * 2
    assert "comm: gloo:all_reduce x2" in repr(tl)
    assert timeline.collect().names(0) == ["step"]  # the current cluster, collected again


def test_recordings_do_not_nest_and_sync_false_works_on_some_ranks(cluster):
    with pytest.raises(distlab.RankError, match="do not nest"):
        cluster.exec(
            "from distlab import timeline\n"
            "with timeline.recording(sync=False):\n"
            "    with timeline.recording(sync=False):\n"
            "        pass\n",
            ranks=[0],
        )
    out = cluster.exec(
        "with timeline.recording(sync=False) as rec:\n"
        "    torch.ones(2) + 1\n"
        "sorted({e['name'] for e in rec.trace['events']} & {'aten::ones', 'aten::add'})",
        ranks=[1],
    )
    assert out[0] == "['aten::add', 'aten::ones']"


def test_collect_before_any_recording_says_what_to_run():
    with distlab.Cluster(world_size=2, timeout=30) as fresh:
        with pytest.raises(RuntimeError, match=r"rank\(s\) 0, 1 have recorded nothing yet"):
            timeline.collect(fresh)


# -- numbers from hand-made traces (no ranks) -------------------------------------------------


def _trace(rank, *, main=(), gloo=(), sync_end=100.0):
    """A trace as `recording` returns it; events as (name, cat, start_us, end_us)."""
    events = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "distlab:sync",
            "tid": 1,
            "ts": sync_end - 10,
            "dur": 10.0,
        }
    ]
    for tid, evs in ((1, main), (2, gloo)):
        for name, cat, a, b in evs:
            events.append({"ph": "X", "cat": cat, "name": name, "tid": tid, "ts": a, "dur": b - a})
    return {
        "rank": rank,
        "world_size": 2,
        "pid": 10 + rank,
        "main_tid": 1,
        "base_ns": 0,
        "cuda": False,
        "threads": {"1": "thread 1 (python)", "2": "thread 2 (gloo)"},
        "events": events,
    }


def test_compute_comm_overlap_idle_and_wait_from_a_known_trace():
    # Rank 0: computes 100-300 us, calls all_reduce at 150; gloo runs it 160-500 (rank 1 is
    # late: it calls at 400). Rank 1: computes 300-400, its gloo part runs 410-500.
    r0 = _trace(
        0,
        main=[("aten::mm", "cpu_op", 100, 300), ("c10d::allreduce_", "cpu_op", 150, 160)],
        gloo=[("gloo:all_reduce", "user_annotation", 160, 500)],
    )
    r1 = _trace(
        1,
        main=[("aten::mm", "cpu_op", 300, 400), ("c10d::allreduce_", "cpu_op", 400, 410)],
        gloo=[("gloo:all_reduce", "user_annotation", 410, 500)],
    )
    tl = timeline.Timeline([r0, r1])
    us = 1e-6
    assert tl.duration == pytest.approx(400 * us)  # from the sync's end (100) to 500
    assert tl.compute(0) == pytest.approx(190 * us)  # 100-300 minus the call 150-160
    assert tl.comm(0) == pytest.approx(350 * us)  # 150-500
    assert tl.overlap(0) == pytest.approx(140 * us)  # 160-300
    assert tl.idle(0) == pytest.approx(0.0)
    assert tl.waits(0) == [("gloo:all_reduce", pytest.approx(250 * us))]  # 160 -> 410
    assert tl.wait(1) == 0.0
    assert tl.idle(1) == pytest.approx(200 * us)  # 100-300
    assert tl.find(0, "gloo:all_reduce")[0].issued_by is None  # no label around the call
    assert (
        repr(tl)
        == "Timeline: 2 ranks, CPU\nranks 0,1:\n  c10d::allreduce_\n  comm: gloo:all_reduce x1"
    )


def test_autograd_wrappers_are_not_compute_they_span_the_hooks_waits():
    # A backward node's wrapper spans an FSDP-style hook that waits 200-400 for a collective.
    main = [
        ("autograd::engine::evaluate_function: AddmmBackward0", "cpu_op", 100, 500),
        ("AddmmBackward0", "cpu_op", 100, 500),
        ("aten::mm", "cpu_op", 110, 190),
        ("c10d::_reduce_scatter_base_", "cpu_op", 195, 200),
    ]
    gloo = [("gloo:all_reduce", "user_annotation", 200, 400)]
    tl = timeline.Timeline([_trace(0, main=main, gloo=gloo), _trace(1, main=main, gloo=gloo)])
    assert [e.name for e in tl.events(0, "op")] == ["aten::mm"]
    assert tl.compute(0) == pytest.approx(80e-6)
    assert tl.overlap(0) == 0.0


def test_text_folds_only_ranks_that_did_the_same():
    a = _trace(0, main=[("fwd", "user_annotation", 100, 200), ("fwd", "user_annotation", 200, 300)])
    b = _trace(1, main=[("bwd", "user_annotation", 100, 200)])
    assert timeline.Timeline([a, b]).text() == (
        "Timeline: 2 ranks, CPU\nrank 0:\n  fwd x2\n  comm: none\nrank 1:\n  bwd\n  comm: none"
    )


# -- errors ------------------------------------------------------------------------------------


def test_bad_input_is_refused_with_what_to_do():
    with pytest.raises(TypeError, match="needs a function to run on every rank"):
        timeline.record(42)
    with pytest.raises(TypeError, match="sync must be True or False"):
        timeline.recording(sync="yes")
    with pytest.raises(ValueError, match="needs one trace per rank"):
        timeline.Timeline([])
    with pytest.raises(ValueError, match="trace 0 is not a distlab.timeline trace"):
        timeline.Timeline([{"events": []}])
    tl = timeline.Timeline([_trace(0), _trace(1)])
    with pytest.raises(ValueError, match=r"rank 2 is not in this timeline \(ranks 0\.\.1\)"):
        tl.events(2)
    with pytest.raises(TypeError, match="rank must be an int"):
        tl.names("0")
    with pytest.raises(ValueError, match="kind must be"):
        tl.events(0, kind="gpu")
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda'"):
        tl.compute(0, device="tpu")
    with pytest.raises(FileNotFoundError):
        tl.save("/nonexistent-dir/trace.json")


def test_exported_from_distlab():
    assert distlab.timeline is timeline
    assert callable(timeline.record) and callable(timeline.collect)
