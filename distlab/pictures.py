"""Pictures of collectives: what every rank holds before and after, one row per rank.

    from distlab import pictures

    pictures.collective(
        "broadcast",
        before=[[1, 2], [0, 0]],        # one entry per rank: rank 0 holds [1, 2], rank 1 [0, 0]
        after=[[1, 2], [1, 2]],
        title="src=0",
        arrows=[(0, 1)],                # optional: data moves from rank 0 to rank 1
    )

In JupyterLab the result is drawn as coloured cells, each showing its value; the same value has
the same colour on both sides, so the eye follows the data. It also has a plain-text form (its
``repr``), one line per rank, which is what ``print`` shows and what nbval compares:

    broadcast: src=0
    rank 0: [1, 2]  ->  [1, 2]
    rank 1: [0, 0]  ->  [1, 2]
    moves: rank 0 -> rank 1

What a rank holds can be a tensor (shown as a row of cells), a list of tensors (list-style
arguments such as ``scatter_list``/``gather_list``: groups of cells, side by side) or ``None``
(the rank holds nothing there: a ``-``).

`mesh` draws a whole training layout instead: which GPUs share a node, which pipeline stages each
pipeline rank holds, which ranks form an FSDP group, and which links each kind of parallelism
uses (notebook 25):

    pictures.mesh(scale.Layout(dp=128, tp=8, pp=16, schedule="Interleaved1F1B",
                               virtual_stages=2), "Llama-3 405B")

Also `launch_path`: how `distlab.launch` starts its ranks (notebook 00's first picture).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from ._chart import BACKGROUND, FAINT, INK, MISSING, OKABE_ITO, Chart, ink_for
from ._config import check_int
from ._grid_picture import RankGrid, rank_grid
from ._launch_picture import LaunchPath
from ._mesh_picture import MeshPicture
from .errors import InputError, InputTypeError

__all__ = ["Cell", "LaunchPath", "MeshPicture", "Picture", "RankGrid", "collective", "launch_path",
           "mesh", "rank_grid"]


# Layout, in cell widths.
_ROW = 1.35  # from one rank's row to the next
_GROUP_GAP = 0.4  # between the tensors of a list
_LABEL_W = 1.7  # the "rank N" column
_MID_W = 1.6  # between the before and after panels
_INCH_PER_CELL = 0.42
# Rough text widths, in cell widths per character, to make room for titles and labels.
_TITLE_CHAR_W = 0.27  # 12 pt bold
_LABEL_CHAR_W = 0.21  # 10 pt italic


@dataclass(frozen=True)
class Cell:
    """One drawn cell: a value some rank holds on one side of the picture.

    ``side`` is "before" or "after"; ``group`` is the index in a list of tensors (0 for a plain
    tensor); ``index`` the position in that tensor; ``text`` the value as printed; ``colour`` the
    fill (``#RRGGBB``) and ``text_colour`` the ink chosen to contrast with it.
    """

    side: str
    rank: int
    group: int
    index: int
    value: float | int | bool | None
    text: str
    colour: str
    text_colour: str


@dataclass(frozen=True)
class _Holding:
    """What one rank holds on one side: nothing, one tensor, or a list of tensors."""

    kind: str  # "none" | "tensor" | "list"
    groups: tuple[tuple, ...] = ()  # the values of each tensor (one group for "tensor")


class Picture(Chart):
    """A collective drawn as per-rank cells, before and after. Build one with `collective`.

    Shows as a PNG in Jupyter (``_repr_png_``) and as text elsewhere (``repr``/``str``, also the
    ``text/plain`` form Jupyter saves next to the PNG). ``png()`` gives the PNG bytes,
    ``figure()`` a matplotlib ``Figure`` to save or adjust, ``cells()`` the cells with their
    colours, ``colour(value)`` the colour of one value. Colours are given per picture: the
    distinct values, smallest first, take the colours of a colour-blind-safe palette (a viridis
    ramp beyond 8 values), so equal values share a colour on both sides.
    """

    def __init__(self, name, before, after, *, title, arrows, labels, max_cells):
        self.name = name
        self.title = title
        self.labels = labels
        self.max_cells = max_cells
        self.before = before  # list[_Holding], one per rank
        self.after = after
        self.arrows = arrows  # list[(src, dst)]
        self._colours = _colour_map(
            v for side in (before, after) for h in side for g in h.groups for v in g
        )
        self._png: bytes | None = None

    @property
    def world_size(self) -> int:
        return len(self.before)

    # --- text -------------------------------------------------------------------------------

    def text(self) -> str:
        """The picture as text: a header line, then ``rank N: before  ->  after`` per rank."""
        header = self.name if self.title is None else f"{self.name}: {self.title}"
        lefts = [self._holding_text(h) for h in self.before]
        rights = [self._holding_text(h) for h in self.after]
        width = max(len(s) for s in lefts)
        lines = [header]
        for rank, (left, right) in enumerate(zip(lefts, rights, strict=True)):
            lines.append(f"rank {rank}: {left.ljust(width)}  ->  {right}")
        if self.arrows:
            lines.append("moves: " + ", ".join(f"rank {s} -> rank {d}" for s, d in self.arrows))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.text()

    __str__ = __repr__

    def _holding_text(self, holding: _Holding) -> str:
        if holding.kind == "none":
            return "-"
        parts = [self._group_text(g) for g in holding.groups]
        return parts[0] if holding.kind == "tensor" else "[" + ", ".join(parts) + "]"

    def _group_text(self, values: tuple) -> str:
        shown, hidden = _truncate(values, self.max_cells)
        items = [_fmt(v) for v in shown]
        if hidden:
            items.append(f"... (+{hidden})")
        return "[" + ", ".join(items) + "]"

    # --- colours ----------------------------------------------------------------------------

    def colour(self, value) -> str:
        """The fill colour (``#RRGGBB``) of ``value`` in this picture. KeyError if not shown."""
        return self._colours[_key(value)]

    def cells(self) -> list[Cell]:
        """Every cell drawn, side by side, rank by rank (cut to ``max_cells`` per tensor)."""
        out = []
        for side, holdings in (("before", self.before), ("after", self.after)):
            for rank, holding in enumerate(holdings):
                for g, values in enumerate(holding.groups):
                    shown, _ = _truncate(values, self.max_cells)
                    for i, v in enumerate(shown):
                        fill = self._colours[_key(v)]
                        out.append(Cell(side, rank, g, i, v, _fmt(v), fill, ink_for(fill)))
        return out

    # --- drawing ----------------------------------------------------------------------------

    def figure(self):
        """A new matplotlib ``Figure`` of the picture (not shown by pyplot; save or display it)."""
        from matplotlib.figure import Figure
        from matplotlib.patches import FancyArrowPatch

        w_before = max(self._width(h) for h in self.before)
        w_after = max(self._width(h) for h in self.after)
        x_before = _LABEL_W
        header = self.name if self.title is None else f"{self.name}  ({self.title})"
        # Make room for the "before" label above its panel, and for the heading.
        x_after = x_before + max(w_before + _MID_W, len(self.labels[0]) * _LABEL_CHAR_W + 0.6)
        total_w = max(
            x_after + max(w_after, len(self.labels[1]) * _LABEL_CHAR_W) + 0.2,
            0.15 + len(header) * _TITLE_CHAR_W + 0.3,
        )
        top = 1.9  # room for the title and the panel labels
        total_h = top + self.world_size * _ROW

        fig = Figure(
            figsize=(total_w * _INCH_PER_CELL, total_h * _INCH_PER_CELL), facecolor=BACKGROUND
        )
        ax = fig.add_axes((0, 0, 1, 1))
        ax.set_xlim(0, total_w)
        ax.set_ylim(-total_h + top, top)
        ax.set_axis_off()
        ax.set_facecolor(BACKGROUND)

        ax.text(
            0.15,
            top - 0.55,
            header,
            ha="left",
            va="center",
            fontsize=12,
            fontweight="bold",
            color=INK,
        )
        for x, label in zip((x_before, x_after), self.labels, strict=True):
            ax.text(
                x, top - 1.45, label, ha="left", va="center", fontsize=10, color=FAINT,
                style="italic",
            )

        for rank in range(self.world_size):
            y = -rank * _ROW  # cells span y-1 .. y
            ax.text(0.15, y - 0.5, f"rank {rank}", ha="left", va="center", fontsize=10, color=INK)
            self._draw_holding(ax, self.before[rank], x_before, y)
            self._draw_holding(ax, self.after[rank], x_after, y)
            if not self.arrows:
                ax.annotate(
                    "",
                    xy=(x_after - 0.35, y - 0.5),
                    xytext=(x_before + w_before + 0.35, y - 0.5),
                    arrowprops={"arrowstyle": "->", "color": FAINT, "lw": 1.2},
                )

        # Arrows leaving one rank (or reaching one rank) fan out over its cell height.
        starts = _spread([src for src, _ in self.arrows], [dst for _, dst in self.arrows])
        ends = _spread([dst for _, dst in self.arrows], [src for src, _ in self.arrows])
        for (src, dst), dy_start, dy_end in zip(self.arrows, starts, ends, strict=True):
            start = (x_before + self._width(self.before[src]) + 0.15, -src * _ROW - 0.5 + dy_start)
            end = (x_after - 0.15, -dst * _ROW - 0.5 + dy_end)
            bend = 0.0 if src == dst else 0.15 * (1 if dst > src else -1)
            ax.add_patch(
                FancyArrowPatch(
                    start,
                    end,
                    arrowstyle="-|>",
                    mutation_scale=11,
                    color=INK,
                    lw=1.1,
                    connectionstyle=f"arc3,rad={bend}",
                    shrinkA=0,
                    shrinkB=0,
                )
            )
        return fig

    def _width(self, holding: _Holding) -> float:
        if holding.kind == "none":
            return 1.0
        widths = []
        for values in holding.groups:
            shown, hidden = _truncate(values, self.max_cells)
            widths.append(max(1, len(shown) + (1 if hidden else 0)))
        return sum(widths) + _GROUP_GAP * (len(widths) - 1)

    def _draw_holding(self, ax, holding, x, y):
        """Draw what one rank holds on one side, its top-left corner at (x, y)."""
        from matplotlib.patches import FancyBboxPatch, Rectangle

        if holding.kind == "none":
            ax.text(x + 0.5, y - 0.5, "-", ha="center", va="center", fontsize=11, color=FAINT)
            return
        for values in holding.groups:
            shown, hidden = _truncate(values, self.max_cells)
            start = x
            if not shown and not hidden:  # an empty tensor: a dashed, empty box
                ax.add_patch(
                    Rectangle((x, y - 1), 1, 1, fill=False, edgecolor=FAINT, linestyle="--", lw=1)
                )
                x += 1
            for v in shown:
                fill = self._colours[_key(v)]
                ax.add_patch(Rectangle((x, y - 1), 1, 1, facecolor=fill, edgecolor=INK, lw=0.8))
                ax.text(
                    x + 0.5,
                    y - 0.5,
                    _fmt(v),
                    ha="center",
                    va="center",
                    fontsize=_font_size(_fmt(v)),
                    color=ink_for(fill),
                )
                x += 1
            if hidden:
                ax.text(
                    x + 0.5, y - 0.5, "...", ha="center", va="center", fontsize=10, color=FAINT
                )
                x += 1
            if holding.kind == "list":  # outline each tensor of a list
                ax.add_patch(
                    FancyBboxPatch(
                        (start, y - 1),
                        x - start,
                        1,
                        fill=False,
                        edgecolor=FAINT,
                        lw=1.0,
                        boxstyle="round,pad=0.08,rounding_size=0.12",
                    )
                )
            x += _GROUP_GAP


def collective(
    name, before, after, *, title=None, arrows=None, labels=("before", "after"), max_cells=16
) -> Picture:
    """Draw a collective: what each rank holds before and after it, one row per rank.

    Args:
        name: the collective's name, shown as the heading (e.g. ``"all_reduce"``).
        before: one entry per rank, what it holds before: a 1-D tensor or a list of numbers (a
            row of cells), a single number or 0-d tensor (one cell), a list of tensors (list-style
            arguments such as ``scatter_list``; drawn as separate groups) or ``None`` (holds
            nothing there).
        after: the same, after the collective. Must have as many entries as ``before``.
        title: optional detail after the name (e.g. ``"op=SUM, dst=0"``).
        arrows: optional ``(src, dst)`` rank pairs, drawn from ``src``'s "before" to ``dst``'s
            "after" (e.g. ``[(0, 1)]`` for a send from rank 0 to rank 1).
        labels: the headings of the two sides.
        max_cells: at most this many cells per tensor; longer tensors end in ``...``.

    Returns:
        A `Picture`: shown as an image in Jupyter, as text by ``print``.

    Raises:
        ValueError: ``before`` and ``after`` have different numbers of ranks (give one entry per
            rank on both sides); an entry is neither a number, a tensor, a list of numbers, a list
            of tensors nor ``None`` (e.g. a list mixing numbers and lists); a tensor has more than
            one dimension (pass ``t.flatten()``); a value is not a real number; an arrow names a
            rank that is not in the picture.
        TypeError: ``before``/``after`` is not a list or tuple (wrap a single rank's tensor in a
            list: ``[t]``), or ``max_cells`` is not an int >= 1.
    """
    check_int(max_cells, "max_cells", low=1, error=TypeError)
    sides = {}
    for side, entries in (("before", before), ("after", after)):
        if not isinstance(entries, (list, tuple)):
            raise InputTypeError(
                f"{side} must be a list with one entry per rank, got {type(entries).__name__}; "
                f"for a single rank write [{side}]"
            )
        if not entries:
            raise InputError(f"{side} is empty: give one entry per rank")
        sides[side] = [_holding(e, side, rank) for rank, e in enumerate(entries)]
    if len(before) != len(after):
        raise InputError(
            f"before has {len(before)} ranks but after has {len(after)}: "
            "give one entry per rank on both sides (None for a rank that holds nothing)"
        )
    world_size = len(before)
    pairs = []
    for pair in arrows or ():
        try:
            src, dst = (int(r) for r in pair)
        except (TypeError, ValueError):
            raise InputError(f"arrows must be (src, dst) rank pairs, got {pair!r}") from None
        if not (0 <= src < world_size and 0 <= dst < world_size):
            raise InputError(
                f"arrow {pair!r} names a rank outside 0..{world_size - 1} "
                f"(the picture has {world_size} ranks)"
            )
        pairs.append((src, dst))
    if len(labels) != 2:
        raise InputError(f"labels must be two strings (before, after), got {labels!r}")
    return Picture(
        name,
        sides["before"],
        sides["after"],
        title=title,
        arrows=pairs,
        labels=tuple(labels),
        max_cells=max_cells,
    )



def mesh(layout, model, *, rows_shown=3) -> MeshPicture:
    """Draw a training layout: nodes of ``tp`` GPUs, one column per pipeline rank, one row per
    data-parallel rank, each pipeline rank's stages and layers, its FSDP group and the links.

    Args:
        layout: a `distlab.scale.Layout` (or `distlab.calculators.Layout`: the same class); its
            ``pp``, ``dp``, ``tp``, ``cp``, ``replicate``, ``virtual_stages`` and ``schedule``
            are drawn.
        model: what the layers are split from: a preset's name (``"Llama-3 405B"``) or a
            `distlab.calculators.Transformer`; its layers go to the ``pp x virtual_stages``
            stages as `distlab.calculators.stage_layers` splits them.
        rows_shown: how many data-parallel rows to draw: the first ``rows_shown - 1`` and the
            last (at least 2).

    Returns:
        A `MeshPicture`: shown as an image in Jupyter, as text (one line per pipeline rank) by
        ``print``.

    Raises:
        TypeError: ``layout`` is not a Layout (build one: ``scale.Layout(dp=..., tp=..., pp=...)``)
            or ``rows_shown`` is not an int >= 2.
        ValueError: ``model`` is not a preset or a Transformer, or its layers do not split into
            the layout's stages (the message names the stage counts that work).
    """
    from .calculators.models import Transformer, get_model, stage_layers

    needed = ("pp", "dp", "tp", "cp", "replicate", "virtual_stages", "schedule")
    if not all(hasattr(layout, name) for name in needed):
        raise InputTypeError(
            f"layout must be a distlab.scale.Layout, got {type(layout).__name__}; build one: "
            "scale.Layout(dp=128, tp=8, pp=16)"
        )
    check_int(rows_shown, "rows_shown", low=2, error=TypeError)
    model = get_model(model)
    if not isinstance(model, Transformer):
        raise InputError(f"model must be a transformer (a preset's name or a Transformer), got "
                         f"{model!r}: a picture of stages needs its layers")
    stages = layout.pp * layout.virtual_stages
    return MeshPicture(
        model.name,
        pp=layout.pp, dp=layout.dp, tp=layout.tp, cp=layout.cp, replicate=layout.replicate,
        virtual_stages=layout.virtual_stages, schedule=layout.schedule,
        layers=stage_layers(model.layers, stages), rows_shown=rows_shown,
    )

# --- input ------------------------------------------------------------------------------------


def _is_number(x) -> bool:
    return isinstance(x, (numbers.Number, bool)) and not isinstance(x, complex)


def _is_array(x) -> bool:  # a torch tensor or a numpy array, without importing either
    return hasattr(x, "tolist") and hasattr(x, "ndim")


def _values(x, side: str, rank: int) -> tuple:
    """The values of one tensor-like entry: a number, a 0-d/1-d array, or a list of numbers."""
    if _is_array(x):
        if x.ndim > 1:
            raise InputError(
                f"{side}[{rank}] is a tensor with {x.ndim} dimensions (shape "
                f"{tuple(x.shape)}); pictures draw 1-D tensors: pass t.flatten()"
            )
        x = x.tolist()
        x = [x] if not isinstance(x, list) else x
    elif _is_number(x):
        x = [x]
    out = []
    for v in x:
        if isinstance(v, complex) or not _is_number(v):
            raise InputError(
                f"{side}[{rank}] holds {v!r}, which is not a real number; an entry is a "
                "tensor, a list of numbers, a list of tensors or None"
            )
        out.append(v)
    return tuple(out)


def _holding(entry, side: str, rank: int) -> _Holding:
    if entry is None:
        return _Holding("none")
    if _is_array(entry) or _is_number(entry):
        return _Holding("tensor", (_values(entry, side, rank),))
    if not isinstance(entry, (list, tuple)):
        raise InputError(
            f"{side}[{rank}] is a {type(entry).__name__}; an entry is a tensor, a number, a "
            "list of numbers, a list of tensors or None"
        )
    for v in entry:
        if not (_is_number(v) or _is_array(v) or isinstance(v, (list, tuple))):
            raise InputError(
                f"{side}[{rank}] holds {v!r}, which is not a real number; an entry is a "
                "tensor, a list of numbers, a list of tensors or None"
            )
    if all(_is_number(v) for v in entry):  # [1, 2, 3]: one tensor's values
        return _Holding("tensor", (_values(entry, side, rank),))
    if all(_is_array(v) or isinstance(v, (list, tuple)) for v in entry):  # a list of tensors
        groups = []
        for v in entry:
            if isinstance(v, (list, tuple)) and not all(_is_number(x) for x in v):
                raise InputError(
                    f"{side}[{rank}] nests lists too deeply ({v!r}); a list-style entry is a "
                    "flat list of tensors (or of lists of numbers)"
                )
            groups.append(_values(v, side, rank))
        return _Holding("list", tuple(groups))
    raise InputError(
        f"{side}[{rank}] mixes numbers and tensors/lists ({entry!r}); give either the values of "
        "one tensor ([1, 2]) or a list of tensors ([[1], [2]])"
    )


# --- formatting and colour ---------------------------------------------------------------------


def _spread(ends: list[int], others: list[int]) -> list[float]:
    """Vertical offsets so that arrows sharing an end rank meet it at different heights.

    Arrows sharing an end are ordered by the rank at their other end (top to bottom) and spread
    over the middle 60% of the cell; a lone arrow meets the middle.
    """
    offsets = [0.0] * len(ends)
    for rank in set(ends):
        mine = sorted((i for i, e in enumerate(ends) if e == rank), key=lambda i: others[i])
        for k, i in enumerate(mine):
            if len(mine) > 1:
                offsets[i] = 0.3 - 0.6 * k / (len(mine) - 1)  # y grows upwards: top first
    return offsets


def _truncate(values: tuple, max_cells: int) -> tuple[tuple, int]:
    """The values to draw and how many are left out (the last cell becomes "...")."""
    if len(values) <= max_cells:
        return values, 0
    keep = max(1, max_cells - 1)
    return values[:keep], len(values) - keep


def _fmt(v) -> str:
    """A value as shown: exact integers, floats with a decimal point, at most 4 digits."""
    if isinstance(v, bool) or isinstance(v, numbers.Integral):
        return str(v)
    v = float(v)
    if math.isnan(v) or math.isinf(v):
        return str(v)
    if v.is_integer() and abs(v) < 1e6:
        return f"{v:.1f}"
    return f"{v:.4g}"


def _key(v) -> float:
    """Values that are equal (1, 1.0, True) share a colour."""
    return float(v)


def _colour_map(values) -> dict[float, str]:
    keys = sorted({_key(v) for v in values if not math.isnan(_key(v))})
    colours: dict[float, str] = {}
    if len(keys) <= len(OKABE_ITO):
        colours = dict(zip(keys, OKABE_ITO[: len(keys)], strict=True))
    else:
        from matplotlib import colormaps
        from matplotlib.colors import to_hex

        cmap = colormaps["viridis"]
        colours = {k: to_hex(cmap(i / (len(keys) - 1))) for i, k in enumerate(keys)}
    colours[float("nan")] = MISSING
    return _NanAwareDict(colours)


class _NanAwareDict(dict):
    """A dict in which every NaN key finds the NaN entry (NaN != NaN)."""

    def __getitem__(self, key):
        if isinstance(key, float) and math.isnan(key):
            return MISSING
        return super().__getitem__(key)


def _font_size(text: str) -> float:
    return 10 if len(text) <= 4 else max(6, 10 - 1.1 * (len(text) - 4))


# --- how distlab.launch starts ranks (notebook 00) --------------------------------------------


def launch_path(world_size: int = 2) -> LaunchPath:
    """Draw how `distlab.launch` starts ``world_size`` ranks: the kernel asks distlab's helper
    process to fork them; each rank then talks to the kernel over its own socket (tasks, results)
    and pipe (output), and to the other ranks over gloo.

    Args:
        world_size: how many ranks to draw (1 to 4; the picture gets crowded beyond).

    Returns:
        A `LaunchPath`: an image in Jupyter, a line of text by ``print``.

    Raises:
        TypeError: ``world_size`` is not an int.
        ValueError: ``world_size`` is not from 1 to 4.
    """
    check_int(world_size, "world_size", low=1, high=4, error=InputError,
              type_error=InputTypeError)
    return LaunchPath(world_size)
