"""The door to torch's private dispatch and pytree modules, which distlab's counters stand on.

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

__all__ = ["TorchDispatchMode", "tree_leaves"]
