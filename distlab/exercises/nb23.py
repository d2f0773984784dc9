"""Graders for notebook 23, expert parallelism (see `distlab.exercises`).

Exercises 1 and 3 run in the kernel on cases the grader makes (tokens that compete for an expert
with their first and second choices, an expert nobody picks, a uniform router and a skewed one).
Exercise 2 runs the learner's function on the notebook's live 4-rank cluster, under a timeline
recording, with uneven and empty splits and rows a rank keeps for itself.
"""

from __future__ import annotations

import sys

from . import expect

#: Seconds a check may take on the cluster (a hang is called one after this).
TIMEOUT = 10.0


# -- exercise 1: first choices first -----------------------------------------------------------


def _keep_in_order(order, num_experts, capacity):
    """Keep each assignment of ``order`` (a list of (token, slot, expert)) while its expert has
    room."""
    taken = [0] * num_experts
    kept = set()
    for token, slot, e in order:
        if taken[e] < capacity:
            taken[e] += 1
            kept.add((token, slot))
    return kept


def _choices_first(experts, num_experts, capacity):
    import torch

    tokens, k = experts.shape
    order = [(t, s, int(experts[t, s])) for s in range(k) for t in range(tokens)]
    kept = _keep_in_order(order, num_experts, capacity)
    return torch.tensor([[(t, s) in kept for s in range(k)] for t in range(tokens)],
                        dtype=torch.bool).view(tokens, k)


def _tokens_first(experts, num_experts, capacity):
    import torch

    tokens, k = experts.shape
    order = [(t, s, int(experts[t, s])) for t in range(tokens) for s in range(k)]
    kept = _keep_in_order(order, num_experts, capacity)
    return torch.tensor([[(t, s) in kept for s in range(k)] for t in range(tokens)],
                        dtype=torch.bool).view(tokens, k)


def _routing_cases():
    import torch

    g = torch.Generator().manual_seed(23)
    cases = [
        ("tokens that want each other's expert", torch.tensor([[0, 1], [1, 0], [0, 1]]), 2, 1),
        (
            "a token's second choice against a later token's first",
            torch.tensor([[0, 1], [2, 1], [1, 0], [1, 2]]),
            3,
            2,
        ),
    ]
    for k, experts, capacity in ((2, 5, 3), (3, 4, 4), (1, 4, 2), (2, 4, 0), (2, 4, 100)):
        picks = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(12)])
        if experts == 5:
            picks[picks == 4] = 0  # expert 4: nobody picks it
            picks = torch.stack([torch.tensor([0, 1]) if row[0] == row[1] else row
                                 for row in picks])
        cases.append(
            (
                f"12 tokens, k = {k}, {experts} experts, capacity {capacity}",
                picks,
                experts,
                capacity,
            )
        )
    return [*cases, _random_routing()]


def _random_routing():
    """A case drawn anew at every check: a table of the cases above, copied from earlier
    messages, does not pass. The draw is one where the capacity binds (some assignments kept,
    some dropped) and where token order would keep other ones, so that no fixed fallback
    (keep all, drop all, token order) passes it by luck."""
    import torch

    r = expect.rng()
    while True:
        experts, tokens = r.randrange(2, 7), r.randrange(4, 16)
        k = r.randrange(2, min(experts, 3) + 1)
        picks = torch.tensor([r.sample(range(experts), k) for _ in range(tokens)])
        capacity = r.randrange(1, tokens // 2 + 2)
        want = _choices_first(picks, experts, capacity)
        if 0 < int(want.sum()) < want.numel() and not torch.equal(
            want, _tokens_first(picks, experts, capacity)
        ):
            return "drawn at random", picks, experts, capacity


def exercise_1(keep_first_choices_first) -> None:
    """``keep_first_choices_first(experts, num_experts, capacity)``: the (tokens, k) bool mask of
    assignments kept when every token's first choice comes before any second choice (each
    choice in token order), an expert taking at most ``capacity``."""
    import torch

    for name, experts, num_experts, capacity in _routing_cases():
        want = _choices_first(experts, num_experts, capacity)
        got = keep_first_choices_first(experts.clone(), num_experts, capacity)
        what = f"keep_first_choices_first({experts.tolist()}, {num_experts}, {capacity}) ({name})"
        if not isinstance(got, torch.Tensor):
            raise AssertionError(
                f"{what} should return a bool tensor of shape {tuple(want.shape)}; got "
                f"{expect.describe(got)}"
            )
        if got.shape != want.shape:
            raise AssertionError(
                f"{what} should have the shape of `experts`, {tuple(want.shape)}; got "
                f"{tuple(got.shape)} (transposed back?)"
            )
        if got.dtype != torch.bool:
            raise AssertionError(
                f"{what} should be a bool tensor (True: kept), like {want.tolist()}; got "
                f"{got.dtype} {got.tolist()}"
            )
        if torch.equal(got, want):
            continue
        hint = ""
        if torch.equal(got, _tokens_first(experts, num_experts, capacity)):
            hint = (
                ": that is token order (token 0's choices, then token 1's), the lesson's "
                "keep_first; here all first choices come before any second choice"
            )
        elif torch.equal(got, _choices_first(experts, num_experts, capacity + 1)):
            hint = f": that keeps {capacity + 1} per expert; capacity is {capacity}"
        raise AssertionError(f"{what} should be {want.tolist()}; got {got.tolist()}{hint}")


# -- exercise 2: all_to_all from sends and receives ----------------------------------------------

#: send[rank][peer]: rows each rank sends to each peer, per case.
CASES = (
    ((2, 0, 3, 1), (0, 0, 4, 0), (1, 1, 1, 1), (0, 5, 0, 0)),
    ((0, 0, 0, 0), (1, 0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 2)),
)


def _rows(rank: int, n: int):
    import torch

    return torch.arange(n * 3, dtype=torch.float32).view(n, 3) + 1000 * rank


def _expected(case, rank: int):
    import torch

    pieces = []
    for src, send in enumerate(case):
        start = sum(send[:rank])
        pieces.append(_rows(src, sum(send))[start : start + send[rank]])
    return torch.cat(pieces)


def _owner(row, world: int):
    """The rank a received row comes from (its values are 1000 * rank + 0, 1, 2...), or None
    for a row that is no rank's (uninitialised memory: any number, nan, inf)."""
    import torch

    start = float(row[0])
    if not row.isfinite().all() or start != int(start) or not 0 <= start < 1000 * world:
        return None
    rank, offset = divmod(int(start), 1000)
    if not torch.equal(row, torch.arange(3.0) + start) or offset % 3:
        return None
    return rank


def _exchange_cases(exchange):
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    got = []
    for case in CASES:
        out = exchange(_rows(rank, sum(case[rank])), list(case[rank]))
        got.append(out.detach().clone() if isinstance(out, torch.Tensor) else
                   expect.describe(out))
    return got


def exercise_2(exchange, cluster) -> None:
    """``exchange(rows, send)`` on the 4-rank cluster: rank r's ``rows`` split ``send`` ways go
    to ranks 0..3; each rank returns what it received, senders in rank order. Two cases with
    uneven and empty splits and rows kept by their own rank. The counts may move with
    ``all_to_all_single`` (one call per exchange), the rows only with sends and receives."""
    import torch

    from ..errors import RankError
    from . import _not_written_on_ranks

    try:
        values, calls = expect.collectives(_exchange_cases, exchange, cluster=cluster,
                                           timeout=TIMEOUT)
    except RankError as e:
        if _not_written_on_ranks(e):
            raise  # the skeleton: "not attempted yet"
        # A rank that failed halfway leaves the others' sends unmatched; with gloo they would
        # hang the next collective on the cluster. Start it afresh.
        print(str(e), file=sys.stderr)
        cluster.restart()
        raise AssertionError(
            f"your code failed on the ranks ({e.primary.headline()}; the report is above). "
            "distlab restarted the cluster (and re-ran the cells that set it up): the sends "
            "your ranks had started would have hung its next collective"
        ) from None
    for n, case in enumerate(CASES):
        for rank, got in enumerate(values):
            want = _expected(case, rank)
            sources = [send[rank] for send in case]
            what = (f"in case {n + 1} (send = {[list(s) for s in case]}), rank {rank}'s "
                    "received rows")
            if not isinstance(got[n], torch.Tensor):
                raise AssertionError(
                    f"{what} should be one tensor of {len(want)} rows; got {got[n]}"
                )
            if got[n].shape != want.shape:
                raise AssertionError(
                    f"{what} should have shape {tuple(want.shape)} ({sources} rows from ranks "
                    f"0..3); got shape {tuple(got[n].shape)}"
                )
            if not torch.equal(got[n], want):
                owners = [r for r, c in enumerate(sources) for _ in range(c)]
                came = [_owner(row, len(values)) for row in got[n]]
                if None in came:
                    raise AssertionError(
                        f"{what} should come from ranks {owners}, in that order ({sources} rows "
                        f"from ranks 0..3); row {came.index(None)} and others are rows that hold "
                        "no rank's values: memory nothing was written into (a receive into "
                        "another tensor than the one returned, or one not waited for)"
                    )
                raise AssertionError(
                    f"{what} should come from ranks {owners}, in that order ({sources} rows "
                    f"from ranks 0..3); they came from {came}"
                )
    for rank, names in enumerate(calls):
        a2a = [x for x in names if "alltoall" in x.lower()]
        others = sorted(
            {
                x
                for x in names
                if any(
                    o in x.lower()
                    for o in ("allgather", "allreduce", "broadcast", "scatter", "gather", "reduce")
                )
            }
        )
        if others:
            raise AssertionError(
                f"rank {rank} called {', '.join(others)}: the rows go to their ranks with sends "
                "and receives, the counts with all_to_all_single"
            )
        if len(a2a) > len(CASES):
            raise AssertionError(
                f"rank {rank} called all_to_all {len(a2a)} times for {len(CASES)} exchanges: "
                "all_to_all_single moved the rows too. Exchange only the counts with it, and "
                "send the rows with isend/irecv (batch_isend_irecv)"
            )
        if len(a2a) < len(CASES):
            raise AssertionError(
                f"rank {rank} exchanged no counts (all_to_all_single of one number per rank): "
                "a rank cannot know how many rows arrive from each rank otherwise"
            )
    expect.called(calls, ("send",), "sends of its rows to the other ranks")
    expect.called(calls, ("recv",), "receives of the other ranks' rows")


# -- exercise 3: a load-balancing loss ---------------------------------------------------------


def _balance_cases():
    import torch

    g = torch.Generator().manual_seed(31)
    uniform = torch.full((8, 4), 0.25)
    even = torch.tensor([[0, 1], [2, 3], [1, 0], [3, 2], [0, 2], [1, 3], [2, 0], [3, 1]])
    skewed = torch.randn(16, 4, generator=g).mul(2).softmax(-1)
    collapsed = torch.tensor([[0.7, 0.2, 0.05, 0.05]]).repeat(6, 1)
    return [
        ("a uniform router, every expert chosen equally often", uniform, even),
        ("a skewed router, its top-2", skewed, skewed.topk(2, dim=-1).indices),
        ("top-1", skewed, skewed.topk(1, dim=-1).indices),
        ("a collapsed router: experts 2 and 3 are never chosen", collapsed,
         collapsed.topk(2, dim=-1).indices),
    ]


def _balance(probs, experts):
    import torch

    e = probs.shape[-1]
    f = torch.bincount(experts.flatten(), minlength=e).double() / experts.numel()
    return e * (f * probs.double().mean(0)).sum()


def exercise_3(balance_loss) -> None:
    """``balance_loss(probs, experts)``: ``E · Σ_e f_e · P_e`` (Switch Transformer), f from the
    assignments (no gradient), P the mean router probability. Value and gradient with respect
    to ``probs``, on a uniform router (value 1), skewed ones, and a collapsed one (experts that
    nobody chose)."""
    import torch

    for name, probs, experts in _balance_cases():
        p = probs.clone().requires_grad_()
        try:
            got = balance_loss(p, experts.clone())
        except RuntimeError as e:
            if "collapsed" not in name:
                raise
            raise AssertionError(
                f"balance_loss for {name} raised RuntimeError: {str(e).splitlines()[0]}. "
                "torch.bincount counts only up to the largest id it sees: with experts nobody "
                "chose, its result is shorter than E. Give it minlength=E"
            ) from None
        want = _balance(probs, experts)
        what = f"balance_loss for {name}"
        if not isinstance(got, torch.Tensor):
            raise AssertionError(
                f"{what} should be a scalar tensor (the router learns through it), "
                f"{want.item():.4f}; got {expect.describe(got)}"
            )
        if got.numel() != 1:
            raise AssertionError(f"{what} should be a scalar tensor; got shape {tuple(got.shape)}")
        value = got.detach().double().reshape(())
        if not torch.allclose(value, want, rtol=1e-5, atol=1e-7):
            e, k = probs.shape[-1], experts.shape[-1]
            hint = ""
            if torch.allclose(value * e, want, rtol=1e-5):
                hint = f": 1/{e} of the expected, multiply by the number of experts"
            elif torch.allclose(value, want * k, rtol=1e-5) and k > 1:
                hint = (
                    f": {k}x the expected; f_e is a fraction of the assignments "
                    f"(tokens x k), not of the tokens"
                )
            elif torch.allclose(value, want * experts.numel(), rtol=1e-5):
                hint = ": f_e is a fraction (count / number of assignments), not a count"
            raise AssertionError(
                f"{what} should be {want.item():.4f}; got {value.item():.4f}{hint}"
            )
        if not got.requires_grad:
            raise AssertionError(
                f"{what} has no gradient: the router learns through P_e, the mean of probs; "
                "keep probs in the computation (do not detach it)"
            )
        got.backward()
        f = torch.bincount(experts.flatten(), minlength=probs.shape[-1]) / experts.numel()
        grad_want = (probs.shape[-1] * f / probs.shape[0]).expand_as(probs)
        if p.grad is None or not torch.allclose(p.grad.float(), grad_want.float(), atol=1e-6):
            raise AssertionError(
                f"{what} has the right value but the wrong gradient with respect to probs: "
                "f_e counts the chosen experts and takes no gradient; only P_e (the mean of "
                "probs over the tokens) does"
            )
