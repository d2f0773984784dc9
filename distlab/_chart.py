"""One look for every picture distlab draws: the palette, the card it is drawn on, and the base
class that turns a figure into PNG bytes once and shows them in Jupyter.

Every chart (`distlab.pictures.Picture`, `distlab.timeline.Timeline`, `distlab.memory.Table`
and `SideBySide`, the calculators) is a `Chart`: it implements ``figure()`` and inherits
``png()`` and ``_repr_png_``. Colours come from here only, so a colour means the same thing in
every notebook (compute is blue, communication orange, waiting red-orange and hatched).

Knows nothing about what is drawn: each chart module lays out its own axes.
"""

from __future__ import annotations

import io

#: Okabe-Ito: colours that colour-blind readers can tell apart (its black left out: it would
#: vanish on a dark theme). Pictures of collectives colour values with these, in this order.
OKABE_ITO = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#999999")

BACKGROUND = "#F5F5F5"  #: neutral: a light card reads the same in light and dark JupyterLab
INK = "#222222"  #: labels, titles and outlines on that card
FAINT = "#8A8A8A"  #: secondary text, dashed outlines, arrows
MISSING = "#BBBBBB"  #: a value that is not a number (NaN)

#: What a colour means wherever it appears.
COMPUTE = "#0072B2"
COMM = "#E69F00"
WAIT = "#D55E00"
PARTS = {
    "params": "#0072B2",
    "grads": "#E69F00",
    "optimizer": "#009E73",
    "activations": "#CC79A7",
}

#: Colours for named things without a fixed meaning (a timeline's labels): the Okabe-Ito colours
#: left once compute, communication and waiting have theirs, then matplotlib's tab20 colours that
#: do not look like those three.
LABELS = (
    "#56B4E9", "#009E73", "#F0E442", "#CC79A7", "#999999", "#BBBBBB",
    "#9467BD", "#E377C2", "#BCBD22", "#17BECF", "#8C564B", "#98DF8A",
    "#C5B0D5", "#F7B6D2", "#DBDB8D", "#9EDAE5", "#C49C94", "#C7C7C7",
)

#: PNG resolution; shown at 100 pixels per inch, so it stays sharp on HiDPI screens.
DPI = 150


def png_bytes(fig) -> bytes:
    """A matplotlib figure as PNG bytes, the way every distlab chart is saved: same resolution
    and background, and no "Software" entry, so the bytes depend only on what is drawn."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, facecolor=BACKGROUND, metadata={"Software": None})
    return buf.getvalue()


def png_repr(data: bytes):
    """What ``_repr_png_`` returns for PNG ``data`` made by `png_bytes`: the bytes, and a width
    of 100 pixels per inch of figure."""
    width = int.from_bytes(data[16:20], "big")  # in pixels, from the PNG header
    return data, {"width": round(width * 100 / DPI)}


def key(where, entries, *, above: bool = True, **style) -> None:
    """Draw a colour key on an axes or a figure (``where``): ``entries`` are ``(label, colour)``
    or ``(label, colour, hatch)``, three to a row; ``above`` an axes (the default) or, for a
    figure, at its foot. ``style`` overrides the legend's options (``fontsize``, ``title``)."""
    from matplotlib.patches import Patch

    handles = [
        Patch(facecolor=colour, edgecolor=INK, hatch=rest[0] if rest else None, label=label)
        for label, colour, *rest in entries
    ]
    options = {
        "loc": "lower center",
        "bbox_to_anchor": (0.5, 1.0) if above else (0.5, 0.02),
        "ncol": 3,
        "fontsize": 8,
        "frameon": False,
        **style,
    }
    where.legend(handles=handles, **options)


class Chart:
    """Base of every distlab chart: subclasses implement ``figure()``; the PNG is drawn once, on
    first use, and kept (a chart does not change after it is built)."""

    _png: bytes | None = None

    def figure(self):
        """A matplotlib ``Figure`` of this chart (not shown by pyplot; display or save it)."""
        raise NotImplementedError

    def png(self) -> bytes:
        """The chart as PNG bytes (the same bytes for the same chart and matplotlib)."""
        if self._png is None:
            self._png = png_bytes(self.figure())
        return self._png

    def _repr_png_(self):
        return png_repr(self.png())


def luminance(hex_colour: str) -> float:
    """Relative luminance (WCAG 2) of ``#RRGGBB``."""
    channels = [int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def ink_for(fill: str) -> str:
    """Black or white, whichever contrasts more with ``fill``."""
    lum = luminance(fill)
    return "#000000" if (lum + 0.05) / 0.05 >= 1.05 / (lum + 0.05) else "#FFFFFF"
