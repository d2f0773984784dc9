"""Graders for notebook 19, mixed precision (see `distlab.exercises`).

Exercises 1 and 3 run on the notebook's live cluster (2 ranks that imported FSDP already), on a
one-block tiny GPT (`distlab.gpt`, ``sdpa=True``) and meshes the grader builds there itself;
exercise 2 runs in this process, against ``torch.amp.GradScaler``.
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction

from . import expect

#: Seconds a check may take on the cluster: FSDP's first steps take a second or two, more on a
#: busy machine (every right answer passes with two CPU burners beside); a wrong answer that
#: hangs is called a hang after this.
TIMEOUT = 10.0


def _config():
    from .. import gpt

    return gpt.Config(sdpa=True, layers=1)


def _fsdp(model, mesh, policy=None):
    from torch.distributed.fsdp import fully_shard

    options = {"mesh": mesh} if policy is None else {"mesh": mesh, "mp_policy": policy}
    for layer in model.layers:
        fully_shard(layer, **options)
    return fully_shard(model, **options)


# -- exercise 1: the global gradient norm ------------------------------------------------------


def _norm_case(answer, seed):
    """On each rank: an FSDP GPT after one backward on this rank's half of a batch; the answer's
    norm, the collectives it ran, whether it changed the gradients; and what one process with
    the whole batch computes, first (so that whatever the answer changes cannot move it).
    ``seed`` picks the model and the batch: a new case at every check, so that a number copied
    from an earlier message does not pass."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode

    from .. import gpt

    config, world, rank = _config(), dist.get_world_size(), dist.get_rank()
    tokens, targets = gpt.batch(seed % 100, 8, config, seed=seed)
    reference = gpt.GPT(config, seed=seed)
    gpt.loss(reference(tokens), targets).backward()
    truth = float(torch.cat([p.grad.flatten() for p in reference.parameters()]).double().norm())
    model = _fsdp(gpt.GPT(config, seed=seed), init_device_mesh("cpu", (world,)))
    gpt.loss(model(tokens.chunk(world)[rank]), targets.chunk(world)[rank]).backward()
    before = [p.grad.to_local().clone() for p in model.parameters()]
    local = math.sqrt(sum(float(g.double().square().sum()) for g in before))
    with CommDebugMode() as cm:
        got = answer(model)
    counts = {str(op): n for op, n in cm.get_comm_counts().items() if n}
    changed = any(not torch.equal(b, p.grad.to_local())
                  for b, p in zip(before, model.parameters(), strict=True))
    locals_ = [None] * world
    dist.all_gather_object(locals_, local)  # outside the CommDebugMode: for the hints only
    if isinstance(got, torch.Tensor):
        got = ("tensor", got.detach().clone())
    return {"got": got, "counts": counts, "changed": changed, "truth": truth, "locals": locals_}


def _fresh_seed() -> int:
    """A case the learner cannot know in advance: drawn anew at every check."""
    return expect.rng().randrange(1, 10**6)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-9)


def _norm_hint(value: float, truth: float, locals_: list, rank: int) -> str:
    world = len(locals_)
    if _close(value, locals_[rank]):
        return (" (the norm of this rank's shards only: all-reduce the sum of squares over the "
                "ranks)")
    if _close(value, sum(locals_)):
        return (" (the ranks' norms added up: norms do not add, their squares do; all-reduce "
                "the sum of squares, then take the root)")
    if _close(value, truth**2):
        return " (the sum of squares: take its square root)"
    if _close(value, truth / math.sqrt(world)) or _close(value, truth**2 / world):
        return " (averaged over the ranks: the squares must be summed, not averaged)"
    return ""


def exercise_1(global_grad_norm, cluster) -> None:
    """``global_grad_norm(model)`` on every rank of the cluster, after the backward of a
    ``fully_shard``-ed tiny GPT (a model and a batch drawn anew at every check): the norm of the
    whole gradient as a Python float, the same on every rank, equal to one process's, with
    exactly one collective (an all_reduce), leaving the gradients as they were."""
    results = expect.run(_norm_case, global_grad_norm, _fresh_seed(), cluster=cluster,
                         timeout=TIMEOUT)
    truth = results[0]["truth"]
    for rank, r in enumerate(results):
        got = r["got"]
        if isinstance(got, tuple) and got[:1] == ("tensor",):
            raise AssertionError(
                f"global_grad_norm should return a Python float, like {truth:.4f}; rank {rank} "
                f"returned {expect.describe(got[1])} (.item() turns a one-number tensor into a "
                "float)"
            )
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            raise AssertionError(
                f"global_grad_norm should return a Python float, like {truth:.4f}; rank {rank} "
                f"returned {expect.describe(got)}"
            )
        if not _close(float(got), truth):
            raise AssertionError(
                f"rank {rank}'s norm should be {truth:.6g} (one process, the whole gradient); got "
                f"{float(got):.6g}{_norm_hint(float(got), truth, r['locals'], rank)}"
            )
    for rank, r in enumerate(results):
        counts = r["counts"]
        reduces = sum(n for op, n in counts.items() if "all_reduce" in op or "allreduce" in op)
        others = {op: n for op, n in counts.items() if "all_reduce" not in op
                  and "allreduce" not in op}
        if others:
            ran = ", ".join(f"{op} x{n}" for op, n in sorted(counts.items()))
            raise AssertionError(
                f"the right norm, but rank {rank} ran {ran}: gathering gradients moves all of "
                "them; one all_reduce of a single number (this rank's sum of squares) is enough"
            )
        if reduces != 1:
            what = "no collective" if not reduces else f"{reduces} all_reduces"
            raise AssertionError(
                f"rank {rank} ran {what}; the norm needs exactly one all_reduce, of one number: "
                "add up this rank's squares first (a DTensor norm per parameter all-reduces once "
                "per parameter)"
            )
        if r["changed"]:
            raise AssertionError(
                f"your function changed rank {rank}'s gradients: compute the norm from copies "
                "(p.grad.to_local().square() makes a new tensor), do not modify p.grad"
            )


# -- exercise 2: dynamic loss scaling ----------------------------------------------------------

START = 2.0**24
STEPS = 10


def _power(x) -> str:
    try:
        e = math.log2(float(x))
    except (TypeError, ValueError):
        return repr(x)
    return f"2^{int(e)}" if e.is_integer() else repr(x)


#: Steps at which the check makes one gradient not finite itself (an overflow in one layer
#: only), and how: the tiny GPT's own overflows are over by then, and they hit every layer, so
#: an answer that looks at one parameter, or for inf only, would pass without these. At step 8
#: it is a vector's, one of `VECTORS` drawn at every check, so that an answer that checks the
#: matrices only (``p.ndim == 2``) does not pass either.
PLANTED = {7: ("tok.weight", float("inf")), 9: ("layers.0.attn.wq.weight", float("nan"))}
VECTOR_STEP = 8
VECTORS = ("layers.0.ln1.weight", "layers.0.ln1.bias", "layers.0.ln2.weight",
           "layers.0.ln2.bias", "layers.1.ln1.weight", "layers.1.ln1.bias",
           "layers.1.ln2.weight", "layers.1.ln2.bias", "norm.weight", "norm.bias")


def _planted() -> dict:
    """`PLANTED`, with a gradient of one of `VECTORS` drawn made inf, -inf or nan at
    `VECTOR_STEP`."""
    rng = expect.rng()
    value = rng.choice((float("inf"), float("-inf"), float("nan")))
    return {**PLANTED, VECTOR_STEP: (rng.choice(VECTORS), value)}


def _fp16_run(step_fn, planted: dict = PLANTED):
    """Train a fresh tiny GPT (SGD with momentum) under fp16 autocast for STEPS steps; step_fn(
    model, opt, loss, scale) -> next scale. Returns the scales (each step's, then the last one
    returned), whether each step changed the weights, and the weights after each step (flat);
    stops after a step that leaves weights that are not finite. At the steps of ``planted``
    (`PLANTED` and more) one entry of one parameter's gradient is made inf or nan in the
    backward."""
    import torch

    from .. import gpt

    config = gpt.Config(sdpa=True)
    model = gpt.GPT(config, seed=0)
    opt = gpt.make_optimizer(model.parameters(), "sgd")
    now = [0]

    def planter(name):
        def plant(grad):
            where, value = planted.get(now[0], (None, None))
            if where != name:
                return grad
            grad = grad.clone()
            grad.view(-1)[0] = value
            return grad

        return plant

    for name, p in model.named_parameters():
        if any(where == name for where, _ in planted.values()):
            p.register_hook(planter(name))
    scale, scales, stepped, weights = START, [], [], []
    for step in range(STEPS):
        now[0] = step
        tokens, targets = gpt.batch(step, 8, config)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = gpt.loss(model(tokens), targets)
        before = torch.cat([p.detach().flatten() for p in model.parameters()])
        scales.append(scale)
        scale = step_fn(model, opt, loss, scale)
        opt.zero_grad()
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
        stepped.append(not torch.equal(before, weights[-1]))
        if not weights[-1].isfinite().all():
            break  # everything after is nan
    scales.append(scale)
    return scales, stepped, weights


class _by_hand:
    """While an answer runs: torch.amp.GradScaler refuses to work (the exercise asks for the
    scaling by hand; GradScaler does it all, and its result is what the check compares with)."""

    _METHODS = ("__init__", "scale", "unscale_", "step", "update")

    def __enter__(self):
        from torch.amp.grad_scaler import GradScaler

        def refuse(*args, **kwargs):
            raise AssertionError(
                "scaled_step used torch.amp.GradScaler: the exercise asks for loss scaling by "
                "hand (backward of loss * scale, check every gradient with isfinite(), divide "
                "them by the scale, step or skip), the very thing GradScaler does for you"
            )

        self._saved = {m: GradScaler.__dict__[m] for m in self._METHODS}
        for m in self._METHODS:
            setattr(GradScaler, m, refuse)
        return self

    def __exit__(self, *exc):
        from torch.amp.grad_scaler import GradScaler

        for m, original in self._saved.items():
            setattr(GradScaler, m, original)
        return False


def _grad_scaler_step():
    import torch

    state = {}

    def step(model, opt, loss, scale):
        if "scaler" not in state:
            state["scaler"] = torch.amp.GradScaler("cpu", init_scale=scale, growth_interval=10**6)
        scaler = state["scaler"]
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return scaler.get_scale()

    return step


def exercise_2(scaled_step) -> None:
    """``scaled_step(model, optimizer, loss, scale)`` -> the next scale: the backward of
    ``loss * scale``; with finite gradients, unscale and step and keep the scale; otherwise skip
    the step and halve it. Checked over 10 fp16 steps from 2^24 against ``GradScaler``: the
    scales, which steps changed the weights, and the weights; at three steps one gradient of
    one layer is made inf or nan (`PLANTED`, and a LayerNorm's drawn from `VECTORS`). The
    answer itself may not use GradScaler."""
    import torch

    def learner(model, opt, loss, scale):
        with _by_hand():
            new = scaled_step(model, opt, loss, scale)
        if isinstance(new, torch.Tensor) or isinstance(new, bool) or not isinstance(
            new, numbers.Real
        ):
            raise AssertionError(
                f"scaled_step should return the next scale as a number, like {scale / 2!r}; it "
                f"returned {expect.describe(new)}"
            )
        return float(new)

    planted = _planted()
    want_scales, want_stepped, want_weights = _fp16_run(_grad_scaler_step(), planted)
    got_scales, got_stepped, got_weights = _fp16_run(learner, planted)
    for step in range(STEPS):
        overflow = not want_stepped[step]
        why = (f"step {step} overflowed (gradients not finite at scale "
               f"{_power(want_scales[step])})" if overflow else
               f"at step {step} the gradients are finite (scale {_power(want_scales[step])})")
        if step in planted:
            where, value = planted[step]
            kind = " (a vector: a LayerNorm's)" if step == VECTOR_STEP else ""
            why = (f"step {step} overflowed in one layer: {where}'s gradient{kind} holds "
                   f"{value} (the check put it there), every other gradient is finite")
        broken = not got_weights[step].isfinite().all()
        if overflow and got_stepped[step]:
            now = "; your weights now hold inf or nan" if broken else ""
            raise AssertionError(
                f"{why}: the optimizer step must be skipped, but your step changed the "
                f"weights{now}. Check every gradient with isfinite(): the loss times the scale "
                "is finite in fp32 even when gradients overflow"
            )
        if not overflow and not got_stepped[step]:
            raise AssertionError(
                f"{why}: the optimizer should step, but the weights did not change"
            )
        if not torch.allclose(got_weights[step], want_weights[step], rtol=1e-5, atol=1e-7):
            diff = (got_weights[step] - want_weights[step]).abs().max()
            raise AssertionError(
                f"{why}, but after your step the weights differ from GradScaler's (largest "
                f"difference {float(diff):.3g}): divide every gradient by the scale before "
                "optimizer.step()"
            )
        if got_scales[step + 1] != want_scales[step + 1]:
            rule = "halved after an overflow" if overflow else "kept after a good step"
            raise AssertionError(
                f"{why}: the scale for the next step should be {_power(want_scales[step + 1])} "
                f"({rule}); got {_power(got_scales[step + 1])}"
            )


# -- exercise 3: bytes per parameter -----------------------------------------------------------

#: (name, param_dtype, reduce_dtype) as the notebook writes them; resolved on the ranks.
POLICIES = (("no policy", None, None), ("bf16 + fp32 reduce", "bfloat16", "float32"),
            ("bf16, reduce_dtype=None", "bfloat16", None))
#: The policies one more is drawn from at every check (a table of the cases above does not
#: pass), and the world size measured on ranks of their own besides the cluster's: 3, which
#: divides neither 4 nor 8 (a formula right for 1 and 2 ranks only, or one that divides with
#: //, does not pass either). FSDP splits each tensor's rows unevenly over 3 ranks, so what a
#: rank holds there is the ranks' mean: the total over the ranks, divided by n.
OTHER_POLICIES = tuple((f"param_dtype={pd}, reduce_dtype={rd}", pd, rd)
                       for pd in ("float16", "bfloat16", "float32")
                       for rd in (None, "float32", "bfloat16", "float16")
                       if (pd, rd) not in {(p, r) for _, p, r in POLICIES})
MORE_RANKS = 3


def _measure_policies(policies, one=True):
    """On each rank: the bytes per parameter it holds after one AdamW step, for every policy,
    on the whole world and (``one``) on a 1-rank mesh."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from .. import gpt, memory

    config, world = _config(), dist.get_world_size()
    meshes = {world: init_device_mesh("cpu", (world,))}
    if one:
        meshes[1] = init_device_mesh("cpu", (world, 1), mesh_dim_names=("all", "one"))["one"]
    psi = sum(p.numel() for p in gpt.GPT(config).parameters())
    out = {}
    for n, mesh in meshes.items():
        for name, pd, rd in policies:
            policy = None
            if pd is not None:
                policy = MixedPrecisionPolicy(
                    param_dtype=getattr(torch, pd), reduce_dtype=rd and getattr(torch, rd))
            model = _fsdp(gpt.GPT(config, seed=0), mesh, policy)
            opt = gpt.make_optimizer(model.parameters())
            tokens, targets = gpt.batch(0, 8, config)
            gpt.loss(model(tokens.chunk(n)[0]), targets.chunk(n)[0]).backward()
            opt.step()
            u = memory.measure(model, opt)
            out[n, name] = (Fraction(u.params, psi), Fraction(u.grads, psi),
                            Fraction(u.optimizer, psi))
    return out


def _num(x) -> str:
    f = Fraction(x).limit_denominator(1000)
    return str(f.numerator) if f.denominator == 1 else f"{float(f):g}"


def exercise_3(fsdp_bytes, cluster) -> None:
    """``fsdp_bytes(n, param_dtype, reduce_dtype)`` -> ``(params, grads, optimizer)`` bytes per
    parameter one rank holds between steps, for an fp32 model under ``fully_shard`` with that
    ``MixedPrecisionPolicy`` and AdamW; measured on the cluster for n = world size and n = 1,
    and on `MORE_RANKS` ranks of their own (there the mean over the ranks: 3 ranks split the
    rows unevenly), for the notebook's three policies and one more drawn at every check."""
    import torch

    policies = (*POLICIES, expect.rng().choice(OTHER_POLICIES))
    measured = expect.run(_measure_policies, policies, cluster=cluster, timeout=TIMEOUT)[0]
    more = expect.run(_measure_policies, policies, False, world_size=MORE_RANKS,
                      timeout=3 * TIMEOUT)
    measured.update({key: tuple(sum(rank[key][i] for rank in more) / MORE_RANKS
                                for i in range(3)) for key in more[0]})
    for (n, name), truth in sorted(measured.items(), key=lambda kv: (kv[0][0] == MORE_RANKS,
                                                                     -kv[0][0])):
        pd, rd = next((p, r) for nm, p, r in policies if nm == name)
        pd, rd = pd and getattr(torch, pd), rd and getattr(torch, rd)
        call = f"fsdp_bytes({n}, {pd}, {rd})"
        got = fsdp_bytes(n, pd, rd)
        if not isinstance(got, tuple) or len(got) != 3:
            raise AssertionError(
                f"{call} should return a tuple of 3 numbers (params, grads, optimizer), e.g. "
                f"({', '.join(_num(x) for x in truth)}); got {expect.describe(got)}"
            )
        for part, g, t in zip(("params", "grads", "optimizer"), got, truth, strict=True):
            if isinstance(g, bool) or not isinstance(g, numbers.Real) or isinstance(
                g, torch.Tensor
            ):
                raise AssertionError(
                    f"{call}'s {part} should be a number of bytes per parameter, like {_num(t)}; "
                    f"got {expect.describe(g)}"
                )
            if not math.isclose(float(g), float(t), rel_tol=1e-9):
                per_rank = " (that is per rank, not per parameter?)" if float(g) > 100 else ""
                raise AssertionError(
                    f"with {name} on {n} rank{'s' if n > 1 else ''}, a rank holds {part} "
                    f"{_num(t)} bytes per parameter (measured); {call} says {_num(g)}{per_rank}"
                )
