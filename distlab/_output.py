"""Per-rank output: one block per rank, in rank order, every line prefixed ``[rank N]``."""

from __future__ import annotations

import sys


def decode(data: bytes) -> str:
    return data.decode("utf-8", errors="backslashreplace")


def prefix(rank: int, text: str) -> str:
    """``text`` with every line prefixed ``[rank N]`` (an empty line gets the bare prefix), less
    what `tidy` drops. Both the blocks after a run and streamed lines come through here."""
    tag = f"[rank {rank}]"
    return "".join(f"{tag} {line}\n" if line else f"{tag}\n" for line in tidy(text).splitlines())


def tidy(text: str) -> str:
    """``text`` without faulthandler's "Extension modules: ..." line. After a crash it lists every
    C extension the rank had loaded: a long line that helps no one reading the crash, and that
    changes whenever a module happens to be imported earlier or later."""
    if "Extension modules: " not in text:
        return text
    keep = [x for x in text.splitlines(keepends=True) if not x.startswith("Extension modules: ")]
    return "".join(keep)


def render(outputs: dict[int, str]) -> str:
    """All ranks' output, grouped by rank in rank order."""
    return "".join(prefix(r, outputs[r]) for r in sorted(outputs) if outputs[r])


def emit(text: str) -> None:
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()
