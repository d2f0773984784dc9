"""Memory per rank: the bytes of parameters, gradients and optimizer state each rank holds.

Counted from the tensors themselves, on each rank (a ``%%ranks`` cell, or a launched function):

    from distlab import memory
    usage = memory.measure(model, optimizer)     # this rank's bytes (a `Usage`)

then shown side by side in the kernel, in the same three ways as `distlab.timeline`:

    table = memory.record(train_step, world_size=4, title="DDP", psi=n_params)  # new ranks
    table = memory.collect(cluster, title="DDP", psi=n_params)  # each rank's last measure()
    table = memory.Table(cluster.pull("usage"), title="DDP", psi=n_params)   # or by hand
    table                     # a bar chart per rank in Jupyter; text: exact bytes, and ÷ Ψ
    memory.compare(ddp_table, zero_table, fsdp_table)   # several set-ups in one chart

What is counted: a parameter or gradient that is a `DTensor` (FSDP's ``fully_shard``, tensor
parallel) counts with its **local** shard; `ZeroRedundancyOptimizer` counts the state of the
local optimizer it keeps for this rank's share of the parameters. A tensor shared by two
parameters counts once. Activations are counted when you pass what `distlab.activations.Meter`
measured (``measure(model, opt, activations=meter.result)``): the bytes saved for backward, a
fourth part of the table, kept apart from ``total`` because they live between a forward and its
backward while gradients appear during the backward (the peak is not the plain sum).
Communication buffers (DDP's buckets unless ``gradient_as_bucket_view=True``) and the
allocator's spare memory are not counted: `Usage` also
carries the process's measured peak (``peak_rss``, from ``getrusage``; ``cuda_peak``, from
``torch.cuda.max_memory_allocated``), which includes everything, libraries too, and varies from
run to run, so the text form never shows it.
"""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass

from . import _output
from ._chart import BACKGROUND, INK, PARTS, Chart, key
from ._config import check_int, process_group_rank
from .errors import InputError, InputTypeError, entry_point

__all__ = ["SideBySide", "Table", "Usage", "collect", "compare", "measure", "record"]

_PARTS = ("params", "grads", "optimizer")
_ALL_PARTS = (*_PARTS, "activations")


@dataclass(frozen=True)
class Usage:
    """What one rank holds, in bytes.

    ``params``, ``grads``: local bytes of the model's parameters and of their ``.grad``;
    ``optimizer``: the optimizer's per-element state (Adam's ``exp_avg`` and ``exp_avg_sq``,
    SGD's momentum buffer: tensors as large as their parameter); ``optimizer_other``: its other
    state tensors (Adam's ``step`` counters, one small tensor per parameter); ``activations``:
    the bytes saved for backward, when `measure` was given them (else 0). ``total`` is
    params + grads + optimizer: what the rank keeps from step to step. Measured, not computed,
    and never shown in text: ``peak_rss``, the process's peak resident memory, and
    ``cuda_peak``, ``torch.cuda.max_memory_allocated()`` (None without CUDA). ``numel`` is the
    number of local parameter elements.
    """

    rank: int | None
    params: int
    grads: int
    optimizer: int
    optimizer_other: int
    numel: int
    peak_rss: int
    cuda_peak: int | None = None
    activations: int = 0

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


def _local(t):
    """The tensor this rank actually holds: a DTensor's local shard, else the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _nbytes(t) -> int:
    t = _local(t)
    return t.numel() * t.element_size()


def _is_zero(optimizer) -> bool:
    # Whoever built a ZeroRedundancyOptimizer has imported its module; importing it otherwise
    # would cost time and a screenful of torch.jit deprecation warnings.
    module = sys.modules.get("torch.distributed.optim")
    zero = getattr(module, "ZeroRedundancyOptimizer", None)
    return zero is not None and isinstance(optimizer, zero)


#: This rank's last `measure` (what `collect` fetches).
_last: Usage | None = None


def measure(model=None, optimizer=None, *, activations=None) -> Usage:
    """Count the bytes of ``model``'s parameters and gradients and ``optimizer``'s state here.

    Call it on every rank (in a ``%%ranks`` cell or a launched function), then bring the results
    to the kernel (``cluster.pull``, or return it) and show them with `Table`.

    Args:
        model: a ``torch.nn.Module`` (plain, DDP, ``fully_shard``-ed, tensor-parallel), or None.
            Its ``parameters()`` are counted as they are *now*: between FSDP's forward and
            backward they are the gathered parameters when ``reshard_after_forward=False``.
        optimizer: a ``torch.optim.Optimizer`` or a ``ZeroRedundancyOptimizer`` (its local
            optimizer's state is counted), or None. Counted as it is now: Adam creates its
            state at the first ``step()``.
        activations: what a `distlab.activations.Meter` measured around a forward (its
            ``.result``), or a number of bytes; None: not counted (0).

    Returns:
        A `Usage` (bytes), with ``rank`` from the default process group (None without one). It
        is also kept as this rank's last measurement, which `collect` and `record` fetch.

    Raises:
        ValueError: neither a model nor an optimizer was given.
        TypeError: ``model`` is not an ``nn.Module`` (pass the module, e.g. ``ddp_model``),
            ``optimizer`` is not a torch optimizer, or ``activations`` is neither a meter's
            result nor a number of bytes.
    """
    import torch

    if model is None and optimizer is None:
        raise InputError("measure() needs a model, an optimizer, or both: measure(model, opt)")
    saved = _activation_bytes(activations)
    if model is not None and not isinstance(model, torch.nn.Module):
        raise InputTypeError(
            f"model must be a torch.nn.Module, got {type(model).__name__}; pass the module "
            "itself (for a list of tensors, wrap it: torch.nn.ParameterList(tensors))"
        )
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise InputTypeError(
            f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}"
        )

    params = grads = numel = 0
    if model is not None:
        seen = set()
        for p in model.parameters():
            local = _local(p)
            key = (local.data_ptr(), local.numel()) if local.numel() else id(p)
            if key in seen:
                continue
            seen.add(key)
            params += _nbytes(p)
            numel += local.numel()
            if p.grad is not None:
                grads += _nbytes(p.grad)

    state_bytes = other_bytes = 0
    if optimizer is not None:
        inner = optimizer.optim if _is_zero(optimizer) else optimizer
        for param, state in inner.state.items():
            size = _local(param).numel() if isinstance(param, torch.Tensor) else -1
            for value in state.values():
                if not isinstance(value, torch.Tensor):
                    continue
                if value.dim() > 0 and _local(value).numel() == size:
                    state_bytes += _nbytes(value)
                else:
                    other_bytes += _nbytes(value)

    global _last
    _last = Usage(
        rank=process_group_rank()[0],
        params=params,
        grads=grads,
        optimizer=state_bytes,
        optimizer_other=other_bytes,
        activations=saved,
        numel=numel,
        peak_rss=_peak_rss(),
        cuda_peak=_cuda_peak(),
    )
    return _last


def _activation_bytes(activations) -> int:
    if activations is None:
        return 0
    total = getattr(activations, "total", activations)
    return check_int(total, "activations", low=0, error=TypeError, message=(
        "activations must be what a distlab.activations.Meter measured (meter.result) or a "
        f"number of bytes, got {type(activations).__name__}"))


def _peak_rss() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS: bytes; Linux: KiB


def _cuda_peak() -> int | None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.max_memory_allocated())
    return None


def _legend(ax, parts=_PARTS) -> None:
    """The key of the parts (params, grads, optimizer[, activations]), above the bars."""
    key(ax, [(p, PARTS[p]) for p in parts], ncol=len(parts))


class Table(Chart):
    """The `Usage` of every rank, side by side: a bar chart in Jupyter, exact bytes in text.

    Args:
        usages: one `Usage` per rank, in rank order (e.g. ``cluster.pull("usage")``).
        title: a heading, e.g. ``"DDP"``.
        psi: the number of parameters of the whole model (Ψ). Then the text also shows each
            rank's total in bytes per model parameter (total ÷ Ψ), which the formulas predict.
        results: kept as ``.results`` (`record` puts what the function returned there).

    Raises:
        ValueError: no usages; ``psi`` not a positive int.
        TypeError: an entry is not a `Usage` (call ``memory.measure(...)`` on the ranks).
    """

    def __init__(
        self, usages, *, title: str | None = None, psi: int | None = None, results=None
    ):
        usages = list(usages)
        if not usages:
            raise InputError("a memory Table needs one Usage per rank; got none")
        for r, u in enumerate(usages):
            if not isinstance(u, Usage):
                raise InputTypeError(
                    f"entry {r} is a {type(u).__name__}, not a Usage: on the ranks, run "
                    "usage = distlab.memory.measure(model, optimizer), then pass "
                    "cluster.pull('usage')"
                )
        if psi is not None:
            check_int(psi, "psi", low=1, noun="the model's number of parameters (an int)")
        self.usages = usages
        self.results = results  #: what the function returned on each rank (`record` only)
        self.title = title
        self.psi = psi

    def __len__(self) -> int:
        return len(self.usages)

    def __getitem__(self, rank: int) -> Usage:
        return self.usages[rank]

    def per_param(self, rank: int, part: str = "total") -> float:
        """Bytes of ``part`` ("params", "grads", "optimizer" or "total") on ``rank``, per
        parameter of the whole model (÷ Ψ). Raises ValueError without ``psi`` or for an unknown
        part."""
        if self.psi is None:
            raise InputError("per_param needs psi: Table(usages, psi=number_of_parameters)")
        if part not in (*_PARTS, "total"):
            raise InputError(f"part must be one of {(*_PARTS, 'total')}, got {part!r}")
        return getattr(self.usages[rank], part) / self.psi

    def peaks(self) -> list[int]:
        """Each rank's measured peak in bytes: ``cuda_peak`` where CUDA was used, else the
        process's peak resident memory (libraries included; varies from run to run)."""
        return [u.cuda_peak if u.cuda_peak is not None else u.peak_rss for u in self.usages]

    def text(self) -> str:
        """Exact bytes per rank (never the measured peaks): one line per rank."""
        head = self.title or "memory per rank"
        if self.psi is not None:
            head += f" (Ψ = {self.psi:,} parameters)"
        cols = ["params", "grads", "optimizer", "total"]
        if self._with_activations():
            cols.append("activations")
        header = "rank" + "".join(f"{c:>12}" for c in cols)
        if self.psi is not None:
            header += f"{'total/Ψ':>9}"
        header += "  other optimizer state"
        lines = [head, header]
        for r, u in enumerate(self.usages):
            line = f"{r:>4}" + "".join(f"{getattr(u, c):>12,}" for c in cols)
            if self.psi is not None:
                line += f"{u.total / self.psi:>9.2f}"
            line += f"  {u.optimizer_other:,}"
            lines.append(line)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.text()

    __str__ = __repr__

    def _with_activations(self) -> bool:
        return any(u.activations for u in self.usages)

    def figure(self):
        """A matplotlib ``Figure``: one group of bars per rank (params, grads, optimizer, and
        activations when they were measured)."""
        from matplotlib.figure import Figure

        parts = _ALL_PARTS if self._with_activations() else _PARTS
        n = len(self.usages)
        unit, scale = _unit(max(max(getattr(u, p) for p in parts) for u in self.usages))
        fig = Figure(figsize=(max(4.5, 1.3 * n + 2), 3.2), facecolor=BACKGROUND)
        ax = fig.add_axes((0.14, 0.16, 0.83, 0.68))
        ax.set_facecolor(BACKGROUND)
        width = 0.78 / len(parts)
        for r, u in enumerate(self.usages):
            for i, part in enumerate(parts):
                value = getattr(u, part) / scale
                ax.bar(
                    r + (i - (len(parts) - 1) / 2) * width,
                    value,
                    width,
                    color=PARTS[part],
                    edgecolor=INK,
                    linewidth=0.5,
                )
        ax.set_xticks(range(n), [f"rank {r}" for r in range(n)], fontsize=9)
        ax.set_ylabel(unit, fontsize=9)
        ax.tick_params(axis="y", labelsize=8)
        ax.set_title(self.title or "memory per rank", fontsize=11, color=INK, pad=22)
        _legend(ax, parts)
        return fig


class SideBySide(Chart):
    """Several `Table`\\ s side by side (build with `compare`): one group per table, a stacked
    bar (params, grads, optimizer) per rank. Text: one line per table and rank group."""

    def __init__(self, tables):
        self.tables = list(tables)

    def text(self) -> str:
        lines = []
        for t in self.tables:
            name = t.title or "?"
            held = {r: (u.params, u.grads, u.optimizer) for r, u in enumerate(t.usages)}
            for ranks, (p, g, o) in _output.group_alike(held):
                who = _output.tag(ranks)[1:-1]  # "rank 2", "ranks 0,1", "ranks 0-3"
                if t.psi is not None:
                    psi = t.psi
                    parts = (
                        f"params {p / psi:.2f} + grads {g / psi:.2f} + optimizer "
                        f"{o / psi:.2f} = {(p + g + o) / psi:.2f} bytes per parameter"
                    )
                else:
                    parts = f"params {p:,} + grads {g:,} + optimizer {o:,} = {p + g + o:,} bytes"
                lines.append(f"{name}, {who}: {parts}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.text()

    __str__ = __repr__

    def figure(self):
        """A matplotlib ``Figure``: per table, one stacked bar per rank."""
        from matplotlib.figure import Figure

        top = max(u.total for t in self.tables for u in t.usages)
        unit, scale = _unit(top)
        n_bars = sum(len(t.usages) for t in self.tables)
        fig = Figure(
            figsize=(max(5.0, 0.45 * n_bars + 0.6 * len(self.tables) + 1.5), 3.4),
            facecolor=BACKGROUND,
        )
        ax = fig.add_axes((0.1, 0.2, 0.87, 0.64))
        ax.set_facecolor(BACKGROUND)
        x = 0.0
        centres, names = [], []
        for t in self.tables:
            start = x
            for r, u in enumerate(t.usages):
                bottom = 0.0
                for part in _PARTS:
                    value = getattr(u, part) / scale
                    ax.bar(
                        x,
                        value,
                        0.8,
                        bottom=bottom,
                        color=PARTS[part],
                        edgecolor=INK,
                        linewidth=0.5,
                    )
                    bottom += value
                ax.text(
                    x, -0.02 * top / scale, str(r), ha="center", va="top", fontsize=7, color=INK
                )
                x += 1
            centres.append((start + x - 1) / 2)
            names.append(t.title or "?")
            x += 0.8
        ax.set_xticks(centres, names, fontsize=9)
        ax.tick_params(axis="x", length=0, pad=12)
        ax.set_ylabel(f"{unit} per rank", fontsize=9)
        ax.tick_params(axis="y", labelsize=8)
        _legend(ax)
        return fig


@entry_point
def record(fn, *args, cluster=None, title: str | None = None, psi: int | None = None, **kwargs):
    r"""Run ``fn(*args, **kwargs)`` on every rank; return a `Table` of what each rank last
    `measure`\ d while it ran.

    ``fn`` calls ``distlab.memory.measure(model, optimizer)`` itself, at the moment whose bytes
    you want (after the optimizer's first step, say): the same shape as `distlab.timeline.record`
    with ``timeline.recording()`` inside.

    Args:
        fn, args, kwargs, cluster: as for `distlab.timeline.record`: new ranks as
            `distlab.launch` (keyword arguments named like launch's options set them up), or the
            live ranks of ``cluster``. What ``fn`` returns is in the table's ``.results``.
        title, psi: as for `Table`.

    Raises:
        RuntimeError: some rank did not call `measure` while ``fn`` ran (the message names it).
        And what `distlab.timeline.record` and `Table` raise for bad arguments, failures and
        hangs on the ranks.
    """
    from . import _config
    from .launcher import on_ranks, require_every_rank, split_options

    _config.check_callable(fn, "memory.record()")
    options, fn_kwargs = split_options(kwargs)
    out = on_ranks(_run_measured, (fn, args, fn_kwargs), options, cluster=cluster)
    usages = [usage for _, usage in out]
    require_every_rank(usages, "measured nothing while the function ran." + _HOW)
    return Table(usages, title=title, psi=psi, results=[value for value, _ in out])


@entry_point
def collect(cluster=None, *, title: str | None = None, psi: int | None = None) -> Table:
    """Fetch from every rank of ``cluster`` its last `measure` (from a ``%%ranks`` cell), as a
    `Table`.

    Args:
        cluster: a live `distlab.Cluster`; default: the current one (the most recent).
        title, psi: as for `Table`.

    Raises:
        RuntimeError: no cluster is running, or some rank has not measured anything yet (the
            message names it and says what to run).
    """
    from .launcher import from_every_rank

    usages = from_every_rank(cluster, _take_last, missing="have measured nothing yet." + _HOW)
    return Table(usages, title=title, psi=psi)


_HOW = (
    " On every rank, call:\n"
    "    from distlab import memory\n"
    "    usage = memory.measure(model, optimizer)\n"
    "where you want the bytes counted (after the optimizer's first step, say)."
)


def _take_last() -> Usage | None:
    """Run on a rank by `collect`."""
    return _last


def _run_measured(fn, args, kwargs):
    """Run on every rank by `record`: ``fn(*args, **kwargs)``, then its last measurement."""
    global _last
    _last = None
    value = fn(*args, **kwargs)
    return value, _last


def compare(*tables: Table) -> SideBySide:
    """Show several `Table`\\ s (e.g. DDP, ZeRO-1, FSDP) in one chart: per table, one stacked
    bar per rank.

    Raises:
        ValueError: no tables. TypeError: an argument is not a `Table`.
    """
    if not tables:
        raise InputError("compare() needs at least one memory Table")
    for i, t in enumerate(tables):
        if not isinstance(t, Table):
            raise InputTypeError(f"argument {i} is a {type(t).__name__}, not a memory.Table")
    return SideBySide(tables)


def _unit(largest: float) -> tuple[str, float]:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if largest >= scale:
            return unit, float(scale)
    return "bytes", 1.0
