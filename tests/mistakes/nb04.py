"""Notebook 04, reduce and all_reduce."""

from distlab.exercises import nb04

from . import RIGHT, Answer

GRADERS = {
    1: (nb04.exercise_1, ["agree"]),
    2: (nb04.exercise_2, ["best_score"]),
    3: (nb04.exercise_3, ["shared_all_reduce"]),
}

BEST = """
def best_score(score):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    best = score.clone()
    dist.all_reduce(best, op=dist.ReduceOp.MAX)
    who = torch.tensor([rank if torch.equal(score, best) else world_size])
    dist.all_reduce(who, op=dist.ReduceOp.MIN)
    return best.item(), who.item()
"""

ANSWERS = [
    Answer(1, "the solution: BAND and BOR", """
def agree(done):
    everyone, anyone = torch.tensor([done]), torch.tensor([done])
    dist.all_reduce(everyone, op=dist.ReduceOp.BAND)
    dist.all_reduce(anyone, op=dist.ReduceOp.BOR)
    return everyone.item(), anyone.item()
""", RIGHT),
    Answer(1, "one SUM answers both questions", """
def agree(done):
    count = torch.tensor([int(done)])
    dist.all_reduce(count)
    return count.item() == dist.get_world_size(), count.item() > 0
""", RIGHT),
    Answer(1, "returns the tensors", """
def agree(done):
    everyone, anyone = torch.tensor([done]), torch.tensor([done])
    dist.all_reduce(everyone, op=dist.ReduceOp.BAND)
    dist.all_reduce(anyone, op=dist.ReduceOp.BOR)
    return everyone, anyone
""", "should be a bool: False; got a bool tensor of shape (1,): [False]"),
    Answer(1, "1 and 0 for True and False", """
def agree(done):
    everyone, anyone = torch.tensor([int(done)]), torch.tensor([int(done)])
    dist.all_reduce(everyone, op=dist.ReduceOp.MIN)
    dist.all_reduce(anyone, op=dist.ReduceOp.MAX)
    return everyone.item(), anyone.item()
""", "should be a bool: False; got an int: 0"),
    Answer(1, "BOR for both questions", """
def agree(done):
    everyone, anyone = torch.tensor([done]), torch.tensor([done])
    dist.all_reduce(everyone, op=dist.ReduceOp.BOR)
    dist.all_reduce(anyone, op=dist.ReduceOp.BOR)
    return everyone.item(), anyone.item()
""", "with ranks [0, 2] done, rank 0's (everyone, anyone)[0] should be False; got True"),
    Answer(1, "the two answers swapped", """
def agree(done):
    everyone, anyone = torch.tensor([done]), torch.tensor([done])
    dist.all_reduce(everyone, op=dist.ReduceOp.BAND)
    dist.all_reduce(anyone, op=dist.ReduceOp.BOR)
    return anyone.item(), everyone.item()
""", "should be False; got True"),
    Answer(1, "all_gather, then all() and any() in Python", """
def agree(done):
    flags = [torch.tensor([False]) for _ in range(dist.get_world_size())]
    dist.all_gather(flags, torch.tensor([done]))
    return all(f.item() for f in flags), any(f.item() for f in flags)
""", "called dist.all_gather: the exercise asks for all_reduce only"),
    Answer(2, "the solution", BEST, RIGHT),
    Answer(2, "the highest rank on a tie (MAX of the ranks)", """
def best_score(score):
    best = score.clone()
    dist.all_reduce(best, op=dist.ReduceOp.MAX)
    who = torch.tensor([dist.get_rank() if torch.equal(score, best) else -1])
    dist.all_reduce(who, op=dist.ReduceOp.MAX)
    return best.item(), who.item()
""", "should be 1; got 3 (a tie: ranks [1, 3] hold the best score"),
    Answer(2, "sums the ranks that hold the best", """
def best_score(score):
    best = score.clone()
    dist.all_reduce(best, op=dist.ReduceOp.MAX)
    who = torch.tensor([dist.get_rank() if torch.equal(score, best) else 0])
    dist.all_reduce(who)
    return best.item(), who.item()
""", "should be 1; got 4 (a tie"),
    Answer(2, "0 for the ranks without the best, then MIN", """
def best_score(score):
    best = score.clone()
    dist.all_reduce(best, op=dist.ReduceOp.MAX)
    who = torch.tensor([dist.get_rank() if torch.equal(score, best) else 0])
    dist.all_reduce(who, op=dist.ReduceOp.MIN)
    return best.item(), who.item()
""", "should be 1; got 0"),
    Answer(2, "all_gather the scores and take the argmax", """
def best_score(score):
    scores = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(scores, score)
    flat = torch.cat(scores)
    return flat.max().item(), int(flat.argmax())
""", "called dist.all_gather: the exercise asks for all_reduce only"),
    Answer(2, "returns tensors", """
def best_score(score):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    best = score.clone()
    dist.all_reduce(best, op=dist.ReduceOp.MAX)
    who = torch.tensor([rank if torch.equal(score, best) else world_size])
    dist.all_reduce(who, op=dist.ReduceOp.MIN)
    return best, who
""", "should be a float: 0.75; got a float32 tensor"),
    Answer(3, "the solution", """
def shared_all_reduce(paths):
    x = torch.from_file(paths[dist.get_rank()], shared=True, size=4, dtype=torch.float32)
    dist.all_reduce(x.view(2, 2))
""", RIGHT),
    Answer(3, "all-reduces a copy", """
def shared_all_reduce(paths):
    x = torch.from_file(paths[dist.get_rank()], shared=True, size=4, dtype=torch.float32)
    dist.all_reduce(x.view(2, 2).clone())
""", "still holds what it held before"),
    Answer(3, "maps the file without shared=True", """
def shared_all_reduce(paths):
    x = torch.from_file(paths[dist.get_rank()], size=4, dtype=torch.float32)
    dist.all_reduce(x)
""", "still holds what it held before"),
    Answer(3, "every rank maps rank 0's file", """
def shared_all_reduce(paths):
    x = torch.from_file(paths[0], shared=True, size=4, dtype=torch.float32)
    dist.all_reduce(x)
""", "the notebook's tensor of rank 0's file should be"),
    Answer(3, "AVG instead of SUM", """
def shared_all_reduce(paths):
    x = torch.from_file(paths[dist.get_rank()], shared=True, size=4, dtype=torch.float32)
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
""", "exactly 1/2x the expected"),
    Answer(3, "writes the answer of the notebook's example: twos", """
def shared_all_reduce(paths):
    x = torch.from_file(paths[dist.get_rank()], shared=True, size=4, dtype=torch.float32)
    x.fill_(2.0)
""", "never called dist.all_reduce"),
]
