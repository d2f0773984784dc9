"""The wrong answers learners write, per exercise, and what each must be told.

One module per notebook (``nb04.py`` for notebook 04), each with:

- ``GRADERS``: exercise number -> (the grader in `distlab.exercises.nbNN`, the names it takes,
  in order: the learner's functions and values, ``cluster`` for a live cluster, or a name in
  ``GIVEN``);
- ``GIVEN`` (optional): what the notebook's earlier cells define that answers and graders use
  (a class, a helper function), name -> object; put in every answer's namespace;
- ``CLUSTER`` (optional): the options of the live cluster, default ``{"world_size": 2}``;
- ``ANSWERS``: `Answer` rows: what a learner did, the code they wrote (it defines the names),
  and a piece of text the verdict must contain (what was expected), or ``RIGHT`` for an answer
  that must pass. Every exercise has at least three wrong answers and one right one.

tests/test_exercise_mistakes.py feeds every row to `distlab.check` and asserts the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

RIGHT = None  #: an Answer whose verdict must be ✓


@dataclass(frozen=True)
class Answer:
    exercise: int
    why: str  #: the mistake, as a learner would make it ("forgot to divide by the world size")
    code: str  #: the learner's cell (it defines the names the grader takes)
    says: str | None  #: text the ✗ verdict must contain; RIGHT: the verdict must be ✓


def variant(solution: str, *changes: tuple[str, str]) -> str:
    """``solution`` with each ``(old, new)`` replaced in turn: a wrong answer written as what
    differs from the right one (each ``old`` must be there, so a solution edited later cannot
    leave a row testing nothing)."""
    for old, new in changes:
        assert old in solution, old
        solution = solution.replace(old, new)
    return solution
