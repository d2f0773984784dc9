"""Axes for the calculators' charts: a new figure, or the widget's figure emptied for a redraw.

Emptying an axes of what was drawn on it (bars, lines, texts, legends) and drawing again is about
twice as quick as clearing the figure and building new axes (each new axes builds its ticks
anew), which is most of a widget's redraw time. Knows nothing about what is drawn.
"""

from __future__ import annotations

import functools

from .. import _chart


def axes(fig, size, rect):
    """``(fig, ax)``: ``fig`` (None: a new ``Figure`` of ``size`` inches) with one axes at
    ``rect`` (figure fractions), emptied if it was drawn on before."""
    from matplotlib.figure import Figure

    if fig is None or len(fig.axes) != 1:
        fig = Figure(figsize=size, facecolor=_chart.BACKGROUND)
        ax = fig.add_axes(rect)
    else:
        ax = fig.axes[0]
        for artist in [*ax.patches, *ax.texts, *ax.lines, *ax.collections]:
            artist.remove()
        ax.containers.clear()
        if ax.get_legend() is not None:
            ax.get_legend().remove()
        if tuple(fig.get_size_inches()) != tuple(size):
            fig.set_size_inches(size)
        ax.set_position(rect)
    ax.set_facecolor(_chart.BACKGROUND)
    return fig, ax


def labels(ax, points, texts, colour, size=6) -> None:
    """Short labels (``texts``) centred on ``points`` (data coordinates), all in one colour,
    drawn as one collection of glyph outlines: several times quicker than one ``ax.text``
    each, which matters when a chart numbers a hundred bars and redraws on every keypress."""
    from matplotlib.collections import PathCollection
    from matplotlib.transforms import Affine2D

    if not texts:
        return
    fig = ax.get_figure()
    labels = PathCollection(
        [_outline(t, size) for t in texts],
        offsets=points,
        offset_transform=ax.transData,
        transform=Affine2D().scale(1 / 72) + fig.dpi_scale_trans,  # points -> pixels
        facecolors=colour,
        edgecolors="none",
    )
    ax.add_collection(labels, autolim=False)


@functools.lru_cache(maxsize=512)
def _outline(text: str, size: float):
    """``text``'s glyphs as a path in points, centred on (0, 0)."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextPath
    from matplotlib.transforms import Affine2D

    path = TextPath((0, 0), text, size=size, prop=FontProperties())
    box = path.get_extents()
    return path.transformed(
        Affine2D().translate(-(box.x0 + box.x1) / 2, -(box.y0 + box.y1) / 2)
    )
