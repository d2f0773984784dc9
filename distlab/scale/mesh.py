"""The device mesh of a layout, on a simulated rank: its dimensions, the mesh FSDP shards over,
where a rank sits on it, and the names of its groups.

Knows nothing about models: `plan_order` lays a stage out on the mesh.
"""

from __future__ import annotations

from .. import _torch_simulation
from .layout import Layout


def build(layout: Layout):
    """The mesh, with ``dp`` (and ``dp_cp``: the ranks that hold the same parameters) flattened
    where it spans several dimensions."""
    from torch.distributed.device_mesh import init_device_mesh

    shape = layout.mesh_shape
    mesh = init_device_mesh("cpu", tuple(shape.values()), mesh_dim_names=tuple(shape))
    dp = ("dp_mod_ep", "ep") if layout.ep > 1 else ("dp",)
    if layout.ep > 1:
        _torch_simulation.flatten(mesh[dp], "dp")
    if layout.cp > 1:
        _torch_simulation.flatten(mesh[(*dp, "cp")], "dp_cp")
    return mesh


def data_parallel_mesh(mesh, layout: Layout):
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


def coords_of(rank: int, dims: dict) -> dict:
    """Where ``rank`` sits on a mesh of ``dims`` (``{name: size}``, outermost first)."""
    out = {}
    for name, size in reversed(dims.items()):
        out[name] = rank % size
        rank //= size
    return dict(reversed(out.items()))


def rank_of(coords: dict, dims: dict) -> int:
    """The rank at ``coords`` (0 for a dimension not named) on a mesh of ``dims``."""
    rank = 0
    for name, size in dims.items():
        rank = rank * size + coords.get(name, 0)
    return rank


def group_names(*meshes) -> dict:
    """``{group name: mesh axis name}`` for every axis of these meshes."""
    names = {}
    for mesh in meshes:
        for i, axis in enumerate(mesh.mesh_dim_names):
            names.setdefault(mesh.get_group(i).group_name, axis)
    return names
