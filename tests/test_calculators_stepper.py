"""distlab.calculators.ring_steps: notebook 08's ring, step by step, with the bytes each step
moves and the same pictures as the lessons."""

from __future__ import annotations

import pytest
import torch

from distlab import pictures
from distlab.calculators import CalculatorError, ring_steps

pytestmark = pytest.mark.quick


def test_reduce_scatter_ends_as_notebook_08s_picture():
    ring = ring_steps("reduce_scatter", 4)
    assert ring.start == ((1, 2, 3, 4), (11, 12, 13, 14), (21, 22, 23, 24), (31, 32, 33, 34))
    # notebook 08's simulate_reduce_scatter from the same start
    assert ring.steps[-1].after == ((1, 68, 59, 38), (12, 12, 72, 52), (33, 34, 23, 76),
                                    (64, 66, 56, 34))
    assert len(ring.steps) == 3 and {s.phase for s in ring.steps} == {"reduce-scatter"}


def test_all_reduce_leaves_every_rank_with_the_sum():
    for n in range(2, 9):
        ring = ring_steps("all_reduce", n)
        total = tuple(sum(row[c] for row in ring.start) for c in range(n))
        assert ring.steps[-1].after == (total,) * n
        assert len(ring.steps) == 2 * (n - 1)


def test_each_step_starts_where_the_previous_one_ended_and_sends_along_the_ring():
    ring = ring_steps("all_reduce", 5)
    assert ring.steps[0].before == ring.start
    for prev, step in zip(ring.steps[:-1], ring.steps[1:], strict=True):
        assert step.before == prev.after
    for step in ring.steps:
        assert [(src, dst) for src, dst, _ in step.sends] == [(r, (r + 1) % 5) for r in range(5)]


def test_all_gather_fills_in_one_chunk_per_rank_per_step():
    ring = ring_steps("all_gather", 4)
    held = [sum(v is not None for v in row) for row in ring.start]
    assert held == [1, 1, 1, 1]
    for k, step in enumerate(ring.steps, start=1):
        assert [sum(v is not None for v in row) for row in step.after] == [k + 1] * 4
    assert ring.steps[-1].after == ((1, 12, 23, 34),) * 4


def test_bytes_per_rank_are_what_notebook_08_counted():
    # notebook 08: 1024 float32 values on 4 ranks, the ring sends [6144] * 4
    ring = ring_steps("all_reduce", 4, numel=1024, element_size=4)
    assert ring.per_rank == (6144,) * 4 == (2 * 3 * 4096 // 4,) * 4
    assert ring.total == 4 * 6144 and all(s.total == 4 * 1024 for s in ring.steps)
    assert ring_steps("all_gather", 4, numel=1024).per_rank == (3072,) * 4


def test_uneven_chunks_follow_tensor_split():
    ring = ring_steps("all_reduce", 4, numel=10, element_size=2)
    assert ring.chunks == tuple(len(c) for c in torch.tensor_split(torch.zeros(10), 4))
    assert ring.steps[0].sent == (6, 6, 4, 4)  # rank r sends chunk r in the first step
    assert sum(ring.per_rank) == 2 * 3 * 10 * 2  # every chunk goes round twice, 3 hops each


def test_a_step_is_drawn_with_distlab_pictures_with_the_ring_as_arrows():
    step = ring_steps("all_reduce", 4).steps[2]
    picture = step.picture()
    assert isinstance(picture, pictures.Picture)
    assert picture.text().splitlines()[1] == "rank 0: [1, 2, 59, 38]    ->  [1, 68, 59, 38]"
    assert picture.arrows == [(0, 1), (1, 2), (2, 3), (3, 0)]
    gathered = ring_steps("all_gather", 4).steps[0].picture()
    assert gathered.text().splitlines()[1] == "rank 0: [[1], [], [], []]   ->  [[1], [], [], [34]]"


def test_text_shows_every_step_and_the_totals():
    text = ring_steps("all_reduce", 4, numel=1024).text()
    assert text.splitlines()[-1] == ("sent in all: 6,144 bytes per rank (2(n-1)/n x 4,096 = "
                                     "6,144); 24,576 by all ranks together")
    assert "step 4 (all-gather): sent 1,024 bytes per rank" in text
    big = ring_steps("all_gather", 3, numel=10**9, element_size=2).text()
    assert big.splitlines()[-1].startswith("sent in all: bytes per rank 1,333,333,334 / ")
    assert "((n-1)/n x 2,000,000,000 = 1,333,333,333.33)" in big


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(op="broadcast"), "op='broadcast' is not one of"),
        (dict(ranks=1), "a ring needs at least 2 ranks"),
        (dict(numel=0), "numel must be a whole number >= 1"),
        (dict(element_size=0.5), "(bytes per element: 4 for float32)"),
    ],
)
def test_bad_input_says_what_to_choose(kwargs, message):
    with pytest.raises(CalculatorError) as info:
        ring_steps(**kwargs)
    assert message in str(info.value)
