"""distlab.timeline.text: a timeline as text without times, ranks that did the same once."""

from __future__ import annotations

import pytest
from synthetic_traces import trace

from distlab import timeline

pytestmark = pytest.mark.quick


def test_text_folds_only_ranks_that_did_the_same():
    a = trace(0, main=[("fwd", "user_annotation", 100, 200), ("fwd", "user_annotation", 200, 300)])
    b = trace(1, main=[("bwd", "user_annotation", 100, 200)])
    assert timeline.Timeline([a, b]).text() == (
        "Timeline: 2 ranks, CPU\nrank 0:\n  fwd x2\n  comm: none\nrank 1:\n  bwd\n  comm: none"
    )
