"""distlab.gradcheck and the optimizer: gradients that agree to rounding pass through AdamW and
SGD, and `optimizers.Drift`'s allowance for each state tensor and parameter is never less than
what a difference in the gradients really moves, nor far more.
"""

from __future__ import annotations

import pytest
import torch
from test_gradcheck import BATCH, CONFIG, OTHER_SHAPES, STEPS
from torch import nn

from distlab import gpt, gradcheck

quick = pytest.mark.quick


def _noisy_run(config, optimizer, noise, steps=STEPS):
    """One process, with every nonzero gradient entry moved by up to ``noise`` times the
    tensor's largest entry before each step: what another layout's float32 rounding does to
    the gradients (a sum in another order), as a seeded random draw."""
    model = gpt.GPT(config, seed=0)
    opt = gpt.make_optimizer(model.parameters(), optimizer)
    recorder = gradcheck.Recorder()
    g = torch.Generator().manual_seed(0)
    for step in range(steps):
        tokens, targets = gpt.batch(step, BATCH, config)
        loss = gpt.loss(model(tokens), targets)
        loss.backward()
        for p in model.parameters():
            jitter = torch.rand(p.shape, generator=g) * 2 - 1
            p.grad += jitter * noise * p.grad.abs().max() * (p.grad != 0)
        opt.step()
        recorder.record(step, loss, model, opt)
        opt.zero_grad()
    return recorder


@quick
@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
@pytest.mark.parametrize("config", [CONFIG, OTHER_SHAPES[0]], ids=["default", "issue-33"])
def test_gradients_that_agree_to_rounding_pass_through_the_optimizer(config, optimizer):
    # Before issue #33's fix, AdamW turned noise of 1e-7 (issue's shape) or 1e-6 (default) of a
    # gradient's largest entry into a parameter difference of 1e-3 relative: "the gradients
    # agree but the update does not".
    reference = gpt.reference_run(config, STEPS, optimizer=optimizer)
    for noise in (1e-7, 1e-6):
        report = gradcheck.compare([_noisy_run(config, optimizer, noise)], reference)
        assert report.ok, (noise, report.text())
        assert str(report).endswith("all within rounding (rtol 1e-3)")  # no digits of the CPU
    # Noise far beyond rounding is still a difference, in the gradients themselves.
    m = gradcheck.compare([_noisy_run(config, optimizer, 3e-3)], reference).mismatch
    assert (m.kind, m.step) == ("grads", 0)


def _apart(make, steps=6, seed=0):
    """Two copies of a parameter stepped by ``make``'s optimizer on gradients that differ, a
    lot where a quarter of the entries are far below Adam's eps: how far the parameters end up
    beyond what `optimizers.Drift` allows (<= 0: never)."""
    from distlab.gradcheck.optimizers import Drift, settings

    g = torch.Generator().manual_seed(seed)
    start = torch.randn(400, generator=g) * 0.05
    a, b = nn.Parameter(start.clone()), nn.Parameter(start.clone())
    opt_a, opt_b = make([a]), make([b])
    setting = settings(opt_a, {id(a): "p"})["p"]
    drift, beyond = Drift(), -1.0
    for _ in range(steps):
        grad = torch.randn(400, generator=g) * 1e-2
        grad[:100] *= 1e-7
        noise = torch.rand(400, generator=g) * 2 - 1
        other = torch.where(torch.arange(400) < 200, grad * noise,
                            grad + noise * 1e-7 * grad.abs().max())
        a.grad, b.grad = grad.clone(), other.clone()
        opt_a.step()
        opt_b.step()
        drift.update((other.double() - grad.double()).abs(), grad, dict(opt_a.state[a]), setting)
        apart = (b.detach().double() - a.detach().double()).abs()
        beyond = max(beyond, float((apart - drift.params - 1e-7).max()))
    return beyond


@quick
@pytest.mark.parametrize(
    "make",
    [
        lambda p: torch.optim.AdamW(p, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1),
        lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1),
        lambda p: torch.optim.AdamW(p, lr=1e-2, amsgrad=True),
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    ],
    ids=["adamw", "adam-weight-decay", "amsgrad", "sgd-momentum", "sgd-nesterov"],
)
def test_the_allowance_is_never_less_than_what_the_optimizer_really_moved(make):
    # Gradients 0 to 200% apart (a rank's rounding is far less): the parameters of two copies
    # never end further apart than Drift allows, in any step.
    assert max(_apart(make, seed=seed) for seed in range(4)) <= 0


def _run_two(make, gradients, steps, seed):
    """Two float64 copies of a parameter stepped by ``make``'s optimizer, one on the reference's
    gradients and one on ``gradients(grad, generator)``'s, with `optimizers.Drift` following
    them; per step, ``(drift, first copy, second copy, their optimizers)``. float64 so that
    what the copies differ by is the gradients' difference, not the optimizer's own rounding."""
    from distlab.gradcheck.optimizers import Drift, settings

    g = torch.Generator().manual_seed(seed)
    start = torch.randn(400, generator=g, dtype=torch.float64) * 0.05
    a, b = nn.Parameter(start.clone()), nn.Parameter(start.clone())
    opt_a, opt_b = make([a]), make([b])
    setting = settings(opt_a, {id(a): "p"})["p"]
    drift = Drift()
    for step in range(steps):
        grad, other = gradients(step, g)
        a.grad, b.grad = grad.clone(), other.clone()
        opt_a.step()
        opt_b.step()
        drift.update((other - grad).abs(), grad, dict(opt_a.state[a]), setting)
        yield drift, a, b, opt_a.state[a], opt_b.state[b]


def _far_apart(step, g):
    # 0 to 300% apart, either sign, a quarter of the entries far below Adam's eps
    grad = torch.randn(400, generator=g, dtype=torch.float64) * 1e-2
    grad[:100] *= 1e-7
    return grad, grad * (1 + torch.rand(400, generator=g, dtype=torch.float64) * 4 - 2)


@quick
@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize(
    "make",
    [
        lambda p: torch.optim.AdamW(p, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1),
        lambda p: torch.optim.AdamW(p, lr=1e-2, amsgrad=True),
        lambda p: torch.optim.Adam(p, lr=1e-2, betas=(0.9, 0.5), amsgrad=True),
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    ],
    ids=["adamw", "amsgrad", "amsgrad-short-memory", "sgd-momentum"],
)
def test_every_optimizer_state_stays_within_its_allowance_whatever_the_gradients(make, seed):
    # Generated cases (seeded): what each state tensor (exp_avg, exp_avg_sq, AMSGrad's
    # max_exp_avg_sq, the momentum buffer) of two copies differs by is never more than Drift
    # allows it, at any step. v's allowance needs the squared difference of the gradients,
    # (g + d)^2 - g^2 = 2 g d + d^2, and AMSGrad's running maximum the largest of v's so far.
    # (Not Adam with weight decay in the gradient: v then sees g + wd p, and Drift is not
    # given p; its exp_avg_sq allowance is known to fall short there.)
    for step, (drift, a, b, state_a, state_b) in enumerate(
            _run_two(make, _far_apart, steps=6, seed=seed)):
        for key, allowed in drift.state.items():
            if key not in state_a:
                continue
            mine, ref = state_b[key].double(), state_a[key].double()
            over = (mine - ref).abs() - allowed - 1e-9 * (mine.abs() + ref.abs())
            assert float(over.max()) <= 0, f"{key} at step {step}: {float(over.max()):.3g} over"
        apart = (b.detach() - a.detach()).abs()
        assert float((apart - drift.params - 1e-12).max()) <= 0, f"parameter at step {step}"


def _burst_then_quiet(step, g):
    # One large gradient, then small ones: v falls far below its running maximum. The rank's
    # gradient is off by the same small amount everywhere, the worst case for the update.
    grad = torch.randn(400, generator=g, dtype=torch.float64) * (1.0 if step == 0 else 1e-4)
    return grad, grad + 1e-7


@quick
def test_amsgrads_allowance_is_close_to_what_a_gradient_difference_really_moves():
    # Not too loose either: a loose allowance hides a real mistake. AMSGrad divides by v's
    # running maximum, far above v here; an allowance that took v instead would be
    # thousands of times too loose.
    def make(p):
        return torch.optim.Adam(p, lr=1e-3, betas=(0.9, 0.5), amsgrad=True)

    for seed in range(3):
        *_, (drift, a, b, _, _) = _run_two(make, _burst_then_quiet, steps=30, seed=seed)
        apart = (b.detach() - a.detach()).abs()
        ratio = drift.params / apart
        assert float(ratio.min()) >= 1, "the allowance is less than what really moved"
        assert float(ratio.max()) < 2, f"the allowance is {float(ratio.max()):.1f}x too loose"
