"""Activation bytes of a Llama-architecture model, tensor by tensor, as PyTorch keeps them.

Counted op by op for the model `distlab.scale.model.Llama` lays out (SwiGLU, grouped-query
attention, RMSNorm, rotary embeddings, no dropout), and checked against what that model leaves
alive after its forward on simulated ranks (tests/test_scale_calculators.py): s tokens per rank
(``seq_len / cp``), b sequences, h hidden, i the MLP's width, a heads and g key-value heads of
d = h / a, t = tp, V the vocabulary, e bytes per activation (2 in bf16, 4 in fp32). Per layer:

    RMSNorm x 2        its input (e sbh, / t with sequence parallelism) and 1/rms (4 sb, / t)
    q, k, v, o input   the normed input, whole (e sbh: sequence parallelism all-gathers it,
                       and autograd keeps the gathered tensor; Megatron gathers it again in
                       backward instead)
    MLP input          the same, e sbh
    attention, flash   q (e sbh / t), k and v at their own size (e sb gd / t each; with cp > 1
                       the gathered ones: e (cp s) b gd / t), the output (e sbh / t) and the
                       log-sum-exp (4 sb a / t)
    attention, written q, k and v repeated to every head (e sbh / t each; k and v over cp s
                       tokens), the softmax of the scores (e b (a/t) s (cp s)), the causal
                       mask (s (cp s) bytes) and the output made contiguous (e sbh / t)
    SwiGLU             w1's and w3's outputs, SiLU's output and the product: 4 e sbi / t
    a mixture of       the router's probabilities (4 sb E) and choices (8 sb k), each token's
    experts            k copies of each token at its experts (e sbkh; with expert parallelism
                       the copies received, not those sent), 4 e sbki inside the experts,
                       their outputs (e sbkh) and gates (4 sbk)

The first stage adds the token ids (8 sb), the last the final norm's input and 1/rms, the
output layer's input (e sbh) and, with ``loss="upcast"`` (torchtitan's
``cross_entropy(pred.flatten(0, 1).float(), ...)``), the log-softmax in fp32 that
``cross_entropy`` saves for its backward (4 sbV, / t with loss parallelism), and the loss itself
(4 bytes); with ``loss="fused"`` (a fused or chunked cross-entropy: Liger-Kernel's fused linear
cross-entropy, Apple's cut cross-entropy) nothing V-wide is kept. What the upcast loss holds
only while it runs is `loss_transient`.

Two implementations, a named choice (``implementation``):

    "eager"     PyTorch eager, as torchtitan and `distlab.scale` run it: sequence parallelism's
                all-gather output is what the q, k, v and w1, w3 matmuls save (e sbh each, whole),
                and an unfused SwiGLU keeps four tensors (w1's and w3's outputs, SiLU's output,
                the product: 4 e sbi / t).
    "megatron"  Megatron-LM's: the linears save their sequence-sharded input and all-gather it
                again in backward (e sbh / t each), and the fused SwiGLU keeps two tensors (fc1's
                output, w1 and w3 side by side, and fc2's input: 3 e sbi / t).

Full checkpointing keeps each layer's input only (e sbh, / t with sequence parallelism).
Selective checkpointing as Korthikanti et al. mean it (attention's core recomputed) keeps q, k,
v and the output instead of what the core keeps: with flash attention that is the log-sum-exp
less, nothing more; with attention written out, the softmax and the mask less. Op-level
selective checkpointing (`distlab.scale.plans`' policy: matmul, attention and collective outputs
kept; norms, SiLU and products recomputed, as torchtitan's "op" mode does) keeps the layer's
input, the outputs of its matmuls (q, k, v, o, w1, w3, w2; o and w2 before their reduce-scatter
with sequence parallelism, and with it the all-gathered inputs and reduce-scattered outputs) and
attention's output and log-sum-exp. A stage that is not the last keeps its output until its
backward (e sbh, / t with sequence parallelism); every layer keeps its rotary table (4 s d).
"op-selective-alternate" is torchtitan's "op" policy as its December 2024 benchmarks ran it
(`torchtitan/parallelisms/parallelize_llama.py` at 9dec370, ``_get_custom_policy``: "save every
other mm"): of the seven matmuls in a layer, the 1st, 3rd, 5th and 7th outputs are kept (q, v,
w1, w2) and k, o and w3 recomputed; collectives' outputs are kept as above.

Knows nothing about parameters or optimizers: `memory_estimate` adds those.
"""

from __future__ import annotations

__all__ = ["IMPLEMENTATIONS", "LOSSES", "llama_terms", "loss_transient"]

IMPLEMENTATIONS = ("eager", "megatron")
LOSSES = ("upcast", "fused")


def llama_terms(m, *, seq_len: int, micro_batch: int, tp: int, cp: int, sp: bool, e: int,
                attention: str = "sdpa", checkpointing: str = "none", layers: int,
                first: bool, last: bool, ep: int = 1, loss_parallel: bool = True,
                implementation: str = "eager", loss: str = "upcast") -> list:
    """``[(what, bytes), ...]``: the activations one microbatch leaves alive on a rank holding
    ``layers`` layers of ``m`` (a gated `Transformer`); see the module's docstring."""
    s, b, t = seq_len // cp, micro_batch, tp
    h, i, a, g = m.hidden, m.intermediate, m.heads, m.kv_heads
    d = h // a
    sp = sp and t > 1
    ts = t if sp else 1  # what sequence parallelism shards by
    S = s * cp  # keys and values gathered over the context-parallel ranks
    sbh = s * b * h
    terms = []
    if checkpointing == "full":
        per_layer = [("layer input", e * sbh // ts)]
    else:
        norms = [("RMSNorm inputs", 2 * e * sbh // ts), ("RMSNorm 1/rms", 2 * 4 * s * b // ts),
                 ("rotary table (fp32)", 4 * s * d)]
        megatron = implementation == "megatron"
        gathered = [("attention and MLP inputs" + (" (sharded; re-gathered in backward)"
                                                   if megatron and sp else ""),
                     2 * e * sbh // (ts if megatron else 1))]
        if attention == "sdpa":
            attn = [("q", e * sbh // t), ("k, v", 2 * e * S * b * g * d // t),
                    ("attention output", e * sbh // t), ("log-sum-exp", 4 * s * b * a // t)]
        else:
            attn = [("q", e * sbh // t), ("k, v repeated", 2 * e * S * b * h // t),
                    ("softmax", e * b * (a // t) * s * S), ("causal mask", s * S),
                    ("attention output", e * sbh // t)]
        if m.experts > 1:
            k, E = m.top_k, m.experts
            mlp = [("router probabilities", 4 * s * b * E), ("router choices", 8 * s * b * k),
                   ("tokens at their experts", e * sbh * k),
                   ("experts' insides", 4 * e * s * b * k * i), ("experts' outputs", e * sbh * k),
                   ("gates", 4 * s * b * k)]
        else:
            # eager: w1's, w3's and SiLU's outputs and the product; Megatron's fused SwiGLU:
            # fc1's output (w1 and w3 side by side) and fc2's input
            mlp = [("SwiGLU", (3 if megatron else 4) * e * s * b * i // t)]
        if checkpointing == "selective":  # attention's core recomputed: its inputs kept
            attn = [("q", e * sbh // t), ("k, v", 2 * e * S * b * g * d // t),
                    ("attention output (the output layer's input)", e * sbh // t)]
        per_layer = norms + gathered + attn + mlp
        if checkpointing in ("op-selective", "op-selective-alternate"):
            per_layer = _op_selective(m, s, b, t, ts, e, implementation,
                                      alternate=checkpointing == "op-selective-alternate")
    for what, nbytes in per_layer:
        terms.append((what, layers * nbytes))
    if first:
        terms.append(("token ids", 8 * s * b))
    if not last:
        terms.append(("stage output, kept for its backward", e * sbh // ts))
    if last:
        terms += [("final RMSNorm", e * sbh // ts + 4 * s * b // ts),
                  ("output layer input", e * sbh)]
        if loss == "upcast":
            terms += [("log-softmax (fp32)",
                       4 * s * b * _vocab(m, t, loss_parallel))]
        terms.append(("loss", 4))
    return terms


def _vocab(m, t, loss_parallel) -> int:
    return -(-m.vocab // t) if t > 1 and loss_parallel else m.vocab  # padded, as the weights


def loss_transient(m, *, seq_len: int, micro_batch: int, tp: int, cp: int, loss: str,
                   loss_parallel: bool = True) -> int:
    """Bytes the loss holds only while it runs, beyond the log-softmax `llama_terms` counts
    (on the last stage). torchtitan's ``cross_entropy(pred.flatten(0, 1).float(), labels)``
    (``loss="upcast"``), per rank, with n = 4 sbV (/ t with loss parallelism) one fp32 copy of
    the logits: forward holds the bf16 logits (n/2), their fp32 upcast (n) and the log-softmax
    (n, counted); backward, after ``del pred``, holds the log-softmax (counted), nll_loss's
    gradient (n) and log_softmax's (n): 2n more, the larger. (A pipeline's last stage keeps
    its bf16 logits until the microbatch's backward: `memory_estimate` counts them with the
    microbatch's activations.) A fused loss
    (``loss="fused"``) works a chunk of tokens at a time: 0 here. At 8K tokens x 2 sequences and
    a 128K vocabulary n is 8.4 GB, so the upcast loss's backward holds 25 GB at once."""
    if loss == "fused":
        return 0
    n = 4 * (seq_len // cp) * micro_batch * _vocab(m, tp, loss_parallel)
    return 2 * n


def _op_selective(m, s, b, t, ts, e, implementation="eager", alternate=False) -> list:
    h, i, a, g = m.hidden, m.intermediate, m.heads, m.kv_heads
    d = h // a
    sbh = s * b * h
    if alternate:  # torchtitan Dec 2024: the 1st, 3rd, 5th and 7th matmul outputs kept
        kept = [("layer input", e * sbh // ts),
                ("q, v (1st and 3rd matmul outputs)", e * s * b * (h + g * d) // t),
                ("attention output", e * sbh // t), ("log-sum-exp", 4 * s * b * a // t),
                ("w2 output (whole sequence, before its reduction)", e * sbh),
                ("w1 output", e * s * b * i // t)]
    else:
        kept = [("layer input", e * sbh // ts),
                ("q, k, v (matmul outputs)", e * s * b * (h + 2 * g * d) // t),
                ("attention output", e * sbh // t), ("log-sum-exp", 4 * s * b * a // t),
                ("o, w2 outputs (whole sequence, before their reduction)", 2 * e * sbh),
                ("w1, w3 outputs", 2 * e * s * b * i // t)]
    if ts > 1:  # sequence parallelism's collectives are kept too
        gather = ts if implementation == "megatron" else 1
        kept += [("attention and MLP inputs (all-gathered)", 2 * e * sbh // gather),
                 ("o, w2 outputs reduce-scattered", 2 * e * sbh // ts)]
    return kept
