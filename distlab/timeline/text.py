"""A timeline as text, without a single time in it: what ``repr(timeline)`` shows and what
nbval compares. Per rank, the outermost labels and collective calls of its main thread, in order,
then the collectives as the transport ran them, with counts; ranks with the same lines once."""

from __future__ import annotations

from collections import Counter

from .. import _output


def text(timeline) -> str:
    """`distlab.timeline.Timeline.text` (see there)."""
    device = "CPU+CUDA" if timeline._device(None) == "cuda" else "CPU"
    n = timeline.world_size
    header = f"Timeline: {n} rank{'s' if n > 1 else ''}, {device}"
    bodies = {}
    for r in range(n):
        body = _wrap(_runs(timeline.names(r)) or ["(no labels)"], " > ")
        body += _wrap(_counts(timeline.transports(r)) or ["none"], ", ", first="comm: ")
        bodies[r] = tuple(body)
    lines = [header]
    for ranks, body in _output.group_alike(bodies):
        lines.append(_output.tag(ranks)[1:-1] + ":")  # "rank 2", "ranks 0,1", as folded output
        lines.extend(body)
    return "\n".join(lines)


def _runs(names: list[str]) -> list[str]:
    """["a", "a", "b"] -> ["a x2", "b"]."""
    out: list[list] = []
    for n in names:
        if out and out[-1][0] == n:
            out[-1][1] += 1
        else:
            out.append([n, 1])
    return [n if k == 1 else f"{n} x{k}" for n, k in out]


def _wrap(items: list[str], sep: str, first: str = "", width: int = 96) -> list[str]:
    """``items`` joined by ``sep`` (" > " or ", ") on lines of at most ``width`` characters."""
    lines = ["  " + first + items[0]]
    for item in items[1:]:
        if len(lines[-1]) + len(sep) + len(item) <= width:
            lines[-1] += sep + item
        elif sep.strip() == ",":
            lines[-1] += ","
            lines.append("    " + item)
        else:
            lines.append("    " + sep.lstrip() + item)
    return lines


def _counts(names: list[str]) -> list[str]:
    """["a", "b", "a"] -> ["a x2", "b x1"], in order of first appearance."""
    return [f"{n} x{k}" for n, k in Counter(names).items()]


# -- interval arithmetic (sorted, disjoint lists of (start, end)) -------------------------------
