"""How failures are ordered and worded (pure functions: no processes)."""

from __future__ import annotations

import pytest

from distlab.errors import RankError, RankFailure, RankTimeout, order_failures

pytestmark = pytest.mark.quick


def _f(rank, type_="ValueError", message="bad", stage="raised"):
    return RankFailure(rank, type_, message, traceback=f"Traceback ...\n{type_}: {message}\n",
                       stage=stage)


def test_root_causes_come_first_and_connection_errors_are_consequences():
    ordered = order_failures(
        [
            _f(0, "DistBackendError", "Connection closed by peer [127.0.0.1]:1234"),
            _f(2, "ValueError", "bad batch"),
            _f(1, "RuntimeError", "Socket Timeout"),
        ]
    )
    assert [(f.rank, f.consequence) for f in ordered] == [(2, False), (0, True), (1, True)]


def test_a_dead_rank_is_a_root_cause_even_if_reported_late():
    ordered = order_failures(
        [_f(0, "DistBackendError", "Connection reset by peer"), _f(1, "died", "killed", "died")]
    )
    assert [f.rank for f in ordered] == [1, 0] and ordered[1].consequence


def test_when_every_failure_looks_like_a_consequence_the_earliest_is_the_cause():
    ordered = order_failures([_f(1, "RuntimeError", "timed out"), _f(0, "RuntimeError", "timeout")])
    assert [(f.rank, f.consequence) for f in ordered] == [(1, False), (0, True)]


def test_root_causes_are_in_rank_order_so_the_report_is_deterministic():
    ordered = order_failures([_f(3, message="x"), _f(1, message="y")])
    assert [f.rank for f in ordered] == [1, 3]


def test_rank_error_message_groups_identical_tracebacks_and_names_stopped_ranks():
    err = RankError(order_failures([_f(1), _f(0)]), stopped=[2], world_size=3)
    text = str(err)
    assert text.splitlines()[0] == "rank 0 raised: ValueError: bad"
    assert "--- ranks 0, 1 ---" in text
    assert text.count("Traceback ...") == 1
    assert "distlab stopped rank(s) 2" in text
    assert err.primary.rank == 0 and err.ranks == [0, 1]


def test_died_rank_message_shows_its_last_output():
    f = RankFailure(1, "died", "killed by signal SIGSEGV", stage="died", exitcode=-11,
                    output_tail="Fatal Python error: Segmentation fault")
    text = str(RankError([f], [], 2))
    assert text.startswith("rank 1 died: killed by signal SIGSEGV")
    assert "  Fatal Python error: Segmentation fault" in text
    assert f.signal == "SIGSEGV"


def test_rank_timeout_lists_stuck_ranks_with_stacks_and_a_hint():
    err = RankTimeout(3.0, {1: '  File "<cell>", line 2\n    dist.barrier()\n'}, [0], 2)
    text = str(err)
    assert text.splitlines()[0] == "1 of 2 ranks did not finish within 3 s: rank 1."
    assert "--- rank 1 is stuck here (most recent call last) ---" in text
    assert "dist.barrier()" in text and "Finished: rank 0." in text
    assert isinstance(err, TimeoutError) and err.ranks == [1]


def test_every_distlab_error_is_a_distlab_error_and_the_builtin_a_learner_expects():
    import distlab

    expected = {
        "RankError": RuntimeError,
        "RankTimeout": TimeoutError,
        "ClusterBroken": RuntimeError,
        "ShipError": TypeError,
        "StartError": RuntimeError,
    }
    for name, builtin in expected.items():
        cls = getattr(distlab, name)
        assert issubclass(cls, distlab.DistlabError) and issubclass(cls, builtin), name
        assert cls._render_traceback_ is distlab.DistlabError._render_traceback_


def test_an_entry_point_leaves_no_distlab_frame_but_its_own_call_site():
    import traceback

    from distlab.errors import DistlabError, entry_point

    def deep():  # stands for distlab's inner frames
        raise DistlabError("what went wrong")

    deep.__code__ = deep.__code__.replace(co_filename=entry_point.__code__.co_filename)

    @entry_point
    def public():
        deep()

    with pytest.raises(DistlabError) as info:
        public()
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "deep" not in frames, frames  # distlab's inner frames are gone
    assert frames[0] == "test_an_entry_point_leaves_no_distlab_frame_but_its_own_call_site"
    assert info.value.__suppress_context__


def _stack(*frames):
    # A formatted stack as the ranks send it: (file, line, function, source), outermost first.
    return "".join(f'  File "{file}", line {line}, in {fn}\n    {src}\n'
                   for file, line, fn, src in frames)


def test_where_finds_the_innermost_line_of_the_learners_own_code():
    stack = _stack(
        ("<cell>", 9, "<module>", "train()"),  # the cell calls train ...
        ("<cell>", 4, "train", "dist.all_reduce(t)  # waits"),  # ... which waits here
        ("<site-packages>/torch/distributed/c10d_logger.py", 83, "wrapper", "return func()"),
        ("/x/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 4181,
         "all_reduce", "work.wait()"),
    )
    hang = RankTimeout(1, {0: stack, 2: stack}, finished=[1], world_size=3)
    assert hang.where(0) == ("train", 4, "dist.all_reduce(t)  # waits")
    assert hang.where(2) == hang.where(0)


def test_where_refuses_a_rank_that_is_not_stuck_or_has_no_frame_of_its_own():
    only_torch = _stack(("<site-packages>/torch/x.py", 1, "f", "work.wait()"))
    hang = RankTimeout(1, {0: only_torch}, finished=[1], world_size=2)
    with pytest.raises(ValueError, match=r"rank 1 is not stuck: the stuck ranks are \[0\]"):
        hang.where(1)
    with pytest.raises(ValueError, match="no frame of your code"):
        hang.where(0)
