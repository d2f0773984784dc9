"""Play with the numbers: calculators for memory, communication, pipelines and ring collectives.

Pure functions that return small frozen results with exact numbers (ints of bytes, Fractions)
and a text form, each with a chart (``.chart()`` or a chart class), and a widget per calculator
(`widgets`) that redraws as the learner moves its controls:

    from distlab.calculators import memory_per_device, collective_time, step_comm
    from distlab.calculators import pipeline_schedule, ring_steps, widgets

- `memory_per_device`: parameters, gradients, optimizer state and activations per device for a
  model (`PRESETS`, or your own `Transformer`) x dp/tp/pp/cp/ep x ZeRO stage x precision x
  activation checkpointing (module `memory_estimate`);
- `collective_time`, `step_comm`: the alpha-beta time of a collective, ring or tree, and of one
  training step's communication (module `comm`), over a `Link`: a preset (`LINKS`) or your own
  fit from notebook 08, kept with `save_fit` and read back with `load_fit` (module `links`);
- `pipeline_schedule`: GPipe, 1F1B and interleaved 1F1B played out: grid, bubble (a Fraction),
  microbatches in flight per rank (module `pipeline`);
- `ring_steps`: ring reduce-scatter, all-gather and all-reduce step by step, drawn with
  `distlab.pictures` (module `stepper`).

Bad input raises `CalculatorError` (a ValueError) saying what to choose instead.

Names mean one thing here: ``model`` is what you name (a preset's name, a `Transformer`, a
`LinearStack` or a number of parameters), never an ``nn.Module``; ``stage`` is a pipeline
stage's number, 0 first. These formulas predict; `distlab.memory` measures on ranks,
`distlab.activations` in one process, `distlab.scale` simulates at real size.
"""

from ._text import GB, CalculatorError
from .charts import CollectiveChart, MemoryChart, ScheduleChart, StepCommChart
from .comm import CollectiveTime, StepComm, collective_time, step_comm
from .layout import Layout
from .links import LINKS, Link, fit_path, load_fit, save_fit
from .memory_estimate import MemoryEstimate, memory_per_device
from .models import PRESETS, LinearStack, Params, Transformer, stage_layers
from .pipeline import Schedule, pipeline_schedule
from .stepper import RingCollective, RingStep, StepChart, ring_steps
from .steptime import (
    H100_HBM,
    H100_HBM2E,
    H100_PEAK,
    MAMF_H100,
    MATMUL_EFFICIENCY,
    StepTime,
    Term,
    attention_flops,
    bubble,
    step_time,
)

__all__ = [
    "GB", "LINKS", "PRESETS", "CalculatorError", "CollectiveChart", "CollectiveTime",
    "Layout", "Link", "LinearStack", "MemoryChart", "MemoryEstimate", "Params", "RingCollective",
    "RingStep", "Schedule", "ScheduleChart", "StepChart", "StepComm", "StepCommChart",
    "Transformer", "collective_time", "fit_path", "load_fit", "memory_per_device",
    "pipeline_schedule", "ring_steps", "save_fit", "stage_layers", "step_comm",
    "H100_HBM", "H100_HBM2E", "H100_PEAK", "MAMF_H100", "MATMUL_EFFICIENCY", "StepTime", "Term",
    "attention_flops", "bubble", "step_time",
]
