"""Per-rank output: one block per rank, in rank order, every line prefixed ``[rank N]``.

With ``fold=True`` (the default for `distlab.launch`, `distlab.Cluster` and ``%%ranks``), lines
that every rank printed alike are shown once, prefixed with the ranks that printed them::

    [ranks 0-3] UserWarning: ...        <- the same warning on all four ranks, shown once
    [rank 0] loss 0.25                  <- then what differs, rank by rank
    [rank 1] loss 0.31
"""

from __future__ import annotations

import re
import sys

from ._readable import readable


def decode(data: bytes) -> str:
    return data.decode("utf-8", errors="backslashreplace")


def tag(ranks: list[int]) -> str:
    """``[rank 2]`` for one rank; ``[ranks 0-3]``, ``[ranks 0,2]``, ``[ranks 0-2,5]`` for more."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"[rank {ranks[0]}]"
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    parts = [f"{run[0]}-{run[-1]}" if len(run) > 2 else ",".join(map(str, run)) for run in runs]
    return f"[ranks {','.join(parts)}]"


def group_alike(values: dict) -> list[tuple[list[int], object]]:
    """``{rank: value}`` -> ``[(ranks, value), ...]``: ranks with equal values together, each
    group where its lowest rank would be. Every per-rank view shows identical ranks once this
    way (output blocks, timeline text, memory tables): ``{0: a, 1: b, 2: a}`` -> ``[([0, 2], a),
    ([1], b)]``. Values must be hashable."""
    groups: dict = {}
    for r in sorted(values):
        groups.setdefault(values[r], []).append(r)
    return [(ranks, value) for value, ranks in groups.items()]


def prefix(rank: int | list[int], text: str) -> str:
    """``text`` with every line prefixed ``[rank N]`` (or ``[ranks ...]`` for a list of ranks; an
    empty line gets the bare prefix), less what `tidy` drops. Both the blocks after a run and
    streamed lines come through here."""
    if isinstance(rank, int):
        return _tagged([rank], tidy(text, rank).splitlines())
    return _tagged(rank, tidy(text).splitlines())


def _tagged(ranks: list[int], lines) -> str:
    label = tag(ranks)
    return "".join(f"{label} {line}\n" if line else f"{label}\n" for line in lines)


#: The start of a C++ log line from torch (c10): level, date, time to the nanosecond, sometimes
#: a thread id, then the source file and line:
#: ``[W1121 14:05:01.123456789 ProcessGroupGloo.cpp:123]``.
_CPP_LOG = re.compile(
    r"\[([IWEF])\d{4} \d{2}:\d{2}:\d{2}\.\d+(?: \d+)? (?:[^\s\]]*/)?([^\s\]/]+:\d+)\]"
)


def tidy(text: str, rank: int | None = None) -> str:
    """``text`` without faulthandler's "Extension modules: ..." line, with paths made readable
    (`distlab._readable`), and C++ log lines without their date, time and thread id
    (``[W ProcessGroupGloo.cpp:123] ...``: the same warning from every rank then folds).
    After a crash faulthandler lists every C extension the rank had loaded: a long line that
    helps no one reading the crash, and that changes whenever a module happens to be imported
    earlier or later.

    With ``rank``: torch's own ``[rank2]:`` at the start of a line of rank 2 goes too (torch
    adds it to its log lines and to errors under ``TORCH_DISTRIBUTED_DEBUG``); distlab's
    ``[rank 2]`` already says it, and without it the same message from every rank folds."""
    text = _CPP_LOG.sub(r"[\1 \2]", readable(text))
    if rank is not None and f"[rank{rank}]:" in text:
        text = re.sub(rf"(?m)^\[rank{rank}\]:", "", text)
    if "Extension modules: " not in text:
        return text
    keep = [x for x in text.splitlines(keepends=True) if not x.startswith("Extension modules: ")]
    return "".join(keep)


def render(outputs: dict[int, str], fold: bool = False) -> str:
    """All ranks' output, grouped by rank in rank order.

    ``fold``: the leading lines that every rank printed alike are shown once, tagged with all
    those ranks; after them, ranks whose remaining output is the same are shown together, each
    group where its lowest rank would be.
    """
    blocks = {r: tidy(outputs[r], r).splitlines() for r in sorted(outputs) if outputs[r]}
    if not fold or len(blocks) < 2:
        return "".join(prefix(r, outputs[r]) for r in sorted(outputs) if outputs[r])
    everyone = list(blocks)
    common = 0
    for lines in zip(*blocks.values(), strict=False):  # up to the shortest block
        if any(line != lines[0] for line in lines):
            break
        common += 1
    text = _tagged(everyone, blocks[everyone[0]][:common])
    rests = {r: tuple(lines[common:]) for r, lines in blocks.items() if lines[common:]}
    for ranks, rest in group_alike(rests):
        text += _tagged(ranks, rest)
    return text


def emit(text: str) -> None:
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()
