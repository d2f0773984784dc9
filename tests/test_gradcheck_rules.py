"""distlab.gradcheck's rules, in one process: a recording compared with copies of itself, each
changed the way a layout's mistake changes it (an extra division, a forgotten one, chunks in
another order, partial sums, a missing gradient), and what compare() and the Recorder refuse.
"""

from __future__ import annotations

import pickle

import pytest
import torch
from test_gradcheck import BATCH, CONFIG, STEPS
from torch import nn

from distlab import gpt, gradcheck
from distlab.gradcheck.hints import shape_hint

quick = pytest.mark.quick


@pytest.fixture(scope="module")
def reference():
    return gpt.reference_run(CONFIG, STEPS, batch_size=BATCH)


def _copy(recorder):
    return pickle.loads(pickle.dumps(recorder))


@quick
def test_the_hint_blames_the_optimizer_only_when_it_cannot_know_it(reference):
    mine = _copy(reference)
    mine.steps[0].params["norm.weight"] = mine.steps[0].params["norm.weight"] + 0.05
    m = gradcheck.compare([mine], reference).mismatch
    assert (m.name, m.kind, m.step) == ("norm.weight", "params", 0)
    assert "the optimizer has one process's settings" in m.hint
    assert "hyperparameters" not in m.hint and "another optimizer" not in m.hint
    for step in mine.steps.values():  # recorded without the optimizer: it may be the cause
        step.optimizer = {}
    m = gradcheck.compare([mine], reference).mismatch
    assert "another optimizer or hyperparameters" in m.hint


@quick
def test_settings_are_recorded_and_compared_parameter_by_parameter():
    ten = gpt.reference_run(CONFIG, 2, lr=1e-2)
    assert ten.steps[0].optimizer["head.weight"] == {
        "kind": "AdamW", "lr": 0.01, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1,
        "amsgrad": False, "maximize": False, "decoupled_weight_decay": True,
    }
    m = gradcheck.compare([gpt.reference_run(CONFIG, 2, lr=1e-3)], ten).mismatch
    assert (m.name, m.problem) == ("tok.weight", "optimizer")
    assert "the ranks' AdamW has lr=0.001, one process lr=0.01" in m.hint
    sgd = gpt.reference_run(CONFIG, 2, optimizer="sgd", lr=0.1)
    assert sgd.steps[1].optimizer["pos.weight"]["momentum"] == 0.9
    assert "has lr=0.01, one process lr=0.1" in gradcheck.compare(
        [gpt.reference_run(CONFIG, 2, optimizer="sgd")], sgd).mismatch.hint


@quick
def test_reference_equals_itself_in_one_line(reference):
    report = gradcheck.compare([_copy(reference)], reference)
    assert report.ok and bool(report) and report.mismatch is None
    assert str(report) == (
        "✓ equal to one process: 3 steps, 126 tensors per step (loss, 25 gradients, "
        "25 parameters, 75 optimizer state), all within rounding (rtol 1e-3)"
    )
    assert report.max_abs == report.max_rel == 0
    assert "rtol 0.02" in str(gradcheck.compare([_copy(reference)], reference, rtol=0.02))
    report.check()


@quick
def test_the_first_difference_in_step_loss_grad_param_state_order_is_named(reference):
    mine = _copy(reference)
    mine.steps[2].loss += 1.0
    mine.steps[1].state["norm.weight.exp_avg"] *= 3
    mine.steps[1].params["layers.1.attn.wv.weight"] += 1.0
    assert gradcheck.compare([mine], reference).mismatch.name == "layers.1.attn.wv.weight"
    mine.steps[1].grads["layers.1.mlp.w2.weight"] *= -1
    mine.steps[1].grads["layers.0.attn.wq.weight"] *= -1
    m = gradcheck.compare([mine], reference).mismatch
    assert (m.name, m.step, m.kind) == ("layers.0.attn.wq.weight.grad", 1, "grads")
    assert "the negative of the reference" in m.hint
    mine.steps[0].state["tok.weight.exp_avg_sq"] *= 0.75
    m = gradcheck.compare([mine], reference).mismatch
    assert (m.name, m.step) == ("tok.weight.exp_avg_sq", 0) and "exactly 3/4x" in m.hint
    with pytest.raises(AssertionError, match="tok.weight.exp_avg_sq differs"):
        gradcheck.compare([mine], reference).check()


@quick
def test_one_over_world_size_is_an_extra_division(reference):
    ranks = [_copy(reference) for _ in range(4)]
    for r in ranks:
        r.steps[0].grads["pos.weight"] /= 4
    m = gradcheck.compare(ranks, reference).mismatch
    assert (m.name, m.ranks) == ("pos.weight.grad", (0, 1, 2, 3))
    assert "exactly 1/4 of the reference" in m.hint and "once too often" in m.hint


@quick
def test_world_size_times_the_reference_is_a_forgotten_division(reference):
    ranks = [_copy(reference) for _ in range(3)]
    for r in ranks:
        r.steps[0].grads["layers.0.mlp.w1.weight"] *= 3
    m = gradcheck.compare(ranks, reference).mismatch
    assert m.name == "layers.0.mlp.w1.weight.grad" and m.max_rel == pytest.approx(2.0)
    assert "exactly 3x the reference" in m.hint and "forgotten division" in m.hint


@quick
def test_chunks_in_another_order_are_named_as_such(reference):
    mine = _copy(reference)
    g = reference.steps[0].grads["layers.1.mlp.w2.weight"]  # (32, 128)
    mine.steps[0].grads["layers.1.mlp.w2.weight"] = torch.cat(g.chunk(2, 1)[::-1], 1)
    m = gradcheck.compare([mine, _copy(reference)], reference).mismatch
    assert "its 2 chunks along dim 1 are the reference's in the order [1, 0]" in m.hint
    mine.steps[0].grads["layers.1.mlp.w2.weight"] = torch.cat([g.chunk(2, 1)[0]] * 2, 1)
    m = gradcheck.compare([mine, _copy(reference)], reference).mismatch
    assert "its 2 chunks along dim 1 are the reference's chunks [0, 0]" in m.hint


@quick
def test_ranks_that_add_up_to_the_reference_hold_partial_sums(reference):
    ranks = [_copy(reference) for _ in range(2)]
    g = reference.steps[0].grads["norm.weight"]
    ranks[0].steps[0].grads["norm.weight"] = g * 0.25
    ranks[1].steps[0].grads["norm.weight"] = g * 0.75
    m = gradcheck.compare(ranks, reference).mismatch
    assert "their sum is the reference" in m.hint


@quick
def test_only_the_ranks_that_differ_are_named(reference):
    ranks = [_copy(reference) for _ in range(3)]
    ranks[2].steps[0].grads["norm.bias"] = ranks[2].steps[0].grads["norm.bias"] * 2
    m = gradcheck.compare(ranks, reference).mismatch
    assert (m.name, m.rank, m.ranks) == ("norm.bias.grad", 2, (2,))
    assert "only rank 2 differs, ranks 0, 1 agree with one process" in m.hint


@quick
def test_interleaved_rows_are_named_as_a_permutation(reference):
    mine = _copy(reference)
    g = reference.steps[0].grads["head.weight"]  # (64, 32)
    mine.steps[0].grads["head.weight"] = torch.cat([g[0::2], g[1::2]])
    m = gradcheck.compare([mine, _copy(reference)], reference).mismatch
    assert "its slices along dim 0 are the reference's, permuted (0, 2, 4" in m.hint


@quick
@pytest.mark.parametrize(
    "got, want, says",
    [
        ((16, 32), (32, 32), "dim 0 is 1/2 of the reference's"),
        ((32, 64), (32, 32), "dim 1 is 2x the reference's"),
        ((64, 16), (32, 32), "sharded along dim 1 was gathered along dim 0"),
        ((128, 32), (32, 128), "transposed"),
        ((1024,), (32, 32), "1 dims instead of 2"),
    ],
)
def test_shape_hints_name_the_dim(got, want, says):
    assert says in shape_hint(got, want)


@quick
def test_missing_unexpected_and_absent_gradients_are_named(reference):
    mine = _copy(reference)
    del mine.steps[0].params["norm.bias"]
    m = gradcheck.compare([mine], reference).mismatch
    assert (m.name, m.problem, m.rank) == ("norm.bias", "missing", None)
    mine = _copy(reference)
    mine.steps[0].grads["module.norm.bias"] = mine.steps[0].grads["norm.bias"]
    m = gradcheck.compare([mine], reference).mismatch
    assert (m.name, m.problem) == ("module.norm.bias.grad", "unexpected")
    mine = _copy(reference)
    mine.steps[1].grads["pos.weight"] = None
    m = gradcheck.compare([mine], reference).mismatch
    assert (m.name, m.problem, m.step) == ("pos.weight.grad", "no gradient", 1)
    assert "pos.weight.grad is None on rank 0 at step 1" in str(gradcheck.compare([mine],
                                                                                  reference))


@quick
def test_records_travel_without_their_process_groups():
    recorder = gradcheck.Recorder(rename=lambda n: n, shards={"x": 0})
    back = pickle.loads(pickle.dumps(recorder))
    assert back._rename is None and back.shards == {"x": 0} and back.steps == {}


@quick
def test_names_drop_wrappers_and_shift_layers():
    assert gradcheck.clean_name("module.layers.1.attn.wq.weight", 2) == "layers.3.attn.wq.weight"
    assert gradcheck.clean_name("_orig_mod.layers.0._checkpoint_wrapped_module.ln1.bias") == (
        "layers.0.ln1.bias"
    )
    assert gradcheck.clean_name("layers.10.mlp.w1.weight", 1) == "layers.11.mlp.w1.weight"


@quick
def test_an_optimizer_built_before_the_model_changed_is_refused():
    model = gpt.GPT(CONFIG)
    opt = gpt.make_optimizer(model.parameters())
    model.norm.weight = nn.Parameter(model.norm.weight.detach().clone())  # as fully_shard does
    with pytest.raises(ValueError, match="build the optimizer after fully_shard"):
        gradcheck.Recorder().record(0, 1.0, model, opt)


@quick
def test_recorder_refuses_a_step_twice_and_bad_arguments():
    model = gpt.GPT(CONFIG)
    recorder = gradcheck.Recorder()
    recorder.record(0, torch.tensor(2.0), model)
    assert recorder.losses == [2.0] and recorder.steps[0].grads["tok.weight"] is None
    with pytest.raises(ValueError, match="step 0 was recorded already"):
        recorder.record(0, 2.0, model)
    with pytest.raises(TypeError, match="must be a torch.nn.Module"):
        recorder.record(1, 2.0, model.state_dict())
    with pytest.raises(ValueError, match="layer_offset must be an int >= 0"):
        gradcheck.Recorder(layer_offset=-1)
    with pytest.raises(ValueError, match="must be a dim"):
        gradcheck.Recorder(shards={"*.w1.weight": "0"})


@quick
def test_compare_refuses_what_it_cannot_compare(reference):
    with pytest.raises(TypeError, match="one recording per rank"):
        gradcheck.compare(reference, reference)
    with pytest.raises(ValueError, match="empty list"):
        gradcheck.compare([], reference)
    with pytest.raises(TypeError, match="reference must be a Recorder"):
        gradcheck.compare([reference], None)
    with pytest.raises(ValueError, match="atol must be a number >= 0"):
        gradcheck.compare([reference], reference, atol=-1)
    longer = gpt.reference_run(CONFIG, STEPS + 1, batch_size=BATCH)
    with pytest.raises(ValueError, match="run the reference with steps=4"):
        gradcheck.compare([longer], reference)


@quick
def test_a_passing_report_gives_the_largest_errors_it_met(reference):
    # Errors within tolerance, planted where they are known: the largest absolute one in a
    # parameter at step 2, the largest relative one in a gradient at step 0.
    mine = _copy(reference)
    grad = mine.steps[0].grads["norm.bias"]
    grad[0] += 4e-4 * grad.abs().max()  # relative 4e-4, tiny in absolute terms
    param = mine.steps[2].params["head.weight"]
    param[0, 0] += 2e-5
    report = gradcheck.compare([mine], reference)
    assert report.ok, report.text()
    want_abs = float((param.double() - reference.steps[2].params["head.weight"].double()).abs()
                     .max())
    ref_grad = reference.steps[0].grads["norm.bias"].double()
    want_rel = float((grad.double() - ref_grad).abs().max() / ref_grad.abs().max())
    assert report.max_abs == pytest.approx(want_abs, rel=1e-9)
    assert report.max_rel == pytest.approx(want_rel, rel=1e-9)


@quick
def test_a_mistake_is_named_where_it_starts_the_loss_before_its_gradients(reference):
    # A forward mistake moves the loss and every gradient after it: the loss is named.
    mine = _copy(reference)
    mine.steps[0].loss += 0.5
    mine.steps[0].grads["tok.weight"] = mine.steps[0].grads["tok.weight"] * 2
    m = gradcheck.compare([mine], reference).mismatch
    assert (m.name, m.kind, m.step) == ("loss", "loss", 0)
