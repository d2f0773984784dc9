"""Notebook 02, point-to-point."""

from distlab.exercises import nb02

from . import RIGHT, Answer

GRADERS = {
    1: (nb02.exercise_1, ["ring_shift_blocking"]),
    2: (nb02.exercise_2, ["ring_all_gather"]),
    3: (nb02.exercise_3, ["pipeline", "my_prediction"]),
}

PIPELINE = """
def pipeline():
    rank, world_size = dist.get_rank(), dist.get_world_size()
    x = torch.arange(3.0) if rank == 0 else torch.zeros(3)
    if rank > 0:
        dist.recv(x, src=rank - 1)
        x *= rank + 1
    if rank < world_size - 1:
        dist.send(x, dst=rank + 1)
        return None
    return x.tolist()
"""

ANSWERS = [
    Answer(1, "the solution", """
def ring_shift_blocking():
    rank, world_size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    outbox, inbox = torch.tensor([float(rank)]), torch.zeros(1)
    if rank % 2 == 0:
        dist.send(outbox, dst=right)
        dist.recv(inbox, src=left)
    else:
        dist.recv(inbox, src=left)
        dist.send(outbox, dst=right)
    return inbox.item()
""", RIGHT),
    Answer(1, "rank 0 starts the ring, every other rank receives first", """
def ring_shift_blocking():
    rank, world_size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    inbox = torch.zeros(1)
    if rank == 0:
        dist.send(torch.tensor([0.0]), dst=right)
        dist.recv(inbox, src=left)
    else:
        dist.recv(inbox, src=left)
        dist.send(torch.tensor([float(rank)]), dst=right)
    return inbox.item()
""", RIGHT),
    Answer(1, "every rank sends first: a deadlock", """
def ring_shift_blocking():
    rank, world_size = dist.get_rank(), dist.get_world_size()
    inbox = torch.zeros(1)
    dist.send(torch.tensor([float(rank)]), dst=(rank + 1) % world_size)
    dist.recv(inbox, src=(rank - 1) % world_size)
    return inbox.item()
""", "your answer hangs: rank 0 at line 5 in ring_shift_blocking"),
    Answer(1, "isend and irecv: not blocking", """
def ring_shift_blocking():
    rank, world_size = dist.get_rank(), dist.get_world_size()
    inbox = torch.zeros(1)
    send = dist.isend(torch.tensor([float(rank)]), dst=(rank + 1) % world_size)
    recv = dist.irecv(inbox, src=(rank - 1) % world_size)
    send.wait()
    recv.wait()
    return inbox.item()
""", "called the blocking dist.send 0 times"),
    Answer(1, "sends to the left instead of the right", """
def ring_shift_blocking():
    rank, world_size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    inbox = torch.zeros(1)
    if rank % 2 == 0:
        dist.send(torch.tensor([float(rank)]), dst=left)
        dist.recv(inbox, src=right)
    else:
        dist.recv(inbox, src=right)
        dist.send(torch.tensor([float(rank)]), dst=left)
    return inbox.item()
""", "rank 0's answer (its left neighbour's rank) should be 3.0; got 1.0"),
    Answer(1, "returns the tensor", """
def ring_shift_blocking():
    rank, world_size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    outbox, inbox = torch.tensor([float(rank)]), torch.zeros(1)
    if rank % 2 == 0:
        dist.send(outbox, dst=right)
        dist.recv(inbox, src=left)
    else:
        dist.recv(inbox, src=left)
        dist.send(outbox, dst=right)
    return inbox
""", "should be a float: 3.0; got a float32 tensor"),
    Answer(1, "an int tensor, so an int comes back", """
def ring_shift_blocking():
    rank, world_size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    outbox, inbox = torch.tensor([rank]), torch.zeros(1, dtype=torch.long)
    if rank % 2 == 0:
        dist.send(outbox, dst=right)
        dist.recv(inbox, src=left)
    else:
        dist.recv(inbox, src=left)
        dist.send(outbox, dst=right)
    return inbox.item()
""", "should be a float: 3.0; got an int: 3"),
    Answer(2, "the solution", """
def ring_all_gather(mine):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    slots = [torch.zeros_like(mine) for _ in range(world_size)]
    slots[rank] = mine.clone()
    for step in range(world_size - 1):
        send_slot = (rank - step) % world_size
        recv_slot = (rank - step - 1) % world_size
        works = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, slots[send_slot], right),
            dist.P2POp(dist.irecv, slots[recv_slot], left),
        ])
        for work in works:
            work.wait()
    return slots
""", RIGHT),
    Answer(2, "dist.all_gather instead of the ring", """
def ring_all_gather(mine):
    slots = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(slots, mine)
    return slots
""", "called dist.all_gather"),
    Answer(2, "passes its own value at every step", """
def ring_all_gather(mine):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    slots = [torch.zeros_like(mine) for _ in range(world_size)]
    slots[rank] = mine.clone()
    for step in range(world_size - 1):
        recv_slot = (rank - step - 1) % world_size
        works = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, slots[rank], right),
            dist.P2POp(dist.irecv, slots[recv_slot], left),
        ])
        for work in works:
            work.wait()
    return slots
""", "rank 0's list[1] should be"),
    Answer(2, "world_size steps: one more than the ring needs", """
def ring_all_gather(mine):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    slots = [torch.zeros_like(mine) for _ in range(world_size)]
    slots[rank] = mine.clone()
    for step in range(world_size):
        send_slot = (rank - step) % world_size
        recv_slot = (rank - step - 1) % world_size
        works = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, slots[send_slot], right),
            dist.P2POp(dist.irecv, slots[recv_slot], left),
        ])
        for work in works:
            work.wait()
    return slots
""", "called dist.batch_isend_irecv 4 times; a ring of 4 ranks needs world_size - 1 = 3"),
    Answer(2, "one step only", """
def ring_all_gather(mine):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    slots = [torch.zeros_like(mine) for _ in range(world_size)]
    slots[rank] = mine.clone()
    left = (rank - 1) % world_size
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, slots[rank], (rank + 1) % world_size),
        dist.P2POp(dist.irecv, slots[left], left),
    ])
    for work in works:
        work.wait()
    return slots
""", "a ring of 4 ranks needs world_size - 1 = 3 steps"),
    Answer(2, "returns one tensor, torch.cat(slots)", """
def ring_all_gather(mine):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    slots = [torch.zeros_like(mine) for _ in range(world_size)]
    slots[rank] = mine.clone()
    for step in range(world_size - 1):
        works = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, slots[(rank - step) % world_size], right),
            dist.P2POp(dist.irecv, slots[(rank - step - 1) % world_size], left),
        ])
        for work in works:
            work.wait()
    return torch.cat(slots)
""", "returned a tensor"),
    Answer(2, "starts from 10 * rank, not from its argument", """
def ring_all_gather(mine):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    slots = [torch.zeros(1) for _ in range(world_size)]
    slots[rank] = torch.tensor([10.0 * rank])
    for step in range(world_size - 1):
        works = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, slots[(rank - step) % world_size], right),
            dist.P2POp(dist.irecv, slots[(rank - step - 1) % world_size], left),
        ])
        for work in works:
            work.wait()
    return slots
""", "rank 0's list[0] should be"),
    Answer(3, "the solution", PIPELINE + """
def my_prediction():
    import math
    return (torch.arange(3.0) * math.factorial(4)).tolist()
""", RIGHT),
    Answer(3, "the right prediction, written as ints", PIPELINE + """
def my_prediction():
    return [0, 24, 48]
""", RIGHT),
    Answer(3, "the prediction as a tensor", PIPELINE + """
def my_prediction():
    return torch.arange(3.0) * 24
""", "the exercise asks for a list"),
    Answer(3, "the prediction as a tuple", PIPELINE + """
def my_prediction():
    return (0.0, 24.0, 48.0)
""", "the right values, but the exercise asks for a list"),
    Answer(3, "the prediction forgets rank 0's factor: 2 * 3 * 4 is not 4!", PIPELINE + """
def my_prediction():
    return [0.0, 6.0, 12.0]
""", "your prediction (the list the last of 4 ranks returns)[1] should be 24.0; got 6.0"),
    Answer(3, "every rank returns x", """
def pipeline():
    rank, world_size = dist.get_rank(), dist.get_world_size()
    x = torch.arange(3.0) if rank == 0 else torch.zeros(3)
    if rank > 0:
        dist.recv(x, src=rank - 1)
        x *= rank + 1
    if rank < world_size - 1:
        dist.send(x, dst=rank + 1)
    return x.tolist()

def my_prediction():
    return [0.0, 24.0, 48.0]
""", "only the last rank returns the result"),
    Answer(3, "multiplies by rank, not rank + 1", """
def pipeline():
    rank, world_size = dist.get_rank(), dist.get_world_size()
    x = torch.arange(3.0) if rank == 0 else torch.zeros(3)
    if rank > 0:
        dist.recv(x, src=rank - 1)
        x *= rank
    if rank < world_size - 1:
        dist.send(x, dst=rank + 1)
        return None
    return x.tolist()

def my_prediction():
    return [0.0, 24.0, 48.0]
""", "the last rank's answer[1] should be 24.0; got 6.0"),
    Answer(3, "computes the product locally: no messages", """
def pipeline():
    import math
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if rank < world_size - 1:
        return None
    return (torch.arange(3.0) * math.factorial(world_size)).tolist()

def my_prediction():
    return [0.0, 24.0, 48.0]
""", "rank 0 received 0 and sent 0 messages; it should send x to rank 1"),
]
