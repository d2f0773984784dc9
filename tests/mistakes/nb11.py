"""Notebook 11, DDP and the parameters it waits for."""

import torch
from torch import nn

from distlab.exercises import nb11

from . import RIGHT, Answer

GRADERS = {
    1: (nb11.exercise_1, ["UsedAndFrozen"]),
    2: (nb11.exercise_2, ["Branchy", "BRANCHY_DDP_KWARGS"]),
    3: (nb11.exercise_3, ["my_prediction"]),
}

# What the notebook's cells define before the exercises; defined in a module of its own name so
# that they travel to the ranks by value, as a cell's do.
_NOTEBOOK = '''
class UsedAndUnused(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(2, 2)
        self.unused = nn.Linear(2, 2)  # never called in forward

    def forward(self, x):
        return self.used(x)


def uneven_reference(divide_by_initial_world_size=True, lr=0.1):
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    batches = []
    for rank in range(2):
        torch.manual_seed(1 + rank)
        batches.append([torch.randn(4, 2) for _ in range(3 + rank)])
    for step in range(4):
        grads = []
        for rank in range(2):
            if step < len(batches[rank]):
                model.zero_grad()
                model(batches[rank][step]).sum().backward()
                grads.append([p.grad.clone() for p in model.parameters()])
        divisor = 2 if divide_by_initial_world_size else len(grads)
        with torch.no_grad():
            for i, p in enumerate(model.parameters()):
                p -= lr * sum(g[i] for g in grads) / divisor
    return [p.detach() for p in model.parameters()]
'''
_given = {"__name__": "notebook_11", "torch": torch, "nn": nn}
exec(compile(_NOTEBOOK, "<notebook 11>", "exec"), _given)
GIVEN = {name: _given[name] for name in ("UsedAndUnused", "uneven_reference")}

_FROZEN = """
class UsedAndFrozen(UsedAndUnused):
    def __init__(self):
        super().__init__()
        {line}
"""

_BRANCHY = """
class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Linear(2, 2)
        self.extra = nn.Linear(2, 2)

    def forward(self, x):
        out = self.main(x)
        if {condition}:
            out = out + self.extra(x)
        return out


BRANCHY_DDP_KWARGS = {kwargs}
"""

ANSWERS = [
    Answer(1, "the solution", _FROZEN.format(line="self.unused.requires_grad_(False)"), RIGHT),
    Answer(1, "freezes the weight only", _FROZEN.format(
        line="self.unused.weight.requires_grad_(False)"), "['unused.bias']"),
    Answer(1, "freezes the used layer instead", _FROZEN.format(
        line="self.used.requires_grad_(False)"), "only unused should be frozen"),
    Answer(1, "deletes the layer", _FROZEN.format(line="del self.unused"),
           "keep the unused layer in the model"),
    Answer(1, "eval() does not freeze", _FROZEN.format(line="self.unused.eval()"),
           "parameters of unused still want a gradient"),
    Answer(1, "freezes everything", _FROZEN.format(line="self.requires_grad_(False)"),
           "only unused should be frozen"),
    Answer(2, "the solution", _BRANCHY.format(
        condition="x.sum() > 0", kwargs='{"find_unused_parameters": True}'), RIGHT),
    Answer(2, "no flag: the gradients are never averaged", _BRANCHY.format(
        condition="x.sum() > 0", kwargs="{}"),
        "not the average over the ranks: DDP never all-reduced"),
    Answer(2, "static_graph=True: right for one iteration only", _BRANCHY.format(
        condition="x.sum() > 0", kwargs='{"static_graph": True}'), "in iteration 1"),
    Answer(2, "the branch the wrong way round", _BRANCHY.format(
        condition="x.sum() < 0", kwargs='{"find_unused_parameters": True}'),
        "Branchy should use extra when x.sum() > 0"),
    Answer(2, "no branch at all", _BRANCHY.format(
        condition="True", kwargs='{"find_unused_parameters": True}'),
        "Branchy should skip extra"),
    Answer(2, "the flag as a set, not a dict", _BRANCHY.format(
        condition="x.sum() > 0", kwargs='{"find_unused_parameters"}'),
        "should be a dict of DDP's keyword arguments"),
    Answer(3, "the solution", """
def my_prediction():
    return uneven_reference(divide_by_initial_world_size=False)
""", RIGHT),
    Answer(3, "the default's result", """
def my_prediction():
    return uneven_reference()
""", "that is the default's result"),
    Answer(3, "an empty list (zip would pass it)", """
def my_prediction():
    return []
""", "should return a list of 2 tensors"),
    Answer(3, "the weight only", """
def my_prediction():
    return uneven_reference(divide_by_initial_world_size=False)[:1]
""", "should return a list of 2 tensors"),
    Answer(3, "lists of numbers, not tensors", """
def my_prediction():
    return [p.tolist() for p in uneven_reference(divide_by_initial_world_size=False)]
""", "your weight should be"),
    Answer(3, "three steps only: forgets rank 1's fourth", """
def my_prediction():
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    batches = []
    for rank in range(2):
        torch.manual_seed(1 + rank)
        batches.append([torch.randn(4, 2) for _ in range(3 + rank)])
    for step in range(3):
        model.zero_grad()
        for rank in range(2):
            (model(batches[rank][step]).sum() / 2).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
    return [p.detach() for p in model.parameters()]
""", "your weight should be"),
]
