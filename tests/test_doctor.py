"""python -m distlab doctor: a real checklist run, and how a failed check reads."""

from __future__ import annotations

import subprocess
import sys

from distlab import doctor


def test_doctor_runs_a_real_launch_and_passes_on_this_machine():
    out = subprocess.run(
        [sys.executable, "-m", "distlab", "doctor"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("distlab ")
    assert any(x.startswith("✓ 4-rank launch with all_reduce") and "correct" in x for x in lines)
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
