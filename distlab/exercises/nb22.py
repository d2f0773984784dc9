"""Graders for notebook 22, context parallelism: ring attention by hand (see
`distlab.exercises`).

Exercise 1 runs in the kernel on layouts the grader makes (contiguous, zig-zag, striped,
shuffled, uneven, a rank with no tokens). Exercises 2 and 3 run the learner's function on the
notebook's live 4-rank cluster, under a timeline recording, so that what the ranks really called
is checked, not trusted.
"""

from __future__ import annotations

import contextlib
import functools
import numbers

from . import expect

#: Seconds a check may take on the cluster (a hang is called one after this).
TIMEOUT = 10.0

#: How long the other ranks wait before their first pass in exercise 2's last run, and how long
#: rank 0's ``start_pass`` may take there before it counts as waiting for the transfer. (Less
#: than the half second a Cluster gives the other ranks after one fails, before it interrupts
#: them.)
DELAY, PROMPT = 0.3, 0.2


# -- exercise 1: work for any layout ------------------------------------------------------------


def _layouts() -> list[tuple[str, list[list[int]]]]:
    return [*_fixed_layouts(), ("drawn at random", _random_layout())]


def _fixed_layouts() -> list[tuple[str, list[list[int]]]]:
    import torch

    shuffled = torch.randperm(10, generator=torch.Generator().manual_seed(22)).tolist()
    return [
        ("the example", [[0, 1, 2, 3], [4, 5, 6, 7]]),
        ("contiguous, 16 tokens on 4 ranks", [list(range(4 * r, 4 * r + 4)) for r in range(4)]),
        (
            "zig-zag, 16 tokens on 4 ranks",
            [[2 * r, 2 * r + 1, 14 - 2 * r, 15 - 2 * r] for r in range(4)],
        ),
        ("striped, 12 tokens on 3 ranks", [list(range(r, 12, 3)) for r in range(3)]),
        ("shuffled and uneven", [shuffled[:3], shuffled[3:8], shuffled[8:]]),
        ("a rank without tokens", [[0, 1, 2], [], [3]]),
        ("one rank", [[0, 1, 2, 3, 4]]),
    ]


def _random_layout() -> list[list[int]]:
    """A layout drawn anew at every check (1 to 5 ranks, any positions, uneven, maybe empty):
    a table of the layouts above, copied from earlier messages, does not pass."""
    r, fixed = expect.rng(), [layout for _, layout in _fixed_layouts()]
    while True:
        world = r.randrange(1, 6)
        positions = list(range(r.randrange(world, 4 * world + 6)))
        r.shuffle(positions)
        cuts = sorted(r.randrange(len(positions) + 1) for _ in range(world - 1))
        bounds = [0, *cuts, len(positions)]
        layout = [positions[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
        if layout not in fixed:  # by a rare chance
            return layout


def _work(layout) -> list[int]:
    return [sum(t + 1 for t in positions) for positions in layout]


def exercise_1(causal_work) -> None:
    """``causal_work(layout)``: per rank, the (query, key) pairs with key position <= query
    position, for a layout given as each rank's token positions."""
    for name, layout in _layouts():
        want = _work(layout)
        got = causal_work([list(p) for p in layout])
        what = f"causal_work({layout}) ({name})"
        if (
            isinstance(got, list)
            and len(got) == len(want)
            and all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in got)
        ):
            if got == want:
                continue
            hint = ""
            if got == [w - len(p) for w, p in zip(want, layout, strict=True)]:
                hint = (
                    ": one short for every query; a query also sees its own key "
                    "(key position <= query position)"
                )
            elif got == [len(p) * (max(p) + 1) if p else 0 for p in layout]:
                hint = (
                    ": that counts every key up to the rank's last query, for every query; "
                    "each query sees only the keys up to its own position"
                )
            raise AssertionError(f"{what} should be {want}; got {got}{hint}")
        expect.same(got, want, what)


# -- exercise 2: start a pass -------------------------------------------------------------------


def _block(owner: int):
    import torch

    return (torch.arange(12.0).view(3, 4) + 100 * owner).t()  # (4, 3): not contiguous


class _Started(list):
    """The transfers an answer started; ``abandon`` set: do not wait for them (they cannot
    finish, the cluster is restarted instead)."""

    abandon = False


@contextlib.contextmanager
def _transfers_kept():
    """Keep every isend/irecv the answer starts (also through batch_isend_irecv), and wait for
    those it did not wait for: with gloo, a send or receive whose Work is dropped unfinished
    breaks the next collective on that process group (it hangs)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    started = _Started()
    originals = {name: getattr(c10d, name) for name in ("isend", "irecv", "send", "recv")}
    blocking = [0]  # inside dist.send or dist.recv: their isend/irecv is theirs, and waited for

    def keep(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            work = fn(*args, **kwargs)
            if work is not None and not blocking[0]:
                started.append(work)
            return work

        return inner

    def block(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            blocking[0] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                blocking[0] -= 1

        return inner

    for name, fn in originals.items():
        setattr(c10d, name, keep(fn) if name.startswith("i") else block(fn))
        setattr(dist, name, getattr(c10d, name))
    try:
        yield started
    except BaseException:
        started.abandon = True  # the answer raised halfway: what it started cannot finish
        raise
    finally:
        for name, fn in originals.items():
            setattr(c10d, name, fn)
            setattr(dist, name, fn)
        for work in [] if started.abandon else started:
            if not work.is_completed():  # gloo: a second wait() on a finished send never returns
                work.wait()


def _passes(start_pass, delay):
    """Run on every rank: four passes around the ring with the learner's ``start_pass``; the
    other ranks start their first pass ``delay`` s after rank 0."""
    import time

    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    block = _block(rank)
    seen, took = [], None
    for step in range(world):
        if step == 0 and rank != 0 and delay:
            time.sleep(delay)  # rank 0's first pass cannot complete before this
        with _transfers_kept() as started:
            start = time.perf_counter()
            out = start_pass(block)
            if step == 0 and rank == 0:
                took = time.perf_counter() - start
            if not isinstance(out, tuple) or len(out) != 2:
                return {"returned": expect.describe(out)}
            works, incoming = out
            if not isinstance(works, (list, tuple)) or not all(
                callable(getattr(w, "wait", None)) for w in works
            ):
                return {"works": expect.describe(works)}
            if not isinstance(incoming, torch.Tensor):
                return {"incoming": expect.describe(incoming)}
            left = [w for w in started if not any(w is x for x in works)]
            if left and all(any(w is x for x in started) for w in works):
                return {"unreturned": (step, len(started), len(works))}
            block.sum()  # the computation the transfer overlaps
            for w in works:
                if not w.is_completed():
                    w.wait()
        owner = (rank - 1 - step) % world
        if incoming.shape != (4, 3):
            return {"shape": (step, tuple(incoming.shape))}
        if not torch.equal(incoming, _block(owner)):
            came = int(incoming.flatten()[0].item()) // 100 if incoming.numel() else None
            return {"wrong": (step, owner, came)}
        seen.append(owner)
        block = incoming
    return {"seen": seen, "took": took, "started": len(works)}


_OTHERS = ("allgather", "allreduce", "broadcast", "alltoall", "scatter", "gather", "reduce")


def _run_passes(start_pass, delay, cluster, record=False):
    """`_passes` on the cluster (under a timeline recording with ``record``). An answer that
    raised on a rank after starting a transfer leaves the other ranks' sends unmatched (with
    gloo they hang the cluster's next collective): the cluster is restarted, and the error
    becomes the verdict, with what a contiguity error means here."""
    import sys

    from ..errors import RankError
    from . import _not_written_on_ranks

    run = expect.collectives if record else expect.run
    try:
        return run(_passes, start_pass, delay, cluster=cluster, timeout=TIMEOUT)
    except RankError as e:
        if _not_written_on_ranks(e):
            raise  # the skeleton: "not attempted yet"
        print(str(e), file=sys.stderr)
        cluster.restart()
        head = e.primary.headline().splitlines()[0].rstrip()
        hint = ""
        if "contiguous" in head and "irecv" in e.primary.traceback:
            hint = (
                ". The tensor you receive into is not contiguous: torch.empty_like(block) "
                "copies the block's strides. Receive into torch.empty(block.shape), or make "
                "the block contiguous first"
            )
        raise AssertionError(
            f"your code failed on the ranks ({head}; the report is above){hint}. distlab "
            "restarted the cluster (and re-ran the cells that set it up): the transfers your "
            "ranks had started would have hung its next collective"
        ) from None


#: The ranks of exercise 2's extra run, on processes of their own: not the cluster's 4, so
#: that a ring written for 4 ranks (``(rank + 1) % 4``) does not pass.
OTHER_WORLD = 3


def _other_world(start_pass, world: int) -> None:
    """The passes again on `OTHER_WORLD` new ranks; an answer that fails there (it raised, hung,
    or received the wrong block) assumed the cluster's size."""
    from ..errors import RankError, RankTimeout

    other = OTHER_WORLD if world != OTHER_WORLD else world + 1
    why = (f"right on this cluster's {world} ranks, but on {other} ranks of their own")
    fix = (f": the ring's size is dist.get_world_size(), not {world} (send to (rank + 1) % "
           "world, receive from (rank - 1) % world)")
    try:
        values = expect.run(_passes, start_pass, 0.0, world_size=other, timeout=TIMEOUT)
    except RankError as e:
        head = e.primary.headline().splitlines()[0].rstrip()
        raise AssertionError(f"{why} rank {e.primary.rank} failed ({head}){fix}") from None
    except RankTimeout:
        raise AssertionError(f"{why} the passes hang{fix}") from None
    for rank, got in enumerate(values):
        if "seen" not in got:
            raise AssertionError(f"{why} rank {rank}'s passes went wrong ({got}){fix}")


def exercise_2(start_pass, cluster) -> None:
    """``start_pass(block)`` starts sending ``block`` to rank + 1 and receiving from rank - 1
    and returns ``(works, incoming)`` without waiting. Four passes on the cluster: each rank must
    receive its left neighbour's block every time (the first block is not contiguous); a second
    run, on `OTHER_WORLD` ranks of their own, checks the ring does not assume the cluster's
    size; a third, under a timeline recording, that the ranks called send and receive only; in
    a fourth, rank 0's first call must return before its neighbours have even started theirs
    (they wait `DELAY` s)."""
    world = cluster.world_size
    values = _run_passes(start_pass, 0.0, cluster)
    for rank, got in enumerate(values):
        if "unreturned" in got:
            step, started, returned = got["unreturned"]
            raise AssertionError(
                f"at pass {step} rank {rank}'s start_pass started {started} transfers and "
                f"returned {returned} of them: the caller waits only for the works you return, "
                "so it could read `incoming` before the block has arrived. Return every work "
                "(all of what batch_isend_irecv gives)"
            )
        if "returned" in got:
            raise AssertionError(
                "start_pass should return a tuple (works, incoming): the started transfers and "
                f"the tensor the block arrives in; rank {rank} got {got['returned']}"
            )
        if "works" in got:
            raise AssertionError(
                "works should be the list of started transfers (what dist.batch_isend_irecv "
                f"returns, each with .wait()); rank {rank} got {got['works']}"
            )
        if "incoming" in got:
            raise AssertionError(
                f"incoming should be the tensor the block arrives in; rank {rank} got "
                f"{got['incoming']}"
            )
        if "shape" in got:
            step, shape = got["shape"]
            raise AssertionError(
                f"at pass {step} rank {rank} received a block of shape {shape}; the blocks are "
                "(4, 3): receive into a tensor shaped like the block you send"
            )
        if "wrong" in got:
            step, owner, came = got["wrong"]
            source = f"rank {came}'s block" if came in range(world) else "something else"
            raise AssertionError(
                f"at pass {step} rank {rank} should hold rank {owner}'s block (a ring receives "
                f"from rank - 1 and sends to rank + 1); it holds {source}"
            )
    _other_world(start_pass, world)
    _, calls = _run_passes(start_pass, 0.0, cluster, record=True)
    for rank, names in enumerate(calls):
        others = sorted({n for n in names for o in _OTHERS if o in n.lower()})
        if others:
            raise AssertionError(
                f"rank {rank} called {', '.join(others)}: a ring pass sends one block to one "
                "neighbour and receives one (isend/irecv); a collective moves blocks between "
                "all ranks"
            )
    expect.called(calls, ("send",), "a send to rank + 1")
    expect.called(calls, ("recv",), "a receive from rank - 1")
    if not values[0]["started"]:
        raise AssertionError(
            "start_pass returned no started transfers: it finished the pass itself. Start it "
            "with dist.batch_isend_irecv and return the works it gives, so that the caller "
            "computes while the block travels"
        )
    took = _run_passes(start_pass, DELAY, cluster)[0]["took"]
    if took > PROMPT:
        raise AssertionError(
            f"start_pass waited for the transfer: rank 0's first call took {took:.1f} s, as "
            f"long as its neighbours took to start theirs ({DELAY} s). Return as soon as the "
            "send and receive are started (batch_isend_irecv), without wait()"
        )


# -- exercise 3: all-gather, then attend ---------------------------------------------------------


#: (tokens per rank, heads, head dim) of exercise 3's cases: the notebook's chunk of 4, then
#: others, so that a chunk size written into the answer does not pass.
CHUNKS = ((4, 2, 8), (3, 3, 4), (5, 1, 8))


def _allgather_case(answer):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for n, (c, heads, d) in enumerate(CHUNKS):
        g = torch.Generator().manual_seed(23 + c)
        q, k, v = (torch.randn(1, heads, c * world, d, generator=g) for _ in range(3))
        mine = slice(c * rank, c * rank + c)
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True)[:, :, mine]
        unscaled = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0)[:, :, mine]
        case = {"shape": tuple(want.shape)}
        try:
            got = answer(*(t[:, :, mine].clone() for t in (q, k, v)))
        except Exception as e:
            if n == 0:
                raise  # the notebook's own case: the usual report, with its traceback
            out.append({**case, "raised": f"{type(e).__name__}: {str(e).splitlines()[0]}"})
            break  # every rank raises alike here (after the all-gather, on the shapes)
        if not isinstance(got, torch.Tensor):
            out.append({**case, "returned": expect.describe(got)})
        elif got.shape != want.shape:
            out.append({**case, "got_shape": tuple(got.shape)})
        elif got.dtype != want.dtype:
            out.append({**case, "dtype": str(got.dtype).removeprefix("torch.")})
        else:
            got = got.detach()
            out.append({**case, "error": (got - want).abs().max().item(),
                        "ok": torch.allclose(got, want, atol=1e-5, rtol=1e-4),
                        "unscaled": torch.allclose(got, unscaled, atol=1e-5, rtol=1e-4)})
    return out


def exercise_3(allgather_attention, cluster) -> None:
    """``allgather_attention(q, k, v)`` on each rank's contiguous chunk (4 tokens of 16, 2
    heads of 8; then 3 tokens per rank with 3 heads of 4, and 5 with 1 of 8): its queries'
    causal attention over the whole sequence, through an all-gather of the keys and values.
    Checked against one process, rank by rank, in q's dtype."""
    values, calls = expect.collectives(_allgather_case, allgather_attention, cluster=cluster,
                                       timeout=TIMEOUT)
    world = len(values)
    for n in range(len(CHUNKS)):
        c, heads, d = CHUNKS[n]
        case = (f"with {c} tokens per rank ({c * world} in all), {heads} head"
                f"{'s' if heads > 1 else ''} of {d}")
        for rank, cases in enumerate(values):
            got = cases[n] if n < len(cases) else None
            if got is None:
                continue
            shape = got["shape"]
            if "returned" in got:
                raise AssertionError(
                    f"allgather_attention should return this rank's output, a tensor of shape "
                    f"{shape}; {case}, rank {rank} got {got['returned']}"
                )
            if "got_shape" in got:
                raise AssertionError(
                    f"allgather_attention should return this rank's {c} queries' output, shape "
                    f"{shape} (batch, heads, tokens, head dim); {case}, rank {rank} returned "
                    f"shape {got['got_shape']}"
                    + (" (the chunk size is q.shape[2], not a fixed number)"
                       if c != CHUNKS[0][0] else "")
                )
            if "dtype" in got:
                raise AssertionError(
                    f"{case}, rank {rank}'s output is {got['dtype']}; q, k and v are float32, "
                    "and so should the output be (compute in their dtype, or cast back)"
                )
            if "raised" in got:
                raise AssertionError(
                    f"right with the notebook's 4 tokens per rank, but {case}, rank {rank}'s "
                    f"call raised {got['raised']}: the chunk size is q.shape[2] and the number "
                    "of heads q.shape[1], not fixed numbers"
                )
        bad = [r for r, cases in enumerate(values) if n < len(cases) and not cases[n]["ok"]]
        if not bad:
            continue
        rank = bad[0]
        got = values[rank][n]
        hint = ""
        if all(values[r][n]["unscaled"] for r in bad):
            hint = (
                "; it is attention without the 1/sqrt(head dim) scale: scores = q @ k^T * "
                "q.shape[-1] ** -0.5"
            )
        elif 0 not in bad:
            hint = (
                f"; rank 0 is right and the later ranks are not: their queries sit at positions "
                f"{c}·rank .. {c}·rank + {c - 1} of the sequence and see every key before them. "
                "A mask built from local indices (is_causal=True, or triu on the local chunk) "
                "hides the earlier ranks' keys"
            )
        elif len(bad) == len(values):
            hint = "; every rank differs: is the mask causal, over the global positions?"
        if n > 0 and all(values[r][0]["ok"] for r in range(world)):
            hint += (
                f" (right with the notebook's 4 tokens per rank, not with {c}: the chunk size "
                "is q.shape[2], the number of heads q.shape[1])"
            )
        raise AssertionError(
            f"{case}, rank {rank}'s output differs from one process's causal attention "
            f"(largest difference {got['error']:.2g}){hint}"
        )
    expect.called(calls, ("allgather",), "an all-gather of the keys and values")
