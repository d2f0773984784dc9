"""Notebook 17, checkpoints and failures."""

from distlab.exercises import nb17

from . import RIGHT, Answer

GRADERS = {
    1: (nb17.exercise_1, ["predicted_rows"]),
    2: (nb17.exercise_2, ["predicted_restart"]),
}

ANSWERS = [
    Answer(1, "the solution", """
def predicted_rows():
    return {"0.weight": [6, 6, 4], "2.weight": [2, 2, 0]}
""", RIGHT),
    Answer(1, "the remainder on the last rank (floor division)", """
def predicted_rows():
    return {"0.weight": [5, 5, 6], "2.weight": [1, 1, 2]}
""", "0.weight's rows per rank[0] should be 6; got 5"),
    Answer(1, "numpy's array_split: the first ranks take the remainder", """
def predicted_rows():
    return {"0.weight": [6, 5, 5], "2.weight": [2, 1, 1]}
""", "0.weight's rows per rank[1] should be 6; got 5"),
    Answer(1, "16 / 3 rounded", """
def predicted_rows():
    return {"0.weight": [5, 5, 5], "2.weight": [1, 1, 1]}
""", "your rows add up to 15"),
    Answer(1, "rank 0's rows only", """
def predicted_rows():
    return {"0.weight": 6, "2.weight": 2}
""", "one number per rank"),
    Answer(1, "the module's name, not the parameter's", """
def predicted_rows():
    return {"0": [6, 6, 4], "2": [2, 2, 0]}
""", "should have the keys ['0.weight', '2.weight']"),
    Answer(1, "an empty dict", """
def predicted_rows():
    return {}
""", "should have the keys"),
    Answer(1, "tuples", """
def predicted_rows():
    return {"0.weight": (6, 6, 4), "2.weight": (2, 2, 0)}
""", "asks for a list"),
    Answer(2, "the solution", """
def predicted_restart():
    return 3, 2
""", RIGHT),
    Answer(2, "thinks step 6's checkpoint exists", """
def predicted_restart():
    return 6, 0
""", "it resumes from step 3, not 6"),
    Answer(2, "step 3 counted as redone", """
def predicted_restart():
    return 3, 3
""", "steps 4 to 5 are done twice: 2, not 3"),
    Answer(2, "every=2's answer", """
def predicted_restart():
    return 4, 1
""", "it resumes from step 3, not 4"),
    Answer(2, "thinks step 5 was saved", """
def predicted_restart():
    return 5, 0
""", "saved after steps [3]"),
    Answer(2, "floats", """
def predicted_restart():
    return 3.0, 2.0
""", "should be an int like 3"),
    Answer(2, "a single number", """
def predicted_restart():
    return 3
""", "a tuple of 2 ints"),
]
