"""Graders for notebook 26, a 3-D mesh for real (see `distlab.exercises`).

Both answers are formulas about a ``("pp", "dp", "tp")`` mesh, run in the kernel and compared
with the layout ``init_device_mesh`` makes: row-major, ``rank = (pp_i * dp + dp_i) * tp + tp_i``
(the notebook asserts that on its live 8-rank mesh), over shapes the learner cannot guess.
"""

from __future__ import annotations

from . import expect

#: (pp, dp, tp) shapes the checks try: the notebook's, a size-1 axis each way, uneven.
SHAPES = ((2, 2, 2), (1, 2, 4), (4, 1, 2), (2, 4, 1), (3, 2, 2), (2, 3, 4))
AXES = ("pp", "dp", "tp")


def coordinates(rank: int, pp: int, dp: int, tp: int) -> tuple[int, int, int]:
    """(pp index, dp index, tp index) of ``rank`` on a row-major (pp, dp, tp) mesh."""
    return rank // (dp * tp), rank // tp % dp, rank % tp


def expected_groups(pp: int, dp: int, tp: int) -> dict:
    """Every group of each mesh axis: the ranks that differ only in that coordinate, in order."""
    groups = {}
    for i, axis in enumerate(AXES):
        by_rest: dict = {}
        for rank in range(pp * dp * tp):
            coord = coordinates(rank, pp, dp, tp)
            by_rest.setdefault(coord[:i] + coord[i + 1:], []).append(rank)
        groups[axis] = list(by_rest.values())
    return groups


def _as_groups(value, what: str) -> list:
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(g, (list, tuple)) and all(isinstance(r, int) and not isinstance(r, bool)
                                             for r in g)
        for g in value
    ):
        raise AssertionError(f"{what} should be a list of groups, each a list of ranks (ints), "
                             f"like [[0, 4], [1, 5]]; got {expect.describe(value)}")
    return [list(g) for g in value]


def exercise_1(mesh_groups) -> None:
    """``mesh_groups(pp, dp, tp)`` -> ``{"pp": [...], "dp": [...], "tp": [...]}``: every group of
    each axis of a ``(pp, dp, tp)`` mesh, each a list of ranks in mesh order; the order of
    the groups does not matter."""
    for pp, dp, tp in SHAPES:
        got = mesh_groups(pp, dp, tp)
        shape = f"a {pp}x{dp}x{tp} mesh (pp={pp}, dp={dp}, tp={tp})"
        if not isinstance(got, dict) or set(got) != set(AXES):
            raise AssertionError(f'mesh_groups should return a dict with the keys "pp", "dp" '
                                 f'and "tp"; for {shape} it returned {expect.describe(got)}')
        want = expected_groups(pp, dp, tp)
        for axis in AXES:
            groups = _as_groups(got[axis], f'for {shape}, mesh_groups(...)["{axis}"]')
            if sorted(groups) == sorted(want[axis]):
                continue
            hint = ""
            if axis == "dp" and any(len({r // (dp * tp) for r in g}) > 1 for g in groups):
                hint = (" (a dp group stays inside one pipeline stage: its ranks share the pp "
                        "and tp coordinates)")
            elif sorted(map(sorted, groups)) == sorted(map(sorted, want[axis])):
                hint = " (the right ranks, in another order: list each group in mesh order)"
            raise AssertionError(f"for {shape} the {axis} groups should be {want[axis]}; yours "
                                 f"are {groups}{hint}")


def exercise_2(stage_peers) -> None:
    """``stage_peers(rank, pp, dp, tp)`` -> ``(previous, next)``: the ranks a pipeline stage on
    ``rank`` receives activations from and sends them to (None at either end of the pipe)."""
    for pp, dp, tp in SHAPES:
        for rank in range(pp * dp * tp):
            got = stage_peers(rank, pp, dp, tp)
            p, d, t = coordinates(rank, pp, dp, tp)
            before = None if p == 0 else ((p - 1) * dp + d) * tp + t
            after = None if p == pp - 1 else ((p + 1) * dp + d) * tp + t
            what = f"stage_peers({rank}, {pp}, {dp}, {tp})"
            if not isinstance(got, tuple) or len(got) != 2:
                raise AssertionError(f"{what} should return a tuple (previous, next), got "
                                     f"{expect.describe(got)}")
            if got == (before, after):
                continue
            hint = ""
            if got == (rank - 1 if rank else None, rank + 1):
                hint = " (the next stage is dp x tp ranks away, not 1: tp is innermost)"
            elif (before is None or after is None) and None not in got:
                hint = " (a pipeline does not wrap around: the first stage receives from no one)"
            raise AssertionError(f"{what} gave {got}; rank {rank} is stage {p} (dp {d}, tp {t}): "
                                 f"it receives from {before} and sends to {after}{hint}")
