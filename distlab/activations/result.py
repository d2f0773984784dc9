"""What an activation count is: bytes per module, as a table; measured and predicted side by side.

`Meter` (``meter.py``) measures an `Activations`, `predict` (``predict.py``) computes one; this
module only holds and shows them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import InputTypeError

__all__ = ["OUTSIDE", "Activations", "side_by_side"]

OUTSIDE = "(outside the model)"


@dataclass(frozen=True)
class Activations:
    """Bytes saved for backward, per module (measured by `Meter` or predicted by `predict`).

    ``modules``: module name -> bytes of activations saved while it was the innermost running
    module (``""`` is the model's own code, `OUTSIDE` is code outside the model, e.g. the loss);
    ``params``: module name -> bytes of parameters saved for backward (not activation memory,
    never in ``total``); ``order``: every module name of the model, in its order (the rows of
    the table); ``checkpointed``: modules that ran as a checkpointed region (inside, nothing was
    saved here; the inputs the checkpoint keeps are charged to them); ``terms``: for a
    prediction, one ``(module, what, bytes)`` per counted tensor."""

    modules: dict
    params: dict = field(default_factory=dict)
    order: tuple = ()
    checkpointed: tuple = ()
    terms: tuple = ()

    @property
    def total(self) -> int:
        """All activation bytes (parameters not included)."""
        return sum(self.modules.values())

    @property
    def params_total(self) -> int:
        return sum(self.params.values())

    def of(self, module: str, *, params: bool = False) -> int:
        """Activation bytes (or with ``params=True``, parameter bytes) saved by ``module`` and
        everything inside it, e.g. ``of("layers.0")``; ``of("")`` is the whole model."""
        counts = self.params if params else self.modules
        return sum(b for name, b in counts.items() if _inside(name, module))

    def text(self, depth: int | None = None) -> str:
        """A table: per module, the activation bytes saved while it ran itself ("here"), with
        its submodules ("inside"), and the parameter bytes saved inside it. ``depth``: show only
        names of at most ``depth`` parts (``depth=2`` shows ``layers.0``, not
        ``layers.0.attn``). The same result always prints the same text."""
        rows = [("module", "here", "inside", "params")]
        for name in self.order + (OUTSIDE,):
            inside, params = self.of(name), self.of(name, params=True)
            if not (inside or params) or (depth is not None and _depth(name) > depth):
                continue
            mark = " (checkpointed)" if name in self.checkpointed else ""
            rows.append((_display(name) + mark, f"{self.modules.get(name, 0):,}", f"{inside:,}",
                         f"{params:,}"))
        rows.append(("total", "", f"{self.total:,}", f"{self.params_total:,}"))
        return _table(rows)

    __repr__ = __str__ = text


def _table(rows) -> str:
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{r[0]:<{width}}" + "".join(f"{c:>11}" for c in r[1:]) for r in rows)


def _inside(name: str, module: str) -> bool:
    if module == OUTSIDE or name == OUTSIDE:
        return name == module
    return module == "" or name == module or name.startswith(module + ".")


def _depth(name: str) -> int:
    return 0 if name in ("", OUTSIDE) else name.count(".") + 1


def _display(name: str) -> str:
    return "(model)" if name == "" else name


def side_by_side(measured: Activations, predicted: Activations, depth: int | None = None) -> str:
    """Measured and predicted bytes per module (with submodules), and their difference, as
    text. ``depth`` as in `Activations.text`.

    Raises:
        TypeError: an argument is not an `Activations`."""
    for x in (measured, predicted):
        if not isinstance(x, Activations):
            raise InputTypeError(f"side_by_side() takes two Activations, got {type(x).__name__}")
    names = list(dict.fromkeys(measured.order + predicted.order + (OUTSIDE,)))
    rows = [("module", "measured", "predicted", "difference")]
    for name in names:
        m, p = measured.of(name), predicted.of(name)
        if (m or p) and (depth is None or _depth(name) <= depth):
            rows.append((_display(name), f"{m:,}", f"{p:,}", f"{m - p:+,}"))
    rows.append(("total", f"{measured.total:,}", f"{predicted.total:,}",
                 f"{measured.total - predicted.total:+,}"))
    return _table(rows)
