"""The cases graders draw anew at every check (so that a table of the cases copied from earlier
✗ messages does not pass) must never let such a table pass: not by landing on one of the fixed
cases, and not by being a case where a fixed fallback (keep everything, drop everything, the
lesson's other rule) happens to be right.

A CI run once gave notebook 23's memorising answer a ✓: 17% of its draws kept every assignment.
"""

import random

import pytest
import torch

from distlab.exercises import nb20, nb22, nb23, nb24
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
    monkeypatch.setattr(random, "SystemRandom", _Scripted)

    def play(*values):
        _Scripted.script = list(values)

    yield play
    _Scripted.script = []


def test_nb20s_drawn_shape_is_never_one_of_the_fixed_ones(scripted):
    # The draws that make the fixed shape ({"dim": 16, "n_heads": 2}, 5, 7): heads, seq_len,
    # dim per head, mlp_ratio, vocab, batch, seq.
    scripted(2, 16, 8, 4, 40, 5, 7)
    options, b, s = nb20._random_shape()
    c = Config(**options)
    assert (c.dim, c.n_heads, c.mlp_ratio, b, s) != (16, 2, 4, 5, 7)


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
