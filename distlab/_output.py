"""Per-rank output: one block per rank, in rank order, every line prefixed ``[rank N]``."""

from __future__ import annotations

import sys


def decode(data: bytes) -> str:
    return data.decode("utf-8", errors="backslashreplace")


def prefix(rank: int, text: str) -> str:
    """``text`` with every line prefixed ``[rank N]`` (an empty line gets the bare prefix)."""
    tag = f"[rank {rank}]"
    return "".join(f"{tag} {line}\n" if line else f"{tag}\n" for line in text.splitlines())


def render(outputs: dict[int, str]) -> str:
    """All ranks' output, grouped by rank in rank order."""
    return "".join(prefix(r, outputs[r]) for r in sorted(outputs) if outputs[r])


def emit(text: str) -> None:
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()
