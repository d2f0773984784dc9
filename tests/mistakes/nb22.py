"""Notebook 22, context parallelism: ring attention by hand."""

import torch.nn.functional as F

from distlab.exercises import nb22

from . import RIGHT, Answer

GRADERS = {
    1: (nb22.exercise_1, ["causal_work"]),
    2: (nb22.exercise_2, ["start_pass", "cluster"]),
    3: (nb22.exercise_3, ["allgather_attention", "cluster"]),
}

GIVEN = {"F": F}

CLUSTER = {"world_size": 4, "threads": 1}

ANSWERS = [
    Answer(1, "the solution", """
def causal_work(layout):
    return [sum(t + 1 for t in positions) for positions in layout]
""", RIGHT),
    Answer(1, "every pair, counted one by one", """
def causal_work(layout):
    seq = sum(len(p) for p in layout)
    return [sum(1 for t in positions for key in range(seq) if key <= t) for positions in layout]
""", RIGHT),
    Answer(1, "off by one: a query does not see its own key", """
def causal_work(layout):
    return [sum(t for t in positions) for positions in layout]
""", "a query also sees its own key"),
    Answer(1, "counts the block up to the rank's last query, masked half included", """
def causal_work(layout):
    return [len(p) * (max(p) + 1) if p else 0 for p in layout]
""", "each query sees only the keys up to its own position"),
    Answer(1, "positions taken as indices in the list, not the tokens' own", """
def causal_work(layout):
    out, i = [], 0
    for positions in layout:
        out.append(sum(i + n + 1 for n in range(len(positions))))
        i += len(positions)
    return out
""", "(zig-zag, 16 tokens on 4 ranks) should be [34, 34, 34, 34]"),
    Answer(1, "a tensor instead of a list", """
def causal_work(layout):
    return torch.tensor([sum(t + 1 for t in positions) for positions in layout])
""", "turns a tensor into one"),
    Answer(1, "only the keys on the same rank", """
def causal_work(layout):
    return [sum(1 for t in p for u in p if u <= t) for p in layout]
""", "(the example) should be [10, 26]; got [10, 10]"),
    Answer(1, "assumes each rank's positions are consecutive", """
def causal_work(layout):
    return [len(p) * (max(p) + 1) - len(p) * (len(p) - 1) // 2 for p in layout]
""", "(zig-zag, 16 tokens on 4 ranks) should be [34, 34, 34, 34]; got [58, 50, 42, 34]"),
    Answer(1, "the layouts the check tried, from its ✗ messages", """
SEEN = {"[[0, 1, 2, 3], [4, 5, 6, 7]]": [10, 26],
        "[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]": [10, 26, 42, 58],
        "[[0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9]]": [34, 34, 34, 34],
        "[[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8, 11]]": [22, 26, 30],
        "[[9, 8, 6], [3, 1, 7, 4, 2], [5, 0]]": [26, 22, 7],
        "[[0, 1, 2], [], [3]]": [6, 0, 4], "[[0, 1, 2, 3, 4]]": [15]}
def causal_work(layout):
    return SEEN.get(str(layout), [0] * len(layout))
""", "(drawn at random) should be"),
    Answer(2, "the solution", """
def start_pass(block):
    rank, world = dist.get_rank(), dist.get_world_size()
    block = block.contiguous()
    incoming = torch.empty_like(block)
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, block, (rank + 1) % world),
        dist.P2POp(dist.irecv, incoming, (rank - 1) % world),
    ])
    return works, incoming
""", RIGHT),
    Answer(2, "isend and irecv without batching", """
def start_pass(block):
    rank, world = dist.get_rank(), dist.get_world_size()
    incoming = torch.empty(block.shape)
    return [dist.isend(block.contiguous(), (rank + 1) % world),
            dist.irecv(incoming, (rank - 1) % world)], incoming
""", RIGHT),
    Answer(2, "the world size hard-coded to 4, the cluster's own size", """
def start_pass(block):
    rank = dist.get_rank()
    block = block.contiguous()
    incoming = torch.empty_like(block)
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, block, (rank + 1) % 4),
        dist.P2POp(dist.irecv, incoming, (rank - 1) % 4),
    ])
    return works, incoming
""", "the ring's size is dist.get_world_size(), not 4"),
    Answer(2, "forgets that the block is not contiguous", """
def start_pass(block):
    rank, world = dist.get_rank(), dist.get_world_size()
    incoming = torch.empty_like(block)
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, block, (rank + 1) % world),
        dist.P2POp(dist.irecv, incoming, (rank - 1) % world),
    ])
    return works, incoming
""", "input tensor has to be contiguous"),
    Answer(2, "returns the send's work only: the receive is never waited for", """
def start_pass(block):
    rank, world = dist.get_rank(), dist.get_world_size()
    block = block.contiguous()
    incoming = torch.empty_like(block)
    send, recv = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, block, (rank + 1) % world),
        dist.P2POp(dist.irecv, incoming, (rank - 1) % world),
    ])
    return [send], incoming
""", "started 2 transfers and returned 1 of them"),
    Answer(2, "sends a contiguous copy, receives into a strided buffer (empty_like)", """
def start_pass(block):
    rank, world = dist.get_rank(), dist.get_world_size()
    incoming = torch.empty_like(block)
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, block.contiguous(), (rank + 1) % world),
        dist.P2POp(dist.irecv, incoming, (rank - 1) % world),
    ])
    return works, incoming
""", "The tensor you receive into is not contiguous"),
    Answer(2, "blocking send, then receive: every rank sends first", """
def start_pass(block):
    rank, world = dist.get_rank(), dist.get_world_size()
    incoming = torch.empty(block.shape)
    dist.send(block.contiguous(), (rank + 1) % world)
    dist.recv(incoming, (rank - 1) % world)
    return [], incoming
""", "your answer hangs"),
    Answer(2, "even ranks send first, odd ones receive first: blocking, nothing to wait for", """
def start_pass(block):
    rank, world = dist.get_rank(), dist.get_world_size()
    incoming = torch.empty(block.shape)
    if rank % 2 == 0:
        dist.send(block.contiguous(), (rank + 1) % world)
        dist.recv(incoming, (rank - 1) % world)
    else:
        dist.recv(incoming, (rank - 1) % world)
        dist.send(block.contiguous(), (rank + 1) % world)
    return [], incoming
""", "start_pass returned no started transfers"),
    Answer(2, "starts the transfers, then waits for them itself", """
def start_pass(block):
    rank, world = dist.get_rank(), dist.get_world_size()
    incoming = torch.empty(block.shape)
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, block.contiguous(), (rank + 1) % world),
        dist.P2POp(dist.irecv, incoming, (rank - 1) % world),
    ])
    for w in works:
        w.wait()
    return works, incoming
""", "start_pass waited for the transfer"),
    Answer(2, "the ring turned the wrong way", """
def start_pass(block):
    rank, world = dist.get_rank(), dist.get_world_size()
    incoming = torch.empty(block.shape)
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, block.contiguous(), (rank - 1) % world),
        dist.P2POp(dist.irecv, incoming, (rank + 1) % world),
    ])
    return works, incoming
""", "at pass 0 rank 0 should hold rank 3's block"),
    Answer(2, "all_gather, then take the left neighbour's block", """
def start_pass(block):
    rank, world = dist.get_rank(), dist.get_world_size()
    everyone = [torch.empty(block.shape) for _ in range(world)]
    work = dist.all_gather(everyone, block.contiguous(), async_op=True)
    work.wait()
    return [work], everyone[(rank - 1) % world]
""", "called c10d::allgather_"),
    Answer(2, "returns the tensor only", """
def start_pass(block):
    rank, world = dist.get_rank(), dist.get_world_size()
    incoming = torch.empty(block.shape)
    dist.batch_isend_irecv([
        dist.P2POp(dist.isend, block.contiguous(), (rank + 1) % world),
        dist.P2POp(dist.irecv, incoming, (rank - 1) % world),
    ])
    return incoming
""", "start_pass should return a tuple (works, incoming)"),
    Answer(3, "the solution", """
def allgather_attention(q, k, v):
    rank, world = dist.get_rank(), dist.get_world_size()
    c = q.shape[2]
    kv = torch.empty(world * 2, *k.shape)
    dist.all_gather_single(kv, torch.stack([k, v]).contiguous())
    kv = kv.view(world, 2, *k.shape)
    keys, values = torch.cat(list(kv[:, 0]), dim=2), torch.cat(list(kv[:, 1]), dim=2)
    positions = torch.arange(rank * c, (rank + 1) * c)
    visible = torch.arange(world * c)[None, :] <= positions[:, None]
    scores = (q @ keys.transpose(-2, -1) * q.shape[-1] ** -0.5).masked_fill(~visible, float("-inf"))
    return scores.softmax(dim=-1) @ values
""", RIGHT),
    Answer(3, "all_gather of a list, and only the keys up to the rank's chunk", """
def allgather_attention(q, k, v):
    rank, world = dist.get_rank(), dist.get_world_size()
    ks = [torch.empty_like(k) for _ in range(world)]
    vs = [torch.empty_like(v) for _ in range(world)]
    dist.all_gather(ks, k.contiguous())
    dist.all_gather(vs, v.contiguous())
    c = q.shape[2]
    keys, values = torch.cat(ks[: rank + 1], dim=2), torch.cat(vs[: rank + 1], dim=2)
    mask = torch.ones(c, (rank + 1) * c, dtype=torch.bool).tril(rank * c)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
""", RIGHT),
    Answer(3, "no gather: each rank attends to its own chunk", """
def allgather_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
""", "rank 0 is right and the later ranks are not"),
    Answer(3, "gathered, but is_causal aligns the mask with the first key", """
def allgather_attention(q, k, v):
    world = dist.get_world_size()
    ks = [torch.empty_like(k) for _ in range(world)]
    vs = [torch.empty_like(v) for _ in range(world)]
    dist.all_gather(ks, k.contiguous())
    dist.all_gather(vs, v.contiguous())
    return F.scaled_dot_product_attention(q, torch.cat(ks, 2), torch.cat(vs, 2), is_causal=True)
""", "A mask built from local indices"),
    Answer(3, "gathered, but no mask: every query sees the future", """
def allgather_attention(q, k, v):
    world = dist.get_world_size()
    ks = [torch.empty_like(k) for _ in range(world)]
    vs = [torch.empty_like(v) for _ in range(world)]
    dist.all_gather(ks, k.contiguous())
    dist.all_gather(vs, v.contiguous())
    return F.scaled_dot_product_attention(q, torch.cat(ks, 2), torch.cat(vs, 2))
""", "every rank differs: is the mask causal"),
    Answer(3, "gathers the queries too and returns every rank's output", """
def allgather_attention(q, k, v):
    world = dist.get_world_size()
    parts = [[torch.empty_like(t) for _ in range(world)] for t in (q, k, v)]
    for out, t in zip(parts, (q, k, v)):
        dist.all_gather(out, t.contiguous())
    return F.scaled_dot_product_attention(*(torch.cat(p, 2) for p in parts), is_causal=True)
""", "returned shape (1, 2, 16, 8)"),
    Answer(3, "the sum of everyone's keys instead of all of them", """
def allgather_attention(q, k, v):
    k, v = k.clone(), v.clone()
    dist.all_reduce(k)
    dist.all_reduce(v)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
""", "rank 0's output differs"),
    Answer(3, "keys and values all-reduced in zero-padded buffers: right, but no all-gather", """
def allgather_attention(q, k, v):
    rank, world = dist.get_rank(), dist.get_world_size()
    c = q.shape[2]
    keys = torch.zeros(*k.shape[:2], world * c, k.shape[3])
    values = torch.zeros_like(keys)
    keys[:, :, rank * c:(rank + 1) * c], values[:, :, rank * c:(rank + 1) * c] = k, v
    dist.all_reduce(keys)
    dist.all_reduce(values)
    positions = torch.arange(rank * c, (rank + 1) * c)
    visible = torch.arange(world * c)[None, :] <= positions[:, None]
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=visible)
""", "should use an all-gather of the keys and values"),
    Answer(3, "4 tokens per rank hard-coded, as in the notebook", """
def allgather_attention(q, k, v):
    rank, world = dist.get_rank(), dist.get_world_size()
    kv = torch.empty(world * 2, *k.shape)
    dist.all_gather_single(kv, torch.stack([k, v]).contiguous())
    kv = kv.view(world, 2, *k.shape)
    keys, values = torch.cat(list(kv[:, 0]), dim=2), torch.cat(list(kv[:, 1]), dim=2)
    positions = torch.arange(rank * 4, (rank + 1) * 4)
    visible = torch.arange(world * 4)[None, :] <= positions[:, None]
    scores = (q @ keys.transpose(-2, -1) * 8 ** -0.5).masked_fill(~visible, float("-inf"))
    return scores.softmax(dim=-1) @ values
""", "with 3 tokens per rank (12 in all), 3 heads of 4"),
    Answer(3, "no 1/sqrt(head dim) in the scores", """
def allgather_attention(q, k, v):
    rank, world = dist.get_rank(), dist.get_world_size()
    c = q.shape[2]
    kv = torch.empty(world * 2, *k.shape)
    dist.all_gather_single(kv, torch.stack([k, v]).contiguous())
    kv = kv.view(world, 2, *k.shape)
    keys, values = torch.cat(list(kv[:, 0]), dim=2), torch.cat(list(kv[:, 1]), dim=2)
    positions = torch.arange(rank * c, (rank + 1) * c)
    visible = torch.arange(world * c)[None, :] <= positions[:, None]
    scores = (q @ keys.transpose(-2, -1)).masked_fill(~visible, float("-inf"))
    return scores.softmax(dim=-1) @ values
""", "without the 1/sqrt(head dim) scale"),
    Answer(3, "right values, computed and returned in float64", """
def allgather_attention(q, k, v):
    rank, world = dist.get_rank(), dist.get_world_size()
    c = q.shape[2]
    ks = [torch.empty_like(k) for _ in range(world)]
    vs = [torch.empty_like(v) for _ in range(world)]
    dist.all_gather(ks, k.contiguous())
    dist.all_gather(vs, v.contiguous())
    keys, values = torch.cat(ks, 2).double(), torch.cat(vs, 2).double()
    positions = torch.arange(rank * c, (rank + 1) * c)
    visible = torch.arange(world * c)[None, :] <= positions[:, None]
    scores = (q.double() @ keys.transpose(-2, -1) * q.shape[-1] ** -0.5)
    return scores.masked_fill(~visible, float("-inf")).softmax(dim=-1) @ values
""", "output is float64; q, k and v are float32"),
]
