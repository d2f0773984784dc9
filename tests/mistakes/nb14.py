"""Notebook 14, DeviceMesh, DTensor, FSDP and tensor parallel."""

from distlab.exercises import nb14

from . import RIGHT, Answer

GRADERS = {
    1: (nb14.exercise_1, ["keep_gathered", "cluster"]),
    2: (nb14.exercise_2, ["predicted_local_numel", "cluster"]),
    3: (nb14.exercise_3, ["replicated_with_fsdp", "cluster"]),
}

CLUSTER = {"world_size": 4, "threads": 1}

ANSWERS = [
    Answer(1, "the solution", """
def keep_gathered(model, mesh):
    from torch.distributed.fsdp import fully_shard
    for m in (model.net1, model.net2, model):
        fully_shard(m, mesh=mesh, reshard_after_forward=False)
    return model
""", RIGHT),
    Answer(1, "the default sharding: reshards after forward", """
def keep_gathered(model, mesh):
    from torch.distributed.fsdp import fully_shard
    for m in (model.net1, model.net2, model):
        fully_shard(m, mesh=mesh)
    return model
""", "the backward still all-gathered 2 time(s)"),
    Answer(1, "only the root, so one unit for the whole model", """
def keep_gathered(model, mesh):
    from torch.distributed.fsdp import fully_shard
    fully_shard(model, mesh=mesh, reshard_after_forward=False)
    return model
""", "the forward all-gathered 1 time(s)"),
    Answer(1, "an int: reshards to 2 ranks after forward", """
def keep_gathered(model, mesh):
    from torch.distributed.fsdp import fully_shard
    for m in (model.net1, model.net2, model):
        fully_shard(m, mesh=mesh, reshard_after_forward=2)
    return model
""", "an int reshards to that many ranks"),
    Answer(1, "shards, but forgets to return the model", """
def keep_gathered(model, mesh):
    from torch.distributed.fsdp import fully_shard
    for m in (model.net1, model.net2, model):
        fully_shard(m, mesh=mesh, reshard_after_forward=False)
""", "it returned None"),
    Answer(1, "DDP-style replicate: nothing sharded", """
def keep_gathered(model, mesh):
    from torch.distributed._composable import replicate
    return replicate(model)
""", "after keep_gathered it is a Parameter of shape (32, 50)"),
    Answer(2, "the solution", """
def predicted_local_numel(n, rank, world_size):
    size = -(-n // world_size)
    return max(0, min(size, n - rank * size))
""", RIGHT),
    Answer(2, "torch.chunk itself, counting empty chunks", """
def predicted_local_numel(n, rank, world_size):
    chunks = torch.arange(n).chunk(world_size)
    return len(chunks[rank]) if rank < len(chunks) else 0
""", RIGHT),
    Answer(2, "floor division: the remainder forgotten", """
def predicted_local_numel(n, rank, world_size):
    return n // world_size
""", "for n = 10 on 4 ranks, rank 0 holds 3 numbers"),
    Answer(2, "numpy's array_split: the first ranks take the remainder", """
def predicted_local_numel(n, rank, world_size):
    return n // world_size + (1 if rank < n % world_size else 0)
""", "for n = 10 on 4 ranks, rank 2 holds 3 numbers"),
    Answer(2, "no max(0, ...): a negative count for a rank past the end", """
def predicted_local_numel(n, rank, world_size):
    size = -(-n // world_size)
    return min(size, n - rank * size)
""", "your function says -1"),
    Answer(2, "a float", """
def predicted_local_numel(n, rank, world_size):
    return n / world_size
""", "an int like 3"),
    Answer(2, "off by one: ranks counted from 1", """
def predicted_local_numel(n, rank, world_size):
    size = -(-n // world_size)
    return max(0, min(size, n - (rank + 1) * size))
""", "rank 2 holds 3 numbers"),
    Answer(3, "the solution", """
def replicated_with_fsdp(model, mesh):
    from torch.distributed._composable.replicate_with_fsdp import replicate
    return replicate(model, mesh=mesh)
""", RIGHT),
    Answer(3, "fully_shard: sharded, not replicated", """
def replicated_with_fsdp(model, mesh):
    from torch.distributed.fsdp import fully_shard
    return fully_shard(model, mesh=mesh)
""", "it is a DTensor (Shard(dim=0),) of shape (32, 50)"),
    Answer(3, "the DDP-based replicate: plain parameters", """
def replicated_with_fsdp(model, mesh):
    from torch.distributed._composable import replicate
    return replicate(model)
""", "it is a Parameter of shape (32, 50)"),
    Answer(3, "DTensor by hand: replicated parameters, but a module that wants DTensor inputs", """
def replicated_with_fsdp(model, mesh):
    from torch.distributed.tensor import distribute_module
    return distribute_module(model, mesh)
""", "got mixed torch.Tensor and DTensor"),
    Answer(3, "returns nothing", """
def replicated_with_fsdp(model, mesh):
    from torch.distributed._composable.replicate_with_fsdp import replicate
    replicate(model, mesh=mesh)
""", "it returned None"),
]
