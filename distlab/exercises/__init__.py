"""Exercise checks: the learner writes an answer, `check` runs its grader and prints one verdict.

Every exercise in the notebooks has the same three cells:

1. the exercise (markdown);
2. an attempt cell, visible, with a skeleton that raises ``NotImplementedError`` and a call to
   ``check("Exercise N", grader, answer, ...)`` at the end, which prints "not attempted yet"
   until the learner has written an answer, then "✓ correct" or "✗ not yet: <what was wrong>";
3. the solution, collapsed (its source *and* its output hidden), which defines the answer and
   calls the same check. Its output is only the verdict, so even a viewer that ignores the
   collapsed state (GitHub, nbviewer) gives nothing away by showing it.

The graders live here, one module per notebook (`distlab.exercises.nb04` holds notebook 04's),
so that each can be tested against the wrong answers learners write (tests/mistakes/):
a grader finds what is right by running the real thing where it can, checks types and lengths
before values (`distlab.exercises.expect`), never trusts a number the answer computed itself,
and raises AssertionError with a message in the learner's terms.

`check` turns whatever happens into exactly one verdict line: a wrong value, a crash in the
answer (its traceback is printed first), a hang (where each rank waits), or a grader that could
not use what came back. When the answer left a `distlab.Cluster` stuck, `check` restarts it and
re-runs the cells that set it up, so the learner can simply try again.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable

PASSED = "✓ correct"
NOT_ATTEMPTED = "not attempted yet"

_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_DISTLAB = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def check(label: str, test: Callable[..., object], *args, **kwargs) -> bool:
    """Run an exercise's grader ``test(*args, **kwargs)`` and print one line saying how it went.

    Args:
        label: what to call the exercise in the verdict, e.g. ``"Exercise 2"``.
        test: a grader: it calls the learner's code (passed in ``args``/``kwargs``), raises
            ``AssertionError`` with a message saying what is wrong when the answer is wrong,
            and returns when it is right.
        args, kwargs: passed to ``test``.

    Returns:
        True when the answer is right; False otherwise (not written yet, wrong, crashed, hung).

    Raises:
        TypeError: ``test`` is not callable.
        KeyboardInterrupt: you pressed stop.

    What is printed, always ending in one line ``<label>: ...``:

    - ``not attempted yet`` while the skeleton's ``raise NotImplementedError`` is there (also
      when it runs on the ranks); an answer partly written that still reaches a ``raise
      NotImplementedError`` is told it is not finished, with the line; one that torch raised
      is an error like any other;
    - ``✗ not yet: <what>`` for a wrong answer; for an answer that raised, its traceback (or
      the ranks' error report) comes first; for an answer that hangs, where each rank waits;
    - ``✓ correct``.

    Whatever the answer changed of the state later cells share (the default dtype, a method
    patched on a class, a function of ``torch.distributed`` replaced: `expect.restored`) is put
    back after the check, here and, through `expect.run`, on the ranks.
    """
    if not callable(test):
        raise TypeError(f"check() needs a test function to call, got {test!r}")
    from ..errors import ClusterBroken, RankError, RankTimeout
    from .expect import restored

    answers = [a for a in (*args, *kwargs.values()) if _is_answer(a)]
    try:
        with restored():  # an answer that set the default dtype or patched a class
            test(*args, **kwargs)
    except NotImplementedError as e:
        unfinished = _unfinished(e, answers)
        if unfinished is None:
            return _not_attempted(label, str(e))
        if unfinished:
            return _wrong(label, unfinished)
        traceback.print_exception(type(e), e, _without_distlab(e.__traceback__))
        return _wrong(label, f"your code raised NotImplementedError: {e} (traceback above)")
    except AssertionError as e:
        return _wrong(label, str(e) or "a check failed")
    except RankError as e:
        if _not_written_on_ranks(e):
            unfinished = _unfinished_on_ranks(e, answers)
            if unfinished is None:
                return _not_attempted(label, e.primary.message)
            if unfinished:
                return _wrong(label, unfinished)
        print(str(e), file=sys.stderr)
        head = e.primary.headline().splitlines()[0].rstrip()  # C++ messages span lines
        return _wrong(label, f"your code failed on the ranks ({head}; the report is above)")
    except RankTimeout as e:
        return _wrong(label, _hang(e))
    except ClusterBroken as e:
        return _wrong(label, f"the cluster could not run your answer: {e}")
    except Exception as e:  # noqa: BLE001 -- every outcome becomes a verdict
        if _raised_by_the_answer(e):
            traceback.print_exception(type(e), e, _without_distlab(e.__traceback__))
            return _wrong(label, f"your code raised {type(e).__name__}: {e} (traceback above)")
        return _wrong(
            label,
            f"the check could not use what your answer gave back ({type(e).__name__}: {e}). "
            "Compare its type and shape with what the exercise asks for.",
        )
    print(f"{label}: {PASSED}")
    return True


#: The names a skeleton's body may use: ``raise NotImplementedError``, and on the ranks
#: ``rank, world = dist.get_rank(), dist.get_world_size()`` before it.
_SKELETON = frozenset({"NotImplementedError", "dist", "get_rank", "get_world_size"})


def _is_answer(value) -> bool:
    """A function the learner wrote (not distlab's, not a library's): its code comes from a
    notebook cell or a file of theirs."""
    code = getattr(value, "__code__", None)
    return code is not None and _learners(code.co_filename)


def _learners(filename: str) -> bool:
    return not (os.path.abspath(filename).startswith(_DISTLAB) or _is_library(filename))


def _skeleton(fn) -> bool:
    """Whether ``fn`` is still the exercise's skeleton: it uses no name and keeps no variable
    but the skeleton's, branches nowhere and defines nothing inside. (A written answer does one
    of these.)"""
    import dis

    code = fn.__code__
    instructions = list(dis.get_instructions(code))
    # The skeleton may import what the answer will need (`from torch.distributed.fsdp import
    # fully_shard` above its `raise`): the imported names and the locals they are bound to.
    imported, bound = set(), set()
    for i, ins in enumerate(instructions):
        if ins.opname in ("IMPORT_NAME", "IMPORT_FROM"):
            imported.add(ins.argval)
            after = next((n for n in instructions[i + 1:] if n.opname != "POP_TOP"), None)
            if after is not None and after.opname in ("STORE_FAST", "STORE_NAME"):
                bound.add(after.argval)
    used = {i.argval for i in instructions if i.opname.startswith("LOAD_FAST")} & bound
    own = set(code.co_varnames[code.co_argcount + code.co_kwonlyargcount:]) - bound
    nested = any(hasattr(c, "co_code") for c in code.co_consts)
    branches = any("JUMP" in i.opname or i.opname == "FOR_ITER" for i in instructions)
    return (set(code.co_names) - imported <= _SKELETON and own <= {"rank", "world", "world_size"}
            and used <= _SKELETON and not nested and not branches)


def _unfinished_text(name: str, line) -> str:
    where = f" (line {line} in {name})" if line else f" (in {name})"
    return (
        f"your answer reached a `raise NotImplementedError`{where}: it is not finished yet. "
        "Replace that line with the rest of your answer"
    )


def _unfinished(error, answers):
    """A NotImplementedError in the kernel: None when it is the skeleton's (not attempted);
    a verdict when an answer that is partly written raised it itself; "" when the learner's
    code did not raise it (torch did: a real error, shown with its traceback)."""
    tb, innermost = error.__traceback__, None
    while tb is not None:
        innermost = tb
        tb = tb.tb_next
    code = innermost.tb_frame.f_code if innermost is not None else None
    if code is None or not _learners(code.co_filename):
        return ""  # raised inside torch or distlab, not by a `raise` the learner wrote
    fn = next((a for a in answers if a.__code__ is code), None)
    if fn is None or _skeleton(fn):
        return None
    return _unfinished_text(code.co_name, innermost.tb_lineno)


def _unfinished_on_ranks(error, answers):
    """The same for a skeleton's NotImplementedError that a rank raised: the failure's last
    frame names the function; None (not attempted) unless that answer is partly written."""
    import re

    frames = re.findall(r'File "([^"]*)", line (\d+), in (\w+)', error.primary.traceback)
    if not frames:
        return None
    filename, line, name = frames[-1]
    if filename.startswith(("<site-packages>", "<stdlib>", "<frozen")) or not _learners(filename):
        return ""  # torch raised it: a real error, reported as any other
    fn = next((a for a in answers if a.__name__ == name), None)
    if fn is None or _skeleton(fn):
        return None
    return _unfinished_text(name, line)


def _not_attempted(label: str, message: str) -> bool:
    why = f" ({message})" if message else ""
    print(
        f"{label}: {NOT_ATTEMPTED}{why}. Replace the `raise NotImplementedError` above with your "
        "answer and run the cell again."
    )
    return False


def _wrong(label: str, message: str) -> bool:
    repaired = _repair_clusters()
    print(f"{label}: ✗ not yet: {message}{repaired}")
    return False


def _hang(e) -> str:
    """A `RankTimeout` in the learner's terms: which ranks wait, on which line of theirs."""
    where = []
    for rank in e.ranks:
        line = _last_user_line(e.stacks.get(rank, ""))
        where.append(f"rank {rank} at {line}" if line else f"rank {rank}")
    return (
        f"your answer hangs: {', '.join(where)} still waited after {e.timeout:g} s. A collective "
        "(and a recv) waits until every rank of its group has called it: look for a rank that "
        "skips it, or calls another one."
    )


def _last_user_line(stack: str) -> str:
    """The innermost ``File "...", line N, in f`` of a stack that is not torch's or distlab's,
    with its source line: ``line 4 in gather_ranks (dist.all_gather(out, mine))``."""
    import re

    lines = stack.rstrip("\n").splitlines()
    for i in range(len(lines) - 1, -1, -1):
        m = re.match(r'\s*File "([^"]+)", line (\d+), in (.+)$', lines[i])
        if not m:
            continue
        filename, number, func = m.groups()
        if filename.startswith("<site-packages>") or filename.startswith("<stdlib>"):
            continue
        path = os.path.abspath(filename) if not filename.startswith("<") else filename
        if path.startswith(_DISTLAB) or _is_library(path):
            continue
        following = lines[i + 1].strip() if i + 1 < len(lines) else ""
        source = "" if following.startswith("File ") else following
        return f"line {number} in {func}" + (f" ({source})" if source else "")
    return ""


def _repair_clusters() -> str:
    """Restart (and replay) every live cluster the answer left with stuck or dead ranks, or
    out of step after a hang; what to tell the learner about it.

    A hang is always repaired, even when every rank stopped when interrupted: a collective cut
    off halfway (or ended by gloo's own timeout while distlab waited for the ranks to stop)
    leaves the ranks out of step, and the next check's collectives would fail or pair up
    wrongly ("Connection closed by peer", "Application timeout caused pair closure")."""
    from .. import cluster as _cluster

    told = ""
    for c in list(_cluster._all):
        stuck = any(state not in ("idle", "busy") for state in c.states.values())
        if c.closed or not (stuck or c.hung):
            continue
        replayed = c.restart()
        what = "left the cluster stuck" if stuck else "hung, which leaves the ranks out of step"
        told = (
            f". Your answer {what}: distlab restarted its ranks and re-ran the "
            f"{replayed} cell(s) that set them up, so you can try again"
        )
    return told


def _raised_by_the_answer(e: BaseException) -> bool:
    """Whether the traceback passes through code the learner wrote (a notebook cell, their
    own file) rather than only distlab's graders and libraries."""
    tb = e.__traceback__
    while tb is not None:
        filename = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if not (filename.startswith(_DISTLAB) or _is_library(filename)):
            if tb.tb_frame.f_code is not check.__code__:
                return True
        tb = tb.tb_next
    return False


def _is_library(filename: str) -> bool:
    import sysconfig

    paths = sysconfig.get_paths()
    roots = {paths["stdlib"], paths["platstdlib"], paths["purelib"], paths["platlib"]}
    return filename.startswith(tuple(os.path.abspath(r) + os.sep for r in roots)) or (
        filename.startswith("<frozen ")
    )


def _without_distlab(tb):
    from ..errors import _user_frames

    return _user_frames(tb)


def _not_written_on_ranks(error) -> bool:
    """A `RankError` whose root causes are all a skeleton's NotImplementedError (the test ran the
    learner's unwritten answer on the ranks, through `distlab.launch` or `Cluster.run`)."""
    roots = [f for f in error.failures if not f.consequence]
    return bool(roots) and all(f.type == "NotImplementedError" for f in roots)


__all__ = ["NOT_ATTEMPTED", "PASSED", "check"]
