from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "quick: needs no ranks and no kernel (synthetic data only): `pytest -m quick` runs these "
        "alone in seconds",
    )


@pytest.fixture(scope="module")
def kernel():
    from kernel import Kernel

    k = Kernel()
    yield k
    k.shutdown()


@pytest.fixture(scope="module")
def cluster(request):
    """A live `distlab.Cluster` shared by the tests of one module. Its options come from the
    module's ``CLUSTER`` dict (default: 2 ranks, timeout 60 s)."""
    import distlab

    options = {"world_size": 2, "timeout": 60, **getattr(request.module, "CLUSTER", {})}
    c = distlab.Cluster(**options)
    yield c
    c.shutdown()


@pytest.fixture(autouse=True)
def _checks_draw_reproducibly(request):
    """Every exercise check in a test draws its cases from a seed made of the test's name
    (`distlab.exercises.expect.SEED`): a failure reproduces at the next run; the learner's
    kernel, where it is unset, draws anew at every check."""
    import zlib

    from distlab.exercises import expect

    before = os.environ.get(expect.SEED)
    expect.reseed(zlib.crc32(request.node.nodeid.encode()))
    yield
    if before is None:
        os.environ.pop(expect.SEED, None)
    else:
        os.environ[expect.SEED] = before
