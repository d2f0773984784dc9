"""What every calculator widget shares: labelled controls, a chart and a text table that redraw
when a control changes, the time each redraw took, and a form that reads without a kernel.

A `Calculator` is an ipywidgets ``VBox``. Where no kernel runs (GitHub, nbviewer, a notebook
opened later), the saved output still shows the default state: `_repr_mimebundle_` adds its text
table (``text/plain``) and its chart (``image/png``, the same bytes on every run) next to the
widget view. Live redraws are drawn at a lower resolution than saved charts, on one reused
matplotlib figure, to stay well under 100 ms on a laptop.

Knows nothing about what it calculates: `widgets` builds one per calculator.
"""

from __future__ import annotations

import base64
import html
import io
import time

import ipywidgets

from .. import _chart
from .._config import check_int
from ._text import CalculatorError

#: Resolution of live redraws (saved charts use `distlab._chart.DPI`).
LIVE_DPI = 80
_CONTROL_STYLE = {"description_width": "110px"}


def live_png(fig) -> bytes:
    """``fig`` as PNG at `LIVE_DPI`: quick to draw and to send, deterministic bytes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=LIVE_DPI, facecolor=_chart.BACKGROUND,
                metadata={"Software": None}, pil_kwargs={"compress_level": 1})
    return buf.getvalue()


class Calculator(ipywidgets.VBox):
    """Controls, then a chart, then a text table, redrawn whenever a control's value changes.

    Args:
        name: a short name; the widget gets the CSS class ``distlab-calculator-<name>`` and each
            control ``distlab-control-<key>`` (what the browser test finds them by).
        controls: ``{key: ipywidgets control}``; each control's value is passed to ``compute``
            as the keyword ``key``. Give each a ``description``: it is its label.
        compute: ``compute(**values) -> (text, chart)``, a string and a `distlab._chart.Chart`.
            A ValueError or FileNotFoundError it raises is shown in place of the text (the
            chart keeps its last picture), so a learner sees why a setting does not work. A
            chart with a ``key`` attribute is drawn once per key (the stepper's Play loop).
        columns: controls per row.
        extra: widgets shown between the controls and the chart (the stepper's Play button).

    Raises:
        ValueError (a `CalculatorError`) or FileNotFoundError: the controls' initial values do
            not work (``compute`` raised it); the message says what to choose instead.

    Attributes:
        timings: seconds each redraw took (compute, draw, PNG), in order.
        text: the text shown now (or the error).
    """

    def __init__(self, name, controls, compute, *, columns=3, extra=()):
        self._controls = dict(controls)
        self._compute = compute
        self._fig = None
        self._pngs: dict = {}  # live PNGs of charts that name a ``key``, newest last
        self.timings: list[float] = []
        self._text = ipywidgets.HTML()
        self._text.add_class("distlab-calculator-text")
        self._image = ipywidgets.Image(format="png")
        self._image.add_class("distlab-calculator-chart")
        for key, control in self._controls.items():
            control.style = _CONTROL_STYLE
            control.add_class(f"distlab-control-{key}")
        grid = ipywidgets.GridBox(
            list(self._controls.values()),
            layout=ipywidgets.Layout(grid_template_columns=f"repeat({columns}, 290px)"),
        )
        super().__init__([grid, *extra, self._image, self._text])
        self.add_class("distlab-calculator")
        self.add_class(f"distlab-calculator-{name}")
        self.text, self._chart = "", None
        self.redraw(raise_errors=True)  # a bad default is the caller's to fix: say so now
        self._default_text, self._default_chart = self.text, self._chart
        self._default_png: bytes | None = None
        for control in self._controls.values():
            control.observe(self.redraw, names="value")

    def values(self) -> dict:
        """The controls' values now, by key."""
        return {key: control.value for key, control in self._controls.items()}

    def redraw(self, change=None, *, raise_errors=False) -> None:
        """Compute and draw again from the controls' values (called on every change)."""
        start = time.perf_counter()
        try:
            text, chart = self._compute(**self.values())
        except (ValueError, FileNotFoundError) as e:
            if raise_errors:
                raise
            self.text = f"✗ {e}"
            self._text.value = ('<pre class="distlab-calculator-error" style="color:#D55E00">'
                                f"{html.escape(self.text)}</pre>")
        else:
            self.text, self._chart = text, chart
            self._text.value = f"<pre>{html.escape(text)}</pre>"
            key = getattr(chart, "key", None)  # the same picture seen again: no redraw
            png = self._pngs.pop(key, None) if key is not None else None
            if png is None:
                self._fig = chart.figure(fig=self._fig) if _reuses(chart) else chart.figure()
                png = live_png(self._fig)
            if key is not None:
                self._pngs[key] = png
                while len(self._pngs) > 64:
                    del self._pngs[next(iter(self._pngs))]
            width = int.from_bytes(png[16:20], "big")
            self._image.layout.width = f"{round(width * 100 / LIVE_DPI)}px"
            self._image.value = png
        self.timings.append(time.perf_counter() - start)

    def _repr_mimebundle_(self, **kwargs):
        data = super()._repr_mimebundle_(**kwargs) or {}
        if self._default_png is None:
            self._default_png = self._default_chart.png()
        data["text/plain"] = self._default_text
        data["image/png"] = base64.b64encode(self._default_png).decode("ascii")
        return data


def _reuses(chart) -> bool:
    """Whether ``chart.figure`` can draw on an existing figure (``figure(fig=...)``)."""
    import inspect

    return "fig" in inspect.signature(chart.figure).parameters


def dropdown(options, value, description):
    """A list to pick from: ``options`` are values, or ``(label, value)`` pairs."""
    values = [o[1] if isinstance(o, tuple) else o for o in options]
    if value not in values:
        raise CalculatorError(
            f"{description}={value!r} is not offered: choose one of "
            f"{', '.join(repr(v) for v in values)}"
        )
    return ipywidgets.Dropdown(options=options, value=value, description=description)


def number(value, description, low=1, high=1 << 20):
    """A whole-number field from ``low`` to ``high`` (typed, or stepped with the arrow keys)."""
    _within(value, description, low, high)
    return ipywidgets.BoundedIntText(value=value, min=low, max=high, description=description)


def slider(value, low, high, description):
    """A slider from ``low`` to ``high`` that redraws when released (or on each arrow key)."""
    _within(value, description, low, high)
    return ipywidgets.IntSlider(value=value, min=low, max=high, description=description,
                                continuous_update=False)


def _within(value, description, low, high) -> None:
    # ipywidgets would silently clamp a starting value outside the control's range.
    check_int(value, description, low=low, high=high, error=CalculatorError, message=(
        f"{description}={value!r}: this widget's control goes from {low} to {high}; for "
        "other values call the calculator's function itself"))
