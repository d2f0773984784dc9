"""Graders for notebook 01, stores and rendezvous (see `distlab.exercises`).

Every check runs the learner's function on new ranks with no process group (``backend=None``),
each rank opening the same `FileStore` in a temporary directory of the check's own. The learner's
code gets a `PrefixStore` on it, so the keys the check uses to watch it never collide with theirs.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from . import expect

#: How long a rank comes late to a barrier in the check of exercise 1 (seconds): a barrier that
#: lets the others through without it is seen at once; a correct one waits this long.
LATE = 0.1


class _Counting:
    """A store that counts its ``compare_set`` calls and passes everything to the real one."""

    def __init__(self, store):
        self._store = store
        self.compare_sets = 0

    def compare_set(self, *args, **kwargs):
        self.compare_sets += 1
        return self._store.compare_set(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._store, name)


def _stores(dirname: str, prefix: str):
    """On a rank: (rank, world_size, the check's FileStore, the learner's PrefixStore on it)."""
    from datetime import timedelta

    import torch.distributed as dist

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    raw = dist.FileStore(os.path.join(dirname, "store"), world_size)
    raw.set_timeout(timedelta(seconds=60))  # longer than a check waits: a hang is called a hang
    return rank, world_size, raw, dist.PrefixStore(prefix, raw)


def _run(fn, *args, world_size: int) -> list:
    """``fn(dirname, *args)`` on new ranks without a process group, in a fresh directory."""
    dirname = tempfile.mkdtemp(prefix="distlab-")
    try:
        return expect.run(fn, dirname, *args, world_size=world_size, backend=None)
    finally:
        shutil.rmtree(dirname, ignore_errors=True)


def _barrier_three_times(dirname, reusable_barrier, steps):
    import time

    rank, world_size, raw, store = _stores(dirname, "learner")
    seen = []
    for step in range(steps):
        if rank == (step + 1) % world_size:  # a different rank comes late each time
            time.sleep(LATE)
        raw.set(f"arrived/{step}/{rank}", "1")
        reusable_barrier(store, world_size)
        seen.append(raw.check([f"arrived/{step}/{r}" for r in range(world_size)]))
    return seen


def exercise_1(reusable_barrier) -> None:
    """``reusable_barrier(store, world_size)`` used 3 times on 3 ranks, a different rank late
    each time: no rank may leave a barrier before every rank has arrived at it."""
    steps, world_size = 3, 3
    seen = _run(_barrier_three_times, reusable_barrier, steps, world_size=world_size)
    for rank, passed in enumerate(seen):
        for step, ok in enumerate(passed):
            if not ok:
                late = (step + 1) % world_size
                raise AssertionError(
                    f"call {step + 1} of the barrier let rank {rank} through before rank {late} "
                    f"(which came {LATE} s late) had arrived: a barrier must wait for every rank, "
                    "every time it is called"
                )


def _elections(dirname, elect, firsts):
    rank, world_size, raw, _ = _stores(dirname, "unused")
    import torch.distributed as dist

    leaders, counts = [], []
    for n, first in enumerate(firsts):
        store = _Counting(dist.PrefixStore(f"election{n}", raw))
        if rank != first:  # the others try only once the first rank has tried
            raw.wait([f"tried/{n}"])
        try:
            leaders.append(elect(store, rank))
        finally:  # (even if it raised: the others then raise too, instead of waiting)
            if rank == first:
                raw.set(f"tried/{n}", "1")
        counts.append(store.compare_sets)
    return leaders, counts


def exercise_2(elect) -> None:
    """``elect(store, rank)`` on 4 ranks, three elections: each time one rank tries first and
    the others after it, so that rank must win, and every rank must say so (an int), with one
    ``compare_set`` each."""
    firsts = (2, 0, 3)
    results = _run(_elections, elect, firsts, world_size=4)
    for rank, (_, counts) in enumerate(results):
        for n, count in enumerate(counts):
            if count != 1:
                raise AssertionError(
                    f"in election {n + 1} rank {rank} called store.compare_set {count} times; "
                    "the exercise asks for exactly one per rank (it sets the leader only if "
                    "there is none yet, and says who the leader is either way)"
                )
    for n, first in enumerate(firsts):
        for rank, (leaders, _) in enumerate(results):
            expect.same(
                leaders[n],
                first,
                f"in election {n + 1} rank {first} tried first and the others after it, so "
                f"rank {first} is the leader; rank {rank}'s answer",
            )


def _gather_texts(dirname, store_all_gather, texts):
    """On a rank: the learner's all-gather on every rank, then on every rank but the last
    (``world_size - 1`` of them), each in a namespace of its own."""
    import torch.distributed as dist

    rank, world_size, raw, _ = _stores(dirname, "unused")
    gathered = []
    for n, size in enumerate((world_size, world_size - 1)):
        if rank < size:
            store = dist.PrefixStore(f"gather{n}", raw)
            gathered.append(store_all_gather(store, rank, size, texts[n][rank]))
    return gathered


def exercise_3(store_all_gather) -> None:
    """``store_all_gather(store, rank, world_size, text)`` on 3 ranks, then on ranks 0 and 1
    alone (``world_size=2``), with texts that cannot be guessed from the rank: every rank
    returns the list of every rank's text (str), in rank order."""
    texts = (["grüß dich", "hola", "salut"], ["ahoj", "hej"])
    results = _run(_gather_texts, store_all_gather, texts, world_size=len(texts[0]))
    for n, want in enumerate(texts):
        for rank in range(len(want)):
            got = results[rank][n]
            if isinstance(got, list) and any(isinstance(g, bytes) for g in got):
                raise AssertionError(
                    f"rank {rank} returned bytes ({got!r}): store.get gives bytes, the exercise "
                    "asks for the texts as str (.decode() turns one into the other)"
                )
            expect.same(got, want, f"on {len(want)} ranks, rank {rank}'s list")
