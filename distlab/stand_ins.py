"""Stand-ins, on a page, for what a learner does outside a cell: read the terminal's stderr,
press the stop button, run a script under ``torchrun``.

A notebook that nbval checks cannot press buttons or read a terminal, and a lesson should not
spend its cells on file descriptors and timers. These do it in one documented call each:

- `children_stderr`: what child processes write to file descriptor 2 (the terminal that runs
  Jupyter), collected instead of shown, so a cell can print it in a fixed order;
- `press_stop`: sends the kernel's main thread ``SIGINT`` after a delay, as the stop button does;
- `torchrun`: runs a function defined in a cell under the real ``torchrun --standalone``, in a
  script of its own, and brings back each rank's return value and where torchrun's store
  listened.

Nothing here starts distlab's ranks: these are the tools a learner would use without distlab.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
from dataclasses import dataclass, field

from ._config import check_int
from ._patience import patience
from ._ranks.forkserver import cores_for_the_kernel
from .errors import InputError, InputTypeError, StartError

__all__ = ["Collected", "TorchrunRun", "children_stderr", "press_stop", "torchrun"]


@dataclass
class Collected:
    """What a `children_stderr` block collected: ``text``, filled in when the block ends."""

    text: str = ""


@contextlib.contextmanager
def children_stderr():
    """Collect what is written to file descriptor 2 (stderr) inside the block, by this process
    and by every child process it starts, instead of letting it reach the terminal (and, in
    JupyterLab, the cell, in whatever order the children happen to write).

    Child processes inherit the descriptor, so a child started in the block writes into the
    collection too; so does Python's own ``sys.stderr`` of this process (a warning that the
    logging module prints, say). While the block runs, distlab's helper process pauses its
    warm-up, so that the children get the cores. Use it to show a child's error in a fixed
    order::

        with stand_ins.children_stderr() as collected:
            ...start processes that fail...
        print(collected.text)

    Yields:
        A `Collected` whose ``text`` holds everything written, once the block has ended.

    Raises:
        OSError: the temporary file or the descriptor could not be made (a full disk, say).
    """
    collected = Collected()
    with cores_for_the_kernel(), tempfile.TemporaryFile() as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            with open(os.dup(2), "w", closefd=True) as py_stderr, \
                    contextlib.redirect_stderr(py_stderr):
                yield collected
                py_stderr.flush()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            collected.text = tmp.read().decode("utf-8", errors="backslashreplace")


def press_stop(after: float) -> threading.Timer:
    """Do what JupyterLab's stop button (■, Kernel → Interrupt) does, ``after`` seconds from now:
    send ``SIGINT`` to this process's main thread, which raises ``KeyboardInterrupt`` in the cell
    that is running then.

    Args:
        after: seconds to wait (a positive number).

    Returns:
        The started ``threading.Timer``: ``.cancel()`` it if the cell finishes first.

    Raises:
        ValueError: ``after`` is not a positive number of seconds.
    """
    if isinstance(after, bool) or not isinstance(after, (int, float)) or not after > 0:
        raise InputError(f"after must be a positive number of seconds, got {after!r}")
    main = threading.main_thread().ident
    timer = threading.Timer(after, signal.pthread_kill, (main, signal.SIGINT))
    timer.daemon = True
    timer.start()
    return timer


@dataclass
class TorchrunRun:
    """One run of a function under ``torchrun``: made by `torchrun`.

    Attributes: ``returned`` (one value per rank, in rank order), ``store_listens_on`` (the
    addresses the store in the ``torchrun`` process listened on for ``MASTER_PORT``, as rank 0
    saw them), ``command`` (the command line that ran it), ``script`` (the script's text).
    """

    returned: list
    store_listens_on: list[str]
    command: list[str] = field(repr=False)
    script: str = field(repr=False)


_SCRIPT = '''\
import os
import pickle
import sys

import torch
import torch.distributed as dist

{source}

if __name__ == "__main__":
    dist.init_process_group("gloo")  # reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    value = {name}()
    listens = None
    if dist.get_rank() == 0:  # where does the store this rank connected to listen?
        import psutil

        agent = psutil.Process(os.getppid())  # the torchrun process
        port = int(os.environ["MASTER_PORT"])
        listens = sorted({{c.laddr.ip for c in agent.net_connections("tcp")
                          if c.status == "LISTEN" and c.laddr.port == port}})
    with open(os.path.join(sys.argv[1], f"rank{{dist.get_rank()}}.pkl"), "wb") as f:
        pickle.dump((value, listens), f)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # done: skip Python's teardown of torch (half a second per rank)
'''


def torchrun(fn, nproc_per_node: int = 2, timeout: float = 60.0) -> TorchrunRun:
    """Run ``fn()`` on ``nproc_per_node`` ranks under the real ``torchrun --standalone``, as a
    script would, and bring back what each rank returned.

    The script is ``fn``'s source (``inspect.getsource``) after ``import os, pickle, sys,
    torch`` and ``import torch.distributed as dist``; its main block calls
    ``dist.init_process_group("gloo")`` (torchrun sets the variables it reads), then ``fn()``,
    and pickles the value into a temporary folder. It runs as
    ``python -m torch.distributed.run --standalone --nproc-per-node N script.py`` with
    ``OMP_NUM_THREADS=1``, while distlab's helper process pauses its warm-up (the agent and
    its workers get the cores).

    Args:
        fn: a function defined with ``def`` that takes no arguments and uses only ``os``,
            ``torch``, ``dist`` and names it defines or imports itself (the script has nothing
            else); its return value must pickle.
        nproc_per_node: ranks to start (an int >= 1).
        timeout: seconds the whole run may take on a quiet machine (stretched on a busy one).

    Returns:
        A `TorchrunRun`: ``returned`` (per rank), ``store_listens_on``, ``command``, ``script``.

    Raises:
        TypeError: ``fn`` is not a function defined with ``def`` (a lambda, a builtin, a method),
            or ``nproc_per_node`` is not an int.
        ValueError: ``nproc_per_node < 1``.
        distlab.StartError: torchrun failed (a rank raised, e.g. ``NameError`` for a name the
            script does not have: import it inside ``fn``) or did not finish within the
            timeout; the message ends with torchrun's last lines of stderr.
    """
    if not inspect.isfunction(fn) or fn.__name__ == "<lambda>":
        raise InputTypeError(
            f"fn must be a function defined with def, got {fn!r}: torchrun runs its source "
            "as a script")
    check_int(nproc_per_node, "nproc_per_node", low=1, error=InputError,
              type_error=InputTypeError)
    script = _SCRIPT.format(source=textwrap.dedent(inspect.getsource(fn)), name=fn.__name__)
    limit = patience(timeout)
    with cores_for_the_kernel(), tempfile.TemporaryDirectory(prefix="distlab-torchrun-") as tmp:
        path = os.path.join(tmp, "script.py")
        with open(path, "w") as f:
            f.write(script)
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", str(nproc_per_node), path, tmp]
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=limit,
                                  env=dict(os.environ, OMP_NUM_THREADS="1"))
        except subprocess.TimeoutExpired as e:
            tail = (e.stderr or b"")[-2000:]
            tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
            raise StartError(f"torchrun did not finish within {limit:.0f} s; its stderr "
                             f"ended:\n{tail}") from None
        if proc.returncode != 0:
            raise StartError(
                f"torchrun exited with code {proc.returncode}. The script has only os, torch "
                f"and dist: import anything else inside {fn.__name__}. Its stderr ended:\n"
                f"{proc.stderr[-2000:]}")
        results = []
        for rank in range(nproc_per_node):
            with open(os.path.join(tmp, f"rank{rank}.pkl"), "rb") as f:
                results.append(pickle.load(f))
    return TorchrunRun(returned=[value for value, _ in results],
                       store_listens_on=results[0][1], command=command, script=script)
