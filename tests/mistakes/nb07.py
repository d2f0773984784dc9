"""Notebook 07, groups, barriers and Python objects."""

from distlab.exercises import nb07

from . import RIGHT, Answer

GRADERS = {
    1: (nb07.exercise_1, ["hierarchical_all_reduce"]),
    2: (nb07.exercise_2, ["hand_out"]),
}

ANSWERS = [
    Answer(1, "the solution", """
def hierarchical_all_reduce(t, my_pair, g02):
    rank = dist.get_rank()
    dist.all_reduce(t, group=my_pair)
    leader = rank - rank % 2
    if rank == leader:
        dist.all_reduce(t, group=g02)
    dist.broadcast(t, src=leader, group=my_pair)
    return t
""", RIGHT),
    Answer(1, "no hierarchy: one all_reduce over everyone", """
def hierarchical_all_reduce(t, my_pair, g02):
    dist.all_reduce(t)
    return t
""", "ran one all_reduce over everyone"),
    Answer(1, "forgets the broadcast back into the pair", """
def hierarchical_all_reduce(t, my_pair, g02):
    dist.all_reduce(t, group=my_pair)
    if dist.get_rank() % 2 == 0:
        dist.all_reduce(t, group=g02)
    return t
""", "what rank 1 returned (the sum over all 4 ranks)"),
    Answer(1, "broadcasts from global rank 0 in both pairs", """
def hierarchical_all_reduce(t, my_pair, g02):
    dist.all_reduce(t, group=my_pair)
    if dist.get_rank() % 2 == 0:
        dist.all_reduce(t, group=g02)
    dist.broadcast(t, src=0, group=my_pair)
    return t
""", "your code failed on the ranks"),
    Answer(1, "the leaders' step on the whole world: only the leaders call it", """
def hierarchical_all_reduce(t, my_pair, g02):
    rank = dist.get_rank()
    dist.all_reduce(t, group=my_pair)
    if rank % 2 == 0:
        dist.all_reduce(t)
    dist.broadcast(t, src=rank - rank % 2, group=my_pair)
    return t
""", "hangs"),
    Answer(1, "returns a new tensor, t unchanged", """
def hierarchical_all_reduce(t, my_pair, g02):
    rank = dist.get_rank()
    out = t.clone()
    dist.all_reduce(out, group=my_pair)
    if rank % 2 == 0:
        dist.all_reduce(out, group=g02)
    dist.broadcast(out, src=rank - rank % 2, group=my_pair)
    return out
""", "t after the call (reduced in place)"),
    Answer(1, "the pair's all_reduce twice: twice the sum", """
def hierarchical_all_reduce(t, my_pair, g02):
    rank = dist.get_rank()
    dist.all_reduce(t, group=my_pair)
    dist.all_reduce(t, group=my_pair)
    if rank % 2 == 0:
        dist.all_reduce(t, group=g02)
    dist.broadcast(t, src=rank - rank % 2, group=my_pair)
    return t
""", "what rank 0 returned (the sum over all 4 ranks) should be [18.0"),
    Answer(2, "the solution", """
def hand_out(files):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mine = [None]
    dist.scatter_object_list(
        mine, [files[r::world_size] for r in range(world_size)] if rank == 0 else None, src=0)
    counts = [None] * world_size if rank == 0 else None
    dist.gather_object(sum(len(f) for f in mine[0]), counts, dst=0)
    return mine[0], counts
""", RIGHT),
    Answer(2, "no scatter: slices the list it does not have", """
def hand_out(files):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mine = files[rank::world_size]
    counts = [None] * world_size if rank == 0 else None
    dist.gather_object(sum(len(f) for f in mine), counts, dst=0)
    return mine, counts
""", "your code failed on the ranks"),
    Answer(2, "contiguous blocks instead of round-robin", """
def hand_out(files):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mine = [None]
    blocks = [files[3 * r: 3 * r + 3] for r in range(world_size)] if rank == 0 else None
    dist.scatter_object_list(mine, blocks, src=0)
    counts = [None] * world_size if rank == 0 else None
    dist.gather_object(sum(len(f) for f in mine[0]), counts, dst=0)
    return mine[0], counts
""", "rank 0's files (round-robin"),
    Answer(2, "all_gather_object: every rank gets the counts", """
def hand_out(files):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mine = [None]
    dist.scatter_object_list(
        mine, [files[r::world_size] for r in range(world_size)] if rank == 0 else None, src=0)
    counts = [None] * world_size
    dist.all_gather_object(counts, sum(len(f) for f in mine[0]))
    return mine[0], counts
""", "only rank 0 should get the counts"),
    Answer(2, "the number of files instead of their characters", """
def hand_out(files):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mine = [None]
    dist.scatter_object_list(
        mine, [files[r::world_size] for r in range(world_size)] if rank == 0 else None, src=0)
    counts = [None] * world_size if rank == 0 else None
    dist.gather_object(len(mine[0]), counts, dst=0)
    return mine[0], counts
""", "the counts on rank 0"),
    Answer(2, "returns a list, not a tuple", """
def hand_out(files):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mine = [None]
    dist.scatter_object_list(
        mine, [files[r::world_size] for r in range(world_size)] if rank == 0 else None, src=0)
    counts = [None] * world_size if rank == 0 else None
    dist.gather_object(sum(len(f) for f in mine[0]), counts, dst=0)
    return [mine[0], counts]
""", "should return a tuple of 2"),
    Answer(2, "every rank's files as a tuple", """
def hand_out(files):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mine = [None]
    dist.scatter_object_list(
        mine, [tuple(files[r::world_size]) for r in range(world_size)] if rank == 0 else None,
        src=0)
    counts = [None] * world_size if rank == 0 else None
    dist.gather_object(sum(len(f) for f in mine[0]), counts, dst=0)
    return mine[0], counts
""", "the right values, but the exercise asks for a list"),
]
