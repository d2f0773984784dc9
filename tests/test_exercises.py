"""distlab.check: the verdict an exercise's attempt cell prints."""

from __future__ import annotations

import os
import re
import types

import pytest
import torch.distributed as dist

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


def test_a_bug_in_the_answer_shows_its_traceback_then_one_verdict(capsys):
    def answer():
        return undefined_name  # noqa: F821

    def test():
        answer()

    assert check("Exercise 3", test) is False
    out, err = capsys.readouterr()
    assert out == (
        "Exercise 3: ✗ not yet: your code raised NameError: name 'undefined_name' is not "
        "defined (traceback above)\n"
    )
    assert "return undefined_name" in err  # the answer's own line...
    # ...and none of distlab's frames (whatever the checkout's folder is called: "distlab" too)
    package = os.path.dirname(distlab.__file__) + os.sep
    assert re.findall(r'File "([^"]+)"', err) and not [
        f for f in re.findall(r'File "([^"]+)"', err) if f.startswith(package)
    ], err
    with pytest.raises(TypeError, match="needs a test function"):
        check("Exercise 3", "not callable")


def test_a_grader_that_chokes_on_the_answer_gives_a_verdict_not_a_traceback(capsys):
    from distlab.exercises import nb00

    def my_prediction():  # a learner returning a string where a tuple of 3 is expected
        return "2, ZeroDivisionError, [0, 1]"

    assert check("Exercise 2", nb00.exercise_2, my_prediction) is False
    out, err = capsys.readouterr()
    assert out.startswith("Exercise 2: ✗ not yet: my_prediction() should return a tuple of 3")
    assert err == ""

    def grader(answer):
        import torch

        torch.equal(answer(), torch.ones(2))  # raises TypeError inside torch, not the answer

    # as if it were one of distlab's graders (distlab/exercises/nbNN.py)
    grader.__code__ = grader.__code__.replace(co_filename=nb00.__file__)
    assert check("Exercise 4", grader, lambda: (1.0, 1.0)) is False
    out = capsys.readouterr().out
    assert out.startswith("Exercise 4: ✗ not yet: the check could not use what your answer")


def test_check_is_exported_and_works_on_every_rank(capsys):
    def on_rank():
        import torch.distributed as dist

        from distlab import check as rank_check

        def test():
            if dist.get_rank() == 1:
                raise AssertionError("rank 1 is wrong on purpose")

        return rank_check("Exercise 4", test)

    assert distlab.launch(on_rank, world_size=3) == [True, False, True]
    assert capsys.readouterr().out == (
        f"[ranks 0,2] Exercise 4: {PASSED}\n"
        "[rank 1] Exercise 4: ✗ not yet: rank 1 is wrong on purpose\n"
    )


def test_a_skeleton_on_the_ranks_is_not_attempted_and_a_rank_error_is_reported(capsys):
    def skeleton():
        raise NotImplementedError("your code here")

    def buggy():
        import torch.distributed as dist

        if dist.get_rank() == 1:
            raise ZeroDivisionError("a real bug")

    assert check("Exercise 5", lambda: distlab.launch(skeleton, world_size=2)) is False
    out = capsys.readouterr().out
    assert f"Exercise 5: {NOT_ATTEMPTED} (your code here)." in out
    assert check("Exercise 5", lambda: distlab.launch(buggy, world_size=2)) is False
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == (
        "Exercise 5: ✗ not yet: your code failed on the ranks (rank 1 raised: "
        "ZeroDivisionError: a real bug; the report is above)"
    )
    assert "raise ZeroDivisionError" in err  # the ranks' report, with the answer's line


def test_a_hang_is_a_verdict_naming_where_each_rank_waits(capsys):
    def lonely():
        import torch
        import torch.distributed as dist

        if dist.get_rank() == 0:
            dist.all_reduce(torch.ones(1))

    assert check("Exercise 6", lambda: distlab.launch(lonely, world_size=2, timeout=2)) is False
    verdict = capsys.readouterr().out.splitlines()[-1]
    assert verdict.startswith("Exercise 6: ✗ not yet: your answer hangs: rank 0 at line ")
    assert "in lonely (dist.all_reduce(torch.ones(1))) still waited after 2 s" in verdict


def test_a_half_written_answer_is_not_finished_not_unattempted(capsys):
    def scaled_step(loss, scale):  # the first half written, the overflow branch not yet
        total = loss * scale
        if total > 100:
            raise NotImplementedError
        return total

    def test(answer):
        answer(10.0, 20.0)

    assert check("Exercise 2", test, scaled_step) is False
    verdict = capsys.readouterr().out.strip()
    assert verdict.startswith("Exercise 2: ✗ not yet: your answer reached a `raise "
                              "NotImplementedError` (line "), verdict
    assert "in scaled_step): it is not finished yet" in verdict

    def skeleton(loss, scale):
        # the exercise's skeleton: nothing written yet
        raise NotImplementedError

    assert check("Exercise 2", test, skeleton) is False
    assert capsys.readouterr().out.startswith(f"Exercise 2: {NOT_ATTEMPTED}.")


def test_a_not_implemented_error_from_torch_is_an_error_not_a_skeleton(capsys):
    from torch import nn

    class Sharded(nn.Module):  # forgot to define forward: torch raises NotImplementedError
        pass

    def answer():
        return Sharded()(1.0)

    assert check("Exercise 3", lambda a: a(), answer) is False
    out, err = capsys.readouterr()
    assert out.startswith("Exercise 3: ✗ not yet: your code raised NotImplementedError: "), out
    assert 'missing the required "forward" function' in out and "Traceback" in err


def test_on_the_ranks_a_half_written_answer_is_not_finished_too(capsys):
    from distlab.exercises import expect

    def exchange(rows):
        rank, world = dist.get_rank(), dist.get_world_size()  # noqa: F841
        if rows > 1:  # half written
            return rows * world
        raise NotImplementedError

    def skeleton(rows):  # as the notebooks write it, with `dist` from an earlier cell
        rank, world = dist.get_rank(), dist.get_world_size()  # noqa: F841
        raise NotImplementedError

    def test(answer):
        expect.run(answer, 1, world_size=2)

    assert check("Exercise 2", test, exchange) is False
    verdict = capsys.readouterr().out.strip().splitlines()[-1]
    assert "your answer reached a `raise NotImplementedError` (line " in verdict, verdict
    assert "in exchange): it is not finished yet" in verdict
    assert check("Exercise 2", test, skeleton) is False
    assert f"Exercise 2: {NOT_ATTEMPTED}" in capsys.readouterr().out


def test_what_an_answer_changed_for_later_cells_is_put_back_here_and_on_the_ranks(capsys):
    import torch

    from distlab import gpt
    from distlab.exercises import expect

    forward = gpt.Attention.forward

    def answer():  # two changes that broke every later cell until a restart
        import torch

        from distlab import gpt

        torch.set_default_dtype(torch.float64)
        gpt.Attention.forward = lambda self, x: x
        return torch.get_default_dtype()

    def test(answer):
        assert answer() == torch.float64
        on_ranks = expect.run(answer, world_size=2)
        assert on_ranks == [torch.float64] * 2
        after = distlab.launch(_state_on_a_rank, world_size=2)
        return after

    assert check("Exercise 1", test, answer) is True
    assert torch.get_default_dtype() == torch.float32 and gpt.Attention.forward is forward
    with distlab.Cluster(world_size=2) as cluster:
        expect.run(answer, cluster=cluster)
        assert cluster.run(_state_on_a_rank) == [("torch.float32", True)] * 2


def _state_on_a_rank():
    import torch

    from distlab import gpt

    return str(torch.get_default_dtype()), gpt.Attention.forward.__module__ == "distlab.gpt"


def test_a_skeleton_that_imports_what_the_answer_needs_is_still_not_attempted(capsys):
    """Notebook 14's skeletons import `fully_shard` above their `raise`: not attempted yet.
    Using the import before the `raise` is a start: not finished."""

    def skeleton(model, mesh):
        from torch.distributed.fsdp import fully_shard  # noqa: F401

        raise NotImplementedError

    def started(model, mesh):
        from torch.distributed.fsdp import fully_shard

        fully_shard(model.net1, mesh=mesh)
        raise NotImplementedError

    def test(answer):
        answer(None, None)

    assert check("Exercise 1", test, skeleton) is False
    assert capsys.readouterr().out.startswith(f"Exercise 1: {NOT_ATTEMPTED}.")
    fake = types.SimpleNamespace(net1=None)

    def test_started(answer):
        import torch.distributed.fsdp as fsdp

        real = fsdp.fully_shard
        fsdp.fully_shard = lambda *a, **k: None
        try:
            answer(fake, None)
        finally:
            fsdp.fully_shard = real

    assert check("Exercise 1", test_started, started) is False
    assert "in started): it is not finished yet" in capsys.readouterr().out


def _rank_0_alone():
    import torch

    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))  # rank 1 never joins


def test_on_a_busy_machine_a_hang_on_a_cluster_is_called_a_hang_before_gloo_gives_up(monkeypatch):
    # A check's wait is stretched by the load, but the cluster's process group gives up a few
    # seconds after the cluster's own timeout: past it, the verdict was gloo's "Timed out
    # waiting ... for send operation", not "your answer hangs" (seen beside two CPU burners).
    from distlab.exercises import expect

    monkeypatch.setenv("DISTLAB_SLOWNESS", "10")  # 5 s stretched to 50, the cluster's is 3
    with distlab.Cluster(world_size=2, timeout=3) as cluster:
        with pytest.raises(distlab.RankTimeout):
            expect.run(_rank_0_alone, cluster=cluster)
    assert expect._hang_wait(5, None) == 50  # a fresh launch: its own group waits as long


def _rank_0_reduces_then_both_wait():
    import time

    import torch

    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1), async_op=True)  # started, never joined by rank 1
    while True:
        time.sleep(0.05)  # Python: an interrupt stops both ranks, the collective left halfway


def _every_rank_reduces():
    import torch

    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


@pytest.mark.parametrize(
    "hang, slow",
    [
        (_rank_0_reduces_then_both_wait, None),
        # CI beside a slow machine: the interrupt's wait (stretched) outlasted the process
        # group's timeout, gloo ended rank 0's collective, the rank came back idle, and every
        # later answer on that cluster failed ("Connection closed by peer").
        (_rank_0_alone, "10"),
    ],
    ids=["interrupted in Python", "ended by gloo's timeout while interrupted"],
)
def test_after_a_hang_the_next_answer_runs_on_ranks_in_step(hang, slow, monkeypatch, capsys):
    from distlab.exercises import expect

    if slow:
        monkeypatch.setenv("DISTLAB_SLOWNESS", slow)
    with distlab.Cluster(world_size=2, timeout=3) as cluster:

        def grader(answer):
            values = expect.run(answer, cluster=cluster, timeout=3)
            assert values == [2.0, 2.0], values

        assert check("Exercise 1", grader, hang) is False
        out = capsys.readouterr().out
        assert "your answer hangs" in out and "distlab restarted its ranks" in out, out
        assert not cluster.hung
        assert check("Exercise 1", grader, _every_rank_reduces) is True, capsys.readouterr()


def test_on_a_busy_machine_a_hang_is_called_at_the_quiet_limit_when_the_ranks_use_no_cpu(
        monkeypatch):
    # The check's 2 s is stretched to 20 by the load, but rank 0 waits in a collective rank 1
    # never joins, using no CPU: it is called a hang after 2 s, and the report says 2 s.
    from distlab.exercises import expect

    monkeypatch.setenv("DISTLAB_SLOWNESS", "10")
    with pytest.raises(distlab.RankTimeout) as e:
        expect.run(_rank_0_alone, timeout=2)
    assert e.value.timeout == 2


def _computes_then_reduces(seconds):
    import time

    import torch

    end = time.process_time() + seconds  # CPU seconds: as long on a busy machine as a quiet one
    while time.process_time() < end:
        pass
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def test_ranks_that_compute_past_the_quiet_limit_get_the_stretched_one():
    # Past the quiet machine's limit (0.2 s) rank 0 still computes (2 CPU seconds) while rank 1
    # waits for it in the all_reduce: working, not hung, so the wait goes on to the limit given.
    # The first look at their CPU comes one window (1 s) after the limit, while rank 0 has most of
    # its 2 s still to go: a test that called every rank blocked would call it hung there.
    from distlab._patience import hang_when_idle
    from distlab._ranks.idle import WINDOW

    assert 0.2 + WINDOW < 2 - 0.5
    with hang_when_idle(0.2):
        assert distlab.launch(_computes_then_reduces, 2.0, world_size=2, timeout=120,
                              threads=1) == [2.0, 2.0]
