"""python -m distlab doctor: a real checklist run, and how a failed check reads."""

from __future__ import annotations

import subprocess
import sys

from distlab import doctor
from distlab._patience import patience


def test_doctor_runs_a_real_launch_and_passes_on_this_machine():
    out = subprocess.run(
        [sys.executable, "-m", "distlab", "doctor"], capture_output=True, text=True,
        timeout=patience(120),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("distlab ")
    launch = [x for x in lines if x.startswith("✓ 4-rank launch with all_reduce, result correct")]
    assert launch and "start path forkserver" in launch[0], lines
    loopback = "✓ every socket the ranks listen on is on loopback (127."
    assert any(x.startswith(loopback) for x in lines)
    assert any(x.startswith("✓ torch.distributed with the gloo backend") for x in lines)
    assert any(x.startswith("✓ JupyterLab ") for x in lines)
    assert lines[-1] == "all good: you are ready for the workshop"


def test_a_failed_check_says_how_to_fix_it(monkeypatch):
    monkeypatch.setattr(doctor, "_version", lambda dist: None)
    check = doctor.check_package("jupyterlab", "JupyterLab")
    assert not check.ok
    assert check.line() == "✗ JupyterLab is not installed\n    fix: run `make lab`"


def test_usage_is_printed_for_unknown_commands(capsys):
    from distlab.__main__ import main

    assert main(["frobnicate"]) == 2
    assert "python -m distlab doctor" in capsys.readouterr().out


def test_loopback_check_never_ticks_what_it_could_not_see():
    assert doctor.loopback_check([["127.0.0.1"], ["127.0.0.1", "::1"]]).ok is True
    blind = doctor.loopback_check([["127.0.0.1"], None])
    assert blind.ok is None
    assert blind.line().startswith("? could not list the sockets the ranks listen on (rank(s) 1)")
    exposed = doctor.loopback_check([["127.0.0.1"], ["0.0.0.0"]])
    assert exposed.ok is False
    assert exposed.line().startswith("✗ ranks listen on 0.0.0.0: reachable from the network")
    assert "GLOO_SOCKET_IFNAME=lo" in exposed.line()


def test_a_rank_that_cannot_list_its_sockets_says_so(monkeypatch):
    import psutil

    def denied(self, kind="inet"):
        raise psutil.AccessDenied(self.pid)

    monkeypatch.setattr(psutil.Process, "net_connections", denied)
    assert doctor._listening_addresses() is None


def test_a_failed_launch_is_a_problem_and_leaves_loopback_unchecked(monkeypatch):
    import distlab

    def broken(*args, **kwargs):
        raise distlab.StartError("rank 1 did not start within 60 s: it was still importing torch.")

    monkeypatch.setattr(distlab, "launch", broken)
    launched, loop = doctor.check_launch()
    assert launched.ok is False and loop.ok is None
    assert launched.line().startswith("✗ 4-rank launch failed: rank 1 did not start within 60 s")
    assert loop.line() == "? loopback-only sockets: not checked (the launch failed)"


def test_run_counts_problems_and_blind_checks_apart(monkeypatch, capsys):
    monkeypatch.setattr(
        doctor, "check_launch",
        lambda: (doctor.Check(True, "launch"), doctor.Check(None, "could not look")),
    )
    assert doctor.run() == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "no problem found, but 1 check(s) could not look (marked ?)"
    )
    monkeypatch.setattr(doctor, "check_gloo", lambda: doctor.Check(False, "no gloo", "fix it"))
    assert doctor.run() == 1
    assert capsys.readouterr().out.splitlines()[-1] == "1 problem(s) above"
