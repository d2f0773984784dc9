"""The kernel side of a gradcheck: lay every rank's recording next to the reference's.

`compare` walks the recordings in a fixed order: step by step, and within a step the loss,
then every gradient in parameter order, then the optimizer's settings, then every parameter
after the step, then the optimizer state. It stops at the first tensor that differs on some
rank, because everything after it differs as a consequence, and names it, with a hint from
`hints.diagnose`. Parameters and optimizer state may differ, element by element, by what the
gradients' measured rounding can cause through the optimizer (`optimizers.Drift`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..bounds import limit_text
from ..errors import InputError, InputTypeError
from .hints import close, diagnose
from .optimizers import KNOWN, Drift, differences
from .recorder import Recorder

__all__ = ["Mismatch", "Report", "compare"]

_KINDS = ("loss", "grads", "params", "state")
_SUFFIX = {"grads": ".grad", "params": "", "state": ""}


@dataclass(frozen=True)
class Mismatch:
    """The first tensor that differs. ``name`` as printed (``layers.1.attn.wq.weight.grad``,
    ``loss``, ``tok.weight.exp_avg``); ``kind``: "loss", "grads", "params" or "state";
    ``problem``: "differs", "missing", "no gradient", "unexpected", "shape", "optimizer" (its
    settings differ from one process's) or "not optimized" (the optimizer does not hold the
    parameter); ``rank``: the
    first rank where it is wrong, ``ranks``: all of them; ``max_abs``/``max_rel``: the largest
    error, absolute and relative to the reference's largest magnitude (None when there are no
    values to compare)."""

    step: int
    kind: str
    name: str
    problem: str
    rank: int | None
    ranks: tuple
    max_abs: float | None
    max_rel: float | None
    hint: str

    def text(self) -> str:
        where = f" on rank {self.rank}" if self.rank is not None else ""
        if self.problem == "differs":
            head = (
                f"{self.name} differs{where} at step {self.step}: max abs error "
                f"{self.max_abs:.2g} (rel {self.max_rel:.2g})"
            )
        elif self.problem == "missing":
            head = f"{self.name} was recorded by no rank at step {self.step}"
        elif self.problem == "no gradient":
            head = f"{self.name} is None{where} at step {self.step}: the parameter got no gradient"
        elif self.problem == "optimizer":
            head = f"{self.name}'s optimizer differs from one process's{where} at step {self.step}"
        elif self.problem == "not optimized":
            head = f"{self.name} is not in the optimizer{where} at step {self.step}"
        elif self.problem == "unexpected":
            head = (
                f"{self.name} was recorded{where} at step {self.step}, but one process has no "
                "such tensor"
            )
        else:
            head = f"{self.name} has the wrong shape{where} at step {self.step}"
        return f"{head}; {self.hint}"


@dataclass(frozen=True)
class Report:
    """What `compare` found. ``ok``: every tensor equal within tolerance; ``mismatch``: the first
    `Mismatch` (None when ok); ``steps``: steps compared; ``tensors``: tensors compared per step
    (the loss, gradients, parameters and optimizer state of the reference), ``counts``: the
    numbers of gradients, parameters and optimizer state tensors among them; ``max_abs`` and
    ``max_rel``: the largest errors over everything compared (up to the mismatch); relative
    errors are to each tensor's largest magnitude.

    ``rtol``: the relative tolerance the comparison used.

    ``str(report)`` is one verdict line (and the mismatch); ``bool(report)`` is ``ok``;
    `check` raises AssertionError with that text, for ``distlab.check`` and tests. A passing
    line names the tolerance met, not the errors' digits, which differ from one CPU to another
    (read them from ``max_abs`` and ``max_rel``)."""

    ok: bool
    steps: int
    tensors: int
    counts: tuple
    max_abs: float
    max_rel: float
    mismatch: Mismatch | None
    rtol: float = 1e-3

    def text(self) -> str:
        if self.ok:
            grads, params, state = self.counts
            return (
                f"✓ equal to one process: {self.steps} steps, {self.tensors} tensors per step "
                f"(loss, {grads} gradients, {params} parameters, {state} optimizer state), "
                f"all within rounding (rtol {limit_text(self.rtol)})"
            )
        return f"✗ {self.mismatch.text()}"

    __repr__ = __str__ = text

    def __bool__(self) -> bool:
        return self.ok

    def check(self) -> None:
        """Raise AssertionError with the report's text unless ``ok``."""
        if not self.ok:
            raise AssertionError(self.text())


def _check_args(records, reference, atol, rtol) -> list:
    if isinstance(records, Recorder):
        raise InputTypeError(
            "compare() takes one recording per rank (a list): e.g. the list distlab.launch "
            "returns when every rank returns its Recorder"
        )
    records = list(records)
    if not records:
        raise InputError("compare() needs at least one rank's recording; got an empty list")
    for i, r in enumerate(records):
        if not isinstance(r, Recorder):
            raise InputTypeError(
                f"records[{i}] is a {type(r).__name__}, not a gradcheck.Recorder: return the "
                "Recorder from every rank"
            )
        if not r.steps:
            raise InputError(f"records[{i}] recorded no step: call recorder.record(step, ...)")
    if not isinstance(reference, Recorder):
        raise InputTypeError(
            "reference must be a Recorder, e.g. distlab.gpt.reference_run(config, steps=3); "
            f"got {type(reference).__name__}"
        )
    if not reference.steps:
        raise InputError("the reference recorded no step: call reference.record(step, ...)")
    for name, value in (("atol", atol), ("rtol", rtol)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise InputError(f"{name} must be a number >= 0, got {value!r}")
    return records


def compare(records, reference, *, atol: float = 1e-8, rtol: float = 1e-3) -> Report:
    """Compare each rank's recording with the one-process reference, step by step.

    Args:
        records: one `Recorder` per rank, in rank order (what ``distlab.launch`` returns when
            every rank returns its recorder). A tensor may be recorded by some ranks only (a
            pipeline stage records its own layers); each must be recorded by at least one.
        reference: the `Recorder` of one process, e.g. ``distlab.gpt.reference_run(...)``, with
            every step the ranks recorded.
        atol, rtol: a tensor passes when ``max|got - ref| <= atol + rtol * max|ref|``: the
            error is measured against the tensor's own scale (its largest magnitude), so tiny
            gradients are held to the same relative standard as large ones. Gradients of
            correct layouts of the tiny GPT in float32 agree to about 1e-6; planted mistakes
            are off by 3e-3 to 1. Two more allowances follow from the optimizer (SGD, Adam,
            AdamW; recorded with the state): a parameter or state element may differ besides
            by what the measured gradient differences can move it through the optimizer's
            update (Adam turns a rounding error in a gradient below its eps into a step of up
            to lr), and after a step whose parameters differ by a relative x, the next loss and
            gradients may differ by 4x more (at most 10 * rtol more). An optimizer it does not
            know gets neither.

    Returns:
        A `Report`: ``print(report)`` gives a ✓ line, or ✗ with the first tensor that differs,
        on which rank and step, the error, and a hint.

    Raises:
        TypeError: ``records`` is not a list of Recorders, or ``reference`` is not a Recorder.
        ValueError: an empty list, a recording (or reference) without steps, a negative
            tolerance, or a step the reference does not have (run it with more ``steps``).

    When both sides recorded their optimizer, its class and settings (lr, betas, eps,
    weight_decay, momentum...) are compared first at each step, and a difference is the
    mismatch ("the ranks' AdamW has lr=0.001, one process lr=0.01"), as is a parameter the
    ranks' optimizer does not hold.
    """
    records = _check_args(records, reference, atol, rtol)
    ranks = [r.rank if r.rank is not None else i for i, r in enumerate(records)]
    world = len(records)
    steps = sorted(set().union(*(r.steps for r in records)))
    missing = [s for s in steps if s not in reference.steps]
    if missing:
        raise InputError(
            f"the ranks recorded step {missing[0]} but the reference has steps "
            f"{sorted(reference.steps)}: run the reference with steps={max(steps) + 1}"
        )
    worst = [0.0, 0.0]
    first = reference.steps[steps[0]]
    counts = (len(first.grads), len(first.params), len(first.state))
    tensors = 1 + sum(counts)

    def report(mismatch=None):
        return Report(mismatch is None, len(steps), tensors, counts, worst[0], worst[1], mismatch,
                      rtol)

    drifts = {}  # (rank, name) -> optimizers.Drift: what rounding may have moved
    moved = 0.0  # how far the parameters were apart after the last step (relative)
    for step in steps:
        ref = reference.steps[step]
        for rank, rec in zip(ranks, records, strict=True):
            if step not in rec.steps:
                return report(Mismatch(step, "loss", f"step {step}", "missing", rank, (rank,),
                                       None, None, "this rank recorded other steps than the rest"))
        got = [rec.steps[step] for rec in records]
        losses = [g.loss for g in got if g.loss is not None]
        loss_error = None
        if ref.loss and losses:
            loss_error = max(abs(x - ref.loss) for x in losses) / abs(ref.loss)
        context = {"loss_error": loss_error, "drifts": drifts, "agree": set(),
                   "step_counts": _step_counts(ref, got, ranks)}
        for kind in _KINDS:
            if kind == "params":
                found = _compare_settings(step, ref, got, ranks, context)
                if found is not None:
                    return report(found)
                _follow(ref, got, ranks, drifts)
            # The loss and the gradients are computed at the parameters of the last step: where
            # those differ (by a relative `moved`, within what rounding through the optimizer
            # allows), so may they, up to 10x the tolerance.
            tol = rtol + min(GROWTH * moved, 10 * rtol) if kind in ("loss", "grads") else rtol
            found = _compare_kind(kind, step, ref, got, ranks, world, atol, tol, worst, context)
            if found is not None:
                return report(found)
        moved = _moved(ref, got)
    return report()


#: How much the relative difference of the gradients may grow per relative difference of the
#: parameters they are computed at. Correct layouts of the tiny GPT (tensor-parallel MLP by
#: hand, data-parallel by hand; five shapes; three CPU kernels) under AdamW, whose parameters
#: end a step apart by up to 5e-3 relative (gradients below its eps), compute gradients apart
#: by at most 0.3 times that at the next step, and 2.7 times within 8 steps. The growth stops
#: at 10x ``rtol`` (1e-2), so that a mistake that first shows at a later step is still seen.
GROWTH = 4.0


def _moved(ref, got) -> float:
    """The largest relative difference of any rank's parameters from one process's, each
    tensor against its own largest magnitude."""
    worst = 0.0
    for g in got:
        for name, target in ref.params.items():
            mine = g.params.get(name)
            if mine is None or target is None or mine.shape != target.shape or not mine.numel():
                continue
            worst = max(worst, _errors(mine, target)[1])
    return worst


def _step_counts(ref, got, ranks) -> dict:
    """(rank, name) -> (the rank's optimizer step count, one process's), where both have one."""
    counts = {}
    for rank, g in zip(ranks, got, strict=True):
        for name in ref.params:
            key = f"{name}.step"
            if key in g.state and key in ref.state and g.state[key].numel() == 1:
                counts[rank, name] = (int(g.state[key].item()), int(ref.state[key].item()))
    return counts


def _settings(step_record) -> dict:
    return getattr(step_record, "optimizer", None) or {}


def _compare_settings(step, ref, got, ranks, context):
    """The ranks' optimizer against one process's, parameter by parameter, where both recorded
    it: the same class and settings, and every parameter the reference optimizes held."""
    want = _settings(ref)
    if not want:
        return None
    agree = context["agree"]
    for rank, g in zip(ranks, got, strict=True):
        mine = _settings(g)
        if not mine:
            continue  # recorded without its optimizer: nothing to compare
        for name in ref.params:
            if name not in g.params or name not in want:
                continue
            if name not in mine:
                hint = (
                    "the ranks' optimizer never updates it: build the optimizer from "
                    "model.parameters() after the model is complete (after replacing layers, "
                    "fully_shard, DDP or parallelize_module), not from some of them"
                )
                return Mismatch(step, "params", name, "not optimized", rank, (rank,), None,
                                None, hint)
            why = differences(mine[name], want[name])
            if why is not None:
                hint = (
                    f"{why}: build the ranks' optimizer with one process's settings "
                    "(gpt.make_optimizer(model.parameters()) is what gpt.reference_run uses)"
                )
                return Mismatch(step, "params", name, "optimizer", rank, (rank,), None, None,
                                hint)
            agree.add((rank, name))
    return None


_STATE_KEYS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "step")


def _follow(ref, got, ranks, drifts) -> None:
    """Carry each rank's `Drift` through this step: how far this step's gradient differences
    (measured, rank by rank) can move its parameters and optimizer state."""
    want = _settings(ref)
    for rank, g in zip(ranks, got, strict=True):
        for name, target in ref.grads.items():
            setting = want.get(name)
            mine = g.grads.get(name)
            if setting is None or setting.get("kind") not in KNOWN or target is None:
                continue
            if mine is None or mine.shape != target.shape:
                continue
            state = {k: ref.state[f"{name}.{k}"] for k in _STATE_KEYS
                     if f"{name}.{k}" in ref.state}
            drift = drifts.setdefault((rank, name), Drift())
            drift.update((mine.double() - target.double()).abs(), target, state, setting)


def _allowance(kind: str, name: str, rank, drifts):
    """What `_follow` says this rank's tensor may differ by, element by element (0: nothing)."""
    if kind == "params":
        drift = drifts.get((rank, name))
        return 0.0 if drift is None else drift.params
    if kind == "state":
        base, _, key = name.rpartition(".")
        drift = drifts.get((rank, base))
        return 0.0 if drift is None else drift.state.get(key, 0.0)
    return 0.0


def _errors(got, ref):
    diff = (got.double() - ref.double()).abs()
    top = float(ref.double().abs().max()) if ref.numel() else 0.0
    abs_err = float(diff.max()) if diff.numel() else 0.0
    return abs_err, (abs_err / top if top else (0.0 if abs_err == 0 else float("inf")))


def _compare_kind(kind, step, ref, got, ranks, world, atol, rtol, worst, context):
    if kind == "loss":
        want = {"loss": None if ref.loss is None else torch.tensor(ref.loss, dtype=torch.float64)}
        have = [{"loss": torch.tensor(g.loss, dtype=torch.float64)} if g.loss is not None else {}
                for g in got]
    else:
        want = getattr(ref, kind)
        have = [getattr(g, kind) for g in got]
    suffix = _SUFFIX.get(kind, "")
    for rank, names in zip(ranks, have, strict=True):
        for name in names:
            if name not in want:
                hint = (
                    "a wrapper prefix the recorder does not know (give Recorder(rename=...)), "
                    "or a pipeline stage's layers numbered from 0 (give layer_offset)"
                )
                return Mismatch(step, kind, name + suffix, "unexpected", rank, (rank,), None,
                                None, hint)
    for name, target in want.items():
        if target is None and kind == "loss":
            continue
        holders = {r: h[name] for r, h in zip(ranks, have, strict=True) if name in h}
        if not holders:
            hint = (
                "no rank has it: every layer must live on some rank (pipeline stages: check "
                "layer_offset)"
                if kind != "loss" else "give the loss to record() on the rank that computes it"
            )
            return Mismatch(step, kind, name + suffix, "missing", None, (), None, None, hint)
        if target is None:  # the reference has no gradient here: neither may the ranks
            extra = [r for r, v in holders.items() if v is not None]
            if extra:
                return Mismatch(step, kind, name + suffix, "unexpected", extra[0], tuple(extra),
                                None, None, "one process computes no gradient for it")
            continue
        none = [r for r, v in holders.items() if v is None]
        if none:
            hint = (
                "it took no part in this rank's forward, or requires_grad is False, or "
                "zero_grad() ran before record()"
            )
            return Mismatch(step, kind, name + suffix, "no gradient", none[0], tuple(none),
                            None, None, hint)
        bad = []
        allow = {r: _allowance(kind, name, r, context["drifts"]) for r in holders}
        for r, v in holders.items():
            if v.shape != target.shape:
                bad.append(r)
                continue
            abs_err, rel_err = _errors(v, target)
            if close(v, target, atol, rtol, allow[r]):
                worst[0], worst[1] = max(worst[0], abs_err), max(worst[1], rel_err)
            else:
                bad.append(r)
        if bad:
            v = holders[bad[0]]
            base = name.rpartition(".")[0] if kind == "state" else name
            steps_hint = _step_count_hint(kind, base, bad[0], step, context)
            if steps_hint is not None:
                abs_err, rel_err = _errors(v, target) if v.shape == target.shape else (None, None)
                return Mismatch(step, kind, name + suffix, "differs", bad[0], tuple(bad),
                                abs_err, rel_err, steps_hint)
            siblings = {n + suffix: t for n, t in want.items() if n != name and t is not None
                        and t.shape == target.shape}
            agree = all((r, base) in context["agree"] for r in bad)
            hint = diagnose(kind, holders, target, world=world, atol=atol, rtol=rtol,
                            siblings=siblings, loss_error=context["loss_error"], allow=allow,
                            settings_agree=agree and kind in ("params", "state"))
            if v.shape != target.shape:
                return Mismatch(step, kind, name + suffix, "shape", bad[0], tuple(bad), None,
                                None, hint)
            abs_err, rel_err = _errors(v, target)
            return Mismatch(step, kind, name + suffix, "differs", bad[0], tuple(bad), abs_err,
                            rel_err, hint)
    return None


def _step_count_hint(kind, name, rank, step, context):
    """When a parameter differs and the optimizer's own step count does too, say that."""
    counts = context.get("step_counts", {}).get((rank, name))
    if kind != "params" or counts is None:
        return None
    mine, theirs = counts
    if mine == theirs:
        return None
    return (
        f"the ranks' optimizer has taken {mine} step{'s' if mine != 1 else ''} for it, one "
        f"process {theirs}: optimizer.step() skipped or called more than once per training "
        "step (record() after each optimizer.step())"
    )
