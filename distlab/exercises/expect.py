"""What graders compare with, so that a wrong answer is told what was expected, in its terms.

Each function raises ``AssertionError`` with a message a learner can act on ("expected a list of
4 ints, like [0, 1, 2, 3]; got a tuple of 2: (0, 1)"), and checks the type and the length or
shape before any value: never ``zip`` alone (it stops at the shorter side, so ``()`` would
pass), never a comparison that raises on an unexpected type.

`run` runs a learner's function on ranks with a short timeout, so a hang is called a hang in
seconds; `collectives` runs it under a timeline recording and tells which collectives each rank
really called (so "the answer used all_gather" is checked, not trusted).
"""

from __future__ import annotations

import itertools
import numbers
import os
import random
from fractions import Fraction

from .._patience import hang_when_idle, patience

#: Seconds a learner's function may run in a check before it is called a hang: ample for the
#: exercises' tiny tensors on a quiet laptop, short enough to wait for; stretched by the load
#: (`_patience.patience`) while the ranks still compute, but called at once past it where they use
#: no CPU (`_patience.hang_when_idle`: they wait for each other, and waiting longer changes
#: nothing).
HANG = 5.0


#: The environment variable that makes the checks' draws reproducible: an int, the seed of the
#: first draw (tests/conftest.py sets it per test, from the test's name). Unset, as in a
#: learner's kernel, every check draws anew from the operating system's randomness.
SEED = "DISTLAB_CHECK_SEED"
_draws = itertools.count()


def rng() -> random.Random:
    """The random generator of one check's drawn cases: seeded anew at every call, so that a
    learner who runs the cell again sees new cases (and a table of the cases copied from
    earlier ✗ messages does not pass); under `SEED`, the calls' seeds follow from it (the
    first call's, the second's...), so that a test's draws are the same at every run."""
    seed = os.environ.get(SEED, "").strip()
    if not seed:
        return random.SystemRandom()
    return random.Random(f"{seed}:{next(_draws)}")


def reseed(seed) -> None:
    """Start `SEED`'s sequence again at ``seed`` (a test's first check draws as at every run)."""
    global _draws
    os.environ[SEED] = str(seed)
    _draws = itertools.count()


def describe(value) -> str:
    """``[0, 1]`` -> ``"a list of 2: [0, 1]"``; a tensor -> its dtype, shape and values."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        torch = None
    if torch is not None and isinstance(value, torch.Tensor):
        shown = value.tolist() if value.numel() <= 16 else f"{value.flatten()[:8].tolist()}..."
        dtype = str(value.dtype).removeprefix("torch.")
        return f"a {dtype} tensor of shape {tuple(value.shape)}: {shown}"
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        text = repr(value)
        if len(text) > 120:
            text = text[:117] + "..."
        return f"{_a(type(value).__name__)} of {len(value)}: {text}"
    if value is None:
        return "None (did the function forget to return?)"
    return f"{_a(type(value).__name__)}: {value!r}"


def _a(noun: str) -> str:
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + noun


def same(got, want, what: str = "your answer") -> None:
    """``got`` equals ``want`` exactly, including its type (a list is not a tuple, 3.0 is not
    Fraction(3)), and element by element for lists and tuples, tensors by dtype, shape and
    value. The message says which element differs first."""
    _same(got, want, what)


def _same(got, want, what: str) -> None:
    import torch

    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            raise AssertionError(
                f"{what} should be a tensor like {describe(want)}; got {describe(got)}"
            )
        if got.shape != want.shape:
            raise AssertionError(
                f"{what} should have shape {tuple(want.shape)}; got shape {tuple(got.shape)} "
                f"({describe(got)})"
            )
        if got.dtype != want.dtype:
            raise AssertionError(f"{what} should be {want.dtype}; got {got.dtype}")
        if not torch.equal(got, want):
            raise AssertionError(f"{what} should be {want.tolist()}; got {got.tolist()}")
        return
    if type(got) is not type(want) and not _same_kind(got, want):
        hint = _type_hint(got, want)
        raise AssertionError(
            f"{what} should be {describe(want)}; got {describe(got)}{hint}"
        )
    if isinstance(want, (list, tuple)):
        if len(got) != len(want):
            raise AssertionError(
                f"{what} should have {len(want)} entries ({want!r}); got {len(got)}: {got!r}"
            )
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _same(g, w, f"{what}[{i}]")
        return
    if isinstance(want, dict):
        if set(got) != set(want):
            raise AssertionError(f"{what} should have the keys {sorted(want)}; got {sorted(got)}")
        for k in want:
            _same(got[k], want[k], f"{what}[{k!r}]")
        return
    if got != want:
        raise AssertionError(f"{what} should be {want!r}; got {got!r}")


def _same_kind(got, want) -> bool:
    """int for int (numpy's or torch's ints that are ``numbers.Integral`` too), str for str."""
    if isinstance(want, bool) or isinstance(got, bool):
        return isinstance(got, bool) and isinstance(want, bool)
    if isinstance(want, numbers.Integral) and not isinstance(want, Fraction):
        return isinstance(got, numbers.Integral)
    return False


def _type_hint(got, want) -> str:
    """Why a value of the right size in the wrong type is still wrong, and the fix."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return ""
    if isinstance(want, Fraction) and isinstance(got, float):
        return (
            f" (a float rounds: {got!r}; use fractions.Fraction to give the exact value, "
            f"e.g. Fraction({want.numerator}, {want.denominator}))"
        )
    if isinstance(want, (list, tuple)) and isinstance(got, torch.Tensor):
        kind = type(want).__name__
        if want and isinstance(want[0], torch.Tensor):  # a list of tensors, one per piece
            return f" (the exercise asks for a {kind} of tensors: {kind}(t.unbind(0)) splits one)"
        return f" (the exercise asks for a {kind}: {kind}(t.tolist()) turns a tensor into one)"
    if isinstance(want, (list, tuple, set)) and isinstance(got, (list, tuple, set)):
        if sorted(map(repr, got)) == sorted(map(repr, want)):
            return f" (the right values, but the exercise asks for a {type(want).__name__})"
    return ""


def close(got, want, what: str = "your answer", *, rtol: float = 1e-5, atol: float = 1e-6,
          world_size: int | None = None) -> None:
    """Tensors (or numbers) equal up to rounding. A result off by exactly the world size, or by
    its inverse, says so ("exactly 2x the expected: summed over 2 ranks but not divided?")."""
    import torch

    g = got if isinstance(got, torch.Tensor) else None
    w = want if isinstance(want, torch.Tensor) else torch.as_tensor(want)
    if g is None:
        if isinstance(got, numbers.Real) and not isinstance(got, bool) and w.numel() == 1:
            g = torch.as_tensor(float(got), dtype=w.dtype)
        else:
            raise AssertionError(f"{what} should be {describe(want)}; got {describe(got)}")
    if g.shape != w.shape:
        raise AssertionError(
            f"{what} should have shape {tuple(w.shape)}; got shape {tuple(g.shape)}"
        )
    g64, w64 = g.detach().double(), w.detach().double()
    if torch.allclose(g64, w64, rtol=rtol, atol=atol):
        return
    hint = ""
    if world_size and world_size > 1 and w64.abs().max() > 0:
        for factor, why in (
            (world_size, "summed over the ranks but not divided by the world size?"),
            (1 / world_size, "divided by the world size once too often, or not summed?"),
        ):
            if torch.allclose(g64, w64 * factor, rtol=rtol, atol=atol):
                hint = f": exactly {_fmt(factor)}x the expected ({why})"
    err = (g64 - w64).abs().max().item()
    shown = g.tolist() if g.numel() <= 8 else "..."
    wanted = w.tolist() if w.numel() <= 8 else "..."
    raise AssertionError(
        f"{what} should be {wanted}; got {shown}{hint or f' (largest difference {err:.3g})'}"
    )


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"1/{round(1 / x)}"


def ranks_agree(values: list, what: str = "the ranks' answers") -> None:
    """Every rank returned the same thing (compared with `same`)."""
    for r, v in enumerate(values[1:], start=1):
        try:
            _same(v, values[0], f"rank {r}'s answer")
        except AssertionError as e:
            raise AssertionError(f"{what} differ: {e} (rank 0 gave {values[0]!r})") from None


def not_written(fn, *args) -> None:
    """Call a rank-side answer here, in the kernel, so that a skeleton's NotImplementedError says
    "not attempted" before any rank starts. A written answer usually fails here (no process
    group, RPC not started): that is fine, the grader runs it on the ranks next."""
    try:
        fn(*args)
    except NotImplementedError:
        raise
    except Exception:  # noqa: BLE001 -- it needs the ranks; the grader runs it there
        pass


#: What an answer may change for every later cell, and `restored` puts back: classes whose
#: methods a learner patches (``type(attn).forward = ...``) and modules whose functions a
#: learner replaces (``dist.all_reduce = ...``), as ``(module, attribute)``; a class or module
#: that is not imported is skipped.
_CLASSES = (("distlab.gpt", "GPT"), ("distlab.gpt", "Block"), ("distlab.gpt", "Attention"),
            ("distlab.gpt", "MLP"), ("torch.nn", "Module"), ("torch.nn", "Linear"),
            ("torch.nn", "Embedding"), ("torch.nn", "LayerNorm"), ("torch.nn", "GELU"),
            ("torch.nn", "Dropout"), ("torch", "Tensor"))
_MODULES = ("torch", "torch.nn.functional", "torch.distributed",
            "torch.distributed.distributed_c10d")


class restored:
    """A context manager: what the code inside changed of the state every later cell shares is
    put back when it ends (also when it raises): torch's default dtype, whether gradients are
    on, its number of threads, the methods of the tiny GPT's and torch's module classes, and
    the functions of ``torch``, ``torch.nn.functional`` and ``torch.distributed``. Attributes a
    module gained (torch imports submodules lazily), and torch's own changes (it wraps some of
    its functions on import), are left. ``changed`` lists what had to be put back ("the default
    dtype", "Attention.forward"...)."""

    def __enter__(self):
        import sys

        import torch

        from .. import gpt  # noqa: F401 -- its classes are guarded even if the answer imports it

        self.changed: list[str] = []
        self._dtype, self._grad = torch.get_default_dtype(), torch.is_grad_enabled()
        self._threads = torch.get_num_threads()
        self._classes = []
        for module, name in _CLASSES:
            cls = getattr(sys.modules.get(module), name, None)
            if isinstance(cls, type):
                self._classes.append((cls, dict(vars(cls))))
        self._modules = [(m, dict(vars(sys.modules[m]))) for m in _MODULES if m in sys.modules]
        return self

    def __exit__(self, *exc):
        import sys

        import torch

        if torch.get_default_dtype() != self._dtype:
            torch.set_default_dtype(self._dtype)
            self.changed.append("the default dtype")
        if torch.is_grad_enabled() != self._grad:
            torch.set_grad_enabled(self._grad)
            self.changed.append("whether gradients are on")
        if torch.get_num_threads() != self._threads:
            torch.set_num_threads(self._threads)
        for owner, before, put in (
            *((cls, b, type.__setattr__) for cls, b in self._classes),
            *((sys.modules[m], b, setattr) for m, b in self._modules),
        ):
            now = vars(owner)
            for key, value in before.items():
                if key in now and not _patched(now[key], value):
                    continue
                put(owner, key, value)
                self.changed.append(f"{getattr(owner, '__qualname__', owner.__name__)}.{key}")
            if isinstance(owner, type):
                for key in [k for k in now if k not in before and _patched(now[k], None)]:
                    delattr(owner, key)
                    self.changed.append(f"{owner.__qualname__}.{key}")
        return False


def _patched(now, before) -> bool:
    """Whether an attribute's value ``now`` is a learner's replacement of ``before``: another
    callable, not torch's own (torch wraps some of its functions when a submodule is imported,
    and its counters change: those are left alone)."""
    if now is before or not callable(now):
        return False
    return not str(getattr(now, "__module__", "") or "").startswith("torch")



def restoring(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` inside `restored`: what `run` runs on every rank, so that an
    answer that changed a rank's shared state does not break the next cell there."""
    with restored():
        return fn(*args, **kwargs)


def _hang_wait(timeout: float, cluster=None) -> float:
    """How long a check waits before it calls an answer a hang: ``timeout`` stretched by the
    load, but on a live cluster never past the cluster's own timeout. Its process group gives up
    a few seconds after that (gloo's "Timed out waiting ... for send operation"), and the verdict
    would then be that error instead of "your answer hangs" (seen on a machine busy enough to
    stretch 10 s past the cluster's 60)."""
    wait = patience(timeout)
    return wait if cluster is None else min(wait, cluster.timeout)


def run(fn, *args, world_size: int = 2, cluster=None, timeout: float = HANG, **kwargs) -> list:
    """``fn(*args, **kwargs)`` on ``world_size`` new ranks (or the live ranks of ``cluster``),
    called a hang after ``timeout`` seconds: one value per rank. What the call changed of a
    rank's shared state (the default dtype, patched classes: `restored`) is put back after it.
    Raises what `distlab.launch` raises (`distlab.check` turns each into a verdict)."""
    with hang_when_idle(timeout):
        if cluster is not None:
            return cluster.run(restoring, fn, *args, timeout=_hang_wait(timeout, cluster),
                               _record=False, **kwargs)
        from ..launcher import launch

        return launch(restoring, fn, *args, world_size=world_size, timeout=patience(timeout),
                      **kwargs)


def collectives(fn, *args, world_size: int = 2, cluster=None, timeout: float = HANG, **kwargs):
    """Run ``fn`` as `run` does, under a timeline recording: ``(values, calls)`` where
    ``calls[r]`` lists the collectives rank ``r`` called, as the profiler names them
    (``c10d::allgather_``, ``c10d::send``...), in order."""
    from ..timeline import metrics, record

    where = {"cluster": cluster} if cluster is not None else {"world_size": world_size}
    with hang_when_idle(timeout):
        tl = record(restoring, fn, *args, timeout=_hang_wait(timeout, cluster), sync=False,
                    **where, **kwargs)
    calls = [[e.name for e in metrics.calls(tl.events(r))] for r in range(tl.world_size)]
    return tl.results, calls


def called(calls: list[list[str]], any_of: tuple[str, ...], what: str) -> None:
    """Every rank's ``calls`` (from `collectives`) include one of ``any_of`` (substrings of the
    profiler's names, e.g. ``("allgather",)``); else say which rank did not."""
    for r, names in enumerate(calls):
        if not any(want in name for name in names for want in any_of):
            used = ", ".join(sorted(set(names))) or "no collective at all"
            raise AssertionError(f"rank {r} should use {what}; it called {used}")
