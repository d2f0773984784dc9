"""Text from the ranks, made readable in the notebook: environment paths shortened, and the
kernel's cell files named the way IPython names them.

* ``/home/me/course/.venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py`` becomes
  ``<site-packages>/torch/distributed/c10d_logger.py``, and the standard library's
  ``/usr/lib/python3.11/threading.py`` becomes ``<stdlib>/threading.py``: the part that says
  which file stays, the part that only says where this machine keeps it goes (and with it the
  differences between one learner's output and another's).
* ``File "/tmp/ipykernel_4242/3671902814.py", line 3, in work`` becomes
  ``Cell In[5], line 3, in work``, as in IPython's own tracebacks.
"""

from __future__ import annotations

import functools
import re
import sysconfig

_FILE = re.compile(r'File "([^"]+)", line (\d+)')


@functools.lru_cache(maxsize=1)
def _prefixes() -> tuple[tuple[str, str], ...]:
    paths = sysconfig.get_paths()
    pairs = {
        paths["purelib"]: "<site-packages>",
        paths["platlib"]: "<site-packages>",
        paths["stdlib"]: "<stdlib>",
        paths["platstdlib"]: "<stdlib>",
    }
    # Longest first: site-packages usually lies inside the stdlib directory.
    return tuple(sorted(((p.rstrip("/") + "/", f"{n}/") for p, n in pairs.items()), reverse=True))


def short_paths(text: str) -> str:
    """``text`` with this Python's site-packages and standard-library directories shortened."""
    for path, name in _prefixes():
        if path in text:
            text = text.replace(path, name)
    return text


def _cell_numbers() -> dict[str, int]:
    """IPython's map from a cell's code file name to its execution count (empty outside it)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return {}
    ip = get_ipython()
    return dict(getattr(getattr(ip, "compile", None), "_filename_map", None) or {})


def cell_names(text: str) -> str:
    """``File "<kernel's file for a cell>", line N`` -> ``Cell In[k], line N``; ``%%ranks`` cells
    (named ``Cell In[k]`` already) lose the ``File "..."`` around their name too."""
    numbers = _cell_numbers()

    def name(m: re.Match) -> str:
        filename, line = m.groups()
        if filename in numbers:
            return f"Cell In[{numbers[filename]}], line {line}"
        if filename.startswith("Cell In["):
            return f"{filename}, line {line}"
        return m.group(0)

    text = _FILE.sub(name, text)
    for filename, n in numbers.items():  # a warning's "<file>:<line>: UserWarning: ..."
        if filename in text:
            text = re.sub(re.escape(filename) + r":(\d+):", rf"Cell In[{n}]:\1:", text)
    return text


def readable(text: str) -> str:
    return cell_names(short_paths(text))
