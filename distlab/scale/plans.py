"""Lay a `model.Llama` pipeline stage out on a DeviceMesh with PyTorch's own parallel APIs, in
torchtitan's order: tensor parallelism (``parallelize_module``), context and expert parallelism
(this module's collectives), activation checkpointing, then FSDP (``fully_shard``, HSDP on a 2-D
mesh, or replication for ``zero=0``).

The tensor-parallel plan is Megatron-LM's as torchtitan writes it: q, k, v and the MLP's w1, w3
column-wise, wo and w2 row-wise, the embedding row-wise (by vocabulary), the output layer
column-wise; with sequence parallelism the norms and residuals are sharded by sequence and
all-gathered before each attention and MLP, and reduce-scattered after.

Each ``apply_*`` takes ``module``: the `model.Llama` that holds this rank's pipeline stage (a
stage is its number, as everywhere in `distlab.scale`).

Knows nothing about measuring: `simulate` does that.
"""

from __future__ import annotations

import functools

import torch
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from .. import _torch
from .model import MoE

__all__ = ["apply_checkpointing", "apply_context_parallel", "apply_expert_parallel",
           "apply_fsdp", "apply_tensor_parallel"]


def apply_tensor_parallel(module, tp_mesh, *, sequence_parallel: bool, loss_parallel: bool):
    """Megatron's split of every block, the embedding and the output layer over ``tp_mesh``."""
    sp = sequence_parallel
    seq = Shard(1) if sp else Replicate()
    top = {}
    if module.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if module.output is not None:
        top["norm"] = SequenceParallel() if sp else None
        top["output"] = ColwiseParallel(
            input_layouts=seq,
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    parallelize_module(module, tp_mesh, {k: v for k, v in top.items() if v is not None})
    for block in module.layers.values():
        plan = {
            "attention": PrepareModuleInput(input_layouts=(seq,),
                                            desired_input_layouts=(Replicate(),)),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=seq),
            "feed_forward": PrepareModuleInput(input_layouts=(seq,),
                                               desired_input_layouts=(Replicate(),)),
        }
        if sp:
            plan["attention_norm"] = SequenceParallel()
            plan["ffn_norm"] = SequenceParallel()
        if isinstance(block.feed_forward, MoE):
            # The router sees every token of the sequence; the experts are split by expert
            # parallelism, not by tp (tp ranks hold the same experts and the same tokens).
            plan["feed_forward"] = PrepareModuleInput(
                input_layouts=(seq,), desired_input_layouts=(Replicate(),),
                use_local_output=True)
        else:
            plan |= {"feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
                     "feed_forward.w2": RowwiseParallel(output_layouts=seq)}
        parallelize_module(block, tp_mesh, plan)
        if isinstance(block.feed_forward, MoE) and sp:
            # The MoE returns a plain tensor for the whole sequence; back to sequence shards.
            block.feed_forward.register_forward_hook(
                lambda mod, args, out, mesh=tp_mesh: _scatter_sequence(out, mesh))


def _scatter_sequence(out, mesh):
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(out, mesh, [Replicate()]).redistribute(mesh, [Shard(1)]).to_local()


def apply_context_parallel(module, cp_mesh, seq_len: int):
    """Each rank holds ``seq_len / cp`` tokens; before attention, every layer all-gathers the
    keys and values of the whole sequence over ``cp_mesh`` (the Llama 3 paper's context
    parallelism: K and V are small under grouped-query attention); its backward reduce-scatters
    their gradients. ``rope_offset`` is this rank's first position."""
    cp = cp_mesh.size()
    group = cp_mesh.get_group()
    funcol = _torch.functional_collectives()
    gather = functools.partial(funcol.all_gather_single_autograd, gather_dim=2, group=group)
    for block in module.layers.values():
        block.attention.kv_gather = gather
        block.attention.rope_offset = cp_mesh.get_local_rank() * (seq_len // cp)


def apply_expert_parallel(module, ep_mesh):
    """Each rank keeps ``experts / ep`` of every MoE layer's experts; tokens go to the rank that
    holds their expert and come back with ``all_to_all_single`` (equal splits: the routing is
    balanced)."""
    ep = ep_mesh.size()
    group = ep_mesh.get_group()
    funcol = _torch.functional_collectives()

    def exchange(rows):  # (experts, rows each, hidden): send each expert's rows to its rank
        out = funcol.all_to_all_single(rows.reshape(-1, rows.shape[-1]).contiguous(), None,
                                       None, group)
        # from rank j: its rows for my experts; grouped by my local expert
        return out.view(ep, rows.shape[0] // ep, -1, rows.shape[-1]).transpose(0, 1)

    def back(out):  # (local experts, ep x rows each, hidden) -> (experts, rows each, hidden)
        local, rows, h = out.shape
        out = out.view(local, ep, rows // ep, h).transpose(0, 1).reshape(-1, h).contiguous()
        back = funcol.all_to_all_single(out, None, None, group)
        return back.view(ep * local, rows // ep, h)

    for block in module.layers.values():
        moe = block.feed_forward
        if isinstance(moe, MoE):
            experts = moe.experts
            for name in ("w1", "w3", "w2"):
                w = getattr(experts, name)
                setattr(experts, name, torch.nn.Parameter(
                    torch.empty(moe.n // ep, *w.shape[1:], device=w.device, dtype=w.dtype)))
            moe.exchange = (exchange, back)


def selective_policy(ctx, op, *args, **kwargs):
    """Keep the outputs of matmuls and attention (what is expensive to recompute); recompute
    norms, rotary embeddings, SiLU and products (cheap, memory-bound) in backward."""
    from torch.utils.checkpoint import CheckpointPolicy

    keep = {torch.ops.aten.mm.default, torch.ops.aten.bmm.default, *_torch.sdpa_ops(),
            *_torch.functional_collective_ops()}
    return CheckpointPolicy.MUST_SAVE if op in keep else CheckpointPolicy.PREFER_RECOMPUTE


def alternate_contexts():
    """A block's selective-checkpointing contexts for "op-selective-alternate", torchtitan's
    policy of December 2024 (``_get_custom_policy`` in its ``activation_checkpoint.py``): as
    `selective_policy`, but of the matmuls only the 1st, 3rd, 5th, ... of each forward are kept
    (counted apart in the forward and in backward's recomputation, which must agree)."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    counts = {"forward": 0, "recompute": 0}

    def policy(ctx, op, *args, **kwargs):
        if op == torch.ops.aten.mm.default:
            mode = "recompute" if ctx.is_recompute else "forward"
            counts[mode] += 1
            if counts[mode] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return selective_policy(ctx, op, *args, **kwargs)

    return create_selective_checkpoint_contexts(policy)


def apply_checkpointing(module, how: str):
    """"full" recomputes every block in backward (keeps its input); "selective" (Megatron-LM's,
    Korthikanti et al.'s) recomputes attention's core, softmax(q k^T) v, and keeps its inputs:
    with flash attention the scores are never kept anyway, so it saves only the log-sum-exp;
    "op-selective" recomputes every op but `selective_policy`'s (every matmul's output kept);
    "op-selective-alternate" (torchtitan's) keeps every other matmul's (`alternate_contexts`)."""
    if how == "none":
        return
    if how == "selective":
        for block in module.layers.values():
            block.attention.checkpoint_core = True
        return
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    for name, block in list(module.layers.items()):
        if how == "full":
            wrapped = _torch.checkpoint_wrapper(block, checkpoint_fn=checkpoint,
                                                use_reentrant=False)
        else:
            contexts = (alternate_contexts if how == "op-selective-alternate" else
                        functools.partial(create_selective_checkpoint_contexts,
                                          selective_policy))
            wrapped = _torch.checkpoint_wrapper(
                block, checkpoint_fn=checkpoint, use_reentrant=False, context_fn=contexts,
                **_torch.sac_options())
        module.layers[name] = wrapped


def apply_fsdp(module, dp_mesh, *, reshard: bool, precision: str, expert_mesh=None):
    """``fully_shard`` each block, the embedding, and the norm with the output layer, then the
    whole module (torchtitan's units). ``dp_mesh`` is 1-D (FSDP) or 2-D (HSDP: replicate, shard;
    with shards of one rank: DDP). ``reshard``: free the gathered parameters after each unit's
    forward (not the last block's, which backward needs first, as torchtitan does); False keeps
    them (FSDP's ZeRO-2-like mode; torchtitan's choice with pipelining). Experts are sharded
    over ``expert_mesh`` (the dp ranks that hold the same experts)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if precision == "bf16-fsdp2" else MixedPrecisionPolicy())
    blocks = list(module.layers.values())
    for i, block in enumerate(blocks):
        unit_reshard = reshard and i < len(blocks) - 1
        inner = _torch.unwrap_checkpoint(block)
        if isinstance(inner.feed_forward, MoE) and expert_mesh is not None:
            fully_shard(inner.feed_forward.experts, mesh=expert_mesh, mp_policy=policy,
                        reshard_after_forward=unit_reshard)
        fully_shard(block, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=unit_reshard)
    if module.tok_embeddings is not None:
        fully_shard(module.tok_embeddings, mesh=dp_mesh, mp_policy=policy,
                    reshard_after_forward=reshard)
    if module.output is not None:
        fully_shard([module.norm, module.output], mesh=dp_mesh, mp_policy=policy,
                    reshard_after_forward=False)
    fully_shard(module, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=False)
