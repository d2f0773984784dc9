"""Graders for notebook 17, checkpoints and failures (see `distlab.exercises`).

Each grader runs the real thing on new ranks: the notebook's model sharded on 3 ranks, a
training job that checkpoints with DCP and loses a rank.
"""

from __future__ import annotations

import numbers

from . import expect

#: Seconds a job may take: DCP's first save on busy ranks takes a second or two.
TIMEOUT = 60.0


def _model():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


# -- exercise 1: three ranks -------------------------------------------------------------------


def _rows():
    from torch.distributed.fsdp import fully_shard

    model = _model()
    fully_shard(model)
    return {name: p.to_local().shape[0] for name, p in model.named_parameters()}


def exercise_1(predicted_rows) -> None:
    """``predicted_rows()`` -> ``{"0.weight": [...], "2.weight": [...]}``: the rows of each
    weight that each of 3 ranks holds under ``fully_shard`` (what ``load_sharded`` reads into on
    3 ranks). The grader shards the notebook's model on 3 new ranks and counts."""
    guess = predicted_rows()
    rows = expect.run(_rows, world_size=3, timeout=TIMEOUT)
    truth = {name: [r[name] for r in rows] for name in ("0.weight", "2.weight")}
    if not isinstance(guess, dict):
        raise AssertionError(
            "predicted_rows() should return a dict, {'0.weight': [rows on rank 0, 1, 2], "
            f"'2.weight': [...]}}; got {expect.describe(guess)}"
        )
    if set(guess) != set(truth):
        raise AssertionError(
            f"predicted_rows() should have the keys {sorted(truth)} (the parameters' names, as "
            f"in the state dict); got {sorted(map(str, guess))}"
        )
    for name, want in truth.items():
        got = guess[name]
        if isinstance(got, numbers.Integral):
            raise AssertionError(f"{name}: one number per rank, a list of 3 like [a, b, c]; got "
                                 f"{got!r}")
        if isinstance(got, (list, tuple)) and len(got) == 3 and sum(got) != sum(want):
            raise AssertionError(
                f"{name}: your rows add up to {sum(got)}, but the weight has {sum(want)} rows "
                "and every row is on exactly one rank"
            )
        expect.same(got, want, f"{name}'s rows per rank")


# -- exercise 2: checkpoint less often ---------------------------------------------------------


def _train(root, steps, every, crash_after):
    """The notebook's ``train``: data parallel by hand, a DCP checkpoint every ``every`` steps
    under ``root/step-N``; rank 1 dies right after step ``crash_after``."""
    import os

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import torch.nn.functional as F
    from torch.distributed.checkpoint.state_dict import get_state_dict

    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(1, steps + 1):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)
        F.mse_loss(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world_size
        opt.step()
        opt.zero_grad()
        if step % every == 0:
            model_sd, optim_sd = get_state_dict(model, opt)
            dcp.save({"model": model_sd, "optim": optim_sd},
                     checkpoint_id=os.path.join(root, f"step-{step}"))
        if step == crash_after and rank == 1:
            os._exit(13)


def _latest(root) -> int:
    import os

    done = [int(d.split("-")[1]) for d in os.listdir(root)
            if d.startswith("step-") and os.path.exists(os.path.join(root, d, ".metadata"))]
    return max(done, default=0)


def exercise_2(predicted_restart, every=3, crash_after=5) -> None:
    """``predicted_restart()`` -> ``(step, redone)``: the checkpoint a resumed run starts from
    after rank 1 dies right after step ``crash_after`` of a job that saves every ``every``
    steps, and how many steps are then computed twice. The grader runs that job on 2 new ranks
    and looks at what is on disk."""
    import shutil
    import tempfile

    from ..errors import RankError

    guess = predicted_restart()
    if not isinstance(guess, (tuple, list)) or len(guess) != 2:
        raise AssertionError(
            "predicted_restart() should return (the step it resumes from, the number of steps "
            f"done twice), a tuple of 2 ints; got {expect.describe(guess)}"
        )
    root = tempfile.mkdtemp(prefix="distlab-")
    try:
        try:
            expect.run(_train, root, crash_after + 1, every, crash_after, world_size=2,
                       timeout=TIMEOUT)
        except RankError:
            pass  # rank 1 died, as it should
        start = _latest(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    truth = (start, crash_after - start)
    for what, got, want in zip(("the step it resumes from", "the steps done twice"), guess, truth,
                               strict=True):
        if not isinstance(got, numbers.Integral) or isinstance(got, bool):
            raise AssertionError(f"{what} should be an int like {want}; got "
                                 f"{expect.describe(got)}")
    if guess[0] != truth[0]:
        saved = [s for s in range(every, crash_after + 1, every)]
        raise AssertionError(
            f"it resumes from step {truth[0]}, not {guess[0]}: with every={every} the job "
            f"saved after steps {saved} before rank 1 died after step {crash_after}"
        )
    if guess[1] != truth[1]:
        raise AssertionError(
            f"resuming from step {truth[0]}, steps {truth[0] + 1} to {crash_after} are done "
            f"twice: {truth[1]}, not {guess[1]}"
        )
