"""Notebook 18, debugging a distributed job."""

from distlab.exercises import nb18

from . import RIGHT, Answer

GRADERS = {
    1: (nb18.exercise_1, ["named_with_default", "cluster"]),
    2: (nb18.exercise_2, ["stopped_early", "dumps", "short_name"]),
    3: (nb18.exercise_3, ["predicted_aspect", "cluster"]),
}

CLUSTER = {"world_size": 3}

#: Like the notebook's dumps: on the "short" group (named "1"), rank 0 called 4 collectives,
#: ranks 1 and 2 called 3.
GIVEN = {"dumps": nb18._synthetic({"1": [4, 3, 3]}), "short_name": "1"}

ANSWERS = [
    Answer(1, "the solution", """
def named_with_default():
    return {1}
""", RIGHT),
    Answer(1, "both missing ranks: wait_all_ranks=True's answer", """
def named_with_default():
    return {1, 2}
""", "rank 0 named {1}, not {1, 2}"),
    Answer(1, "the last rank", """
def named_with_default():
    return {2}
""", "rank 0 named {1}, not {2}"),
    Answer(1, "rank 0 itself", """
def named_with_default():
    return {0}
""", "rank 0 named {1}, not {0}"),
    Answer(1, "a list", """
def named_with_default():
    return [1]
""", "should be a set of ranks"),
    Answer(1, "an int", """
def named_with_default():
    return 1
""", "should be a set of ranks (ints)"),
    Answer(1, "ranks as strings", """
def named_with_default():
    return {"1"}
""", "should hold ranks as ints"),
    Answer(2, "the solution", """
def stopped_early(dumps, group_name):
    last = {r: int(d["pg_status"][group_name]["last_enqueued_collective"])
            for r, d in enumerate(dumps)}
    return {r for r, n in last.items() if n == min(last.values())}
""", RIGHT),
    Answer(2, "a list (the set's members, in order)", """
def stopped_early(dumps, group_name):
    last = [d["pg_status"][group_name]["last_enqueued_collective"] for d in dumps]
    return [r for r, n in enumerate(last) if n == min(last)]
""", "should be a set of ranks"),
    Answer(2, "the rank that went furthest", """
def stopped_early(dumps, group_name):
    last = [d["pg_status"][group_name]["last_enqueued_collective"] for d in dumps]
    return {r for r, n in enumerate(last) if n == max(last)}
""", "ranks {1, 2} stopped first; your function says {0}"),
    Answer(2, "only the first rank with the smallest number", """
def stopped_early(dumps, group_name):
    last = [d["pg_status"][group_name]["last_enqueued_collective"] for d in dumps]
    return {last.index(min(last))}
""", "ranks {1, 2} stopped first; your function says {1}"),
    Answer(2, "the default group, whatever group_name says", """
def stopped_early(dumps, group_name):
    last = [d["pg_status"][next(iter(d["pg_status"]))]["last_enqueued_collective"] for d in dumps]
    return {r for r, n in enumerate(last) if n == min(last)}
""", "stopped first; your function says"),
    Answer(2, "counts every entry of every group", """
def stopped_early(dumps, group_name):
    last = [len(d["entries"]) for d in dumps]
    return {r for r, n in enumerate(last) if n == min(last)}
""", "stopped first; your function says"),
    Answer(2, "ranks as strings", """
def stopped_early(dumps, group_name):
    last = {str(r): d["pg_status"][group_name]["last_enqueued_collective"]
            for r, d in enumerate(dumps)}
    return {r for r, n in last.items() if n == min(last.values())}
""", "should hold ranks as ints"),
    Answer(3, "the solution", """
def predicted_aspect():
    return "Tensor dtypes"
""", RIGHT),
    Answer(3, "an empty string (a substring of everything)", """
def predicted_aspect():
    return ""
""", "should be exactly one of"),
    Answer(3, "half the name", """
def predicted_aspect():
    return "Tensor"
""", "should be exactly one of"),
    Answer(3, "shapes", """
def predicted_aspect():
    return "Tensor shapes"
""", "not 'Tensor shapes'"),
    Answer(3, "the op", """
def predicted_aspect():
    return "Op type"
""", "not 'Op type'"),
    Answer(3, "lower case", """
def predicted_aspect():
    return "tensor dtypes"
""", "did you mean 'Tensor dtypes'?"),
]
