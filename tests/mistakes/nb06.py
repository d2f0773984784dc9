"""Notebook 06, async work and coalescing."""

from distlab.exercises import nb06

from . import RIGHT, Answer

GRADERS = {
    1: (nb06.exercise_1, ["mean_async"]),
    2: (nb06.exercise_2, ["all_reduce_buckets"]),
    3: (nb06.exercise_3, ["predicted_dense", "predicted_nnz"]),
}

_PACK = """
def packed(tensors, cap):
    buckets, current = [], []
    for t in tensors:
        if current and sum(x.numel() for x in current) + t.numel() > cap:
            buckets.append(current)
            current = []
        current.append(t)
    buckets.append(current)
    return buckets


def unpack(bucket, flat):
    for t, piece in zip(bucket, flat.split([t.numel() for t in bucket]), strict=True):
        t.copy_(piece.view_as(t))
"""

ANSWERS = [
    Answer(1, "the solution", """
def mean_async(tensors):
    world_size = dist.get_world_size()
    futs = [dist.all_reduce(t, async_op=True).get_future() for t in tensors]
    return torch.futures.collect_all(futs).then(
        lambda f: [g.value()[0] / world_size for g in f.value()])
""", RIGHT),
    Answer(1, "blocking all-reduces, then a finished future", """
def mean_async(tensors):
    for t in tensors:
        dist.all_reduce(t)
    fut = torch.futures.Future()
    fut.set_result([t / dist.get_world_size() for t in tensors])
    return fut
""", "started with async_op=True"),
    Answer(1, "async, but waits for each before returning", """
def mean_async(tensors):
    world_size = dist.get_world_size()
    futs = [dist.all_reduce(t, async_op=True).get_future() for t in tensors]
    for f in futs:
        f.wait()
    return torch.futures.collect_all(futs).then(
        lambda f: [g.value()[0] / world_size for g in f.value()])
""", "mean_async waited for the all-reduces"),
    Answer(1, "returns the list of futures", """
def mean_async(tensors):
    return [dist.all_reduce(t, async_op=True).get_future() for t in tensors]
""", "should return ONE future"),
    Answer(1, "returns collect_all itself: a future of futures", """
def mean_async(tensors):
    return torch.futures.collect_all([dist.all_reduce(t, async_op=True).get_future()
                                      for t in tensors])
""", "it is a list of futures"),
    Answer(1, "forgot to divide: the sums", """
def mean_async(tensors):
    futs = [dist.all_reduce(t, async_op=True).get_future() for t in tensors]
    return torch.futures.collect_all(futs).then(lambda f: [g.value()[0] for g in f.value()])
""", "exactly 3x the expected"),
    Answer(1, "one all-reduce of everything, flattened", """
def mean_async(tensors):
    world_size = dist.get_world_size()
    flat = torch.cat([t.flatten() for t in tensors])
    fut = dist.all_reduce(flat, async_op=True).get_future()
    def split(f):
        pieces = f.value()[0].split([t.numel() for t in tensors])
        return [p.view_as(t) / world_size for p, t in zip(pieces, tensors)]
    return fut.then(split)
""", "one dist.all_reduce per tensor (3)"),
    Answer(1, "only the first tensor's average", """
def mean_async(tensors):
    world_size = dist.get_world_size()
    fut = dist.all_reduce(tensors[0], async_op=True).get_future()
    return fut.then(lambda f: [f.value()[0] / world_size])
""", "one dist.all_reduce per tensor (3)"),
    Answer(2, "the solution", _PACK + """
def all_reduce_buckets(tensors, cap):
    buckets = packed(tensors, cap)
    flats = [torch.cat([t.flatten() for t in b]) for b in buckets]
    works = [dist.all_reduce(flat, async_op=True) for flat in flats]
    for bucket, flat, work in zip(buckets, flats, works):
        work.wait()
        unpack(bucket, flat)
""", RIGHT),
    Answer(2, "blocking bucket all-reduces", _PACK + """
def all_reduce_buckets(tensors, cap):
    for bucket in packed(tensors, cap):
        flat = torch.cat([t.flatten() for t in bucket])
        dist.all_reduce(flat)
        unpack(bucket, flat)
""", "start each bucket's all-reduce with async_op=True"),
    Answer(2, "async, but waits for each bucket before the next", _PACK + """
def all_reduce_buckets(tensors, cap):
    for bucket in packed(tensors, cap):
        flat = torch.cat([t.flatten() for t in bucket])
        dist.all_reduce(flat, async_op=True).wait()
        unpack(bucket, flat)
""", "ran one after another"),
    Answer(2, "no buckets: one all-reduce per tensor", """
def all_reduce_buckets(tensors, cap):
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    for w in works:
        w.wait()
""", "one all-reduce per tensor: no buckets"),
    Answer(2, "one bucket for everything", _PACK + """
def all_reduce_buckets(tensors, cap):
    flat = torch.cat([t.flatten() for t in tensors])
    dist.all_reduce(flat, async_op=True).wait()
    unpack(tensors, flat)
""", "one all-reduce for everything"),
    Answer(2, "a big tensor split over two buckets (every bucket exactly cap)", """
def all_reduce_buckets(tensors, cap):
    flat = torch.cat([t.flatten() for t in tensors])
    pieces = list(flat.split(cap))
    works = [dist.all_reduce(p, async_op=True) for p in pieces]
    for w in works:
        w.wait()
    done = torch.cat(pieces)
    for t, piece in zip(tensors, done.split([t.numel() for t in tensors])):
        t.copy_(piece.view_as(t))
""", "should carry buckets of [8, 2, 11, 5] elements"),
    Answer(2, "forgets to copy the sums back", _PACK + """
def all_reduce_buckets(tensors, cap):
    flats = [torch.cat([t.flatten() for t in b]) for b in packed(tensors, cap)]
    works = [dist.all_reduce(flat, async_op=True) for flat in flats]
    for w in works:
        w.wait()
""", "rank 0's tensor 0 after all_reduce_buckets"),
    Answer(2, "averages instead of summing", _PACK + """
def all_reduce_buckets(tensors, cap):
    buckets = packed(tensors, cap)
    flats = [torch.cat([t.flatten() for t in b]) for b in buckets]
    works = [dist.all_reduce(flat, async_op=True) for flat in flats]
    for bucket, flat, work in zip(buckets, flats, works):
        work.wait()
        unpack(bucket, flat / dist.get_world_size())
""", "exactly 1/2x the expected"),
    Answer(3, "the right prediction", """
def predicted_dense():
    return [1.0, 1.0, 2.0, 2.0, 1.0, 1.0]

def predicted_nnz():
    return 6
""", RIGHT),
    Answer(3, "ints instead of floats", """
def predicted_dense():
    return [1, 1, 2, 2, 1, 1]

def predicted_nnz():
    return 6
""", "predicted_dense()[0] should be a float"),
    Answer(3, "a tensor instead of a list", """
def predicted_dense():
    return torch.tensor([1.0, 1.0, 2.0, 2.0, 1.0, 1.0])

def predicted_nnz():
    return 6
""", "the exercise asks for a list"),
    Answer(3, "counts the entries before coalesce (8)", """
def predicted_dense():
    return [1.0, 1.0, 2.0, 2.0, 1.0, 1.0]

def predicted_nnz():
    return 8
""", "predicted_nnz() (entries stored after coalesce()) should be 6; got 8"),
    Answer(3, "nnz as a float", """
def predicted_dense():
    return [1.0, 1.0, 2.0, 2.0, 1.0, 1.0]

def predicted_nnz():
    return 6.0
""", "should be an int"),
    Answer(3, "thinks every position is hit by every rank", """
def predicted_dense():
    return [4.0] * 6

def predicted_nnz():
    return 6
""", "predicted_dense()[0] should be 1.0; got 4.0"),
    Answer(3, "only the first 4 positions", """
def predicted_dense():
    return [1.0, 1.0, 2.0, 2.0]

def predicted_nnz():
    return 4
""", "should have 6 entries"),
]
