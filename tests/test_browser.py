"""The course in a real JupyterLab, in a real (headless) browser: what a workshop participant sees.

Starts JupyterLab from this environment (loopback, a free port, a token) on a copy of the
notebooks, opens notebook 00 in Debian's Chromium driven by Playwright, clears its outputs, runs
all cells, and checks that per-rank output blocks and the cluster's status widget appear.
A screenshot is saved to test-output/browser/.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "00_launching_from_a_notebook.ipynb"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
OUT = ROOT / "test-output" / "browser"

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (make test installs it)"),
    pytest.mark.skipif(
        not (ROOT / "notebooks" / NOTEBOOK).exists(), reason=f"notebooks/{NOTEBOOK} not written"
    ),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lab_settings(folder: Path) -> Path:
    """User settings for this test's JupyterLab only: render every cell (JupyterLab 4 otherwise
    drops cells scrolled out of view from the page, and their outputs with them) and ask for no
    news (the offline machine cannot fetch it, and its pop-up covers the page)."""
    for plugin, settings in {
        "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
        "@jupyterlab/apputils-extension/notification": {"fetchNews": "false"},
    }.items():
        package, name = plugin.rsplit("/", 1)
        path = folder / package / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings))
    return folder


@pytest.fixture
def lab(tmp_path):
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks")
    port, token = _free_port(), secrets.token_hex(16)
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "jupyter", "lab", "--no-browser",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={tmp_path / 'notebooks'}",
            "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            # CI and containers often run as root, which Jupyter refuses without this flag.
            *(["--allow-root"] if os.geteuid() == 0 else []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "lab.log", "w"),  # noqa: SIM115
        env=dict(
            os.environ,
            JUPYTER_CONFIG_DIR=str(tmp_path / "jupyter-config"),
            JUPYTERLAB_SETTINGS_DIR=str(_lab_settings(tmp_path / "lab-settings")),
        ),
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError((tmp_path / "lab.log").read_text()[-3000:]) from None
            time.sleep(0.3)
    yield url, token
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_notebook_00_runs_in_jupyterlab_in_a_real_browser(lab):
    from playwright.sync_api import sync_playwright

    url, token = lab
    OUT.mkdir(parents=True, exist_ok=True)
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
    ]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=flags)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            _run_notebook_00(page, url, token)
        except Exception:
            page.screenshot(path=str(OUT / "notebook00-failure.png"))
            # The page's text, outputs and tracebacks included: which cell stopped "Run All".
            (OUT / "notebook00-failure.txt").write_text(page.locator(".jp-Notebook").inner_text())
            raise
        finally:
            browser.close()


def _run_notebook_00(page, url: str, token: str) -> None:
    from playwright.sync_api import expect

    page.goto(f"{url}/lab/tree/{NOTEBOOK}?token={token}")
    notebook = page.locator(".jp-NotebookPanel")
    expect(notebook).to_be_visible(timeout=60_000)
    idle = page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")
    expect(idle).to_have_count(1, timeout=60_000)
    _clear_all_outputs(page)

    page.locator(".lm-MenuBar-item", has_text="Run").click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()

    # Per-rank output blocks appear, in the page, from live ranks.
    expect(page.get_by_text("[rank 0]").first).to_be_visible(timeout=120_000)
    expect(page.get_by_text("[rank 1]").first).to_be_visible(timeout=60_000)
    # The status widget renders as a live view (an HTML table naming each rank's state).
    widget = page.locator(".jp-OutputArea-output .widget-html").first
    expect(widget).to_contain_text("rank 0", timeout=120_000)
    # Wait until the whole notebook has run: the last code cell gets an execution count.
    last_prompt = page.locator(".jp-CodeCell .jp-InputArea-prompt").last
    last_prompt.scroll_into_view_if_needed()
    expect(last_prompt).to_have_text("[" + _code_cell_count() + "]:", timeout=180_000)
    page.screenshot(path=str(OUT / "notebook00.png"), full_page=False)
    assert page.locator(".jp-RenderedText", has_text="[rank 0]").count() > 0


def _clear_all_outputs(page) -> None:
    """Edit > Clear Outputs of All Cells. The command is greyed out until the notebook panel is
    the active widget, which on a busy machine can be a moment after the page looks ready: make
    it active first, and try again if the outputs are still there."""
    from playwright.sync_api import expect

    outputs = page.locator(".jp-OutputArea-output")
    for attempt in range(3):
        page.locator(".jp-NotebookPanel-toolbar").first.click()
        page.locator(".lm-MenuBar-item", has_text="Edit").click()
        page.locator(".lm-Menu-itemLabel", has_text="Clear Outputs of All Cells").click()
        try:
            expect(outputs).to_have_count(0, timeout=5_000)
            return
        except AssertionError:
            page.keyboard.press("Escape")  # close the menu if the click did nothing
            if attempt == 2:
                raise


def _code_cell_count() -> str:
    import nbformat

    nb = nbformat.read(ROOT / "notebooks" / NOTEBOOK, as_version=4)
    return str(sum(1 for c in nb.cells if c.cell_type == "code"))
