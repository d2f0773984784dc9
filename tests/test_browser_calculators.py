"""The calculators in a real JupyterLab, in a real (headless) browser: a learner moves one control
of each calculator and sees its number and its picture change.

Starts JupyterLab (loopback, a free port, a token) on a temporary folder holding one small
notebook that shows each calculator's widget, runs it in Debian's Chromium driven by Playwright,
then, for each widget, changes one control the way a learner does (types into a number field,
picks from a list, or presses an arrow key on a focused slider) and waits until the widget's text
shows the new number and its image is a new picture. A screenshot is saved to
test-output/browser/.
"""

from __future__ import annotations

import time
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

from distlab._patience import patience

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium (make test installs it)"
)

NOTEBOOK = "calculators.ipynb"
CELLS = [
    "from distlab.calculators import widgets",
    "widgets.memory()",
    "widgets.comm()",
    "widgets.pipeline()",
    "widgets.stepper()",
]


def _write_notebook(folder: Path) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, folder / NOTEBOOK)


@pytest.fixture
def lab(tmp_path):
    (tmp_path / "nb").mkdir()
    _write_notebook(tmp_path / "nb")
    with serve(
        tmp_path / "nb",
        tmp_path,
        DISTLAB_NO_WARM="1",  # the calculators launch no ranks: no helper process
        DISTLAB_HOME=str(tmp_path / "distlab-home"),  # not the user's saved fit
    ) as url_and_token:
        yield url_and_token


def test_moving_a_control_of_each_calculator_changes_its_number_and_picture(lab):
    url, token = lab
    in_chromium(_drive, url, token, "calculators", full_page=True)


def _drive(page, url: str, token: str) -> None:
    from playwright.sync_api import expect

    page.goto(f"{url}/lab/tree/{NOTEBOOK}?token={token}")
    expect(page.locator(".jp-NotebookPanel")).to_be_visible(timeout=ms(60))
    idle = page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")
    expect(idle).to_have_count(1, timeout=ms(60))
    clear_all_outputs(page)
    run_all_cells(page)

    def move_tp(w):  # a number field: type, then Enter
        w.locator(".distlab-control-tp input").fill("2")
        w.locator(".distlab-control-tp input").press("Enter")

    def move_ranks(w):
        w.locator(".distlab-control-ranks input").fill("64")
        w.locator(".distlab-control-ranks input").press("Enter")

    def move_m(w):  # a slider, from the keyboard: focus its handle, one step right
        w.locator(".distlab-control-m .noUi-handle").focus()
        page.keyboard.press("ArrowRight")

    def move_op(w):  # a list: pick another entry
        w.locator(".distlab-control-op select").select_option("all_gather")

    for name, move, shown in (
        ("memory", move_tp, "dp 8 x tp 2 x pp 1"),
        ("comm", move_ranks, "on 64 ranks"),
        ("pipeline", move_m, "m = 9 microbatches"),
        ("stepper", move_op, "ring all_gather on 4 ranks"),
    ):
        widget = page.locator(f".distlab-calculator-{name}")
        text = widget.locator(".distlab-calculator-text pre")
        image = widget.locator("img.distlab-calculator-chart")
        # As long as the notebook keeps moving (tests/jupyter_lab.py: a busy machine is slower,
        # not broken).
        until_shown(page, lambda t, text=text: expect(text).to_be_visible(timeout=t),
                    f"the {name} calculator's text")
        widget.scroll_into_view_if_needed()
        before_text, before_src = text.inner_text(), _src(image)
        assert shown not in before_text
        move(widget)
        expect(text).to_contain_text(shown, timeout=ms(30))
        deadline = time.monotonic() + patience(30)
        while _src(image) == before_src and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _src(image) != before_src, f"{name}: the picture did not change"
        assert not text.inner_text().startswith("✗"), text.inner_text()
    page.screenshot(path=str(OUT / "calculators.png"), full_page=True)


def _src(image) -> str:
    """The image's bytes as the page holds them (a blob: URL, new for each new picture)."""
    deadline = time.monotonic() + patience(10)
    while time.monotonic() < deadline:
        src = image.get_attribute("src")
        if src:
            return src
        time.sleep(0.1)
    raise AssertionError("the calculator's image never got a picture")

