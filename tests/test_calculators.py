"""distlab.calculators, memory per device: the models' sizes, the ZeRO paper's Figure 1,
Korthikanti et al.'s activations, and the course's own models against `distlab.memory.measure`
in one process (on two real ranks: test_calculators_measured.py)."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
import torch.nn as nn

from distlab import memory
from distlab.calculators import (
    GB,
    PRESETS,
    CalculatorError,
    MemoryEstimate,
    Params,
    Transformer,
    memory_per_device,
)

pytestmark = pytest.mark.quick

NB15 = "notebook 15: 4 x Linear(64, 64)"
NB14 = "notebook 14: SimpleMLP"
NB16 = "notebook 16: 8 x (Linear(16, 16), Tanh)"


# --- the models' sizes, from their published configs --------------------------------------


@pytest.mark.parametrize(
    "name, count",
    [
        ("GPT-2 124M", 124_439_808),  # Hugging Face's gpt2, tied embeddings counted once
        ("Llama-3 8B", 8_030_261_248),
        ("Llama-3 70B", 70_553_706_496),  # "70.6B"
        ("Llama-3 405B", 405_853_388_800),
        ("Mixtral 8x7B", 46_702_792_704),  # "46.7B" total, 8 experts per layer
        (NB15, 16_640),  # the notebook asserts PSI == 16_640
        (NB14, 50 * 32 + 32 + 32 * 8 + 8),
        (NB16, 8 * (16 * 16 + 16)),
    ],
)
def test_presets_count_the_parameters_of_their_published_configs(name, count):
    assert PRESETS[name].parameters() == count


def test_gpt2_count_equals_the_torch_model_built_from_its_config():
    # GPT-2's modules as Hugging Face builds them: the count must be that of real tensors.
    h, v, layers = 768, 50257, 12
    block = [nn.LayerNorm(h), nn.Linear(h, 3 * h), nn.Linear(h, h), nn.LayerNorm(h),
             nn.Linear(h, 4 * h), nn.Linear(4 * h, h)]
    per_layer = sum(p.numel() for m in block for p in m.parameters())
    total = v * h + 1024 * h + layers * per_layer + 2 * h  # wte, wpe, blocks, ln_f (lm_head tied)
    assert PRESETS["GPT-2 124M"].parameters() == total == 124_439_808


def test_tensor_parallel_shards_add_up_to_the_model_less_the_replicated_parts():
    llama = PRESETS["Llama-3 8B"]
    dense, _ = llama.shard(tp=8, pp=1, stage=0)
    norms = (2 * llama.layers + 1) * llama.hidden  # RMSNorm weights: whole on every TP rank
    assert 8 * (dense - norms) == llama.parameters() - norms


def test_pipeline_stages_hold_the_layers_once_between_them():
    llama = PRESETS["Llama-3 70B"]
    stages = [llama.shard(tp=1, pp=4, stage=s)[0] for s in range(4)]
    assert sum(stages) == llama.parameters()
    assert stages[1] == stages[2] == 20 * (stages[1] // 20)  # middle stages: 20 layers each


# --- the ZeRO paper, Figure 1 ---------------------------------------------------------------


def test_zero_paper_figure_1_is_reproduced_exactly():
    # 7.5B parameters, 64 GPUs, mixed-precision Adam (K = 12): 120, 31.4, 16.6 and 1.9 GB, where
    # 1 GB is 10^9 bytes and the paper rounds to one decimal.
    totals = [memory_per_device(7_500_000_000, dp=64, zero=z, precision="bf16-mixed").total
              for z in range(4)]
    assert totals == [120_000_000_000, 31_406_250_000, 16_640_625_000, 1_875_000_000]
    assert [round(t / GB, 1) for t in totals] == [120.0, 31.4, 16.6, 1.9]
    assert [round(t / 2**30, 1) for t in totals] != [120.0, 31.4, 16.6, 1.9]  # not GiB


def test_each_zero_stage_shards_one_more_part():
    e = [memory_per_device(7_500_000_000, dp=64, zero=z, precision="bf16-mixed")
         for z in range(4)]
    psi = 7_500_000_000
    assert (e[0].params, e[0].grads, e[0].optimizer) == (2 * psi, 2 * psi, 12 * psi)
    assert (e[1].params, e[1].grads, e[1].optimizer) == (2 * psi, 2 * psi, 12 * psi // 64)
    assert (e[2].params, e[2].grads, e[2].optimizer) == (2 * psi, 2 * psi // 64, 12 * psi // 64)
    assert (e[3].params, e[3].grads, e[3].optimizer) == (2 * psi // 64, 2 * psi // 64,
                                                         12 * psi // 64)
    fp32 = memory_per_device(psi, dp=64, zero=1, precision="fp32")
    assert (fp32.params, fp32.grads, fp32.optimizer) == (4 * psi, 4 * psi, 8 * psi // 64)


def test_an_uneven_shard_is_rounded_up_to_whole_elements():
    e = memory_per_device(10, dp=4, zero=3, precision="fp32")
    assert (e.params, e.grads, e.optimizer) == (3 * 4, 3 * 4, 3 * 8)


# --- activations: Korthikanti et al. 2022, Table 2 -------------------------------------------


def _gpt(heads=96, hidden=12288, layers=4):
    return Transformer("GPT-3-like", vocab=51200, hidden=hidden, intermediate=4 * hidden,
                       layers=layers, heads=heads, kv_heads=heads, gated=False, bias=True)


@pytest.mark.parametrize(
    "checkpointing, sequence_parallel, per_layer",
    [  # s, b, h, a, t = 2048, 1, 12288, 96, 8: Table 2, row by row
        ("none", False, lambda s, b, h, a, t: s * b * h * (10 + Fraction(24, t)
                                                           + Fraction(5 * a * s, h * t))),
        ("none", True, lambda s, b, h, a, t: s * b * h * (Fraction(34, t)
                                                          + Fraction(5 * a * s, h * t))),
        ("selective", False, lambda s, b, h, a, t: s * b * h * (10 + Fraction(24, t))),
        ("selective", True, lambda s, b, h, a, t: s * b * h * Fraction(34, t)),
        ("full", False, lambda s, b, h, a, t: 2 * s * b * h),
    ],
)
def test_activations_follow_korthikanti_table_2(checkpointing, sequence_parallel, per_layer):
    e = memory_per_device(_gpt(), tp=8, seq_len=2048, checkpointing=checkpointing,
                          sequence_parallel=sequence_parallel)
    assert e.activations == 4 * per_layer(2048, 1, 12288, 96, 8)  # 4 layers


def test_activations_without_parallelism_are_sbh_34_plus_5as_over_h():
    s, b, h, a = 1024, 2, 768, 12
    e = memory_per_device("GPT-2 124M", seq_len=s, micro_batch=b)
    assert e.activations == 12 * s * b * h * (34 + Fraction(5 * a * s, h))
    assert memory_per_device("GPT-2 124M", seq_len=s, micro_batch=b,
                             precision="fp32").activations == 2 * e.activations


def test_pipeline_stages_hold_their_microbatches_in_flight_and_cp_splits_the_sequence():
    first = memory_per_device("Llama-3 8B", pp=4, seq_len=4096)
    last = first.with_(stage=3)
    assert (first.in_flight, last.in_flight) == (4, 1)  # 1F1B
    assert first.activations == 4 * first.per_microbatch
    assert last.activations == last.per_microbatch
    named = {what for what, _ in first.terms}, {what for what, _ in last.terms}
    assert "token ids" in named[0] and "log-softmax (fp32)" not in named[0]
    assert "log-softmax (fp32)" in named[1] and "token ids" not in named[1]
    assert first.with_(microbatches=2).in_flight == 2
    # context parallelism: every rank holds half the tokens, but gathers all keys and values
    one, two = (dict(memory_per_device("Llama-3 8B", cp=cp, seq_len=4096).terms)
                for cp in (1, 2))
    assert two["q"] * 2 == one["q"] and two["k, v"] == one["k, v"]
    assert two["SwiGLU"] * 2 == one["SwiGLU"]


def test_attention_written_out_keeps_the_softmax_and_selective_recompute_drops_it():
    flash = dict(memory_per_device("Llama-3 8B", seq_len=4096).terms)
    written = dict(memory_per_device("Llama-3 8B", seq_len=4096, attention="written").terms)
    s, a, layers = 4096, 32, 32
    assert written["softmax"] == 2 * a * s * s * layers and "softmax" not in flash
    again = memory_per_device("Llama-3 8B", seq_len=4096, attention="written",
                              checkpointing="selective")
    assert "softmax" not in dict(again.terms)
    # with flash attention, recomputing the core saves only the log-sum-exp
    sel = memory_per_device("Llama-3 8B", seq_len=4096, checkpointing="selective")
    assert sum(flash.values()) - sel.per_microbatch == flash["log-sum-exp"]


def test_an_ep_that_does_not_divide_the_experts_is_refused_with_the_sizes_that_do():
    # The one mixture-of-experts path no preset reached: ep divides dp (6) but not the 8
    # experts, which would otherwise share out 8 // 3 = 2 experts per rank and lose two.
    with pytest.raises(CalculatorError, match=r"ep=3 does not divide the 8 experts of Mixtral "
                                              r"8x7B: choose ep in 1, 2, 4, 8"):
        memory_per_device("Mixtral 8x7B", dp=6, ep=3)
    assert memory_per_device("Mixtral 8x7B", dp=6, ep=2).ep == 2


def test_mixture_of_experts_shares_out_its_experts_over_ep():
    one = memory_per_device("Mixtral 8x7B", dp=8, ep=1, seq_len=1024)
    eight = memory_per_device("Mixtral 8x7B", dp=8, ep=8, seq_len=1024)
    mixtral = PRESETS["Mixtral 8x7B"]
    dense, expert = mixtral.shard(1, 1, 0)
    assert one.numel == dense + expert and eight.numel == dense + expert // 8


# --- the course's models against distlab.memory.measure -------------------------------------


def _nb14():
    class SimpleMLP(nn.Module):  # notebook 14's
        def __init__(self):
            super().__init__()
            self.net1, self.relu, self.net2 = nn.Linear(50, 32), nn.ReLU(), nn.Linear(32, 8)

        def forward(self, x):
            return torch.sigmoid(self.net2(self.relu(self.net1(x))))

    return SimpleMLP()


BUILD = {
    NB15: (lambda: nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)]), 64),
    NB14: (_nb14, 50),
    NB16: (lambda: nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.Tanh())
                                   for _ in range(8)]), 16),
}


@pytest.mark.parametrize("name", [NB15, NB14, NB16])
def test_course_models_match_what_memory_measure_counts_in_one_process(name):
    build, width = BUILD[name]
    torch.manual_seed(0)
    model = build()
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(8, width)).square().mean().backward()
    opt.step()
    u = memory.measure(model, opt)
    e = memory_per_device(name, precision="fp32")
    assert (e.params, e.grads, e.optimizer) == (u.params, u.grads, u.optimizer)


@pytest.mark.parametrize("name", [NB15, NB14, NB16])
def test_course_models_activations_are_what_autograd_saves(name):
    build, width = BUILD[name]
    model = build()
    params = {p.data_ptr() for p in model.parameters()}
    saved = {}

    def pack(t):
        if t.data_ptr() not in params:
            saved[t.data_ptr(), t.numel()] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(torch.randn(8, width))
    e = memory_per_device(name, precision="fp32", micro_batch=8, seq_len=1)
    assert e.activations == sum(saved.values()) > 0


# --- what a learner sees --------------------------------------------------------------------


def test_text_shows_exact_bytes_and_gb_and_is_deterministic():
    e = memory_per_device("Llama-3 70B", dp=8, tp=8, zero=1, checkpointing="full",
                          seq_len=8192, precision="bf16-mixed")
    assert isinstance(e, MemoryEstimate) and repr(e) == str(e) == e.text()
    assert e.text() == memory_per_device("Llama-3 70B", dp=8, tp=8, zero=1,
                                         checkpointing="full", seq_len=8192,
                                         precision="bf16-mixed").text()
    assert "params      17,640,734,720      17.64" in e.text()
    assert "total       50,530,598,916      50.53" in e.text()
    # zero=1: the whole bf16 gradients are there in backward, more than the loss's copies
    assert "peak        51,092,905,988      51.09  (estimate: total + a recomputed layer)" in (
        e.text())
    assert e.fits() and not e.with_(tp=4).fits()
    assert "0x" not in e.text()  # no object addresses


def test_smallest_tp_at_which_llama3_70b_peaks_under_80_gb_with_fsdp_and_full_recompute_is_4():
    # Notebook 15's exercise 4: dp=8, ZeRO-3, full checkpointing, 8192 tokens. At tp=2 the
    # total (78.2 GB) fits and the peak (82.4 GB) does not.
    ests = {tp: memory_per_device("Llama-3 70B", dp=8, tp=tp, zero=3, checkpointing="full",
                                  seq_len=8192) for tp in (1, 2, 4, 8)}
    assert [tp for tp, e in ests.items() if e.fits()] == [4, 8]
    assert ests[2].total < 80 * GB < ests[2].peak


def test_chart_draws_png_bytes_that_depend_only_on_the_estimate():
    e = memory_per_device("GPT-2 124M", dp=4, zero=2)
    png = e.chart().png()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert png == e.chart().png() and png != e.with_(zero=3).chart().png()
    assert repr(e.chart()) == e.text()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(model="Llama-3 8B", tp=3), "tp=3 does not divide the 32 attention heads of "
                                         "Llama-3 8B: choose tp in 1, 2, 4, 8"),
        (dict(model="Llama-3 8B", tp=16), "16 does not divide the 8 key-value heads"),
        (dict(model="Llama-3 8B", pp=35), "pp=35 stages need at least one layer each; the model "
                                          "has 32: choose pp in 1, 2, 4, 8, 16, 32 (or 33, 34"),
        (dict(model="Llama-3 8B", stage=4, pp=4), "stage must be a pipeline stage, 0 to 3"),
        (dict(model="Llama-3 8B", attention="flash"), "attention='flash' is not one of"),
        (dict(model="Llama-3 8B", dp=2, ep=2), "Llama-3 8B is dense (no experts)"),
        (dict(model="Mixtral 8x7B", dp=4, ep=8), "ep=8 must divide dp=4"),
        (dict(model="Llama-3 8B", cp=3, seq_len=4096), "seq_len=4096 does not split into cp=3"),
        (dict(model="Llama-3 8B", zero=4), "zero=4 is not a ZeRO stage: choose 0"),
        (dict(model="Llama-3 8B", precision="fp16"), "precision='fp16' is not one of"),
        (dict(model="Llama-3 8B", dp=0), "dp must be a whole number >= 1, got 0"),
        (dict(model="Llama-3 9B"), "no preset model named 'Llama-3 9B'; the presets are"),
        (dict(model=NB15, tp=2), "tensor parallelism is modelled for transformers only"),
        (dict(model=NB15, checkpointing="full"), "use checkpointing='none'"),
    ],
)
def test_bad_input_says_what_was_wrong_and_what_to_choose(kwargs, message):
    with pytest.raises(CalculatorError) as info:
        memory_per_device(kwargs.pop("model"), **kwargs)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


def test_a_bare_parameter_count_has_no_activations_and_says_so():
    e = memory_per_device(Params(1000), tp=2, pp=2)
    assert e.activations == 0 and e.numel == 250
    assert "activations: not modelled" in e.text()


# --- what each device holds, case by case ------------------------------------------------------


def test_zero_shards_over_the_data_and_context_parallel_ranks_together():
    # The cp ranks of a dp group hold the same parameters: ZeRO shards over dp x cp of them.
    llama = PRESETS["Llama-3 8B"]
    n = llama.parameters()
    for zero in (1, 2, 3):
        e = memory_per_device("Llama-3 8B", dp=2, cp=4, zero=zero, seq_len=4096,
                              precision="bf16-mixed")
        shard = -(-n // 8)
        assert e.optimizer == 12 * shard
        assert e.grads == (2 * shard if zero >= 2 else 2 * n)
        assert e.params == (2 * shard if zero >= 3 else 2 * n)
    assert memory_per_device("Llama-3 8B", dp=8, zero=3, precision="bf16-mixed").params == e.params


def test_a_mixture_of_experts_keeps_what_its_router_and_experts_save():
    # Mixtral 8x7B, per layer (s tokens, b sequences, h hidden, i the experts' width, k = 2 of
    # E = 8 experts, e = 2 bytes): the router's probabilities (fp32) and choices (int64), each
    # token's k copies at its experts, 4 tensors of width i inside each expert, the experts'
    # outputs and the gates (fp32).
    s, b, h, i, k, E, e, layers = 1024, 2, 4096, 14336, 2, 8, 2, 32
    terms = dict(memory_per_device("Mixtral 8x7B", seq_len=s, micro_batch=b).terms)
    assert terms["router probabilities"] == layers * 4 * s * b * E
    assert terms["router choices"] == layers * 8 * s * b * k
    assert terms["tokens at their experts"] == layers * e * s * b * h * k
    assert terms["experts' insides"] == layers * 4 * e * s * b * k * i
    assert terms["experts' outputs"] == layers * e * s * b * h * k
    assert terms["gates"] == layers * 4 * s * b * k
    assert "SwiGLU" not in terms  # a dense model's MLP term


def test_a_tied_embedding_is_kept_twice_across_pipeline_stages_once_without():
    # GPT-2 ties its output layer to the token embedding: one tensor on one device; with
    # pp > 1 the last stage keeps a copy of it (Megatron-LM), the first the embedding.
    gpt2 = PRESETS["GPT-2 124M"]
    whole = gpt2.shard(tp=1, pp=1, stage=0)[0]
    assert whole == gpt2.parameters()
    stages = [gpt2.shard(tp=1, pp=2, stage=s)[0] for s in range(2)]
    assert sum(stages) == gpt2.parameters() + gpt2.vocab * gpt2.hidden


def test_a_vocabulary_that_tp_does_not_divide_is_padded_to_a_whole_share():
    # GPT-2's 50,257 tokens on 2 ranks: each holds 25,129 rows of the embedding (Megatron pads
    # the vocabulary), not 25,128.
    gpt2 = PRESETS["GPT-2 124M"]
    assert gpt2.end_parameters(tp=2, pp=1, stage=0) == (25_129 + 1024 + 2) * 768
    dense, _ = gpt2.shard(tp=2, pp=1, stage=0)
    assert dense == gpt2.layer_parameters(2)[0] * 12 + (25_129 + 1024 + 2) * 768


def test_a_one_element_parameters_optimizer_state_is_state_and_its_step_count_apart():
    # Linear(4, 1)'s bias has one element: its Adam m and v are one element each (optimizer
    # state, as the calculator counts it), and its step counter, one element too, is not.
    from distlab.calculators import LinearStack

    model = nn.Linear(4, 1)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    measured = memory.measure(model, opt)
    e = memory_per_device(LinearStack("one output", (4, 1)), precision="fp32")
    assert (measured.params, measured.grads, measured.optimizer) == (
        e.params, e.grads, e.optimizer) == (20, 20, 40)
    assert measured.optimizer_other == 2 * 4  # two step counters, one float32 each
