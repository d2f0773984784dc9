"""Notebook 27, training through failures."""

from distlab.exercises import nb27

from . import RIGHT, Answer, variant

GRADERS = {
    1: (nb27.exercise_1, ["checkpoint_interval"]),
    2: (nb27.exercise_2, ["find_straggler"]),
    3: (nb27.exercise_3, ["entered_last"]),
    4: (nb27.exercise_4, ["resume_step"]),
}

_ENTERED = """
def entered_last(dumps):
    entered = {}
    for rank, dump in enumerate(dumps):
        for e in dump["entries"]:
            key = (e["process_group"][0], e["collective_seq_id"])
            entered.setdefault(key, {})[rank] = e["time_created_ns"]
    return {key: max(times, key=times.get) for key, times in entered.items()
            if len(times) == len(dumps)}
"""
_PAIRED = """
def entered_last(dumps):
    out = {}
    for row in zip(*(d["entries"] for d in dumps)):
        times = [e["time_created_ns"] for e in row]
        out[(row[0]["process_group"][0], row[0]["collective_seq_id"])] = times.index(max(times))
    return out
"""
_RESUME = """
def resume_step(listing):
    done = [int(name.split("-")[1]) for name, files in listing.items()
            if name.startswith("step-") and name.split("-")[1].isdigit() and ".metadata" in files]
    return max(done, default=0)
"""


def _resume(old: str, new: str) -> str:
    return variant(_RESUME, (old, new))


_KEEP = "\n            if len(times) == len(dumps)}"

ANSWERS = [
    Answer(1, "the solution", """
def checkpoint_interval(save_seconds, gpus, gpu_mtbf_hours):
    return (2 * save_seconds * gpu_mtbf_hours * 3600 / gpus) ** 0.5
""", RIGHT),
    Answer(1, "without the factor 2", """
def checkpoint_interval(save_seconds, gpus, gpu_mtbf_hours):
    return (save_seconds * gpu_mtbf_hours * 3600 / gpus) ** 0.5
""", "without the factor 2"),
    Answer(1, "one GPU's MTBF taken as the job's", """
def checkpoint_interval(save_seconds, gpus, gpu_mtbf_hours):
    return (2 * save_seconds * gpu_mtbf_hours * 3600) ** 0.5
""", "divide one GPU's MTBF by the number of GPUs"),
    Answer(1, "hours left as hours", """
def checkpoint_interval(save_seconds, gpus, gpu_mtbf_hours):
    return (2 * save_seconds * gpu_mtbf_hours / gpus) ** 0.5
""", "turn it into seconds"),
    Answer(1, "the answer in minutes", """
def checkpoint_interval(save_seconds, gpus, gpu_mtbf_hours):
    return (2 * save_seconds * gpu_mtbf_hours * 3600 / gpus) ** 0.5 / 60
""", "seconds"),
    Answer(1, "no square root", """
def checkpoint_interval(save_seconds, gpus, gpu_mtbf_hours):
    return 2 * save_seconds * gpu_mtbf_hours * 3600 / gpus
""", "take the square root"),
    Answer(1, "the job's MTBF instead of the interval", """
def checkpoint_interval(save_seconds, gpus, gpu_mtbf_hours):
    return gpu_mtbf_hours * 3600 / gpus
""", "the job's MTBF"),
    Answer(1, "a string", """
def checkpoint_interval(save_seconds, gpus, gpu_mtbf_hours):
    return f"{(2 * save_seconds * gpu_mtbf_hours * 3600 / gpus) ** 0.5:.0f} s"
""", "should return a number of seconds"),
    Answer(1, "the Llama 3 figure, whatever the job", """
def checkpoint_interval(save_seconds, gpus, gpu_mtbf_hours):
    return 221.0
""", "should be"),
    Answer(2, "the solution: largest median time before the collective", """
import statistics

def find_straggler(times):
    return max(times, key=lambda r: statistics.median(b for b, _ in times[r]))
""", RIGHT),
    Answer(2, "also right: shortest median wait inside the collective", """
import statistics

def find_straggler(times):
    return min(times, key=lambda r: statistics.median(i for _, i in times[r]))
""", RIGHT),
    Answer(2, "the mean time before the collective: one bad step decides", """
def find_straggler(times):
    return max(times, key=lambda r: sum(b for b, _ in times[r]) / len(times[r]))
""", "take the median"),
    Answer(2, "the slowest single step", """
def find_straggler(times):
    return max(times, key=lambda r: max(b for b, _ in times[r]))
""", "had one bad step"),
    Answer(2, "the longest wait inside the collective", """
import statistics

def find_straggler(times):
    return max(times, key=lambda r: statistics.median(i for _, i in times[r]))
""", "one of the fast ranks"),
    Answer(2, "the longest step (they are all alike)", """
import statistics

def find_straggler(times):
    return max(times, key=lambda r: statistics.median(b + i for b, i in times[r]))
""", "not"),
    Answer(2, "the first step only", """
def find_straggler(times):
    return max(times, key=lambda r: times[r][0][0])
""", "not"),
    Answer(2, "the first step dropped (the warm-up), then the largest mean before", """
def find_straggler(times):
    return max(times, key=lambda r: sum(b for b, _ in times[r][1:]) / (len(times[r]) - 1))
""", "a bad step can come anywhere"),
    Answer(2, "the last step alone: the freshest measurement", """
def find_straggler(times):
    return max(times, key=lambda r: times[r][-1][0])
""", "had one bad step"),
    Answer(2, "the shortest median step time: it waits for no one", """
import statistics

def find_straggler(times):
    return min(times, key=lambda r: statistics.median(b + i for b, i in times[r]))
""", "the step times are all about alike"),
    Answer(2, "also right: the most steps slowest before the collective, numpy's argmax", """
import numpy as np

def find_straggler(times):
    ranks = sorted(times)
    before = np.array([[b for b, _ in times[r]] for r in ranks])  # ranks x steps
    slowest = np.bincount(before.argmax(axis=0), minlength=len(ranks))
    return ranks[int(np.argmax(slowest))]
""", RIGHT),
    Answer(2, "also right, as a numpy integer: the largest median before", """
import numpy as np

def find_straggler(times):
    return np.argmax([np.median([b for b, _ in times[r]]) for r in sorted(times)])
""", RIGHT),
    Answer(2, "the rank as a string", """
import statistics

def find_straggler(times):
    return str(max(times, key=lambda r: statistics.median(b for b, _ in times[r])))
""", "should return a rank (an int)"),
    Answer(3, "the solution: by group and call number, the largest entry time", _ENTERED, RIGHT),
    Answer(3, "the entries paired by their place in the buffers", _PAIRED,
           "match them by group and call number"),
    Answer(3, "the rank that entered first", variant(_ENTERED, (
        "max(times, key=times.get)", "min(times, key=times.get)")), "entered *first*"),
    Answer(3, "the call number alone, groups mixed up", variant(_ENTERED, (
        'key = (e["process_group"][0], e["collective_seq_id"])', 'key = e["collective_seq_id"]')),
        "call numbers start at 1 again in every group"),
    Answer(3, "calls some rank no longer holds kept", variant(_ENTERED, (_KEEP, "}")),
           "leave out the calls some rank no longer holds"),
    Answer(3, "the group's description instead of its name, with the call number", variant(
        _ENTERED, ('e["process_group"][0]', 'e["process_group"][1]')), "no rank recorded"),
    Answer(3, "the latest time instead of the rank", variant(_ENTERED, (
        "max(times, key=times.get)", "max(times.values())")), "each value should be a rank, 0 to"),
    Answer(3, "a list of pairs instead of a dict", variant(
        _ENTERED, ("return {key: max(times, key=times.get) for",
                   "return [(key, max(times, key=times.get)) for"),
        (_KEEP, "\n            if len(times) == len(dumps)]")), "should return a dict"),
    Answer(3, "the entries paired counting from the newest", variant(_PAIRED, (
        'd["entries"] for d', 'd["entries"][::-1] for d')), "buffers end at different calls too"),
    Answer(4, "the solution", _RESUME, RIGHT),
    Answer(4, "sorted names, newest complete by walking back", """
def resume_step(listing):
    steps = sorted((int(n[5:]) for n in listing if n.startswith("step-") and n[5:].isdigit()),
                   reverse=True)
    for step in steps:
        if ".metadata" in listing[f"step-{step}"]:
            return step
    return 0
""", RIGHT),
    Answer(4, "the names compared as strings: step-9 after step-12", """
def resume_step(listing):
    done = [name for name, files in listing.items()
            if name.startswith("step-") and ".metadata" in files]
    return int(max(done)[5:]) if done else 0
""", "compare the steps as numbers"),
    Answer(4, "the newest directory, .metadata or not", _resume(
        ' and ".metadata" in files]', "]"), "has no .metadata"),
    Answer(4, "any directory with files counts as saved", _resume(
        ' and ".metadata" in files]', " and files]"), "has no .metadata"),
    Answer(4, "always one save back: the newest assumed unfinished", """
def resume_step(listing):
    steps = sorted(int(n.split("-")[1]) for n in listing
                   if n.startswith("step-") and n.split("-")[1].isdigit())
    return steps[-2] if len(steps) > 1 else 0
""", "resume from step"),
    Answer(4, "the directory's name returned, not its step", _resume(
        "return max(done, default=0)", 'return f"step-{max(done)}" if done else 0'), "as an int"),
    Answer(4, "None when nothing is complete", _resume(
        "return max(done, default=0)", "return max(done) if done else None"), "the answer is 0"),
    Answer(4, "the notebook's step-6 hard-coded", """
def resume_step(listing):
    return 6
""", "resume from step"),
]
