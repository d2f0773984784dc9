"""Graders for notebook 18, debugging a distributed job (see `distlab.exercises`).

The graders break things on purpose on the notebook's live cluster (3 ranks), each on a new
group whose collectives give up after a second, and read what the ranks say.
"""

from __future__ import annotations

import contextlib
import io
import numbers
import re

from . import expect

#: Seconds a check may take on the cluster (two 1 s group timeouts, and their reports).
TIMEOUT = 20.0


def _on_short_group(fn, *args, seconds=1.0, **kwargs):
    """The notebook's ``on_short_group``: a new group whose collectives give up after
    ``seconds``, then ``fn(group, ...)``: ("returned", value) or ("raised", "Type: message")."""
    from datetime import timedelta

    import torch.distributed as dist

    group = dist.new_group(timeout=timedelta(seconds=seconds))
    try:
        return "returned", fn(group, *args, **kwargs)
    except RuntimeError as e:
        return "raised", f"{type(e).__name__}: {e}"


def _quietly(fn, *args, **kwargs):
    """`expect.run` with what the ranks print (gloo's C++ log lines) kept out of the notebook."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return expect.run(fn, *args, **kwargs)


def _as_set_of_ranks(guess, what: str, example) -> set:
    if isinstance(guess, (list, tuple, frozenset)) and all(
        isinstance(r, numbers.Integral) for r in guess
    ):
        raise AssertionError(
            f"{what} should be a set of ranks, like {example!r}; got {expect.describe(guess)} "
            f"(a set has no order and no repeats: set(...) makes one)"
        )
    if not isinstance(guess, set):
        raise AssertionError(f"{what} should be a set of ranks (ints), like {example!r}; got "
                             f"{expect.describe(guess)}")
    if not all(isinstance(r, numbers.Integral) and not isinstance(r, bool) for r in guess):
        raise AssertionError(f"{what} should hold ranks as ints, like {example!r}; got "
                             f"{guess!r}")
    return guess


# -- exercise 1: who does rank 0 name? ---------------------------------------------------------

#: The notebook's BATCHES: rank 0 has one batch more than ranks 1 and 2.
BATCHES = {0: 3, 1: 2, 2: 2}


def _train_checked(group, batches, wait_all_ranks):
    """The notebook's ``train_checked``: a monitored_barrier before every step's all_reduce."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    weights = torch.zeros(2)
    dist.broadcast(weights, src=0, group=group)
    for step in range(batches[rank]):
        dist.monitored_barrier(group, timeout=timedelta(seconds=1), wait_all_ranks=wait_all_ranks)
        grad = torch.full((2,), float(rank + step))
        dist.all_reduce(grad, group=group)
        weights -= 0.1 * grad / dist.get_world_size(group)
    return weights.tolist()


def _named(message: str) -> set[int]:
    found = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", message)
    return {int(r) for r in found.group(1).split(",")} if found else set()


def exercise_1(named_with_default, cluster) -> None:
    """``named_with_default()``: the set of ranks rank 0's ``monitored_barrier`` names when
    ranks 1 and 2 have one batch fewer (``BATCHES``) and ``wait_all_ranks=False`` (the
    default). The grader runs it on the cluster and reads rank 0's message."""
    guess = named_with_default()
    outcome = _quietly(_on_short_group, _train_checked, BATCHES, False, cluster=cluster,
                       timeout=TIMEOUT)
    how, message = outcome[0]
    truth = _named(message) if how == "raised" else set()
    _as_set_of_ranks(guess, "named_with_default()", {0})
    if guess != truth:
        raise AssertionError(f"rank 0 named {truth}, not {guess}: it said {message.strip()!r}")


# -- exercise 2: who stopped first? ------------------------------------------------------------


def _last_seq(dump, group_name) -> int:
    """The last call number on ``group_name`` in one rank's dump, from its *entries* (the
    learner reads ``pg_status``: the grader's truth comes from the other field)."""
    seqs = [e["collective_seq_id"] for e in dump["entries"]
            if e["process_group"][0] == group_name]
    return max(seqs, default=0)


def _synthetic(lasts: dict[str, list[int]]) -> list[dict]:
    """Dumps of as many ranks as the lists hold, whose groups (name -> each rank's last call
    number) end as given, in the flight recorder's format (its fields that matter here)."""
    ranks = len(next(iter(lasts.values())))
    dumps = []
    for r in range(ranks):
        entries = [
            {"process_group": (name, "synthetic"), "collective_seq_id": seq,
             "profiling_name": "gloo:all_reduce"}
            for name, per_rank in lasts.items() for seq in range(1, per_rank[r] + 1)
        ]
        status = {name: {"last_enqueued_collective": per_rank[r],
                         "last_started_collective": -1, "last_completed_collective": -1}
                  for name, per_rank in lasts.items()}
        dumps.append({"entries": entries, "pg_status": status})
    return dumps


#: Cases the notebook's dumps do not have: two ranks that stopped at the same call, a rank
#: alone, every rank even (then all of them hold the smallest number), and a default group
#: ("0") that ends differently from the group asked about.
CASES = [
    ({"0": [1, 1, 1], "3": [10, 9, 9]}, "3"),
    ({"0": [5, 5, 5], "1": [4, 4, 3]}, "1"),
    ({"0": [7, 2, 7], "2": [6, 6, 6]}, "2"),
]


def exercise_2(stopped_early, dumps, group_name) -> None:
    """``stopped_early(dumps, group_name)``: the set of ranks whose last enqueued call number on
    group ``group_name`` (``dump["pg_status"][group_name]["last_enqueued_collective"]``) is
    the smallest. Checked on the notebook's dumps and on synthetic dumps of 3 ranks."""
    cases = [(dumps, group_name)] + [(_synthetic(lasts), name) for lasts, name in CASES]
    for i, (ds, name) in enumerate(cases):
        lasts = [_last_seq(d, name) for d in ds]
        truth = {r for r, n in enumerate(lasts) if n == min(lasts)}
        guess = stopped_early(ds, name)
        where = "the notebook's dumps" if i == 0 else f"dumps whose last call numbers are {lasts}"
        _as_set_of_ranks(guess, f"stopped_early on {where}", truth)
        if guess != truth:
            raise AssertionError(
                f"on {where} (group {name!r}), ranks {truth} stopped first; your function says "
                f"{guess}"
            )


# -- exercise 3: what does DETAIL say? ---------------------------------------------------------

ASPECTS = ("Op type", "Tensor shapes", "Tensor dtypes")


def _mixed_dtypes(group):
    import torch
    import torch.distributed as dist

    dtype = torch.float32 if dist.get_rank() == 0 else torch.int64
    dist.all_reduce(torch.ones(2, dtype=dtype), group=group)


def _checked(fn):
    import torch.distributed as dist

    dist.set_debug_level(dist.DebugLevel.DETAIL)  # groups made now get the checker
    try:
        return _on_short_group(fn)
    finally:
        dist.set_debug_level(dist.DebugLevel.OFF)


def exercise_3(predicted_aspect, cluster) -> None:
    """``predicted_aspect()``: which aspect (exactly one of `ASPECTS`) rank 0's
    ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` message says the collectives differ in, when rank 0
    all-reduces 2 float32 numbers and ranks 1 and 2 two int64. The grader runs it."""
    guess = predicted_aspect()
    if not isinstance(guess, str) or guess not in ASPECTS:
        near = [a for a in ASPECTS if isinstance(guess, str) and guess.strip()
                and guess.strip().lower() in a.lower()]
        raise AssertionError(
            f"predicted_aspect() should be exactly one of {', '.join(map(repr, ASPECTS))}; got "
            f"{expect.describe(guess)}"
            + (f" (did you mean {near[0]!r}?)" if len(near) == 1 else "")
        )
    how, message = _quietly(_checked, _mixed_dtypes, cluster=cluster, timeout=TIMEOUT)[0]
    said = message[message.index("Collectives differ"):] if "Collectives differ" in message else ""
    differ = [a for a in ASPECTS if f"{a}:" in said]
    if guess not in differ:
        raise AssertionError(f"rank 0 said: {said.strip() or message!r}; not {guess!r}")
