"""distlab._ranks.start_path: the start method a learner names (or the environment does) is
checked before any rank starts, with the methods there are in the message."""

from __future__ import annotations

import pytest

import distlab
from distlab._ranks import start_path
from distlab.errors import InputError


@pytest.mark.quick
def test_a_start_method_is_checked_where_the_start_paths_are(monkeypatch):
    monkeypatch.delenv(start_path.ENV_VAR, raising=False)
    assert start_path.check_method("spawn") == "spawn"
    assert start_path.check_method(None) == start_path.default_method()
    with pytest.raises(InputError, match=r"one of \('forkserver', 'spawn'\), got 'fork'\."):
        start_path.check_method("fork")
    monkeypatch.setenv(start_path.ENV_VAR, "fork")
    with pytest.raises(ValueError, match=r"got 'fork' \(from \$DISTLAB_START_METHOD\)"):
        start_path.check_method(None)


@pytest.mark.quick
def test_launch_and_cluster_refuse_an_unknown_start_method_before_starting_ranks():
    for call in (lambda: distlab.launch(print, world_size=2, start_method="fork"),
                 lambda: distlab.Cluster(world_size=2, start_method="fork")):
        with pytest.raises(InputError, match="start_method must be one of"):
            call()
