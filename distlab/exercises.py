"""Exercise checks: the learner writes an answer, `check` runs the test and says how it went.

Every exercise in the notebooks has the same three cells:

1. the exercise (markdown);
2. an attempt cell, visible, with a skeleton that raises ``NotImplementedError`` and a call to
   ``check("Exercise N", test)`` at the end, which prints "not attempted yet" until the learner
   has written an answer, then "✓ correct" or "✗ not yet: <what was wrong>";
3. the solution, collapsed (its source *and* its output hidden), which defines the answer and
   calls the same check. Its output is only the verdict, so even a viewer that ignores the
   collapsed state (GitHub, nbviewer) gives nothing away by showing it.

The test itself computes what is right by running the real thing where it can (the answer to
"predict what rank 2 prints" is found by running it), so the attempt cell does not spell out the
answer either.
"""

from __future__ import annotations

from collections.abc import Callable

PASSED = "✓ correct"
NOT_ATTEMPTED = "not attempted yet"


def check(label: str, test: Callable[..., object], *args, **kwargs) -> bool:
    """Run an exercise's ``test(*args, **kwargs)`` and print one line saying how it went.

    Args:
        label: what to call the exercise in the verdict, e.g. ``"Exercise 2"``.
        test: a function that raises ``AssertionError`` (with a message saying what is wrong)
            when the answer is wrong, and returns when it is right. It calls the learner's code,
            so a skeleton's ``raise NotImplementedError`` reaches it, also from the ranks (a
            `distlab.RankError` whose root cause is that error reads as "not attempted yet").
        args, kwargs: passed to ``test``.

    Returns:
        True when the answer is right; False when it is wrong or not written yet.

    Raises:
        TypeError: ``test`` is not callable.
        Any other error ``test`` raises (a bug in the answer, say ``NameError``) propagates with
        its traceback: that is more useful to see than a verdict.
    """
    if not callable(test):
        raise TypeError(f"check() needs a test function to call, got {test!r}")
    from .errors import RankError

    try:
        test(*args, **kwargs)
    except (NotImplementedError, RankError) as e:
        if isinstance(e, RankError) and not _not_written_on_ranks(e):
            raise  # a real error on a rank: its report says where
        message = e.primary.message if isinstance(e, RankError) else str(e)
        why = f" ({message})" if message else ""
        print(
            f"{label}: {NOT_ATTEMPTED}{why}. Replace the `raise NotImplementedError` above with "
            "your answer and run the cell again."
        )
        return False
    except AssertionError as e:
        print(f"{label}: ✗ not yet: {e or 'a check failed'}")
        return False
    print(f"{label}: {PASSED}")
    return True


def _not_written_on_ranks(error) -> bool:
    """A `RankError` whose root causes are all a skeleton's NotImplementedError (the test ran the
    learner's unwritten answer on the ranks, through `distlab.launch` or `Cluster.run`)."""
    roots = [f for f in error.failures if not f.consequence]
    return bool(roots) and all(f.type == "NotImplementedError" for f in roots)


__all__ = ["NOT_ATTEMPTED", "PASSED", "check"]
