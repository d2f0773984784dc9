"""distlab._ranks.forksafety: ranks fork from the helper under macOS's rules, or spawn.

Nothing here can run on a Mac; ``DISTLAB_AS_MACOS=1`` applies the same rules on Linux, and test
hooks make the helper do what only a Mac would (a thread in the helper, a canary that prints the
Objective-C runtime's complaint, a rank that dies with it). Each test runs a script of its own:
the switch to the spawn path is for good in a kernel, so it needs a fresh process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from distlab._patience import patience

OBJC = ("objc[4242]: +[NSNumber initialize] may have been in progress in another thread when "
        "fork() was called.")

#: Prints, for each of two launches, "forked" or "spawned" per rank (a forked rank's parent is
#: the helper, a spawned one's the kernel, or a spare the kernel started), then the results.
SCRIPT = """
import os, sys, distlab, torch, torch.distributed as dist

def work(die=False):
    t = torch.ones(1)
    dist.all_reduce(t)
    if die and dist.get_rank() == 1:
        sys.stderr.write({objc!r} + "\\n")
        sys.stderr.flush()
        os.kill(os.getpid(), 5)  # SIGTRAP, as the runtime's abort does
    return os.getppid(), t.item()

def how(results):
    return ["spawned" if ppid == os.getpid() else "forked" for ppid, _ in results]

first = {first}
try:
    print("first", how(distlab.launch(work, first, world_size=2, timeout=60)))
except distlab.RankError as e:
    print("first failed:", str(e).splitlines()[0])
print("second", how(distlab.launch(work, world_size=2, timeout=60)))
"""


#: Every scenario: (environment added, whether the first launch dies in a system framework,
#: whether macOS's rules apply). They run side by side, each in a process of its own.
SCENARIOS = {
    "rules": ({}, "False", True),
    "canary complains": ({"DISTLAB_TEST_CANARY_STDERR": OBJC}, "False", True),
    "thread early": ({"DISTLAB_TEST_HELPER_THREAD": "early"}, "False", True),
    "thread late": ({"DISTLAB_TEST_HELPER_THREAD": "late"}, "False", True),
    "rank dies": ({}, "True", True),
    "linux": ({"DISTLAB_TEST_CANARY_STDERR": OBJC}, "True", False),
}


@pytest.fixture(scope="module")
def runs() -> dict[str, subprocess.CompletedProcess]:
    started = {}
    for name, (extra, first, macos) in SCENARIOS.items():
        env = {k: v for k, v in os.environ.items()
               if k not in ("DISTLAB_START_METHOD", "DISTLAB_AS_MACOS")}
        env.update(extra)
        if macos:
            env["DISTLAB_AS_MACOS"] = "1"
        code = textwrap.dedent(SCRIPT.format(objc=OBJC, first=first))
        started[name] = subprocess.Popen([sys.executable, "-c", code], env=env, text=True,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    done = {}
    for name, proc in started.items():
        out, err = proc.communicate(timeout=patience(280))
        done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done


def _run(runs, name: str) -> subprocess.CompletedProcess:
    out = runs[name]
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _switch_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines()
            if line.startswith("distlab: ranks start as fresh interpreters")]


def test_under_macos_rules_ranks_fork_after_a_canary(runs):
    out = _run(runs, "rules")
    assert "first ['forked', 'forked']" in out.stdout
    assert "second ['forked', 'forked']" in out.stdout
    assert _switch_lines(out.stderr) == []


def test_a_canary_that_meets_the_runtimes_complaint_switches_to_spawn_with_one_line(runs):
    out = _run(runs, "canary complains")
    assert "first ['spawned', 'spawned']" in out.stdout
    assert "second ['spawned', 'spawned']" in out.stdout
    lines = _switch_lines(out.stderr)
    assert len(lines) == 1 and OBJC in lines[0] and "forked test process" in lines[0]


def test_a_helper_that_had_a_thread_before_the_canary_is_never_forked_from(runs):
    out = _run(runs, "thread early")
    assert "first ['spawned', 'spawned']" in out.stdout
    (line,) = _switch_lines(out.stderr)
    assert "the helper has 2 threads before forking" in line


def test_a_helper_that_gains_a_thread_later_refuses_to_fork_and_the_launch_spawns(runs):
    out = _run(runs, "thread late")
    assert "first ['spawned', 'spawned']" in out.stdout  # refused at the fork itself
    (line,) = _switch_lines(out.stderr)
    assert "the helper has 2 threads (it must never have had more than one)" in line


def test_a_rank_that_dies_in_a_system_framework_switches_the_next_launch_to_spawn(runs):
    out = _run(runs, "rank dies")
    assert "first failed: rank 1 died: killed by signal SIGTRAP" in out.stdout
    assert "second ['spawned', 'spawned']" in out.stdout
    (line,) = _switch_lines(out.stderr)
    assert "rank 1 died of a fork in a system framework" in line and OBJC in line


def test_on_linux_without_macos_rules_nothing_changes(runs):
    out = _run(runs, "linux")
    # a crash is a crash: the next launch still forks, and no canary ran to complain
    assert "second ['forked', 'forked']" in out.stdout
    assert _switch_lines(out.stderr) == []


@pytest.mark.parametrize("macos", [True, False])
def test_mps_in_a_forked_rank_says_to_spawn_instead(macos):
    code = textwrap.dedent(
        """
        import distlab, torch
        def ask():
            return torch.backends.mps.is_available()
        try:
            print(distlab.launch(ask, world_size=1, backend=None))
        except distlab.RankError as e:
            print(str(e).splitlines()[0])
        """
    )
    env = dict(os.environ)
    env.pop("DISTLAB_START_METHOD", None)
    if macos:
        env["DISTLAB_AS_MACOS"] = "1"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=patience(120), env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    if macos:
        assert "launch with start_method='spawn' for ranks that use MPS" in out.stdout
    else:
        assert out.stdout.strip() == "[False]"  # Linux has no MPS, and nothing is guarded


@pytest.mark.parametrize("value, rules", [(None, False), ("", False), ("0", False), (" 0 ", False),
                                          ("1", True), ("yes", True)])
def test_distlab_as_macos_0_or_unset_leaves_the_macos_rules_off_on_linux(monkeypatch, value,
                                                                         rules):
    from distlab._ranks import forksafety

    monkeypatch.setattr(forksafety.sys, "platform", "linux")
    if value is None:
        monkeypatch.delenv("DISTLAB_AS_MACOS", raising=False)
    else:
        monkeypatch.setenv("DISTLAB_AS_MACOS", value)
    assert forksafety.macos_rules() is rules


def test_guard_mps_refuses_both_ways_of_asking_for_metal(monkeypatch):
    import torch.backends.mps as mps

    from distlab._ranks import forksafety

    for name in ("is_available", "is_built"):
        monkeypatch.setattr(mps, name, getattr(mps, name))  # put back after the test
    forksafety.guard_mps()
    for name in ("is_available", "is_built"):
        with pytest.raises(RuntimeError, match="launch with start_method='spawn'"):
            getattr(mps, name)()
