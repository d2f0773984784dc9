"""Graders for notebook 26, a 3-D mesh for real (see `distlab.exercises`).

Both answers are about a ``("pp", "dp", "tp")`` mesh, run in the kernel and compared with the
layout ``init_device_mesh`` makes: ``torch.arange(pp * dp * tp).view(pp, dp, tp)``, row-major,
``rank = (pp_i * dp + dp_i) * tp + tp_i`` (the notebook asserts that on its live 8-rank mesh).
Exercise 1 asks for every group of each axis; exercise 2 for what one rank exchanges with whom
in a training step of the notebook's composition (pipeline sends and receives, FSDP's
all-gathers and reduce-scatters, Megatron's all-reduces) on the axes `TRAFFIC` names: those the
notebook's live run records for each kind (its "What each dimension carries" asserts them).
Shapes are drawn at every check, so a table of the cases copied from earlier ✗ messages does
not pass.
"""

from __future__ import annotations

import functools
import numbers

from . import expect

AXES = ("pp", "dp", "tp")
#: What exercise 2 asks for, in a step's order: the collective (or point-to-point call) -> the
#: mesh axis it runs on and what it carries, as the notebook's "What each dimension carries"
#: says.
TRAFFIC = {
    "send": ("pp", "activations to the next stage, gradients back to the previous one"),
    "recv": ("pp", "activations from the previous stage, gradients from the next one"),
    "all_reduce": ("tp", "Megatron's partial sums (g forward, f backward)"),
    "all_gather": ("dp", "FSDP's parameter shards, before forward and again before backward"),
    "reduce_scatter": ("dp", "FSDP's gradients, each rank keeping its shard's sum"),
}


def coordinates(rank: int, pp: int, dp: int, tp: int) -> tuple[int, int, int]:
    """(pp index, dp index, tp index) of ``rank`` on a row-major (pp, dp, tp) mesh."""
    return rank // (dp * tp), rank // tp % dp, rank % tp


def _mesh(pp: int, dp: int, tp: int):
    """The ranks as ``init_device_mesh`` lays them out (its ``mesh`` tensor)."""
    import torch

    return torch.arange(pp * dp * tp).view(pp, dp, tp)


def _stage(rank: int, pp: int, dp: int, tp: int) -> int:
    """The pipeline stage ``rank`` is on: its pp coordinate."""
    return coordinates(rank, pp, dp, tp)[0]


def expected_groups(pp: int, dp: int, tp: int) -> dict:
    """Every group of each mesh axis: the ranks that differ only in that coordinate, in mesh
    order (what ``mesh[axis]`` is on each of its ranks)."""
    mesh = _mesh(pp, dp, tp)
    groups = {}
    for i, axis in enumerate(AXES):
        moved = mesh.movedim(i, -1).reshape(-1, mesh.shape[i])  # one row per group
        groups[axis] = sorted(row.tolist() for row in moved)
    return groups


#: The most ranks a drawn mesh has: exercise 1 (groups) and exercise 2 (every rank's traffic,
#: so fewer). Thousands of shapes either way: too many to paste from ✗ messages.
MOST_1, MOST_2 = 512, 64


def draw_shapes(most: int = MOST_1) -> list[tuple[int, int, int]]:
    """(pp, dp, tp) shapes for one check, of at most ``most`` ranks, none of `SEEN`: the first
    with every axis above 1 and no two alike (a mix-up of axes shows), one with an axis of 1,
    then for each axis a pair of meshes that differ in that axis only (an answer that ignores
    one axis, or keeps what it computed by two of them, gives the second the first's groups)."""
    rng = expect.rng()
    shapes = _all_shapes(most)
    uneven = rng.choice(_uneven(most))
    flat = rng.choice(_flat(most))
    drawn = [uneven, flat]
    for axis in range(3):
        while True:
            first = rng.choice(shapes)
            twins = [s for s in _along(most, axis)[_rest(first, axis)] if s != first]
            if twins:
                break
        drawn += [first, rng.choice(twins)]
    return drawn


def _rest(shape: tuple, axis: int) -> tuple:
    return tuple(n for i, n in enumerate(shape) if i != axis)


@functools.lru_cache(maxsize=8)
def _uneven(most: int) -> tuple:
    return tuple(s for s in _all_shapes(most) if min(s) > 1 and len(set(s)) == 3)


@functools.lru_cache(maxsize=8)
def _flat(most: int) -> tuple:
    return tuple(s for s in _all_shapes(most) if 1 in s and max(s) > 1)


@functools.lru_cache(maxsize=8)
def _along(most: int, axis: int) -> dict:
    """The shapes by their sizes on the two other axes: those that differ in ``axis`` only."""
    out: dict = {}
    for s in _all_shapes(most):
        out.setdefault(_rest(s, axis), []).append(s)
    return out


#: The shapes the checks tried before they drew theirs (their ✗ messages printed the answers
#: for them) and the notebook's own: never drawn.
SEEN = ((2, 2, 2), (1, 2, 4), (4, 1, 2), (2, 4, 1), (3, 2, 2), (2, 3, 4))


@functools.lru_cache(maxsize=4)
def _all_shapes(most: int) -> tuple[tuple[int, int, int], ...]:
    return tuple((p, d, t) for p in range(1, most + 1) for d in range(1, most // p + 1)
                 for t in range(1, most // (p * d) + 1)
                 if p * d * t > 1 and (p, d, t) not in SEEN)


def _is_rank(r) -> bool:
    """An int, numpy's and torch's included (``numbers.Integral``); not a bool."""
    return isinstance(r, numbers.Integral) and not isinstance(r, bool)


def _float_ranks(value) -> bool:
    """Whether ``value`` holds a float where a rank goes (``world / pp`` is 4.0, not 4)."""
    if isinstance(value, float):
        return True
    if isinstance(value, (list, tuple)):
        return any(_float_ranks(v) for v in value)
    return False


def _as_groups(value, what: str) -> list:
    if _float_ranks(value):
        raise AssertionError(f"{what} holds floats ({value!r}); ranks are ints: 4.0 is not rank "
                             "4 (use // for the arithmetic)")
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(g, (list, tuple)) and all(_is_rank(r) for r in g) for g in value
    ):
        raise AssertionError(f"{what} should be a list of groups, each a list of ranks (ints), "
                             f"like [[0, 4], [1, 5]]; got {expect.describe(value)}")
    return [list(g) for g in value]


def _shape(pp: int, dp: int, tp: int) -> str:
    return f"a {pp}x{dp}x{tp} mesh (pp={pp}, dp={dp}, tp={tp}, ranks 0-{pp * dp * tp - 1})"


def exercise_1(mesh_groups) -> None:
    """``mesh_groups(pp, dp, tp)`` -> ``{"pp": [...], "dp": [...], "tp": [...]}``: every group of
    each axis of a ``(pp, dp, tp)`` mesh, each a list of ranks (ints) in mesh order; the order
    of the groups does not matter. Shapes of up to `MOST_1` ranks drawn at every check
    (`draw_shapes`), among them pairs that differ in one axis only."""
    asked = {}  # the groups of the shapes asked before, to name an answer that repeats one
    for pp, dp, tp in draw_shapes():
        got = mesh_groups(pp, dp, tp)
        shape = _shape(pp, dp, tp)
        if not isinstance(got, dict) or set(got) != set(AXES):
            raise AssertionError(f'mesh_groups should return a dict with the keys "pp", "dp" '
                                 f'and "tp"; for {shape} it returned {expect.describe(got)}')
        want = expected_groups(pp, dp, tp)
        for axis in AXES:
            groups = _as_groups(got[axis], f'for {shape}, mesh_groups(...)["{axis}"]')
            if sorted(groups) == want[axis]:
                continue
            hint = ""
            earlier = [s for s, w in asked.items() if sorted(groups) == w[axis]]
            if earlier:
                before = earlier[0]
                differs = ", ".join(f"{a}={before[i]} there, {(pp, dp, tp)[i]} here"
                                    for i, a in enumerate(AXES) if before[i] != (pp, dp, tp)[i])
                hint = (f" (those are the {axis} groups of the {'x'.join(map(str, before))} mesh "
                        f"asked before ({differs}): every size changes the groups, so compute "
                        "them from all three, or key what you keep by (pp, dp, tp))")
            elif axis == "dp" and any(len({_stage(r, pp, dp, tp) for r in g}) > 1
                                      for g in groups):
                hint = (" (a dp group stays inside one pipeline stage: its ranks share the pp "
                        "and tp coordinates)")
            elif sorted(map(sorted, groups)) == sorted(map(sorted, want[axis])):
                hint = " (the right ranks, in another order: list each group in mesh order)"
            raise AssertionError(f"for {shape} the {axis} groups should be "
                                 f"{_groups_text(want[axis], groups)}{hint}")
        asked[(pp, dp, tp)] = want


def _groups_text(want: list, groups: list) -> str:
    """``want``, and where ``groups`` differ from it: whole when short, else the counts or
    the first group that is not one of ``want``'s, beside the group of its first rank."""
    whole = f"{want}; yours are {groups}"
    if len(whole) <= 400:
        return whole
    if len(groups) != len(want) or any(len(g) != len(want[0]) for g in groups):
        sizes = sorted({len(g) for g in groups})
        return (f"{len(want)} groups of {len(want[0])} ranks, like {want[0]}; yours are "
                f"{len(groups)} groups of {' or '.join(map(str, sizes)) or 'no'} ranks")
    wrong = next(g for g in sorted(groups) if g not in want)
    of = next((w for w in want if wrong and wrong[0] in w), want[0])
    return (f"{len(want)} groups of {len(want[0])} ranks, like {want[0]}; yours include "
            f"{wrong}, which is none of them (the group of rank {wrong[0] if wrong else 0} is "
            f"{of})")


def expected_traffic(rank: int, pp: int, dp: int, tp: int) -> dict:
    """What ``rank`` exchanges in one training step of the notebook's composition: for
    ``send`` and ``recv`` its pipeline neighbours (the ranks with its dp and tp coordinates in
    the stages before and after), for each collective the group of the axis it runs on, the
    rank included; all sorted."""
    mesh = _mesh(pp, dp, tp)
    p, d, t = coordinates(rank, pp, dp, tp)
    neighbours = sorted(int(mesh[q, d, t]) for q in (p - 1, p + 1) if 0 <= q < pp)
    group = {"pp": mesh[:, d, t], "dp": mesh[p, :, t], "tp": mesh[p, d, :]}
    return {kind: neighbours if axis == "pp" else sorted(group[axis].tolist())
            for kind, (axis, _) in TRAFFIC.items()}


def _traffic_hint(kind: str, got: list, rank: int, pp: int, dp: int, tp: int) -> str:
    axis, _ = TRAFFIC[kind]
    p, d, t = coordinates(rank, pp, dp, tp)
    mesh = _mesh(pp, dp, tp)
    whole = {"pp": sorted(mesh[:, d, t].tolist()), "dp": sorted(mesh[p, :, t].tolist()),
             "tp": sorted(mesh[p, d, :].tolist()), "stage": sorted(mesh[p].flatten().tolist()),
             "world": list(range(pp * dp * tp))}
    for other, why in (("tp", "that is its tp group: tp all-reduces Megatron's partial sums; "
                               "FSDP gathers and reduce-scatters over dp"),
                       ("dp", "that is its dp group: FSDP's collectives run there; Megatron's "
                              "all-reduces stay inside the tp group"),
                       ("pp", "that is its pipeline: only sends and receives cross stages"),
                       ("stage", "that is the whole stage, dp x tp ranks: each collective runs "
                                 "on one axis of it"),
                       ("world", "that is every rank: on a 3-D mesh each collective runs on one "
                                 "axis's group")):
        if other != axis and sorted(got) == whole[other] and len(whole[other]) > 1:
            return f" ({why})"
    if axis == "pp":
        wrapped = sorted(int(mesh[q % pp, d, t]) for q in (p - 1, p + 1))
        if pp > 1 and p in (0, pp - 1) and sorted(got) == wrapped:
            return " (a pipeline does not wrap around: the first stage receives from no one)"
        if any(r in got for r in (rank - 1, rank + 1)) and dp * tp > 1:
            return (" (the next stage is dp x tp ranks away, not 1: a rank talks to the rank with "
                    "its own dp and tp coordinates in the neighbouring stages)")
        want = [int(mesh[q, d, t]) for q in (p - 1, p + 1) if 0 <= q < pp]
        if set(got) < set(want):
            return (" (a stage sends activations to the next stage and gradients back to the "
                    "previous one, and receives both: every neighbour it has)")
    if rank not in got and axis != "pp":
        return f" (a group includes rank {rank} itself)"
    return ""


def exercise_2(step_traffic) -> None:
    """``step_traffic(rank, pp, dp, tp)`` -> ``{"send": [...], "recv": [...], "all_reduce":
    [...], "all_gather": [...], "reduce_scatter": [...]}``: in one training step of the
    notebook's composition on a ``(pp, dp, tp)`` mesh, the ranks ``rank`` sends to and receives
    from, and the group each collective it calls runs over (itself included: a group of one
    when that axis has size 1); the order inside a list does not matter. Every rank of shapes
    of up to `MOST_2` ranks drawn at every check (`draw_shapes`)."""
    for pp, dp, tp in draw_shapes(MOST_2):
        for rank in range(pp * dp * tp):
            got = step_traffic(rank, pp, dp, tp)
            call = f"step_traffic({rank}, {pp}, {dp}, {tp})"
            if not isinstance(got, dict) or set(got) != set(TRAFFIC):
                raise AssertionError(
                    f"{call} should return a dict with the keys {', '.join(map(repr, TRAFFIC))}"
                    f"; it returned {expect.describe(got)}")
            want = expected_traffic(rank, pp, dp, tp)
            for kind, (axis, carries) in TRAFFIC.items():
                value = got[kind]
                if _float_ranks(value):
                    raise AssertionError(
                        f"{call}[{kind!r}] holds floats ({value!r}); ranks are ints: 4.0 is not "
                        "rank 4 (use // for the arithmetic)")
                if not isinstance(value, (list, tuple, set)) or not all(map(_is_rank, value)):
                    raise AssertionError(
                        f"{call}[{kind!r}] should be a list of ranks (ints), like [0, 2]; got "
                        f"{expect.describe(value)}")
                if sorted(value) == want[kind]:
                    continue
                p, d, t = coordinates(rank, pp, dp, tp)
                raise AssertionError(
                    f"on {_shape(pp, dp, tp)}, rank {rank} (stage {p}, dp {d}, tp {t}): its "
                    f"{kind} ({carries}) goes over {axis}, to {want[kind]}; {call}[{kind!r}] "
                    f"says {sorted(value)}{_traffic_hint(kind, list(value), rank, pp, dp, tp)}")


# -- exercise 3: how many collectives, on which axis --

#: What exercise 3 counts, in the notebook's cell 7's spelling: (mesh axis, kind).
COUNTED = (("pp", "send"), ("pp", "recv"), ("dp", "all_gather"), ("dp", "reduce_scatter"),
           ("tp", "all_reduce"))
#: Megatron's f and g in one block of the tiny GPT (`gpt.tp_plan`, no sequence parallelism):
#: g forward after the row-parallel ``wo`` and ``w2``, f backward before the column-parallel
#: ``wq``, ``wk``, ``wv`` and ``w1``.
F_AND_G_PER_BLOCK = 2 + 4
#: `loss_parallel`'s all-reduces over the vocabulary shards, per microbatch: the max, the sum
#: of exponentials, the target's logit.
LOSS_PARALLEL = 3


def expected_collectives(stage: int, blocks: int, microbatches: int) -> dict:
    """One optimizer step of the notebook's composition (two pipeline stages, GPipe, FSDP2 on
    each block and the stage's root, `gpt.tp_plan` without sequence parallelism, the loss in
    ``loss_parallel``) on stage ``stage`` (0 or 1) of ``blocks`` blocks, ``microbatches`` per
    step: ``{(axis, kind): calls}`` on one rank. The notebook's live run asserts it for its own
    case (1 block, 2 microbatches); tests/test_drawn_cases.py runs another on 8 ranks."""
    m = microbatches
    ends = 1 if stage == 0 else 1 + LOSS_PARALLEL  # tok's g; or the head's f and the loss
    return {
        ("pp", "send"): m,  # stage 0: activations forward; stage 1: their gradients back
        ("pp", "recv"): m,
        # the root once (FSDP2 keeps the root gathered); each block before every microbatch's
        # forward (resharded after it) and once for backward (the pipeline keeps it gathered
        # through every microbatch's backward)
        ("dp", "all_gather"): 1 + blocks * (m + 1),
        ("dp", "reduce_scatter"): 1 + blocks,  # once per unit, after the last backward
        ("tp", "all_reduce"): m * (ends + F_AND_G_PER_BLOCK * blocks),
    }


#: (blocks, microbatches) the notebook ran (its cell 7 prints the answer): never drawn.
SEEN_3 = ((1, 2),)


def draw_runs() -> list[tuple[int, int, int]]:
    """(stage, blocks, microbatches) for one check: both stages of three runs, each with at
    least 2 blocks and 2 microbatches and the two unequal (an answer that mixes them up, or
    forgets one factor, gives another count), none of `SEEN_3`."""
    r = expect.rng()
    pairs = [(b, m) for b in range(2, 9) for m in range(2, 9) if b != m and (b, m) not in SEEN_3]
    runs = r.sample(pairs, 3)
    return [(stage, b, m) for b, m in runs for stage in (0, 1)]


#: A count a learner derives with one rule wrong -> what to tell them.
_WRONG_3 = {
    ("dp", "all_gather"): [
        (lambda s, b, m: 1 + b * m, "each block is gathered again for backward (resharded after "
                                    "every forward), once: the pipeline keeps it gathered "
                                    "through every microbatch's backward"),
        (lambda s, b, m: 1 + b, "under `reshard_after_forward=True` a block is freed after each "
                                "forward, so every microbatch's forward gathers it again"),
        (lambda s, b, m: m + b * (m + 1), "FSDP2 gathers the root once and keeps it (it does "
                                          "not reshard the root after forward)"),
        (lambda s, b, m: b * (m + 1), "the root (tok and pos, or the norm and the head) is a "
                                      "unit too: one gather"),
        (lambda s, b, m: 1 + 2 * b * m, "the pipeline keeps each block gathered through all "
                                        "the microbatches' backwards: one gather for backward"),
    ],
    ("dp", "reduce_scatter"): [
        (lambda s, b, m: (1 + b) * m, "the pipeline tells FSDP not to reduce before the last "
                                      "microbatch: one reduce-scatter per unit per step"),
        (lambda s, b, m: b, "the root's gradients are reduce-scattered too"),
    ],
    ("tp", "all_reduce"): [
        (lambda s, b, m: 1 + (LOSS_PARALLEL if s else 0) + F_AND_G_PER_BLOCK * b,
         "f and g run for every microbatch"),
        (lambda s, b, m: m * (1 + F_AND_G_PER_BLOCK * b),
         "stage 1 adds loss_parallel's 3 all-reduces per microbatch to the head's f"),
        (lambda s, b, m: m * ((1 if s == 0 else 1 + LOSS_PARALLEL) + 4 * b),
         "the tiny GPT's q, k and v are three Linears: f before each of wq, wk, wv and w1 "
         "(4) and g after wo and w2 (2), 6 per block"),
        (lambda s, b, m: m * F_AND_G_PER_BLOCK * b, "the ends of the model have all-reduces "
                                                    "too: tok's g on stage 0, the head's f "
                                                    "and the loss's 3 on stage 1"),
        (lambda s, b, m: m * (1 + LOSS_PARALLEL + F_AND_G_PER_BLOCK * b),
         "stage 0 has tok's g (1); the head and the loss are stage 1's"),
    ],
    ("pp", "send"): [
        (lambda s, b, m: m if s == 0 else 0, "the gradients go back: stage 1 sends one per "
                                             "microbatch"),
        (lambda s, b, m: 1, "one message per microbatch"),
        (lambda s, b, m: 2 * m, "a stage of two sends one way only: activations forward "
                                "(stage 0) or gradients back (stage 1)"),
    ],
    ("pp", "recv"): [
        (lambda s, b, m: m if s == 1 else 0, "stage 0 receives the gradients back: one per "
                                             "microbatch"),
        (lambda s, b, m: 1, "one message per microbatch"),
        (lambda s, b, m: 2 * m, "a stage of two receives from one side only"),
    ],
}


def exercise_3(step_collectives) -> None:
    """``step_collectives(stage, blocks, microbatches)`` -> ``{(axis, kind): calls}``: the
    collectives one rank of stage ``stage`` (0 or 1) calls in one step of the notebook's
    composition with ``blocks`` blocks per stage and ``microbatches`` microbatches, the keys
    of `COUNTED` (a missing key counts 0). Runs drawn at every check (`draw_runs`)."""
    for stage, blocks, m in draw_runs():
        call = f"step_collectives({stage}, {blocks}, {m})"
        got = step_collectives(stage, blocks, m)
        if not isinstance(got, dict):
            raise AssertionError(f"{call} should return a dict like {{('dp', 'all_gather'): 4, "
                                 f"...}}; it returned {expect.describe(got)}")
        extra = [k for k in got if k not in COUNTED and got[k]]
        if extra:
            raise AssertionError(
                f"{call} has {extra[0]!r}: the keys are (axis, kind) pairs, "
                f"{', '.join(map(repr, COUNTED))}; in this composition there are no others")
        want = expected_collectives(stage, blocks, m)
        for key in COUNTED:
            value = got.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise AssertionError(f"{call}[{key!r}] should be a count (an int); got "
                                     f"{expect.describe(value)}")
            if value == want[key]:
                continue
            hint = next((why for rule, why in _WRONG_3.get(key, ())
                         if rule(stage, blocks, m) == value), "")
            raise AssertionError(
                f"stage {stage} of 2, {blocks} blocks a stage, {m} microbatches: "
                f"{key[1]} on {key[0]} should be called {want[key]} times in a step; {call} "
                f"says {value}" + (f" ({hint})" if hint else ""))
