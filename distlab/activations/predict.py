"""The activation formula of Korthikanti et al. 2022, counted op by op for `distlab.gpt.GPT`."""

from __future__ import annotations

import torch

from .._config import check_int
from ..errors import InputError
from .result import OUTSIDE, Activations

__all__ = ["korthikanti", "predict"]


def predict(config=None, batch_size: int = 8, seq_len: int | None = None, *,
            dtype=torch.float32, checkpoint: bool = False, tp: int = 1,
            sequence_parallel: bool = False) -> Activations:
    """What `Meter` should measure for `distlab.gpt.GPT` in train mode, counted op by op.

    Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models")
    count sbh(34 + 5as/h) bytes per layer for 2-byte values with dropout (s sequence, b batch,
    h width, a heads; see `korthikanti`). Here each term is named and kept where it applies:
    values of ``dtype`` (4 bytes for float32), dropout masks only when ``config.dropout > 0``
    (on the CPU a mask is a tensor of the input's dtype, not 1 byte), plus what the paper leaves
    out: each LayerNorm's mean and 1/std (2sb values), the embedding's token and position ids,
    the final norm, the head's input, and the loss's log-softmax (bsv values) and targets.
    Tensors that two ops save count once, as the meter counts them.

    Args:
        config: a `distlab.gpt.Config` (default ``Config()``).
        batch_size: b. seq_len: s (default ``config.seq_len``).
        dtype: the dtype the model runs in (its element size is used; with ``sdpa=True`` the
            fused kernel keeps its log-sum-exp in float32 for bf16 and fp16 values).
        checkpoint: True when every block runs under ``torch.utils.checkpoint`` (any flavour,
            or ``checkpoint_wrapper``): a block then keeps only its input (sbh values).
        tp: the tensor-parallel size of ``gpt.tp_plan()``: what one rank keeps. Attention's and
            the MLP's insides shrink by tp; the norms' inputs, the input of ``wq``/``wk``/``wv``
            and ``w1``, and the head's input stay whole (replicated).
        sequence_parallel: with ``gpt.tp_plan(sequence_parallel=True)``: the norms' inputs
            shrink by tp too. The inputs of ``wq``/``w1``/``head`` stay whole: torch's
            sequence parallelism keeps the all-gathered tensor for backward (Megatron-LM
            gathers it again in backward instead, which gives the paper's 34/t).

    Returns:
        An `Activations` with the same module names the meter uses, ``params`` (the weights
        that Linear and LayerNorm save; this rank's shards), and ``terms``: one
        ``(module, what, bytes)`` per counted tensor.

    Raises:
        ValueError: ``batch_size``, ``seq_len`` or ``tp`` not an int >= 1, ``seq_len`` longer
            than ``config.seq_len``; ``sdpa=True`` or ``tp > 1`` with dropout (not predicted);
            ``heads``, the MLP width or ``vocab`` not divisible by ``tp``;
            ``sequence_parallel`` without ``tp > 1``, or ``seq_len`` not divisible by ``tp``.
    """
    from ..gpt import Config

    config = Config() if config is None else config
    s = config.seq_len if seq_len is None else seq_len
    for name, value in (("batch_size", batch_size), ("seq_len", s), ("tp", tp)):
        check_int(value, name, low=1)
    if s > config.seq_len:
        raise InputError(f"seq_len={s} is longer than config.seq_len={config.seq_len}")
    if config.dropout and (config.sdpa or tp > 1):
        raise InputError("predict() does not cover dropout > 0 with sdpa=True or tp > 1")
    for what, size in (("heads", config.heads), ("the MLP width", config.intermediate),
                       ("vocab", config.vocab)):
        if size % tp:
            raise InputError(f"{what} ({size}) must be divisible by tp={tp}")
    if sequence_parallel and (tp == 1 or s % tp):
        raise InputError(f"sequence_parallel needs tp > 1 dividing seq_len={s}; got tp={tp}")
    b, h, a, v, f = batch_size, config.hidden, config.heads, config.vocab, config.intermediate
    e = torch.empty((), dtype=dtype).element_size()
    sbh, as2b, drop = s * b * h, a * s * s * b, config.dropout > 0
    terms, params = [], {}

    def add(module, what, values, split=False, size=e):
        """A saved tensor of ``values`` elements; ``split``: this rank keeps 1/tp of it."""
        n = tp if split else 1
        terms.append((module, what + (f" / tp={tp}" if n > 1 else ""), size * values // n))

    def weights(module, *shapes):
        params[module] = params.get(module, 0) + e * sum(x * y // tp for x, y in shapes)

    def norm(module):
        add(module, "LayerNorm input (sbh)", sbh, sequence_parallel)
        add(module, "LayerNorm mean and 1/std (2sb)", 2 * s * b, sequence_parallel)
        params[module] = params.get(module, 0) + e * 2 * h  # weight and bias: replicated

    add("tok", "token ids (int64, bs)", b * s, size=8)
    add("pos", "position ids (int64, s)", s, size=8)
    if drop:
        add("drop", "embedding dropout mask (sbh)", sbh)
    for i in range(config.layers):
        p = f"layers.{i}"
        if checkpoint:
            add(p, "the checkpoint keeps the block's input (sbh)", sbh)
            continue
        norm(f"{p}.ln1")
        add(f"{p}.attn.wq", "input of wq, wk, wv: ln1's output, saved 3 times, kept once (sbh)",
            sbh)
        for w in ("wq", "wk", "wv", "wo"):
            weights(f"{p}.attn.{w}", (h, h))
        if config.sdpa:
            add(f"{p}.attn", "q, k, v: views of wq/wk/wv's outputs (3sbh)", 3 * sbh, True)
            add(f"{p}.attn", "attention output, also wo's input: joining the heads is a view "
                "(sbh)", sbh, True)
            # The fused kernel keeps its log-sum-exp in the accumulation type: float32 for
            # bf16 and fp16 values, the values' own for float32 and float64.
            add(f"{p}.attn", "log-sum-exp per query, at least fp32 (asb)", a * s * b, True,
                size=max(e, 4))
        else:
            add(f"{p}.attn", "Q and K, copied to (b*a, s, h/a) for QK^T (2sbh)", 2 * sbh, True)
            add(f"{p}.attn", "softmax output, also probs@V's input unless dropped out (as^2b)",
                as2b, True)
            add(f"{p}.attn", "V, copied for probs@V (sbh)", sbh, True)
            if drop:
                add(f"{p}.attn.attn_drop", "attention dropout mask (as^2b)", as2b)
                add(f"{p}.attn", "dropped-out probabilities, probs@V's input (as^2b)", as2b)
            add(f"{p}.attn.wo", "heads joined again: a copy, wo's input (sbh)", sbh, True)
        if drop:
            add(f"{p}.attn.drop", "dropout mask after attention (sbh)", sbh)
        norm(f"{p}.ln2")
        add(f"{p}.mlp.w1", "w1's input: ln2's output (sbh)", sbh)
        add(f"{p}.mlp.act", "GELU's input: w1's output (4sbh)", s * b * f, True)
        add(f"{p}.mlp.w2", "w2's input: GELU's output (4sbh)", s * b * f, True)
        weights(f"{p}.mlp.w1", (h, f))
        weights(f"{p}.mlp.w2", (f, h))
        if drop:
            add(f"{p}.mlp.drop", "dropout mask after the MLP (sbh)", sbh)
    norm("norm")
    add("head", "head's input: the final norm's output (sbh)", sbh)
    weights("head", (v, h))  # tied or not: the head saves the weight it multiplies by
    add(OUTSIDE, "cross-entropy: log-softmax output (bsv)", b * s * v, True)
    add(OUTSIDE, "cross-entropy: targets (int64, bs)", b * s, size=8)
    add(OUTSIDE, "cross-entropy: total weight (one value)", 1)

    modules = {}
    for module, _, nbytes in terms:
        modules[module] = modules.get(module, 0) + nbytes
    return Activations(modules, params, _gpt_modules(config), (), tuple(terms))


def _gpt_modules(config) -> tuple:
    """`distlab.gpt.GPT`'s module names, in ``named_modules()`` order."""
    block = ("", ".ln1", ".attn", ".attn.wq", ".attn.wk", ".attn.wv", ".attn.wo",
             ".attn.attn_drop", ".attn.drop", ".ln2", ".mlp", ".mlp.w1", ".mlp.act", ".mlp.w2",
             ".mlp.drop")
    layers = [f"layers.{i}{part}" for i in range(config.layers) for part in block]
    return ("", "tok", "pos", "drop", "layers", *layers, "norm", "head")


def korthikanti(config=None, batch_size: int = 8, seq_len: int | None = None) -> int:
    """Korthikanti et al. 2022's activation bytes per transformer layer, as published:
    sbh(34 + 5as/h), for 2-byte values, 1-byte dropout masks, no tensor parallelism."""
    from ..gpt import Config

    config = Config() if config is None else config
    s = config.seq_len if seq_len is None else seq_len
    sbh = s * batch_size * config.hidden
    return sbh * 34 + 5 * config.heads * s * s * batch_size
