"""The house's rooms stay small: no module of distlab over 600 lines, no function of the
calculators or the simulator (`distlab.calculators`, `distlab.scale`) over 80 (docstring
included), docstrings that name a sibling module name one that exists, no two classes of
distlab share a name, and `distlab.scale`'s naming rule is kept (``model`` is never the
``nn.Module``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "distlab"
MODULE_LINES, FUNCTION_LINES = 600, 80
#: Functions over the limit, each with why and until when.
OVER: set[tuple[str, str]] = set()


def _modules():
    return sorted(PACKAGE.rglob("*.py"))


@pytest.mark.quick
def test_no_module_is_over_600_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in _modules()
            if (n := len(p.read_text().splitlines())) > MODULE_LINES}
    assert not long, f"modules over {MODULE_LINES} lines (split them by concern): {long}"


@pytest.mark.quick
def test_no_function_of_the_calculators_or_the_simulator_is_over_80_lines():
    long = {}
    for path in _modules():
        where = path.relative_to(PACKAGE)
        if where.parts[0] not in ("calculators", "scale"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > FUNCTION_LINES and (str(where), node.name) not in OVER:
                    long[f"{where}:{node.name}"] = lines
    assert not long, f"functions over {FUNCTION_LINES} lines: {long}"


@pytest.mark.quick
def test_a_sibling_module_a_docstring_names_exists():
    """A module docstring's `name` in backticks that reads as a module of its own package
    (``"`memory_estimate`"``, ``"`pipeline`"``) names a file there."""
    wrong = []
    for path in _modules():
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        siblings = {p.stem for p in path.parent.glob("*.py")} | {
            p.name for p in path.parent.iterdir() if p.is_dir()}
        for name in re.findall(r"module `(\w+)`|\(module `(\w+)`\)", doc):
            name = next(n for n in name if n)
            if name not in siblings:
                wrong.append(f"{path.relative_to(PACKAGE)} names module {name!r}")
    assert not wrong, wrong


#: Class names two modules define, each with why a reader is not misled.
SAME_NAME = {
    # the layers of two models, each with its model (the tiny GPT's and the simulated Llama's),
    # as every model file in torchtitan or transformers has its own Attention
    "Attention": ("distlab.gpt", "distlab.scale.model"),
    "Block": ("distlab.gpt", "distlab.scale.model"),
}


def _classes() -> dict[str, list[str]]:
    """class name -> the modules of distlab that define it (``distlab.timeline.metrics``)."""
    found: dict[str, list[str]] = {}
    for path in _modules():
        parts = ("distlab", *path.relative_to(PACKAGE).with_suffix("").parts)
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(module)
    return found


@pytest.mark.quick
def test_no_two_classes_of_distlab_share_a_name():
    twice = {name: tuple(sorted(where)) for name, where in _classes().items()
             if len(where) > 1 and SAME_NAME.get(name) != tuple(sorted(where))}
    assert not twice, (
        f"classes with one name in two places (name each for what it is): {twice}")


#: What only an ``nn.Module`` does: read or called on a ``model`` in `distlab.scale`, it says
#: the module is called ``model`` there, against the naming rule in ``scale/__init__.py``.
_MODULE_ONLY = {"parameters", "named_parameters", "modules", "named_modules", "children",
                "state_dict", "to_empty", "register_forward_hook", "register_forward_pre_hook",
                "set_requires_gradient_sync", "layer_ids", "dp_mesh", "pp_group"}


def _module_called_model(tree: ast.Module) -> list[str]:
    """``model.parameters()``, ``self.model.to_empty``, ``stage_model.dp_mesh``, ``model(x)``:
    an ``nn.Module`` named model (the line and what gave it away)."""
    def is_model(node) -> bool:
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
        return name == "model" or name.endswith("_model")

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in _MODULE_ONLY and is_model(node.value):
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Call) and "model" in (getattr(node.func, "id", None),
                                                        getattr(node.func, "attr", None)):
            found.append(f"line {node.lineno}: called")
    return sorted(found)


@pytest.mark.quick
def test_scale_never_calls_the_nn_module_model():
    broken = {str(p.relative_to(PACKAGE)): uses for p in _modules()
              if p.relative_to(PACKAGE).parts[0] == "scale"
              and (uses := _module_called_model(ast.parse(p.read_text())))}
    assert not broken, (
        "in distlab.scale, `model` is a preset's name or a Transformer config and the nn.Module "
        f"is `module` (scale/__init__.py): {broken}")


def test_the_naming_check_sees_a_module_called_model():
    assert _module_called_model(ast.parse(
        "def f(model, config):\n"
        "    model.set_requires_gradient_sync(True)\n"
        "    return model(x), self.model.parameters(), stage_model.dp_mesh, get_model(config)\n"
    )) == ["line 2: .set_requires_gradient_sync", "line 3: .dp_mesh", "line 3: .parameters",
           "line 3: called"]


@pytest.mark.quick
def test_no_class_of_scale_calls_a_mesh_axis_dim():
    """``dim`` is a tensor dimension; a class's field or property named so holds a mesh axis
    (`CollectiveCall.axis` had a ``dim`` alias once)."""
    found = []
    for path in _modules():
        if path.relative_to(PACKAGE).parts[0] != "scale":
            continue
        for cls in ast.walk(ast.parse(path.read_text())):
            if not isinstance(cls, ast.ClassDef):
                continue
            for node in cls.body:
                named = (node.target.id if isinstance(node, ast.AnnAssign)
                         and isinstance(node.target, ast.Name) else getattr(node, "name", None))
                if named == "dim":
                    found.append(f"{path.relative_to(PACKAGE)}: {cls.name}.dim")
    assert not found, f"a mesh axis is `axis` in distlab.scale: {found}"
