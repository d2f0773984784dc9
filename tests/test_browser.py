"""The course in a real JupyterLab, in a real (headless) browser: what a workshop participant sees.

Starts JupyterLab from this environment (loopback, a free port, a token) on a copy of the
notebooks, opens notebook 00 in Debian's Chromium driven by Playwright, clears its outputs, runs
all cells, and checks that per-rank output blocks and the cluster's status widget appear.
A screenshot is saved to test-output/browser/.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from jupyter_lab import (
    CHROMIUM,
    OUT,
    clear_all_outputs,
    in_chromium,
    ms,
    run_all_cells,
    serve,
    until_shown,
)

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "00_launching_from_a_notebook.ipynb"

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (make test installs it)"),
    pytest.mark.skipif(
        not (ROOT / "notebooks" / NOTEBOOK).exists(), reason=f"notebooks/{NOTEBOOK} not written"
    ),
]


@pytest.fixture
def lab(tmp_path):
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks")
    with serve(tmp_path / "notebooks", tmp_path) as url_and_token:
        yield url_and_token


def test_notebook_00_runs_in_jupyterlab_in_a_real_browser(lab):
    url, token = lab
    in_chromium(_run_notebook_00, url, token, "notebook00")


def _run_notebook_00(page, url: str, token: str) -> None:
    from playwright.sync_api import expect

    page.goto(f"{url}/lab/tree/{NOTEBOOK}?token={token}")
    notebook = page.locator(".jp-NotebookPanel")
    expect(notebook).to_be_visible(timeout=ms(60))
    idle = page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")
    expect(idle).to_have_count(1, timeout=ms(60))
    clear_all_outputs(page)

    run_all_cells(page)

    # Per-rank output blocks appear, in the page, from live ranks. Each wait lasts as long as the
    # notebook keeps moving (tests/jupyter_lab.py: a busy machine is slower, not broken).
    for rank in ("[rank 0]", "[rank 1]"):
        until_shown(page, lambda t, rank=rank: expect(page.get_by_text(rank).first)
                    .to_be_visible(timeout=t), rank)
    # The status widget renders as a live view (an HTML table naming each rank's state).
    widget = page.locator(".jp-OutputArea-output .widget-html").first
    until_shown(page, lambda t: expect(widget).to_contain_text("rank 0", timeout=t),
                "the status widget")
    # Wait until the whole notebook has run: the last code cell gets an execution count.
    last_prompt = page.locator(".jp-CodeCell .jp-InputArea-prompt").last
    last_prompt.scroll_into_view_if_needed()
    count = "[" + _code_cell_count() + "]:"
    until_shown(page, lambda t: expect(last_prompt).to_have_text(count, timeout=t),
                f"the last cell's prompt {count}")
    page.screenshot(path=str(OUT / "notebook00.png"), full_page=False)
    assert page.locator(".jp-RenderedText", has_text="[rank 0]").count() > 0


def _code_cell_count() -> str:
    import nbformat

    nb = nbformat.read(ROOT / "notebooks" / NOTEBOOK, as_version=4)
    return str(sum(1 for c in nb.cells if c.cell_type == "code"))
