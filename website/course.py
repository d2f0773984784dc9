"""The course as the README describes it: its introduction, who it is for, and its notebooks by
part. The README is the one place these are written; the website reads them from it.

`read(root)` gives a `Course`; `CourseError` says what in the README or notebooks/ disagrees and
how to fix it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

NOTEBOOKS_HEADING = "## The notebooks, in order"
_ROW = re.compile(r"^\|\s*(\d\d)\s*\|\s*`([^`]+)`\s*\|\s*(.*?)\s*\|\s*$")
_PART = re.compile(r"^### (Part [IVX]+) · (.+)$")


class CourseError(ValueError):
    """The README's table of notebooks and notebooks/ disagree, or the README lacks a section."""


@dataclass
class Notebook:
    number: str  #: "25"
    stem: str  #: "25_at_scale_on_a_laptop"
    summary: str  #: the README's "what you learn" (markdown)
    part: Part

    @property
    def filename(self) -> str:
        return f"{self.stem}.ipynb"

    @property
    def page(self) -> str:
        return f"{self.stem}.html"


@dataclass
class Part:
    label: str  #: "Part III"
    title: str  #: "The transformer at scale"
    intro: str  #: markdown
    notebooks: list[Notebook] = field(default_factory=list)


@dataclass
class Course:
    intro: str  #: the README's opening (markdown): what the course is and the two commands
    what_this_is: str  #: the README's "What this is" section (markdown), "Who it is for" first
    after_table: str  #: the README's text after the tables (markdown)
    parts: list[Part]

    @property
    def notebooks(self) -> list[Notebook]:
        return [nb for part in self.parts for nb in part.notebooks]


def _sections(readme: str) -> dict[str, str]:
    """The README's level-2 sections by heading ("" for the text before the first)."""
    sections, name, lines = {}, "", []
    for line in readme.splitlines():
        if line.startswith("## "):
            sections[name] = "\n".join(lines).strip()
            name, lines = line, []
        else:
            lines.append(line)
    sections[name] = "\n".join(lines).strip()
    return sections


def read(root: Path) -> Course:
    """The course from ``root``/README.md, checked against ``root``/notebooks/. Raises
    CourseError when the README has no notebooks section or parts, or when a notebook file is
    missing from its table (or the table names a notebook that is not there)."""
    readme = (root / "README.md").read_text(encoding="utf-8")
    sections = _sections(readme)
    if NOTEBOOKS_HEADING not in sections:
        raise CourseError(f"README.md has no section {NOTEBOOKS_HEADING!r}: the website builds "
                          "its table of notebooks from it")
    intro = sections[""]
    intro = "\n".join(line for line in intro.splitlines() if not line.startswith("# ")).strip()
    parts: list[Part] = []
    intro_lines: list[str] = []
    after: list[str] = []
    for line in sections[NOTEBOOKS_HEADING].splitlines():
        if m := _PART.match(line):
            parts.append(Part(m.group(1), m.group(2), ""))
            intro_lines = []
        elif m := _ROW.match(line):
            if not parts:
                raise CourseError(f"README.md: notebook {m.group(2)} comes before any "
                                  "'### Part N · title' heading: put one above the table")
            number, stem, summary = m.groups()
            if not stem.startswith(number + "_"):
                raise CourseError(f"README.md: row {number} names {stem}, whose number differs")
            parts[-1].notebooks.append(Notebook(number, stem, summary, parts[-1]))
        elif parts and not parts[-1].notebooks and not line.startswith("|"):
            intro_lines.append(line)
            parts[-1].intro = "\n".join(intro_lines).strip()
        elif parts and parts[-1].notebooks and not line.startswith("|"):
            after.append(line)
    if not parts:
        raise CourseError("README.md's table of notebooks has no '### Part N · title' headings")
    course = Course(intro, sections.get("## What this is", ""), "\n".join(after).strip(), parts)
    listed = {nb.filename for nb in course.notebooks}
    present = {p.name for p in (root / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    if listed - present:
        raise CourseError(f"README.md lists notebooks that notebooks/ does not hold: "
                          f"{sorted(listed - present)}")
    if present - listed:
        raise CourseError(f"notebooks/ holds notebooks README.md's table does not list: "
                          f"{sorted(present - listed)}: add a row for each")
    return course
