"""Notebook 03, broadcast, scatter and gather."""

from distlab.exercises import nb03

from . import RIGHT, Answer

GRADERS = {
    1: (nb03.exercise_1, ["tree_broadcast"]),
    2: (nb03.exercise_2, ["all_gather_by_hand"]),
    3: (nb03.exercise_3, ["scatter_via_broadcast", "my_prediction"]),
}

SCATTER = """
def scatter_via_broadcast(output, scatter_list, src):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    everything = torch.empty(world_size, *output.shape, dtype=output.dtype)
    if rank == src:
        everything.copy_(torch.stack(scatter_list))
    dist.broadcast(everything, src=src)
    output.copy_(everything[rank])
    return everything.numel()
"""

ANSWERS = [
    Answer(1, "the solution", """
def tree_broadcast(tensor):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    sent, step = 0, 1
    while step < world_size:
        if rank < step and rank + step < world_size:
            dist.send(tensor, dst=rank + step)
            sent += 1
        elif step <= rank < 2 * step:
            dist.recv(tensor, src=rank - step)
        step *= 2
    return sent
""", RIGHT),
    Answer(1, "the root sends to everyone: p - 1 messages in a row", """
def tree_broadcast(tensor):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        for dst in range(1, world_size):
            dist.send(tensor, dst=dst)
        return world_size - 1
    dist.recv(tensor, src=0)
    return 0
""", "rank 0 sent 3 and received 0 messages; along the tree it sends 2"),
    Answer(1, "a chain: each rank passes it on", """
def tree_broadcast(tensor):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if rank > 0:
        dist.recv(tensor, src=rank - 1)
    if rank < world_size - 1:
        dist.send(tensor, dst=rank + 1)
        return 1
    return 0
""", "rank 0 sent 1 and received 0 messages; along the tree it sends 2"),
    Answer(1, "dist.broadcast itself", """
def tree_broadcast(tensor):
    dist.broadcast(tensor, src=0)
    return 2 if dist.get_rank() == 0 else 0
""", "called dist.broadcast"),
    Answer(1, "returns the number of rounds, not of messages", """
def tree_broadcast(tensor):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    rounds, step = 0, 1
    while step < world_size:
        if rank < step and rank + step < world_size:
            dist.send(tensor, dst=rank + step)
        elif step <= rank < 2 * step:
            dist.recv(tensor, src=rank - step)
        step *= 2
        rounds += 1
    return rounds
""", "rank 1's return value (the number of messages it sent: it sent once) should be 1; got 2"),
    Answer(1, "log2 rounded down: right for powers of two only", """
def tree_broadcast(tensor):
    import math
    rank, world_size = dist.get_rank(), dist.get_world_size()
    sent = 0
    for k in range(int(math.log2(world_size))):
        step = 2**k
        if rank < step and rank + step < world_size:
            dist.send(tensor, dst=rank + step)
            sent += 1
        elif step <= rank < 2 * step:
            dist.recv(tensor, src=rank - step)
    return sent
""", "on 3 ranks, rank 2's tensor after the broadcast (rank 0's tensor) should be"),
    Answer(2, "the solution", """
def all_gather_by_hand(tensor):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    stacked = torch.empty(world_size, *tensor.shape, dtype=tensor.dtype)
    gather_list = list(stacked.unbind(0)) if rank == 0 else None
    dist.gather(tensor, gather_list, dst=0)
    dist.broadcast(stacked, src=0)
    return list(stacked.unbind(0))
""", RIGHT),
    Answer(2, "dist.all_gather itself", """
def all_gather_by_hand(tensor):
    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(out, tensor)
    return out
""", "called dist.all_gather"),
    Answer(2, "returns the stacked tensor", """
def all_gather_by_hand(tensor):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    stacked = torch.empty(world_size, *tensor.shape, dtype=tensor.dtype)
    dist.gather(tensor, list(stacked.unbind(0)) if rank == 0 else None, dst=0)
    dist.broadcast(stacked, src=0)
    return stacked
""", "list(stacked.unbind(0))"),
    Answer(2, "no broadcast: only rank 0 has everything", """
def all_gather_by_hand(tensor):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    slots = [torch.empty_like(tensor) for _ in range(world_size)] if rank == 0 else None
    dist.gather(tensor, slots, dst=0)
    return slots if rank == 0 else [tensor]
""", "called dist.gather 1 and dist.broadcast 0 times"),
    Answer(2, "the values of the notebook's example, built without the ranks", """
def all_gather_by_hand(tensor):
    return [torch.tensor([r, r * r]) for r in range(dist.get_world_size())]
""", "called dist.gather 0 and dist.broadcast 0 times"),
    Answer(2, "a float buffer for every dtype", """
def all_gather_by_hand(tensor):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    stacked = torch.empty(world_size, *tensor.shape)
    gather_list = list(stacked.unbind(0)) if rank == 0 else None
    dist.gather(tensor.float(), gather_list, dst=0)
    dist.broadcast(stacked, src=0)
    return list(stacked.unbind(0))
""", "should be torch.int64; got torch.float32"),
    Answer(3, "the solution", SCATTER + """
def my_prediction():
    return 4 * 1000, 1000
""", RIGHT),
    Answer(3, "returns the size of its own piece, and predicts from it", """
def scatter_via_broadcast(output, scatter_list, src):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    everything = torch.empty(world_size, *output.shape, dtype=output.dtype)
    if rank == src:
        everything.copy_(torch.stack(scatter_list))
    dist.broadcast(everything, src=src)
    output.copy_(everything[rank])
    return output.numel()

def my_prediction():
    return 1000, 1000
""", "rank 0's return value (its broadcast of 4000 elements) should be 4000; got 1000"),
    Answer(3, "4000 written in", """
def scatter_via_broadcast(output, scatter_list, src):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    everything = torch.empty(world_size, *output.shape, dtype=output.dtype)
    if rank == src:
        everything.copy_(torch.stack(scatter_list))
    dist.broadcast(everything, src=src)
    output.copy_(everything[rank])
    return 4000

def my_prediction():
    return 4000, 1000
""", "with pieces of 5, rank 0's return value (its broadcast of 20 elements) should be 20"),
    Answer(3, "dist.scatter itself", """
def scatter_via_broadcast(output, scatter_list, src):
    dist.scatter(output, scatter_list, src=src)
    return output.numel() * dist.get_world_size()

def my_prediction():
    return 4000, 1000
""", "called dist.scatter"),
    Answer(3, "the prediction in bytes", SCATTER + """
def my_prediction():
    return 16000, 4000
""", "counts bytes"),
    Answer(3, "the prediction as a list", SCATTER + """
def my_prediction():
    return [4000, 1000]
""", "the right values, but the exercise asks for a tuple"),
    Answer(3, "the prediction the wrong way round", SCATTER + """
def my_prediction():
    return 1000, 4000
""", "your prediction (elements via broadcast, via scatter)[0] should be 4000; got 1000"),
]
