"""Graders for notebook 15, memory per rank (see `distlab.exercises`).

The learner predicts; the grader measures the real thing with `distlab.memory` on the
notebook's live cluster (4 ranks), or asks the memory calculator, and compares.
"""

from __future__ import annotations

import numbers
import warnings

from . import expect

#: Seconds a check may take on the cluster (FSDP's first step on 4 busy ranks takes a few).
TIMEOUT = 30.0


def _model(width, layers):
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])


def _step(model, opt, width):
    import torch
    import torch.distributed as dist

    x = torch.randn(8, width, generator=torch.Generator().manual_seed(dist.get_rank()))
    with warnings.catch_warnings():
        # FSDP's backward hooks on a first layer whose input needs no gradient, and a warning
        # about in-place ops on its output (there are none here): harmless here
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
        model(x).square().mean().backward()
    opt.step()


def _fsdp(width, layers, reshard=True):
    from torch.distributed.fsdp import fully_shard

    model = _model(width, layers)
    for layer in model:
        fully_shard(layer, reshard_after_forward=reshard)
    fully_shard(model, reshard_after_forward=reshard)
    return model


def _ints(guess, n: int, what: str, example) -> tuple:
    """``guess`` as a tuple of ``n`` ints, or an AssertionError that says what is wrong."""
    if not isinstance(guess, (tuple, list)) or len(guess) != n:
        raise AssertionError(f"{what} should be a tuple of {n} ints, like {example}; got "
                             f"{expect.describe(guess)}")
    for v in guess:
        if not isinstance(v, numbers.Integral) or isinstance(v, bool):
            hint = " (bytes are whole numbers: use // to divide)" if isinstance(v, float) else ""
            raise AssertionError(
                f"{what} should hold ints (bytes), like {example}; got {expect.describe(guess)}"
                f"{hint}"
            )
    return tuple(int(v) for v in guess)


# -- exercise 1: FSDP with SGD and momentum ----------------------------------------------------

#: (width, layers) of the models measured: the notebook's, and a smaller one.
MODELS = ((64, 4), (32, 2))


def _fsdp_sgd(models):
    import torch

    from .. import memory

    out = []
    for width, layers in models:
        model = _fsdp(width, layers)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        _step(model, opt, width)
        u = memory.measure(model, opt)
        psi = sum(p.numel() for p in _model(width, layers).parameters())
        out.append((psi, (u.params, u.grads, u.optimizer)))
    return out


def exercise_1(predict_fsdp_sgd, cluster) -> None:
    """``predict_fsdp_sgd(psi, n)`` -> ``(params, grads, optimizer)``: the bytes a rank holds
    after one step of ``fully_shard`` + ``SGD(lr=0.1, momentum=0.9)`` in fp32, for a model of
    ``psi`` parameters on ``n`` ranks. Measured with `distlab.memory.measure` on every rank of
    the cluster, for two models."""
    measured = expect.run(_fsdp_sgd, MODELS, cluster=cluster, timeout=TIMEOUT)
    n = len(measured)
    for i in range(len(MODELS)):
        psi, truth = measured[0][i]
        guess = _ints(predict_fsdp_sgd(psi, n), 3, f"predict_fsdp_sgd({psi}, {n})", truth)
        for r in range(n):
            real = measured[r][i][1]
            if guess == real:
                continue
            parts = ", ".join(
                f"{name} {g:,} (measured {m:,})"
                for name, g, m in zip(("params", "grads", "optimizer"), guess, real, strict=True)
                if g != m
            )
            raise AssertionError(
                f"for Ψ = {psi:,} on {n} ranks, rank {r} holds {real} bytes; you predicted "
                f"{guess}: {parts}"
            )


# -- exercise 2: ZeRO-1 with uneven layers -----------------------------------------------------

#: (in, out) of the nn.Linear layers of each model measured: the notebook's SIZES, and one whose
#: tensors tie in size (the lowest rank takes a tie) and come in no particular order.
LAYERS = (
    ((64, 64), (64, 32), (32, 32), (32, 8), (8, 8)),
    ((16, 16), (16, 16), (16, 16), (16, 8), (8, 32)),
)


def _zero1(layers):
    import torch
    from torch import nn
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from .. import memory

    out = []
    for sizes in layers:
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(i, o) for i, o in sizes])
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam)
        model(torch.ones(2, sizes[0][0])).sum().backward()
        opt.step()
        numels = [p.numel() for p in model.parameters()]
        out.append((numels, memory.measure(optimizer=opt).optimizer))
    return out


def exercise_2(zero1_adam_bytes, cluster) -> None:
    """``zero1_adam_bytes(numels, n)`` -> a list: the bytes of Adam state (m and v, fp32) each
    of the ``n`` ranks holds when ``ZeroRedundancyOptimizer`` shares out parameter tensors of
    ``numels`` elements. Measured on the cluster for two models (one with ties)."""
    measured = expect.run(_zero1, LAYERS, cluster=cluster, timeout=TIMEOUT)
    n = len(measured)
    for i in range(len(LAYERS)):
        numels = measured[0][i][0]
        truth = [measured[r][i][1] for r in range(n)]
        guess = zero1_adam_bytes(list(numels), n)
        what = f"zero1_adam_bytes({numels}, {n})"
        expect.same(guess, truth, what)


# -- exercise 3: fewer all-gathers -------------------------------------------------------------


def _all_gathers():
    import torch
    from torch.distributed.tensor.debug import CommDebugMode

    counted = {}
    for reshard in (True, False):
        model = _fsdp(64, 4, reshard)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        with CommDebugMode() as cm:
            _step(model, opt, 64)
        counted[reshard] = sum(n for op, n in cm.get_comm_counts().items()
                               if "allgather" in str(op) or "all_gather" in str(op))
    return counted


def exercise_3(all_gathers_per_step, cluster) -> None:
    """``all_gathers_per_step(reshard_after_forward)``: all-gathers one rank runs in one
    training step of the notebook's ``fsdp_model(64, reshard)`` (4 layers, each its own unit,
    and the root). Counted with ``CommDebugMode`` on every rank of the cluster."""
    counted = expect.run(_all_gathers, cluster=cluster, timeout=TIMEOUT)[0]
    for reshard in (True, False):
        guess = all_gathers_per_step(reshard)
        what = f"all_gathers_per_step({reshard})"
        if not isinstance(guess, numbers.Integral) or isinstance(guess, bool):
            raise AssertionError(f"{what} should be a count, an int; got "
                                 f"{expect.describe(guess)}")
        if guess != counted[reshard]:
            raise AssertionError(
                f"with reshard_after_forward={reshard}, each rank ran {counted[reshard]} "
                f"all-gathers in one step; you predicted {guess}"
            )


# -- exercise 4: how much tensor parallelism? --------------------------------------------------

LLAMA = dict(model="Llama-3 70B", dp=8, zero=3, precision="bf16-mixed",
             checkpointing="full", seq_len=8192)


def exercise_4(smallest_tp) -> None:
    """``smallest_tp()``: the smallest tensor-parallel size at which the peak of Llama-3 70B
    fits in an 80 GB device with FSDP (ZeRO-3, dp=8, full checkpointing, 8192 tokens, bf16
    mixed), asked of the memory calculator for every size it accepts."""
    from ..calculators import GB, CalculatorError, memory_per_device

    guess = smallest_tp()
    if not isinstance(guess, numbers.Integral) or isinstance(guess, bool):
        raise AssertionError(f"smallest_tp() should be a tensor-parallel size, an int; got "
                             f"{expect.describe(guess)}")
    fits = {}
    for tp in range(1, 65):
        try:
            fits[tp] = memory_per_device(tp=tp, **LLAMA)
        except CalculatorError:
            continue
    truth = min(tp for tp, est in fits.items() if est.fits())
    if guess == truth:
        return
    if guess not in fits:
        raise AssertionError(
            f"tp={guess} cannot split Llama-3 70B: a tensor-parallel size must divide its 8 "
            f"key-value heads (the sizes that work: {', '.join(map(str, sorted(fits)))})"
        )
    est = fits[guess]
    if not est.fits():
        raise AssertionError(
            f"with tp={guess} each device needs {est.peak / GB:.1f} GB at its peak: more than "
            "80 GB"
        )
    raise AssertionError(
        f"tp={guess} fits (a peak of {est.peak / GB:.1f} GB), but so does a smaller size: "
        "which is the smallest?"
    )
