"""A Llama-architecture transformer built from a calculator's `Transformer` config, to be laid out
by PyTorch's own parallel code at its real size, on the meta device and under fake tensors.

    from distlab.calculators import PRESETS
    from distlab.scale.model import Llama
    with torch.device("meta"):
        module = Llama(PRESETS["Llama-3 70B"], layers=range(0, 10), first=True, last=False)

Names follow torchtitan's Llama (``tok_embeddings``, ``layers.<i>.attention.wq``,
``layers.<i>.feed_forward.w1``, ``norm``, ``output``) so that its tensor-parallel plan reads
the same. The layers are numbered as in the whole model, so a pipeline stage that holds layers
40-49 calls them ``layers.40`` to ``layers.49``.

What autograd keeps is what a GPU run keeps, on any device:

- `RMSNorm` saves its input and 1/rms, as CUDA's fused kernel does (CPU's ``nn.RMSNorm`` is a
  composite that keeps two fp32 copies of its input; the numbers here are meant for GPUs);
- attention is ``F.scaled_dot_product_attention`` with ``enable_gqa=True`` (flash attention
  keeps q, k, v at their own sizes, the output and the log-sum-exp per query), or written out
  (``attention="written"``: the softmax of the scores, ``a s^2 b`` values, is kept as well);
- rotary embeddings are applied in fp32 and keep nothing (the angle table needs no gradient);
- a mixture of experts routes tokens perfectly evenly (every expert gets ``tokens * top_k /
  experts`` rows: capacity factor 1, nothing dropped), so that shapes do not depend on values:
  fake tensors have none. With expert parallelism the rows travel by ``all_to_all_single``.

Knows nothing about meshes or parallel plans: `plans` applies those.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import InputError

__all__ = ["ATTENTIONS", "Attention", "Experts", "FeedForward", "Llama", "MoE", "RMSNorm"]

ATTENTIONS = ("sdpa", "written")


class _RMSNormFunction(torch.autograd.Function):
    """y = x / rms(x) * w, with rms(x) = sqrt(mean(x^2) + eps) computed in fp32. Keeps x and
    1/rms for backward, as a fused kernel does."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        x32 = x.float()
        rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (x32 * rstd).type_as(x) * weight

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        x32, g32 = x.float(), grad.float()
        normed = x32 * rstd
        grad_weight = (g32 * normed).flatten(0, -2).sum(0).to(weight.dtype)
        gw = g32 * weight.float()
        grad_x = rstd * (gw - normed * (gw * normed).mean(-1, keepdim=True))
        return grad_x.type_as(x), grad_weight, None


class RMSNorm(nn.Module):
    """Root-mean-square normalisation with a learned scale, keeping what a fused kernel keeps."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return _RMSNormFunction.apply(x, self.weight, self.eps)


def rope_table(seq_len: int, head_dim: int, *, offset: int = 0, theta: float = 500000.0,
               device=None) -> torch.Tensor:
    """cos and sin of the rotary angles, (2, seq_len, head_dim // 2), fp32 (Llama 3's theta)."""
    freqs = theta ** -(torch.arange(0, head_dim, 2, device=device).float() / head_dim)
    positions = torch.arange(offset, offset + seq_len, device=device).float()
    angles = torch.outer(positions, freqs)
    return torch.stack([angles.cos(), angles.sin()])


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate pairs of x's last dim, x: (batch, seq, heads, head_dim)."""
    cos, sin = rope[0][None, :, None, :], rope[1][None, :, None, :]
    a, b = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2).type_as(x)


class Attention(nn.Module):
    """Grouped-query attention with rotary embeddings. Head counts come from the local weights'
    shapes, so the same code runs whole or tensor-parallel (``heads / tp`` heads per rank).
    ``kv_gather``, when set, is called on k and v before attention (context parallelism
    gathers the other ranks' keys and values, as the Llama 3 paper does). Under context
    parallelism the causal mask of a rank's queries against the whole sequence is not built:
    these layers compute shapes under fake tensors, not values."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, attention: str = "sdpa"):
        super().__init__()
        if attention not in ATTENTIONS:
            raise InputError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
        self.head_dim = hidden // heads
        self.wq = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, hidden, bias=False)
        self.attention = attention
        self.kv_gather = None
        self.rope_offset = 0  # the position of this rank's first token (context parallelism)
        self.checkpoint_core = False

    def forward(self, x):
        b, s, _ = x.shape
        rope = rope_table(s, self.head_dim, offset=self.rope_offset, device=x.device)
        q = apply_rope(self.wq(x).view(b, s, -1, self.head_dim), rope).transpose(1, 2)
        k = apply_rope(self.wk(x).view(b, s, -1, self.head_dim), rope).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        if self.kv_gather is not None:
            k, v = self.kv_gather(k), self.kv_gather(v)
        if self.checkpoint_core:  # Megatron's selective recomputation: the attention core
            from torch.utils.checkpoint import checkpoint

            out = checkpoint(self.core, q, k, v, use_reentrant=False)
        else:
            out = self.core(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))

    def core(self, q, k, v):
        """softmax(q k^T / sqrt(d)) v, causal, heads of k and v shared by groups of q's."""
        if self.attention == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scores = q @ k.transpose(-2, -1) * self.head_dim**-0.5
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
        return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.w1 = nn.Linear(hidden, intermediate, bias=False)
        self.w3 = nn.Linear(hidden, intermediate, bias=False)
        self.w2 = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Experts(nn.Module):
    """``n`` SwiGLU experts as three stacked weights (one batched matmul each): ``w1``, ``w3``
    (n, intermediate, hidden) and ``w2`` (n, hidden, intermediate). Takes rows grouped by
    expert, (n, rows each, hidden)."""

    def __init__(self, n: int, hidden: int, intermediate: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(n, intermediate, hidden))
        self.w3 = nn.Parameter(torch.empty(n, intermediate, hidden))
        self.w2 = nn.Parameter(torch.empty(n, hidden, intermediate))

    def forward(self, rows):
        up = F.silu(torch.bmm(rows, self.w1.transpose(1, 2)))
        return torch.bmm(up * torch.bmm(rows, self.w3.transpose(1, 2)), self.w2.transpose(1, 2))


class MoE(nn.Module):
    """A mixture of SwiGLU experts with top-k routing, perfectly balanced (see the module's
    notes): ``router`` and ``experts`` (all of them, or ``experts / ep`` once `plans` has laid
    them out). ``exchange``, when set, is ``(dispatch, combine)``: functions that send each
    expert's rows to the rank holding it and bring the results back (expert parallelism)."""

    def __init__(self, hidden: int, intermediate: int, experts: int, top_k: int):
        super().__init__()
        self.n, self.top_k = experts, top_k
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = Experts(experts, hidden, intermediate)
        self.exchange = None

    def forward(self, x):
        b, s, h = x.shape
        tokens = x.reshape(-1, h)
        gates, _ = torch.softmax(self.router(tokens).float(), -1).topk(self.top_k, -1)
        # Balanced routing: k copies of each token, dealt out to the experts in turn.
        rows = tokens.repeat_interleave(self.top_k, 0).view(self.n, -1, h)
        if self.exchange is not None:
            rows = self.exchange[0](rows)
        out = self.experts(rows.reshape(self.experts.w1.shape[0], -1, h))
        if self.exchange is not None:
            out = self.exchange[1](out)
        out = out.reshape(-1, self.top_k, h) * gates.unsqueeze(-1).type_as(out)
        return out.sum(1).view(b, s, h)


class Block(nn.Module):
    def __init__(self, config, attention: str):
        super().__init__()
        c = config
        self.attention_norm = RMSNorm(c.hidden)
        self.attention = Attention(c.hidden, c.heads, c.kv_heads, attention)
        self.ffn_norm = RMSNorm(c.hidden)
        if c.experts > 1:
            self.feed_forward = MoE(c.hidden, c.intermediate, c.experts, c.top_k)
        else:
            self.feed_forward = FeedForward(c.hidden, c.intermediate)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    """The layers ``layers`` of a Llama-architecture model (a pipeline stage), with the token
    embedding if ``first`` and the final norm and output layer if ``last``.

    ``forward(x)`` takes token ids (first stage) or hidden states (later stages) of shape
    (batch, seq[, hidden]) and returns hidden states, or the logits on the last stage.
    """

    def __init__(self, config, layers=None, *, first: bool = True, last: bool = True,
                 attention: str = "sdpa"):
        super().__init__()
        layers = range(config.layers) if layers is None else layers
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab, config.hidden) if first else None
        self.layers = nn.ModuleDict({str(i): Block(config, attention) for i in layers})
        self.norm = RMSNorm(config.hidden) if last else None
        self.output = nn.Linear(config.hidden, config.vocab, bias=False) if last else None

    def forward(self, x):
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        for block in self.layers.values():
            h = block(h)
        if self.output is not None:
            h = self.output(self.norm(h))
        return h
