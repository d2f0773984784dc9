"""The door to torch's private code that `distlab.scale` simulates a rank with.

A fake process group, fake tensors, DeviceMesh's group creation, DTensor's caches and its shape
propagation, and MemTracker: none of it is public, all of it changes between torch releases. A
torch upgrade that breaks `distlab.scale` is fixed here. Each entry says what it is, since when
torch has it (in the form used here), and what replaces it publicly, if anything.

Knows nothing about layouts or models: `distlab.scale` says what to simulate.
"""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def fake_world(rank: int, world_size: int):
    """A fake default process group: this process plays ``rank`` of ``world_size``; every
    collective returns at once, and a device mesh creates only the groups this rank is in
    (`own_groups_only`). Destroyed on leaving.

    - ``torch.testing._internal.distributed.fake_pg.FakeStore``: private to PyTorch's own tests
      (importing the module registers the "fake" backend); since torch 2.1. No public
      replacement (``torch.distributed._local_tensor``, 2.9+, is the other private way).

    Raises RuntimeError when this process already has a default process group.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError(
            "a process group is already initialized in this process: the simulation needs the "
            "default group for its fake ranks. Run it in the notebook's kernel (or a fresh "
            "process), not on a rank of distlab.launch or a Cluster"
        )
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        with own_groups_only():
            yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def own_groups_only():
    """While simulating: a device mesh creates only the groups this rank belongs to.

    On a real backend every rank takes part in creating every group, so `DeviceMesh` calls
    ``new_group`` for each group of each dimension: 35,968 calls (1.1 s) for Llama-3 405B's
    16,384 ranks, all but five for groups this rank is not in. The fake backend needs no such
    agreement; the groups this rank is in are created as before, with the same ranks.

    - ``DeviceMesh._init_one_process_group(sub_layout, rank_map, dim_name, backend_override)``
      and ``device_mesh._MeshLayout``: private, in this form since torch 2.9 (meshes as CuTe
      layouts). torch 2.15 passes one more argument: anything past the four is passed on to
      torch's own function where it creates the group, and not needed where this does (the
      fake backend takes any group). No public replacement.
    """
    import torch.distributed as dist
    from torch.distributed import device_mesh

    mesh_class = device_mesh.DeviceMesh
    original = mesh_class.__dict__["_init_one_process_group"]

    def init_one(sub_layout, rank_map, dim_name, backend_override, *args, **kwargs):
        if sub_layout.numel() == dist.get_world_size() or backend_override != (None, None):
            return original.__func__(sub_layout, rank_map, dim_name, backend_override, *args,
                                     **kwargs)
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


def flatten(mesh, name: str):
    """One dimension named ``name`` made of the dimensions of ``mesh`` (a slice of a mesh).

    - ``DeviceMesh._flatten(name)``: private, since torch 2.6 (torchtitan calls it too). No
      public replacement in the releases the course supports.
    """
    return mesh._flatten(name)


def forget_dtensor_caches() -> None:
    """Empty DTensor's caches of sharding decisions: keyed by mesh shapes, they would hand the
    next fake process group the meshes (and group names) of the last one. (No gc.collect: with
    the caches empty nothing reaches the old meshes, and in a notebook's kernel a collection
    cost 0.3-0.6 s per simulation.)

    - ``DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding`` and
      ``ShardingPropagator._propagate_tensor_meta_cached`` (``functools.lru_cache``\\ s), and
      ``torch.distributed.tensor._redistribute``'s ``_gen_transform_infos`` cache and
      ``clear_redistribute_planner_cache``: private, since DTensor moved to
      ``torch.distributed.tensor`` (2.5) or later; all in 2.13 to 2.15.
    - ``torch._C._clear_DTensor_sharding_propagator_cache``: the C++ fast path's cache.
    No public replacement: DTensor offers no way to empty its caches.
    """
    import torch
    from torch.distributed.tensor import DTensor, _redistribute
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()
    ShardingPropagator._propagate_tensor_meta_cached.cache_clear()
    _redistribute._gen_transform_infos.cache_clear()
    _redistribute.clear_redistribute_planner_cache()
    torch._C._clear_DTensor_sharding_propagator_cache()  # the C++ fast path's cache


@contextlib.contextmanager
def unseen_shape_propagation():
    """DTensor learns an op's output shape by running the op once more on fake tensors of the
    *global* shapes (once per op and shapes). That run is not part of the rank's work: without
    this, a FLOP counter counts a whole unsharded matmul and a memory tracker sees a whole
    unsharded output. Here it runs with every dispatch mode set aside.

    - ``ShardingPropagator._propagate_tensor_meta_non_cached``: private, since torch 2.5.
    - ``torch.utils._python_dispatch._disable_current_modes``: private, since torch 2.0.
    No public replacement.
    """
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


@contextlib.contextmanager
def waits_unseen():
    """While active, ``Work.wait()`` runs with every dispatch mode set aside. On a real gloo rank
    (`scale.real_ranks`): gloo's reduce-scatter (``_reduce_scatter_base``) all-reduces a copy of
    its whole input and, in ``wait()``, splits it and copies this rank's chunk into the output,
    so a MemTracker would count an input-sized buffer that NCCL (a true reduce-scatter) and the
    fake backend never make. Nothing else a real rank's step waits for runs an op in ``wait()``.

    - ``torch._C._distributed_c10d.Work.wait``: a method of c10d's pybind class, replaced on
      the class while active; public as ``dist.Work.wait``, replacing it is not.
    - ``torch.utils._python_dispatch._disable_current_modes``: private, since torch 2.0.
    No public replacement.
    """
    from torch._C._distributed_c10d import Work
    from torch.utils._python_dispatch import _disable_current_modes

    original = Work.wait

    def wait(self, *args, **kwargs):
        with _disable_current_modes():
            return original(self, *args, **kwargs)

    Work.wait = wait
    try:
        yield
    finally:
        Work.wait = original


def fake_tensors():
    """A mode in which new tensors are fake: shapes, dtypes and devices, no memory, no values
    (real tensors from outside are allowed in).

    - ``torch._subclasses.fake_tensor.FakeTensorMode``: private module, since torch 2.0 (what
      ``torch.compile`` and ``torch.export`` trace with). No public replacement; the meta
      device (``torch.device("meta")``) is the public cousin, without devices or strides'
      behaviour.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)


def rank_peak_tracker():
    """torch's MemTracker, less its per-module peaks: it updates every module's peak after every
    op (ops x modules: 40 s for Llama-3 8B's 32 layers on one rank); one rank's peak is enough.
    Used as MemTracker is: ``track_external(model, optimizer)``, ``with tracker:``,
    ``reset_mod_stats()``, ``get_tracker_snapshot("peak")``; and ``total_now()`` (the bytes
    tracked now) and ``open_window()`` / ``window`` (the most bytes since the window opened:
    the peak of one part of a step).

    And per stream, as the CUDA caching allocator pools them: a block freed by a tensor made
    on one stream is reused only by tensors made on that stream (c10/cuda/CUDACachingAllocator:
    a free block is looked up by stream and size), so what FSDP2 makes on its side streams (its
    all-gathers' outputs on the copy-in stream, the reduce-scatters' outputs, which become the
    sharded gradients, on the reduce-scatter stream) stays reserved apart from what the
    default stream makes. ``home_now()`` / ``home_window`` are the bytes made on the stream
    current when the tracker was made; ``side_peaks``: ``{stream: the most bytes alive that
    were made on it}`` for every other stream; ``home_peak``. (The streams are the device
    handle's: on the CPU, ``torch.cpu.Stream`` objects FSDP2 makes and enters as on a GPU.)

    - ``torch.distributed._tools.mem_tracker.MemTracker``: private, since torch 2.5; its
      ``_update_peak_stats``, ``_update_snap`` (an ``_UpdateType`` and a ``_WeakRefInfo``
      with ``mem_consumed``), ``_curr_mem_snap``, ``_peak_mem`` and ``_peak_mem_snap`` too.
      No public replacement (on a GPU, ``torch.cuda.memory._record_memory_history`` and
      ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` measure real memory).
    - ``torch.cpu.current_stream()``: public; on the CPU a stand-in that FSDP2's
      ``with device_handle.stream(...)`` sets, since torch 2.1.
    """
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker, _UpdateType

    class RankPeak(MemTracker):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._home = torch.cpu.current_stream()
            self._stream_of, self._side_now, self.side_peaks = {}, {}, {}
            self.home_peak = self.home_window = 0

        def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None):
            super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)
            if u_type == _UpdateType.ADD:
                stream = torch.cpu.current_stream()
                if stream is self._home:
                    return
                self._stream_of[winfo] = stream
                change = winfo.mem_consumed
            elif u_type == _UpdateType.DEL:
                stream, change = self._stream_of.pop(winfo, None), -winfo.mem_consumed
            elif u_type == _UpdateType.SIZE:
                stream, change = self._stream_of.get(winfo), winfo.mem_consumed - old_mem_consumed
            else:
                return
            if stream is not None:
                now = self._side_now[stream] = self._side_now.get(stream, 0) + change
                self.side_peaks[stream] = max(self.side_peaks.get(stream, 0), now)

        def home_now(self) -> int:
            return self.total_now() - sum(self._side_now.values())

        def _pre_fw_hook(self, module, inputs) -> None:
            # A pipeline schedule runs the stage's forward once per microbatch: MemTracker
            # refuses a root module's second forward ("multiple iterative calls"). Its
            # per-module stats are not read here; start this root's afresh (its forward files
            # each of its modules again before a backward hook looks; other stages' stay).
            parents = set(self._mod_tracker.parents) - {self._mod_tracker.get_known_fqn(module)}
            if (module in self.memory_tracking and not self._mod_tracker.is_bw
                    and parents == {"Global"}):
                for sub in module.modules():
                    self.memory_tracking.pop(sub, None)
            super()._pre_fw_hook(module, inputs)

        window = 0  # the most bytes (over devices) since `open_window`

        def open_window(self) -> int:
            """Start a window: its peak is the current total (``home_window``: of the home
            stream's bytes); returns that total."""
            self.window = self.total_now()
            self.home_window = self.home_now()
            return self.window

        def total_now(self) -> int:
            return int(sum(snap["Total"] for snap in self._curr_mem_snap.values()))

        def _update_peak_stats(self, peak_state) -> None:
            for device, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(device, 0) < snap["Total"]:
                    self._peak_mem[device] = snap["Total"]
                    self._peak_mem_snap[device] = dict(snap)
            self.window = max(self.window, self.total_now())
            home = self.home_now()
            self.home_window = max(self.home_window, home)
            self.home_peak = max(self.home_peak, home)

    return RankPeak()


def activation_bytes(tracker, leave_out: set[int]) -> int:
    """The bytes a MemTracker files as activations now, less the storages whose ``id`` is in
    ``leave_out``.

    - ``MemTracker._WINFO`` (storage -> its info: ``reftype``, ``mem_consumed``): private, since
      torch 2.5 (PyTorch's own tests read it too). No public replacement.
    """
    total = 0
    for storage, (info, _) in list(tracker._WINFO.items()):
        if str(info.reftype).endswith("ACT") and id(storage) not in leave_out:
            total += info.mem_consumed
    return total


#: The methods with which a ``PipelineStage`` makes its receive buffers, one per microbatch,
#: when a schedule first runs it (their first argument: the number of microbatches).
#: `scale.pipeline` measures three microbatches of a longer step and gives these the step's
#: count, so that the buffers are the real run's.
#:
#: - ``PipelineStage._prepare_forward_infra`` / ``_prepare_backward_infra``: private, in
#:   ``torch.distributed.pipelining.stage``; their first argument ``num_microbatches`` since
#:   torch 2.4 (backward's since 2.6). No public replacement.
PIPELINE_STAGE_SETUP = ("_prepare_forward_infra", "_prepare_backward_infra")


def unshards_ahead(schedule_class) -> bool:
    """Whether a pipeline schedule gathers its FSDP stages itself: a runtime schedule
    (interleaved 1F1B and its kin) runs UNSHARD actions, ``unshard(async_op=True)`` on every
    FSDP module of the stage, whose all-gathers FSDP2 then makes on the current stream
    (``get_all_gather_streams``), where FSDP's own pre-forward gather (a single-stage
    schedule's) uses its side streams.

    - ``torch.distributed.pipelining.schedules._PipelineScheduleRuntime``: private, since
      torch 2.5. No public replacement.
    """
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    return issubclass(schedule_class, _PipelineScheduleRuntime)


@contextlib.contextmanager
def gathers_on_current_stream(module):
    """While active, the FSDP modules in ``module`` gather before forward and backward with
    ``async_op=True``: on the current stream, as a runtime schedule's UNSHARD actions do
    (`unshards_ahead`), at the moment FSDP's own hooks would.

    - ``FSDPModule._set_unshard_async_op``: private, since torch 2.6 ("allows the all-gather
      allocations to happen in the default stream, avoiding inter-stream memory
      fragmentation"). No public replacement.
    """
    module._set_unshard_async_op(True)
    try:
        yield
    finally:
        module._set_unshard_async_op(False)



def pipeline_action_kinds() -> frozenset[str]:
    """The names of every kind of action torch's pipeline schedules can put in an order
    (``FORWARD``, ``FULL_BACKWARD``, ``SEND_F``, ... ; torch 2.15 added ``WAIT_SEND_F``,
    ``WAIT_SEND_B`` and ``WAIT_REDUCE_GRAD`` to the orders its schedules emit).

    - ``torch.distributed.pipelining.schedules._ComputationType``: private, since torch 2.5
      (its members change between releases: that is why `scale.pipeline` classifies each). No
      public replacement.
    """
    from torch.distributed.pipelining.schedules import _ComputationType

    return frozenset(kind.name for kind in _ComputationType)
