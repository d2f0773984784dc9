from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(scope="module")
def kernel():
    from kernel import Kernel

    k = Kernel()
    yield k
    k.shutdown()
