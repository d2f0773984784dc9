"""distlab.activations: bytes saved for backward per module, measured and predicted exactly."""

from __future__ import annotations

import sys
import warnings

import cloudpickle
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import distlab
from distlab import activations, gpt

cloudpickle.register_pickle_by_value(sys.modules[__name__])

quick = pytest.mark.quick


def _measure(model, config=None, batch_size=8, seq_len=None, backward=True):
    config = config or gpt.Config()
    tokens, targets = gpt.batch(0, batch_size, config)
    if seq_len is not None:
        tokens, targets = tokens[:, :seq_len].contiguous(), targets[:, :seq_len].contiguous()
    with activations.Meter(model) as meter:
        loss = gpt.loss(model(tokens), targets)
    if backward:
        loss.backward()  # the graph the meter saw is a real one
    return meter.result


@quick
@pytest.mark.parametrize(
    "config, batch_size, seq_len",
    [
        (gpt.Config(), 8, None),
        (gpt.Config(), 3, 10),
        (gpt.Config(tied=True, layers=3), 2, None),
        (gpt.Config(dropout=0.1), 4, None),
        (gpt.Config(sdpa=True), 4, None),
        (gpt.Config(heads=2, mlp_ratio=2, vocab=40), 5, 7),
    ],
    ids=["default", "short", "tied", "dropout", "sdpa", "other-shape"],
)
def test_measured_bytes_equal_the_prediction_module_by_module(config, batch_size, seq_len):
    measured = _measure(gpt.GPT(config), config, batch_size, seq_len)
    predicted = activations.predict(config, batch_size, seq_len)
    print(activations.side_by_side(measured, predicted))
    assert measured.modules == predicted.modules
    assert measured.params == predicted.params
    assert measured.total == predicted.total > 0


@quick
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("sdpa", [True, False], ids=["sdpa", "written-out"])
def test_the_prediction_holds_in_every_dtype(sdpa, dtype):
    # Issue #33's shape: in bf16 the fused kernel keeps its log-sum-exp in fp32, 4 bytes a
    # value where the prediction counted 2 (400 bytes short per block here).
    config = gpt.Config(vocab=50, hidden=40, heads=5, seq_len=20, sdpa=sdpa)
    measured = _measure(gpt.GPT(config).to(dtype), config, batch_size=2)
    predicted = activations.predict(config, 2, dtype=dtype)
    assert measured.modules == predicted.modules, activations.side_by_side(measured, predicted)
    assert measured.params == predicted.params


@quick
def test_the_prediction_is_the_papers_formula_after_the_stated_changes():
    # Korthikanti et al. 2022: sbh(34 + 5as/h) bytes per layer, 2-byte values, 1-byte masks.
    # Without dropout three masks go (sbh + sbh + as^2b, 1 byte each) and so does the dropout's
    # output (2as^2b: probs@V saves the softmax output itself, already counted): 32sbh + 2as^2b.
    # 4-byte values double it: sbh(64 + 4as/h). The paper leaves out each LayerNorm's mean and
    # 1/std: 2 norms x 2sb values x 4 bytes = 16sb.
    config = gpt.Config()
    s, b, h, a = config.seq_len, 8, config.hidden, config.heads
    paper = activations.korthikanti(config, b)
    assert paper == s * b * h * 34 + 5 * a * s * s * b
    without_dropout = paper - (2 * s * b * h + a * s * s * b) - 2 * a * s * s * b
    assert without_dropout == s * b * h * 32 + 2 * a * s * s * b
    predicted = activations.predict(config, b)
    for layer in range(config.layers):
        assert predicted.of(f"layers.{layer}") == 2 * without_dropout + 16 * s * b
    assert predicted.of("layers.0") == 296_960  # what the meter measures (test above)
    # Every term is named, and the terms add up to the total.
    assert sum(nbytes for *_, nbytes in predicted.terms) == predicted.total
    assert ("layers.0.mlp.act", "GELU's input: w1's output (4sbh)", 4 * s * b * 4 * h) in (
        predicted.terms
    )


@quick
def test_a_tensor_that_two_ops_save_counts_once():
    class TwoSaves(nn.Module):
        def forward(self, x):
            return x.sin() + x.cos()  # sin and cos both save x

    x = torch.randn(4, 8, requires_grad=True)
    with activations.Meter(model := TwoSaves()) as meter:
        model(x)
    assert meter.result.modules == {"": 4 * 8 * 4}


@quick
def test_views_count_the_bytes_they_span_once():
    class Views(nn.Module):
        def forward(self, x):
            big = x * 1.0  # 8 x 8 floats, saved below only through views
            a = big[:4].sin()  # saves rows 0-3 (128 bytes)
            b = big[2:6].sin()  # rows 2-5: 64 bytes more
            c = big[:6].cos()  # nothing new
            d = big[7:].exp()  # exp saves its output, not the view: 32 bytes, a new tensor
            return a.sum() + b.sum() + c.sum() + d.sum()

    with activations.Meter(model := Views()) as meter:
        model(torch.randn(8, 8, requires_grad=True))
    assert meter.result.modules == {"": 128 + 64 + 32}


@quick
def test_a_weight_saved_for_backward_is_a_parameter_not_an_activation():
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU())
    with activations.Meter(model) as meter:
        model(torch.randn(4, 8, requires_grad=True))
    r = meter.result
    # Linear saves its input (4x8) and, for the input's gradient, its weight (16x8); GELU its
    # input (4x16).
    assert r.modules == {"0": 4 * 8 * 4, "1": 4 * 16 * 4}
    assert r.params == {"0": 16 * 8 * 4} and r.params_total == 512 and r.total == 384


@quick
def test_the_table_is_the_same_text_every_time():
    model = nn.Sequential(nn.Linear(8, 16), nn.Sequential(nn.GELU(), nn.Linear(16, 2)))
    with activations.Meter(model) as meter:
        model(torch.randn(4, 8, requires_grad=True)).sum()
    assert meter.result.text() == (
        "module        here     inside     params\n"
        "(model)          0        640        640\n"
        "0              128        128        512\n"
        "1                0        512        128\n"
        "1.0            256        256          0\n"
        "1.1            256        256        128\n"
        "total                     640        640"
    )
    assert str(meter.result) == meter.result.text()
    assert meter.result.text(depth=1).splitlines()[1:] == [
        "(model)          0        640        640",
        "0              128        128        512",
        "1                0        512        128",
        "total                     640        640",
    ]


def _checkpointed_in_forward(use_reentrant):
    class Model(gpt.GPT):
        def forward(self, tokens):
            h = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
            for layer in self.layers:
                h = checkpoint(layer, h, use_reentrant=use_reentrant)
            return self.head(self.norm(h))

    return Model()


def _checkpoint_wrapper():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    model = gpt.GPT()
    model.layers = nn.ModuleList(checkpoint_wrapper(layer) for layer in model.layers)
    return model


def _composable():
    from torch.distributed._composable import checkpoint as composable_checkpoint

    model = gpt.GPT()
    for layer in model.layers:
        composable_checkpoint(layer)
    return model


@quick
@pytest.mark.parametrize(
    "build",
    [
        lambda: _checkpointed_in_forward(use_reentrant=False),
        lambda: _checkpointed_in_forward(use_reentrant=True),
        _checkpoint_wrapper,
        _composable,
    ],
    ids=["non-reentrant", "reentrant", "checkpoint_wrapper", "composable"],
)
def test_a_checkpointed_block_keeps_only_its_input(build):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # checkpoint_wrapper and composable are private APIs
        measured = _measure(build())
    config = gpt.Config()
    block_input = config.seq_len * 8 * config.hidden * 4
    assert [measured.of(f"layers.{i}") for i in range(2)] == [block_input] * 2
    assert measured.checkpointed == ("layers.0", "layers.1")
    assert "layers.0 (checkpointed)" in measured.text()
    predicted = activations.predict(config, 8, checkpoint=True)
    assert measured.modules == predicted.modules
    full = activations.predict(config, 8)
    assert full.of("layers.0") // block_input == 18  # what checkpointing saves, per block


@quick
def test_the_loss_outside_the_model_is_counted_apart():
    r = _measure(gpt.GPT())
    # log-softmax output (8 x 16 x 64 floats), targets (int64), the loss's total weight
    assert r.modules[activations.OUTSIDE] == 8 * 16 * 64 * 4 + 8 * 16 * 8 + 4
    assert r.of("") == r.total - r.modules[activations.OUTSIDE]


@quick
def test_nothing_is_saved_without_gradients_and_the_meter_leaves_no_hooks():
    model = gpt.GPT()
    with torch.no_grad():
        r = _measure(model, backward=False)
    assert r.total == 0 and r.params_total == 0
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())


@quick
def test_bad_use_is_refused():
    with pytest.raises(TypeError, match="must be a torch.nn.Module"):
        activations.Meter(lambda x: x)
    meter = activations.Meter(nn.Linear(2, 2))
    with meter, pytest.raises(RuntimeError, match="already measuring"):
        meter.__enter__()
    with pytest.raises(ValueError, match="seq_len=17 is longer"):
        activations.predict(gpt.Config(), 8, 17)
    with pytest.raises(ValueError, match="heads \\(4\\) must be divisible by tp=3"):
        activations.predict(gpt.Config(), 8, tp=3)
    with pytest.raises(ValueError, match="sequence_parallel needs tp > 1"):
        activations.predict(gpt.Config(), 8, sequence_parallel=True)
    with pytest.raises(TypeError, match="two Activations"):
        activations.side_by_side({}, activations.predict())


def _tensor_parallel(sequence_parallel):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel, parallelize_module

    mesh = init_device_mesh("cpu", (2,))
    model = parallelize_module(gpt.GPT(), mesh, gpt.tp_plan(sequence_parallel))
    with loss_parallel():
        return _measure(model)


def _fully_sharded():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2,))
    model = gpt.GPT()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    tokens, targets = gpt.batch(0, 8)
    mine = slice(4 * dist.get_rank(), 4 * dist.get_rank() + 4)  # a view of the batch
    with activations.Meter(model) as meter:
        loss = gpt.loss(model(tokens[mine]), targets[mine])
    loss.backward()
    return meter.result


def test_sharded_ranks_keep_what_the_prediction_says():
    def layouts():
        return {"tp": _tensor_parallel(False), "sp": _tensor_parallel(True),
                "fsdp": _fully_sharded()}

    per_rank = distlab.launch(layouts, world_size=2, timeout=120)
    predictions = {
        "tp": activations.predict(gpt.Config(), 8, tp=2),
        "sp": activations.predict(gpt.Config(), 8, tp=2, sequence_parallel=True),
        # FSDP: each rank runs the whole model on its half of the batch, with the gathered
        # parameters (FSDP frees them after each block; the meter tells storages apart).
        "fsdp": activations.predict(gpt.Config(), 4),
    }
    for layout, predicted in predictions.items():
        for rank in (0, 1):
            measured = per_rank[rank][layout]
            assert measured.modules == predicted.modules, (
                layout, activations.side_by_side(measured, predicted)
            )
            assert measured.params == predicted.params, layout
    # The shares of one layer, against one process (296,960 bytes): attention's and the MLP's
    # insides halve; the norms' inputs halve only with sequence parallelism; the inputs of
    # wq/wk/wv and w1 stay whole even then (torch keeps the all-gathered tensor for backward).
    tp, sp = per_rank[0]["tp"], per_rank[0]["sp"]
    assert (tp.of("layers.0"), sp.of("layers.0")) == (182_272, 164_864)
    assert tp.of("layers.0.ln1") == 17_408 and sp.of("layers.0.ln1") == 8_704
    assert tp.modules["layers.0.attn.wq"] == sp.modules["layers.0.attn.wq"] == 16_384


@quick
def test_a_model_of_twelve_blocks_is_predicted_block_by_block():
    # layers.1 is not layers.10 or layers.11: each block's count is its own.
    config = gpt.Config(layers=12)
    predicted = activations.predict(config, 2)
    assert len({predicted.of(f"layers.{i}") for i in range(12)}) == 1
    assert predicted.of("layers") == 12 * predicted.of("layers.1")
    measured = _measure(gpt.GPT(config), config, batch_size=2)
    assert [measured.of(f"layers.{i}") for i in range(12)] == [predicted.of("layers.0")] * 12


@quick
def test_side_by_side_shows_measured_minus_predicted():
    measured = activations.Activations({"a": 1_000, "b": 50}, order=("a", "b"))
    predicted = activations.Activations({"a": 900, "b": 70}, order=("a", "b"))
    assert activations.side_by_side(measured, predicted) == (
        "module   measured  predicted difference\n"
        "a           1,000        900       +100\n"
        "b              50         70        -20\n"
        "total       1,050        970        +80"
    )
