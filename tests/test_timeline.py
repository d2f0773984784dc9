"""distlab.timeline: per-rank torch.profiler traces, their numbers, the merged file, and errors."""

from __future__ import annotations

import json
import sys
import time

import cloudpickle
import pytest
from synthetic_traces import trace

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


def _mlp_step(variant: str):
    """One recorded backward of a 6-layer MLP after a warm-up step, its gradients all-reduced
    one of three ways: ``blocking`` (a post-accumulate-grad hook per parameter that all-reduces
    and waits: no overlap possible), ``ddp`` (DDP's buckets, async) or ``after`` (one
    all_reduce per gradient after the backward)."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(6)])
    # a batch large enough that a layer's backward (~1 ms) outlasts a bucket's all_reduce
    x = torch.randn(1024, 256)
    if variant == "ddp":
        model = DDP(model, bucket_cap_mb=0.5)
    elif variant == "blocking":
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(lambda p: dist.all_reduce(p.grad))
    for step in range(2):
        with timeline.recording() if step == 1 else _nothing():
            model(x).sum().backward()
            if variant == "after":
                for p in model.parameters():
                    dist.all_reduce(p.grad)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _late_to_two_async_all_reduces():
    import torch
    import torch.distributed as dist

    if dist.get_rank() == 1:
        time.sleep(0.3)
    works = [dist.all_reduce(torch.ones(4), async_op=True) for _ in range(2)]
    for w in works:
        w.wait()




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
    assert tl.wait(0) >= 0.25, tl.table()  # rank 0 sat in the all_reduce for rank 1's 0.3 s
    assert tl.wait(1) < 0.05, tl.table()  # rank 1 arrived last: no wait
    assert [name for name, _ in tl.waits(0)] == ["c10d::allreduce_"]
    stats = tl.stats()
    assert stats[0]["comm"] >= 0.2 and stats[1]["idle"] >= 0.2, tl.table()
    assert stats[0]["total"] == stats[1]["total"] == tl.duration >= 0.3
    for s in stats:
        assert s["compute"] + s["comm"] - s["overlap"] + s["idle"] == pytest.approx(s["total"])


def test_two_collectives_waiting_for_one_late_rank_count_its_lateness_once():
    tl = timeline.record(_late_to_two_async_all_reduces, world_size=2)
    assert [round(w, 1) for _, w in tl.waits(0)] == [0.3, 0.3], tl.waits(0)
    assert 0.25 <= tl.wait(0) < 0.45, tl.table()  # 0.3 s once, not 0.6


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


def _overlap_share(tl) -> list[float]:
    return [tl.overlap(r) / tl.comm(r) for r in range(tl.world_size)]


def test_a_blocking_all_reduce_in_a_hook_scores_no_overlap_and_ddp_does(cluster):
    shares = {}
    for variant in ("blocking", "ddp", "after"):
        cluster.run(_mlp_step, variant)
        tl = timeline.collect(cluster)
        if variant != "ddp":
            assert tl.count("gloo:all_reduce") == [12, 12]  # 6 weights and 6 biases
        shares[variant] = _overlap_share(tl)
    # Every wait was inside AccumulateGrad. What still counts as overlap is the collective's own
    # dispatch (an op while the collective is under way): a few percent, more on a busy machine
    # (6.4% measured once under make test beside another process; 2.6% on its peer).
    assert max(shares["blocking"]) < 0.15, shares
    assert max(shares["after"]) < 0.05, shares
    # Buckets all-reduced while the backward went on. On a busy machine a rank that waits long
    # for its peer spends that wait after its backward has ended; the later rank does not.
    assert max(shares["ddp"]) > max(0.1, 2 * max(shares["blocking"])), shares


def test_collect_before_any_recording_says_what_to_run():
    with distlab.Cluster(world_size=2, timeout=30) as fresh:
        with pytest.raises(RuntimeError, match=r"rank\(s\) 0, 1 have recorded nothing yet"):
            timeline.collect(fresh)


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
    tl = timeline.Timeline([trace(0), trace(1)])
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
