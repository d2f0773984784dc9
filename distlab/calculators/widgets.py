"""The calculators as widgets: move a control, see the numbers and the picture change.

    from distlab.calculators import widgets
    widgets.memory()        # memory per device: model x parallel sizes x ZeRO x precision x ...
    widgets.comm()          # one collective's alpha-beta time, ring against tree
    widgets.step_comm()     # one training step's communication, DDP / FSDP / TP / PP
    widgets.pipeline()      # a pipeline schedule: grid, bubble, microbatches in flight
    widgets.stepper()       # a ring collective step by step (a slider, or the Play button)

Each is a `Calculator` (an ipywidgets box). Its arguments are the controls' starting values,
with the meaning they have in the function it calls (`memory_per_device`, `collective_time`,
`step_comm`, `pipeline_schedule`, `ring_steps`), e.g. ``widgets.memory(model="Llama-3 70B",
tp=8)``. Each raises what that function raises (a `CalculatorError`, a ValueError, saying what
to choose instead) when its starting values do not work; a value a learner sets later that does
not work shows that message in place of the table. Without a kernel, the saved notebook shows
the starting state's table and chart.
"""

from __future__ import annotations

import ipywidgets

from . import comm as _comm
from ._widget import Calculator, dropdown, number, slider
from .charts import CollectiveChart, StepCommChart
from .comm import ALGORITHMS, COLLECTIVES, LAYOUTS, collective_time
from .layout import CHECKPOINTING, PRECISIONS, Layout, as_layout
from .links import LINKS, fit_path
from .memory_estimate import memory_per_device
from .models import PRESETS, Transformer
from .pipeline import SCHEDULES, pipeline_schedule
from .stepper import OPS, StepChart, ring_steps

__all__ = ["comm", "memory", "pipeline", "step_comm", "stepper"]

_ZERO = [("0: none (DDP)", 0), ("1: optimizer", 1), ("2: + gradients", 2), ("3: + params", 3)]


def _links():
    presets = [(name, name) for name in LINKS]
    return ([("your fit (notebook 08)", "fit")] if fit_path().exists() else []) + presets


def memory(model="Llama-3 8B", layout: Layout | None = None, **knobs) -> Calculator:
    """Memory per device (`memory_per_device`) of ``model`` (a preset's name), starting at
    ``layout`` (default ``Layout(dp=8)``: the one Layout's defaults, on 8 ranks) with
    ``knobs`` changed, e.g. ``widgets.memory("Llama-3 70B", tp=8)``; a control for each size,
    ZeRO, precision, checkpointing, sequence length and micro-batch. The text also says whether
    the peak fits in an 80 GB device."""
    start = as_layout(Layout(dp=8) if layout is None else layout, knobs, "widgets.memory")
    controls = {
        "model": dropdown(list(PRESETS), model, "model"),
        "zero": dropdown(_ZERO, start.zero, "ZeRO stage"),
        "precision": dropdown(list(PRECISIONS), start.precision, "precision"),
        "dp": number(start.dp, "data parallel"),
        "tp": number(start.tp, "tensor parallel"),
        "pp": number(start.pp, "pipeline parallel"),
        "cp": number(start.cp, "context parallel"),
        "ep": number(start.ep, "expert parallel"),
        "checkpointing": dropdown(list(CHECKPOINTING), start.checkpointing, "checkpointing"),
        "seq_len": number(start.seq_len, "sequence length"),
        "micro_batch": number(start.micro_batch, "micro-batch"),
    }

    def compute(**values):
        est = memory_per_device(values.pop("model"), start, **values)
        verdict = "fits" if est.fits() else "does not fit"
        return f"{est.text()}\nits peak {verdict} in an 80 GB device", est.chart()

    return Calculator("memory", controls, compute)


def comm(op="all_reduce", size=2**30, ranks=8, link="NVLink 4 (H100 SXM)",
         algorithm="ring") -> Calculator:
    """One collective's alpha-beta time (`collective_time`), drawn against its size for the ring
    and the tree. ``link`` is a preset's name or "fit" (offered once `save_fit` has run); the
    size slider moves in powers of two from 1 B to 64 GiB."""
    controls = {
        "op": dropdown(list(COLLECTIVES), op, "collective"),
        "algorithm": dropdown(list(ALGORITHMS), algorithm, "algorithm"),
        "link": dropdown(_links(), link, "link"),
        "ranks": number(ranks, "ranks"),
        "size": ipywidgets.FloatLogSlider(value=size, base=2, min=0, max=36, step=1,
                                          description="size (bytes)", readout_format=".3g",
                                          continuous_update=False),
    }

    def compute(size, **values):
        t = collective_time(size=int(size), **values)
        return t.text(), CollectiveChart(t)

    return Calculator("comm", controls, compute)


def step_comm(model="Llama-3 8B", ranks=8, link="NVLink 4 (H100 SXM)", precision="bf16-mixed",
              seq_len=4096, micro_batch=1, microbatches=8) -> Calculator:
    """One training step's communication (`step_comm`) for DDP, FSDP, TP and PP side by side
    (DDP and FSDP only for a model that is not a transformer); ``model`` is a preset's name,
    ``ranks`` each layout's group size."""
    controls = {
        "model": dropdown(list(PRESETS), model, "model"),
        "link": dropdown(_links(), link, "link"),
        "precision": dropdown(list(PRECISIONS), precision, "precision"),
        "ranks": number(ranks, "ranks", low=2),
        "seq_len": number(seq_len, "sequence length"),
        "micro_batch": number(micro_batch, "micro-batch"),
        "microbatches": number(microbatches, "microbatches"),
    }

    def compute(model, ranks, link, **values):
        layouts = LAYOUTS if isinstance(PRESETS[model], Transformer) else ("DDP", "FSDP")
        chart = StepCommChart(_comm.step_comm(layout, model, ranks, link, **values)
                              for layout in layouts)
        return repr(chart), chart

    return Calculator("step_comm", controls, compute)


def pipeline(p=4, m=8, v=1, schedule="1F1B") -> Calculator:
    """A pipeline schedule (`pipeline_schedule`): the grid, the bubble, the peaks."""
    controls = {
        "schedule": dropdown(list(SCHEDULES), schedule, "schedule"),
        "p": slider(p, 1, 16, "ranks p"),
        "m": slider(m, 1, 32, "microbatches m"),
        "v": slider(v, 1, 4, "stages per rank v"),
    }

    def compute(**values):
        s = pipeline_schedule(**values)
        return s.text(), s.chart()

    return Calculator("pipeline", controls, compute, columns=2)


def stepper(op="all_reduce", ranks=4, numel=1024, element_size=4) -> Calculator:
    """A ring collective (`ring_steps`) one step at a time: a step slider and a Play button (the
    slider's range follows the collective's number of steps, 2(n-1) or n-1)."""
    step = slider(1, 1, max(1, 2 * (ranks - 1)), "step")  # ring_steps checks ranks
    play = ipywidgets.Play(value=1, min=1, max=step.max, interval=1200, description="play")
    ipywidgets.jslink((play, "value"), (step, "value"))
    controls = {
        "op": dropdown(list(OPS), op, "collective"),
        "ranks": slider(ranks, 2, 8, "ranks"),
        "numel": number(numel, "elements"),
        "element_size": dropdown([("4 (float32)", 4), ("2 (bfloat16)", 2)], element_size,
                                 "bytes each"),
        "step": step,
    }

    def compute(op, ranks, numel, element_size, step):
        ring = ring_steps(op, ranks, numel, element_size)
        last = len(ring.steps)
        if controls["step"].max != last:  # op or ranks changed: so did the number of steps
            controls["step"].max = play.max = last
        this = ring.steps[min(step, last) - 1]
        done = [sum(s.sent[r] for s in ring.steps[: this.number]) for r in range(ranks)]
        so_far = ", ".join(f"{b:,}" for b in done)
        text = (f"{ring.text()}\n\n{this.text()}\nsent so far, ranks 0..{ranks - 1}: {so_far} "
                "bytes")
        return text, StepChart(this)

    return Calculator("stepper", controls, compute, columns=3, extra=(play,))
