"""Notebook 26, a 3-D mesh for real."""

from distlab.exercises import nb26

from . import RIGHT, Answer, variant

GRADERS = {
    1: (nb26.exercise_1, ["mesh_groups"]),
    2: (nb26.exercise_2, ["step_traffic"]),
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
]
