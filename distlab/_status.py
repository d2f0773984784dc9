"""The cluster's status view: each rank idle / busy / stuck / dead, and its last cell's time.

An ipywidgets HTML box that updates live as cells run. Its plain-text repr names only states (no
times), so a notebook that displays it stays stable under nbval.
"""

from __future__ import annotations

_COLOURS = {"idle": "#2e7d32", "busy": "#f9a825", "stuck": "#c62828", "dead": "#616161"}


class StatusView:
    def __init__(self) -> None:
        import ipywidgets

        self._html = ipywidgets.HTML()
        self._text = "cluster: (no ranks yet)"

    def update(self, backend: str | None, rows: list[tuple[int, str, float | None]]) -> None:
        self._text = f"cluster ({backend or 'no process group'}): " + ", ".join(
            f"rank {r} {state}" for r, state, _ in rows
        )
        cells = []
        for r, state, seconds in rows:
            took = "" if seconds is None else f"<br><small>{seconds * 1000:.0f} ms</small>"
            cells.append(
                f'<td style="padding:4px 10px;text-align:center;border-radius:4px;'
                f'background:{_COLOURS.get(state, "#616161")};color:white">'
                f"<b>rank {r}</b><br>{state}{took}</td>"
            )
        self._html.value = (
            f'<table style="border-spacing:4px"><tr>{"".join(cells)}</tr></table>'
            f"<small>backend: {backend or 'none'}</small>"
        )

    @property
    def widget(self):
        return self._html

    def __repr__(self) -> str:
        return self._text

    def _repr_mimebundle_(self, **kwargs):
        bundle = self._html._repr_mimebundle_(**kwargs) or {}
        bundle["text/plain"] = self._text
        return bundle
