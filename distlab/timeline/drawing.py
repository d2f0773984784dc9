"""A timeline as a picture: one swim-lane per rank (labels on top, compute in the middle,
communication below with its waits hatched), milliseconds along the bottom."""

from __future__ import annotations

import functools
import re

from .._chart import BACKGROUND, COMM, COMPUTE, INK, LABELS, WAIT, key
from .trace import Event

_AXES_INCHES = 8.8  # width of the plot area in inches
_FONT_PT = 7

#: Each label's colour, kept for as long as the kernel runs: a label has the same colour in every
#: timeline a notebook draws (given in order of first appearance, so a re-run gives the same).
_LABEL_COLOURS: dict[str, str] = {}


def label_colour(base: str) -> str:
    """The colour of label ``base`` (a label without its layer number) in every picture."""
    if base not in _LABEL_COLOURS:
        _LABEL_COLOURS[base] = LABELS[len(_LABEL_COLOURS) % len(LABELS)]
    return _LABEL_COLOURS[base]


def figure(timeline, device: str | None = None):
    """`distlab.timeline.Timeline.figure` (see there)."""
    from matplotlib.figure import Figure

    device = timeline._device(device)
    n = timeline.world_size
    end = timeline.duration
    bases = []  # the kinds of labels, in order of first appearance: one colour each
    for r in range(n):
        for e in timeline._events[r]:
            if e.kind == "label" and e.thread == "main" and e.depth == 0:
                if _base(e.name) not in bases:
                    bases.append(_base(e.name))
    label_colours = {b: label_colour(b) for b in bases}
    key_rows = -(-len(bases) // 3)  # the colour key below the plot, three per row
    height = 1.0 + 1.0 * n + 0.2 * key_rows
    fig = Figure(figsize=(10, height), facecolor=BACKGROUND)
    ax = fig.add_axes((0.1, (0.6 + 0.2 * key_rows) / height, 0.88, n / height))
    ax.set_facecolor(BACKGROUND)
    scale = 1e3  # seconds -> ms
    yticks, ylabels = [], []
    for r in range(n):
        top = (n - 1 - r) * 1.0
        rows = {"label": top + 0.68, "compute": top + 0.38, "comm": top + 0.08}
        for e in timeline._events[r]:
            if e.kind == "label" and e.thread == "main" and e.depth == 0:
                ax.broken_barh(
                    [(e.start * scale, e.duration * scale)],
                    (rows["label"], 0.24),
                    facecolors=label_colours[_base(e.name)],
                    edgecolor=INK,
                    linewidth=0.4,
                )
                _bar_text(ax, e, e.name, rows["label"], scale, end)
        compute = timeline._compute(r, device)
        ax.broken_barh(
            [(a * scale, (b - a) * scale) for a, b in compute],
            (rows["compute"], 0.24),
            facecolors=COMPUTE,
        )
        transport = (
            [e for e in timeline._events[r] if e.kind == "comm" and e.thread == "gpu"]
            if device == "cuda"
            else timeline._transport(r)
        )
        ax.broken_barh(
            [(e.start * scale, e.duration * scale) for e in transport],
            (rows["comm"], 0.24),
            facecolors=COMM,
            edgecolor=INK,
            linewidth=0.4,
        )
        if device == "cpu":
            waited = [x for _, iv in timeline._wait_intervals(r) for x in iv]
            ax.broken_barh(
                [(a * scale, (b - a) * scale) for a, b in waited],
                (rows["comm"], 0.24),
                facecolors=WAIT,
                hatch="///",
                edgecolor=INK,
                linewidth=0.4,
            )
        for e in transport:  # named after the collective, as in notebook 06's pictures
            if any(o is not e and o.start < e.end and e.start < o.end for o in transport):
                continue  # collectives in flight together share the lane: no room for a name
            _bar_text(
                ax,
                e,
                _collective(e.name),
                rows["comm"],
                scale,
                end,
                bbox={"facecolor": COMM, "edgecolor": "none", "pad": 0.5},
            )
        yticks += [rows["label"] + 0.12, rows["compute"] + 0.12, rows["comm"] + 0.12]
        ylabels += [f"rank {r}  labels", "compute", "comm"]
    ax.set_yticks(yticks, ylabels, fontsize=8)
    ax.set_ylim(0, n)
    ax.set_xlim(0, max(end, 1e-6) * scale)
    ax.set_xlabel("ms since the ranks met", fontsize=9)
    ax.tick_params(axis="x", labelsize=8)
    for r in range(1, n):
        ax.axhline(r, color="#BBBBBB", lw=0.8)
    key(
        ax,
        [
            ("compute (PyTorch ops)", COMPUTE),
            ("collective under way", COMM),
            ("waiting for the last rank", WAIT, "///"),
        ],
    )
    if bases:
        key(
            fig,
            [(b, label_colours[b]) for b in bases],
            above=False,
            fontsize=7,
            title="labels (record_function)",
            title_fontsize=7,
        )
    return fig

def _bar_text(
    ax, e: Event, name: str, row: float, scale: float, total: float, **style
) -> None:
    """``name`` centred on the bar of event ``e`` in lane ``row``, if it fits the bar."""
    text = _shown(name, e.duration, total)
    if text:
        ax.text(
            (e.start + e.duration / 2) * scale,
            row + 0.12,
            text,
            ha="center",
            va="center",
            fontsize=_FONT_PT,
            color=INK,
            clip_on=True,
            **style,
        )


def _base(name: str) -> str:
    """A label without its module or layer: "FSDP::pre_forward (1)" -> "FSDP::pre_forward"."""
    return re.sub(r"\s*(?:\(\d+\)|for \S+)$", "", name)


def _collective(name: str) -> str:
    """A transport event's collective: "gloo:all_reduce" -> "all_reduce"."""
    return name.split(":", 1)[-1]


def _shown(text: str, duration: float, total: float) -> str | None:
    """The text to write on a bar: ``text``, else without its "FSDP::"-like prefix, else None."""
    for candidate in (text, re.sub(r"^\w+::", "", text)):
        if _fits(candidate, duration, total):
            return candidate
    return None


def _fits(text: str, duration: float, total: float) -> bool:
    """Whether ``text`` at 7 pt, measured with the font it is drawn in, fits inside a bar of
    ``duration`` on an axis ``total`` long, with a little room on each side."""
    if total <= 0:
        return False
    return _text_inches(text) + 0.06 < duration / total * _AXES_INCHES


@functools.lru_cache(maxsize=4096)
def _text_inches(text: str) -> float:
    """The width of ``text`` at 7 pt, in inches, from the font's own metrics (a timeline asks
    for the same few names hundreds of times)."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    width, _, _ = TextToPath().get_text_width_height_descent(
        text, FontProperties(size=_FONT_PT), ismath=False
    )
    return width / 72
