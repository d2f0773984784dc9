"""`make test` runs two pytest-xdist workers: each gets a temporary folder of its own (the root
conftest.py), so that a test that counts what launches leave behind sees its own worker's only."""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.quick

_path = Path(__file__).resolve().parents[1] / "conftest.py"
_spec = importlib.util.spec_from_file_location("root_conftest", _path)
root = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(root)


@pytest.fixture
def restored(monkeypatch):
    """TMPDIR and tempfile's cache as they were, whatever the test does to them."""
    monkeypatch.setattr(tempfile, "tempdir", tempfile.tempdir)
    monkeypatch.setenv("TMPDIR", os.environ.get("TMPDIR", tempfile.gettempdir()))
    return monkeypatch


def test_a_worker_gets_a_temporary_folder_of_its_own_and_leaves_nothing(restored):
    before = tempfile.gettempdir()
    restored.setenv("PYTEST_XDIST_WORKER", "gw7")
    config = SimpleNamespace()
    root.pytest_configure(config)
    mine = tempfile.gettempdir()
    assert mine != before and Path(mine).name.startswith("xdist-gw7-")
    assert os.environ["TMPDIR"] == mine  # the worker's kernels and ranks inherit it
    (Path(mine) / "distlab-left-over").mkdir()
    root.pytest_unconfigure(config)
    assert not Path(mine).exists()


def test_without_workers_the_temporary_folder_is_left_alone(restored):
    restored.delenv("PYTEST_XDIST_WORKER", raising=False)
    before = tempfile.gettempdir()
    config = SimpleNamespace()
    root.pytest_configure(config)
    assert tempfile.gettempdir() == before
    root.pytest_unconfigure(config)
