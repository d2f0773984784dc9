"""Ranks that wait for each other, told from ranks that work: by the CPU they use.

A grader's wait for a learner's answer is stretched by the load (`distlab._patience.patience`)
so that slow is not called hung on a busy laptop. But ranks blocked in a collective or a recv
that one of them never joins use no CPU, and waiting longer changes nothing: past the quiet
machine's limit (`distlab._patience.hang_when_idle`) they are called hung at once. A rank that
computes on a machine with 10 tasks per core still gets about 0.1 s of each second.

The same test ends the wait after an interrupt (`collect_interrupted`): a rank in Python stops
within milliseconds of SIGINT, and one still there a moment later that uses no CPU is blocked
inside C++ (a collective's wait, a store's get) and would never stop.
"""

from __future__ import annotations

import time

#: Ranks that used less than `CPU` seconds together over `WINDOW` seconds are blocked, not slow.
WINDOW = 1.0
CPU = 0.03
#: After an interrupt: the window that tells a rank blocked in C++ from one computing in it.
INTERRUPT_WINDOW = 0.25


def cpu_seconds(pids) -> dict[int, float] | None:
    """Each live process's CPU seconds so far (user + system, all its threads), leaving out one
    that runs or waits on a disk now (so that it never looks idle); None where psutil cannot
    tell (then nothing is called idle)."""
    try:
        import psutil
    except ImportError:
        return None
    seen = {}
    for pid in pids:
        try:
            p = psutil.Process(pid)
            with p.oneshot():
                if p.status() in (psutil.STATUS_RUNNING, psutil.STATUS_DISK_SLEEP):
                    continue
                t = p.cpu_times()
                seen[pid] = t.user + t.system
        except psutil.Error:
            continue  # gone: its death is reported by its own channel
        except Exception:  # noqa: BLE001 -- an unknown platform: never call anything idle
            return None
    return seen


def _pids(group, task) -> list[int]:
    return [group.procs[r].pid for r in task.pending]


def _blocked(before, now, pids, cpu: float) -> bool:
    """Were all ``pids`` sampled both times (none running then), and did they use less than
    ``cpu`` seconds together in between? False where psutil could not tell."""
    if before is None or now is None:
        return False
    alike = [pid for pid in pids if pid in before and pid in now]
    return len(alike) == len(pids) and sum(now[pid] - before[pid] for pid in alike) < cpu


def collect_while_working(group, task, deadline: float, stream: bool, grace: float) -> bool:
    """Past a hang's limit on a quiet machine, let ``group`` collect ``task``'s replies until
    ``deadline`` (the limit stretched by the load) only while its ranks still running work:
    True if they were called hung early, for using no CPU over `WINDOW` seconds."""
    before = cpu_seconds(_pids(group, task))
    while task.pending and time.monotonic() < deadline:
        if before is None or task.first_failure_at is not None:
            group.collect(task, deadline, stream, grace)  # as without: psutil cannot tell
            return False
        group.collect(task, min(deadline, time.monotonic() + WINDOW), stream, grace)
        now = cpu_seconds(_pids(group, task))
        if task.pending and _blocked(before, now, _pids(group, task), CPU):
            return True
        before = now if now is not None else before
    return False


def collect_interrupted(group, task, deadline: float, stream: bool, grace: float) -> None:
    """After SIGINT to ``task``'s pending ranks: let ``group`` collect their replies until
    ``deadline`` (the interrupt's wait, stretched by the load), or until those still running
    have used no CPU over `INTERRUPT_WINDOW` seconds (blocked inside C++: waiting longer changes
    nothing). Where psutil cannot tell, until ``deadline``."""

    def window():
        group.collect(task, min(deadline, time.monotonic() + INTERRUPT_WINDOW), stream, grace)

    window()  # ranks in Python stop now
    before = cpu_seconds(_pids(group, task))
    while task.pending and time.monotonic() < deadline:
        window()
        now = cpu_seconds(_pids(group, task))
        if task.pending and _blocked(before, now, _pids(group, task),
                                     CPU * INTERRUPT_WINDOW / WINDOW):
            return
        before = now
