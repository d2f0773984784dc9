"""distlab's imports, read from the source (`ast`, nothing imported): the layers go one way.

- No circle between distlab's modules, counting imports at module level and inside functions.
- Every module stands on a floor (`FLOORS`) and imports nothing from a floor above its own:
  the checks and the torch door know no ranks, the ranks' machinery no tool, a tool neither
  the exercises nor the package itself (``from .. import launch`` is an import of `distlab`).
- Every "knows nothing about X" in a module's docstring is true: the module does not import X.
- torch's private code is reached only through the door (`distlab._torch`, `distlab._torch_*`).
- The README's "Where things are" names every module.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import distlab

PACKAGE = Path(distlab.__file__).parent
README = PACKAGE.parent / "README.md"


def _modules() -> dict[str, Path]:
    """``{"distlab.scale.plans": path}`` for every module of distlab (packages by their name)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("distlab", *path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _package_of(name: str) -> str:
    return name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]


def _imported(name: str, tree: ast.Module) -> set[str]:
    """The modules ``name`` imports anywhere (module level, functions, classes), absolute names.
    ``from a import b`` names ``a.b`` when that is a module of distlab, else ``a``; for other
    packages it names both (``b`` may be a submodule: ``from torch.distributed.tensor import
    _redistribute``)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = _package_of(name).split(".")
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, *([base] if base else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in MODULES:
                    out.add(full)
                elif base.split(".")[0] == "distlab":
                    out.add(base)
                else:
                    out.update((base, full))
    return out


TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}
IMPORTS = {name: _imported(name, tree) for name, tree in TREES.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None."""
    state, path = {}, []

    def visit(node):
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_distlab_modules_import_each_other_one_way_only():
    graph = {name: {m for m in imports if m in MODULES} for name, imports in IMPORTS.items()}
    cycle = _cycle(graph)
    assert cycle is None, "an import circle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_planted_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


# -- floors: imports run down, never up -------------------------------------------------------

#: distlab's floors, lowest first: a module may import its own floor and those below. Each
#: entry names modules, or packages with everything in them; ``distlab`` itself (the package
#: a learner imports) is only the top floor's.
FLOORS = (
    ("checks, errors and the torch door", (
        "distlab.errors", "distlab._readable", "distlab._config", "distlab._patience",
        "distlab._status", "distlab._output", "distlab._chart", "distlab._torch",
        "distlab._torch_dispatch", "distlab._torch_simulation")),
    ("the ranks' machinery", ("distlab._ranks",)),
    ("launching", ("distlab.launcher", "distlab.cluster", "distlab.magic")),
    ("the learner's tools", (
        "distlab.bounds", "distlab.pictures", "distlab._mesh_picture", "distlab._launch_picture",
        "distlab._grid_picture", "distlab.memory", "distlab.timeline", "distlab.stand_ins",
        "distlab.calculators", "distlab.scale", "distlab.gpt", "distlab.gradcheck",
        "distlab.activations", "distlab.flight_recorder", "distlab.faults")),
    ("the exercises", ("distlab.exercises",)),
    ("the front door", ("distlab", "distlab.__main__", "distlab.doctor")),
)


def _floor(name: str, floors=FLOORS) -> int | None:
    """The floor ``name`` stands on (its index in ``floors``), or None."""
    for i, (_, members) in enumerate(floors):
        if any(name == m or (m != "distlab" and name.startswith(m + ".")) for m in members):
            return i
    return None


def _upward(imports: dict[str, set[str]], floors=FLOORS) -> list[str]:
    """``"a (floor) imports b (floor above)"`` for every import that goes up."""
    out = []
    for name in sorted(imports):
        mine = _floor(name, floors)
        for other in sorted(imports[name]):
            theirs = _floor(other, floors)
            if mine is not None and theirs is not None and theirs > mine:
                out.append(f"{name} ({floors[mine][0]}) imports {other} ({floors[theirs][0]})")
    return out


def test_every_module_stands_on_one_floor():
    lost = sorted(name for name in MODULES if _floor(name) is None)
    assert not lost, f"put these in FLOORS (tests/test_imports.py): {lost}"


def test_imports_go_down_the_floors_never_up():
    up = _upward({name: {m for m in imports if m in MODULES} for name, imports in IMPORTS.items()})
    assert not up, "imports that go up a floor (move the code down, or pass it in): " + (
        "; ".join(up))


def test_the_floor_check_finds_a_planted_upward_import():
    planted = {"distlab._config": {"distlab._ranks.start_path"},  # a check that knows ranks
               "distlab.scale.lay_out": {"distlab"},  # ``from .. import launch``
               "distlab.launcher": {"distlab._ranks.group", "distlab.errors"}}  # down: fine
    assert _upward(planted) == [
        "distlab._config (checks, errors and the torch door) imports distlab._ranks.start_path "
        "(the ranks' machinery)",
        "distlab.scale.lay_out (the learner's tools) imports distlab (the front door)"]


# -- "knows nothing about X" ------------------------------------------------------------------

_C = "distlab.calculators."
_S = "distlab.scale."
_FORMULAS = tuple(_C + m for m in ("activation_terms", "comm", "links", "memory_estimate",
                                   "pipeline", "stepper"))
_DRAWING = (_C + "charts", _C + "_axes", "distlab._chart", "distlab.pictures",
            "distlab._mesh_picture", "distlab._launch_picture", "distlab._grid_picture",
            "matplotlib")
_SIMULATING = tuple(_S + m for m in ("simulate", "mesh", "measure", "plan_order", "plans",
                                     "instruments"))

#: (module, X as its docstring writes it) -> what the module must not import for that to be true
#: (a module, or a package and everything in it).
KNOWS_NOTHING = {
    ("distlab._config", "ranks"): ("distlab._ranks",),
    ("distlab._torch", "ranks, notebooks or the learner"): (
        "distlab._ranks", "distlab.exercises", "distlab.launcher", "distlab.cluster",
        "distlab.magic"),  # (distlab.errors, a leaf, is the one way every module refuses input)
    ("distlab._ranks.loopback", "ranks or process groups"): (
        "distlab._ranks.group", "distlab._ranks.rank", "distlab._ranks.protocol", "torch"),
    ("distlab._ranks.starter", "which path is taken"): (
        "distlab._ranks.start_path", "distlab._ranks.forkserver", "distlab._ranks.spawn",
        "distlab._ranks.forkserver_main", "distlab._ranks.forksafety"),
    ("distlab._torch_simulation", "layouts or models"): (_S + "layout", _S + "model",
                                                         "distlab.calculators"),
    ("distlab._chart", "what is drawn"): ("distlab.calculators", "distlab.timeline",
                                          "distlab.pictures", "distlab.memory"),
    ("distlab.gradcheck.recorder", "what the numbers should be"): (
        "distlab.gradcheck.compare", "distlab.gradcheck.hints"),
    ("distlab.timeline.trace", "what the numbers mean or how they are drawn"): (
        "distlab.timeline.metrics", "distlab.timeline.intervals", "distlab.timeline.drawing",
        "distlab._chart", "matplotlib"),
    (_C + "_axes", "what is drawn"): (*_FORMULAS, _C + "charts", _C + "models"),
    (_C + "_text", "what is being computed"): (*_FORMULAS, _C + "models", _C + "charts"),
    (_C + "_widget", "what it calculates"): (*_FORMULAS, _C + "models", _C + "widgets"),
    (_C + "activation_terms", "parameters or optimizers"): (_C + "memory_estimate",
                                                           _C + "models"),
    (_C + "charts", "the formulas"): _FORMULAS,
    (_C + "comm", "drawing"): _DRAWING,
    (_C + "links", "collectives"): (_C + "comm", _C + "stepper"),
    (_C + "memory_estimate", "widgets"): (_C + "widgets", _C + "_widget", "ipywidgets"),
    (_C + "models", "bytes, optimizers or activations"): (_C + "memory_estimate",
                                                          _C + "activation_terms",
                                                          _C + "comm"),
    (_C + "pipeline", "models or memory in bytes"): (_C + "models", _C + "memory_estimate"),
    (_C + "stepper", "time"): (_C + "comm", _C + "links"),
    (_C + "steptime", "memory or drawing"): (_C + "memory_estimate", _C + "activation_terms",
                                             *_DRAWING),
    (_S + "calculator_check", "how either is computed"): (*_SIMULATING,
                                                      _C + "activation_terms"),
    (_S + "instruments", "models or layouts"): (_S + "model", _S + "layout",
                                                _C + "models"),
    (_S + "replay", "models or layouts"): (_S + "model", _S + "layout", _S + "plans",
                                             _S + "plan_order", "distlab.calculators"),
    (_S + "pipeline", "how a stage is built or what is read off it"): (
        _S + "plan_order", _S + "plans", _S + "model", _S + "measure", _S + "instruments"),
    (_S + "model", "meshes or parallel plans"): (_S + "plans", _S + "mesh",
                                                 "torch.distributed.device_mesh"),
    (_S + "plans", "measuring"): (_S + "simulate", _S + "measure", _S + "instruments"),
    (_S + "simulate", "the calculators' formulas"): _FORMULAS,
    (_S + "mesh", "models"): (_S + "model", _S + "plans", _C + "models"),
    (_S + "plan_order", "measuring"): (_S + "measure", _S + "instruments", _S + "report"),
}

_SENTENCE = re.compile(r"\bknows nothing (?:about|of) (.+?)(?=[:;]|\.(?:\s|$)|$)", re.IGNORECASE)


def _knows_nothing() -> set[tuple[str, str]]:
    """``(module, X)`` for every "knows nothing about X" in a module docstring (X without its
    asides in parentheses)."""
    found = set()
    for name, tree in TREES.items():
        doc = re.sub(r"\s*\([^()]*\)", "", " ".join((ast.get_docstring(tree) or "").split()))
        found.update((name, m.group(1).strip()) for m in _SENTENCE.finditer(doc))
    return found


def _imports_any(name: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(m for m in IMPORTS[name]
                  if any(m == f or m.startswith(f + ".") for f in forbidden))


def test_every_knows_nothing_sentence_is_mapped_to_what_it_rules_out():
    found = _knows_nothing()
    assert not found - set(KNOWS_NOTHING), (
        f"say in KNOWS_NOTHING what these rule out: {sorted(found - set(KNOWS_NOTHING))}")
    assert not set(KNOWS_NOTHING) - found, (
        f"no docstring says these any more: {sorted(set(KNOWS_NOTHING) - found)}")


def test_every_knows_nothing_sentence_is_true():
    false = {key: _imports_any(key[0], forbidden) for key, forbidden in KNOWS_NOTHING.items()
             if key[0] in IMPORTS and _imports_any(key[0], forbidden)}
    assert not false, f"docstrings that say 'knows nothing about' what they import: {false}"


# -- torch's private code, behind one door ------------------------------------------------------

DOOR = {name for name in MODULES if re.fullmatch(r"distlab\._torch(_\w+)?", name)}
#: Modules outside the door allowed to reach torch's private code, each with the reason.
PRIVATE_TORCH_ALLOWED: dict[str, str] = {}


def _private(dotted: str) -> str | None:
    """``dotted`` cut after its first private part, when it is torch's private code."""
    parts = dotted.split(".")
    if parts[0] != "torch":
        return None
    for i, part in enumerate(parts[1:], 1):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[: i + 1])
    return None


def _torch_names(tree: ast.Module) -> dict[str, str]:
    """Local names bound to torch modules or objects: ``{"dist": "torch.distributed"}``."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    names[alias.asname or "torch"] = alias.name if alias.asname else "torch"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _dotted(node) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


#: Private attributes of torch's objects (not modules), which no name bound to torch leads to:
#: an op as ``__torch_dispatch__`` gets it, a DTensor, a module FSDP wrapped. Reading one of these
#: on anything, outside the door, counts as reaching torch's private code.
TORCH_PRIVATE_ATTRIBUTES = {
    "_schema": "OpOverload's schema (the door: _torch_dispatch.writes)",
    "_overloadpacket": "OpOverload's packet (public: .overloadpacket)",
    "_op": "OpOverload's C++ op",
    "_local_tensor": "DTensor's shard (public: .to_local())",
    "_spec": "DTensor's placement spec (public: .placements, .device_mesh)",
    "_checkpoint_wrapped_module": "checkpoint_wrapper's module",
    "_get_ddp_logging_data": "DDP's logging data",
}


def _private_torch_uses(tree: ast.Module) -> list[str]:
    """torch's private modules imported, private torch attributes reached through a name
    bound to torch (``torch._C.Future``, ``dist.distributed_c10d._resolve_process_group``), and
    `TORCH_PRIVATE_ATTRIBUTES` read on anything (``func._schema``, as ``?._schema``)."""
    uses = set()
    names = _torch_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in TORCH_PRIVATE_ATTRIBUTES:
            uses.add(f"?.{node.attr}")
        if isinstance(node, ast.Import):
            uses.update(_private(a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            uses.update(_private(f"{node.module}.{a.name}") for a in node.names)
        elif isinstance(node, ast.Attribute) and (dotted := _dotted(node)):
            if dotted[0] in names:
                uses.add(_private(".".join([names[dotted[0]], *dotted[1:]])))
    return sorted(uses - {None})


def test_only_the_door_reaches_torchs_private_code():
    found = {name: _private_torch_uses(tree) for name, tree in TREES.items()
             if name not in DOOR and name not in PRIVATE_TORCH_ALLOWED}
    found = {name: uses for name, uses in found.items() if uses}
    assert not found, (
        "torch's private code outside distlab._torch*: put it behind a function there that says "
        f"what it is, since when torch has it and what replaces it: {found}")


def test_the_private_torch_finder_sees_imports_and_attributes():
    tree = ast.parse(
        "import torch\nimport torch.distributed as dist\n"
        "from torch.utils._pytree import tree_leaves\n"
        "def f():\n"
        "    from torch.distributed.tensor import DTensor, _redistribute\n"
        "    return torch._C.Future, dist.distributed_c10d._x(), torch.ones, DTensor._op\n"
        "def g(func, args):\n"
        "    return func._schema.arguments, func.overloadpacket, func._overloadpacket, args._x\n")
    assert _private_torch_uses(tree) == [
        "?._op", "?._overloadpacket", "?._schema",
        "torch._C", "torch.distributed.distributed_c10d._x", "torch.distributed.tensor.DTensor._op",
        "torch.distributed.tensor._redistribute", "torch.utils._pytree"]


# -- the README's map ---------------------------------------------------------------------------


def _readme_table() -> list[tuple[str, str]]:
    text = README.read_text()
    start = text.index("Where things are in `distlab/`")
    rows = []
    for line in text[start:].splitlines()[1:]:
        if rows and not line.startswith("|"):
            break
        if line.startswith("|") and not line.startswith("|---"):
            first, second = line.strip("|").split("|", 1)
            rows.append((first, second))
    return rows[1:]  # less the header


def _named(path: Path, rows) -> bool:
    """Whether a row names ``path``: a module at the top in the first column (`launcher.py`), a
    module in a folder in the folder's row (`_ranks/` ... `group.py`; ``nbNN.py`` stands for
    ``nb00.py`` to ``nb99.py``); a folder's ``__init__.py`` by the folder."""
    rel = path.relative_to(PACKAGE)
    file = "nbNN.py" if re.fullmatch(r"nb\d\d\.py", rel.name) else rel.name
    if not rel.parent.parts:
        return any(f"`{file}`" in first for first, _ in rows)
    folder = f"`{rel.parent.as_posix()}/`"
    return any(folder in first and (file == "__init__.py" or f"`{file}`" in second)
               for first, second in rows)


def test_the_readme_names_every_module_of_distlab():
    rows = _readme_table()
    missing = [str(p.relative_to(PACKAGE)) for p in MODULES.values() if not _named(p, rows)]
    assert not missing, f"README.md's 'Where things are' does not name: {missing}"
