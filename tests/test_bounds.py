"""distlab.below / distlab.above: a rounding-level number printed as the bound it meets."""

from __future__ import annotations

import math

import pytest
import torch

import distlab
from distlab.bounds import limit_text

pytestmark = pytest.mark.quick


def test_below_prints_the_bound_and_checks_it():
    assert distlab.below(5.4e-07, 1e-5) == "< 1e-5"
    assert distlab.below(6.6e-07, 1e-5) == "< 1e-5"  # another CPU's digits, the same line
    assert distlab.below(torch.tensor(3e-7), 1e-5) == "< 1e-5"  # one-element tensors too
    assert distlab.below(-2.0, 0) == "< 0"
    with pytest.raises(AssertionError, match=r"2e-05 is not below 1e-5"):
        distlab.below(2e-5, 1e-5)
    with pytest.raises(AssertionError, match="is not below"):
        distlab.below(1e-5, 1e-5)  # strictly below
    with pytest.raises(AssertionError, match="nan is not below"):
        distlab.below(math.nan, 1.0)


def test_above_prints_the_bound_and_checks_it():
    assert distlab.above(0.0148, 1e-3) == "> 1e-3"
    with pytest.raises(AssertionError, match=r"0.0001 is not above 1e-3"):
        distlab.above(1e-4, 1e-3)
    with pytest.raises(AssertionError):
        distlab.above(math.nan, 0)


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="value must be a number"):
        distlab.below("1e-7", 1e-5)
    with pytest.raises(TypeError, match="value must be a number"):
        distlab.below(torch.ones(2), 1e-5)  # not one number
    with pytest.raises(TypeError, match="limit must be a number"):
        distlab.below(1e-7, None)
    with pytest.raises(TypeError):
        distlab.below(True, 2)


@pytest.mark.parametrize(
    "limit, text",
    [(1e-5, "1e-5"), (5e-4, "5e-4"), (2.5e-7, "2.5e-7"), (1e-3, "1e-3"), (0.01, "0.01"),
     (0.25, "0.25"), (100, "100"), (1e6, "1e6"), (0, "0"), (-1e-5, "-1e-5")],
)
def test_limits_are_written_as_a_person_writes_them(limit, text):
    assert limit_text(limit) == text
