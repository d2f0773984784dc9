"""Every public entry point, fed an argument that cannot work, raises a `DistlabError` that is
also the built-in error a learner expects, with a message that says what to give instead."""

from __future__ import annotations

import pytest

import distlab
from distlab import scale
from distlab.calculators import Layout, memory_per_device, pipeline_schedule, step_time

CASES = [
    # (call, the built-in error, words of the fix the message must hold)
    (lambda: distlab.launch(print, world_size=0), ValueError, "Example: world_size=4"),
    (lambda: distlab.launch(print, world_size="2"), TypeError, "Example: world_size=4"),
    (lambda: distlab.launch(print, world_size=2, timeout=-1), ValueError, "timeout=60"),
    (lambda: distlab.launch(print, world_size=2, timeout="1"), TypeError, "timeout=60"),
    (lambda: distlab.launch(print, world_size=2, backend="mpi"), ValueError, "Choose one of"),
    (lambda: distlab.Cluster(world_size=0), ValueError, "Example: world_size=4"),
    (lambda: memory_per_device("Llama-3 8B", tp=3), ValueError, "choose tp in"),
    (lambda: memory_per_device("Llama-3 8B", zero=5), ValueError, "choose 0"),
    (lambda: memory_per_device("Llama-3 8B", v=2), ValueError, "a Layout calls it"),
    (lambda: step_time("Llama-3 8B", pp=2, schedule="Interleaved1F1B"), ValueError,
     "set virtual_stages=2"),
    (lambda: step_time("Llama-3 8B", replicate=2), ValueError, "use replicate=1"),
    (lambda: pipeline_schedule(4, 2), ValueError, "choose m >= 4"),
    (lambda: Layout(dp=4, ep=3), ValueError, "choose ep in"),
    (lambda: scale.Layout(schedule="Interleaved1F1B"), ValueError, "schedule='1F1B'"),
    (lambda: scale.simulate_rank("Llama-3 8B", scale.Layout(zero=1)), ValueError, "zero=3"),
    (lambda: scale.simulate_rank("Llama-3 8B", {"dp": 2}), ValueError, "Layout(dp=8"),
]


@pytest.mark.quick
@pytest.mark.parametrize("index", range(len(CASES)))
def test_bad_input_raises_a_distlab_error_that_says_how_to_fix_it(index):
    call, builtin, fix = CASES[index]
    with pytest.raises(distlab.DistlabError) as info:
        call()
    assert isinstance(info.value, builtin), type(info.value).__mro__
    assert fix in str(info.value), str(info.value)
