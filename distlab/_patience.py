"""How long to wait for something that is sure to come, on a machine that may be busy.

A rank's stack, the end marker of its output, a page in a browser: each arrives, only later when
the cores are shared with a video call or another test run. A fixed limit tuned on a quiet machine
then fails on a busy laptop by luck. `patience` stretches such a limit by `slowness`, what this
machine's load says now. A limit the learner sets (``launch(timeout=...)``, ``start_timeout``,
``%%ranks --timeout``) means what it says and is never stretched.
"""

from __future__ import annotations

import contextlib
import contextvars
import os

#: The most a limit is stretched: a machine 10 times slower than a quiet one is not "busy" but
#: stuck, and something that never comes must still be reported in bounded time.
MOST = 10.0


def _runnable() -> float:
    """Tasks that want a core now, this process included: the 1-minute load average, or the
    instantaneous count of runnable tasks where Linux gives it (the load average lags a burst of
    work by a minute); whichever is larger."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # not on every platform
        load = 0.0
    try:
        with open("/proc/loadavg") as f:
            running = float(f.read().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        running = 0.0
    return max(load, running)


def slowness() -> float:
    """How many times longer than on a quiet machine work takes here now: the tasks that want a
    core per core (at least 1, at most `MOST`). On 2 cores with two CPU burners and a test
    running, about 2; with a load of 7, 3.5. ``DISTLAB_SLOWNESS=3`` in the environment says it
    instead of measuring (a machine known to be slow; the tests of this module).

    Raises ValueError if ``DISTLAB_SLOWNESS`` is not a number of at least 1."""
    said = os.environ.get("DISTLAB_SLOWNESS")
    if said:
        try:
            value = float(said)
        except ValueError:
            value = 0.0
        if not value >= 1:
            raise ValueError(
                f"DISTLAB_SLOWNESS={said!r}: it must be a number of at least 1 (how many times "
                "slower than a quiet machine this one is); unset it to have it measured")
        return value
    cores = os.cpu_count() or 1
    return min(MOST, max(1.0, _runnable() / cores))


def patience(seconds: float) -> float:
    """``seconds`` (a limit that suits a quiet machine) stretched by `slowness` now."""
    return seconds * slowness()


# -- a grader's wait for a hang ------------------------------------------------------------------

#: Set while a check waits for a learner's answer (`hang_when_idle`): the quiet machine's limit,
#: after which ranks that use no CPU are called hung at once instead of at the stretched limit.
_idle_after: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "distlab_idle_after", default=None)


@contextlib.contextmanager
def hang_when_idle(seconds: float):
    """Inside: a wait for ranks stretched by `patience` ends after ``seconds`` (the limit on a
    quiet machine) if the ranks still running use no CPU: they wait for each other (a collective
    or a recv that a rank never joins), and no amount of waiting ends that. Ranks that compute,
    or wait on a disk, get the stretched limit (`distlab._ranks.idle`). What
    `distlab.exercises.expect.run` waits under: on a busy laptop an answer that hangs is called a
    hang after 10 s, not 35."""
    token = _idle_after.set(seconds)
    try:
        yield
    finally:
        _idle_after.reset(token)


def idle_after() -> float | None:
    """The limit `hang_when_idle` set, or None outside it."""
    return _idle_after.get()
