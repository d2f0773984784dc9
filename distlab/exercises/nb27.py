"""Graders for notebook 27, training through failures (see `distlab.exercises`).

Every answer is a computation in the kernel, checked on cases drawn anew at every check (a table
of cases copied from earlier ✗ messages does not pass): Young's checkpoint interval for a job of
many GPUs, the straggler of per-rank timings where another rank has one bad step, who
entered each collective last in Flight Recorder dumps whose buffers start at different calls,
and the checkpoint a restart must load from a directory where a save died.
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
    r = expect.rng()
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


def draw_job(r: random.Random, bad_step: int | None = None) -> tuple[dict, int, int]:
    """A synchronous job's per-rank timings: ``(times, straggler, hiccup)``.

    ``times[rank]`` is a list of ``(before, inside)`` seconds per step. The straggler is slow
    before the collective at every step; every rank's step ends when the slowest arrives and
    the all-reduce then runs (2 to 5 ms, finishing a little apart on each rank), so the others
    wait inside for the difference, and the steps take about the same time on every rank (the
    straggler's not the shortest: its all-reduce may end later than another's). Another rank,
    ``hiccup``, has one step (``bad_step``, drawn if None: the first, a middle or the last)
    far slower than the straggler's (a warm-up, a pause): its mean, its maximum and that
    step's time are the largest, not its median."""
    world = r.randrange(3, 9)
    steps = r.randrange(5, 9)
    straggler = r.randrange(world)
    hiccup = r.choice([k for k in range(world) if k != straggler])
    bad = r.randrange(steps) if bad_step is None else bad_step % steps
    delay = r.randrange(40, 200) / 1000
    times: dict[int, list] = {k: [] for k in range(world)}
    for s in range(steps):
        before = {k: r.randrange(5, 15) / 1000 for k in range(world)}
        before[straggler] += delay
        if s == bad:
            before[hiccup] += delay * (steps + 2)
        slowest = max(before.values())
        for k in range(world):
            reduce = r.randrange(2, 6) / 1000
            times[k].append((round(before[k], 4), round(slowest - before[k] + reduce, 4)))
    return times, straggler, hiccup


def _copy(times: dict) -> dict:
    return {k: list(v) for k, v in times.items()}


def _median(values) -> float:
    import statistics

    return statistics.median(values)


#: Ways of reading the timings that name the straggler on some jobs and not on others: each
#: drawn job is one where every one of these names another rank than the straggler (so none
#: passes by luck), and each gets a message of its own in `exercise_2`.
WRONG_RULES = {
    "the longest median wait inside": lambda t: max(t, key=lambda k: _median(i for _, i in t[k])),
    "the largest mean before": lambda t: max(t, key=lambda k: sum(b for b, _ in t[k])),
    "the slowest single step before": lambda t: max(t, key=lambda k: max(b for b, _ in t[k])),
    "the first step dropped, then the largest mean before":
        lambda t: max(t, key=lambda k: sum(b for b, _ in t[k][1:])),
    "the first step alone": lambda t: max(t, key=lambda k: t[k][0][0]),
    "the last step alone": lambda t: max(t, key=lambda k: t[k][-1][0]),
    "the shortest median step": lambda t: min(t, key=lambda k: _median(b + i for b, i in t[k])),
    "the longest median step": lambda t: max(t, key=lambda k: _median(b + i for b, i in t[k])),
}


#: The rules that do not read the time before the collective: on a drawn job they name
#: neither the straggler nor the rank with the bad step, so that their message is theirs.
_NOT_BEFORE = ("the longest median wait inside", "the shortest median step",
               "the longest median step")


def _separating_job(r: random.Random, bad_step: int) -> tuple[dict, int, int]:
    """A job (`draw_job`, the bad step where ``bad_step`` says) on which every rule of
    `WRONG_RULES` that can be wrong there names another rank than the straggler: the first
    step's rules where the bad step is not the first, the last step's where it is not the
    last, the others always."""
    while True:
        times, straggler, hiccup = draw_job(r, bad_step)
        bad = next(s for s in range(len(times[0]))
                   if times[hiccup][s][0] > max(b for b, _ in times[straggler]))
        fooled = {name: rule(times) != straggler for name, rule in WRONG_RULES.items()}
        if bad == 0:
            fooled.pop("the first step dropped, then the largest mean before")
        if bad != 0:
            fooled.pop("the first step alone")
        if bad != len(times[0]) - 1:
            fooled.pop("the last step alone")
        others = {WRONG_RULES[name](times) for name in _NOT_BEFORE}  # their own messages
        if all(fooled.values()) and hiccup not in others:
            return times, straggler, hiccup


def exercise_2(find_straggler) -> None:
    """``find_straggler(times)`` -> the rank slow at every step, on drawn jobs where another
    rank has one very slow step (the first, a middle one, the last: each at least once), and
    on which every rule of `WRONG_RULES` names another rank."""
    r = expect.rng()
    bad_steps = [0, -1, 2, r.randrange(1, 4), 0, -1][:CASES]
    r.shuffle(bad_steps)
    for bad_step in bad_steps:
        times, straggler, hiccup = _separating_job(r, bad_step)
        got = find_straggler(_copy(times))
        world, steps = len(times), len(times[0])
        bad = next(s for s in range(steps) if times[hiccup][s][0] > times[straggler][s][0])
        what = f"a job of {world} ranks, {steps} steps"
        if isinstance(got, bool) or not isinstance(got, numbers.Integral):
            raise AssertionError(f"find_straggler should return a rank (an int); got "
                                 f"{expect.describe(got)}")
        if got == straggler:
            continue
        if got == hiccup:
            raise AssertionError(
                f"{what}: you named rank {got}, which had one bad step (step {bad} of 0 to "
                f"{steps - 1}) and is fast at the others; the straggler is slow at every step "
                "(a mean, a maximum or any one step lets one step decide, and a bad step can "
                "come anywhere: take the median)")
        if not 0 <= got < world:
            raise AssertionError(f"{what}: rank {got} is not one of the ranks 0 to {world - 1}")
        why = []
        if got == WRONG_RULES["the longest median wait inside"](times):
            why.append("it waits the longest inside the collective: it is one of the fast "
                       "ranks, waiting for the straggler")
        if got in (WRONG_RULES["the shortest median step"](times),
                   WRONG_RULES["the longest median step"](times)):
            why.append("its steps are the shortest or the longest, but every rank's step ends "
                       "when the all-reduce does, so the step times are all about alike and "
                       "say nothing")
        raise AssertionError(
            f"{what}: you named rank {got}, which is not slow before the collective at most "
            f"steps{': ' + '; and '.join(why) if why else ''}. Look at each rank's time before "
            "the all-reduce, step by step")


# -- exercise 3: who entered last, from the Flight Recorder's dumps ---------------------------


def draw_dumps(r: random.Random) -> list[dict]:
    """Flight Recorder dumps of a job, one per rank, in torch's format (the fields that matter).

    Every rank makes the same calls on two groups, the default one (``"0"``) and ``"1"``, each
    numbering its calls from 1, so call numbers repeat across groups. For each call one rank,
    drawn anew, enters 20 to 200 ms after the others (the others 0 to 9 ms apart: no ties). Each
    rank's ring buffer kept its last calls only, from a different call on each rank, and one rank
    had not yet called the last one or two when it was dumped: the ranks' entries line up by
    group and call number, neither from the start of the buffers nor from their end."""
    world = r.randrange(3, 6)
    calls = r.randrange(10, 15)
    groups = ["0"] + [r.choice(["0", "1"]) for _ in range(calls - 2)] + ["1"]
    r.shuffle(groups)
    numbered, seen = [], {"0": 0, "1": 0}
    for g in groups:
        seen[g] += 1
        numbered.append((g, seen[g]))
    first = [r.randrange(0, 4) for _ in range(world)]  # the oldest call each buffer still holds
    first[r.randrange(world)] = r.randrange(4, 6)  # at least one rank dropped a few more
    end = [calls] * world
    end[r.randrange(world)] = calls - r.randrange(1, 3)  # behind: not yet in the last calls
    t0 = 1_800_000_000_000_000_000
    dumps = [{"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": []}
             for _ in range(world)]
    for i, (g, seq) in enumerate(numbered):
        late = r.randrange(world)
        offsets = r.sample(range(10), world)  # distinct: no ties
        for rank in range(world):
            created = t0 + i * 300_000_000 + offsets[rank] * 1_000_000
            if rank == late:
                created += r.randrange(20, 200) * 1_000_000
            if first[rank] <= i < end[rank]:
                dumps[rank]["entries"].append({
                    "record_id": i, "process_group": (g, "default_pg" if g == "0" else "tp"),
                    "collective_seq_id": seq, "profiling_name": "gloo:all_reduce",
                    "time_created_ns": created, "input_sizes": [[4]], "state": "scheduled"})
    return dumps


def _last_by(dumps: list[dict], key, pick=max) -> dict:
    entered: dict = {}
    for rank, dump in enumerate(dumps):
        for e in dump["entries"]:
            entered.setdefault(key(e), {})[rank] = e["time_created_ns"]
    return {k: pick(t, key=t.get) for k, t in entered.items() if len(t) == len(dumps)}


def entered_last(dumps: list[dict]) -> dict:
    """(group name, call number) -> the rank that entered it last, for every call that every
    rank's buffer still holds."""
    return _last_by(dumps, lambda e: (e["process_group"][0], e["collective_seq_id"]))


def _by_position(dumps: list[dict], from_end: bool = False) -> dict:
    """What pairing the ranks' entries by their place in the buffers gives (the mistake), counted
    from the oldest entry or from the newest."""
    out = {}
    lists = [d["entries"][::-1] if from_end else d["entries"] for d in dumps]
    for row in zip(*lists, strict=False):  # the shortest decides
        times = [e["time_created_ns"] for e in row]
        e = row[0]
        out[(e["process_group"][0], e["collective_seq_id"])] = times.index(max(times))
    return out


def exercise_3(fn) -> None:
    """``entered_last(dumps)`` -> ``{(group name, call number): rank}``, on drawn dumps whose
    buffers start at different calls and whose groups both number their calls from 1."""
    import copy

    r = expect.rng()
    for _ in range(CASES):
        dumps = draw_dumps(r)
        want = entered_last(dumps)
        while want in (_by_position(dumps), _by_position(dumps, from_end=True)):
            dumps = draw_dumps(r)  # a draw that tells pairing by place apart
            want = entered_last(dumps)
        got = fn(copy.deepcopy(dumps))
        what = f"dumps of {len(dumps)} ranks"
        if not isinstance(got, dict):
            raise AssertionError(
                f"entered_last should return a dict {{(group name, call number): rank}}; got "
                f"{expect.describe(got)}")
        if got == want:
            continue
        if any(not (isinstance(k, tuple) and len(k) == 2) for k in got):
            bad = next(k for k in got if not (isinstance(k, tuple) and len(k) == 2))
            raise AssertionError(
                f"{what}: name each call by (group name, call number), like {next(iter(want))!r}; "
                f"got the key {bad!r} (call numbers start at 1 again in every group)")
        if any(isinstance(v, bool) or not isinstance(v, numbers.Integral) for v in got.values()):
            bad = next(v for v in got.values()
                       if isinstance(v, bool) or not isinstance(v, numbers.Integral))
            raise AssertionError(
                f"{what}: each value should be a rank (an int); got {expect.describe(bad)}")
        if any(not 0 <= v < len(dumps) for v in got.values()):
            bad = next(v for v in got.values() if not 0 <= v < len(dumps))
            raise AssertionError(
                f"{what}: each value should be a rank, 0 to {len(dumps) - 1}; got {bad} (a "
                "time_created_ns? return the rank that has the largest)")
        if got == _by_position(dumps):
            raise AssertionError(
                f"{what}: you paired the ranks' entries by their place in the buffers, but the "
                "buffers start at different calls: match them by group and call number")
        if got == _by_position(dumps, from_end=True):
            raise AssertionError(
                f"{what}: you paired the ranks' entries counting from the newest, but the "
                "buffers end at different calls too (a rank had not yet called the last ones): "
                "match them by group and call number")
        extra = sorted(set(got) - set(want), key=str)
        if extra:
            holders = [d for d in dumps if any(
                (e["process_group"][0], e["collective_seq_id"]) == extra[0] for e in d["entries"])]
            if holders:
                raise AssertionError(
                    f"{what}: {extra[0]!r} is not held by every rank (a buffer keeps only its "
                    "last calls, and theirs start at different calls): leave out the calls "
                    "some rank no longer holds")
            raise AssertionError(f"{what}: no rank recorded {extra[0]!r}")
        missing = sorted(set(want) - set(got), key=str)
        if missing:
            raise AssertionError(
                f"{what}: {missing[0]!r} is missing: every rank holds it (there are "
                f"{len(want)} such calls)")
        if got == _last_by(dumps, lambda e: (e["process_group"][0], e["collective_seq_id"]),
                           pick=min):
            raise AssertionError(
                f"{what}: those are the ranks that entered *first*; the one the others wait for "
                "entered last (the largest time_created_ns)")
        key = next(k for k in sorted(want, key=str) if got[k] != want[k])
        raise AssertionError(
            f"{what}: call {key!r} was entered last by rank {want[key]}; you said rank {got[key]}")


# -- exercise 4: which checkpoint to resume from -----------------------------------------------

#: Entries of a checkpoint directory that are not checkpoints (the store's file, a log folder).
_OTHERS = {"store": [], "rendezvous": [], "logs": ["rank-0.txt", "rank-1.txt"]}


def resume_step(listing: dict) -> int:
    """The newest complete ``step-<N>`` of ``listing`` (entry -> the files in it): DCP writes
    ``.metadata`` last, so a directory without it is a save that did not finish. 0: none."""
    done = [int(name[5:]) for name, files in listing.items()
            if name.startswith("step-") and name[5:].isdigit() and ".metadata" in files]
    return max(done, default=0)


def _window(r: random.Random) -> list[int]:
    """The steps of the last few saves, every ``k`` steps, across a power of ten (9 and 12,
    96 and 100, ...), so that comparing names as strings picks the wrong one."""
    p = r.choice((10, 100, 1000))
    k = r.randint(1, min(p - 1, 40))
    keep = r.randint(3, 5)
    first_over = -(-p // k)  # the first save at p or later
    n = first_over + r.randint(0, keep - 2)
    return [k * i for i in range(max(1, n - keep + 1), n + 1)]


def draw_listing(r: random.Random, kind: str) -> dict:
    """A checkpoint directory: ``kind`` is "died saving" (the newest has some ranks' files and
    no ``.metadata``), "died after" (every save complete), "died at once" (the newest is
    empty), or "nothing saved" (a single save that did not finish)."""
    ranks = r.randint(2, 4)
    whole = [".metadata"] + [f"__{i}_0.distcp" for i in range(ranks)]
    while True:
        steps = _window(r)
        complete = steps if kind == "died after" else steps[:-1]
        if kind == "nothing saved":
            steps, complete = steps[-1:], []
        names = [f"step-{s}" for s in complete]
        if kind == "nothing saved" or max(names) != f"step-{max(complete)}":
            break  # the string max is another step: a string comparison shows
    listing = {f"step-{s}": list(whole) for s in complete}
    newest = f"step-{steps[-1]}"
    if kind in ("died saving", "nothing saved"):
        listing[newest] = [f"__{i}_0.distcp" for i in sorted(r.sample(range(ranks),
                                                                       r.randint(1, ranks)))]
    elif kind == "died at once":
        listing[newest] = []
    listing.update({k: list(v) for k, v in _OTHERS.items() if r.random() < 0.7})
    items = list(listing.items())
    r.shuffle(items)  # os.listdir's order is no order
    return dict(items)


#: The kinds of directories each check draws, in this order.
KINDS_4 = ("died saving", "died after", "died at once", "nothing saved", "died saving",
           "died after")


def _steps_of(listing: dict) -> list[int]:
    return sorted(int(n[5:]) for n in listing if n.startswith("step-") and n[5:].isdigit())


def exercise_4(fn) -> None:
    """``resume_step(listing)`` -> the step (an int) of the newest complete checkpoint of a
    directory listing (entry -> its files), 0 if none: on `KINDS_4` drawn anew at every check."""
    import copy

    r = expect.rng()
    for kind in KINDS_4:
        listing = draw_listing(r, kind)
        want = resume_step(listing)
        got = fn(copy.deepcopy(listing))
        if got == want and isinstance(got, numbers.Integral) and not isinstance(got, bool):
            continue
        shown = {k: v for k, v in sorted(listing.items(), key=lambda kv: kv[0])}
        what = f"for {shown}"
        if got is None and want == 0:
            raise AssertionError(f"{what}: no checkpoint is complete, so the answer is 0 (start "
                                 "from scratch), an int; got None")
        if isinstance(got, str):
            raise AssertionError(f"{what}: return the step as an int, like {want}; got the "
                                 f"string {got!r}")
        if isinstance(got, bool) or not isinstance(got, numbers.Integral):
            raise AssertionError(f"{what}: return the step as an int, like {want}; got "
                                 f"{expect.describe(got)}")
        steps = _steps_of(listing)
        complete = [s for s in steps if ".metadata" in listing[f"step-{s}"]]
        if complete and got == int(max(f"step-{s}" for s in complete)[5:]):
            hint = (f"that is the largest name as a string: 'step-{got}' sorts after "
                    f"'step-{want}', but {want} > {got}: compare the steps as numbers")
        elif got == steps[-1] and got != want:
            hint = (f"step-{got} has no .metadata: DCP writes it last, so that save did not "
                    "finish and cannot be loaded")
        elif kind == "died after" and len(steps) > 1 and got == steps[-2]:
            hint = (f"step-{want} has its .metadata: the save finished (the job died after it), "
                    "so it is the one to load")
        elif got not in steps and got != 0:
            hint = f"there is no step-{got} in the directory"
        else:
            hint = "the newest directory with a .metadata is the one a restart loads"
        raise AssertionError(f"{what}: resume from step {want}; got {got} ({hint})")
