"""What a learner can reach: every public name is exported, resolves, and says what it does."""

from __future__ import annotations

import inspect

import pytest

import distlab
from distlab import exercises, memory, pictures, stand_ins, timeline

pytestmark = pytest.mark.quick

MODULES = [distlab, timeline, memory, pictures, exercises, stand_ins]


@pytest.mark.parametrize("module", MODULES, ids=[m.__name__ for m in MODULES])
def test_every_public_name_is_exported_and_documented(module):
    names = [n for n in module.__all__ if not n.startswith("__")]
    for name in names:
        obj = getattr(module, name)  # AttributeError: __all__ names something that is not there
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert (obj.__doc__ or "").strip(), f"{module.__name__}.{name} has no docstring"
    defined_here = [
        n
        for n, obj in vars(module).items()
        if not n.startswith("_")
        and (inspect.isfunction(obj) or inspect.isclass(obj))
        and obj.__module__.startswith(module.__name__)
    ]
    missing = sorted(set(defined_here) - set(names))
    assert not missing, f"{module.__name__} defines {missing} but does not export them"


def test_the_functions_a_learner_calls_list_their_errors():
    for fn in (distlab.launch, distlab.Cluster, timeline.record, timeline.collect,
               memory.measure, memory.record, memory.collect, exercises.check,
               pictures.launch_path, stand_ins.children_stderr, stand_ins.press_stop,
               stand_ins.torchrun, distlab.RankTimeout.where):
        doc = inspect.getdoc(fn) or ""
        assert "Raises" in doc, f"{fn.__qualname__}'s docstring does not list its errors"
