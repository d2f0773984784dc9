"""A tiny GPT that the Part III notebooks share, with its data and a one-process reference run.

    from distlab import gpt
    config = gpt.Config()                         # vocab 64, hidden 32, 2 layers, 4 heads, seq 16
    model = gpt.GPT(config, seed=0)               # the same numbers on every rank, every time
    tokens, targets = gpt.batch(step=0, batch_size=8, config=config, seed=0)
    loss = gpt.loss(model(tokens), targets)
    reference = gpt.reference_run(config, steps=3)   # what one process computes, step by step

Written to be parallelized, and so that every parallelism keeps the parameter names:

- attention has separate ``wq``, ``wk``, ``wv``, ``wo`` layers, and reshapes with ``-1`` heads:
  a tensor-parallel rank that holds only its heads (``ColwiseParallel`` on ``wq``/``wk``/``wv``,
  ``RowwiseParallel`` on ``wo``) runs the same code on fewer heads;
- the MLP is ``w1`` → GELU → ``w2`` (``ColwiseParallel``, then ``RowwiseParallel``);
- the model returns logits; the loss is `loss`, outside the model, so that it can run under
  ``loss_parallel()`` on vocabulary-sharded logits;
- ``tok`` and ``pos`` (together), ``norm`` and ``head`` may be set to None: a pipeline stage
  keeps only its layers, and takes (or returns) hidden states instead of tokens (or logits).

Linear layers have no bias (as in LLaMA, and nanoGPT's ``bias=False``): a key bias gets a
gradient that is exactly zero in theory (softmax ignores a constant added to every score), so in
practice it is rounding noise, which Adam turns into full-size steps that differ between any
two layouts, and a gradcheck would flag it. Norms are ``LayerNorm`` (GPT-2's, and the one
Korthikanti et al. 2022 count in their activation formula, which
`distlab.activations.predict` reproduces), not RMSNorm. Parameter names are
``tok.weight``, ``pos.weight``, ``layers.0.ln1.weight``, ``layers.0.attn.wq.weight``, ...,
``norm.weight``, ``head.weight``. The model itself is not distributed: the notebooks build
every layout around it, and `distlab.gradcheck` compares them with `reference_run`.
`tp_plan` is the one tensor-parallel plan written down here, because
`distlab.activations.predict` predicts exactly what it keeps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ._config import check_int
from .errors import InputError, InputTypeError

__all__ = [
    "GPT",
    "Config",
    "batch",
    "loss",
    "make_optimizer",
    "reference_run",
    "tp_plan",
]

OPTIMIZERS = ("adamw", "sgd")


@dataclass(frozen=True)
class Config:
    """The shape of the tiny GPT.

    Args:
        vocab: vocabulary size (tokens are ``0 .. vocab-1``).
        hidden: model width h (the residual stream); ``hidden // heads`` is the head size.
        layers: number of transformer blocks.
        heads: attention heads; divisible by the tensor-parallel size you plan (2 and 4 work
            with the default 4 heads).
        seq_len: the longest sequence (the learned positions table has this many rows).
        dropout: dropout probability after the embedding, on the attention probabilities, and
            after each block's attention and MLP. 0.0 (the default) keeps every run exact.
        tied: True ties the lm head's weight to the token embedding (one tensor, named
            ``tok.weight``); False (default) gives the head its own ``head.weight``.
        mlp_ratio: the MLP's width (`intermediate`) is ``mlp_ratio * hidden`` (4, as in GPT-2).
        sdpa: True computes attention with ``F.scaled_dot_product_attention`` (a fused kernel that
            keeps no s x s matrix for backward); False (default) writes it out: scores, softmax,
            weighted sum, as the activation formula counts it.

    Raises:
        ValueError: a size that is not a positive int, ``hidden`` not divisible by ``heads``, or
            ``dropout`` outside [0, 1). The message names the field.
    """

    vocab: int = 64
    hidden: int = 32
    layers: int = 2
    heads: int = 4
    seq_len: int = 16
    dropout: float = 0.0
    tied: bool = False
    mlp_ratio: int = 4
    sdpa: bool = False

    def __post_init__(self):
        for name in ("vocab", "hidden", "layers", "heads", "seq_len", "mlp_ratio"):
            value = getattr(self, name)
            check_int(value, f"Config.{name}", low=1)
        if self.hidden % self.heads:
            raise InputError(
                f"Config.hidden ({self.hidden}) must be divisible by heads ({self.heads}): each "
                "head gets hidden // heads features"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise InputError(f"Config.dropout must be in [0, 1), got {self.dropout!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def intermediate(self) -> int:
        """The MLP's width (`calculators.Transformer`'s word for it)."""
        return self.mlp_ratio * self.hidden


class Attention(nn.Module):
    """Causal self-attention with separate q, k, v and output projections."""

    def __init__(self, config: Config):
        super().__init__()
        self.head_dim = config.head_dim
        self.sdpa = config.sdpa
        self.wq = nn.Linear(config.hidden, config.hidden, bias=False)
        self.wk = nn.Linear(config.hidden, config.hidden, bias=False)
        self.wv = nn.Linear(config.hidden, config.hidden, bias=False)
        self.wo = nn.Linear(config.hidden, config.hidden, bias=False)
        self.attn_drop = nn.Dropout(config.dropout)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x):
        b, s, _ = x.shape
        # -1 heads, never config.heads: under tensor parallelism wq's output holds only this
        # rank's heads (hidden / tp features), and the same code must run on them.
        q = self.wq(x).view(b, s, -1, self.head_dim).transpose(1, 2)  # (b, heads, s, head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        if self.sdpa:
            p = self.attn_drop.p if self.training else 0.0
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            # An additive mask (0 or -inf): adding a constant keeps nothing for backward. In
            # the scores' dtype: a float32 mask would promote bf16 scores to float32.
            mask = torch.full((s, s), float("-inf"), device=x.device, dtype=q.dtype).triu(1)
            scores = q @ k.transpose(-2, -1) * self.head_dim**-0.5 + mask
            out = self.attn_drop(scores.softmax(dim=-1)) @ v
        out = out.transpose(1, 2).reshape(b, s, -1)  # the heads side by side again
        return self.drop(self.wo(out))


class MLP(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.w1 = nn.Linear(config.hidden, config.intermediate, bias=False)
        self.act = nn.GELU()
        self.w2 = nn.Linear(config.intermediate, config.hidden, bias=False)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.drop(self.w2(self.act(self.w1(x))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln1(x)), then + mlp(ln2(x))."""

    def __init__(self, config: Config):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.hidden)
        self.attn = Attention(config)
        self.ln2 = nn.LayerNorm(config.hidden)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """The tiny GPT: token + learned position embeddings, blocks, a final norm and an lm head.

    ``model(tokens)`` takes int64 tokens of shape (batch, seq) with seq <= ``config.seq_len`` and
    returns logits (batch, seq, vocab). A pipeline stage may set ``tok = pos = None`` (it then
    takes hidden states (batch, seq, hidden)) and ``norm = head = None`` (it returns hidden
    states).

    Args:
        config: a `Config` (default: ``Config()``).
        seed: the parameters are drawn from ``torch.Generator().manual_seed(seed)`` in parameter
            order, so they are the same on every rank and in every run, whatever the global RNG.

    Raises:
        TypeError: ``config`` is not a `Config`.
    """

    def __init__(self, config: Config | None = None, seed: int = 0):
        super().__init__()
        config = Config() if config is None else config
        if not isinstance(config, Config):
            raise InputTypeError(
                f"config must be a distlab.gpt.Config, got {type(config).__name__}")
        self.config = config
        self.tok = nn.Embedding(config.vocab, config.hidden)
        self.pos = nn.Embedding(config.seq_len, config.hidden)
        self.drop = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.hidden)
        self.head = nn.Linear(config.hidden, config.vocab, bias=False)
        if config.tied:
            self.head.weight = self.tok.weight
        self.init_weights(seed)

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """Draw every parameter again from ``seed`` (GPT-2's scheme: normal(0, 0.02) weights,
        output projections ``wo``, ``w2`` scaled by 1/sqrt(2 * layers), norms' weights 1 and
        biases 0). Deterministic: it uses its own generator, in parameter order."""
        generator = torch.Generator().manual_seed(seed)
        small = 0.02 / (2 * self.config.layers) ** 0.5
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif ".ln" in name or name.startswith("norm."):
                p.fill_(1.0)
            else:
                std = small if name.endswith(("wo.weight", "w2.weight")) else 0.02
                p.copy_(torch.randn(p.shape, generator=generator) * std)

    def forward(self, tokens):
        if self.tok is not None:
            s = tokens.shape[1]
            if s > self.config.seq_len:
                raise InputError(
                    f"a sequence of {s} tokens is longer than Config.seq_len={self.config.seq_len}"
                )
            positions = torch.arange(s, device=tokens.device)
            h = self.drop(self.tok(tokens) + self.pos(positions))
        else:
            h = tokens  # a later pipeline stage: hidden states from the previous one
        for layer in self.layers:
            h = layer(h)
        if self.norm is not None:
            h = self.norm(h)
        if self.head is not None:
            h = self.head(h)
        return h


def tp_plan(sequence_parallel: bool = False) -> dict:
    """Megatron-style tensor parallelism for `GPT`, as a ``parallelize_module`` plan.

    ``ColwiseParallel`` on ``wq``, ``wk``, ``wv`` (each rank computes its own heads) and ``w1``;
    ``RowwiseParallel`` on ``wo`` and ``w2`` (partial sums, all-reduced); a vocabulary-sharded
    embedding (``RowwiseParallel(input_layouts=Replicate())``: an embedding's input is token
    ids, not a sharded activation) and head (``ColwiseParallel`` with vocabulary-sharded
    DTensor logits: run `loss` and its backward inside ``loss_parallel()``).

    With ``sequence_parallel=True`` the norms and the residual stream are sharded along the
    sequence (``SequenceParallel``); attention and the MLP all-gather their input first
    (``PrepareModuleInput``), and ``wo``/``w2`` reduce-scatter instead of all-reduce. Use with
    ``parallelize_module(model, mesh, tp_plan())`` on a 1-D mesh (``mesh["tp"]`` of a 2-D one);
    ``heads`` must be divisible by the mesh size.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    sp = sequence_parallel
    stream = Shard(1) if sp else Replicate()  # the residual stream: sequence-sharded or whole
    plan = {
        "tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=stream),
        "layers.*.attn.wq": ColwiseParallel(),
        "layers.*.attn.wk": ColwiseParallel(),
        "layers.*.attn.wv": ColwiseParallel(),
        "layers.*.attn.wo": RowwiseParallel(output_layouts=stream),
        "layers.*.mlp.w1": ColwiseParallel(),
        "layers.*.mlp.w2": RowwiseParallel(output_layouts=stream),
        "head": ColwiseParallel(input_layouts=stream, output_layouts=Shard(-1),
                                use_local_output=False),
    }
    if sp:
        gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        plan.update({
            "pos": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0)),
            "layers.*.ln1": SequenceParallel(),
            "layers.*.ln2": SequenceParallel(),
            "layers.*.attn": gather,
            "layers.*.mlp": gather,
            "norm": SequenceParallel(),
        })
    return plan


def loss(logits, targets):
    """Mean cross-entropy of ``logits`` (batch, seq, vocab) against ``targets`` (batch, seq).

    Works on vocabulary-sharded DTensor logits inside ``torch.distributed.tensor.parallel.
    loss_parallel()`` (run the backward inside it too)."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(0, 1))


def batch(step: int, batch_size: int, config: Config | None = None, seed: int = 0):
    """The batch of a training step: ``(tokens, targets)``, int64 tensors of (batch_size, seq_len).

    Every sequence starts at a random token and then follows a fixed random successor table
    (a permutation of the vocabulary drawn from ``seed``): the next token is a function of the
    current one, so a model learns it and the loss falls from ln(vocab) towards 0. ``targets``
    are the tokens shifted by one. The same (step, batch_size, config, seed) gives the same
    batch on every rank; a data-parallel rank takes its part, e.g. ``tokens.chunk(world)[rank]``.

    Args:
        step: the training step (int >= 0); each step has its own batch.
        batch_size: sequences in the batch (int >= 1).
        config: a `Config` (its ``vocab`` and ``seq_len``); default ``Config()``.
        seed: chooses the successor table and the start tokens.

    Raises:
        ValueError: ``step`` < 0 or ``batch_size`` < 1 (or not ints).
        TypeError: ``config`` is not a `Config`.
    """
    config = Config() if config is None else config
    if not isinstance(config, Config):
        raise InputTypeError(f"config must be a distlab.gpt.Config, got {type(config).__name__}")
    for name, value, low in (("step", step, 0), ("batch_size", batch_size, 1)):
        check_int(value, name, low=low)
    successor = torch.randperm(config.vocab, generator=torch.Generator().manual_seed(seed))
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step + 1)
    stream = torch.empty(batch_size, config.seq_len + 1, dtype=torch.int64)
    stream[:, 0] = torch.randint(config.vocab, (batch_size,), generator=generator)
    for t in range(config.seq_len):
        stream[:, t + 1] = successor[stream[:, t]]
    # Two separate tensors (not views of one stream): each owns exactly its own memory.
    return stream[:, :-1].clone(), stream[:, 1:].clone()


def make_optimizer(params, name: str = "adamw", lr: float = 1e-2):
    """The optimizer `reference_run` uses, for the layouts to build the same one.

    ``"adamw"``: AdamW(lr, betas=(0.9, 0.95), weight_decay=0.1); ``"sgd"``: SGD(lr,
    momentum=0.9). Build it *after* wrapping or sharding the model (``fully_shard`` replaces the
    parameters; an optimizer built before holds the old ones).

    Raises:
        ValueError: an unknown ``name`` (the message lists the known ones).
    """
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    raise InputError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")


def reference_run(
    config: Config | None = None,
    steps: int = 3,
    *,
    optimizer: str = "adamw",
    lr: float = 1e-2,
    batch_size: int = 8,
    seed: int = 0,
    data_seed: int = 0,
):
    """Train `GPT` in this one process for ``steps`` steps and record every step.

    Each step: ``batch(step, batch_size, config, data_seed)``, forward, `loss`, backward,
    ``optimizer.step()``, then a record of the loss, every gradient, every parameter after the
    step and the optimizer's state (names -> tensors), then ``zero_grad()``. A parallel layout
    that starts from ``GPT(config, seed)`` and trains on the same batches must record the same
    numbers (`distlab.gradcheck.compare`).

    Args:
        config: a `Config` (default ``Config()``).
        steps: training steps (int >= 1).
        optimizer: ``"adamw"`` or ``"sgd"`` (see `make_optimizer`).
        lr: learning rate.
        batch_size: sequences per step (the *global* batch of a data-parallel layout).
        seed: the model's seed (`GPT`). data_seed: the batches' seed (`batch`).

    Returns:
        A `distlab.gradcheck.Recorder`: ``.losses`` (one float per step), and per step
        ``.steps[step].grads`` / ``.params`` / ``.state`` (dicts of names -> tensors).

    Raises:
        ValueError: ``steps`` < 1, an unknown optimizer, or a bad batch size (from `batch`).
    """
    from .gradcheck import Recorder

    check_int(steps, "steps", low=1)
    config = Config() if config is None else config
    model = GPT(config, seed=seed)
    opt = make_optimizer(model.parameters(), optimizer, lr)
    recorder = Recorder()
    for step in range(steps):
        tokens, targets = batch(step, batch_size, config, data_seed)
        value = loss(model(tokens), targets)
        value.backward()
        opt.step()
        recorder.record(step, value, model, opt)
        opt.zero_grad()
    return recorder
