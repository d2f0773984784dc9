"""Notebook 16, pipeline parallelism."""

from fractions import Fraction

from distlab.exercises import nb16

from . import RIGHT, Answer

GRADERS = {
    1: (nb16.exercise_1, ["smallest_m"]),
    2: (nb16.exercise_2, ["one_f_one_b", "cluster"]),
    3: (nb16.exercise_3, ["predict_looped_bfs", "cluster"]),
    4: (nb16.exercise_4, ["smallest_interleaved_m"]),
}

CLUSTER = {"world_size": 4, "threads": 1}
GIVEN = {"Fraction": Fraction}

ANSWERS = [
    Answer(1, "the answer", """
def smallest_m():
    return 27
""", RIGHT),
    Answer(1, "one short", """
def smallest_m():
    return 26
""", "above 0.1"),
    Answer(1, "enough, but not the smallest", """
def smallest_m():
    return 28
""", "a smaller m does too"),
    Answer(1, "forgot the p - 1 in the formula: 9 * 1", """
def smallest_m():
    return 9
""", "the bubble is 1/4"),
    Answer(1, "the bubble itself, not m", """
def smallest_m():
    return 0.1
""", "an int"),
    Answer(1, "a string", """
def smallest_m():
    return "27"
""", "an int"),
    Answer(2, "the solution", """
def one_f_one_b(rank, p, m):
    warmup = min(p - 1 - rank, m)
    order = [("F", rank, i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", rank, warmup + i), ("B", rank, i)]
    return order + [("B", rank, i) for i in range(m - warmup, m)]
""", RIGHT),
    Answer(2, "GPipe's order", """
def one_f_one_b(rank, p, m):
    return [("F", rank, i) for i in range(m)] + [("B", rank, i) for i in range(m)]
""", "one_f_one_b(1, 4, 4): action 3 should be ('B', 1, 0)"),
    Answer(2, "one forward too many in the warm-up", """
def one_f_one_b(rank, p, m):
    warmup = min(p - rank, m)
    order = [("F", rank, i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", rank, warmup + i), ("B", rank, i)]
    return order + [("B", rank, i) for i in range(m - warmup, m)]
""", "one_f_one_b(1, 4, 4): action 3 should be ('B', 1, 0)"),
    Answer(2, "the warm-up reversed: rank r runs r forwards first", """
def one_f_one_b(rank, p, m):
    warmup = min(rank, m)
    order = [("F", rank, i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", rank, warmup + i), ("B", rank, i)]
    return order + [("B", rank, i) for i in range(m - warmup, m)]
""", "one_f_one_b(0, 4, 4): action 1 should be ('F', 0, 1)"),
    Answer(2, "written for m = 4 only", """
def one_f_one_b(rank, p, m):
    warmup = p - 1 - rank
    order = [("F", rank, i) for i in range(warmup)]
    for i in range(4 - warmup):
        order += [("F", rank, warmup + i), ("B", rank, i)]
    return order + [("B", rank, i) for i in range(4 - warmup, 4)]
""", "one_f_one_b(0, 4, 5)"),
    Answer(2, "lists, not tuples", """
def one_f_one_b(rank, p, m):
    warmup = min(p - 1 - rank, m)
    order = [["F", rank, i] for i in range(warmup)]
    for i in range(m - warmup):
        order += [["F", rank, warmup + i], ["B", rank, i]]
    return order + [["B", rank, i] for i in range(m - warmup, m)]
""", "each as a list"),
    Answer(2, "microbatches numbered from 1", """
def one_f_one_b(rank, p, m):
    warmup = min(p - 1 - rank, m)
    order = [("F", rank, i + 1) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", rank, warmup + i + 1), ("B", rank, i + 1)]
    return order + [("B", rank, i + 1) for i in range(m - warmup, m)]
""", "action 0 should be ('F', 0, 0)"),
    Answer(2, "the steady state's backward before its forward", """
def one_f_one_b(rank, p, m):
    warmup = min(p - 1 - rank, m)
    order = [("F", rank, i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("B", rank, i), ("F", rank, warmup + i)]
    return order + [("B", rank, i) for i in range(m - warmup, m)]
""", "should be"),
    Answer(3, "the solution", """
def predict_looped_bfs():
    return Fraction(3, 19), 16
""", RIGHT),
    Answer(3, "the bubble as a float", """
def predict_looped_bfs():
    return 3 / 19, 16
""", "use fractions.Fraction"),
    Answer(3, "GPipe's bubble: interleaving forgotten", """
def predict_looped_bfs():
    return Fraction(3, 11), 16
""", "the bubble should be Fraction(3, 19)"),
    Answer(3, "Interleaved1F1B's peak", """
def predict_looped_bfs():
    return Fraction(3, 19), 11
""", "rank 0's peak should be 16; got 11"),
    Answer(3, "the microbatches, not the stage-microbatches", """
def predict_looped_bfs():
    return Fraction(3, 19), 8
""", "rank 0's peak should be 16; got 8"),
    Answer(3, "an empty tuple", """
def predict_looped_bfs():
    return ()
""", "should return (bubble, peak)"),
    Answer(4, "the answer", """
def smallest_interleaved_m():
    return 32
""", RIGHT),
    Answer(4, "the GPipe/1F1B answer for p = 8: v forgotten", """
def smallest_interleaved_m():
    return 63
""", "a smaller m does too"),
    Answer(4, "31: the formula's m, which torch refuses", """
def smallest_interleaved_m():
    return 31
""", "m = 31 cannot run"),
    Answer(4, "27: the p = 4 answer", """
def smallest_interleaved_m():
    return 27
""", "above 0.1"),
    Answer(4, "30", """
def smallest_interleaved_m():
    return 30
""", "0.104"),
]
