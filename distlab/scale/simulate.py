"""Simulate one rank of a layout: a fake process group of the layout's world size in this one
process, the rank's pipeline stage built on the meta device, laid out with PyTorch's parallel
code, then one training step under fake tensors (shapes and dtypes, no values, no memory).

What is read off the rank (`RankReport`):

- parameters, gradients and Adam's state: the bytes of the real local shards after the step;
- activations: the bytes one microbatch's forward leaves alive for backward (MemTracker's
  activation memory after the forward: what autograd saved, selective checkpointing's cache,
  the loss), times the microbatches the stage holds at once (1F1B);
- the peak: ``torch.distributed._tools.mem_tracker.MemTracker`` over forward, backward and the
  optimizer step of one microbatch, plus the other microbatches' activations in flight;
- FLOPs of forward and backward (`instruments.LocalFlops`) and every collective with its bytes
  and mesh dimension (`instruments.Collectives`).

``torch.testing._internal.distributed.fake_pg`` (the "fake" backend: collectives that return at
once) is private to PyTorch's tests; so is ``MemTracker`` (``torch.distributed._tools``).

Knows nothing about the calculators: `compare` sets the two side by side.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..calculators._text import CalculatorError
from ..calculators.models import Transformer, get_model
from .instruments import Collectives, LocalFlops
from .layout import Layout, stage_layers
from .model import Llama
from .plans import (
    apply_checkpointing,
    apply_context_parallel,
    apply_expert_parallel,
    apply_fsdp,
    apply_tensor_parallel,
)

__all__ = ["RankReport", "simulate_rank", "simulated"]



@dataclass(frozen=True)
class RankReport:
    """What one simulated rank holds and does in one step (bytes, FLOPs, collectives).

    ``rank`` and ``coords`` (its place on the mesh), ``stage`` (pipeline stage) and ``layers``
    it holds; ``numel`` parameters it holds a shard of; ``params``, ``grads``, ``optimizer``:
    bytes of its local shards after the step (Adam's per-tensor step counters in
    ``optimizer_steps``, apart); ``activations``: bytes saved by one microbatch's forward, and
    ``in_flight`` microbatches held at once; ``peak``: the most bytes alive at once;
    ``flops``: forward and backward of one microbatch; ``tokens``: tokens this rank processes
    per microbatch; ``collectives``: every call of the step (all its accumulated microbatches),
    in order."""

    model: object
    layout: Layout
    rank: int
    coords: dict
    stage: int
    layers: tuple
    numel: int
    params: int
    grads: int
    optimizer: int
    optimizer_steps: int
    activations: int
    in_flight: int
    peak_one_microbatch: int
    flops: int
    tokens: int
    collectives: tuple = field(default=(), repr=False)

    @property
    def peak(self) -> int:
        """The peak of one microbatch's step plus the activations of the others in flight."""
        return self.peak_one_microbatch + (self.in_flight - 1) * self.activations

    @property
    def states(self) -> int:
        return self.params + self.grads + self.optimizer

    def comm(self) -> dict:
        """``{(dim, kind): (calls, bytes)}`` over the step's collectives."""
        calls, nbytes = Counter(), Counter()
        for c in self.collectives:
            calls[c.dim, c.kind] += 1
            nbytes[c.dim, c.kind] += c.nbytes
        return {key: (calls[key], nbytes[key]) for key in sorted(calls)}


@contextlib.contextmanager
def fake_world(rank: int, world_size: int):
    """A fake default process group: this process plays ``rank`` of ``world_size``."""
    if dist.is_initialized():
        raise RuntimeError(
            "a process group is already initialized in this process: the simulation needs the "
            "default group for its fake ranks. Run it in the notebook's kernel (or a fresh "
            "process), not on a rank of distlab.launch or a Cluster"
        )
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        with _own_groups_only():
            yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _own_groups_only():
    """While simulating: a device mesh creates only the groups this rank belongs to.

    On a real backend every rank takes part in creating every group, so `DeviceMesh` calls
    ``new_group`` for each group of each dimension: 35,968 calls (1.1 s) for Llama-3 405B's
    16,384 ranks, all but five for groups this rank is not in. The fake backend needs no such
    agreement; the groups this rank is in are created as before, with the same ranks."""
    from torch.distributed import device_mesh

    mesh_class = device_mesh.DeviceMesh
    original = mesh_class.__dict__["_init_one_process_group"]

    def init_one(sub_layout, rank_map, dim_name, backend_override):
        if sub_layout.numel() == dist.get_world_size() or backend_override != (None, None):
            return original.__func__(sub_layout, rank_map, dim_name, backend_override)
        rows = device_mesh._MeshLayout([sub_layout]).remap_to_tensor(rank_map)
        mine = (rows == dist.get_rank()).any(dim=1).nonzero().flatten().tolist()
        if not mine:
            return None
        group = dist.new_group(ranks=rows[mine[0]].tolist(), group_desc=f"mesh_{dim_name}")
        return group.group_name

    mesh_class._init_one_process_group = staticmethod(init_one)
    try:
        yield
    finally:
        mesh_class._init_one_process_group = original


def _mesh(layout: Layout):
    """The mesh, with ``dp`` (and ``dp_cp``: the ranks that hold the same parameters) flattened
    where it spans several dimensions."""
    from torch.distributed.device_mesh import init_device_mesh

    shape = layout.mesh_shape
    mesh = init_device_mesh("cpu", tuple(shape.values()), mesh_dim_names=tuple(shape))
    dp = ("dp_mod_ep", "ep") if layout.ep > 1 else ("dp",)
    if layout.ep > 1:
        mesh[dp]._flatten("dp")
    if layout.cp > 1:
        mesh[(*dp, "cp")]._flatten("dp_cp")
    return mesh


def _dp_mesh(mesh, layout: Layout):
    """FSDP's mesh: the ranks that hold the same parameters (dp, with cp), replicated over
    ``replicate`` (HSDP). zero=0 (DDP): all of them are replicas, each "shard" one rank."""
    from torch.distributed.device_mesh import DeviceMesh

    shard = "dp_cp" if layout.cp > 1 else "dp"
    if layout.zero == 0:
        peers = mesh[("replicate", shard)] if layout.replicate > 1 else mesh[shard]
        ranks = peers.mesh.flatten()
        return DeviceMesh("cpu", ranks.view(-1, 1), mesh_dim_names=("ddp", "one"))
    if layout.replicate > 1:
        return mesh[("replicate", shard)]
    return mesh[shard]


def _coords_of(rank: int, dims: dict) -> dict:
    out = {}
    for name, size in reversed(dims.items()):
        out[name] = rank % size
        rank //= size
    return dict(reversed(out.items()))


def _rank_of(coords: dict, dims: dict) -> int:
    rank = 0
    for name, size in dims.items():
        rank = rank * size + coords.get(name, 0)
    return rank


def _group_names(*meshes) -> dict:
    """``{group name: mesh dimension name}`` for every dimension of these meshes."""
    names = {}
    for mesh in meshes:
        for i, dim in enumerate(mesh.mesh_dim_names):
            names.setdefault(mesh.get_group(i).group_name, dim)
    return names


def build_stage(config: Transformer, layout: Layout, stage: int, mesh):
    """The stage's model, laid out on ``mesh`` (see `plans`)."""
    layers = stage_layers(config.layers, layout.pp)[stage]
    with torch.device("meta"):
        model = Llama(config, layers, first=stage == 0, last=stage == layout.pp - 1,
                      attention=layout.attention)  # fmt: skip
    if layout.ep > 1:
        apply_expert_parallel(model, mesh["ep"])
    if layout.tp > 1:
        apply_tensor_parallel(model, mesh["tp"], sequence_parallel=layout.sequence_parallel,
                              loss_parallel=layout.loss_parallel)  # fmt: skip
    if layout.cp > 1:
        apply_context_parallel(model, mesh["cp"], layout.seq_len)
    apply_checkpointing(model, layout.checkpointing)
    expert_mesh = None
    if layout.ep > 1:
        expert_mesh = mesh["dp_mod_ep"] if layout.cp == 1 else mesh[("dp_mod_ep", "cp")]
    dp_mesh = _dp_mesh(mesh, layout)
    apply_fsdp(model, dp_mesh, reshard=layout.reshard_after_forward and layout.pp == 1,
               precision=layout.precision, expert_mesh=expert_mesh)
    return model, tuple(layers), dp_mesh


def _state_bytes(model, optimizer) -> tuple[int, int, int, int, int]:
    def local(t):
        t = getattr(t, "_local_tensor", t)
        return t.numel() * t.element_size()

    params = list(model.parameters())
    numel = sum(getattr(p, "_local_tensor", p).numel() for p in params)
    p_bytes = sum(local(p) for p in params)
    g_bytes = sum(local(p.grad) for p in params if p.grad is not None)
    opt, steps = 0, 0
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                if key == "step":
                    steps += local(value)
                else:
                    opt += local(value)
    return numel, p_bytes, g_bytes, opt, steps


@contextlib.contextmanager
def simulated(model, layout: Layout, stage: int = 0):
    """This process as the first rank of pipeline ``stage`` of ``layout`` (a fake process group
    of the layout's world size), with the stage's model built on the meta device and laid out
    by PyTorch's parallel code: yields ``(stage_model, mesh)``. Its parameters are DTensors with
    their real shapes and placements, and no memory (``to_empty`` under a ``FakeTensorMode``
    gives them fake storage). On leaving, the fake process group is destroyed and DTensor's
    caches are emptied (they hold meshes of the fake group, which the next simulation in this
    process would otherwise be handed).

    Raises: as `simulate_rank`.
    """
    config = get_model(model)
    _check(config, layout, stage)
    rank = _rank_of({"pp": stage}, layout.mesh_shape)
    try:
        with fake_world(rank, layout.world_size), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # FSDP's and DTensor's notes about fake/meta tensors
            mesh = _mesh(layout)
            stage_model, layers, dp_mesh = build_stage(config, layout, stage, mesh)
            stage_model.layer_ids, stage_model.dp_mesh = layers, dp_mesh
            yield stage_model, mesh
    finally:
        _forget_dtensor_caches()


def _forget_dtensor_caches() -> None:
    """Empty DTensor's caches of sharding decisions: keyed by mesh shapes, they would hand the
    next fake process group the meshes (and group names) of the last one. (No gc.collect: with
    the caches empty nothing reaches the old meshes, and in a notebook's kernel a collection
    cost 0.3-0.6 s per simulation.)"""
    from torch.distributed.tensor import DTensor, _redistribute
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()
    ShardingPropagator._propagate_tensor_meta_cached.cache_clear()
    _redistribute._gen_transform_infos.cache_clear()
    _redistribute.clear_redistribute_planner_cache()
    torch._C._clear_DTensor_sharding_propagator_cache()  # the C++ fast path's cache


def simulate_rank(model, layout: Layout, stage: int = 0) -> RankReport:
    """Lay ``model`` out with ``layout`` and run one step as the first rank of pipeline ``stage``
    (all other coordinates 0), under fake tensors, in this process (which must not be running a
    process group of its own).

    Args:
        model: a preset's name ("Llama-3 405B") or a `calculators.Transformer`.
        layout: a `Layout`.
        stage: the pipeline stage, 0 to ``layout.pp - 1``.

    Returns:
        A `RankReport`.

    Raises:
        CalculatorError (a ValueError): a model that is not a transformer; ``tp`` that does not
            divide the heads, key-value heads, MLP or vocabulary; ``ep`` > 1 for a dense model
            or not dividing the experts; a ``stage`` outside the pipeline; ``seq_len`` not
            divisible by ``cp`` or, with sequence parallelism, by ``tp``.
        RuntimeError: a process group already runs in this process.
    """
    config = get_model(model)
    with simulated(config, layout, stage) as (stage_model, mesh):
        return _step(config, layout, stage, _group_names(mesh, stage_model.dp_mesh), stage_model)


def _check(config, layout: Layout, stage: int) -> None:
    if not isinstance(config, Transformer):
        raise CalculatorError(f"the simulation lays out transformers; {config!r} is not one")
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < layout.pp:
        raise CalculatorError(f"stage must be 0 to {layout.pp - 1} (pp={layout.pp}), got "
                              f"{stage!r}")  # fmt: skip
    config.check_tp(layout.tp)
    if config.vocab % layout.tp:
        raise CalculatorError(f"tp={layout.tp} does not divide the vocabulary of {config.name} "
                              f"({config.vocab})")  # fmt: skip
    if layout.ep > 1 and (config.experts == 1 or config.experts % layout.ep):
        raise CalculatorError(f"ep={layout.ep}: {config.name} has {config.experts} expert(s); "
                              "ep must divide them")  # fmt: skip
    tokens = layout.seq_len // layout.cp
    if layout.tp > 1 and layout.sequence_parallel and tokens % layout.tp:
        raise CalculatorError(f"sequence parallelism splits {tokens} tokens per rank over "
                              f"tp={layout.tp}: choose seq_len divisible by cp x tp")


def _step(config, layout, stage, names, model) -> RankReport:
    from torch._subclasses.fake_tensor import FakeTensorMode

    rank, dims = _rank_of({"pp": stage}, layout.mesh_shape), layout.mesh_shape

    b, s = layout.micro_batch, layout.seq_len // layout.cp
    first, last = stage == 0, stage == layout.pp - 1
    act_dtype = torch.bfloat16 if layout.precision == "bf16-mixed" else torch.float32
    flops, comms = LocalFlops(), Collectives(names)
    parallel_loss = last and layout.tp > 1 and layout.loss_parallel
    with FakeTensorMode(allow_non_fake_inputs=True), _unseen_shape_propagation():
        model.to_empty(device="cpu")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        _steady_state(model, optimizer)
        if first:
            x = torch.randint(0, config.vocab, (b, s))
        else:  # the previous stage's output: the residual stream, sharded by sequence with SP
            rows = s // layout.tp if layout.tp > 1 and layout.sequence_parallel else s
            x = torch.empty(b, rows, config.hidden, dtype=act_dtype, requires_grad=True)
        tracker = _tracker()
        tracker.track_external(model, optimizer)
        # The tracker innermost: it runs a DTensor op itself, and the counters must see the
        # local ops inside it (they pass DTensor ops on and count what DTensor runs).
        with tracker, flops, comms:
            for micro in range(layout.accumulate):  # gradient accumulation (data parallel)
                tracker.reset_mod_stats()  # per-module stats of one forward; the peak stays
                if layout.accumulate > 1 and layout.zero == 3:
                    # FSDP2: reduce-scatter only after the last microbatch, unless told to
                    # after every one (then each microbatch's gradients are sharded at once)
                    model.set_requires_gradient_sync(
                        layout.sync_each_microbatch or micro == layout.accumulate - 1)
                with _loss_parallel(parallel_loss):
                    out = model(x)
                    if last:
                        targets = torch.randint(0, config.vocab, (b * s,))
                        out = F.cross_entropy(out.flatten(0, 1).float(), targets)
                    if micro == 0:
                        activations = _activations(tracker, model)
                    out.backward(None if last else torch.empty_like(out))
            optimizer.step()
        peak = tracker.get_tracker_snapshot("peak")
        numel, p_bytes, g_bytes, opt, steps = _state_bytes(model, optimizer)
    peak_bytes = _bytes(peak, "Total")
    return RankReport(
        model=config, layout=layout, rank=rank, coords=_coords_of(rank, dims), stage=stage,
        layers=model.layer_ids, numel=numel, params=p_bytes, grads=g_bytes, optimizer=opt,
        optimizer_steps=steps, activations=activations, in_flight=_in_flight(layout, stage),
        peak_one_microbatch=int(peak_bytes), flops=flops.total // layout.accumulate, tokens=b * s,
        collectives=tuple(comms.calls),
    )  # fmt: skip


@contextlib.contextmanager
def _unseen_shape_propagation():
    """DTensor learns an op's output shape by running the op once more on fake tensors of the
    *global* shapes (``ShardingPropagator._propagate_tensor_meta_non_cached``, once per op and
    shapes). That run is not part of the rank's work: without this, the FLOP counter counts a
    whole unsharded matmul and the memory tracker sees a whole unsharded output. Here it runs
    with every mode of ours set aside."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator
    from torch.utils._python_dispatch import _disable_current_modes

    original = ShardingPropagator._propagate_tensor_meta_non_cached

    def quiet(self, op_schema):
        with _disable_current_modes():
            return original(self, op_schema)

    ShardingPropagator._propagate_tensor_meta_non_cached = quiet
    try:
        yield
    finally:
        ShardingPropagator._propagate_tensor_meta_non_cached = original


def _loss_parallel(on: bool):
    if not on:
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


def _tracker():
    """torch's MemTracker, less its per-module peaks: it updates every module's peak after every
    op (ops x modules: 40 s for Llama-3 8B's 32 layers on one rank); one rank's peak is enough."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class RankPeak(MemTracker):
        def _update_peak_stats(self, peak_state) -> None:
            for device, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(device, 0) < snap["Total"]:
                    self._peak_mem[device] = snap["Total"]
                    self._peak_mem_snap[device] = dict(snap)

    return RankPeak()


def _steady_state(model, optimizer) -> None:
    """A step in the middle of training: Adam's state there already (its first step creates
    it), gradients freed by ``zero_grad()``."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _activations(tracker, model) -> int:
    """What the forward left alive for backward (selective checkpointing's cache too; a
    stage's output, kept for its backward), less the gathered parameters FSDP keeps after
    forward (a module with ``reshard_after_forward=False``): MemTracker files them as
    activations, having seen them made during the forward."""
    params = set()
    for p in model.parameters():  # FSDP's unsharded parameters are registered now
        params.add(id(getattr(p, "_local_tensor", p).untyped_storage()))
    total = 0
    for storage, (info, _) in list(tracker._WINFO.items()):  # private: tests read it too
        if str(info.reftype).endswith("ACT") and id(storage) not in params:
            total += info.mem_consumed
    return total


def _bytes(snapshot: dict, kind: str) -> int:
    """The bytes of one kind ("ACT", "Total", ...) in a MemTracker snapshot, over devices."""
    return int(sum(v for per_device in snapshot.values() for k, v in per_device.items()
                   if str(k).rsplit(".", 1)[-1] == kind))  # fmt: skip


def _in_flight(layout: Layout, stage: int) -> int:
    """Microbatches whose activations stage ``stage`` holds at once under 1F1B."""
    return min(layout.pp - stage, layout.microbatches or layout.pp)

