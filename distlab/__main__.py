"""``python -m distlab doctor``: check this machine before a workshop."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["doctor"]:
        from .doctor import run

        return run()
    print("usage: python -m distlab doctor    (checks this machine for the course)")
    return 2


if __name__ == "__main__":
    sys.exit(main())
