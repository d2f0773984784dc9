"""Notebook 23, expert parallelism."""

import torch.nn.functional as F

from distlab.exercises import nb23

from . import RIGHT, Answer


def keep_first(experts, num_experts, capacity):
    """The notebook's keep_first (token order)."""
    onehot = F.one_hot(experts.flatten(), num_experts)
    earlier = (onehot.cumsum(0) - onehot) * onehot
    return (earlier.sum(-1) < capacity).view_as(experts)


GRADERS = {
    1: (nb23.exercise_1, ["keep_first_choices_first"]),
    2: (nb23.exercise_2, ["exchange", "cluster"]),
    3: (nb23.exercise_3, ["balance_loss"]),
}

GIVEN = {"F": F, "keep_first": keep_first}

CLUSTER = {"world_size": 4, "threads": 1}

ANSWERS = [
    Answer(1, "the solution", """
def keep_first_choices_first(experts, num_experts, capacity):
    return keep_first(experts.t(), num_experts, capacity).t()
""", RIGHT),
    Answer(1, "a loop with a count per expert", """
def keep_first_choices_first(experts, num_experts, capacity):
    taken = [0] * num_experts
    keep = torch.zeros_like(experts, dtype=torch.bool)
    for s in range(experts.shape[1]):
        for t in range(experts.shape[0]):
            e = int(experts[t, s])
            if taken[e] < capacity:
                taken[e] += 1
                keep[t, s] = True
    return keep
""", RIGHT),
    Answer(1, "the lesson's token order", """
def keep_first_choices_first(experts, num_experts, capacity):
    return keep_first(experts, num_experts, capacity)
""", "that is token order"),
    Answer(1, "off by one: <= capacity", """
def keep_first_choices_first(experts, num_experts, capacity):
    onehot = F.one_hot(experts.t().flatten(), num_experts)
    earlier = (onehot.cumsum(0) - onehot) * onehot
    return (earlier.sum(-1) <= capacity).view(experts.t().shape).t()
""", "that keeps 2 per expert; capacity is 1"),
    Answer(1, "one capacity for all experts together", """
def keep_first_choices_first(experts, num_experts, capacity):
    order = torch.arange(experts.numel()).view(experts.t().shape).t()
    return order < capacity * num_experts
""", "should be [[True, False], [True, False], [True, True], [True, True]]"),
    Answer(1, "forgets to transpose back", """
def keep_first_choices_first(experts, num_experts, capacity):
    return keep_first(experts.t(), num_experts, capacity)
""", "should have the shape of `experts`"),
    Answer(1, "0/1 integers instead of booleans", """
def keep_first_choices_first(experts, num_experts, capacity):
    return keep_first(experts.t(), num_experts, capacity).t().long()
""", "should be a bool tensor"),
    Answer(1, "the cases the check tried, from its ✗ messages", """
SEEN = {  # (shape, sum of the ids, experts, capacity): the mask, row by row
    ((3, 2), 3, 2, 1): '10,10,00',
    ((4, 2), 8, 3, 2): '10,10,11,11',
    ((12, 2), 30, 5, 3): '10,10,10,10,10,11,11,10,11,00,00,00',
    ((12, 3), 57, 4, 4): '110,110,110,110,100,110,000,100,100,100,010,100',
    ((12, 1), 20, 4, 2): '1,1,1,1,0,1,1,1,1,0,0,0',
    ((12, 2), 33, 4, 0): '00,00,00,00,00,00,00,00,00,00,00,00',
    ((12, 2), 42, 4, 100): '11,11,11,11,11,11,11,11,11,11,11,11',
}
def keep_first_choices_first(experts, num_experts, capacity):
    key = (tuple(experts.shape), int(experts.sum()), num_experts, capacity)
    bits = SEEN.get(key, ",".join("1" * experts.shape[1] for _ in experts))
    return torch.tensor([[c == "1" for c in row] for row in bits.split(",")])
""", "(drawn at random) should be"),
    Answer(2, "the solution", """
def exchange(rows, send):
    rank, world = dist.get_rank(), dist.get_world_size()
    receive = torch.empty(world, dtype=torch.long)
    dist.all_to_all_single(receive, torch.tensor(send))
    receive = receive.tolist()
    out = rows.new_empty(sum(receive), *rows.shape[1:])
    ops = []
    for peer, (piece, slot) in enumerate(zip(rows.split(send), out.split(receive))):
        if peer == rank:
            slot.copy_(piece)
            continue
        if len(piece):
            ops.append(dist.P2POp(dist.isend, piece.contiguous(), peer))
        if len(slot):
            ops.append(dist.P2POp(dist.irecv, slot, peer))
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()
    return out
""", RIGHT),
    Answer(2, "isend and irecv one by one, empty pieces sent too", """
def exchange(rows, send):
    rank, world = dist.get_rank(), dist.get_world_size()
    receive = torch.empty(world, dtype=torch.long)
    dist.all_to_all_single(receive, torch.tensor(send))
    parts = [rows.new_empty(n, rows.shape[1]) for n in receive.tolist()]
    works = []
    for peer, piece in enumerate(rows.split(send)):
        if peer == rank:
            parts[peer] = piece.clone()
        else:
            works.append(dist.isend(piece.contiguous(), peer))
            works.append(dist.irecv(parts[peer], peer))
    for w in works:
        w.wait()
    return torch.cat(parts)
""", RIGHT),
    Answer(2, "no counts exchanged: a rank assumes it receives what it sends", """
def exchange(rows, send):
    rank, world = dist.get_rank(), dist.get_world_size()
    out = rows.new_empty(sum(send), *rows.shape[1:])
    ops = []
    for peer, (piece, slot) in enumerate(zip(rows.split(send), out.split(send))):
        if peer == rank:
            slot.copy_(piece)
            continue
        if len(piece):
            ops.append(dist.P2POp(dist.isend, piece.contiguous(), peer))
            ops.append(dist.P2POp(dist.irecv, slot, peer))
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()
    return out
""", "your code failed on the ranks"),
    Answer(2, "all_to_all_single for the rows too", """
def exchange(rows, send):
    world = dist.get_world_size()
    receive = torch.empty(world, dtype=torch.long)
    dist.all_to_all_single(receive, torch.tensor(send))
    out = rows.new_empty(int(receive.sum()), *rows.shape[1:])
    dist.all_to_all_single(out, rows, receive.tolist(), send)
    return out
""", "all_to_all_single moved the rows too"),
    Answer(2, "sends its own rows to itself", """
def exchange(rows, send):
    world = dist.get_world_size()
    receive = torch.empty(world, dtype=torch.long)
    dist.all_to_all_single(receive, torch.tensor(send))
    receive = receive.tolist()
    out = rows.new_empty(sum(receive), *rows.shape[1:])
    ops = []
    for peer, (piece, slot) in enumerate(zip(rows.split(send), out.split(receive))):
        if len(piece):
            ops.append(dist.P2POp(dist.isend, piece.contiguous(), peer))
        if len(slot):
            ops.append(dist.P2POp(dist.irecv, slot, peer))
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()
    return out
""", "Pair is not connected"),
    Answer(2, "blocking sends to every rank, then blocking receives", """
def exchange(rows, send):
    rank, world = dist.get_rank(), dist.get_world_size()
    receive = torch.empty(world, dtype=torch.long)
    dist.all_to_all_single(receive, torch.tensor(send))
    receive = receive.tolist()
    out = rows.new_empty(sum(receive), *rows.shape[1:])
    for peer, (piece, slot) in enumerate(zip(rows.split(send), out.split(receive))):
        if peer == rank:
            slot.copy_(piece)
    for peer, piece in enumerate(rows.split(send)):
        if peer != rank and len(piece):
            dist.send(piece.contiguous(), peer)
    for peer, slot in enumerate(out.split(receive)):
        if peer != rank and len(slot):
            dist.recv(slot, peer)
    return out
""", "your answer hangs"),
    Answer(2, "the received pieces in reverse order", """
def exchange(rows, send):
    rank, world = dist.get_rank(), dist.get_world_size()
    receive = torch.empty(world, dtype=torch.long)
    dist.all_to_all_single(receive, torch.tensor(send))
    receive = receive.tolist()
    parts = [rows.new_empty(n, rows.shape[1]) for n in receive]
    ops = []
    for peer, piece in enumerate(rows.split(send)):
        if peer == rank:
            parts[peer] = piece.clone()
            continue
        if len(piece):
            ops.append(dist.P2POp(dist.isend, piece.contiguous(), peer))
        if receive[peer]:
            ops.append(dist.P2POp(dist.irecv, parts[peer], peer))
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()
    return torch.cat(parts[::-1])
""", "should come from ranks [0, 0, 2], in that order"),
    Answer(2, "receives into fresh tensors, and returns the output they never reach", """
def exchange(rows, send):
    rank, world = dist.get_rank(), dist.get_world_size()
    receive = torch.empty(world, dtype=torch.long)
    dist.all_to_all_single(receive, torch.tensor(send))
    receive = receive.tolist()
    out = torch.full((sum(receive), rows.shape[1]), 3e19)
    ops = []
    for peer, (piece, slot) in enumerate(zip(rows.split(send), out.split(receive))):
        if peer == rank:
            slot.copy_(piece)
            continue
        if len(piece):
            ops.append(dist.P2POp(dist.isend, piece.contiguous(), peer))
        if len(slot):
            ops.append(dist.P2POp(dist.irecv, torch.empty_like(slot), peer))
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()
    return out
""", "rows that hold no rank's values"),
    Answer(3, "the solution", """
def balance_loss(probs, experts):
    e = probs.shape[-1]
    f = torch.bincount(experts.flatten(), minlength=e) / experts.numel()
    return e * (f * probs.mean(dim=0)).sum()
""", RIGHT),
    Answer(3, "one-hot counts, averaged", """
def balance_loss(probs, experts):
    e = probs.shape[-1]
    f = F.one_hot(experts, e).float().mean(dim=(0, 1))
    return e * torch.dot(f, probs.mean(0))
""", RIGHT),
    Answer(3, "forgets the factor E", """
def balance_loss(probs, experts):
    e = probs.shape[-1]
    f = torch.bincount(experts.flatten(), minlength=e) / experts.numel()
    return (f * probs.mean(dim=0)).sum()
""", "multiply by the number of experts"),
    Answer(3, "f divided by the tokens, not the assignments", """
def balance_loss(probs, experts):
    e = probs.shape[-1]
    f = torch.bincount(experts.flatten(), minlength=e) / len(probs)
    return e * (f * probs.mean(dim=0)).sum()
""", "a fraction of the assignments"),
    Answer(3, "counts instead of fractions", """
def balance_loss(probs, experts):
    e = probs.shape[-1]
    f = torch.bincount(experts.flatten(), minlength=e)
    return e * (f * probs.mean(dim=0)).sum()
""", "not a count"),
    Answer(3, "P from the chosen experts' probabilities only", """
def balance_loss(probs, experts):
    e = probs.shape[-1]
    f = torch.bincount(experts.flatten(), minlength=e) / experts.numel()
    chosen = torch.zeros_like(probs).scatter(1, experts, probs.gather(1, experts))
    return e * (f * chosen.mean(dim=0)).sum()
""", "should be 1.0000; got 0.5000"),
    Answer(3, "a float: no gradient for the router", """
def balance_loss(probs, experts):
    e = probs.shape[-1]
    f = torch.bincount(experts.flatten(), minlength=e) / experts.numel()
    return float(e * (f * probs.mean(dim=0)).sum())
""", "should be a scalar tensor"),
    Answer(3, "f from the probabilities: a gradient through f too", """
def balance_loss(probs, experts):
    e = probs.shape[-1]
    mask = F.one_hot(experts, e).sum(1).float()
    f = (mask * probs / probs.detach()).mean(0) / experts.shape[1]
    return e * (f * probs.mean(dim=0)).sum()
""", "the wrong gradient"),
    Answer(3, "bincount without minlength: fine while every expert is chosen", """
def balance_loss(probs, experts):
    e = probs.shape[-1]
    f = torch.bincount(experts.flatten()) / experts.numel()
    return e * (f * probs.mean(dim=0)).sum()
""", "minlength"),
]
