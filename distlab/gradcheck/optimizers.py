"""How far rounding in the gradients can move the parameters and the optimizer state.

Two correct layouts compute gradients that agree to float32 rounding, not bit for bit: a sum
split over ranks adds in another order. SGD passes that difference on to the parameters
unchanged (times the learning rate). Adam does not: it divides each entry by ``sqrt(v) + eps``,
so an entry whose gradient is about ``eps`` or smaller (1e-9 against eps 1e-8) turns a rounding
error of that size into a step of up to ``lr``, in either layout. Comparing parameters with one
tolerance for the whole tensor then calls a correct layout wrong.

This module knows the update rules of SGD, Adam and AdamW (torch's), and says, element by
element, how much of a parameter's (or optimizer state's) difference the *measured* gradient
differences can explain: `Drift` follows them step by step (bounds, not first-order guesses:
the denominator is taken at its smallest), capped by what two updates can be apart at all
(about ``2 * lr`` per step for Adam). `settings` reads what the rules
need from an optimizer's ``param_groups``; `differences` says how two optimizers' settings
differ. An optimizer it does not know gets no allowance: its parameters are compared as before.
`distlab.gradcheck.compare` uses all three; nothing here decides whether a tensor differs.
"""

from __future__ import annotations

import math

import torch

__all__ = ["KNOWN", "Drift", "differences", "settings"]

#: The optimizers whose update rules `Drift` follows (class names).
KNOWN = ("SGD", "Adam", "AdamW")

#: What a parameter's update depends on, as ``param_groups`` name it (those an optimizer has).
_KEYS = ("lr", "betas", "eps", "weight_decay", "momentum", "dampening", "nesterov", "amsgrad",
         "maximize", "decoupled_weight_decay")


def _plain(value):
    """A setting as a plain Python value: a tensor lr becomes a float, betas a tuple."""
    if isinstance(value, torch.Tensor):
        return float(value)
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    return value


def settings(optimizer, names: dict) -> dict:
    """``{parameter name: {"kind": class name, "lr": ..., ...}}`` for every parameter the
    optimizer holds whose ``id`` is in ``names`` (id -> name): the optimizer's class and the
    settings of its parameter group that the update depends on."""
    kind = type(optimizer).__name__
    out = {}
    for group in optimizer.param_groups:
        chosen = {"kind": kind, **{k: _plain(group[k]) for k in _KEYS if k in group}}
        for p in group["params"]:
            if id(p) in names:
                out[names[id(p)]] = dict(chosen)
    return out


def _show(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return "(" + ", ".join(_show(v) for v in value) + ")"
    return repr(value)


def differences(mine: dict, reference: dict) -> str | None:
    """How the ranks' settings of one parameter (``mine``) differ from one process's, in words
    ("the ranks' AdamW has lr=0.001, one process lr=0.01"), or None when they agree."""
    if mine.get("kind") != reference.get("kind"):
        return f"the ranks' optimizer is {mine.get('kind')}, one process's {reference.get('kind')}"
    kind = mine["kind"]
    for key in _KEYS:
        a, b = mine.get(key), reference.get(key)
        same = a == b or (isinstance(a, (int, float)) and isinstance(b, (int, float))
                          and math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0))
        if not same:
            return f"the ranks' {kind} has {key}={_show(a)}, one process {key}={_show(b)}"
    return None


def _bound(b1: float, b2: float, t: int) -> float:
    """The largest |m̂| / sqrt(v̂) Adam can reach at step t (Cauchy-Schwarz over the gradients
    so far): 1 at the first step, about 1.2 later for betas (0.9, 0.95)."""
    if b2 <= 0.0 or b2 >= 1.0 or b1 >= 1.0:
        return 1.0
    terms = sum((b1 * b1 / b2) ** k for k in range(t))
    return (1 - b1) / (1 - b1**t) * math.sqrt((1 - b2**t) / (1 - b2) * terms)


class Drift:
    """The differences that gradient rounding can cause, followed step by step for one
    parameter on one rank (all tensors float64, element by element).

    ``update(grad_diff, grad, state, setting)`` takes this step's measured gradient
    difference ``|g_rank - g_ref|``, the reference's gradient, its optimizer state after the
    step (``{"exp_avg": ..., "step": ...}``) and the optimizer's settings; then ``params`` is
    what the parameter may differ by, and ``state[key]`` what each state tensor may (0 where
    nothing is known: an unknown optimizer keeps today's rule, one tolerance per tensor)."""

    def __init__(self):
        self.params = 0.0
        self.state: dict = {}
        self._m = self._v = self._v_peak = self._buf = 0.0
        self._steps = 0

    def update(self, grad_diff, grad, state: dict, setting: dict) -> None:
        kind = setting.get("kind")
        if kind not in KNOWN:
            self.params, self.state = 0.0, {}
            return
        self._steps += 1
        step = int(state["step"]) if isinstance(state.get("step"), torch.Tensor) else self._steps
        dg, g = grad_diff.double(), grad.double()
        wd, lr = float(setting.get("weight_decay", 0.0)), float(setting.get("lr", 0.0))
        if kind == "SGD":
            dg = dg + wd * self.params  # weight decay adds wd * p to the gradient
            momentum = float(setting.get("momentum", 0.0))
            if momentum:
                damp = 1.0 - float(setting.get("dampening", 0.0))
                self._buf = momentum * self._buf + damp * dg if step > 1 else dg
                step_diff = dg + momentum * self._buf if setting.get("nesterov") else self._buf
                self.state = {"momentum_buffer": self._buf}
            else:
                step_diff = dg
            self.params = self.params + lr * step_diff
            return
        b1, b2 = setting.get("betas", (0.9, 0.999))
        eps = float(setting.get("eps", 1e-8))
        decoupled = setting.get("decoupled_weight_decay", kind == "AdamW")
        if wd and not decoupled:  # Adam: weight decay goes into the gradient
            dg = dg + wd * self.params
        self._m = b1 * self._m + (1 - b1) * dg
        self._v = b2 * self._v + (1 - b2) * (2 * g.abs() * dg + dg * dg)
        # AMSGrad divides by the running maximum of v: two running maxima differ by at most the
        # largest difference of v so far, which can be larger than this step's.
        self._v_peak = torch.maximum(torch.as_tensor(self._v_peak, dtype=torch.float64), self._v)
        m = state.get("exp_avg")
        amsgrad = bool(setting.get("amsgrad"))
        v = state.get("max_exp_avg_sq") if amsgrad else state.get("exp_avg_sq")
        self.state = {"exp_avg": self._m, "exp_avg_sq": self._v, "max_exp_avg_sq": self._v_peak}
        if m is None or v is None:
            return
        m, v = m.double().abs(), v.double()
        bc1, bc2 = 1 - b1**step, 1 - b2**step
        dv = torch.as_tensor(self._v_peak if amsgrad else self._v, dtype=torch.float64)
        dv = dv.expand_as(v)
        root, low = v.sqrt(), (v - dv).clamp(min=0).sqrt()  # the rank's sqrt(v) is >= low
        denom = root / math.sqrt(bc2) + eps
        least = low / math.sqrt(bc2) + eps
        # |m'/D' - m/D| <= |m' - m| / D' + |m| |D - D'| / (D D'), and D' >= `least`
        change = lr / bc1 * (self._m / least + m * (root - low) / math.sqrt(bc2) / (denom * least))
        cap = 2 * lr * _bound(b1, b2, step)  # two updates, each at most lr * bound, apart
        self.params = self.params + change.clamp(max=cap)
