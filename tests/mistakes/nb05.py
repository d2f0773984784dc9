"""Notebook 05, all_gather, reduce_scatter and all_to_all."""

from distlab.exercises import nb05

from . import RIGHT, Answer

GRADERS = {
    1: (nb05.exercise_1, ["all_reduce_any"]),
    2: (nb05.exercise_2, ["all_gather_uneven"]),
    3: (nb05.exercise_3, ["all_gather_via_a2a"]),
}

# What the attempt cell of exercise 1 defines above the learner's answer.
RS_AG = """
def all_reduce_via_rs_ag(t):
    shard = torch.empty(t.numel() // dist.get_world_size())
    dist.reduce_scatter_single(shard, t)
    full = torch.empty_like(t)
    dist.all_gather_single(full, shard)
    return full
"""

ANSWERS = [
    Answer(1, "the solution", RS_AG + """
def all_reduce_any(t):
    n, world_size = t.numel(), dist.get_world_size()
    padded_n = -(-n // world_size) * world_size
    padded = torch.cat([t.flatten(), t.new_zeros(padded_n - n)])
    return all_reduce_via_rs_ag(padded)[:n].view_as(t)
""", RIGHT),
    Answer(1, "dist.all_reduce itself", RS_AG + """
def all_reduce_any(t):
    t = t.clone()
    dist.all_reduce(t)
    return t
""", "called dist.all_reduce"),
    Answer(1, "pads but does not trim", RS_AG + """
def all_reduce_any(t):
    n, world_size = t.numel(), dist.get_world_size()
    padded_n = -(-n // world_size) * world_size
    return all_reduce_via_rs_ag(torch.cat([t, t.new_zeros(padded_n - n)]))
""", "should have shape (7,); got shape (8,)"),
    Answer(1, "no padding: 7 does not divide by 4", RS_AG + """
def all_reduce_any(t):
    return all_reduce_via_rs_ag(t)
""", "your code failed on the ranks"),
    Answer(1, "one zero of padding, right for 7 elements only", RS_AG + """
def all_reduce_any(t):
    return all_reduce_via_rs_ag(torch.cat([t, t.new_zeros(1)]))[:-1]
""", "your code failed on the ranks"),
    Answer(2, "the solution", """
def all_gather_uneven(t):
    world_size = dist.get_world_size()
    size = torch.tensor([t.numel()])
    sizes = [torch.zeros_like(size) for _ in range(world_size)]
    dist.all_gather(sizes, size)
    longest = int(max(sizes))
    padded = torch.cat([t, t.new_zeros(longest - t.numel())])
    slots = [torch.empty(longest) for _ in range(world_size)]
    dist.all_gather(slots, padded)
    return [s[: int(n)] for s, n in zip(slots, sizes)]
""", RIGHT),
    Answer(2, "lengths written in: rank r holds r + 1 elements", """
def all_gather_uneven(t):
    world_size = dist.get_world_size()
    padded = torch.cat([t, t.new_zeros(world_size - t.numel())])
    slots = [torch.empty(world_size) for _ in range(world_size)]
    dist.all_gather(slots, padded)
    return [s[: r + 1] for r, s in enumerate(slots)]
""", "your code failed on the ranks"),
    Answer(2, "lengths written in, padded to the longest it learnt", """
def all_gather_uneven(t):
    world_size = dist.get_world_size()
    size = torch.tensor([t.numel()])
    sizes = [torch.zeros_like(size) for _ in range(world_size)]
    dist.all_gather(sizes, size)
    longest = int(max(sizes))
    slots = [torch.empty(longest) for _ in range(world_size)]
    dist.all_gather(slots, torch.cat([t, t.new_zeros(longest - t.numel())]))
    return [s[: r + 1] for r, s in enumerate(slots)]
""", "rank 0's piece 0 has 1 elements; rank 0's piece has 3"),
    Answer(2, "all_gather of unequal sizes", """
def all_gather_uneven(t):
    slots = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(slots, t)
    return slots
""", "your code failed on the ranks"),
    Answer(2, "forgets to trim the padding", """
def all_gather_uneven(t):
    world_size = dist.get_world_size()
    size = torch.tensor([t.numel()])
    sizes = [torch.zeros_like(size) for _ in range(world_size)]
    dist.all_gather(sizes, size)
    longest = int(max(sizes))
    slots = [torch.empty(longest) for _ in range(world_size)]
    dist.all_gather(slots, torch.cat([t, t.new_zeros(longest - t.numel())]))
    return slots
""", "rank 0's piece 0 has 5 elements; rank 0's piece has 3"),
    Answer(2, "returns one tensor, the pieces end to end", """
def all_gather_uneven(t):
    world_size = dist.get_world_size()
    size = torch.tensor([t.numel()])
    sizes = [torch.zeros_like(size) for _ in range(world_size)]
    dist.all_gather(sizes, size)
    longest = int(max(sizes))
    slots = [torch.empty(longest) for _ in range(world_size)]
    dist.all_gather(slots, torch.cat([t, t.new_zeros(longest - t.numel())]))
    return torch.cat([s[: int(n)] for s, n in zip(slots, sizes)])
""", "returned a tensor"),
    Answer(3, "the solution", """
def all_gather_via_a2a(x):
    out = torch.empty(dist.get_world_size() * x.numel())
    dist.all_to_all_single(out, x.repeat(dist.get_world_size()))
    return out
""", RIGHT),
    Answer(3, "all_gather_single itself", """
def all_gather_via_a2a(x):
    out = torch.empty(dist.get_world_size() * x.numel())
    dist.all_gather_single(out, x)
    return out
""", "called dist.all_gather_single"),
    Answer(3, "sends x once, not once per rank", """
def all_gather_via_a2a(x):
    out = torch.empty(dist.get_world_size() * x.numel())
    dist.all_to_all_single(out, x)
    return out
""", "your code failed on the ranks"),
    Answer(3, "one row per rank: shape (world_size, n)", """
def all_gather_via_a2a(x):
    out = torch.empty(dist.get_world_size() * x.numel())
    dist.all_to_all_single(out, x.repeat(dist.get_world_size()))
    return out.view(dist.get_world_size(), -1)
""", "should have shape (8,); got shape (4, 2)"),
    Answer(3, "the list form, all_to_all", """
def all_gather_via_a2a(x):
    world_size = dist.get_world_size()
    received = [torch.empty_like(x) for _ in range(world_size)]
    dist.all_to_all(received, [x] * world_size)
    return torch.cat(received)
""", "called dist.all_to_all"),
]
