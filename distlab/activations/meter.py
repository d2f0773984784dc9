"""The activation meter: charge every tensor saved for backward to the module that saved it."""

from __future__ import annotations

import torch

from .. import _torch
from .._torch_dispatch import tree_leaves
from ..errors import InputTypeError
from ..gradcheck.recorder import clean_name
from .result import OUTSIDE, Activations

__all__ = ["Meter"]


def _span(t):
    """(storage, first byte, end byte) of the memory a saved tensor addresses. The storage is
    named by its identity, not its address: FSDP frees and re-allocates parameter memory, and
    a new tensor may get an address that a saved one had."""
    t = _torch.local_tensor(t)  # a DTensor: this rank's shard is what it keeps
    try:
        key = _torch.storage_key(t)
    except (RuntimeError, NotImplementedError):  # a tensor without storage (fake, functional)
        return ("id", id(t)), 0, t.numel() * t.element_size()
    if t.numel() == 0:
        return key, 0, 0
    start = t.storage_offset() * t.element_size()
    extent = 1 + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride(), strict=True))
    return key, start, start + extent * t.element_size()


def _cover(covered: list, start: int, end: int) -> int:
    """Add [start, end) to the disjoint byte ranges ``covered``; return how many are new."""
    pieces = [(start, end)]
    for a, b in covered:
        rest = []
        for x, y in pieces:
            if b <= x or y <= a:
                rest.append((x, y))
                continue
            if x < a:
                rest.append((x, a))
            if b < y:
                rest.append((b, y))
        pieces = rest
    covered.extend(pieces)
    return sum(y - x for x, y in pieces)


class Meter:
    """Measure the activations a forward pass saves, per module of ``model``.

    Use as a context manager around the forward pass (and the loss, if you want it counted);
    the result is in ``meter.result`` (an `Activations`) after the ``with`` block. Counts what
    the forward saves, at the moment it is saved: run it with gradients enabled, in train mode
    if you want dropout's masks.

    Args:
        model: the ``nn.Module`` whose submodules the bytes are charged to (names as in
            ``model.named_modules()``, with wrapper prefixes such as DDP's ``module.`` and
            ``checkpoint_wrapper``'s ``_checkpoint_wrapped_module.`` dropped).

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        RuntimeError: the meter is entered twice at once (use one meter per forward).
    """

    def __init__(self, model):
        if not isinstance(model, torch.nn.Module):
            raise InputTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.result: Activations | None = None
        self._handles = []
        self._active = False

    def __enter__(self):
        if self._active:
            raise RuntimeError("this Meter is already measuring; use one Meter per forward")
        self._active = True
        self._stack = []  # (name, module, inside a foreign hooks region)
        self._seen = {}  # storage -> list of [owner name, new bytes, is parameter]
        self._covered = {}  # storage -> the byte ranges of it that saved tensors address
        self._keep = []  # saved tensors, held so that their storages stay the same objects
        self._checkpointed = []
        self._pending = {}  # storage key -> (module, caller): a reentrant checkpoint's inputs
        self._pack_fn = self._pack
        for name, module in self.model.named_modules():
            name = clean_name(name)
            self._handles.append(module.register_forward_pre_hook(
                self._pre(name, module), with_kwargs=True))
            self._handles.append(module.register_forward_hook(self._post(name), always_call=True))
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack_fn, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        for handle in self._handles:
            handle.remove()
        self._handles = []
        modules, params = {}, {}
        for owner, nbytes, is_param in (e for entries in self._seen.values() for e in entries):
            target = params if is_param else modules
            target[owner] = target.get(owner, 0) + nbytes
        names = tuple(dict.fromkeys(clean_name(n) for n, _ in self.model.named_modules()))
        rank = {n: i for i, n in enumerate(names + (OUTSIDE,))}

        def ordered(d):
            return dict(sorted(d.items(), key=lambda kv: rank[kv[0]]))

        self.result = Activations(ordered(modules), ordered(params), names,
                                  tuple(dict.fromkeys(self._checkpointed)))
        self._keep, self._seen, self._covered, self._pending = [], {}, {}, {}
        self._active = False
        return False

    def _pack(self, t):
        key, start, end = _span(t)
        nbytes = _cover(self._covered.setdefault(key, []), start, end)
        if nbytes:
            owner = self._stack[-1][0] if self._stack else OUTSIDE
            module, caller = self._pending.pop(key, (None, None))
            if module is not None and caller == owner:
                # A reentrant checkpoint saves its inputs when it returns, in its caller.
                owner = module
                self._checkpointed.append(module)
            module = self._stack[-1][1] if self._stack else self.model
            params = {_span(p)[0] for p in (*module.parameters(), *module.buffers())}
            self._seen.setdefault(key, []).append([owner, nbytes, key in params])
            self._keep.append(t)
        return t

    def _pre(self, name, module):
        def hook(mod, args, kwargs):
            if _torch.in_backward():  # a checkpoint recomputing in backward
                return None
            foreign = _foreign_hooks(self._pack_fn)
            grad = torch.is_grad_enabled()
            parent = self._stack[-1] if self._stack else (OUTSIDE, None, False, True)
            inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            if foreign and not parent[2]:
                # The outermost module of a (non-reentrant) checkpointed region: the checkpoint
                # saved its inputs just before, charged to the caller; charge them to it.
                self._checkpointed.append(name)
                for t in inputs:
                    for entry in self._seen.get(_span(t)[0], ()):
                        if entry[0] == parent[0] and not entry[2]:
                            entry[0] = name
            elif parent[3] and not grad:
                # Gradients off inside a module that had them: a reentrant checkpoint, which
                # saves these inputs when it returns to the caller (see _pack).
                for t in inputs:
                    self._pending[_span(t)[0]] = (name, parent[0])
            self._stack.append((name, module, foreign or parent[2], grad))
            return None

        return hook

    def _post(self, name):
        def hook(mod, args, output):
            if _torch.in_backward():
                return None
            while self._stack:  # pop this module (and any that raised inside it)
                if self._stack.pop()[0] == name:
                    break
            return None

        return hook


def _foreign_hooks(ours) -> bool:
    """Are other saved-tensor hooks (a checkpoint's, save_on_cpu's) innermost right now?"""
    innermost = _torch.innermost_pack_hook()  # None also where torch no longer tells: then
    return innermost is not None and innermost != ours  # no checkpoint attribution
