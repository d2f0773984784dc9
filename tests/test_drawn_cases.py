"""The cases graders draw anew at every check (so that a table of the cases copied from earlier
✗ messages does not pass) must never let such a table pass: not by landing on one of the fixed
cases, and not by being a case where a fixed fallback (keep everything, drop everything, the
lesson's other rule) happens to be right.

A CI run once gave notebook 23's memorising answer a ✓: 17% of its draws kept every assignment.
"""

import random

import pytest
import torch

from distlab.exercises import nb20, nb22, nb23, nb24, nb25, nb26
from distlab.gpt import Config


class _Scripted:
    """Stands in for `random.SystemRandom`: returns the scripted values first, in call order,
    then the smallest choice each time."""

    script: list = []

    def randrange(self, start, stop=None):
        if stop is None:
            start, stop = 0, start
        value = _Scripted.script.pop(0) if _Scripted.script else start
        assert start <= value < stop, (value, start, stop)
        return value

    def choice(self, seq):
        if _Scripted.script:
            value = _Scripted.script.pop(0)
            assert value in seq, (value, seq)
            return value
        return seq[0]

    def shuffle(self, x):
        pass


@pytest.fixture
def scripted(monkeypatch):
    from distlab.exercises import expect

    monkeypatch.delenv(expect.SEED)  # the draws come from the operating system's randomness...
    monkeypatch.setattr(random, "SystemRandom", _Scripted)  # ...scripted here

    def play(*values):
        _Scripted.script = list(values)

    yield play
    _Scripted.script = []


def test_nb20s_drawn_shape_is_never_one_of_the_fixed_ones(scripted):
    # The draws that make the fixed shape ({"hidden": 16, "heads": 2}, 5, 7): heads, seq_len,
    # dim per head, mlp_ratio, vocab, batch, seq.
    scripted(2, 16, 8, 4, 40, 5, 7)
    options, b, s = nb20._random_shape()
    c = Config(**options)
    assert (c.hidden, c.heads, c.mlp_ratio, b, s) != (16, 2, 4, 5, 7)


def test_nb22s_drawn_layout_is_never_one_of_the_fixed_ones(scripted):
    scripted(1, 5)  # one rank, 5 positions, not shuffled: the fixed "one rank" layout
    layout = nb22._random_layout()
    assert layout not in [fixed for _, fixed in nb22._fixed_layouts()], layout


def _memorising(cases, answer, fallback):
    """An answer right on `cases` (copied from ✗ messages) and `fallback` anywhere else."""
    seen = {repr(args): answer(*args) for args in cases}

    def memorised(*args):
        key = repr(tuple(a.tolist() if isinstance(a, torch.Tensor) else a for a in args))
        return seen[key] if key in seen else fallback(*args)

    return memorised


def _passes(grader, answer, times=300) -> int:
    passed = 0
    for _ in range(times):
        try:
            grader(answer)
            passed += 1
        except AssertionError:
            pass
    return passed


@pytest.mark.parametrize(
    "fallback",
    [
        lambda e, n, c: torch.ones(e.shape, dtype=torch.bool),
        lambda e, n, c: torch.zeros(e.shape, dtype=torch.bool),
        lambda e, n, c: nb23._tokens_first(e, n, c),
    ],
    ids=["keep all", "drop all", "token order"],
)
def test_nb23_no_memorised_answer_passes(fallback):
    fixed = [(e.tolist(), n, c) for _, e, n, c in nb23._routing_cases()[:-1]]
    right = lambda e, n, c: nb23._choices_first(torch.tensor(e), n, c)  # noqa: E731
    cheat = _memorising(fixed, right, fallback)
    assert _passes(nb23.exercise_1, cheat) == 0
    assert _passes(nb23.exercise_1, nb23._choices_first, times=20) == 20  # the truth passes


def test_nb24_no_memorised_answer_passes():
    fixed = list(nb24.SHAPES_1)
    cheat = _memorising(fixed, nb24.expected_groups, lambda dp, tp: {"dp": [], "tp": []})
    assert _passes(nb24.exercise_1, cheat) == 0
    assert _passes(nb24.exercise_1, nb24.expected_groups, times=20) == 20


# -- notebook 25: the state a rank holds, when FSDP's all-gather hides -------------------------


@pytest.mark.parametrize("tp, pp, dp, stage", [(8, 16, 128, 0), (8, 16, 128, 1), (8, 16, 128, 15),
                                               (4, 9, 24, 0), (4, 9, 24, 4), (4, 9, 24, 8),
                                               (2, 3, 7, 2), (1, 1, 5, 0)])
def test_nb25s_truth_is_what_fsdp2_allocates_on_a_simulated_rank(tp, pp, dp, stage):
    from distlab import scale

    layout = scale.Layout(dp=dp, tp=tp, pp=pp, seq_len=8192)
    with scale.simulated("Llama-3 405B", layout, stage=stage) as (module, _):
        held = sum(p.to_local().numel() for p in module.parameters())
    assert nb25.held(stage, tp, pp, dp) == held


def _state_bytes(stage, tp, pp, dp):
    return nb25.BYTES * nb25.held(stage, tp, pp, dp)


def test_nb25_an_answer_wrong_only_on_the_middle_stages_is_wrong():
    def middles_wrong(stage, tp, pp, dp):
        return _state_bytes(stage, tp, pp, dp) + (16 if 0 < stage < pp - 1 else 0)

    assert _passes(nb25.exercise_1, middles_wrong, times=50) == 0
    assert _passes(nb25.exercise_1, _state_bytes, times=20) == 20


@pytest.mark.parametrize(
    "fallback",
    [
        lambda s, tp, pp, dp: 381513728,  # the paper's stage 0, as the old check printed it
        lambda s, tp, pp, dp: 381710336,  # the same, padded per tensor (cell 7)
        lambda s, tp, pp, dp: 16 * -(-nb25.held(s, tp, pp, dp, rows=lambda r, c: r * c) // dp),
    ],
    ids=["old message", "cell 7", "whole-stage rounding"],
)
def test_nb25_no_memorised_answer_passes(fallback):
    fixed = [(s, tp, pp, dp) for tp, pp, dp in nb25.SEEN
             for s in sorted({0, min(1, pp - 1), pp // 2, pp - 1})]
    cheat = _memorising(fixed, _state_bytes, fallback)
    assert _passes(nb25.exercise_1, cheat) == 0


def test_nb25_an_answer_that_rebinds_the_preset_is_wrong_and_the_preset_is_put_back():
    from distlab.calculators import PRESETS, Transformer

    before = PRESETS["Llama-3 405B"]

    def rebinds(stage, tp, pp, dp):
        PRESETS["Llama-3 405B"] = Transformer("Llama-3 405B", vocab=1, hidden=8, intermediate=8,
                                              layers=126, heads=8, kv_heads=8)
        return _state_bytes(stage, tp, pp, dp)

    try:
        with pytest.raises(AssertionError, match=r'changed PRESETS\["Llama-3 405B"\]'):
            nb25.exercise_1(rebinds)
        assert PRESETS["Llama-3 405B"].parameters() == before.parameters()
        nb25.exercise_1(_state_bytes)  # the notebook's solution works again at once
    finally:
        PRESETS["Llama-3 405B"] = before


def _min_tokens(dp, flops, bandwidth):
    return (dp - 1) / dp * flops / bandwidth


@pytest.mark.parametrize("factor", [1 + 1e-3, 1 - 1e-3, 1 + 1e-5])
def test_nb25_min_tokens_a_little_off_is_wrong(factor):
    def off(dp, flops, bandwidth):
        return _min_tokens(dp, flops, bandwidth) * factor

    assert _passes(nb25.exercise_2, off, times=50) == 0


def test_nb25_min_tokens_rounded_to_the_nearest_never_passes_and_the_ceiling_always_does():
    import math

    assert _passes(nb25.exercise_2, lambda *a: round(_min_tokens(*a))) == 0
    assert _passes(nb25.exercise_2, lambda *a: int(_min_tokens(*a))) == 0
    assert _passes(nb25.exercise_2, lambda *a: math.ceil(_min_tokens(*a))) == 300
    assert _passes(nb25.exercise_2, _min_tokens) == 300



def _split_as_exercise_3_says(layers: int, pp: int) -> list[int] | None:
    """Notebook 25's exercise 3, in its words: every stage ceil(layers / pp) layers, the
    difference taken from the first and last stages a layer at a time (the first, the last, the
    first, ...); no split (None) when that would empty a stage."""
    sizes = [-(-layers // pp)] * pp
    for k in range(sizes[0] * pp - layers):
        sizes[-1 if k % 2 else 0] -= 1
    return None if min(sizes) < 1 else sizes


def test_nb25_exercise_3_states_the_rule_stage_layers_follows():
    from distlab.calculators import CalculatorError, stage_layers

    for layers in range(24, 97):  # every depth exercise 3 draws, every pp it asks for
        for pp in nb25.PP_TRIED:
            try:
                got = [len(r) for r in stage_layers(layers, pp)]
            except CalculatorError:
                got = None
            assert got == _split_as_exercise_3_says(layers, pp), (layers, pp, got)
            assert nb25._splits(nb25._draw_model(random.Random(0), layers), pp) == (got is not None)
    # the text's example, and the splits the old text's rule ("pp divides the layers, or the
    # layers + 2") refused
    assert [pp for pp in range(1, 17) if _split_as_exercise_3_says(30, pp)] == [*range(1, 12),
                                                                                15, 16]
    assert _split_as_exercise_3_says(25, 2) == [12, 13]
    assert _split_as_exercise_3_says(24, 5) == [4, 5, 5, 5, 5]

# -- notebook 26: a 3-D mesh ------------------------------------------------------------------


def _groups(pp, dp, tp):
    return nb26.expected_groups(pp, dp, tp)


def test_nb26s_groups_are_what_device_mesh_makes():
    # The layout init_device_mesh uses (its `mesh` tensor), written out by hand for 2x3x2.
    want = {"pp": [[0, 6], [1, 7], [2, 8], [3, 9], [4, 10], [5, 11]],
            "dp": [[0, 2, 4], [1, 3, 5], [6, 8, 10], [7, 9, 11]],
            "tp": [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]}
    assert _groups(2, 3, 2) == want
    traffic = nb26.expected_traffic(9, 2, 3, 2)  # stage 1, dp 1, tp 1
    assert traffic == {"send": [3], "recv": [3], "all_reduce": [8, 9],
                       "all_gather": [7, 9, 11], "reduce_scatter": [7, 9, 11]}


def test_nb26_no_memorised_answer_passes():
    cheat = _memorising(nb26.SEEN, _groups, lambda pp, dp, tp: _groups(2, 2, 2))
    assert _passes(nb26.exercise_1, cheat) == 0
    assert _passes(nb26.exercise_1, _groups, times=20) == 20
    seen = [(r, *s) for s in nb26.SEEN for r in range(s[0] * s[1] * s[2])]
    cheat = _memorising(seen, nb26.expected_traffic,
                        lambda r, pp, dp, tp: nb26.expected_traffic(r % 8, 2, 2, 2))
    assert _passes(nb26.exercise_2, cheat) == 0
    assert _passes(nb26.exercise_2, nb26.expected_traffic, times=20) == 20


def test_nb26s_hint_blames_a_crossed_stage_only_when_a_dp_group_crosses_one():
    def reversed_dp(pp, dp, tp):
        groups = _groups(pp, dp, tp)
        return dict(groups, dp=[g[::-1] for g in groups["dp"]])

    for _ in range(30):
        with pytest.raises(AssertionError) as e:
            nb26.exercise_1(reversed_dp)
        assert "in another order" in str(e.value) and "pipeline stage" not in str(e.value)


def test_nb26_float_ranks_are_wrong():
    def floats(rank, pp, dp, tp):
        traffic = nb26.expected_traffic(rank, pp, dp, tp)
        return {k: [float(r) for r in v] for k, v in traffic.items()}

    with pytest.raises(AssertionError, match="ranks are ints"):
        nb26.exercise_2(floats)


# -- notebook 21: a step's collectives --------------------------------------------------------


def _counts(n_layers, sp):
    L = n_layers
    if not sp:
        return {"forward": {"all_reduce": 2 * L + 4}, "backward": {"all_reduce": 4 * L + 1}}
    return {"forward": {"all_gather": 2 * L + 1, "all_reduce": 3, "reduce_scatter": 2 * L + 2},
            "backward": {"all_gather": 2 * L + 2, "reduce_scatter": 2 * L + 1}}


def test_nb21_no_memorised_answer_passes(monkeypatch):
    from distlab.exercises import nb21

    # The cluster's CommDebugMode counts, as the notebook's solution (checked against them in
    # tests/test_exercise_mistakes.py) gives them.
    monkeypatch.setattr(nb21.expect, "run",
                        lambda fn, cases, **kw: [{case: _counts(*case) for case in cases}])
    seen = [(n, sp) for n in range(1, 9) for sp in (False, True)]  # every depth ever measured
    cheat = _memorising(seen, _counts, lambda n, sp: _counts(2, sp))  # the notebook's table
    assert _passes(lambda a: nb21.exercise_3(a, None), cheat) == 0
    assert _passes(lambda a: nb21.exercise_3(a, None), _counts, times=20) == 20


# -- every drawn check: right answers always pass, the shortcuts it was built against never --


#: The exercises whose check runs in the kernel (no ranks), and the wrong answers of their
#: tables (tests/mistakes/) that right only on some cases would pass a narrow draw: each such
#: row, and every right one, is tried on 30 draws.
DRAWN = {("nb25", 1), ("nb25", 2), ("nb25", 3), ("nb26", 1), ("nb26", 2), ("nb26", 3), ("nb27", 1),
         ("nb27", 2), ("nb27", 3), ("nb27", 4), ("nb22", 1)}
SHORTCUTS = ("wrong only on a middle stage", "math.floor(x) + 1", "range(1, 16)",
             "first degree the layers do not split", "keyed by (pp, dp)",
             "first step dropped", "the last step alone", "shortest median step time",
             "the longest wait inside", "the slowest single step", "the mean time before",
             "hard-coded", "the paper's layout", "pasted", "from its ✗ messages",
             "compared as strings", "always one save back")


def _rows():
    from test_exercise_mistakes import ROWS

    return [(nb, a) for nb, a in ROWS if (nb, a.exercise) in DRAWN
            and (a.says is None or any(s in a.why for s in SHORTCUTS))]


@pytest.mark.parametrize("row", _rows(), ids=lambda r: f"{r[0]}-ex{r[1].exercise}-{r[1].why}")
def test_a_drawn_check_gives_the_same_verdict_in_30_of_30_draws(row):
    import contextlib
    import io

    from test_exercise_mistakes import TABLES, _learner

    from distlab.exercises import check

    nb, answer = row
    grader, names = TABLES[nb].GRADERS[answer.exercise]
    verdicts = []
    for _ in range(30):  # a learner running the cell again: new draws, their answer unchanged
        ns = _learner(answer.code, nb, **getattr(TABLES[nb], "GIVEN", {}))
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            verdicts.append(check("Exercise", grader, *[ns[n] for n in names]))
    assert verdicts.count(answer.says is None) == 30, (answer.why, verdicts)


def test_a_cached_answer_is_caught_when_one_namespace_sees_every_draw():
    """The (pp, dp)-keyed cache keeps its entries across checks, as a notebook's would."""
    from test_exercise_mistakes import TABLES, _learner

    row = next(a for a in TABLES["nb26"].ANSWERS if "keyed by (pp, dp)" in a.why)
    ns = _learner(row.code, "nb26")
    assert _passes(nb26.exercise_1, ns["mesh_groups"], times=30) == 0


def test_what_the_exercises_text_says_of_the_draws_is_what_the_checks_do():
    import nbformat

    from distlab.calculators import CalculatorError, stage_layers

    def text(name, exercise):
        """The text of notebook ``name``'s exercise ``exercise`` (its cell found by its title,
        wherever the notebook's cells have moved)."""
        path = next(__import__("pathlib").Path(__file__).parent.parent.glob(f"notebooks/{name}*"))
        cells = [c.source for c in nbformat.read(path, 4).cells
                 if c.source.startswith(f"**Exercise {exercise}.")]
        assert len(cells) == 1, (name, exercise, len(cells))
        return cells[0].replace("\n", " ")

    def splits(layers, pp):
        try:
            stage_layers(layers, pp)
        except CalculatorError:
            return False
        return True

    assert [pp for pp in range(11, 16) if splits(30, pp)] == [11, 15]
    assert [len(s) for s in stage_layers(126, 16)] == [7] + [8] * 14 + [7]
    assert ("30 layers split into 11 stages and into 15, not into 12, 13 or 14"
            in text("25_", 3)) and "7 + 14 × 8 + 7" in text("25_", 3)
    assert f"of up to {nb26.MOST_1} ranks" in text("26_", 1)
    assert f"again on {nb22.OTHER_WORLD} ranks of their own" in text("22_", 2)
    assert "At three steps" in text("19_", 2) and len(
        {**__import__("distlab.exercises.nb19", fromlist=["x"]).PLANTED, 0: 0}) == 3


def test_the_seed_makes_a_tests_draws_the_same_and_a_learners_new():
    from distlab.exercises import expect

    expect.reseed(7)
    first = [nb26.draw_shapes() for _ in range(3)]
    expect.reseed(7)
    assert [nb26.draw_shapes() for _ in range(3)] == first  # a test reproduces
    assert first[0] != first[1]  # each check draws anew
