"""The course website (`make site`, website/build.py) as a reader uses it, in Debian's Chromium
driven by Playwright, from file:// URLs (what "open site/index.html" gives; nothing listens):
every page loads with every picture, every link inside the site resolves, search finds notebook
25, a solution stays hidden until clicked, and every page fits a phone's width.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_lab import CHROMIUM, ms

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "website"))

import build  # noqa: E402
import course  # noqa: E402

browser_only = pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium (make test installs it)")
PHONE = 390


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site") / "site"
    build.build(out)
    return out


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("needs Debian's chromium (make test installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update"])
        yield b
        b.close()


def _pages(site: Path) -> list[Path]:
    return sorted(site.glob("*.html"))


def test_every_notebook_in_the_readme_has_a_page_and_the_landing_page_links_them(site):
    notebooks = course.read(ROOT).notebooks
    assert len(notebooks) == len(list((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")))
    landing = (site / "index.html").read_text()
    for nb in notebooks:
        assert (site / nb.page).exists(), nb.page
        assert f'href="{nb.page}"' in landing, f"the landing page does not link {nb.page}"
    for part in course.read(ROOT).parts:
        assert f"{part.label} · {part.title}" in landing


def test_every_internal_link_resolves(site):
    broken = []
    for page in _pages(site):
        html = page.read_text()
        for target in re.findall(r'(?:href|src)="([^"]+)"', html):
            if re.match(r"[a-z]+:", target):
                continue  # http(s)://, mailto:, data: (none expected inside the site)
            path, _, anchor = target.partition("#")
            file = (page.parent / path) if path else page
            if not file.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and file.suffix == ".html" and f'id="{anchor}"' not in file.read_text():
                broken.append(f"{page.name}: {target} (no such anchor)")
    assert not broken, "\n".join(broken[:20])


def test_solutions_are_collapsed_and_left_out_of_search(site):
    index = " ".join(e[4] for e in json.loads(
        (site / "assets" / "search-index.js").read_text()
        .removeprefix("window.DISTLAB_SEARCH = ").rstrip().rstrip(";")))
    for nb in course.read(ROOT).notebooks:
        cells = nbformat.read(ROOT / "notebooks" / nb.filename, as_version=4).cells
        solutions = [c for c in cells if c.cell_type == "code"
                     and c.metadata.get("jupyter", {}).get("source_hidden")
                     and c.metadata.get("jupyter", {}).get("outputs_hidden")]
        html = (site / nb.page).read_text()
        assert html.count('<details class="hidden-cell') >= len(solutions), nb.page
        for cell in solutions:  # the cell's code, as the index would hold it
            code = " ".join(cell.source.split())
            assert code not in index, f"{nb.page}: a solution's code is in the search index"


@browser_only
def test_every_page_loads_its_pictures_and_fits_a_phone(site, browser):
    page = browser.new_page(viewport={"width": PHONE, "height": 844})
    failures = []
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    for file in _pages(site):
        page.goto(file.as_uri())
        page.evaluate("document.querySelectorAll('img').forEach(i => i.loading = 'eager')")
        page.wait_for_function(
            "[...document.images].every(i => i.complete)", timeout=ms(20))
        broken = page.evaluate(
            "[...document.images].filter(i => i.naturalWidth === 0).map(i => i.src)")
        if broken:
            failures.append(f"{file.name}: broken pictures {broken[:3]}")
        width = page.evaluate("document.documentElement.scrollWidth")
        if width > PHONE:
            wide = page.evaluate(f"""[...document.querySelectorAll('main *')]
                .filter(e => e.getBoundingClientRect().right > {PHONE} + 1)
                .filter(e => !e.closest('pre, table, .math.display, .highlight'))
                .slice(0, 3).map(e => e.tagName + '.' + e.className)""")
            failures.append(f"{file.name}: {width} px wide at {PHONE} px ({wide})")
        if not page.title():
            failures.append(f"{file.name}: no title")
    pictures = sum(len(list((site / "img").glob(f"{p.stem}/*"))) for p in _pages(site))
    assert pictures > 0
    assert not failures, "\n".join(failures)
    assert not errors, errors


@browser_only
def test_search_finds_a_term_from_notebook_25(site, browser):
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1200, "height": 900})
    page.goto((site / "index.html").as_uri())
    page.fill("#search", "simulated ranks fake process group")
    results = page.locator("#search-results a")
    results.first.wait_for(timeout=ms(10))
    hrefs = results.evaluate_all("links => links.map(a => a.getAttribute('href'))")
    assert any(h.startswith("25_at_scale_on_a_laptop.html") for h in hrefs), hrefs
    page.locator("#search").press("Enter")
    # the landing page's own address matches any ".html": wait until the page has changed
    page.wait_for_url(lambda url: not url.split("#")[0].endswith("/index.html"), timeout=ms(10))
    assert page.url.split("/")[-1].split("#")[0] in [h.split("#")[0] for h in hrefs]
    page.fill("#search", "zzqx-nothing-matches")
    expect(page.locator("#search-results")).to_contain_text("Nothing found", timeout=ms(10))


@browser_only
def test_a_solution_is_hidden_until_clicked(site, browser):
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    page.goto((site / "02_point_to_point.html").as_uri())
    solution = page.locator("details.solution").first
    code = solution.locator(".jp-InputArea-editor")
    verdict = solution.locator(".jp-OutputArea-output")
    assert code.count() == 1 and verdict.count() >= 1
    assert not code.is_visible() and not verdict.first.is_visible()
    solution.locator("summary").click()
    assert code.is_visible() and verdict.first.is_visible()
    assert "✓ correct" in verdict.first.inner_text()


def test_widgets_show_their_stored_picture_and_say_where_they_are_live(site):
    html = (site / "08_build_your_own_all_reduce.html").read_text()
    assert html.count('class="widget-note"') == 2
    assert "application/vnd.jupyter.widget-view+json" not in html
    assert "cdn" not in html.lower() and "https://" not in re.sub(
        r'<a [^>]*href="https://[^"]*"', "", html).split("<main>")[0]


def test_the_site_loads_nothing_from_the_network(site):
    for page in _pages(site):
        html = page.read_text()
        assert not re.findall(r'<(?:script|link|img)[^>]+(?:src|href)="(?:https?:)?//', html), (
            page.name)
    json.loads((site / "assets" / "search-index.js").read_text()
               .removeprefix("window.DISTLAB_SEARCH = ").rstrip().rstrip(";"))
