"""Notebook 13, the hybrid model.

`from_notebook` takes what a notebook's cells define (functions, classes, constants) straight
from the notebook's source, so that the answers here use exactly what a learner's do.
"""

import ast
from pathlib import Path

import torch
import torch.distributed.autograd as dist_autograd

from distlab.exercises import nb13

from . import RIGHT, Answer

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def from_notebook(stem: str, names: list[str], **namespace) -> dict:
    """The top-level definitions and assignments of ``names`` in notebook ``stem``'s code cells
    (the last one of each, as after a top-to-bottom run), executed in order in ``namespace``."""
    import nbformat

    nb = nbformat.read(NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    wanted, nodes = set(names), {}
    for cell in nb.cells:
        if cell.cell_type != "code" or cell.source.lstrip().startswith("%"):
            continue
        for node in ast.parse(cell.source).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined = {node.name}
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                defined = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            else:
                continue
            for name in defined & wanted:
                nodes.pop(name, None)
                nodes[name] = node
    missing = wanted - set(nodes)
    assert not missing, f"{stem} defines no {sorted(missing)}"
    ns = dict(namespace)
    done = set()
    for node in nodes.values():
        if id(node) not in done:
            done.add(id(node))
            exec(compile(ast.Module([node], []), f"<{stem}>", "exec"), ns)
    return {name: ns[name] for name in names}


_PIECES = from_notebook(
    "13_rpc_hybrid_model",
    ["NUM_EM_ROW", "D_SPARSE", "D_DENSE", "D_HID", "D_OUT", "NUM_TRAINERS", "FeatureSet",
     "getLinear", "RemoteEM", "RemoteNet", "get_training_examples", "reference_grads",
     "microbatches"],
    torch=torch, nn=torch.nn, NamedTuple=__import__("typing").NamedTuple,
)

#: What the trainers reported in the notebook's uneven run (its ``uneven``): per trainer,
#: (DDP gradients (fc1, fc2), non-DDP gradients).
UNEVEN = [
    ((torch.tensor([[0.0, 12.0], [0.0, 4.0]]), torch.tensor([[0.0, 14.0, 14.0]])), ()),
    ((torch.tensor([[0.0, 12.0], [0.0, 4.0]]), torch.tensor([[0.0, 14.0, 14.0]])), ()),
    ((torch.tensor([[2.0, -2.0], [-2.0, 2.0]]), torch.tensor([[7.0, 0.0, 0.0]])), ()),
    ((torch.tensor([[2.0, -2.0], [-2.0, 2.0]]), torch.tensor([[7.0, 0.0, 0.0]])), ()),
]

GRADERS = {
    1: (nb13.exercise_1, ["predict_second_microbatch", "uneven"]),
    2: (nb13.exercise_2, ["em_grad_on_owner"]),
}

GIVEN = {
    **_PIECES,
    "examples": _PIECES["get_training_examples"](),
    "uneven": UNEVEN,
    "dist_autograd": dist_autograd,
}

ANSWERS = [
    Answer(1, "the solution", """
def predict_second_microbatch():
    second = [reference_grads(microbatches(examples[r])[1], examples[r].values) for r in (2, 3)]
    return tuple(sum(g[name] for g in second) / NUM_TRAINERS for name in ("fc1", "fc2"))
""", RIGHT),
    Answer(1, "divides by the 2 trainers still running", """
def predict_second_microbatch():
    second = [reference_grads(microbatches(examples[r])[1], examples[r].values) for r in (2, 3)]
    return tuple(sum(g[name] for g in second) / 2 for name in ("fc1", "fc2"))
""", "exactly 2x what they reported"),
    Answer(1, "sums, never divides", """
def predict_second_microbatch():
    second = [reference_grads(microbatches(examples[r])[1], examples[r].values) for r in (2, 3)]
    return tuple(sum(g[name] for g in second) for name in ("fc1", "fc2"))
""", "exactly 4x what they reported"),
    Answer(1, "the micro-batch's own values in the loss, not the full batch's", """
def predict_second_microbatch():
    second = [reference_grads(mb, mb.values) for mb in
              (microbatches(examples[r])[1] for r in (2, 3))]
    return tuple(sum(g[name] for g in second) / NUM_TRAINERS for name in ("fc1", "fc2"))
""", "what trainers 2 and 3 reported"),
    Answer(1, "the first micro-batch instead of the second", """
def predict_second_microbatch():
    first = [reference_grads(microbatches(examples[r])[0], examples[r].values) for r in (2, 3)]
    return tuple(sum(g[name] for g in first) / NUM_TRAINERS for name in ("fc1", "fc2"))
""", "what trainers 2 and 3 reported"),
    Answer(1, "fc2 first", """
def predict_second_microbatch():
    second = [reference_grads(microbatches(examples[r])[1], examples[r].values) for r in (2, 3)]
    return tuple(sum(g[name] for g in second) / NUM_TRAINERS for name in ("fc2", "fc1"))
""", "that is fc2's shape"),
    Answer(1, "an empty tuple", """
def predict_second_microbatch():
    return ()
""", "a tuple of 2 tensors"),
    Answer(2, "the solution", """
def em_grad_on_owner(remote_em_rref, context_id):
    return dist_autograd.get_gradients(context_id)[remote_em_rref.local_value().em.weight]
""", RIGHT),
    Answer(2, "reads .grad, which distributed autograd leaves alone", """
def em_grad_on_owner(remote_em_rref, context_id):
    return remote_em_rref.local_value().em.weight.grad
""", "came back as None"),
    Answer(2, "the whole dict of the context's gradients (a TypeError in the old test)", """
def em_grad_on_owner(remote_em_rref, context_id):
    return dist_autograd.get_gradients(context_id)
""", "came back as a dict"),
    Answer(2, "the weight, not its gradient", """
def em_grad_on_owner(remote_em_rref, context_id):
    return remote_em_rref.local_value().em.weight.detach()
""", "the table's weight itself"),
    Answer(2, "the first gradient of the context, whichever it is", """
def em_grad_on_owner(remote_em_rref, context_id):
    return next(iter(dist_autograd.get_gradients(context_id).values()))
""", "should"),
    Answer(2, "a list instead of a tensor", """
def em_grad_on_owner(remote_em_rref, context_id):
    grads = dist_autograd.get_gradients(context_id)
    return grads[remote_em_rref.local_value().em.weight].tolist()
""", "should be a float32 tensor of shape (2, 3)"),
]
