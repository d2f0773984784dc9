"""Activation memory: the bytes a forward pass keeps for its backward, per module.

    from distlab import activations
    with activations.Meter(model) as meter:           # around the forward (and the loss)
        loss = gpt.loss(model(tokens), targets)
    print(meter.result)                                # bytes per module, deterministic text
    predicted = activations.predict(config, batch_size=8)   # the same, from a formula
    print(activations.side_by_side(meter.result, predicted))

How it counts: every tensor autograd saves for backward passes through
``torch.autograd.graph.saved_tensors_hooks``; forward pre/post hooks on every module say which
module is running, and the tensor is charged to the innermost one. Memory is counted once, by
the bytes of storage that saved tensors address: the layer-norm output that ``wq``, ``wk`` and
``wv`` all save counts once, and so does the softmax output that softmax and the next matmul
both save; a saved view counts the part of the storage it spans (a rank's chunk of the batch
counts as that chunk). A saved tensor that is a parameter's storage (a Linear keeps its weight)
is counted apart, in ``params``: it is parameter memory, which exists anyway.

``torch.utils.checkpoint`` regions keep only their inputs: ops inside them save through the
checkpoint's own hooks, not these. The inputs the checkpoint keeps are charged to the
checkpointed module (its name is listed in ``checkpointed``). Other saved-tensor hooks (e.g.
``save_on_cpu``) hide their region the same way. This module counts; `distlab.memory` counts
parameters, gradients and optimizer state.
"""

from .meter import Meter
from .predict import korthikanti, predict
from .result import OUTSIDE, Activations, side_by_side

__all__ = ["OUTSIDE", "Activations", "Meter", "korthikanti", "predict", "side_by_side"]
