"""Shipping code and data between the notebook and the ranks.

Functions and classes defined in notebook cells live in the kernel's ``__main__``, which no other
process can import. cloudpickle sends them *by value* (their code, not their name); the rank then
publishes them under ``__main__`` again (`distlab._ranks.rank.adopt_into_main`). The cells'
source text travels too, so a traceback or a stuck rank's stack shows the learner's own lines.

Code objects travel whole, with `marshal` (the format of .pyc files), and not as cloudpickle
rebuilds them: cloudpickle 3.1.3 renames the file of every function it ships to
``<dynamic-code>``, and a future version may drop or change other fields. A code object that
keeps its ``co_filename`` keeps the learner's cell (``/tmp/ipykernel_.../123.py``) or module in
every traceback and stack, whatever cloudpickle does. Both ends run the same interpreter (ranks are
forked or spawned from ``sys.executable``), so marshal's version-specific format is no limit.
"""

from __future__ import annotations

import importlib
import io
import linecache
import marshal
import sys
import types

import cloudpickle

from ..errors import ShipError


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, except that code objects are marshalled as they are, and that an imported
    module of a module subclass (``torch.backends.mps`` is one) travels by name: cloudpickle
    knows only plain modules, and refused any function that used ``torch.backends.mps``."""

    def reducer_override(self, obj):
        if type(obj) is types.CodeType:
            return marshal.loads, (marshal.dumps(obj),)
        if (isinstance(obj, types.ModuleType) and type(obj) is not types.ModuleType
                and sys.modules.get(obj.__name__) is obj):
            return importlib.import_module, (obj.__name__,)
        return super().reducer_override(obj)


def pickle(obj: object) -> bytes:
    """`obj` by value where it must be (cell functions and classes), code objects intact."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=cloudpickle.DEFAULT_PROTOCOL).dump(obj)
    return buf.getvalue()


def dumps(op: str, *body: object) -> bytes:
    return pickle((op, *body))


def dumps_call(fn, args: tuple, kwargs: dict) -> bytes:
    """The payload for "call fn(*args, **kwargs)"; names the culprit if something won't pickle."""
    try:
        return dumps("call", fn, args, kwargs)
    except Exception as e:
        parts = [("the function " + getattr(fn, "__name__", repr(fn)), fn)]
        parts += [(f"positional argument {i} ({type(a).__name__})", a) for i, a in enumerate(args)]
        parts += [(f"keyword argument {k!r} ({type(v).__name__})", v) for k, v in kwargs.items()]
        for what, obj in parts:
            try:
                pickle(obj)
            except Exception as inner:
                raise ShipError(
                    f"{what} cannot be sent to the ranks: {type(inner).__name__}: {inner}\n"
                    "Each rank is a separate process, so everything it receives is pickled. "
                    "Create this object inside the function instead (open files, locks, sockets, "
                    "process groups and generators cannot travel)."
                ) from None
        raise ShipError(f"cannot send the call to the ranks: {type(e).__name__}: {e}") from None


def loads(data: bytes):
    return cloudpickle.loads(data)


def _cell_sources() -> dict[str, list[str]]:
    """linecache entries kept only in memory: notebook cells (IPython gives them mtime None)."""
    out = {}
    for name, entry in list(linecache.cache.items()):
        if len(entry) == 4 and entry[1] is None and entry[2]:
            out[name] = entry[2]
    return out


class LineShipper:
    """Sends each cell's source to a group's ranks once (and again if it changes)."""

    def __init__(self) -> None:
        self._sent: dict[str, int] = {}

    def new(self) -> dict[str, list[str]]:
        fresh = {}
        for name, lines in _cell_sources().items():
            key = hash(tuple(lines))
            if self._sent.get(name) != key:
                self._sent[name] = key
                fresh[name] = lines
        return fresh
