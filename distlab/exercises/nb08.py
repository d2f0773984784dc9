"""Graders for notebook 08, build your own all-reduce (see `distlab.exercises`).

The truths come from outside the answer: the sum computed here in one process, the bytes a ring
rank sends from `distlab.calculators.ring_steps` (a step-by-step simulation of notebook 08's
ring) and from the notebook's own byte counter run on new ranks, the alpha-beta times from
`distlab.calculators.collective_time`.
"""

from __future__ import annotations

from fractions import Fraction

from . import expect


def _number(value, what: str) -> None:
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise AssertionError(f"{what} should be a number; got {expect.describe(value)}")


# -- exercise 1: half a ring ------------------------------------------------------------------

#: (ranks, elements): lengths that do not divide evenly, so chunks differ in size.
CASES_1 = [(4, 10), (3, 8)]


def _input_1(rank, length):
    import torch

    return (torch.arange(float(length)) + 1) * (rank + 1)


def _reduce_scatter_on_rank(ring_reduce_scatter, length):
    import torch.distributed as dist

    t = _input_1(dist.get_rank(), length)
    got = ring_reduce_scatter(t)
    return got, t


def exercise_1(ring_reduce_scatter) -> None:
    """``ring_reduce_scatter(t)`` on 4 ranks (10 elements) and on 3 (8 elements): rank r
    returns the complete sum of chunk (r + 1) % n of ``torch.tensor_split(t, n)``, leaves ``t``
    as it was, and talks to its neighbours only: n - 1 sends and n - 1 receives, no collective."""
    import torch

    expect.not_written(ring_reduce_scatter, _input_1(0, 10))
    for n, length in CASES_1:
        values, calls = expect.collectives(_reduce_scatter_on_rank, ring_reduce_scatter,
                                           length, world_size=n)
        total = sum(_input_1(r, length) for r in range(n))
        chunks = torch.tensor_split(total, n)
        for rank, (got, t) in enumerate(values):
            expect.same(t, _input_1(rank, length), f"{n} ranks, rank {rank}'s t after the "
                        "call (ring_reduce_scatter must leave its input unchanged)")
            want = chunks[(rank + 1) % n]
            if isinstance(got, torch.Tensor) and got.shape != want.shape:
                raise AssertionError(
                    f"on {n} ranks with {length} elements, rank {rank} should return chunk "
                    f"{(rank + 1) % n} of torch.tensor_split(t, {n}), {want.numel()} elements; "
                    f"got {got.numel()} (torch.chunk and a plain split cut differently)"
                )
            expect.close(got, want, f"on {n} ranks, rank {rank}'s chunk {(rank + 1) % n}",
                         world_size=n)
        for rank, names in enumerate(calls):
            collectives = sorted({x for x in names if "send" not in x and "recv" not in x})
            if collectives:
                raise AssertionError(
                    f"rank {rank} called {', '.join(collectives)}: write the ring with "
                    "isend/irecv between neighbours only, as ring_all_reduce does"
                )
            sends = sum("send" in x for x in names)
            if sends != n - 1:
                raise AssertionError(
                    f"on {n} ranks each rank should send n - 1 = {n - 1} chunks; rank {rank} "
                    f"sent {sends} messages"
                )


# -- exercise 2: the bus-bandwidth factor -----------------------------------------------------

SIZE, SECONDS = 64 * 2**20, 0.040
RANKS_2 = (2, 3, 8)


def _ring_factor(n: int) -> Fraction:
    """Bytes the busiest rank sends in a ring all-reduce, per byte of the tensor: counted by
    the step-by-step simulation (a length that divides evenly)."""
    from ..calculators import ring_steps

    ring = ring_steps("all_reduce", ranks=n, numel=n * 1024)
    return Fraction(max(ring.per_rank), ring.nbytes)


def exercise_2(bandwidths) -> None:
    """``bandwidths(size_bytes, seconds, n)`` -> ``(algbw, busbw)`` in bytes per second, for 64
    MiB in 40 ms on 2, 3 and 8 ranks: algbw = size / time; busbw / algbw = the bytes a ring rank
    sends per byte of the tensor, 2(n - 1)/n (counted, not taken from a formula)."""
    import math

    for n in RANKS_2:
        got = bandwidths(SIZE, SECONDS, n)
        if not isinstance(got, tuple) or len(got) != 2:
            raise AssertionError(
                f"bandwidths should return a tuple of 2, (algbw, busbw); got {expect.describe(got)}"
            )
        algbw, busbw = got
        _number(algbw, "algbw")
        _number(busbw, "busbw")
        want = SIZE / SECONDS
        if not math.isclose(algbw, want, rel_tol=1e-9):
            hint = ""
            for factor, why in ((8, "bits, not bytes?"), (1e-6, "MB/s? the exercise asks for "
                                "bytes per second"), (1e-9, "GB/s? the exercise asks for bytes "
                                "per second")):
                if math.isclose(algbw, want * factor, rel_tol=1e-9):
                    hint = f" ({why})"
            raise AssertionError(
                f"algbw on {n} ranks should be size / seconds = {want:.6g} bytes/s; got "
                f"{algbw:.6g}{hint}"
            )
        factor = _ring_factor(n)
        if not math.isclose(busbw, float(factor) * want, rel_tol=1e-9):
            ratio = busbw / algbw if algbw else float("nan")
            raise AssertionError(
                f"on {n} ranks busbw / algbw should be {factor} (= {float(factor):.4g}: a ring "
                f"rank sends that many bytes per byte of the tensor); yours is {ratio:.4g}"
            )


# -- exercise 3: uneven chunks ----------------------------------------------------------------


def exercise_3(rank0_bytes, count_bytes) -> None:
    """``rank0_bytes()``: the bytes rank 0 sends in a ring all-reduce of 1001 float32 values on 8
    ranks, an int. The truth: the notebook's ``count_bytes("ring", 1001)`` run on 8 new ranks."""
    answer = rank0_bytes()
    truth = expect.run(count_bytes, "ring", 1001, world_size=8)[0]
    if isinstance(answer, int) and not isinstance(answer, bool) and answer != truth:
        even = 2 * 7 * 1001 * 4 / 8
        if answer in (int(even), round(even)):
            raise AssertionError(
                f"{answer} is the even-split formula 2(n-1)/n x 4004 = {even:g}; but 1001 "
                "values do not split evenly over 8 ranks: count the chunks rank 0 really "
                f"sends (torch.tensor_split gives one chunk 126 values, the others 125): {truth}"
                " is what the run counts"
            )
        if answer * 4 == truth:
            raise AssertionError(
                f"{answer} counts values; the exercise asks for bytes (4 per float32 value)"
            )
    expect.same(answer, truth, "rank0_bytes() (bytes, an int)")


# -- exercise 4: where the ring overtakes the tree --------------------------------------------

LINK, RANKS_4 = "NVLink 4 (H100 SXM)", 8


def exercise_4(smallest_power_of_two) -> None:
    """``smallest_power_of_two()``: the smallest 2**k bytes at which the ring all_reduce is
    faster than the tree on 8 ranks over the NVLink preset, in the alpha-beta model
    (`distlab.calculators.collective_time`); an int."""
    from ..calculators import collective_time

    answer = smallest_power_of_two()
    truth = next(
        2**k
        for k in range(64)
        if collective_time("all_reduce", 2**k, RANKS_4, LINK, "ring").seconds
        < collective_time("all_reduce", 2**k, RANKS_4, LINK, "tree").seconds
    )
    if isinstance(answer, int) and not isinstance(answer, bool) and answer != truth:
        if answer & (answer - 1) or answer <= 0:
            raise AssertionError(f"{answer} is not a power of two (2**k bytes)")
        ring = collective_time("all_reduce", answer, RANKS_4, LINK, "ring").seconds
        tree = collective_time("all_reduce", answer, RANKS_4, LINK, "tree").seconds
        if ring >= tree:
            raise AssertionError(
                f"at {answer:,} bytes the tree is still faster ({tree * 1e6:.2f} µs against "
                f"the ring's {ring * 1e6:.2f} µs): go bigger"
            )
        raise AssertionError(
            f"the ring is faster at {answer:,} bytes, but is it at {answer // 2:,}? Look for "
            "the smallest power of two"
        )
    expect.same(answer, truth, "smallest_power_of_two() (bytes, an int)")
