"""`lay_out`: every rank of a layout that differs from the others, each simulated in a process of
its own, and what they hold and do, as one table.

    laid = scale.lay_out("Llama-3 405B", scale.Layout(dp=8, tp=8, pp=16, seq_len=8192))
    laid            # a table: one column per distinct rank (first, middle, last stage)

Ranks that differ are those of different pipeline stages (the first holds the embedding, the
last the output layer and the loss, and their layer counts may differ); the data-, tensor-,
context- and expert-parallel ranks of one stage hold and do the same (up to FSDP's padding of
the last shard). They are simulated one after another in this process, or side by side in
``processes`` processes of `distlab.launch` (on several cores, quicker; each a fresh helper
process, which on the spawn path costs an interpreter's start).
"""

from __future__ import annotations

from dataclasses import dataclass

from .._config import check_int
from ..calculators._text import GB
from ..calculators.models import get_model
from .layout import Layout, stage_layers
from .report import RankReport

__all__ = ["LaidOut", "distinct_stages", "lay_out"]


def _ranges(layers) -> str:
    """``(0, 1, 2, 63, 64)`` as ``"0-2, 63-64"``: an interleaved rank's stages apart."""
    out, start = [], 0
    for i in range(1, len(layers) + 1):
        if i == len(layers) or int(layers[i]) != int(layers[i - 1]) + 1:
            out.append(f"{layers[start]}-{layers[i - 1]}")
            start = i
    return ", ".join(out)


def distinct_stages(layers: int, pp: int) -> list[int]:
    """The pipeline stages whose ranks differ: the first, the last, and one of the middle ones
    for each layer count they have."""
    sizes = [len(r) for r in stage_layers(layers, pp)]
    stages = [0]
    seen = set()
    for s in range(1, pp - 1):
        if sizes[s] not in seen:
            seen.add(sizes[s])
            stages.append(s)
    if pp > 1:
        stages.append(pp - 1)
    return stages


def _simulate(model, jobs, processes):
    """On rank r of a launch: every ``processes``-th ``(layout, stage)`` of ``jobs``, from r."""
    import os

    from .simulate import simulate_rank

    rank = int(os.environ["RANK"])
    return [simulate_rank(model, layout, stage) for layout, stage in jobs[rank::processes]]


def _checked(config, jobs: list, processes) -> int:
    """Refuse, before anything runs, a ``(layout, stage)`` job `simulate.simulate_rank` would
    refuse, or a bad ``processes``; the processes to use (never more than the jobs)."""
    from .simulate import _check

    for layout, stage in jobs:
        _check(config, layout, stage)
    check_int(processes, "processes", low=1)
    return min(processes, len(jobs))


def _launched(config, jobs: list, processes: int, timeout: float) -> list:
    """``jobs`` (``(layout, stage)`` pairs) simulated in ``processes`` ranks of
    `distlab.launch`, side by side; their reports in the order of ``jobs``."""
    from ..launcher import launch

    parts = launch(_simulate, config, jobs, processes, world_size=processes, backend=None,
                   timeout=timeout, threads=1)
    reports = [None] * len(jobs)
    for rank, part in enumerate(parts):
        for k, report in zip(range(rank, len(jobs), processes), part, strict=True):
            reports[k] = report
    return reports


@dataclass(frozen=True)
class LaidOut:
    """One `RankReport` per distinct rank (``ranks``), with the model and layout."""

    model: object
    layout: Layout
    ranks: tuple

    def __getitem__(self, stage: int) -> RankReport:
        for r in self.ranks:
            if r.stage == stage:
                return r
        raise KeyError(f"pipeline rank {stage} was not simulated; these were: "
                       f"{[r.stage for r in self.ranks]}")

    def text(self) -> str:
        head = [f"{self.model.name} on {self.layout.text()}"]
        # a pipeline rank (with an interleaved schedule it holds several of torch's stages)
        cols = [f"pp rank {r.stage}" + (f" (of {self.layout.pp})" if r.stage == 0 else "")
                for r in self.ranks]
        rows = [("layers", [_ranges(r.layers) for r in self.ranks]),
                ("parameters held", [f"{r.numel:,}" for r in self.ranks])]
        for label, attr in (("params GB", "params"), ("grads GB", "grads"),
                            ("Adam state GB", "optimizer")):
            rows.append((label, [f"{getattr(r, attr) / GB:.2f}" for r in self.ranks]))
        rows.append(("activations GB", [f"{r.activations / GB:.2f} x {r.in_flight}"
                                        for r in self.ranks]))
        rows.append(("peak GB", [f"{r.peak / GB:.2f}" for r in self.ranks]))
        rows.append(("TFLOP per microbatch", [f"{r.flops / 1e12:.1f}" for r in self.ranks]))
        for axis, kind in sorted({key for r in self.ranks for key in r.comm()}):
            cells = []
            for r in self.ranks:
                calls, nbytes = r.comm().get((axis, kind), (0, 0))
                cells.append(f"{calls} x, {nbytes / GB:.2f} GB")
            rows.append((f"{kind} over {axis}", cells))
        width = max(len(label) for label, _ in rows)
        colw = [max(len(c), *(len(v[i]) for _, v in rows)) for i, c in enumerate(cols)]
        header = "  ".join(c.rjust(w) for c, w in zip(cols, colw, strict=True))
        lines = head + [" " * width + "  " + header]
        for label, values in rows:
            lines.append(label.ljust(width) + "  " + "  ".join(
                v.rjust(w) for v, w in zip(values, colw, strict=True)))
        return "\n".join(lines)

    __repr__ = __str__ = text


def lay_out(model, layout: Layout, stages=None, *, processes: int = 1,
            timeout: float = 120.0) -> LaidOut:
    """Simulate the ranks of ``layout`` that differ (`distinct_stages`) and lay them side by side.

    Args:
        model: a preset's name ("Llama-3 70B") or a `calculators.Transformer`.
        layout: a `Layout`.
        stages: the pipeline stages to simulate (default: `distinct_stages`).
        processes: 1 (default): one after another, in this process (which must not run a
            process group of its own); more: side by side, in that many ranks of
            `distlab.launch`, each simulating every ``processes``-th stage.
        timeout: seconds the simulations may take when launched.

    Returns:
        A `LaidOut`: ``print(laid)`` shows the table; ``laid[0]`` is stage 0's `RankReport`.

    Raises:
        CalculatorError (a ValueError): what `simulate.simulate_rank` refuses (a size that does not
            divide the model, an unknown preset...), raised before anything is simulated.
        ValueError: ``processes`` not an int >= 1.
        RuntimeError: ``processes=1`` in a process that runs a process group.
        distlab.RankError: a launched simulation failed (its traceback says where).
    """
    from .simulate import simulate_rank

    config = get_model(model)
    stages = distinct_stages(config.layers, layout.pp) if stages is None else list(stages)
    jobs = [(layout, stage) for stage in stages]
    processes = _checked(config, jobs, processes)
    if processes == 1:
        reports = [simulate_rank(config, layout, stage) for stage in stages]
    else:
        reports = _launched(config, jobs, processes, timeout)
    return LaidOut(config, layout, tuple(reports))


def simulate_apart(model, layouts, stage: int = 0, *, processes: int = 2,
                   timeout: float = 120.0) -> list:
    """`simulate.simulate_rank` of ``stage`` under each of ``layouts``, in processes of their
    own: ranks of `distlab.launch`, forked from its warm helper, side by side.

    What a notebook calls to use more than one core, and to leave a simulation's first-time
    work (DTensor's and FSDP's imports and caches, torch._dynamo) to processes forked from the
    helper, which has loaded them already, instead of its kernel.

    Args:
        model: a preset's name or a `calculators.Transformer`.
        layouts: the `Layout`s to simulate (at least one).
        stage: the pipeline stage to simulate under each.
        processes: how many processes at most (an int >= 1; never more than there are
            layouts): each simulates every ``processes``-th layout.
        timeout: seconds the simulations may take.

    Returns:
        One `RankReport` per layout, in the order of ``layouts``.

    Raises:
        CalculatorError (a ValueError): what `simulate.simulate_rank` refuses, raised before
            anything is launched.
        ValueError: no layouts, or ``processes`` not an int >= 1.
        distlab.RankError: a simulation failed (its traceback says where).
    """
    config = get_model(model)
    jobs = [(layout, stage) for layout in layouts]
    if not jobs:
        raise ValueError("simulate_apart needs at least one Layout to simulate, got none")
    return _launched(config, jobs, _checked(config, jobs, processes), timeout)
