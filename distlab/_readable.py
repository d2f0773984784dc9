"""Text from the ranks, made readable in the notebook, and the same on every run.

* ``/home/me/course/.venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py`` becomes
  ``<site-packages>/torch/distributed/c10d_logger.py``, and the standard library's
  ``/usr/lib/python3.11/threading.py`` becomes ``<stdlib>/threading.py``: the part that says
  which file stays, the part that only says where this machine keeps it goes (and with it the
  differences between one learner's output and another's). distlab's own files read
  ``distlab/exercises/nb15.py`` wherever it is installed (site-packages or a checkout).
* A notebook cell's code: ``File "/tmp/ipykernel_4242/3671902814.py", line 3, in work`` becomes
  ``File "<cell>", line 3, in work``. Cell numbers change from run to run (and nbval runs every
  cell as number 1), so text a notebook compares never has them; the traceback IPython shows for
  a distlab error (`distlab.errors`), which nbval does not compare, names the cell as IPython
  does, ``Cell In[5], line 3, in work`` (``numbered=True``).
* What distlab picks anew on every run: loopback ports (``127.0.0.1:<port>``), socket file
  descriptors (``fd=<fd>``) and its private temporary directories (``<distlab-tmp>``).

So an instructor's own notebooks compare under strict nbval with no sanitize file.
"""

from __future__ import annotations

import functools
import re
import sysconfig
from pathlib import Path

_FILE = re.compile(r'File "([^"]+)", line (\d+)')
_PORT = re.compile(r"((?:\[(?:::ffff:)?127\.0\.0\.1\]|\b127\.0\.0\.1|\blocalhost|\[::1\])):\d+\b")
_FD = re.compile(r"\bfd=\d+")
_TMP = re.compile(r"(?:/private)?(?:/tmp|/var/folders/[^\s\"']*?/T)/distlab-[A-Za-z0-9_]+")

#: %%ranks cells: the name the ranks know a cell by -> IPython's execution count when it ran.
_RANKS_CELLS: dict[str, int] = {}
_ranks_cells_run = 0


@functools.lru_cache(maxsize=1)
def _prefixes() -> tuple[tuple[str, str], ...]:
    paths = sysconfig.get_paths()
    pairs = {
        paths["purelib"]: "<site-packages>",
        paths["platlib"]: "<site-packages>",
        paths["stdlib"]: "<stdlib>",
        paths["platstdlib"]: "<stdlib>",
    }
    # distlab's own files as "distlab/...", installed or editable (a checkout's path differs from
    # machine to machine: a CI runner clones elsewhere than the instructor's laptop).
    package = Path(__file__).resolve().parent
    pairs[str(package)] = "distlab"
    pairs[str(Path(__file__).parent)] = "distlab"
    # Longest first: site-packages usually lies inside the stdlib directory.
    return tuple(sorted(((p.rstrip("/") + "/", f"{n}/") for p, n in pairs.items()), reverse=True))


def short_paths(text: str) -> str:
    """``text`` with this Python's site-packages and standard-library directories shortened."""
    for path, name in _prefixes():
        if path in text:
            text = text.replace(path, name)
    return text


def _cell_numbers() -> dict[str, int]:
    """Every cell file name distlab may meet -> IPython's execution count for it (empty outside
    IPython): the kernel's code files, and the names of ``%%ranks`` cells."""
    numbers = dict(_RANKS_CELLS)
    try:
        from IPython import get_ipython
    except ImportError:
        return numbers
    ip = get_ipython()
    numbers.update(getattr(getattr(ip, "compile", None), "_filename_map", None) or {})
    return numbers


def ranks_cell_name() -> str:
    """A name for the ``%%ranks`` cell (or `Cluster.exec` source) run now: ``<%%ranks cell 3>``,
    counted in this kernel, so the same on every run of a notebook; remembered with IPython's
    number for the cell."""
    global _ranks_cells_run
    _ranks_cells_run += 1
    name = f"<%%ranks cell {_ranks_cells_run}>"
    try:
        from IPython import get_ipython

        _RANKS_CELLS[name] = get_ipython().execution_count
    except Exception:  # not in IPython
        pass
    return name


def cell_names(text: str, numbered: bool = False) -> str:
    """Cell file names in ``text`` -> ``"<cell>"``, or with ``numbered`` ``Cell In[k]`` (how
    IPython names cells in its own tracebacks)."""
    numbers = _cell_numbers()
    if not numbers:
        return text

    def name(m: re.Match) -> str:
        filename, line = m.groups()
        if filename not in numbers:
            return m.group(0)
        if numbered:
            return f"Cell In[{numbers[filename]}], line {line}"
        return f'File "<cell>", line {line}'

    text = _FILE.sub(name, text)
    for filename, n in numbers.items():  # a warning's "<file>:<line>: UserWarning: ..."
        if filename in text:
            shown = f"Cell In[{n}]" if numbered else "<cell>"
            text = re.sub(
                re.escape(filename) + r":(\d+):", lambda m, s=shown: f"{s}:{m[1]}:", text
            )
    return text


def run_noise(text: str) -> str:
    """``text`` without what distlab picks anew each run: loopback ports, socket descriptors,
    its temporary directories."""
    text = _PORT.sub(r"\1:<port>", text)
    text = _FD.sub("fd=<fd>", text)
    return _TMP.sub("<distlab-tmp>", text)


def readable(text: str, numbered: bool = False) -> str:
    return run_noise(cell_names(short_paths(text), numbered))


def innermost(stack: str, frames: int = 4) -> str:
    """The last ``frames`` frames of a formatted stack (two lines each, as traceback formats
    them): where a rank that has not started yet is, without the imports that led there."""
    lines = stack.rstrip("\n").splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("  File ")]
    if len(starts) <= frames:
        return "\n".join(lines)
    return "  ...\n" + "\n".join(lines[starts[-frames] :])
