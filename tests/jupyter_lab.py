"""A real JupyterLab and a real (headless) browser, for the tests that drive the course the way a
workshop participant does (tests/test_browser.py, tests/test_browser_calculators.py).

`serve` starts JupyterLab from this environment (loopback, a free port, a token) on a folder;
`in_chromium` opens Debian's Chromium, driven by Playwright, and hands a page to the test;
`clear_all_outputs` empties a notebook's outputs from JupyterLab's own menu; `until_shown` waits
for something to appear for as long as the notebook keeps moving.

No wait here is a fixed wall clock: a busy machine (a laptop in a video call, CI beside other
jobs) is slower, not broken. Each limit suits a quiet machine and is stretched by
`distlab._patience.patience`, what the machine's load says at the time of the wait; and a wait for
a notebook's output fails only when the page has stopped changing for that long.
"""

from __future__ import annotations

import contextlib
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

from distlab._patience import patience

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
OUT = ROOT / "test-output" / "browser"  #: screenshots, and each failure's page text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lab_settings(folder: Path) -> Path:
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


@contextlib.contextmanager
def serve(root: Path, tmp_path: Path, **env: str):
    """JupyterLab serving the notebooks in ``root``, its configuration, settings and log
    (``lab.log``) in ``tmp_path``, with ``env`` added to its environment; yields ``(url,
    token)`` once it answers (RuntimeError with the log's end if it does not within 60 s, stretched
    on a busy machine)."""
    port, token = free_port(), secrets.token_hex(16)
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "jupyter", "lab", "--no-browser",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
            f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
            "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            # CI and containers often run as root, which Jupyter refuses without this flag.
            *(["--allow-root"] if os.geteuid() == 0 else []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "lab.log", "w"),  # noqa: SIM115
        env=dict(
            os.environ,
            JUPYTER_CONFIG_DIR=str(tmp_path / "jupyter-config"),
            JUPYTERLAB_SETTINGS_DIR=str(lab_settings(tmp_path / "lab-settings")),
            **env,
        ),
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + patience(60)
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError((tmp_path / "lab.log").read_text()[-3000:]) from None
            time.sleep(0.3)
    try:
        yield url, token
    finally:
        proc.terminate()
        try:
            proc.wait(patience(20))
        except subprocess.TimeoutExpired:
            proc.kill()


def in_chromium(drive, url: str, token: str, name: str, full_page: bool = False) -> None:
    """``drive(page, url, token)`` on a new page of a headless Chromium. If it raises, the page
    is kept for the reader: a screenshot (``OUT/<name>-failure.png``, the whole page with
    ``full_page``) and its text, outputs and tracebacks included (``<name>-failure.txt``)."""
    from playwright.sync_api import sync_playwright

    OUT.mkdir(parents=True, exist_ok=True)
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
    ]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=flags)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            drive(page, url, token)
        except Exception:
            page.screenshot(path=str(OUT / f"{name}-failure.png"), full_page=full_page)
            (OUT / f"{name}-failure.txt").write_text(page.locator(".jp-Notebook").inner_text())
            raise
        finally:
            browser.close()


def clear_all_outputs(page) -> None:
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
            expect(outputs).to_have_count(0, timeout=ms(5))
            return
        except AssertionError:
            page.keyboard.press("Escape")  # close the menu if the click did nothing
            if attempt == 2:
                raise


def run_all_cells(page) -> None:
    """Run > Run All Cells, after `clear_all_outputs`. On a busy machine a click on the menu can
    come before the menu is ready and do nothing: if no cell has started (every prompt still
    "[ ]:") after a few seconds, stretched, try again."""
    from playwright.sync_api import expect

    started = page.locator(".jp-CodeCell .jp-InputArea-prompt").filter(has_not_text="[ ]:")
    for attempt in range(3):
        page.locator(".lm-MenuBar-item", has_text="Run").click()
        page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
        try:
            expect(started.first).to_be_attached(timeout=ms(10))
            return
        except AssertionError:
            page.keyboard.press("Escape")
            if attempt == 2:
                raise


def ms(seconds: float) -> float:
    """A Playwright timeout (milliseconds) for a wait of ``seconds`` on a quiet machine, stretched
    by how busy this one is now."""
    return patience(seconds) * 1000


#: What the page shows of a running notebook: each cell's prompt ("[*]:" while it runs, "[3]:"
#: once it has), how many outputs there are and how much text they hold, and the kernel's status.
_PROGRESS = """() => {
  const prompts = [...document.querySelectorAll('.jp-InputArea-prompt')].map(e => e.textContent);
  const outputs = [...document.querySelectorAll('.jp-OutputArea-output')];
  const text = outputs.reduce((n, e) => n + e.textContent.length, 0);
  const status = document.querySelector('.jp-Notebook-ExecutionIndicator');
  return [prompts.join('|'), outputs.length, text, status && status.dataset.status].join('#');
}"""


def until_shown(page, check, what: str, stall: float = 60) -> None:
    """Wait until ``check(timeout_ms)`` (a Playwright ``expect(...)`` call) passes, for as long as
    the notebook keeps running: fail only once the page has not changed (no cell started or
    finished, no output grew, the kernel's status stayed the same) for ``stall`` seconds, a limit
    for a quiet machine stretched by how busy this one is at each look. A busy machine makes this
    wait longer, never fail; a notebook that stopped (an error, a lost click) fails it in bounded
    time, naming ``what`` it waited for and what the page last showed."""
    last, since = None, time.monotonic()
    while True:
        try:
            check(2_000)
            return
        except AssertionError as e:
            now = page.evaluate(_PROGRESS)
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since > patience(stall):
                raise AssertionError(
                    f"{what} was not shown, and the notebook has not moved for "
                    f"{time.monotonic() - since:.0f} s (prompts, outputs, kernel: {now})"
                ) from e
