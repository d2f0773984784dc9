"""Every exercise's check, fed the wrong answers learners write (tests/mistakes/): each must be
told ✗ with what was expected, each right answer ✓, every verdict one line, and a wrong answer
never leaves the cluster stuck for the next cell."""

from __future__ import annotations

import importlib
import pkgutil
import time

import mistakes
import pytest
import torch
import torch.distributed as dist
from torch import nn

from distlab._patience import slowness
from distlab.exercises import NOT_ATTEMPTED, PASSED, check

TABLES = {
    m.name: importlib.import_module(f"mistakes.{m.name}")
    for m in pkgutil.iter_modules(mistakes.__path__)
    if m.name.startswith("nb")
}
ROWS = [(nb, a) for nb, table in sorted(TABLES.items()) for a in table.ANSWERS]


def _id(row) -> str:
    nb, a = row
    return f"{nb}-ex{a.exercise}-{a.why}"


@pytest.fixture(scope="module")
def clusters():
    """One live cluster per notebook table (its ``CLUSTER`` options), started when a row first
    needs it, shut down when the next table's rows begin: one at a time on two cores."""
    import distlab

    live = {}

    def get(nb):
        if nb not in live:
            for c in live.values():
                c.shutdown()
            live.clear()
            options = {"world_size": 2, "timeout": 60, **getattr(TABLES[nb], "CLUSTER", {})}
            live[nb] = distlab.Cluster(**options)
        return live[nb]

    yield get
    for c in live.values():
        c.shutdown()


def _learner(code: str, nb: str, **given):
    """Run a learner's cell in a namespace of its own (cloudpickle then ships its functions by
    value, as it does a notebook's), with what a notebook's cells would have defined."""
    ns = {"__name__": f"learner_{nb}", "torch": torch, "dist": dist, "nn": nn, **given}
    exec(compile(code, f"<{nb} answer>", "exec"), ns)
    return ns


@pytest.mark.parametrize("row", ROWS, ids=[_id(r) for r in ROWS])
def test_a_learners_answer_gets_the_verdict_it_deserves(row, clusters, capsys):
    nb, answer = row
    table = TABLES[nb]
    grader, names = table.GRADERS[answer.exercise]
    given = dict(getattr(table, "GIVEN", {}))
    if "cluster" in names or "cluster" in answer.code:
        given["cluster"] = clusters(nb)
    ns = _learner(answer.code, nb, **given)
    label = f"Exercise {answer.exercise}"
    start, slow = time.monotonic(), slowness()
    passed = check(label, grader, *[ns[n] for n in names])
    took = time.monotonic() - start
    limit = 40 * max(slow, slowness())  # 40 s on a quiet machine, as the graders' own waits stretch
    lines = capsys.readouterr().out.strip().splitlines()
    verdict = lines[-1] if lines else ""
    assert [x for x in lines if x.startswith(f"{label}:")] == [verdict], lines  # one verdict
    if answer.says is None:
        assert passed and verdict == f"{label}: {PASSED}", verdict
    else:
        assert not passed and verdict.startswith(f"{label}: ✗ not yet: "), verdict
        assert answer.says in verdict, f"the verdict should say {answer.says!r}: {verdict}"
    assert took < limit, f"the check took {took:.0f} s: a hang must be called one in seconds"
    if "cluster" in given:  # the next cell works: the answer did not leave the cluster stuck
        cluster = given["cluster"]
        ranks = cluster.run(dist.get_rank, _record=False)
        assert ranks == list(range(cluster.world_size))


def test_every_exercise_has_three_wrong_answers_and_a_right_one():
    for nb, table in TABLES.items():
        for n in table.GRADERS:
            rows = [a for a in table.ANSWERS if a.exercise == n]
            wrong = [a for a in rows if a.says is not None]
            assert len(wrong) >= 3, f"{nb} exercise {n}: {len(wrong)} wrong answers"
            assert len(rows) - len(wrong) >= 1, f"{nb} exercise {n}: no right answer"


def test_an_unwritten_answer_is_not_attempted(capsys):
    from distlab.exercises import nb00

    def gather_ranks():
        raise NotImplementedError

    assert check("Exercise 1", nb00.exercise_1, gather_ranks) is False
    assert capsys.readouterr().out.startswith(f"Exercise 1: {NOT_ATTEMPTED}")
