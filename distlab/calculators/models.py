"""The models the calculators size: transformers from their published configs, the course's own
MLPs, or a bare parameter count.

    from distlab.calculators import PRESETS, Transformer
    PRESETS["Llama-3 70B"].parameters()        # 70,553,706,496
    Transformer("mine", vocab=32000, hidden=2048, intermediate=5632, layers=22, heads=32,
                kv_heads=4)                     # your own sizes

Each model counts its parameters, whole or as one device holds them under tensor parallelism
(Megatron-LM's split: attention heads, MLP columns/rows and the vocabulary divided by ``tp``;
norms, position embeddings and row-parallel biases whole on every tensor-parallel rank) and
pipeline parallelism (a transformer's layers as `stage_layers` splits them: equally, or as the
Llama 3 paper does when pp does not divide them; the embedding on the first stage, the final
norm and output layer on the last). Knows nothing about bytes, optimizers or activations:
`memory_estimate` does that.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._config import check_int
from ._text import CalculatorError, divisors, one_of

__all__ = ["PRESETS", "LinearStack", "Params", "Transformer", "get_model", "stage_layers"]


def _split(n: int, parts: int) -> int:
    """The largest share of ``n`` items split ``parts`` ways (Megatron pads the vocabulary)."""
    return -(-n // parts)


def stage_layers(layers: int, pp: int) -> list[range]:
    """The layers of each of ``pp`` pipeline stages. Equal when ``pp`` divides ``layers``;
    otherwise as the Llama 3 paper balances 126 layers on 16 stages: every stage gets
    ``ceil(layers / pp)``, and the first and last stages (which also hold the embedding and the
    output layer) give up the difference, alternately, one layer at a time. With a layer a
    stage, the first and last may end with none (the paper's 126 layers on 128 stages, 16
    ranks x 8: "the first model chunk on the first stage has only the embedding, and the last
    model chunk on the last stage has only output projection and loss calculation"). Raises
    `CalculatorError` when a stage is left empty otherwise."""
    ends = (f" (or {layers + 1}, {layers + 2}: a layer a stage, the first and the last holding "
            "only the embedding and the output layer)")
    check_int(pp, "pp", low=1, high=layers + 2, error=CalculatorError, message=(
        f"pp={pp!r} stages need at least one layer each; the model has {layers}: choose pp in "
        f"{one_of(divisors(layers))}{ends}"))
    per = -(-layers // pp)
    sizes = [per] * pp
    for step in range(per * pp - layers):
        sizes[0 if step % 2 == 0 else -1] -= 1
    if min(sizes) < (0 if per == 1 else 1) or (pp == 1 and sizes[0] < 1):
        raise CalculatorError(f"{layers} layers do not fill pp={pp} stages; choose pp in "
                              f"{one_of(divisors(layers))}{ends}")
    out, start = [], 0
    for n in sizes:
        out.append(range(start, start + n))
        start += n
    return out


def _check_pp(name: str, layers: int, pp: int) -> None:
    if layers % pp:
        raise CalculatorError(
            f"pp={pp} does not divide the {layers} layers of {name} into equal stages: "
            f"choose pp in {one_of(divisors(layers))}"
        )


@dataclass(frozen=True)
class Transformer:
    """A decoder-only transformer, as its config file describes it.

    Args:
        name: what to call it in tables.
        vocab, hidden, intermediate, layers, heads, kv_heads: vocabulary size, hidden size, the
            MLP's inner size, number of layers, attention heads and key-value heads (grouped-query
            attention when ``kv_heads < heads``).
        positions: learned position embeddings (GPT-2: 1024); 0 for rotary embeddings (Llama).
        tied: the output layer reuses the token embedding (GPT-2).
        bias: every Linear and LayerNorm has a bias (GPT-2); False: no biases and RMSNorm (Llama).
        gated: a gated MLP with three matrices (SwiGLU: Llama); False: two (GPT-2's GELU MLP).
        experts, top_k: a mixture of experts: ``experts`` MLPs per layer plus a router, each token
            sent to ``top_k`` of them (1, 1: a dense model).
        dropout: the dropout probability it trains with (GPT-2: 0.1; Llama and Mixtral: 0). The
            memory calculator counts dropout's masks only for a model that has them.
        source: where the numbers come from.
    """

    name: str
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    positions: int = 0
    tied: bool = False
    bias: bool = False
    gated: bool = True
    experts: int = 1
    top_k: int = 1
    dropout: float = 0.0
    source: str = ""

    def __post_init__(self):
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise CalculatorError(
                f"{self.name}: hidden={self.hidden} must split into heads={self.heads}, and "
                f"heads into kv_heads={self.kv_heads} groups"
            )

    def parameters(self) -> int:
        """The number of parameters of the whole model (tied embeddings counted once)."""
        dense, expert = self.shard(tp=1, pp=1, stage=0)
        return dense + expert

    def check_tp(self, tp: int) -> None:
        """Raise `CalculatorError` unless ``tp`` splits heads, key-value heads and the MLP."""
        for what, n in (
            ("attention heads", self.heads),
            ("key-value heads", self.kv_heads),
            ("MLP columns", self.intermediate),
        ):
            if n % tp:
                good = [t for t in divisors(self.kv_heads) if self.intermediate % t == 0]
                raise CalculatorError(
                    f"tp={tp} does not divide the {n} {what} of {self.name}: "
                    f"choose tp in {one_of(good)}"
                )

    def layer_parameters(self, tp: int = 1) -> tuple[int, int]:
        """``(dense, expert)`` parameters of one layer on one tensor-parallel rank (the experts
        before expert parallelism divides them)."""
        h, hd = self.hidden, self.hidden // self.heads
        q, kv = self.heads * hd, self.kv_heads * hd
        # Column-parallel (q, k, v; the MLP's first matrices) splits weights and biases by tp;
        # row-parallel (attention output; the MLP's last matrix) splits weights, keeps its bias.
        attn = h * (q + 2 * kv) // tp + q * h // tp
        mats = 3 if self.gated else 2
        mlp = mats * h * self.intermediate // tp
        if self.bias:
            attn += (q + 2 * kv) // tp + h
            mlp += (mats - 1) * self.intermediate // tp + h
        layer = attn + 2 * self._norm()
        if self.experts > 1:  # the router, the experts: whole on every tp rank (expert
            # parallelism splits them; expert-tensor-parallel size 1, DeepSpeed-MoE's default)
            return layer + h * self.experts, mats * h * self.intermediate * self.experts
        return layer + mlp, 0

    def _norm(self) -> int:
        return self.hidden * (2 if self.bias else 1)

    def end_parameters(self, tp: int, pp: int, stage: int) -> int:
        """Parameters outside the layers on ``stage`` (one tp rank): the embedding (and learned
        positions) on the first, the final norm and the output layer on the last."""
        embedding = _split(self.vocab, tp) * self.hidden
        ends = 0
        if stage == 0:
            ends += embedding + self.positions * self.hidden
        if stage == pp - 1:
            ends += self._norm()
            if not self.tied or pp > 1:  # Megatron's last stage keeps a copy of tied embeddings
                ends += embedding
        return ends

    def shard(self, tp: int, pp: int, stage: int) -> tuple[int, int]:
        """Parameters one device holds with tensor-parallel size ``tp``, on pipeline ``stage``
        of ``pp``: ``(dense, expert)``, the experts of all of its layers (before expert
        parallelism divides them). Raises `CalculatorError` for a ``tp`` or ``pp`` that does
        not divide the model (the message lists the sizes that do)."""
        self.check_tp(tp)
        layers = len(stage_layers(self.layers, pp)[stage])
        dense, expert = self.layer_parameters(tp)
        return dense * layers + self.end_parameters(tp, pp, stage), expert * layers


@dataclass(frozen=True)
class LinearStack:
    """A stack of ``nn.Linear`` layers, as the course's notebooks build them (their small MLPs;
    `distlab.gpt.MLP` is the tiny GPT's feed-forward module, an ``nn.Module``).

    Args:
        name: what to call it in tables.
        widths: the in and out features of the layers: ``(64, 64, 64)`` is Linear(64, 64) twice.
        activation: the elementwise function between layers: "relu", "tanh", "sigmoid" or None.
        final: the one after the last layer (same choices).
        source: which notebook builds it.
    """

    name: str
    widths: tuple[int, ...]
    activation: str | None = None
    final: str | None = None
    source: str = ""

    @property
    def layers(self) -> int:
        return len(self.widths) - 1

    def parameters(self) -> int:
        """The number of parameters (weights and biases)."""
        return sum(self.shard(tp=1, pp=1, stage=0))

    def shard(self, tp: int, pp: int, stage: int) -> tuple[int, int]:
        """``(parameters, 0)`` of pipeline ``stage`` of ``pp``; ``tp`` must be 1."""
        if tp != 1:
            raise CalculatorError(
                f"tensor parallelism is modelled for transformers only; {self.name} runs with "
                "tp=1 (notebook 14 splits its MLP by hand with ColwiseParallel/RowwiseParallel)"
            )
        _check_pp(self.name, self.layers, pp)
        per = self.layers // pp
        pairs = list(zip(self.widths[:-1], self.widths[1:], strict=True))
        return sum(i * o + o for i, o in pairs[stage * per : (stage + 1) * per]), 0

    def saved_per_row(self, pp: int, stage: int) -> int:
        """Values per row (token) autograd saves in the forward of ``stage``: each Linear saves
        its input; ReLU, tanh and sigmoid save their output, which is the next Linear's input
        (the same tensor, counted once), except after the last layer."""
        per = self.layers // pp
        saved = sum(self.widths[stage * per : (stage + 1) * per])
        if stage == pp - 1 and self.final is not None:
            saved += self.widths[-1]
        return saved


@dataclass(frozen=True)
class Params:
    """Just a number of parameters (the ZeRO paper's "7.5B"): no layers, so tensor and pipeline
    parallelism divide it evenly and activations are not modelled."""

    count: int
    name: str = ""

    def parameters(self) -> int:
        return self.count

    def shard(self, tp: int, pp: int, stage: int) -> tuple[int, int]:
        """``(ceil(count / (tp * pp)), 0)``."""
        return _split(self.count, tp * pp), 0


_META = "Meta's config.json on the Hugging Face Hub (meta-llama/{}); Llama 3 paper, Table 3"

#: The models the calculators offer, by name. Llama-3 and Mixtral from their published
#: config.json files; GPT-2 from OpenAI's released 124M checkpoint (Hugging Face "gpt2");
#: the MLPs from the notebooks that build them.
PRESETS = {
    m.name: m
    for m in (
        LinearStack("notebook 15: 4 x Linear(64, 64)", (64,) * 5,
                    source="notebooks/15, make_model()"),
        LinearStack("notebook 14: SimpleMLP", (50, 32, 8), "relu", "sigmoid",
                    "notebooks/14, SimpleMLP"),
        LinearStack("notebook 16: 8 x (Linear(16, 16), Tanh)", (16,) * 9, "tanh", "tanh",
                    "notebooks/16, make_model()"),
        Transformer("GPT-2 124M", vocab=50257, hidden=768, intermediate=3072, layers=12,
                    heads=12, kv_heads=12, positions=1024, tied=True, bias=True, gated=False,
                    dropout=0.1,
                    source="config.json of openai-community/gpt2 on the Hugging Face Hub"),
        Transformer("Llama-3 8B", vocab=128256, hidden=4096, intermediate=14336, layers=32,
                    heads=32, kv_heads=8, source=_META.format("Meta-Llama-3-8B")),
        Transformer("Llama-3 70B", vocab=128256, hidden=8192, intermediate=28672, layers=80,
                    heads=64, kv_heads=8, source=_META.format("Meta-Llama-3-70B")),
        Transformer("Llama-3 405B", vocab=128256, hidden=16384, intermediate=53248,
                    layers=126, heads=128, kv_heads=8,
                    source=_META.format("Llama-3.1-405B")),
        Transformer("Mixtral 8x7B", vocab=32000, hidden=4096, intermediate=14336, layers=32,
                    heads=32, kv_heads=8, experts=8, top_k=2,
                    source="config.json of mistralai/Mixtral-8x7B-v0.1 on the Hugging Face Hub"),
    )
}


def get_model(model):
    """``model`` as a model object: a preset's name, an int (a `Params`), or a `Transformer`,
    `LinearStack` or `Params` as is. Raises `CalculatorError` for an unknown name (listing the
    presets) or anything else."""
    if isinstance(model, (Transformer, LinearStack, Params)):
        return model
    if isinstance(model, str):
        if model not in PRESETS:
            raise CalculatorError(
                f"no preset model named {model!r}; the presets are: {', '.join(PRESETS)}"
            )
        return PRESETS[model]
    if isinstance(model, int) and not isinstance(model, bool) and model > 0:
        return Params(model)
    raise CalculatorError(
        f"model must be a preset's name, a number of parameters, a Transformer, a LinearStack "
        f"or Params, got {model!r}"
    )


def describe(model) -> str:
    """One line: the model's name and parameter count."""
    count = f"{model.parameters():,} parameters"
    return f"{model.name}: {count}" if model.name else count

