"""Graders for notebook 27, training through failures (see `distlab.exercises`).

Both answers are computations in the kernel, checked on cases drawn anew at every check (a table
of cases copied from earlier ✗ messages does not pass): Young's checkpoint interval for a job of
many GPUs, and the straggler of per-rank timings where another rank has one bad step.
"""

from __future__ import annotations

import math
import numbers
import random

from . import expect

#: How many cases each check draws.
CASES = 6


# -- exercise 1: how often to save ------------------------------------------------------------


def young_interval(save_seconds: float, gpus: int, gpu_mtbf_hours: float) -> float:
    """Young's interval, √(2 δ M), with M the job's mean time between failures in seconds: one
    GPU's, divided by the number of GPUs (any one failing stops the job)."""
    return math.sqrt(2 * save_seconds * gpu_mtbf_hours * 3600 / gpus)


def _draw_interval_case(r: random.Random) -> tuple[float, int, float]:
    save = r.randrange(5, 600) + r.randrange(0, 10) / 10  # seconds, not a round number
    gpus = r.choice((256, 512, 1024, 3072, 8192, 16384, 24576))
    mtbf = float(r.randrange(20_000, 200_000))  # hours per GPU: 2 to 23 years
    return save, gpus, mtbf


#: Factors that name a typical mistake: the interval came out this many times the right one.
def _interval_hints(save: float, gpus: int, mtbf: float) -> list[tuple[float, str]]:
    return [
        (1 / math.sqrt(2), "without the factor 2 under the root (√(δM), not √(2δM))"),
        (math.sqrt(gpus), "the job fails when *any* GPU fails: divide one GPU's MTBF by the "
                          "number of GPUs"),
        (1 / 60, "60 times too small: the MTBF is in hours (turn it into seconds, × 3600, "
                 "before the root), and the interval is asked in seconds, not minutes"),
        (60, "that is minutes, not seconds?"),
        (math.sqrt(2) * math.sqrt(gpus), "one GPU's MTBF is not the job's: divide by the "
                                         "number of GPUs"),
    ]


def exercise_1(checkpoint_interval) -> None:
    """``checkpoint_interval(save_seconds, gpus, gpu_mtbf_hours)`` -> Young's interval in
    seconds, on drawn cases."""
    r = random.SystemRandom()
    for _ in range(CASES):
        save, gpus, mtbf = _draw_interval_case(r)
        got = checkpoint_interval(save, gpus, mtbf)
        call = f"checkpoint_interval({save}, {gpus}, {mtbf:g})"
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            raise AssertionError(f"{call} should return a number of seconds; got "
                                 f"{expect.describe(got)}")
        want = young_interval(save, gpus, mtbf)
        if math.isclose(got, want, rel_tol=1e-6):
            continue
        if got > 0:
            for factor, why in _interval_hints(save, gpus, mtbf):
                if math.isclose(got, want * factor, rel_tol=1e-6):
                    raise AssertionError(f"{call} returned {got:.6g}: {why}")
            if math.isclose(got, want**2 / (2 * save), rel_tol=1e-6):
                raise AssertionError(f"{call} returned {got:.6g}, the job's MTBF: the interval "
                                     "is √(2 δ M)")
            if math.isclose(got, want**2, rel_tol=1e-6):
                raise AssertionError(f"{call} returned {got:.6g}: take the square root")
        raise AssertionError(f"{call} should be {want:.6g} s; got {got!r}")


# -- exercise 2: find the straggler -----------------------------------------------------------


def draw_job(r: random.Random) -> tuple[dict, int, int]:
    """A synchronous job's per-rank timings: ``(times, straggler, hiccup)``.

    ``times[rank]`` is a list of ``(before, inside)`` seconds per step. The straggler is slow
    before the collective at every step; every rank's step ends when the slowest arrives, so the
    others wait inside for the difference (plus 2 or 3 ms; the last to arrive, 1 ms), and the
    steps take the same time on every rank, the straggler's never the longest. Another rank,
    ``hiccup``, has one first step far slower than the straggler's (a warm-up, a pause): its
    mean, its maximum and its first step are the largest, not its median."""
    world = r.randrange(3, 9)
    steps = r.randrange(5, 9)
    straggler = r.randrange(world)
    hiccup = r.choice([k for k in range(world) if k != straggler])
    delay = r.randrange(40, 200) / 1000
    times: dict[int, list] = {k: [] for k in range(world)}
    for s in range(steps):
        before = {k: r.randrange(5, 15) / 1000 for k in range(world)}
        before[straggler] += delay
        if s == 0:
            before[hiccup] += delay * (steps + 2)
        slowest = max(before.values())
        for k in range(world):
            late = 1 if k == straggler else r.randrange(2, 4)
            times[k].append((round(before[k], 4), round(slowest - before[k] + late / 1000, 4)))
    return times, straggler, hiccup


def _copy(times: dict) -> dict:
    return {k: list(v) for k, v in times.items()}


def exercise_2(find_straggler) -> None:
    """``find_straggler(times)`` -> the rank slow at every step, on drawn jobs where another
    rank has one very slow step."""
    import statistics

    r = random.SystemRandom()
    for _ in range(CASES):
        times, straggler, hiccup = draw_job(r)
        got = find_straggler(_copy(times))
        world, steps = len(times), len(times[0])
        what = f"a job of {world} ranks, {steps} steps"
        if isinstance(got, bool) or not isinstance(got, numbers.Integral):
            raise AssertionError(f"find_straggler should return a rank (an int); got "
                                 f"{expect.describe(got)}")
        if got == straggler:
            continue
        if got == hiccup:
            raise AssertionError(
                f"{what}: you named rank {got}, which had one bad step and is fast at the "
                "others; the straggler is slow at every step (a mean, a maximum or the first step "
                "lets one step decide: take the median)")
        waits = {k: statistics.median(i for _, i in v) for k, v in times.items()}
        if got == max(waits, key=waits.get):
            raise AssertionError(
                f"{what}: you named rank {got}, which waits the longest inside the "
                "collective: it is one of the fast ranks, waiting for the straggler")
        if not 0 <= got < world:
            raise AssertionError(f"{what}: rank {got} is not one of the ranks 0 to {world - 1}")
        raise AssertionError(
            f"{what}: you named rank {got}, which is not slow before the collective at most "
            "steps; look at each rank's time before the all-reduce, step by step (the step "
            "times are all alike)")
