"""Notebook 00, launching from a notebook."""

from distlab.exercises import nb00

from . import RIGHT, Answer

GRADERS = {
    1: (nb00.exercise_1, ["gather_ranks"]),
    2: (nb00.exercise_2, ["my_prediction"]),
    3: (nb00.exercise_3, ["sum_pushed_values", "cluster"]),
}

ANSWERS = [
    Answer(1, "the solution", """
def gather_ranks():
    mine = torch.tensor([dist.get_rank()])
    everyone = [torch.zeros(1, dtype=torch.long) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    return [int(t) for t in everyone]
""", RIGHT),
    Answer(1, "no collective: builds the list itself", """
def gather_ranks():
    return list(range(dist.get_world_size()))
""", "rank 0 should use all_gather"),
    Answer(1, "returns the tensors, not ints", """
def gather_ranks():
    everyone = [torch.zeros(1, dtype=torch.long) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, torch.tensor([dist.get_rank()]))
    return everyone
""", "rank 0's list[0] should be an int"),
    Answer(1, "float32 slots for an int64 rank (the dtype trap)", """
def gather_ranks():
    everyone = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, torch.tensor([dist.get_rank()]))
    return [int(t) for t in everyone]
""", "different dtypes"),
    Answer(1, "only its own rank", """
def gather_ranks():
    return [dist.get_rank()]
""", "should have 4 entries"),
    Answer(1, "all_reduce instead of all_gather", """
def gather_ranks():
    t = torch.tensor([dist.get_rank()])
    dist.all_reduce(t)
    return [int(t)] * dist.get_world_size()
""", "should be 0; got 6"),
    Answer(1, "off by one: ranks counted from 1", """
def gather_ranks():
    everyone = [torch.zeros(1, dtype=torch.long) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, torch.tensor([dist.get_rank() + 1]))
    return [int(t) for t in everyone]
""", "should be 0; got 1"),
    Answer(1, "all_gather on rank 0 only: a hang", """
def gather_ranks():
    everyone = [torch.zeros(1, dtype=torch.long) for _ in range(dist.get_world_size())]
    if dist.get_rank() == 0:
        dist.all_gather(everyone, torch.tensor([0]))
    return [int(t) for t in everyone]
""", "hangs: rank 0 at line 5 in gather_ranks"),
    Answer(2, "the right prediction", """
def my_prediction():
    return 2, "ZeroDivisionError", [0, 1]
""", RIGHT),
    Answer(2, "an empty tuple (zip would pass it)", """
def my_prediction():
    return ()
""", "should return a tuple of 3"),
    Answer(2, "the exception class instead of its name", """
def my_prediction():
    return 2, ZeroDivisionError, [0, 1]
""", "as a string, like 'ZeroDivisionError'"),
    Answer(2, "blames rank 0", """
def my_prediction():
    return 0, "ZeroDivisionError", [1, 2]
""", "primary_rank should be 2; got 0"),
    Answer(2, "the stopped ranks as a tuple", """
def my_prediction():
    return 2, "ZeroDivisionError", (0, 1)
""", "stopped should be a list of 2"),
    Answer(2, "thinks nobody is stopped", """
def my_prediction():
    return 2, "ZeroDivisionError", []
""", "stopped should have 2 entries"),
    Answer(3, "the solution", """
def sum_pushed_values():
    cluster.push(ranks=[0], v=torch.tensor([10.0]))
    cluster.push(ranks=[1], v=torch.tensor([32.0]))
    cluster.exec("dist.all_reduce(v)")
    return cluster.pull("v")
""", RIGHT),
    Answer(3, "all_reduce on one rank only: a hang that breaks the cluster", """
def sum_pushed_values():
    cluster.push(ranks=[0], v=torch.tensor([10.0]))
    cluster.push(ranks=[1], v=torch.tensor([32.0]))
    cluster.exec("dist.all_reduce(v)", ranks=[0])
    return cluster.pull("v")
""", "hangs"),
    Answer(3, "pushes the same value to both ranks", """
def sum_pushed_values():
    cluster.push(v=torch.tensor([10.0]))
    cluster.exec("dist.all_reduce(v)")
    return cluster.pull("v")
""", "v on rank 0 should be [42.0]; got [20.0]"),
    Answer(3, "forgets the all_reduce", """
def sum_pushed_values():
    cluster.push(ranks=[0], v=torch.tensor([10.0]))
    cluster.push(ranks=[1], v=torch.tensor([32.0]))
    return cluster.pull("v")
""", "v on rank 0 should be [42.0]; got [10.0]"),
    Answer(3, "returns the values as floats", """
def sum_pushed_values():
    cluster.push(ranks=[0], v=torch.tensor([10.0]))
    cluster.push(ranks=[1], v=torch.tensor([32.0]))
    cluster.exec("dist.all_reduce(v)")
    return [t.item() for t in cluster.pull("v")]
""", "v on rank 0 should be a float32 tensor like tensor([42.]); it is a float: 42.0"),
    Answer(3, "int tensors: [10] and [32]", """
def sum_pushed_values():
    cluster.push(ranks=[0], v=torch.tensor([10]))
    cluster.push(ranks=[1], v=torch.tensor([32]))
    cluster.exec("dist.all_reduce(v)")
    return cluster.pull("v")
""", "v on rank 0 should be a float32 tensor like tensor([42.]); it is an int64 tensor"),
]
