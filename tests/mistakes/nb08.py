"""Notebook 08, build your own all-reduce."""

import torch
import torch.distributed as dist

from distlab.exercises import nb08

from . import RIGHT, Answer

GRADERS = {
    1: (nb08.exercise_1, ["ring_reduce_scatter"]),
    2: (nb08.exercise_2, ["bandwidths"]),
    3: (nb08.exercise_3, ["rank0_bytes", "count_bytes"]),
    4: (nb08.exercise_4, ["smallest_power_of_two"]),
}

# What the notebook's cells define before the exercises (its ring and its byte counter),
# defined in a module of its own name so that they travel to the ranks by value, as a cell's do.
_NOTEBOOK = '''
def ring_all_reduce(t):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    out = t.clone()
    chunks = list(torch.tensor_split(out, n))
    for s in range(n - 1):
        send_c, recv_c = (rank - s) % n, (rank - s - 1) % n
        incoming = torch.empty_like(chunks[recv_c])
        reqs = [dist.isend(chunks[send_c].contiguous(), right), dist.irecv(incoming, left)]
        for req in reqs:
            req.wait()
        chunks[recv_c] += incoming
    for s in range(n - 1):
        send_c, recv_c = (rank + 1 - s) % n, (rank - s) % n
        incoming = torch.empty_like(chunks[recv_c])
        reqs = [dist.isend(chunks[send_c].contiguous(), right), dist.irecv(incoming, left)]
        for req in reqs:
            req.wait()
        chunks[recv_c].copy_(incoming)
    return out


def count_bytes(which, length):
    sent = 0
    real_send, real_isend = dist.send, dist.isend

    def send(t, dst, *a, **k):
        nonlocal sent
        sent += t.numel() * t.element_size()
        return real_send(t, dst, *a, **k)

    def isend(t, dst, *a, **k):
        nonlocal sent
        sent += t.numel() * t.element_size()
        return real_isend(t, dst, *a, **k)

    dist.send, dist.isend = send, isend
    try:
        {"ring": ring_all_reduce}[which](torch.ones(length))
    finally:
        dist.send, dist.isend = real_send, real_isend
    return sent
'''
_given = {"__name__": "notebook_08", "torch": torch, "dist": dist}
exec(compile(_NOTEBOOK, "<notebook 08>", "exec"), _given)
GIVEN = {"count_bytes": _given["count_bytes"]}

_RING_RS = """
def ring_reduce_scatter(t):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = [c.clone() for c in torch.tensor_split(t, n)]
    for s in range(n - 1):
        send_c, recv_c = (rank - s) % n, (rank - s - 1) % n
        incoming = torch.empty_like(chunks[recv_c])
        for req in (dist.isend(chunks[send_c], right), dist.irecv(incoming, left)):
            req.wait()
        chunks[recv_c] += incoming
    return chunks[(rank + 1) % n]
"""

ANSWERS = [
    Answer(1, "the solution", _RING_RS, RIGHT),
    Answer(1, "a library all_reduce, then the slice", """
def ring_reduce_scatter(t):
    rank, n = dist.get_rank(), dist.get_world_size()
    total = t.clone()
    dist.all_reduce(total)
    return torch.tensor_split(total, n)[(rank + 1) % n]
""", "write the ring with isend/irecv between neighbours only"),
    Answer(1, "returns chunk r instead of chunk (r + 1) % n", _RING_RS.replace(
        "return chunks[(rank + 1) % n]", "return chunks[rank]"),
        "on 4 ranks, rank 0's chunk 1 should be"),
    Answer(1, "adds into t's own chunks: changes the input", """
def ring_reduce_scatter(t):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = list(torch.tensor_split(t, n))
    for s in range(n - 1):
        send_c, recv_c = (rank - s) % n, (rank - s - 1) % n
        incoming = torch.empty_like(chunks[recv_c])
        for req in (dist.isend(chunks[send_c].contiguous(), right), dist.irecv(incoming, left)):
            req.wait()
        chunks[recv_c] += incoming
    return chunks[(rank + 1) % n]
""", "must leave its input unchanged"),
    Answer(1, "torch.chunk instead of tensor_split: uneven lengths go wrong", _RING_RS.replace(
        "torch.tensor_split(t, n)", "torch.chunk(t, n)"),
        "torch.chunk and a plain split cut differently"),
    Answer(1, "n steps instead of n - 1", _RING_RS.replace("for s in range(n - 1):",
                                                          "for s in range(n):"),
        "each rank should send n - 1 = 3 chunks; rank 0 sent 4"),
    Answer(2, "the solution", """
def bandwidths(size_bytes, seconds, n):
    algbw = size_bytes / seconds
    return algbw, algbw * 2 * (n - 1) / n
""", RIGHT),
    Answer(2, "busbw = algbw (true on 2 ranks only)", """
def bandwidths(size_bytes, seconds, n):
    algbw = size_bytes / seconds
    return algbw, algbw
""", "on 3 ranks busbw / algbw should be 4/3"),
    Answer(2, "reduce-scatter's factor (n - 1)/n", """
def bandwidths(size_bytes, seconds, n):
    algbw = size_bytes / seconds
    return algbw, algbw * (n - 1) / n
""", "on 2 ranks busbw / algbw should be 1"),
    Answer(2, "in bits per second", """
def bandwidths(size_bytes, seconds, n):
    algbw = 8 * size_bytes / seconds
    return algbw, algbw * 2 * (n - 1) / n
""", "bits, not bytes?"),
    Answer(2, "in GB/s", """
def bandwidths(size_bytes, seconds, n):
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * 2 * (n - 1) / n
""", "GB/s?"),
    Answer(2, "swapped: (busbw, algbw)", """
def bandwidths(size_bytes, seconds, n):
    algbw = size_bytes / seconds
    return algbw * 2 * (n - 1) / n, algbw
""", "algbw on 3 ranks should be size / seconds"),
    Answer(2, "a list, not a tuple", """
def bandwidths(size_bytes, seconds, n):
    algbw = size_bytes / seconds
    return [algbw, algbw * 2 * (n - 1) / n]
""", "should return a tuple of 2"),
    Answer(3, "the right count", """
def rank0_bytes():
    return 7008
""", RIGHT),
    Answer(3, "the even-split formula", """
def rank0_bytes():
    return int(2 * (8 - 1) / 8 * 1001 * 4)
""", "the even-split formula"),
    Answer(3, "values, not bytes", """
def rank0_bytes():
    return 1752
""", "counts values"),
    Answer(3, "a float", """
def rank0_bytes():
    return 7008.0
""", "should be an int"),
    Answer(3, "the whole tensor twice (a naive send)", """
def rank0_bytes():
    return 2 * 1001 * 4
""", "should be 7008; got 8008"),
    Answer(4, "the right size", """
def smallest_power_of_two():
    return 2**22
""", RIGHT),
    Answer(4, "one too small: the tree still wins", """
def smallest_power_of_two():
    return 2**21
""", "the tree is still faster"),
    Answer(4, "one too big", """
def smallest_power_of_two():
    return 2**23
""", "is it at 4,194,304?"),
    Answer(4, "a guess of 4 KiB", """
def smallest_power_of_two():
    return 4096
""", "go bigger"),
    Answer(4, "a float", """
def smallest_power_of_two():
    return 4194304.0
""", "should be an int"),
    Answer(4, "the crossover size itself, not a power of two", """
def smallest_power_of_two():
    return 2_880_000
""", "is not a power of two"),
]
