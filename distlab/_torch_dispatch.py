"""The door to torch's private dispatch and pytree modules, and an op's schema, which distlab's
counters stand on.

Imported at module level by modules that define classes on it (it imports torch); the rest of
torch's private code is behind `distlab._torch` and `distlab._torch_simulation`.
"""

from __future__ import annotations

#: Subclass it to see every op that runs (``__torch_dispatch__``), as FLOP counters and memory
#: trackers do. ``torch.utils._python_dispatch.TorchDispatchMode``: private module, since torch
#: 1.13; documented in "Extending PyTorch", with no public import path.
from torch.utils._python_dispatch import TorchDispatchMode

#: Every tensor (leaf) in a nest of lists, tuples and dicts. ``torch.utils._pytree.tree_leaves``:
#: private module, since torch 1.x. No public replacement in torch 2.14.
from torch.utils._pytree import tree_leaves

__all__ = ["TorchDispatchMode", "tree_leaves", "writes"]


def writes(func) -> list[bool]:
    """For each argument of the op ``func`` (an ``OpOverload``, as ``__torch_dispatch__`` gets
    it), in its schema's order: whether the op writes it (``Tensor(a!)``: in-place, ``out=``).

    ``OpOverload._schema`` (a ``torch.FunctionSchema``): private attribute, since torch 1.x. torch
    2.15 has no public way to an op's schema (``OpOverload`` offers ``overloadpacket``,
    ``namespace``, ``is_view`` and ``tags``; ``torch.library.infer_schema`` reads a Python
    function's annotations, not an op's)."""
    return [arg.alias_info is not None and arg.alias_info.is_write
            for arg in func._schema.arguments]
