"""Why a recorded tensor differs from the reference: read the shape of the error.

Distributed mistakes leave fingerprints. A gradient summed over N ranks and never divided is
exactly N times the reference; one that each rank kept to itself averages (over the ranks) to
the reference; a shard gathered along the wrong dim has the wrong shape; shards concatenated in
the wrong order are the reference's chunks, permuted. `diagnose` looks for these, in that order,
and says what they usually mean. It never decides *whether* a tensor differs (`compare` does).
"""

from __future__ import annotations

from fractions import Fraction

import torch

__all__ = ["close", "diagnose", "shape_hint"]

_WHAT = {"loss": "the loss", "grads": "the gradient", "params": "the parameter",
         "state": "the optimizer state"}


def close(got, ref, atol: float, rtol: float, allow=0.0) -> bool:
    """The gradcheck's test: same shape and ``|got - ref| <= atol + rtol * max|ref| + allow``
    for every element, the error measured against the tensor's own scale (its largest
    magnitude), not element by element: a gradient whose entries are all tiny is still compared
    to its own size. ``allow`` (0, or a tensor of ``ref``'s shape): what each element may
    differ by besides, e.g. what the optimizer made of the gradients' rounding
    (`distlab.gradcheck.optimizers.Drift`)."""
    if got.shape != ref.shape:
        return False
    if got.numel() == 0:
        return True
    got, ref = got.double(), ref.double()
    bound = atol + rtol * ref.abs().max()
    if isinstance(allow, torch.Tensor) or allow:
        return bool(((got - ref).abs() <= bound + allow).all())
    return bool((got - ref).abs().max() <= bound)


_close = close


def _ranks(ranks) -> str:
    ranks = list(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def shape_hint(got: tuple, want: tuple) -> str:
    """What a wrong shape suggests (shapes as tuples)."""
    if len(got) == len(want) and sorted(got) == sorted(want) and got == tuple(reversed(want)):
        return "it is transposed (a Linear weight is (out_features, in_features))"
    if len(got) != len(want):
        return f"{len(got)} dims instead of {len(want)}: a view or flattened copy was recorded"
    diff = [d for d in range(len(want)) if got[d] != want[d]]
    if len(diff) == 1:
        d = diff[0]
        g, w = got[d], want[d]
        if w % g == 0:
            k = w // g
            return (
                f"dim {d} is 1/{k} of the reference's: a shard that was never gathered (a plain "
                f"tensor sharded by hand: give Recorder(shards={{name: {d}}}); a DTensor is "
                "gathered by itself)"
            )
        if g % w == 0:
            k = g // w
            return (
                f"dim {d} is {k}x the reference's: {k} copies concatenated along dim {d}: a "
                "replicated tensor gathered as if it were sharded (wrong shards= entry?)"
            )
    if len(diff) == 2:
        a, b = diff
        ka, kb = Fraction(got[a], want[a]), Fraction(got[b], want[b])
        if ka * kb == 1:
            big, small = (a, b) if ka > 1 else (b, a)
            return (
                f"dim {big} is {max(ka, kb)}x and dim {small} is 1/{max(ka, kb)} of the "
                f"reference's: a tensor sharded along dim {small} was gathered along dim {big} "
                f"(the wrong shard dim: Shard({big}) where Shard({small}) was meant)"
            )
    return "the shapes do not match"


def _ratio(got, ref, atol, rtol):
    """The c with got == c * ref, if there is one (least squares, then checked), else None."""
    denom = float((ref * ref).sum())
    if denom == 0.0:
        return None
    c = float((got * ref).sum()) / denom
    if _close(got, c * ref, atol, rtol):
        return c
    return None


def _ratio_hint(c: float, what: str, world: int) -> str | None:
    def near(x):
        return abs(c - x) <= 1e-3 * max(1.0, abs(x))

    if world > 1 and near(world):
        return (
            f"{what} is exactly {world}x the reference: looks like a sum over {world} ranks "
            "that was not divided (a forgotten division by the world size)"
        )
    if world > 1 and near(1 / world):
        return (
            f"{what} is exactly 1/{world} of the reference: divided by the world size once too "
            "often (an all-reduce with op=AVG and then a division, or a loss divided by the world "
            "size on top of averaged gradients)"
        )
    if near(-1.0):
        return f"{what} is the negative of the reference: a sign flipped"
    if near(0.0):
        return f"{what} is all zeros: it never received its value (no gradient reached it?)"
    frac = Fraction(c).limit_denominator(16)
    if near(float(frac)):
        return (
            f"{what} is exactly {frac}x the reference: a scale mistake, a division or "
            f"multiplication by the wrong group size? ({world} ranks here)"
        )
    return None


def _chunk_hint(got, ref, world: int, atol, rtol) -> str | None:
    """Same shape, wrong values: are they the reference's chunks (or slices) rearranged?"""
    for d in range(ref.dim()):
        size = ref.shape[d]
        for k in sorted({world, 2, 4} - {1}, key=lambda k: (k != world, k)):
            if size % k or size == k:
                continue
            gs, rs = got.chunk(k, d), ref.chunk(k, d)
            match = [next((j for j, r in enumerate(rs) if _close(g, r, atol, rtol)), None)
                     for g in gs]
            if all(m is not None for m in match):
                if len(set(match)) == k:
                    return (
                        f"its {k} chunks along dim {d} are the reference's in the order {match}: "
                        f"shards concatenated in the wrong order (shard i is not the part of "
                        f"rank i), or sharded along dim {d} in a different order than gathered"
                    )
                return (
                    f"its {k} chunks along dim {d} are the reference's chunks {match}: the same "
                    "shard gathered more than once (every rank sent the same part?)"
                )
    for d in range(ref.dim()):
        if ref.shape[d] < 3:
            continue
        gs, rs = got.unbind(d), ref.unbind(d)
        match = [next((j for j, r in enumerate(rs) if _close(g, r, atol, rtol)), None)
                 for g in gs]
        if all(m is not None for m in match) and len(set(match)) == len(match):
            head = ", ".join(map(str, match[:8])) + (", ..." if len(match) > 8 else "")
            return (
                f"its slices along dim {d} are the reference's, permuted ({head}): an interleaved "
                "shard (w[rank::N]) gathered as contiguous chunks, or the other way round"
            )
    return None


def _ranks_hint(kind, values: dict, ref, atol, rtol) -> str | None:
    """Several ranks hold a tensor that should be the same everywhere, and they disagree."""
    tensors = list(values.values())
    if len(tensors) < 2 or any(t.shape != ref.shape for t in tensors):
        return None
    if all(_close(t, tensors[0], atol, rtol) for t in tensors[1:]):
        return None
    what = _WHAT[kind]
    stacked = torch.stack(tensors)
    n = len(tensors)
    if _close(stacked.mean(0), ref, atol, rtol):
        if kind == "loss":
            return (
                "each rank recorded its own local loss; their average is the reference: give "
                "Recorder(loss_group=...) the data-parallel ranks so it records the average"
            )
        return (
            f"the ranks disagree, and their average is the reference: each rank kept its own "
            f"local value; {what} was never averaged across the {n} ranks (a missing "
            "all-reduce)"
        )
    if _close(stacked.sum(0), ref, atol, rtol):
        return (
            f"the ranks disagree, and their sum is the reference: each rank holds a partial sum "
            f"(a missing all-reduce: a row-parallel output not reduced, or {what} divided by "
            "the world size but never summed)"
        )
    return None


def _loss_agrees(error: float | None) -> str:
    if error is None:
        return ""
    return f" (to {error:.1e} relative; float32 rounding alone gives about 1e-07)"


def diagnose(kind: str, values: dict, ref, *, world: int, atol: float, rtol: float,
             siblings: dict | None = None, loss_error: float | None = None,
             allow: dict | None = None, settings_agree: bool = False) -> str:
    """A one-sentence guess at why ``values`` (rank -> tensor, the ranks that recorded this
    tensor) differ from ``ref``. ``kind``: "loss", "grads", "params" or "state". ``world``: the
    number of ranks. ``siblings``: the reference's other tensors of this kind (name -> tensor),
    to recognise a tensor recorded under the wrong name. ``loss_error``: the largest relative
    error of this step's loss (it passed), to say how closely the forward agreed. ``allow``:
    rank -> what each element may differ by besides the tolerance (see `close`).
    ``settings_agree``: the ranks' optimizer has one process's class and settings (both were
    recorded), so the hint does not blame them."""
    what = _WHAT[kind]
    values = {r: v.double() for r, v in values.items()}
    ref = ref.double()
    allow = allow or {}
    bad = [r for r, v in values.items() if not _close(v, ref, atol, rtol, allow.get(r, 0.0))]
    good = [r for r in values if r not in bad]
    first = values[bad[0]]
    if first.shape != ref.shape:
        return (
            f"shape {tuple(first.shape)} instead of {tuple(ref.shape)}: "
            f"{shape_hint(tuple(first.shape), tuple(ref.shape))}"
        )
    hint = _ranks_hint(kind, values, ref, atol, rtol)
    if hint is None:
        c = _ratio(first, ref, atol, rtol)
        hint = None if c is None else _ratio_hint(c, what, world)
    if hint is None and first.dim() > 0:
        hint = _chunk_hint(first, ref, world, atol, rtol)
    if hint is None:
        for name, other in (siblings or {}).items():
            if _close(first, other.double(), atol, rtol):
                hint = (
                    f"the values are the reference's {name}: recorded under the wrong name (a "
                    "pipeline stage's local layers.i is global layers.{i + offset}: give "
                    "Recorder(layer_offset=...))"
                )
                break
    if hint is None:
        hint = {
            "loss": "the forward already computes something else (heads split wrong, a "
            "row-parallel output not reduced, another batch or seed), so nothing after it can "
            "match",
            "grads": f"the loss agrees{_loss_agrees(loss_error)} and this gradient does not: a "
            "missing, extra or wrong all-reduce or division in the backward, a hook that changes "
            "gradients, or a forward mistake that barely moves the loss yet (at initialisation "
            "attention is nearly uniform: a wrong split of the heads hardly shows in the loss)",
            "params": "the gradients agree but the update does not: another optimizer or "
            "hyperparameters, an optimizer built before the model was wrapped, or parameters "
            "that were not the same on every rank",
            "state": "gradients and parameters agree but the optimizer state does not: other "
            "optimizer hyperparameters (betas, momentum), or state that was not gathered",
        }[kind]
        if settings_agree and kind == "params":
            hint = (
                "the gradients agree to rounding and the optimizer has one process's settings, "
                "but the update does not: parameters that were not the same on every rank "
                "before the step (another seed, a shard taken from the wrong place), a "
                "parameter changed outside the optimizer, or gradients changed between "
                "optimizer.step() and record()"
            )
        elif settings_agree and kind == "state":
            hint = (
                "gradients and parameters agree, and the optimizer has one process's settings, "
                "but its state does not: state that was not gathered (a shard recorded as the "
                "whole: check Recorder(shards=...)), or state changed outside the optimizer"
            )
    if good and len(values) > 1:
        differ = "differs" if len(bad) == 1 else "differ"
        agree = "agrees" if len(good) == 1 else "agree"
        hint += (
            f"; only {_ranks(bad)} {differ}, {_ranks(good)} {agree} with one process: a "
            "rank-dependent mistake (another seed, batch or shard there)"
        )
    return hint
