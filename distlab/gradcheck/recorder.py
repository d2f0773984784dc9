"""The rank side of a gradcheck: record the loss, gradients, parameters and optimizer state.

A `Recorder` keeps, per training step, *full* tensors under the names a one-process model would
use, so that a recording from any layout can be laid next to `distlab.gpt.reference_run`'s:

- a DTensor (``fully_shard``, tensor parallel, FSDP x TP) is gathered with ``full_tensor()``;
- a plain tensor that you sharded by hand is gathered when you name its shard dim (``shards``);
- wrapper prefixes are dropped: DDP's ``module.``, ``torch.compile``'s ``_orig_mod.``,
  ``checkpoint_wrapper``'s ``_checkpoint_wrapped_module.``;
- a pipeline stage's local ``layers.0`` becomes ``layers.{layer_offset}``.

It knows nothing about what the numbers should be: `distlab.gradcheck.compare` judges them.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

import torch

from .._config import check_int
from ..errors import InputError, InputTypeError
from .optimizers import settings

__all__ = ["Recorder", "Step", "clean_name"]

_WRAPPERS = ("_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module")
_LAYER = re.compile(r"^layers\.(\d+)(?=\.|$)")


@dataclass
class Step:
    """What one rank recorded at one step. Dicts keep parameter order.

    ``loss``: a float (None where this rank has no loss, e.g. an early pipeline stage);
    ``grads``: name -> full gradient (None where the parameter had none); ``params``: name ->
    full parameter after the optimizer step; ``state``: ``"<name>.<key>"`` -> full optimizer
    state tensor (``layers.0.attn.wq.weight.exp_avg``); ``optimizer``: name -> the optimizer's
    class and settings for that parameter (``{"kind": "AdamW", "lr": 0.01, "betas": (0.9,
    0.95), ...}``), for the parameters the optimizer holds."""

    loss: float | None
    grads: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    state: dict = field(default_factory=dict)
    optimizer: dict = field(default_factory=dict)


def clean_name(name: str, layer_offset: int = 0) -> str:
    """A parameter's (or module's) name as the unwrapped one-process model has it: wrapper
    parts dropped, ``layers.i`` shifted to ``layers.{i + layer_offset}``."""
    parts = name.split(".")
    if parts[0] == "module":  # DDP
        parts = parts[1:]
    name = ".".join(p for p in parts if p not in _WRAPPERS)
    if layer_offset:
        name = _LAYER.sub(lambda m: f"layers.{int(m.group(1)) + layer_offset}", name)
    return name


def _rank_and_world():
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None, 1


def _group_of(group, what: str):
    """A ProcessGroup (None: the default one) from a ProcessGroup, a 1-D DeviceMesh or "world"."""
    if group is None or group == "world":
        return None
    get_group = getattr(group, "get_group", None)
    if callable(get_group):  # a DeviceMesh
        if group.ndim != 1:
            raise InputError(
                f"{what} must be a 1-D DeviceMesh; slice it first, e.g. mesh['dp'], got a "
                f"{group.ndim}-D mesh"
            )
        return get_group()
    return group


class Recorder:
    """Records a training run on this rank, step by step, as full tensors with global names.

    Call `record` after ``optimizer.step()`` and before ``zero_grad()`` on every rank, then
    return the recorder from the rank (``distlab.launch`` brings it to the kernel) and hand the
    list of them to `distlab.gradcheck.compare`.

    Args:
        loss_group: the ranks whose losses average to the whole batch's loss (the data-parallel
            ranks): a ProcessGroup, a 1-D DeviceMesh (``mesh["dp"]``) or ``"world"``. The
            recorder then all-reduces the loss over them and records the average. None
            (default): the loss is recorded as given (tensor parallelism: every rank already has
            the whole batch's loss).
        layer_offset: added to ``layers.i`` in every name: a pipeline stage that holds global
            layers 2 and 3 as its ``layers.0`` and ``layers.1`` passes 2.
        rename: optional function ``name -> name`` applied after the above, for other layouts.
        shards: for parameters you sharded *by hand* as plain tensors: ``{pattern: dim}``, e.g.
            ``{"layers.*.mlp.w1.*": 0, "layers.*.mlp.w2.weight": 1}`` (fnmatch patterns on the
            global name). Those parameters, their gradients and their per-element optimizer
            state are all-gathered over ``shard_group`` and concatenated along ``dim`` in rank
            order. DTensors need nothing: they know their placements.
        shard_group: the ranks that hold the shards (ProcessGroup, 1-D DeviceMesh or "world").

    Raises:
        ValueError: ``layer_offset`` not an int >= 0 (or a list of them); a ``shards`` dim that
            is not an int; a DeviceMesh with more than one axis (slice it).
    """

    def __init__(
        self,
        *,
        loss_group=None,
        layer_offset: int = 0,
        rename=None,
        shards: dict | None = None,
        shard_group=None,
    ):
        offsets = layer_offset if isinstance(layer_offset, (list, tuple)) else [layer_offset]
        for offset in offsets:
            check_int(offset, "layer_offset", low=0, message=(
                f"layer_offset must be an int >= 0 (or a list of them, one per module), "
                f"got {layer_offset!r}"))
        for pattern, dim in (shards or {}).items():
            check_int(dim, f"shards[{pattern!r}]", noun="a dim (an int)")
        self.rank, self.world_size = _rank_and_world()
        self.steps: dict[int, Step] = {}
        self.layer_offset = layer_offset
        self.shards = dict(shards or {})
        self._loss_group = _group_of(loss_group, "loss_group") if loss_group is not None else None
        self._average_loss = loss_group is not None
        self._shard_group = _group_of(shard_group, "shard_group")
        self._rename = rename

    @property
    def losses(self) -> list:
        """The recorded losses, in step order."""
        return [self.steps[s].loss for s in sorted(self.steps)]

    def __getstate__(self):
        # Process groups and meshes cannot travel back to the kernel, and are not needed there.
        state = dict(self.__dict__)
        state["_loss_group"] = state["_shard_group"] = state["_rename"] = None
        return state

    def __repr__(self) -> str:
        first = self.steps[min(self.steps)] if self.steps else Step(None)
        who = "one process" if self.rank is None else f"rank {self.rank} of {self.world_size}"
        return (
            f"Recorder({who}: {len(self.steps)} steps, {len(first.grads)} gradients, "
            f"{len(first.params)} parameters, {len(first.state)} optimizer state tensors)"
        )

    def record(self, step: int, loss, model, optimizer=None) -> Step:
        """Record ``step``: the loss, and ``model``'s gradients, parameters and ``optimizer``'s
        state, as full tensors with global names. Every rank must call it (it gathers).

        Args:
            step: the step number (int >= 0, each once), as in ``gpt.batch(step, ...)``.
            loss: the loss tensor or float of this step, or None on a rank without one (an early
                pipeline stage).
            model: the module this rank trains (DDP, ``fully_shard``-ed, tensor-parallel, a
                pipeline stage's ``submod``), or a list of them (a rank with several stages;
                then ``layer_offset`` of the recorder may be a list, one per module).
            optimizer: its optimizer, or None to record no optimizer state. Its class and
                settings (lr, betas, eps, weight_decay, momentum...) are recorded too: `compare`
                names settings that differ from one process's, and knows how much SGD, Adam and
                AdamW let rounding in the gradients move the parameters.

        Returns:
            The `Step` recorded.

        Raises:
            ValueError: ``step`` recorded twice or negative; a list of modules whose length
                differs from the recorder's list of layer offsets; ``loss`` is None with a
                ``loss_group``; the optimizer holds a parameter the model does not have (build
                the optimizer *after* ``fully_shard``/``DDP``/``parallelize_module``: they
                replace or wrap the parameters).
            TypeError: ``model`` is not an ``nn.Module`` (or a list of them).
        """
        check_int(step, "step", low=0)
        if step in self.steps:
            raise InputError(f"step {step} was recorded already; record each step once")
        models = list(model) if isinstance(model, (list, tuple)) else [model]
        offsets = self.layer_offset
        offsets = list(offsets) if isinstance(offsets, (list, tuple)) else [offsets] * len(models)
        if len(offsets) != len(models):
            raise InputError(
                f"{len(models)} modules but {len(offsets)} layer offsets: give one per module"
            )
        for m in models:
            if not isinstance(m, torch.nn.Module):
                raise InputTypeError(f"model must be a torch.nn.Module, got {type(m).__name__}")
        named = []  # (global name, parameter), in parameter order
        for m, offset in zip(models, offsets, strict=True):
            for name, p in m.named_parameters():
                name = clean_name(name, offset)
                named.append((self._rename(name) if self._rename else name, p))
        with torch.no_grad():
            record = Step(loss=self._loss(loss))
            for name, p in named:
                record.grads[name] = None if p.grad is None else self._full(p.grad, name, p)
            for name, p in named:
                record.params[name] = self._full(p, name, p)
            if optimizer is not None:
                self._state(optimizer, named, record)
        self.steps[step] = record
        return record

    def _loss(self, loss):
        if loss is None:
            if self._average_loss:
                raise InputError(
                    "loss is None but the recorder averages the loss over loss_group: every "
                    "rank of that group must pass its loss"
                )
            return None
        value = loss.detach() if isinstance(loss, torch.Tensor) else torch.tensor(float(loss))
        value = value.full_tensor() if hasattr(value, "full_tensor") else value
        value = value.double().reshape(())
        if self._average_loss:
            import torch.distributed as dist

            value = value.clone()
            dist.all_reduce(value, group=self._loss_group)
            value /= dist.get_world_size(self._loss_group)
        return float(value)

    def _shard_dim(self, name: str):
        for pattern, dim in self.shards.items():
            if fnmatch.fnmatchcase(name, pattern):
                return dim
        return None

    def _full(self, t, name: str, param):
        if hasattr(t, "full_tensor"):  # a DTensor: it knows how it is spread
            return t.full_tensor().detach().clone().cpu()
        t = t.detach()
        dim = self._shard_dim(name)
        if dim is not None and t.shape == getattr(param, "shape", None):
            import torch.distributed as dist

            world = dist.get_world_size(self._shard_group)
            parts = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(parts, t.contiguous(), group=self._shard_group)
            return torch.cat(parts, dim=dim).cpu()
        return t.clone().cpu()

    def _state(self, optimizer, named, record: Step) -> None:
        names = {id(p): name for name, p in named}
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in names:
                    raise InputError(
                        "the optimizer holds a parameter the model does not have (shape "
                        f"{tuple(p.shape)}): build the optimizer after fully_shard/DDP/"
                        "parallelize_module, from model.parameters(); those replace or wrap "
                        "the parameters, and an optimizer built before updates the old ones"
                    )
        for name, p in named:
            for key, value in optimizer.state.get(p, {}).items():
                if isinstance(value, torch.Tensor):
                    record.state[f"{name}.{key}"] = self._full(value, name, p)
        record.optimizer = settings(optimizer, names)
