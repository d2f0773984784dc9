"""What one simulated rank does, counted while its step runs under fake tensors.

- `LocalFlops`: the FLOPs this rank computes, with torch's own formulas
  (``torch.utils.flop_counter``), counted on the *local* ops. ``FlopCounterMode`` counts a
  DTensor op at its global shape (8 times a tensor-parallel rank's work at tp 8); here a DTensor
  op is passed on (``NotImplemented``) to DTensor, and the local ops it runs come back through
  this mode and are counted. Beside them, the bytes the *other* ops move (``moved``): every op
  with no FLOP formula (norms, SwiGLU's silu and product, rotary's arithmetic, residual adds,
  casts, copies, the loss, the optimizer's update) reads its inputs and writes its outputs
  once, as PyTorch eager runs each op as one kernel; views, allocations and collectives move
  nothing here (collectives are timed as communication).
- `Collectives`: every collective this rank issues, with the bytes of its buffer and the mesh
  axis whose group it runs on ("axis" for a DeviceMesh axis, "dim" for a tensor dimension, as
  torchtitan names them); c10d's ops (FSDP's all-gathers and reduce-scatters) and the
  functional ones (DTensor's redistributions, context parallelism's all-gathers).

Knows nothing about models or layouts.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils.flop_counter import flop_registry

from .._torch import resolve_process_group
from .._torch_dispatch import TorchDispatchMode, tree_leaves, writes

__all__ = ["CollectiveCall", "Collectives", "LocalFlops", "moved_bytes"]


def _is_dtensor_call(types) -> bool:
    return any(issubclass(t, DTensor) for t in types)


_aten = torch.ops.aten
#: torch's formulas, and the CPU's flash attention counted as CUDA's is (the same two matmuls
#: forward, the same five backward; torch's registry knows only the GPU kernels).
_FORMULAS = dict(flop_registry)
_FORMULAS[_aten._scaled_dot_product_flash_attention_for_cpu] = (
    flop_registry[_aten._scaled_dot_product_flash_attention])
_FORMULAS[_aten._scaled_dot_product_flash_attention_for_cpu_backward] = (
    flop_registry[_aten._scaled_dot_product_flash_attention_backward])


#: ops that read a few rows of their first argument, picked by the second: what they read is
#: what they write (plus the indices), not the whole table (an embedding's 4 GB at 405B)
_GATHERS = {_aten.embedding, _aten.index_select, _aten.gather, _aten.nll_loss_forward,
            _aten.nll_loss2d_forward, _aten.index}
#: ops that move no bytes of their own: allocations (their fill is counted where it is written
#: by zero_/fill_) and bookkeeping
#: (views, ``detach`` and ``alias`` among them, are known by ``func.is_view``)
_FREE = {_aten.empty, _aten.empty_like, _aten.empty_strided, _aten.new_empty,
         _aten.new_empty_strided, _aten._local_scalar_dense, _aten.set_, _aten.resize_,
         _aten._unsafe_view}
#: ops that only write: fills, and tensors made like another (its shape, not its values)
_WRITES_ONLY = {_aten.zero_, _aten.fill_, _aten.zeros_like, _aten.ones_like, _aten.full_like,
                _aten.rand_like, _aten.randn_like}
#: fused Adam's kernel writes the gradient back only to unscale it (a ``grad_scale`` given),
#: though its schema marks the gradients written
_FUSED_ADAM = {_aten._fused_adam_, _aten._fused_adamw_}
#: collectives (timed as communication) and metadata (``prim.device``, ...) move nothing here
_NO_BYTES_NAMESPACES = ("c10d", "_c10d_functional", "_c10d_functional_autograd", "prim")


def moved_bytes(func, args, kwargs, out) -> int:
    """The bytes an op moves through memory if it runs as one kernel that reads each input
    once and writes each output once: 0 for views, allocations and collectives; for a gather
    (an embedding, the loss's pick of each target's log-probability), its output and indices
    read, not the whole table; for ``copy_(dst, src)``, src read and dst written; a fill or a
    ``zeros_like`` only writes; ``index_put_`` reads and writes its values, not the whole
    tensor; an in-place op that returns nothing writes what its schema marks written (fused
    Adam's gradients only with a ``grad_scale``); for FSDP2's
    ``all_gather_copy_in``, the shards it copies into the buffer it makes for the all-gather."""
    packet = func.overloadpacket
    if (func.is_view or packet in _FREE or packet in _FORMULAS
            or func.namespace in _NO_BYTES_NAMESPACES):
        return 0
    if func.namespace == "fsdp" and packet.__name__ == "all_gather_copy_in":
        return 2 * _nbytes(args[0])  # the shards copied in; the output buffer is only made
    if packet in (_aten.copy_, _aten._foreach_copy_):
        return _nbytes(args[1]) + _nbytes(args[0])  # the source read, the destination written
    if packet in _WRITES_ONLY:
        return _nbytes(out) or _nbytes(args[0])
    if packet in (_aten.index_put_, _aten.index_put):  # the values written where indexed
        return _nbytes(args[1:]) + _nbytes(args[2])
    if packet in _GATHERS:
        return _nbytes(args[1:]) + 2 * _nbytes(out)
    return _nbytes((args, kwargs)) + (_nbytes(out) or _written_in_place(func, args, kwargs))


def _written_in_place(func, args, kwargs) -> int:
    """The bytes of the arguments an op that returns nothing writes (the optimizer's fused
    update): those its schema marks written, less fused Adam's gradients when it has no
    ``grad_scale`` to unscale them with."""
    written = [a for a, w in zip(args, writes(func), strict=False) if w]
    if func.overloadpacket in _FUSED_ADAM and kwargs.get("grad_scale") is None:
        del written[1]  # (params, grads, exp_avgs, ...): the gradients, read only
    return _nbytes(written)


class LocalFlops(TorchDispatchMode):
    """FLOPs of the ops this rank runs on its own tensors, by op (``counts``) and in all
    (``total``); the bytes the other ops move, by op (``moved_by_op``) and in all (``moved``,
    see `moved_bytes`). A matmul of (m, k) by (k, n) is 2mkn; attention and convolutions as
    torch's flop counter counts them (attention: the whole score matrix, causal or not)."""

    def __init__(self):
        super().__init__()
        self.counts: Counter = Counter()
        self.moved_by_op: Counter = Counter()

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def moved(self) -> int:
        return sum(self.moved_by_op.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _is_dtensor_call(types):
            return NotImplemented
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = _FORMULAS.get(func.overloadpacket)
        if formula is not None:
            self.counts[str(func.overloadpacket)] += int(formula(*args, **kwargs, out_val=out))
        else:
            moved = moved_bytes(func, args, kwargs, out)
            if moved:
                self.moved_by_op[str(func.overloadpacket)] += moved
        return out


@dataclass(frozen=True)
class CollectiveCall:
    """One collective call: ``kind`` ("all_gather", "reduce_scatter", "all_reduce",
    "all_to_all", "send", "recv", "broadcast"), ``axis`` (the mesh axis, or several joined by
    "+"), ``ranks`` in its group, and ``nbytes``: the buffer S of the alpha-beta model (the
    input of all_reduce, reduce_scatter and all_to_all, the output of all_gather, the message
    of a send)."""

    kind: str
    axis: str
    ranks: int
    nbytes: int

    @property
    def sent(self) -> float:
        """Bytes each rank sends with a ring (``(N-1)/N S``, all_reduce twice that)."""
        n = self.ranks
        if self.kind in ("send", "recv", "broadcast"):
            return float(self.nbytes) if self.kind != "recv" else 0.0
        share = (n - 1) / n * self.nbytes
        return 2 * share if self.kind == "all_reduce" else share


#: namespace -> {op name: (kind, the positional argument that holds the buffer S, or None for the
#: op's return value)}. S is what the alpha-beta model calls S: the input of all_reduce,
#: reduce_scatter, all_to_all and broadcast, the output of all_gather.
_OPS = {
    "c10d": {
        "_allgather_base_": ("all_gather", 0),  # (output, input, group, ...)
        "allgather_into_tensor_coalesced_": ("all_gather", 0),  # (outputs, inputs, group)
        "allgather_": ("all_gather", 0),
        "_reduce_scatter_base_": ("reduce_scatter", 1),  # (output, input, group, ...)
        "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1),
        "reduce_scatter_": ("reduce_scatter", 1),
        "allreduce_": ("all_reduce", 0),  # (tensors, group, ...)
        "allreduce_coalesced_": ("all_reduce", 0),
        "alltoall_base_": ("all_to_all", 1),  # (output, input, group, ...)
        "broadcast_": ("broadcast", 0),
        "send": ("send", 0),
        "recv_": ("recv", 0),
    },
    "_c10d_functional": {
        "all_gather_into_tensor": ("all_gather", None),  # (input, group size, group name)
        "all_gather_into_tensor_coalesced": ("all_gather", None),
        "reduce_scatter_tensor": ("reduce_scatter", 0),
        "reduce_scatter_tensor_coalesced": ("reduce_scatter", 0),
        "all_reduce": ("all_reduce", 0),
        "all_reduce_coalesced": ("all_reduce", 0),
        "all_to_all_single": ("all_to_all", 0),
        "broadcast": ("broadcast", 0),
    },
}
_OPS["_c10d_functional_autograd"] = {
    name: _OPS["_c10d_functional"][name]
    for name in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single")
}


def _nbytes(x) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(x) if isinstance(t, torch.Tensor))


class Collectives(TorchDispatchMode):
    """Record the collectives issued while it is active, in ``calls`` (a list of
    `CollectiveCall`).

    Args:
        names: ``{group_name: mesh axis name}`` for the groups of the mesh (a group not in it is
            recorded under its own name).
    """

    def __init__(self, names: dict[str, str]):
        super().__init__()
        self.names = dict(names)
        self.calls: list[CollectiveCall] = []

    def _group(self, args, kwargs) -> tuple[str, int]:
        for a in tree_leaves((args, kwargs)):
            if isinstance(a, torch.ScriptObject):
                try:
                    group = dist.ProcessGroup.unbox(a)
                except Exception:  # noqa: BLE001 -- not a process group (a Work, an op)
                    continue
                return self.names.get(group.group_name, group.group_name), group.size()
        name = next((a for a in tree_leaves((args, kwargs)) if isinstance(a, str)
                     and a in self.names), None)
        if name is not None:
            return self.names[name], resolve_process_group(name).size()
        return "?", 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _is_dtensor_call(types):
            return NotImplemented
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        entry = _OPS.get(func.namespace, {}).get(func.overloadpacket.__name__)
        if entry is not None:
            kind, which = entry
            axis, ranks = self._group(args, kwargs)
            nbytes = _nbytes(out if which is None else args[which])
            self.calls.append(CollectiveCall(kind, axis, ranks, nbytes))
        return out
