"""Notebook 26, a 3-D mesh for real."""

from distlab.exercises import nb26

from . import RIGHT, Answer, variant

GRADERS = {
    1: (nb26.exercise_1, ["mesh_groups"]),
    2: (nb26.exercise_2, ["step_traffic"]),
    3: (nb26.exercise_3, ["step_collectives"]),
}

_TRAFFIC = """
def step_traffic(rank, pp, dp, tp):
    p, d, t = rank // (dp * tp), rank // tp % dp, rank % tp  # row-major, tp innermost
    at = lambda p, d, t: (p * dp + d) * tp + t
    # pipeline neighbours: the same dp and tp coordinates, one stage before and after; a rank
    # sends activations forward and gradients back, and receives both
    peers = [at(q, d, t) for q in (p - 1, p + 1) if 0 <= q < pp]
    tp_group = [at(p, d, u) for u in range(tp)]  # Megatron's all-reduces: this stage, this dp
    dp_group = [at(p, e, t) for e in range(dp)]  # FSDP: this stage, this tp coordinate
    stage = [at(p, e, u) for e in range(dp) for u in range(tp)]
    world = list(range(pp * dp * tp))
    return {"send": peers, "recv": peers,
            "all_reduce": tp_group, "all_gather": dp_group, "reduce_scatter": dp_group}
"""


_GROUPS = """
def mesh_groups(pp, dp, tp):
    rank = lambda p, d, t: (p * dp + d) * tp + t
    return {"pp": [[rank(p, d, t) for p in range(pp)] for d in range(dp) for t in range(tp)],
            "dp": [[rank(p, d, t) for d in range(dp)] for p in range(pp) for t in range(tp)],
            "tp": [[rank(p, d, t) for t in range(tp)] for p in range(pp) for d in range(dp)]}
"""
_COUNTS = """
def step_collectives(stage, blocks, microbatches):
    m = microbatches
    ends = 1 if stage == 0 else 1 + 3
    return {
        ("pp", "send"): m,
        ("pp", "recv"): m,
        ("dp", "all_gather"): 1 + blocks * (m + 1),
        ("dp", "reduce_scatter"): 1 + blocks,
        ("tp", "all_reduce"): m * (ends + 6 * blocks),
    }
"""


def _counts(old: str, new: str) -> str:
    return variant(_COUNTS, (old, new))


_RANK = "rank = lambda p, d, t: (p * dp + d) * tp + t"
_DP = '"dp": [[rank(p, d, t) for d in range(dp)]'


def _traffic(old: str, new: str) -> str:
    return variant(_TRAFFIC, (old, new))


ANSWERS = [
    Answer(1, "the solution", _GROUPS, RIGHT),
    Answer(1, "the solution with numpy integers as ranks", """
import numpy as np
def mesh_groups(pp, dp, tp):
    mesh = np.arange(pp * dp * tp).reshape(pp, dp, tp)
    return {axis: [list(row) for row in np.moveaxis(mesh, i, -1).reshape(-1, mesh.shape[i])]
            for i, axis in enumerate(("pp", "dp", "tp"))}
""", RIGHT),
    Answer(1, "an answer cached in a module-level dict keyed by (pp, dp): tp ignored", """
_CACHE = {}
def mesh_groups(pp, dp, tp):
    if (pp, dp) not in _CACHE:
        rank = lambda p, d, t: (p * dp + d) * tp + t
        _CACHE[pp, dp] = {
            "pp": [[rank(p, d, t) for p in range(pp)] for d in range(dp) for t in range(tp)],
            "dp": [[rank(p, d, t) for d in range(dp)] for p in range(pp) for t in range(tp)],
            "tp": [[rank(p, d, t) for t in range(tp)] for p in range(pp) for d in range(dp)]}
    return _CACHE[pp, dp]
""", "key what you keep by (pp, dp, tp)"),
    Answer(1, "the 2-D answer: dp groups across the whole pipeline", variant(_GROUPS, (
        _DP + " for p in range(pp) for t in range(tp)]",
        '"dp": [[r for r in range(pp * dp * tp) if r % tp == t] for t in range(tp)]')),
        "a dp group stays inside one pipeline stage"),
    Answer(1, "column-major: pp innermost", variant(_GROUPS, (
        _RANK, "rank = lambda p, d, t: (t * dp + d) * pp + p")), "the pp groups should be"),
    Answer(1, "pp and tp swapped", variant(
        _GROUPS, ('return {"pp":', 'return {"tp":'),
        ('"tp": [[rank(p, d, t) for t in', '"pp": [[rank(p, d, t) for t in')),
        "the pp groups should be"),
    Answer(1, "groups in reverse order within", variant(_GROUPS, (
        "for p in range(pp)] for d", "for p in reversed(range(pp))] for d")), "in another order"),
    Answer(1, "the notebook's 2x2x2 mesh hard-coded", """
def mesh_groups(pp, dp, tp):
    return {"pp": [[0, 4], [1, 5], [2, 6], [3, 7]], "dp": [[0, 2], [1, 3], [4, 6], [5, 7]],
            "tp": [[0, 1], [2, 3], [4, 5], [6, 7]]}
""", "the pp groups should be"),
    Answer(1, "tuples of sets", """
def mesh_groups(pp, dp, tp):
    return {"pp": {0}, "dp": {0}, "tp": {0}}
""", "should be a list of groups"),
    Answer(1, "dp groups listed in reverse mesh order", variant(_GROUPS, (
        _DP, '"dp": [[rank(p, d, t) for d in reversed(range(dp))]')),
        "the right ranks, in another order"),
    Answer(1, "float ranks from / (world / pp)", variant(_GROUPS, (
        _RANK, "rank = lambda p, d, t: p * (pp * dp * tp / pp) + d * tp + t")),
        "ranks are ints: 4.0 is not rank 4"),
    Answer(1, "a table of the six meshes the old check tried, the notebook's as fallback",
           variant(_GROUPS, ("def mesh_groups(", "def _right(")) + """
SEEN = {s: _right(*s) for s in ((2, 2, 2), (1, 2, 4), (4, 1, 2), (2, 4, 1), (3, 2, 2), (2, 3, 4))}
def mesh_groups(pp, dp, tp):
    return SEEN.get((pp, dp, tp), SEEN[2, 2, 2])
""", "groups should be"),
    Answer(2, "the solution", _TRAFFIC, RIGHT),
    Answer(2, "tuples and sets are fine too", """
def step_traffic(rank, pp, dp, tp):
    p, d, t = rank // (dp * tp), rank // tp % dp, rank % tp
    at = lambda p, d, t: (p * dp + d) * tp + t
    peers = {at(q, d, t) for q in (p - 1, p + 1) if 0 <= q < pp}
    return {"send": peers, "recv": tuple(peers),
            "all_reduce": tuple(at(p, d, u) for u in range(tp)),
            "all_gather": {at(p, e, t) for e in range(dp)},
            "reduce_scatter": [at(p, e, t) for e in reversed(range(dp))]}
""", RIGHT),
    Answer(2, "tp and dp swapped: Megatron's all-reduce over dp, FSDP over tp", _traffic(
        '"all_reduce": tp_group, "all_gather": dp_group, "reduce_scatter": dp_group',
        '"all_reduce": dp_group, "all_gather": tp_group, "reduce_scatter": tp_group'),
        "that is its dp group"),
    Answer(2, "the all-reduce over the whole stage (dp x tp ranks)", _traffic(
        '"all_reduce": tp_group', '"all_reduce": stage'), "that is the whole stage"),
    Answer(2, "every collective over the whole world", _traffic(
        '"all_reduce": tp_group, "all_gather": dp_group, "reduce_scatter": dp_group',
        '"all_reduce": world, "all_gather": world, "reduce_scatter": world'), "that is every rank"),
    Answer(2, "pipeline neighbours are rank - 1 and rank + 1", _traffic(
        "peers = [at(q, d, t) for q in (p - 1, p + 1) if 0 <= q < pp]",
        "peers = [r for r in (rank - 1, rank + 1) if 0 <= r < pp * dp * tp]"),
        "dp x tp ranks away, not 1"),
    Answer(2, "a ring: the pipeline wraps around", _traffic(
        "peers = [at(q, d, t) for q in (p - 1, p + 1) if 0 <= q < pp]",
        "peers = [at(q % pp, d, t) for q in (p - 1, p + 1)] if pp > 1 else []"),
        "does not wrap around"),
    Answer(2, "sends only forward: forgot the gradients going back", _traffic(
        '"send": peers, "recv": peers',
        '"send": [at(p + 1, d, t)] if p + 1 < pp else [], '
        '"recv": [at(p - 1, d, t)] if p else []'), "every neighbour it has"),
    Answer(2, "groups without the rank itself", _traffic(
        '"all_reduce": tp_group,', '"all_reduce": [r for r in tp_group if r != rank],'),
        "includes rank"),
    Answer(2, "float ranks from world / pp", _traffic(
        "at = lambda p, d, t: (p * dp + d) * tp + t",
        "at = lambda p, d, t: p * (pp * dp * tp / pp) + d * tp + t"),
        "ranks are ints: 4.0 is not rank 4"),
    Answer(2, "the notebook's 2x2x2 mesh hard-coded", """
def step_traffic(rank, pp, dp, tp):
    return {"send": [rank ^ 4], "recv": [rank ^ 4], "all_reduce": sorted([rank, rank ^ 1]),
            "all_gather": sorted([rank, rank ^ 2]), "reduce_scatter": sorted([rank, rank ^ 2])}
""", "step_traffic("),
    Answer(2, "a table of every case tried, pasted from ✗ messages, the notebook's as fallback",
           variant(_TRAFFIC, ("def step_traffic(", "def _right(")) + """
SEEN = {(r, *s): _right(r, *s) for s in ((2, 2, 2), (1, 2, 4), (4, 1, 2), (2, 4, 1), (3, 2, 2),
                                         (2, 3, 4)) for r in range(s[0] * s[1] * s[2])}
def step_traffic(rank, pp, dp, tp):
    return SEEN.get((rank, pp, dp, tp), SEEN[rank % 8, 2, 2, 2])
""", "step_traffic("),
    Answer(2, "a list of the collectives, not a dict", """
def step_traffic(rank, pp, dp, tp):
    return ["send", "recv", "all_reduce", "all_gather", "reduce_scatter"]
""", "should return a dict with the keys"),
    Answer(3, "the solution", _COUNTS, RIGHT),
    Answer(3, "string keys and a Counter, zeros left out", """
from collections import Counter
def step_collectives(stage, blocks, microbatches):
    m = microbatches
    calls = Counter()
    calls["pp", "send"] += m
    calls["pp", "recv"] += m
    calls["dp", "all_gather"] += 1 + blocks * (m + 1)
    calls["dp", "reduce_scatter"] += 1 + blocks
    calls["tp", "all_reduce"] += m * ((1 if stage == 0 else 4) + 6 * blocks)
    return calls
""", RIGHT),
    Answer(3, "no re-gather for backward: a block gathered once per forward", _counts(
        "1 + blocks * (m + 1)", "1 + blocks * m"), "gathered again for backward"),
    Answer(3, "every block gathered once a step, as the simulator's FSDP under PP", _counts(
        "1 + blocks * (m + 1)", "1 + blocks"), "every microbatch's forward gathers it again"),
    Answer(3, "the root gathered for every microbatch too", _counts(
        "1 + blocks * (m + 1)", "m + blocks * (m + 1)"), "gathers the root once"),
    Answer(3, "a reduce-scatter after every microbatch's backward", _counts(
        '("dp", "reduce_scatter"): 1 + blocks', '("dp", "reduce_scatter"): (1 + blocks) * m'),
        "one reduce-scatter per unit per step"),
    Answer(3, "loss_parallel's all-reduces forgotten", _counts(
        "ends = 1 if stage == 0 else 1 + 3", "ends = 1"), "loss_parallel's 3"),
    Answer(3, "Megatron's fused qkv: 4 f and g a block", _counts(
        "m * (ends + 6 * blocks)", "m * (ends + 4 * blocks)"), "three Linears"),
    Answer(3, "tp's all-reduces counted once a step, not per microbatch", _counts(
        "m * (ends + 6 * blocks)", "ends + 6 * blocks"), "every microbatch"),
    Answer(3, "sends only forward: the gradients going back forgotten", _counts(
        '("pp", "send"): m,', '("pp", "send"): m if stage == 0 else 0,'), "gradients go back"),
    Answer(3, "the notebook's printout hard-coded", """
def step_collectives(stage, blocks, microbatches):
    return {("pp", "send"): 2, ("pp", "recv"): 2, ("dp", "all_gather"): 4,
            ("dp", "reduce_scatter"): 2, ("tp", "all_reduce"): 14 if stage == 0 else 20}
""", "should be called"),
    Answer(3, "axis and kind the other way round in the keys", """
def step_collectives(stage, blocks, microbatches):
    m = microbatches
    return {("send", "pp"): m, ("recv", "pp"): m, ("all_gather", "dp"): 1 + blocks * (m + 1),
            ("reduce_scatter", "dp"): 1 + blocks,
            ("all_reduce", "tp"): m * ((1 if stage == 0 else 4) + 6 * blocks)}
""", "(axis, kind) pairs"),
    Answer(3, "floats from / 2", _counts(
        '("pp", "send"): m,', '("pp", "send"): 2 * m / 2,'), "should be a count (an int)"),
]
