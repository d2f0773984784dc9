"""`make site`: the course as a static website, from the notebooks as stored (nothing is run).

    python website/build.py [--out site]

Writes ``site/index.html`` (what the course is, who it is for, the two commands, the notebooks by
part: all read from README.md, see course.py), one page per notebook (its cells, outputs and
pictures as nbconvert's HTML exporter renders them with ``templates/notebook.html.j2``, a list of
its sections, previous and next), ``assets/`` (the style, the script, and the search index as a
script, so that search works from ``file://`` too), ``img/`` (the notebooks' pictures, one file
each) and ``notebooks/`` (each .ipynb, for the link on its page).

Nothing is fetched: no CDN, no MathJax (the notebooks' TeX is turned into HTML by tex.py).
Exercise solutions stay collapsed behind a click, and are left out of the search index.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

import bs4
import jinja2
import nbformat
from nbconvert.exporters import HTMLExporter, TemplateExporter
from nbconvert.exporters.html import WidgetsDataTypeFilter
from nbconvert.filters.highlight import Highlight2HTML
from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath
from nbconvert.preprocessors import ExtractOutputPreprocessor
from traitlets.config import Config

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import course as course_module  # noqa: E402
from tex import TexError, tex_to_html  # noqa: E402

# What a static page can show, best first. A widget's own view needs a kernel, so it is left out
# and the widget's stored picture or text shows instead (templates/notebook.html.j2 adds a note).
DISPLAY_PRIORITY = ["text/html", "text/markdown", "image/svg+xml", "image/png", "image/jpeg",
                    "text/latex", "text/plain"]


class _Renderer(IPythonRenderer):
    """nbconvert's markdown renderer, with the TeX turned into HTML here instead of by MathJax."""

    def inline_math(self, body: str) -> str:
        return tex_to_html(body)

    def block_math(self, body: str) -> str:
        return tex_to_html(body, display=True)


def markdown(source: str) -> str:
    return MarkdownWithMath(renderer=_Renderer(escape=False)).render(source)


_NOTEBOOK_LINK = re.compile(r"^(\d\d_\w+)\.ipynb(#.*)?$")


class _Reader:
    """What a notebook's page holds, gathered while nbconvert renders it, cell by cell (no
    second pass over the whole page): its headings, with ids made unique on the page, for the
    contents list, and its text by section for the search index. Code behind a click (a
    solution) is left out of the index."""

    def __init__(self):
        self.seen: set[str] = set()
        self.toc: list[dict] = []
        self.sections: list[list] = [["", "", []]]  # [heading id, heading, texts]

    def markdown(self, source: str) -> str:
        soup = bs4.BeautifulSoup(markdown(source), "html.parser")
        for a in soup.find_all("a", href=_NOTEBOOK_LINK):  # a link to another notebook: its page
            a["href"] = _NOTEBOOK_LINK.sub(r"\1.html\2", a["href"])
        for child in soup.children:
            if not isinstance(child, bs4.Tag):
                continue
            if child.name not in ("h1", "h2", "h3", "h4", "h5", "h6"):
                self.sections[-1][2].append(_text(child))
                continue
            base = child.get("id") or "section"
            ident, n = base, 1
            while ident in self.seen:
                n += 1
                ident = f"{base}-{n}"
            self.seen.add(ident)
            child["id"] = ident
            for a in child.find_all("a", class_="anchor-link"):
                a["href"] = f"#{ident}"
            if child.name in ("h2", "h3"):
                self.toc.append({"id": ident, "text": _text(child), "level": int(child.name[1])})
            self.sections.append([ident, _text(child), []])
        return str(soup)

    def code(self, source: str, metadata: dict) -> None:
        if not metadata.get("jupyter", {}).get("source_hidden"):
            self.sections[-1][2].append(" ".join(source.split()))

    def search_entries(self) -> list[tuple[str, str, str]]:
        return [(ident, heading, " ".join(texts)) for ident, heading, texts in self.sections
                if texts]


def _hidden_label(source: str) -> str:
    """The summary of a collapsed cell: what it holds, and that a click shows it."""
    first = source.lstrip().splitlines()[0] if source.strip() else ""
    if first.startswith("# Solution"):
        return "Solution: try the exercise first, then click to show"
    what = re.sub(r"^#\s*", "", first) if first.startswith("#") else "Code"
    what = re.sub(r"\s*\(collapsed\)\s*", " ", what).rstrip(" :")
    return f"{what}: click to show"


def _image_alt(output) -> str:
    """An image's alternative text: its output's text form, unless that is matplotlib's
    "<Figure size ...>"."""
    text = output.get("data", {}).get("text/plain", "")
    if not text or text.startswith("<Figure"):
        return "A chart drawn by the cell above"
    return " ".join(text.split())[:300]


class _Exporter(HTMLExporter):
    """nbconvert's HTML exporter, reading each notebook into a `_Reader` as it renders it:
    markdown through `_Reader.markdown` (TeX as HTML), code recorded for search."""

    reader: _Reader

    def default_filters(self):
        yield from super().default_filters()
        yield ("markdown2html", lambda source: self.reader.markdown(source))
        yield ("hidden_label", _hidden_label)
        yield ("image_alt", _image_alt)

    def from_notebook_node(self, nb, resources=None, **kw):
        """HTMLExporter's, without its pass of BeautifulSoup over the whole page (alt text and
        tab stops, which the template writes itself): it took half the build's time."""
        self.reader = _Reader()
        highlight = Highlight2HTML(pygments_lexer="ipython3", parent=self)

        def highlight_code(source, language=None, metadata=None):
            self.reader.code(source, metadata or {})
            return highlight(source, language, metadata)

        resources = self._init_resources(resources)
        self.register_filter("highlight_code", highlight_code)
        self.register_filter("filter_data_type", WidgetsDataTypeFilter(
            notebook_metadata=self._nb_metadata, parent=self, resources=resources))
        return TemplateExporter.from_notebook_node(self, nb, resources, **kw)


def _exporter() -> _Exporter:
    config = Config()
    config.NbConvertBase.display_data_priority = DISPLAY_PRIORITY
    config.TemplateExporter.exclude_input_prompt = True
    config.TemplateExporter.exclude_output_prompt = True
    exporter = _Exporter(config=config, template_name="lab",
                         extra_template_paths=[str(HERE / "templates")],
                         template_file="notebook.html.j2")
    exporter.register_preprocessor(ExtractOutputPreprocessor(config=config), enabled=True)
    return exporter


def _text(tag: bs4.Tag) -> str:
    return " ".join(tag.get_text(" ").replace("¶", " ").split())


def _title(nb) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    raise course_module.CourseError("a notebook has no '# title' line in its first cells")


def _plain(markdown_text: str) -> str:
    return " ".join(bs4.BeautifulSoup(markdown(markdown_text), "html.parser").get_text().split())


def build(out: Path) -> dict:
    """Write the site to ``out`` (emptied first). Returns counts: pages, images, seconds."""
    start = time.perf_counter()
    course = course_module.read(ROOT)
    if out.exists():
        shutil.rmtree(out)
    (out / "assets").mkdir(parents=True)
    (out / "notebooks").mkdir()
    pages = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                               autoescape=False, keep_trailing_newline=True)
    page = pages.get_template("page.html.j2")
    exporter = _exporter()
    notebooks = course.notebooks
    last = notebooks[-1].number
    read = {nb.stem: nbformat.read(ROOT / "notebooks" / nb.filename, as_version=4)
            for nb in notebooks}
    titles = {stem: _title(nb) for stem, nb in read.items()}
    for nb in notebooks:
        nb.title = re.sub(r"^\d\d\s*·\s*", "", titles[nb.stem])
        nb.title_html = markdown(nb.title).strip().removeprefix("<p>").removesuffix("</p>")
    index, images = [], 0
    for i, nb in enumerate(notebooks):
        resources = {"unique_key": "out", "output_files_dir": f"img/{nb.stem}",
                     "metadata": {"name": nb.stem}}
        try:
            body, resources = exporter.from_notebook_node(read[nb.stem], resources=resources)
        except TexError as error:
            raise TexError(f"notebooks/{nb.filename}: {error}") from None
        for name, data in resources.get("outputs", {}).items():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_bytes(data)
            images += 1
        toc = exporter.reader.toc
        for anchor, heading, text in exporter.reader.search_entries():
            index.append([nb.page, anchor, f"{nb.number} · {nb.title}", heading, text])
        (out / nb.page).write_text(page.render(
            title=f"{titles[nb.stem]} · distlab", kind="notebook-page", toc=toc, body=body,
            notebook=nb, last_number=last, previous=notebooks[i - 1] if i else None,
            next=notebooks[i + 1] if i + 1 < len(notebooks) else None), encoding="utf-8")
        shutil.copy2(ROOT / "notebooks" / nb.filename, out / "notebooks" / nb.filename)
    landing = pages.get_template("landing.html.j2").render(course=course, markdown=markdown,
                                                          last_number=last)
    (out / "index.html").write_text(page.render(
        title="distlab: a hands-on course in PyTorch distributed", kind="landing-page", toc=None,
        body=landing, notebook=None), encoding="utf-8")
    for part in course.parts:
        for nb in part.notebooks:
            index.append([nb.page, "", f"{nb.number} · {nb.title}", part.label,
                          _plain(nb.summary)])
    (out / "assets" / "search-index.js").write_text(
        "window.DISTLAB_SEARCH = " + json.dumps(index, ensure_ascii=False) + ";\n",
        encoding="utf-8")
    for asset in (HERE / "static").iterdir():
        shutil.copy2(asset, out / "assets" / asset.name)
    (out / "assets" / "pygments.css").write_text(_pygments_css())
    return {"pages": len(notebooks) + 1, "images": images,
            "seconds": round(time.perf_counter() - start, 1)}


def _pygments_css() -> str:
    from pygments.formatters import HtmlFormatter

    return HtmlFormatter(style="default").get_style_defs(".highlight")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "site",
                        help="the folder to write (emptied first; default: site/)")
    args = parser.parse_args(argv)
    try:
        counts = build(args.out)
    except (course_module.CourseError, TexError) as error:
        print(f"make site: {error}", file=sys.stderr)
        return 1
    print(f"site: {counts['pages']} pages, {counts['images']} pictures, in {counts['seconds']} s"
          f" -> open {args.out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
