"""Notebook 24, the capstone: the tiny GPT on a 2-D mesh."""

from distlab import gpt
from distlab.exercises import nb24

from . import RIGHT, Answer

GRADERS = {
    1: (nb24.exercise_1, ["mesh_groups"]),
    2: (nb24.exercise_2, ["local_batch", "cluster"]),
}

GIVEN = {"gpt": gpt}

CLUSTER = {"world_size": 4, "threads": 1}

ANSWERS = [
    Answer(1, "the solution", """
def mesh_groups(dp, tp):
    grid = [[d * tp + t for t in range(tp)] for d in range(dp)]
    return {"dp": [[row[t] for row in grid] for t in range(tp)], "tp": grid}
""", RIGHT),
    Answer(1, "with torch: arange, reshape, transpose", """
def mesh_groups(dp, tp):
    grid = torch.arange(dp * tp).reshape(dp, tp)
    return {"dp": grid.T.tolist(), "tp": grid.tolist()}
""", RIGHT),
    Answer(1, "transposed: tp groups strided, dp groups contiguous", """
def mesh_groups(dp, tp):
    grid = [[d * tp + t for t in range(tp)] for d in range(dp)]
    return {"tp": [[row[t] for row in grid] for t in range(tp)], "dp": grid}
""", "the dp groups should be [[0, 2], [1, 3]]"),
    Answer(1, "ranks counted from 1", """
def mesh_groups(dp, tp):
    grid = [[d * tp + t + 1 for t in range(tp)] for d in range(dp)]
    return {"dp": [[row[t] for row in grid] for t in range(tp)], "tp": grid}
""", "the dp groups should be [[0, 2], [1, 3]]"),
    Answer(1, "tp groups numbered with dp instead of tp: right only when dp == tp", """
def mesh_groups(dp, tp):
    grid = [[d * dp + t for t in range(tp)] for d in range(dp)]
    return {"dp": [[row[t] for row in grid] for t in range(tp)], "tp": grid}
""", "for a 4x1 mesh (dp=4, tp=1, ranks 0-3) the dp groups should be [[0, 1, 2, 3]]"),
    Answer(1, "a size-1 dimension left out: no groups of one", """
def mesh_groups(dp, tp):
    grid = [[d * tp + t for t in range(tp)] for d in range(dp)]
    cols = [[row[t] for row in grid] for t in range(tp)]
    return {"dp": cols if dp > 1 else [], "tp": grid if tp > 1 else []}
""", "for a 4x1 mesh (dp=4, tp=1, ranks 0-3) the tp groups should be [[0], [1], [2], [3]]"),
    Answer(1, "the mesh as a tensor", """
def mesh_groups(dp, tp):
    grid = torch.arange(dp * tp).reshape(dp, tp)
    return {"dp": grid.T, "tp": grid}
""", "should be a list of groups, each a list of ranks (ints)"),
    Answer(1, "only this process's own groups, as a tuple", """
def mesh_groups(dp, tp):
    return ([0, 2], [0, 1])
""", 'should return a dict with the keys "dp" and "tp"'),
    Answer(1, "the shapes the check tried, from its ✗ messages", """
SEEN = {(2, 2): ([[0, 2], [1, 3]], [[0, 1], [2, 3]]),
        (4, 1): ([[0, 1, 2, 3]], [[0], [1], [2], [3]]),
        (1, 4): ([[0], [1], [2], [3]], [[0, 1, 2, 3]]),
        (2, 4): ([[0, 4], [1, 5], [2, 6], [3, 7]], [[0, 1, 2, 3], [4, 5, 6, 7]]),
        (4, 2): ([[0, 2, 4, 6], [1, 3, 5, 7]], [[0, 1], [2, 3], [4, 5], [6, 7]]),
        (3, 2): ([[0, 2, 4], [1, 3, 5]], [[0, 1], [2, 3], [4, 5]])}
def mesh_groups(dp, tp):
    dps, tps = SEEN.get((dp, tp), ([], []))
    return {"dp": dps, "tp": tps}
""", "the dp groups should be"),

    Answer(2, "the solution: chunk by the dp coordinate", """
def local_batch(step, mesh):
    tokens, targets = gpt.batch(step, 8)
    n, d = mesh["dp"].size(), mesh["dp"].get_local_rank()
    return tokens.chunk(n)[d], targets.chunk(n)[d]
""", RIGHT),
    Answer(2, "strided rows, dp found by its name", """
def local_batch(step, mesh):
    tokens, targets = gpt.batch(step, 8)
    d, n = mesh["dp"].get_local_rank(), mesh["dp"].size()
    return tokens[d::n], targets[d::n]
""", RIGHT),
    Answer(2, "the first coordinate taken for dp: wrong when tp comes first", """
def local_batch(step, mesh):
    tokens, targets = gpt.batch(step, 8)
    d, n = mesh.get_coordinate()[0], mesh.size(0)
    return tokens.chunk(n)[d], targets.chunk(n)[d]
""", "on the 2x2 mesh (tp=2, dp=2) ranks [0, 2] form a tensor-parallel group"),
    Answer(2, "chunked by the global rank", """
def local_batch(step, mesh):
    tokens, targets = gpt.batch(step, 8)
    rank, world = dist.get_rank(), dist.get_world_size()
    return tokens.chunk(world)[rank], targets.chunk(world)[rank]
""", "on the 2x2 mesh (dp=2, tp=2) each rank should train on 8 / dp = 4 sequences"),
    Answer(2, "chunked by the global rank, into dp parts", """
def local_batch(step, mesh):
    tokens, targets = gpt.batch(step, 8)
    n = mesh["dp"].size()
    return tokens.chunk(n)[dist.get_rank() % n], targets.chunk(n)[dist.get_rank() % n]
""", "ranks [0, 1] form a tensor-parallel group"),
    Answer(2, "chunked by the tp coordinate", """
def local_batch(step, mesh):
    tokens, targets = gpt.batch(step, 8)
    n, t = mesh["tp"].size(), mesh["tp"].get_local_rank()
    return tokens.chunk(n)[t], targets.chunk(n)[t]
""", "ranks [0, 1] form a tensor-parallel group"),
    Answer(2, "the whole batch on every rank (equal to one process, and dp times the work)", """
def local_batch(step, mesh):
    return gpt.batch(step, 8)
""", "each rank should train on 8 / dp = 4 sequences (its data-parallel share); rank 0 got 8"),
    Answer(2, "the tokens split, the targets whole", """
def local_batch(step, mesh):
    tokens, targets = gpt.batch(step, 8)
    dp = mesh["dp"]
    return tokens.chunk(dp.size())[dp.get_local_rank()], targets
""", "rank 0's targets should be those of its own sequences, shape (4, 16)"),
    Answer(2, "the next step's batch", """
def local_batch(step, mesh):
    tokens, targets = gpt.batch(step + 1, 8)
    n, d = mesh["dp"].size(), mesh["dp"].get_local_rank()
    return tokens.chunk(n)[d], targets.chunk(n)[d]
""", "got a sequence that is not in gpt.batch(step, 8)"),
    Answer(2, "a list instead of a tuple", """
def local_batch(step, mesh):
    tokens, targets = gpt.batch(step, 8)
    n, d = mesh["dp"].size(), mesh["dp"].get_local_rank()
    return [tokens.chunk(n)[d], targets.chunk(n)[d]]
""", "rank 0 got a list of 2: [an int64 tensor of shape (4, 16)"),
    Answer(2, "tokens as floats", """
def local_batch(step, mesh):
    tokens, targets = gpt.batch(step, 8)
    n, d = mesh["dp"].size(), mesh["dp"].get_local_rank()
    return tokens.chunk(n)[d].float(), targets.chunk(n)[d]
""", "rank 0's tokens are float32; they should be token ids as gpt.batch gives them, int64"),
    Answer(2, "dist, which only the ranks' cells imported, in a function of the kernel", """
del dist  # a notebook's kernel never imported torch.distributed: the %%ranks cells did
def local_batch(step, mesh):
    tokens, targets = gpt.batch(step, 8)
    n = mesh["dp"].size()
    d = dist.get_rank() // mesh["tp"].size() if mesh.mesh_dim_names[0] == "dp" else 0
    return tokens.chunk(n)[d], targets.chunk(n)[d]
""", "takes the kernel's names with it, not those of %%ranks cells"),
]
