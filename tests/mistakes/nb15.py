"""Notebook 15, memory per rank."""

from distlab.exercises import nb15

from . import RIGHT, Answer

GRADERS = {
    1: (nb15.exercise_1, ["predict_fsdp_sgd", "cluster"]),
    2: (nb15.exercise_2, ["zero1_adam_bytes", "cluster"]),
    3: (nb15.exercise_3, ["all_gathers_per_step", "cluster"]),
    4: (nb15.exercise_4, ["smallest_tp"]),
}

CLUSTER = {"world_size": 4, "threads": 1}

ANSWERS = [
    Answer(1, "the solution", """
def predict_fsdp_sgd(psi, n):
    return 4 * psi // n, 4 * psi // n, 4 * psi // n
""", RIGHT),
    Answer(1, "Adam's 8 bytes of state per parameter", """
def predict_fsdp_sgd(psi, n):
    return 4 * psi // n, 4 * psi // n, 8 * psi // n
""", "optimizer 33,280 (measured 16,640)"),
    Answer(1, "the momentum buffer not sharded", """
def predict_fsdp_sgd(psi, n):
    return 4 * psi // n, 4 * psi // n, 4 * psi
""", "optimizer 66,560 (measured 16,640)"),
    Answer(1, "SGD keeps no state at all", """
def predict_fsdp_sgd(psi, n):
    return 4 * psi // n, 4 * psi // n, 0
""", "optimizer 0 (measured 16,640)"),
    Answer(1, "ZeRO-2: parameters whole", """
def predict_fsdp_sgd(psi, n):
    return 4 * psi, 4 * psi // n, 4 * psi // n
""", "params 66,560 (measured 16,640)"),
    Answer(1, "floats from /", """
def predict_fsdp_sgd(psi, n):
    return 4 * psi / n, 4 * psi / n, 4 * psi / n
""", "use // to divide"),
    Answer(1, "an empty tuple", """
def predict_fsdp_sgd(psi, n):
    return ()
""", "should be a tuple of 3 ints"),
    Answer(2, "the solution", """
def zero1_adam_bytes(numels, n):
    held = [0] * n
    for numel in sorted(numels, reverse=True):
        held[held.index(min(held))] += numel
    return [8 * h for h in held]
""", RIGHT),
    Answer(2, "round robin, in the model's order", """
def zero1_adam_bytes(numels, n):
    held = [0] * n
    for i, numel in enumerate(numels):
        held[i % n] += numel
    return [8 * h for h in held]
""", "should be 32768; got"),
    Answer(2, "greedy, but unsorted", """
def zero1_adam_bytes(numels, n):
    held = [0] * n
    for numel in numels:
        held[held.index(min(held))] += numel
    return [8 * h for h in held]
""", "zero1_adam_bytes("),
    Answer(2, "a tie goes to the highest rank", """
def zero1_adam_bytes(numels, n):
    held = [0] * n
    for numel in sorted(numels, reverse=True):
        lowest = min(held)
        held[n - 1 - held[::-1].index(lowest)] += numel
    return [8 * h for h in held]
""", "zero1_adam_bytes([4096"),
    Answer(2, "4 bytes: m only", """
def zero1_adam_bytes(numels, n):
    held = [0] * n
    for numel in sorted(numels, reverse=True):
        held[held.index(min(held))] += numel
    return [4 * h for h in held]
""", "should be 32768; got 16384"),
    Answer(2, "a tuple", """
def zero1_adam_bytes(numels, n):
    held = [0] * n
    for numel in sorted(numels, reverse=True):
        held[held.index(min(held))] += numel
    return tuple(8 * h for h in held)
""", "asks for a list"),
    Answer(3, "the solution", """
def all_gathers_per_step(reshard_after_forward):
    return 8 if reshard_after_forward else 4
""", RIGHT),
    Answer(3, "the same either way", """
def all_gathers_per_step(reshard_after_forward):
    return 4
""", "with reshard_after_forward=True, each rank ran 8"),
    Answer(3, "the root counted as a unit of its own", """
def all_gathers_per_step(reshard_after_forward):
    return 10 if reshard_after_forward else 5
""", "each rank ran 8 all-gathers"),
    Answer(3, "swapped", """
def all_gathers_per_step(reshard_after_forward):
    return 4 if reshard_after_forward else 8
""", "you predicted 4"),
    Answer(3, "a string", """
def all_gathers_per_step(reshard_after_forward):
    return "8" if reshard_after_forward else "4"
""", "should be a count, an int"),
    Answer(4, "the answer", """
def smallest_tp():
    return 4
""", RIGHT),
    Answer(4, "tp=2: the total fits, the peak does not", """
def smallest_tp():
    return 2
""", "82.4 GB at its peak"),
    Answer(4, "tp=8: fits, but so does 4", """
def smallest_tp():
    return 8
""", "but so does a smaller size"),
    Answer(4, "tp=1: full checkpointing alone is not enough on 8 devices", """
def smallest_tp():
    return 1
""", "164.4 GB at its peak"),
    Answer(4, "tp=16: more than the key-value heads", """
def smallest_tp():
    return 16
""", "must divide its 8 key-value heads"),
    Answer(4, "tp=3", """
def smallest_tp():
    return 3
""", "tp=3 cannot split"),
    Answer(4, "tp=64: one per device of the whole job", """
def smallest_tp():
    return 64
""", "tp=64 cannot split"),
    Answer(4, "a float", """
def smallest_tp():
    return 4.0
""", "an int"),
]
