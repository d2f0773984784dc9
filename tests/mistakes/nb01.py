"""Notebook 01, stores and rendezvous."""

from distlab.exercises import nb01

from . import RIGHT, Answer

GRADERS = {
    1: (nb01.exercise_1, ["reusable_barrier"]),
    2: (nb01.exercise_2, ["elect"]),
    3: (nb01.exercise_3, ["store_all_gather"]),
}

ANSWERS = [
    Answer(1, "the solution", """
def reusable_barrier(store, world_size, name="rbarrier"):
    arrived = store.add(f"{name}/arrived", 1)
    generation = (arrived - 1) // world_size
    if arrived % world_size == 0:
        store.set(f"{name}/go/{generation}", "1")
    store.wait([f"{name}/go/{generation}"])
""", RIGHT),
    Answer(1, "the one-shot barrier of section 5: the second call goes straight through", """
def reusable_barrier(store, world_size, name="rbarrier"):
    arrived = store.add(f"{name}/arrived", 1)
    if arrived == world_size:
        store.set(f"{name}/go", "1")
    store.wait([f"{name}/go"])
""", "call 2 of the barrier let rank"),
    Answer(1, "one gate for every generation", """
def reusable_barrier(store, world_size, name="rbarrier"):
    arrived = store.add(f"{name}/arrived", 1)
    if arrived % world_size == 0:
        store.set(f"{name}/go", "1")
    store.wait([f"{name}/go"])
""", "call 2 of the barrier let rank"),
    Answer(1, "a barrier that does not wait", """
def reusable_barrier(store, world_size, name="rbarrier"):
    store.add(f"{name}/arrived", 1)
""", "call 1 of the barrier let rank 0 through before rank 1"),
    Answer(1, "off by one: generation = arrived // world_size", """
def reusable_barrier(store, world_size, name="rbarrier"):
    arrived = store.add(f"{name}/arrived", 1)
    generation = arrived // world_size
    if arrived % world_size == 0:
        store.set(f"{name}/go/{generation}", "1")
    store.wait([f"{name}/go/{generation}"])
""", "your answer hangs"),
    Answer(2, "the solution", """
def elect(store, rank):
    return int(store.compare_set("leader", "", str(rank)))
""", RIGHT),
    Answer(2, "compare_set that ignores the rule: expects '0', so nobody ever sets it", """
def elect(store, rank):
    return int(store.compare_set("leader", "0", str(rank)))
""", "rank 2 is the leader; rank 0's answer should be 2; got 0"),
    Answer(2, "everyone votes for rank 0", """
def elect(store, rank):
    store.compare_set("leader", "", "0")
    return 0
""", "rank 2 is the leader; rank 0's answer should be 2; got 0"),
    Answer(2, "each rank declares itself", """
def elect(store, rank):
    store.compare_set("leader", "", str(rank))
    return rank
""", "rank 0's answer should be 2; got 0"),
    Answer(2, "set and get: no compare_set, the last writer wins", """
def elect(store, rank):
    store.set("leader", str(rank))
    return int(store.get("leader"))
""", "called store.compare_set 0 times"),
    Answer(2, "returns the store's bytes", """
def elect(store, rank):
    return store.compare_set("leader", "", str(rank))
""", "should be an int: 2; got a bytes: b'2'"),
    Answer(3, "the solution", """
def store_all_gather(store, rank, world_size, text):
    store.set(f"gather/{rank}", text)
    keys = [f"gather/{r}" for r in range(world_size)]
    store.wait(keys)
    return [store.get(k).decode() for k in keys]
""", RIGHT),
    Answer(3, "forgets to decode the bytes", """
def store_all_gather(store, rank, world_size, text):
    store.set(f"gather/{rank}", text)
    return [store.get(f"gather/{r}") for r in range(world_size)]
""", "store.get gives bytes"),
    Answer(3, "builds the texts it expects instead of reading them", """
def store_all_gather(store, rank, world_size, text):
    return [f"hello from {r}" for r in range(world_size)]
""", "rank 0's list[0] should be 'grüß dich'; got 'hello from 0'"),
    Answer(3, "only its own text", """
def store_all_gather(store, rank, world_size, text):
    store.set(f"gather/{rank}", text)
    return [text]
""", "should have 3 entries"),
    Answer(3, "three ranks written in: waits for a rank that does not exist", """
def store_all_gather(store, rank, world_size, text):
    store.set(f"gather/{rank}", text)
    return [store.get(f"gather/{r}").decode() for r in range(3)]
""", "your answer hangs"),
    Answer(3, "a set of texts: the order is lost", """
def store_all_gather(store, rank, world_size, text):
    store.set(f"gather/{rank}", text)
    return {store.get(f"gather/{r}").decode() for r in range(world_size)}
""", "should be a list of 3"),
]
