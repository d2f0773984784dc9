"""The ``%%ranks`` cell magic: run a notebook cell on every rank of the current cluster.

    %load_ext distlab
    cluster = distlab.Cluster(world_size=4)

    %%ranks                    # every rank
    %%ranks 0,2                # ranks 0 and 2 only
    %%ranks --timeout 5        # declare the cell hung after 5 s
    %%ranks --stream           # show lines as they are printed
    %%ranks --no-fold          # every rank's full block, even lines all ranks printed alike
"""

from __future__ import annotations

import argparse
import shlex
import sys

from . import cluster as _cluster
from .errors import InputError, entry_point


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="%%ranks", add_help=False)
    p.add_argument("ranks", nargs="?", default=None)
    p.add_argument("-t", "--timeout", type=float, default=None)
    p.add_argument("--stream", action="store_true")
    p.add_argument("--no-fold", dest="fold", action="store_false", default=None)
    return p


def parse_line(
    line: str, world_size: int
) -> tuple[list[int] | None, float | None, bool, bool | None]:
    """``"0,2 --timeout 5"`` -> ([0, 2], 5.0, False, None). The last item is False for
    ``--no-fold``, else None (the cluster's setting). Raises ValueError with a usage hint."""
    usage = "usage: %%ranks [RANKS like 0,2 or all] [--timeout SECONDS] [--stream] [--no-fold]"
    try:
        args = _parser().parse_args(shlex.split(line))
    except SystemExit:
        raise InputError(f"could not read {line!r}. {usage}") from None
    ranks = None
    if args.ranks not in (None, "all", "*"):
        try:
            ranks = sorted({int(x) for x in args.ranks.split(",") if x.strip()})
        except ValueError:
            raise InputError(f"ranks must look like 0,2 (got {args.ranks!r}). {usage}") from None
        bad = [r for r in ranks if not 0 <= r < world_size]
        if bad or not ranks:
            raise InputError(
                f"rank(s) {bad or args.ranks} out of range: this cluster has ranks "
                f"0..{world_size - 1}. {usage}"
            )
    return ranks, args.timeout, args.stream, args.fold


@entry_point
def ranks(line: str, cell: str):
    """Run this cell on the ranks of the current distlab cluster (see ``distlab.magic``)."""
    cl = _cluster.current()
    targets, timeout, stream, fold = parse_line(line, cl.world_size)
    chosen = targets if targets is not None else list(range(cl.world_size))
    warning = _cluster.collective_warning(cell, chosen, cl.world_size)
    if warning:
        print(warning, file=sys.stderr)
    result = cl.exec(cell, ranks=targets, timeout=timeout, stream=stream, fold=fold)
    if not result.items() or cell.rstrip().endswith(";"):  # a trailing ; hides Out, as in IPython
        return None
    return result


def load_ipython_extension(ipython) -> None:
    """What ``%load_ext distlab`` runs: registers the ``%%ranks`` cell magic."""
    ipython.register_magic_function(ranks, magic_kind="cell", magic_name="ranks")
