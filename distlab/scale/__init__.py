"""At scale, on a laptop: real models laid out by PyTorch's own parallel code on simulated ranks.

    from distlab import scale
    scale.lay_out("Llama-3 405B", scale.Layout(dp=8, tp=8, pp=16))   # its first, middle, last stage

One process plays one rank of a layout of any size (a fake process group, the meta device,
fake tensors): parameters, gradients and Adam's state are read off the real shards, the
activations and the peak off one step that computes nothing, FLOPs and collectives counted.

Names mean one thing here: ``model`` is a preset's name or a `Transformer` config (the
``nn.Module`` built from it is what `plans` calls ``module``); ``stage`` is a pipeline stage's
number; an "axis" is a DeviceMesh axis ("dp", "tp", ...), a "dim" a tensor dimension.
"""

from .calculator_check import CalculatorCheck, against_calculator, calculator_for
from .lay_out import LaidOut, distinct_stages, lay_out, simulate_apart
from .layout import Layout, stage_layers
from .simulate import RankReport, simulate_rank, simulated

__all__ = ["CalculatorCheck", "LaidOut", "Layout", "RankReport", "against_calculator",
           "calculator_for", "distinct_stages", "lay_out", "simulate_apart", "simulate_rank",
           "simulated", "stage_layers"]
