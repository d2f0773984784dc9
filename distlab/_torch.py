"""The one door to torch's private and version-dependent APIs.

torch changes its private code every release, and sometimes renames public calls. Everything
distlab uses that is private (a leading underscore), or that differs between the torch releases
the course supports (2.13, 2.14, 2.15), is reached through a function here, so that a torch
upgrade touches this module and nothing else. Each entry says what it is, since when torch has
it, and what replaces it. Two siblings hold what needs a room of its own: `_torch_dispatch`
(dispatch modes and pytrees, imported at module level by the counters) and `_torch_simulation`
(what `distlab.scale` simulates a rank with). tests/test_imports.py keeps every other module
away from torch's private code.

Knows nothing about ranks, notebooks or the learner: it only finds the right torch call.
"""

from __future__ import annotations

import datetime

from .errors import InputError


def release() -> tuple[int, ...]:
    """The installed torch's release as numbers: ``(2, 14, 1)`` for ``2.14.1+cu130``."""
    import torch

    return _numbers(torch.__version__.split("+")[0])


def at_least(version: str) -> bool:
    """Whether the installed torch is ``version`` (``"2.14"``, ``"2.14.1"``) or newer."""
    wanted = _numbers(version)
    return release()[: len(wanted)] >= wanted


def _numbers(version: str) -> tuple[int, ...]:
    import re

    match = re.match(r"(\d+(?:\.\d+)*)", version) if isinstance(version, str) else None
    if not match:
        raise InputError(
            f"{version!r} is not a torch release: write it as dotted numbers, e.g. '2.14'"
        )
    return tuple(int(part) for part in match.group(1).split("."))


def sac_options() -> dict:
    """Keyword arguments for ``torch.utils.checkpoint.checkpoint`` with a selective policy.

    - ``respect_saved_tensors_hooks``: new in torch 2.14. SAC's cache bypasses saved-tensor
      hooks (an activation meter's, ``save_on_cpu``); 2.14 warns (FutureWarning) when such a
      hook is active around SAC unless the caller chooses, since a later release will route the
      cache through the hooks. ``False`` keeps what 2.13 did, without the warning; on 2.13 the
      argument does not exist and nothing is passed.
    """
    import inspect

    from torch.utils.checkpoint import checkpoint

    if "respect_saved_tensors_hooks" in inspect.signature(checkpoint).parameters:
        return {"respect_saved_tensors_hooks": False}
    return {}


def set_pg_timeout(timeout: datetime.timedelta, group=None) -> bool:
    """Change a process group's timeout after ``init_process_group``; False where torch cannot.

    - ``torch.distributed.set_timeout(timeout, group)``: public since torch 2.14.
    - ``torch.distributed.distributed_c10d._set_pg_timeout``: private, torch 2.2 to 2.13; in
      2.14 it still works but warns (a FutureWarning that every rank would print into the
      learner's cell), so it is used only where the public call is missing.
    """
    import torch.distributed as dist

    setter = getattr(dist, "set_timeout", None)
    if setter is None:
        setter = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    if setter is None:
        return False
    setter(timeout, group)
    return True


# -- DTensor, process groups, functional collectives ----------------------------------------------


def local_tensor(t):
    """A DTensor's local shard as the tensor it holds (no op runs); any other tensor itself.

    - ``DTensor._local_tensor``: private, since DTensor (torch 2.0, then
      ``torch.distributed._tensor``). Public: ``DTensor.to_local()``, which runs an op (seen by
      dispatch modes and autograd), so it is not used where bytes are counted.
    """
    return getattr(t, "_local_tensor", t)


def resolve_process_group(name: str):
    """The process group a functional collective names by its group name.

    - ``torch.distributed.distributed_c10d._resolve_process_group``: private, since torch 2.3.
      No public replacement.
    """
    import torch.distributed as dist

    return dist.distributed_c10d._resolve_process_group(name)


def functional_collectives():
    """torch's functional collectives (``funcol.all_reduce(x, "sum", group)`` returns a new
    tensor and is differentiable), as a module.

    - ``torch.distributed._functional_collectives``: private module, since torch 2.1; what
      DTensor and ``torch.compile`` use. No public replacement: the collectives of
      ``torch.distributed`` work in place and return a ``Work``.
    """
    import torch.distributed._functional_collectives as funcol

    return funcol


def functional_collective_ops() -> set:
    """The ATen ops functional collectives run that FSDP's and DTensor's gathers and scatters
    go through: ``reduce_scatter_tensor`` and ``all_gather_into_tensor``.

    - ``torch.ops._c10d_functional``: a private op namespace, since torch 2.2 (the native
      functional collectives). No public replacement.
    """
    import torch

    ops = torch.ops._c10d_functional
    return {ops.reduce_scatter_tensor.default, ops.all_gather_into_tensor.default}


def ddp_parameter_tensors(ddp_model) -> int:
    """How many parameter tensors a DDP model's reducer holds.

    - ``DistributedDataParallel._get_ddp_logging_data()["num_parameter_tensors"]``: private,
      since torch 1.9. No public replacement.
    """
    return ddp_model._get_ddp_logging_data()["num_parameter_tensors"]


#: The logger DTensor's redistribution writes its notes to.
#: ``torch.distributed.tensor._redistribute``: a private module, since torch 2.5. No public name.
REDISTRIBUTE_LOGGER = "torch.distributed.tensor._redistribute"


# -- the Flight Recorder ------------------------------------------------------------------------


def flight_recorder_dump(stacks: bool = False) -> dict:
    """This process's Flight Recorder buffer, unpickled: ``{"version", "pg_config", "pg_status",
    "entries", ...}``, one entry per collective it called (the last ``TORCH_FR_BUFFER_SIZE``,
    2000 unless set; 0 turns recording off). ``stacks`` adds each call's Python stack
    (``frames``); leave it off on a busy machine: it imports ``torch._dynamo`` on first use.

    - ``torch._C._distributed_c10d._dump_fr_trace``: private, since torch 2.8 (the recorder
      made backend-independent: gloo records into it too). Before it:
      ``_dump_nccl_trace``, NCCL builds only (still there in 2.14, for NCCL's buffer). No public
      replacement in 2.13 to 2.15: the experimental HTTP debug server
      (``torch.distributed.debug.start_debug_server``) serves the same dumps, and on NCCL
      ``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` writes them to ``TORCH_FR_DUMP_TEMP_FILE<rank>``. (torch
      2.14's ``FlightRecorderHook.attach(group)`` records a group's calls a second time, as
      ``c10d:<op>`` entries, into the same buffer; distlab does not use it.)
    """
    import pickle

    import torch

    c10d = torch._C._distributed_c10d
    dump = getattr(c10d, "_dump_fr_trace", None) or getattr(c10d, "_dump_nccl_trace", None)
    if dump is None:
        raise RuntimeError(
            f"torch {torch.__version__} has no Flight Recorder dump (_dump_fr_trace, torch 2.8 "
            "and later): install the course's torch (python -m distlab doctor says which)")
    return pickle.loads(dump(includeStackTraces=stacks))


# -- checkpointing, autograd ------------------------------------------------------------------


def checkpoint_wrapper(module, **options):
    """``module`` wrapped so that its forward runs under ``torch.utils.checkpoint`` (the
    options: ``checkpoint_fn``, ``use_reentrant``, ``context_fn``, ...).

    - ``torch.distributed.algorithms._checkpoint.checkpoint_wrapper.checkpoint_wrapper``:
      private module, since torch 1.12 (what torchtitan wraps its blocks with). Public: calling
      ``torch.utils.checkpoint.checkpoint`` in the module's own forward.
    """
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        checkpoint_wrapper as wrap,
    )

    return wrap(module, **options)


def unwrap_checkpoint(module):
    """The module inside a `checkpoint_wrapper`; any other module itself.

    - ``CheckpointWrapper._checkpoint_wrapped_module``: private, since torch 1.12.
    """
    return getattr(module, "_checkpoint_wrapped_module", module)


def sdpa_ops() -> set:
    """The ATen ops ``F.scaled_dot_product_attention`` runs as (flash on CPU and on CUDA,
    memory-efficient on CUDA): what a selective-checkpointing policy sees of attention.

    - ``aten._scaled_dot_product_flash_attention`` and ``_efficient_attention``: private ops,
      since torch 2.0; ``_scaled_dot_product_flash_attention_for_cpu`` since torch 2.2. Public:
      ``F.scaled_dot_product_attention``, which has no op of its own that a policy could name.
    """
    import torch

    aten = torch.ops.aten
    return {aten._scaled_dot_product_flash_attention_for_cpu.default,
            aten._scaled_dot_product_flash_attention.default,
            aten._scaled_dot_product_efficient_attention.default}


def in_backward() -> bool:
    """Whether autograd is running a backward pass on this thread now (where a non-reentrant
    checkpoint recomputes its forward).

    - ``torch._C._current_graph_task_id()`` (-1 outside a backward): private, since torch 2.1.
      No public replacement.
    """
    import torch

    return torch._C._current_graph_task_id() != -1


def innermost_pack_hook():
    """The pack hook of the innermost default saved-tensor hooks now (a checkpoint's,
    ``save_on_cpu``'s, an activation meter's); None when there are none, or when this torch no
    longer tells.

    - ``torch._C._autograd._top_saved_tensors_default_hooks(ignore_is_tracing)``: private, in
      2.13 to 2.15 (looked up, not assumed). No public replacement.
    """
    import torch

    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    hooks = top(False) if top is not None else None
    return hooks[0] if hooks is not None else None


def storage_key(t) -> int:
    """A name for the storage a tensor uses, the same for every tensor viewing it, that stays
    the storage's while it lives (unlike its address, which FSDP frees and hands out again).
    Raises as ``untyped_storage()`` does for a tensor without storage.

    - ``UntypedStorage._cdata``: private (the C++ storage's handle), since torch 1.x. No public
      replacement: ``data_ptr()`` is the address.
    """
    return t.untyped_storage()._cdata


def profiler_enabled() -> bool:
    """Whether a torch profiler is recording on this thread now.

    - ``torch.autograd._profiler_enabled()``: private, since torch 1.x. No public replacement
      (``torch.profiler.profile`` does not say whether another one runs).
    """
    import torch

    return torch.autograd._profiler_enabled()


def future_type() -> type:
    """The class of every future torch hands out: ``Work.get_future()``, ``then()``,
    ``torch.futures.collect_all``.

    - ``torch._C.Future``: private, since torch 1.6. Public: ``torch.futures.Future``, which
      subclasses it, but what ``get_future()`` returns is the base class, not an instance of it.
    """
    import torch

    return torch._C.Future


# The torch releases the course is run on. LOCKED made every stored output (the Makefile's pin);
# the others are tried on purpose (`make test-torch TORCH_VERSION=2.13.0`, `make test-latest`), and
# the README's "Which torch" table says what differs on each. tests/test_project_files.py keeps
# LOCKED equal to the Makefile's pin.
LOCKED = "2.15.0"
TRIED = ("2.13.0", "2.14.1", "2.15.0")


def reconfigure_options(uuid: int, handles: list[str]):
    """The options of ``ProcessGroup.reconfigure`` (torch >= 2.14, experimental): a new
    membership named ``uuid`` (the same on every member), and the members' handles in rank
    order. torch has no public name for them: ``torch._C._distributed_c10d.ReconfigureOptions``.
    Replaced by: nothing yet (torch 2.15's ``dist.split_group`` makes a smaller group on gloo
    too, but cannot grow one back)."""
    from torch._C import _distributed_c10d as c10d

    if not hasattr(c10d, "ReconfigureOptions"):
        import torch

        raise InputError(f"torch {torch.__version__} has no ProcessGroup.reconfigure (torch 2.14 "
                         "added it); on older releases rebuild the group with "
                         "init_process_group on a new store, as a restart does")
    options = c10d.ReconfigureOptions()
    options.uuid, options.handles = uuid, list(handles)
    return options
