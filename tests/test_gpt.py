"""distlab.gpt: the tiny GPT of Part III, its batches and its one-process reference run."""

from __future__ import annotations

import math
import time

import pytest
import torch

from distlab import gpt

pytestmark = pytest.mark.quick

NAMES = (
    ["tok.weight", "pos.weight"]
    + [
        f"layers.{i}.{name}"
        for i in range(2)
        for name in (
            "ln1.weight", "ln1.bias", "attn.wq.weight", "attn.wk.weight", "attn.wv.weight",
            "attn.wo.weight", "ln2.weight", "ln2.bias", "mlp.w1.weight", "mlp.w2.weight",
        )
    ]
    + ["norm.weight", "norm.bias", "head.weight"]
)


def test_parameter_names_are_the_ones_every_layout_maps_to():
    model = gpt.GPT()
    assert [name for name, _ in model.named_parameters()] == NAMES
    assert sum(p.numel() for p in model.parameters()) == 29_504
    tied = gpt.GPT(gpt.Config(tied=True))
    assert tied.head.weight is tied.tok.weight
    assert [name for name, _ in tied.named_parameters()] == NAMES[:-1]  # one tensor, one name


def test_the_same_seed_gives_the_same_model_whatever_the_global_rng():
    torch.manual_seed(1)
    a = gpt.GPT(seed=3)
    torch.manual_seed(2)
    b = gpt.GPT(seed=3)
    c = gpt.GPT(seed=4)
    for (name, p), q, r in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(p, q), name
        if name.endswith(".weight") and ".ln" not in name and not name.startswith("norm"):
            assert not torch.equal(p, r), name
    # GPT-2's init: std 0.02, and 0.02 / sqrt(2 * n_layers) = 0.01 for the output projections
    assert a.layers[0].attn.wq.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert a.layers[0].attn.wo.weight.std().item() == pytest.approx(0.01, rel=0.1)
    assert a.layers[1].mlp.w2.weight.std().item() == pytest.approx(0.01, rel=0.1)


@pytest.mark.parametrize("tp", [2, 4])
def test_attention_split_by_heads_adds_up_to_the_whole(tp):
    # What tensor parallelism does to one block: rank r keeps rows of wq/wk/wv (its heads) and
    # the matching columns of wo; the partial outputs of the ranks sum to the whole output.
    # It works because Attention reshapes with -1 heads.
    attn = gpt.GPT(seed=0).layers[0].attn
    x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(0))
    whole = attn(x)
    parts = []
    for r in range(tp):
        part = gpt.Attention(gpt.Config())
        with torch.no_grad():
            for w in ("wq", "wk", "wv"):
                getattr(part, w).weight = torch.nn.Parameter(
                    getattr(attn, w).weight.chunk(tp, 0)[r].clone()
                )
            part.wo.weight = torch.nn.Parameter(attn.wo.weight.chunk(tp, 1)[r].clone())
        parts.append(part(x))
    torch.testing.assert_close(sum(parts), whole, rtol=1e-5, atol=1e-6)


def test_fused_attention_computes_what_the_written_out_one_does():
    tokens, _ = gpt.batch(0, 4)
    written = gpt.GPT(gpt.Config())(tokens)
    fused = gpt.GPT(gpt.Config(sdpa=True))(tokens)
    torch.testing.assert_close(fused, written, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sdpa", [False, True], ids=["written-out", "sdpa"])
def test_the_model_runs_in_bf16_and_computes_what_fp32_does(sdpa):
    # gpt.GPT(config).to(torch.bfloat16): the written-out attention's causal mask takes the
    # scores' dtype (a float32 mask made the scores float32: "expected m1 and m2 to have the
    # same dtype" at probs @ V).
    config = gpt.Config(sdpa=sdpa)
    tokens, targets = gpt.batch(0, 4, config)
    fp32 = gpt.GPT(config)(tokens)
    model = gpt.GPT(config).to(torch.bfloat16)
    logits = model(tokens)
    assert logits.dtype == torch.bfloat16
    torch.testing.assert_close(logits.float(), fp32, rtol=0.05, atol=0.02)
    gpt.loss(logits, targets).backward()
    assert all(p.grad.dtype == torch.bfloat16 for p in model.parameters())


def test_attention_is_causal():
    model = gpt.GPT()
    tokens, _ = gpt.batch(0, 2)
    changed = tokens.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 64
    torch.testing.assert_close(model(changed)[:, :10], model(tokens)[:, :10])
    assert not torch.allclose(model(changed)[:, 10:], model(tokens)[:, 10:])


def test_pipeline_stages_chain_to_the_whole_model():
    tokens, _ = gpt.batch(0, 4)
    whole = gpt.GPT()(tokens)
    first, second = gpt.GPT(), gpt.GPT()
    first.layers = torch.nn.ModuleList(first.layers[:1])
    first.norm = first.head = None
    second.layers = torch.nn.ModuleList(second.layers[1:])  # renumbered: layers.0
    second.tok = second.pos = None
    hidden = first(tokens)
    assert hidden.shape == (4, 16, 32)
    torch.testing.assert_close(second(hidden), whole)
    assert "layers.0.ln1.weight" in dict(second.named_parameters())


def test_batches_are_deterministic_and_follow_one_successor_table():
    tokens, targets = gpt.batch(5, 8, gpt.Config(), seed=1)
    again, _ = gpt.batch(5, 8, gpt.Config(), seed=1)
    assert tokens.shape == targets.shape == (8, 16) and tokens.dtype == torch.int64
    assert torch.equal(tokens, again)
    assert not torch.equal(tokens, gpt.batch(6, 8, gpt.Config(), seed=1)[0])
    assert torch.equal(tokens[:, 1:], targets[:, :-1])
    # Each token is always followed by the same one: a function a model can learn.
    successor = {}
    for a, b in zip(tokens.flatten().tolist(), targets.flatten().tolist(), strict=True):
        assert successor.setdefault(a, b) == b
    other, _ = gpt.batch(5, 8, gpt.Config(), seed=2)
    assert not torch.equal(tokens, other)
    assert tokens.untyped_storage().data_ptr() != targets.untyped_storage().data_ptr()


def test_reference_run_records_every_step_and_the_loss_falls():
    ref = gpt.reference_run(steps=10)
    assert abs(ref.losses[0] - math.log(64)) < 0.01  # a fresh model guesses uniformly
    assert ref.losses[-1] < ref.losses[0] - 1.5
    step = ref.steps[9]
    assert list(step.grads) == list(step.params) == NAMES
    assert sorted({k.rsplit(".", 1)[1] for k in step.state}) == ["exp_avg", "exp_avg_sq", "step"]
    assert step.state["tok.weight.step"].item() == 10
    init = dict(gpt.GPT().named_parameters())
    assert not torch.equal(ref.steps[0].params["tok.weight"], init["tok.weight"])


def test_reference_run_is_the_same_every_time():
    a = gpt.reference_run(steps=2, optimizer="sgd", lr=0.1)
    b = gpt.reference_run(steps=2, optimizer="sgd", lr=0.1)
    assert a.losses == b.losses
    for name in NAMES:
        assert torch.equal(a.steps[1].params[name], b.steps[1].params[name])
        assert torch.equal(a.steps[1].state[f"{name}.momentum_buffer"],
                           b.steps[1].state[f"{name}.momentum_buffer"])


def test_one_training_step_takes_milliseconds():
    model = gpt.GPT()
    opt = gpt.make_optimizer(model.parameters())
    tokens, targets = gpt.batch(0, 8)

    def step():
        gpt.loss(model(tokens), targets).backward()
        opt.step()
        opt.zero_grad()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a rank of a 2-rank launch on 2 cores runs
    try:
        step()  # the first step imports and initializes
        times = []
        for _ in range(5):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    # ~6 ms on an idle 2-core machine; the bound leaves room for a machine busy with others.
    assert sorted(times)[2] < 0.5


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"hidden": 30}, r"Config.hidden \(30\) must be divisible by heads \(4\)"),
        ({"heads": 0}, "Config.heads must be an int >= 1"),
        ({"vocab": 2.5}, "vocab must be an int >= 1"),
        ({"dropout": 1.0}, r"dropout must be in \[0, 1\)"),
    ],
)
def test_bad_configs_are_refused_with_the_field_named(kwargs, says):
    with pytest.raises(ValueError, match=says):
        gpt.Config(**kwargs)


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="must be a distlab.gpt.Config"):
        gpt.GPT({"hidden": 32})
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        gpt.batch(0, 0)
    with pytest.raises(ValueError, match="step must be an int >= 0"):
        gpt.batch(-1, 4)
    with pytest.raises(ValueError, match="optimizer must be one of"):
        gpt.make_optimizer(gpt.GPT().parameters(), "adam")
    with pytest.raises(ValueError, match="steps must be an int >= 1"):
        gpt.reference_run(steps=0)
    with pytest.raises(ValueError, match="longer than Config.seq_len=16"):
        gpt.GPT()(torch.zeros(1, 17, dtype=torch.int64))


def test_make_optimizer_has_its_documented_settings():
    params = list(gpt.GPT().parameters())
    adamw = gpt.make_optimizer(params)
    group = adamw.param_groups[0]
    assert type(adamw) is torch.optim.AdamW
    assert (group["lr"], group["betas"], group["weight_decay"]) == (1e-2, (0.9, 0.95), 0.1)
    sgd = gpt.make_optimizer(params, "sgd", lr=0.5)
    group = sgd.param_groups[0]
    assert type(sgd) is torch.optim.SGD
    assert (group["lr"], group["momentum"]) == (0.5, 0.9)


def test_reference_run_steps_with_the_learning_rate_it_is_given():
    # SGD's first step with momentum is p - lr * g: the learning rate is visible in the update.
    ref = gpt.reference_run(steps=1, optimizer="sgd", lr=0.25)
    init = dict(gpt.GPT().named_parameters())
    step = ref.steps[0]
    for name in ("tok.weight", "layers.1.mlp.w2.weight", "head.weight"):
        want = init[name].detach() - 0.25 * step.grads[name]
        torch.testing.assert_close(step.params[name], want, rtol=0, atol=1e-7)


@pytest.mark.quick
def test_the_tiny_gpt_and_the_calculators_name_a_models_shape_alike():
    """One vocabulary for a model's shape: `gpt.Config` speaks `calculators.Transformer`'s words
    (``hidden`` the width, ``intermediate`` the MLP's, ``layers``, ``heads``, ``tied``)."""
    from distlab.calculators import PRESETS

    words = ("vocab", "hidden", "intermediate", "layers", "heads", "tied")
    tiny, llama = gpt.Config(), PRESETS["Llama-3 8B"]
    assert [getattr(tiny, w) for w in words] == [64, 32, 128, 2, 4, False]
    assert all(isinstance(getattr(llama, w), type(getattr(tiny, w))) for w in words)
    layer = gpt.GPT(tiny).layers[0]
    assert layer.mlp.w1.weight.shape == (tiny.intermediate, tiny.hidden)
