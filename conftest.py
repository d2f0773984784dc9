"""Shared by every test run here, notebooks included.

nbval reports a cell that raised with its traceback only. What the cell printed before it
raised (often the very values an assert compared) is lost, and a failure seen once on a busy CI
machine cannot be diagnosed afterwards. This hook adds it to the failure's report, as a section
"printed by the cell", next to pytest's own "Captured ..." sections.
"""

from __future__ import annotations

import pytest


def printed_by(outputs: list[dict]) -> str:
    """The text a cell wrote (streams, text results, errors), in order, as nbval collected it."""
    parts = []
    for out in outputs:
        kind = out.get("output_type")
        if kind == "stream":
            parts.append(out.get("text", ""))
        elif kind in ("execute_result", "display_data"):
            text = out.get("data", {}).get("text/plain")
            if text is not None:
                parts.append(text + "\n")
        elif kind == "error":
            parts.append(f"{out.get('ename', '')}: {out.get('evalue', '')}\n")
    return "".join(parts)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    outputs = getattr(item, "test_outputs", None)  # nbval's cell items keep what they collected
    if report.failed and call.when == "call" and outputs:
        text = printed_by(outputs)
        if text.strip():
            report.sections.append(("printed by the cell", text))
