"""Graders for notebook 16, pipeline parallelism (see `distlab.exercises`).

Where torch runs the schedule, the grader records it on the notebook's live cluster (4 ranks,
one stage each, or two for the looped schedules), with stages and hooks of its own; where the
answer is a number of the model, the grader plays the schedule out with
`distlab.calculators.pipeline_schedule` (the notebook's ``simulate``, in the package).
"""

from __future__ import annotations

import numbers
from fractions import Fraction

from . import expect

#: Seconds a check may take on the cluster: a few pipeline steps of a tiny model.
TIMEOUT = 30.0
WIDTH, BLOCKS = 16, 8


def _blocks(stage: int, num_stages: int):
    """The notebook's ``my_blocks``: stage ``stage``'s slice of 8 blocks of Linear(16, 16) +
    Tanh (seeded, the same on every rank)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())
                            for _ in range(BLOCKS)])
    per = BLOCKS // num_stages
    return model[stage * per:(stage + 1) * per]


def _step(schedule, rows: int) -> None:
    import torch
    import torch.distributed as dist

    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(rows, WIDTH, generator=g), torch.randn(rows, WIDTH, generator=g)
    if dist.get_rank() == 0:
        schedule.step(x)
    elif dist.get_rank() == dist.get_world_size() - 1:
        schedule.step(target=y)
    else:
        schedule.step()


# -- exercise 1: how many microbatches? ---------------------------------------------------------


def _smallest_m(p: int, v: int, schedule: str, at_most: Fraction) -> int:
    from ..calculators import CalculatorError, pipeline_schedule

    m = 1
    while True:
        try:
            if pipeline_schedule(p, m, v, schedule).bubble <= at_most:
                return m
        except CalculatorError:
            pass  # an m the schedule refuses (1F1B: m < p; interleaved: not whole rounds)
        m += 1


def _check_smallest_m(guess, p: int, v: int, schedule: str, what: str) -> None:
    from ..calculators import CalculatorError, pipeline_schedule

    tenth = Fraction(1, 10)
    if not isinstance(guess, numbers.Integral) or isinstance(guess, bool):
        raise AssertionError(f"{what} should be a number of microbatches, an int; got "
                             f"{expect.describe(guess)}")
    if guess < 1:
        raise AssertionError(f"{what} should be a number of microbatches, at least 1; got {guess}")
    try:
        mine = pipeline_schedule(p, guess, v, schedule)
    except CalculatorError as e:
        raise AssertionError(f"m = {guess} cannot run: {e}") from None
    if mine.bubble > tenth:
        raise AssertionError(
            f"with m = {guess} the bubble is {mine.bubble} = {float(mine.bubble):.3f}, above "
            "0.1: more microbatches"
        )
    truth = _smallest_m(p, v, schedule, tenth)
    if guess != truth:
        raise AssertionError(
            f"m = {guess} gives a bubble of {float(mine.bubble):.3f}, within 0.1, but a smaller "
            "m does too: which is the smallest?"
        )


def exercise_1(smallest_m) -> None:
    """``smallest_m()``: the smallest number of microbatches that brings GPipe's bubble on
    ``p = 4`` stages to 10% or less, played out with `pipeline_schedule`."""
    _check_smallest_m(smallest_m(), 4, 1, "GPipe", "smallest_m()")


# -- exercise 2: 1F1B by hand ---------------------------------------------------------------------

#: The microbatch counts recorded: m = p, m not a multiple of p, and m = 2p.
COUNTS = (4, 5, 8)


def _record(schedule_cls, m: int, stage_ids: list[int], num_stages: int) -> list:
    """One step of ``schedule_cls`` (after a warm-up step) on this rank's stages, logged by
    hooks: [("F" | "B", stage, microbatch), ...] in the order they ran."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage

    log = []

    def instrument(blocks, stage_id):
        class MarkBackward(torch.autograd.Function):
            @staticmethod
            def forward(ctx, out):
                return out.view_as(out)

            @staticmethod
            def backward(ctx, grad):
                log.append(("B", stage_id))
                return grad

        blocks.register_forward_hook(lambda mod, args, out: (log.append(("F", stage_id)),
                                                             MarkBackward.apply(out))[1])
        return blocks

    cpu = torch.device("cpu")
    stages = [PipelineStage(instrument(_blocks(s, num_stages), s), s, num_stages, cpu)
              for s in stage_ids]
    schedule = schedule_cls(stages if len(stages) > 1 else stages[0], n_microbatches=m,
                            loss_fn=F.mse_loss)
    _step(schedule, 2 * m)  # warm-up: the first step also works out the shapes
    log.clear()
    _step(schedule, 2 * m)
    seen, order = {}, []
    for kind, s in log:
        order.append((kind, s, seen.setdefault((kind, s), 0)))
        seen[kind, s] += 1
    return order


def _one_f_one_b_orders(counts):
    import torch.distributed as dist
    from torch.distributed.pipelining import Schedule1F1B

    r, p = dist.get_rank(), dist.get_world_size()
    return {m: _record(Schedule1F1B, m, [r], p) for m in counts}


def exercise_2(one_f_one_b, cluster) -> None:
    """``one_f_one_b(rank, p, m)``: the actions rank ``rank`` runs under ``Schedule1F1B`` with
    ``p`` stages (one per rank) and ``m`` microbatches, as ``("F" | "B", stage, microbatch)``
    tuples in order. Compared with what the real schedule runs on every rank of the cluster,
    for several m."""
    real = expect.run(_one_f_one_b_orders, COUNTS, cluster=cluster, timeout=TIMEOUT)
    p = len(real)
    for m in COUNTS:
        for r in range(p):
            ran = real[r][m]
            mine = one_f_one_b(r, p, m)
            what = f"one_f_one_b({r}, {p}, {m})"
            if not isinstance(mine, list):
                expect.same(mine, ran, what)  # says which type it should be
            if all(isinstance(a, list) for a in mine) and [tuple(a) for a in mine] == ran:
                raise AssertionError(f"{what}: the right actions, but each as a list; make each "
                                     "a tuple, like ('F', 0, 0)")
            shown = " ".join(f"{k}{mb}" for k, _, mb in ran)
            for i, (a, b) in enumerate(zip(mine, ran, strict=False)):  # lengths: below
                if a != b:
                    raise AssertionError(
                        f"{what}: action {i} should be {b}; got {a!r}. Rank {r} ran: {shown}"
                    )
            if len(mine) != len(ran):
                raise AssertionError(
                    f"{what} lists {len(mine)} actions; rank {r} ran {len(ran)}: {shown}"
                )


# -- exercise 3: breadth first -------------------------------------------------------------------


def _looped_bfs_order(m):
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleLoopedBFS

    r, p = dist.get_rank(), dist.get_world_size()
    stages = [PipelineStage(_blocks(s, 2 * p), s, 2 * p, torch.device("cpu"))
              for s in (r, r + p)]
    schedule = ScheduleLoopedBFS(stages, m)
    return [[(a.computation_type.value, a.stage_index, a.microbatch_index)
             for a in acts if a is not None and a.computation_type.value in ("F", "B")]
            for _, acts in sorted(schedule.pipeline_order.items())]


def exercise_3(predict_looped_bfs, cluster) -> None:
    """``predict_looped_bfs()`` -> ``(bubble, peak)``: for ``ScheduleLoopedBFS`` with p = 4
    ranks, 2 stages per rank and m = 8, the bubble of the course's model (per stage: forward
    1/2, backward 1) as a `Fraction`, and the most stage-microbatches rank 0 holds at once. The
    truth: the schedule's own ``pipeline_order``, built on the cluster and played out."""
    from ..calculators.pipeline import _peak, _simulate

    guess = predict_looped_bfs()
    if not isinstance(guess, tuple) or len(guess) != 2:
        raise AssertionError(
            "predict_looped_bfs() should return (bubble, peak), e.g. (Fraction(1, 3), 5); got "
            f"{expect.describe(guess)}"
        )
    orders = expect.run(_looped_bfs_order, 8, cluster=cluster, timeout=TIMEOUT)[0]
    p = len(orders)
    timed = _simulate(orders, 2 * p, Fraction(1, 2), Fraction(1))
    span = max(a.end for acts in timed for a in acts)
    busy = sum(a.end - a.start for acts in timed for a in acts)
    bubble, peak = 1 - busy / (p * span), _peak(orders[0])
    expect.same(guess[0], bubble, "the bubble")
    expect.same(guess[1], peak, "rank 0's peak")


# -- exercise 4: interleaving, played with the explorer -----------------------------------------


def exercise_4(smallest_interleaved_m) -> None:
    """``smallest_interleaved_m()``: with p = 8 ranks and ``Interleaved1F1B`` at v = 2 stages
    per rank, the smallest m that torch runs and whose bubble is at most 10%."""
    _check_smallest_m(smallest_interleaved_m(), 8, 2, "Interleaved1F1B",
                      "smallest_interleaved_m()")
