"""Notebook 26, a 3-D mesh for real."""

from distlab.exercises import nb26

from . import RIGHT, Answer

GRADERS = {
    1: (nb26.exercise_1, ["mesh_groups"]),
    2: (nb26.exercise_2, ["stage_peers"]),
}

ANSWERS = [
    Answer(1, "the solution", """
def mesh_groups(pp, dp, tp):
    rank = lambda p, d, t: (p * dp + d) * tp + t
    return {"pp": [[rank(p, d, t) for p in range(pp)] for d in range(dp) for t in range(tp)],
            "dp": [[rank(p, d, t) for d in range(dp)] for p in range(pp) for t in range(tp)],
            "tp": [[rank(p, d, t) for t in range(tp)] for p in range(pp) for d in range(dp)]}
""", RIGHT),
    Answer(1, "the 2-D answer: dp groups across the whole pipeline", """
def mesh_groups(pp, dp, tp):
    rank = lambda p, d, t: (p * dp + d) * tp + t
    return {"pp": [[rank(p, d, t) for p in range(pp)] for d in range(dp) for t in range(tp)],
            "dp": [[r for r in range(pp * dp * tp) if r % tp == t] for t in range(tp)],
            "tp": [[rank(p, d, t) for t in range(tp)] for p in range(pp) for d in range(dp)]}
""", "a dp group stays inside one pipeline stage"),
    Answer(1, "column-major: pp innermost", """
def mesh_groups(pp, dp, tp):
    rank = lambda p, d, t: (t * dp + d) * pp + p
    return {"pp": [[rank(p, d, t) for p in range(pp)] for d in range(dp) for t in range(tp)],
            "dp": [[rank(p, d, t) for d in range(dp)] for p in range(pp) for t in range(tp)],
            "tp": [[rank(p, d, t) for t in range(tp)] for p in range(pp) for d in range(dp)]}
""", "the pp groups should be"),
    Answer(1, "pp and tp swapped", """
def mesh_groups(pp, dp, tp):
    rank = lambda p, d, t: (p * dp + d) * tp + t
    return {"tp": [[rank(p, d, t) for p in range(pp)] for d in range(dp) for t in range(tp)],
            "dp": [[rank(p, d, t) for d in range(dp)] for p in range(pp) for t in range(tp)],
            "pp": [[rank(p, d, t) for t in range(tp)] for p in range(pp) for d in range(dp)]}
""", "the pp groups should be"),
    Answer(1, "groups in reverse order within", """
def mesh_groups(pp, dp, tp):
    rank = lambda p, d, t: (p * dp + d) * tp + t
    return {"pp": [[rank(p, d, t) for p in reversed(range(pp))] for d in range(dp)
                   for t in range(tp)],
            "dp": [[rank(p, d, t) for d in range(dp)] for p in range(pp) for t in range(tp)],
            "tp": [[rank(p, d, t) for t in range(tp)] for p in range(pp) for d in range(dp)]}
""", "in another order"),
    Answer(1, "the notebook's 2x2x2 mesh hard-coded", """
def mesh_groups(pp, dp, tp):
    return {"pp": [[0, 4], [1, 5], [2, 6], [3, 7]], "dp": [[0, 2], [1, 3], [4, 6], [5, 7]],
            "tp": [[0, 1], [2, 3], [4, 5], [6, 7]]}
""", "a 1x2x4 mesh"),
    Answer(1, "tuples of sets", """
def mesh_groups(pp, dp, tp):
    return {"pp": {0}, "dp": {0}, "tp": {0}}
""", "should be a list of groups"),
    Answer(2, "the solution", """
def stage_peers(rank, pp, dp, tp):
    step = dp * tp  # the next stage holds the same dp and tp coordinates, dp x tp ranks on
    previous = rank - step if rank >= step else None
    following = rank + step if rank + step < pp * dp * tp else None
    return previous, following
""", RIGHT),
    Answer(2, "neighbouring ranks", """
def stage_peers(rank, pp, dp, tp):
    return (rank - 1 if rank else None, rank + 1)
""", "dp x tp ranks away"),
    Answer(2, "a ring: wraps around", """
def stage_peers(rank, pp, dp, tp):
    world, step = pp * dp * tp, dp * tp
    return (rank - step) % world, (rank + step) % world
""", "does not wrap around"),
    Answer(2, "steps of tp only", """
def stage_peers(rank, pp, dp, tp):
    previous = rank - tp if rank >= tp else None
    following = rank + tp if rank + tp < pp * dp * tp else None
    return previous, following
""", "it receives from"),
    Answer(2, "a list", """
def stage_peers(rank, pp, dp, tp):
    step = dp * tp
    return [rank - step if rank >= step else None, rank + step if rank + step < pp * dp * tp
            else None]
""", "should return a tuple"),
]
