"""distlab.check: the verdict an exercise's attempt cell prints."""

from __future__ import annotations

import pytest

import distlab
from distlab.exercises import NOT_ATTEMPTED, PASSED, check


def test_a_skeleton_that_raises_not_implemented_is_not_attempted_yet(capsys):
    def answer():
        raise NotImplementedError

    def test():
        assert answer() == 3

    assert check("Exercise 1", test) is False
    out = capsys.readouterr().out
    assert out.startswith(f"Exercise 1: {NOT_ATTEMPTED}.") and "run the cell again" in out


def test_a_wrong_answer_says_what_was_wrong_and_a_right_one_passes(capsys):
    def test(value):
        if value != 3:  # not `assert`: pytest would rewrite its message
            raise AssertionError(f"expected 3, got {value}")

    assert check("Exercise 2", test, 4) is False
    assert capsys.readouterr().out == "Exercise 2: ✗ not yet: expected 3, got 4\n"
    assert check("Exercise 2", test, value=3) is True
    assert capsys.readouterr().out == f"Exercise 2: {PASSED}\n"


def test_a_bug_in_the_answer_is_raised_with_its_traceback_not_judged():
    def test():
        return undefined_name  # noqa: F821

    with pytest.raises(NameError):
        check("Exercise 3", test)
    with pytest.raises(TypeError, match="needs a test function"):
        check("Exercise 3", "not callable")


def test_check_is_exported_and_works_on_every_rank(capsys):
    def on_rank():
        import torch.distributed as dist

        from distlab import check as rank_check

        def test():
            if dist.get_rank() == 1:
                raise AssertionError("rank 1 is wrong on purpose")

        return rank_check("Exercise 4", test)

    assert distlab.check is check
    assert distlab.launch(on_rank, world_size=3) == [True, False, True]
    assert capsys.readouterr().out == (
        f"[ranks 0,2] Exercise 4: {PASSED}\n"
        "[rank 1] Exercise 4: ✗ not yet: rank 1 is wrong on purpose\n"
    )


def test_a_skeleton_run_on_the_ranks_is_not_attempted_yet_and_a_real_rank_error_is_raised(capsys):
    def skeleton():
        raise NotImplementedError("your code here")

    def buggy():
        import torch.distributed as dist

        if dist.get_rank() == 1:
            raise ZeroDivisionError("a real bug")

    assert check("Exercise 5", lambda: distlab.launch(skeleton, world_size=2)) is False
    out = capsys.readouterr().out
    assert f"Exercise 5: {NOT_ATTEMPTED} (your code here)." in out
    with pytest.raises(distlab.RankError, match="ZeroDivisionError"):
        check("Exercise 5", lambda: distlab.launch(buggy, world_size=2))
