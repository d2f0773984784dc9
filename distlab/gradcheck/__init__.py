"""A distributed gradcheck: is a parallel layout the same training run as one process?

On every rank, build the layout from the same seed, train a few steps, and record each step:

    from distlab import gpt, gradcheck

    def train(steps=3):
        model = ...                                   # gpt.GPT(config, seed=0), then your layout
        opt = gpt.make_optimizer(model.parameters())  # after wrapping/sharding
        recorder = gradcheck.Recorder(loss_group="world")   # DP: record the average loss
        for step in range(steps):
            ...                                       # forward, loss, backward, opt.step()
            recorder.record(step, loss, model, opt)   # gathers full tensors, global names
            opt.zero_grad()
        return recorder

    report = gradcheck.compare(distlab.launch(train, world_size=2), gpt.reference_run(steps=3))
    print(report)   # ✓ equal to one process: 3 steps, ... | ✗ the first tensor that differs

``recorder.py`` records on the ranks (the optimizer's class and settings too), ``compare.py``
walks the recordings against the reference in a fixed order (step; loss; gradients, the
optimizer's settings, parameters, optimizer state in parameter order) and stops at the first
difference, ``optimizers.py`` says how far the gradients' rounding can move parameters and
state through SGD, Adam or AdamW (Adam magnifies it), ``hints.py`` reads the shape of that
difference (2x: a forgotten division; the ranks average to the reference: a missing
all-reduce; a shard's shape; permuted chunks).
"""

from .compare import Mismatch, Report, compare
from .recorder import Recorder, Step, clean_name

__all__ = ["Mismatch", "Recorder", "Report", "Step", "clean_name", "compare"]
