"""Every lesson notebook is one clean run that follows the house arc.

nbval (`pytest --nbval`) re-runs each notebook and compares its outputs with the saved ones. These
tests check what nbval does not: that the saved outputs come from one top-to-bottom run, that the
first cell shows the versions they were made with (and that those are today's), the shape of the
lesson (goals, summary, exercises with hidden solutions), and that no output is excused from the
comparison without a reason.

Each notebook is its own test id, e.g. ``test_notebook_opens_with_goals[01_stores_and_rendezvous]``.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

import distlab
from distlab import _torch
from distlab import exercises as exercises_mod

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))

each_notebook = pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])

FIX = "Re-run it top to bottom: make notebooks (or jupyter nbconvert --execute --inplace)."


def _read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def _code_cells(nb) -> list[tuple[int, nbformat.NotebookNode]]:
    """(index in the notebook, cell) for every code cell."""
    return [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]


def _stdout(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


# -- (a) one run, top to bottom ---------------------------------------------------------------


@each_notebook
def test_saved_outputs_come_from_one_top_to_bottom_run(path):
    cells = _code_cells(_read(path))
    assert cells, f"{path.name} has no code cells"
    for n, (i, cell) in enumerate(cells, start=1):
        assert cell.execution_count == n, (
            f"{path.name}: code cell {n} (cell {i}) has execution_count {cell.execution_count}, "
            f"expected {n}: the outputs are not from one top-to-bottom run. {FIX}"
        )
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, (
            f"{path.name}: cell {i} was saved with an error ({errors[0].get('ename')}): "
            f"catch and print errors you show on purpose. {FIX}"
        )


# -- (b) the versions line --------------------------------------------------------------------


@each_notebook
def test_first_cell_imports_distlab_first_and_shows_current_versions(path):
    _, first = _code_cells(_read(path))[0]
    code = [x.strip() for x in first.source.splitlines() if x.strip() and not x.strip()[0] == "#"]
    assert code and re.fullmatch(r"import distlab(\s*#.*)?", code[0]), (
        f"{path.name}: the first code cell must start with `import distlab` (it warms the helper "
        f"that starts the ranks), not {code[0] if code else 'nothing'!r}"
    )
    assert "print(distlab.versions())" in first.source, (
        f"{path.name}: the first code cell must `print(distlab.versions())`"
    )
    # Outputs are made with the locked torch (the Makefile's pin). On another release (`make
    # test-latest`, `make test-torch`) the notebooks are compared all the same; only this line
    # differs, by design, so it is checked against the release the outputs were made with.
    current = re.sub(r"torch \S+,", f"torch {_torch.LOCKED},", distlab.versions())
    saved = [line for line in _stdout(first).splitlines() if line.startswith("Python ")]
    assert saved, f"{path.name}: the first code cell has no saved versions line. {FIX}"
    assert saved == [current], (
        f"{path.name} was saved with {saved[0]!r}, this environment has {current!r}: the notebook "
        f"is stale. {FIX}"
    )


# -- (c) the lesson arc -----------------------------------------------------------------------

_GOALS = re.compile(
    r"^\s{0,3}#{1,6}\s.*\b(?:goals|you will)\b"  # a heading: "## Goals", "## You will ..."
    r"|(?P<bold>\*\*|__)[^*_\n]*\b(?:goals|you will)\b[^*_\n]*(?P=bold)",  # "**Goals.**"
    re.IGNORECASE | re.MULTILINE,
)
_BULLET = re.compile(r"^\s{0,3}[-*+]\s+\S", re.MULTILINE)  # a top-level bullet, not a nested one
_SUMMARY = re.compile(r"^\s{0,3}#{1,6}\s+summary\b", re.IGNORECASE | re.MULTILINE)
_EXERCISES = re.compile(r"^\s{0,3}#{1,6}\s+exercises\b", re.IGNORECASE | re.MULTILINE)
# The start of one exercise, as a heading or in bold: "### Exercise 1: ...", "**Exercise 2.**",
# "**3. Title.**".
_EXERCISE = re.compile(
    r"^\s{0,3}(?:#{1,6}\s+|\*\*|__)(?:exercise\s+\d+|\d+[.:)])", re.IGNORECASE | re.MULTILINE
)
# A line that checks something: a plain assert, or torch.testing's / numpy.testing's assert_*().
_CHECK = re.compile(r"^\s*(?:assert\b|(?:[\w.]+\.)?assert_\w+\()", re.MULTILINE)
GOALS_WITHIN = 3  # the goals are in one of the first cells
MIN_GOALS, MAX_GOALS = 3, 5
MIN_EXERCISES, MAX_EXERCISES = 2, 4


def _first_markdown(nb, pattern: re.Pattern, start: int = 0) -> int | None:
    for i, cell in enumerate(nb.cells[start:], start=start):
        if cell.cell_type == "markdown" and pattern.search(cell.source):
            return i
    return None


def _goal_bullets(nb) -> list[str] | None:
    """The bullets after the goals marker, in the first cells; None if there is no marker."""
    for cell in nb.cells[:GOALS_WITHIN]:
        if cell.cell_type != "markdown":
            continue
        marker = _GOALS.search(cell.source)
        if marker:
            after = cell.source[marker.end() :]
            return _BULLET.findall(after)
    return None


@each_notebook
def test_notebook_opens_with_goals(path):
    bullets = _goal_bullets(_read(path))
    assert bullets is not None, (
        f"{path.name}: no goals in the first {GOALS_WITHIN} cells: a markdown heading or bold "
        "text with 'Goals' or 'You will', followed by a bullet list"
    )
    assert MIN_GOALS <= len(bullets) <= MAX_GOALS, (
        f"{path.name}: {len(bullets)} goal bullets; the house arc asks for {MIN_GOALS}-{MAX_GOALS}"
    )


def _verdicts(cell) -> list[str]:
    """The lines a cell printed, without their ``[rank N]`` / ``[ranks 0-3]`` prefixes."""
    text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
    return [re.sub(r"^\[ranks? [\d,-]+\] ?", "", line) for line in text.splitlines()]


def _exercise_problems(nb, name: str) -> tuple[int, list[str]]:
    """(number of exercises, what is wrong with their shape). See `distlab.exercises`."""
    summary = _first_markdown(nb, _SUMMARY)
    if summary is None:
        return 0, [f"{name}: no '## Summary' markdown heading"]
    exercises = _first_markdown(nb, _EXERCISES, start=summary)
    if exercises is None:
        return 0, [f"{name}: no '## Exercises' markdown heading after the summary"]
    problems, found = [], 0
    for i, cell in enumerate(nb.cells[exercises:], start=exercises):
        if cell.cell_type != "markdown":
            continue
        numbers = _EXERCISE.findall(cell.source)
        if not numbers:
            continue
        if len(numbers) > 1:
            problems.append(f"{name}: cell {i} holds {len(numbers)} exercises; one per cell")
            continue
        found += 1
        n = re.search(r"\d+", numbers[0]).group()
        label = f"Exercise {n}"
        attempt, solution = (nb.cells[i + k] if i + k < len(nb.cells) else None for k in (1, 2))
        if attempt is None or attempt.cell_type != "code" or solution is None or (
            solution.cell_type != "code"
        ):
            problems.append(
                f"{name}: exercise {n} (cell {i}) must be followed by two code cells: the "
                "learner's attempt cell, then the hidden solution"
            )
            continue
        where = f"{name}: exercise {n}"
        if attempt.metadata.get("jupyter", {}).get("source_hidden"):
            problems.append(f"{where}: the attempt cell (cell {i + 1}) must be visible")
        if "raise NotImplementedError" not in attempt.source:
            problems.append(
                f"{where}: the attempt cell (cell {i + 1}) needs a skeleton that says "
                "`raise NotImplementedError` where the learner's answer goes"
            )
        call = f'check("{label}"'
        for which, c in (("attempt", attempt), ("solution", solution)):
            if call not in c.source:
                problems.append(f"{where}: the {which} cell does not call {call}, test)")
        if not any(v.startswith(f"{label}: {exercises_mod.NOT_ATTEMPTED}") for v in _verdicts(
            attempt
        )):
            problems.append(
                f"{where}: the attempt cell's saved output does not say "
                f"'{label}: {exercises_mod.NOT_ATTEMPTED}' (it should run the check on the "
                "skeleton). " + FIX
            )
        hidden = solution.metadata.get("jupyter", {})
        if not (hidden.get("source_hidden") is True and hidden.get("outputs_hidden") is True):
            problems.append(
                f"{where}: the solution (cell {i + 2}) must be collapsed, source and output: "
                'metadata["jupyter"] = {"source_hidden": True, "outputs_hidden": True}'
            )
        shown = [o.output_type for o in solution.outputs if o.output_type != "stream"]
        verdicts = _verdicts(solution)
        if shown or verdicts != sorted(set(verdicts)) or verdicts != [
            f"{label}: {exercises_mod.PASSED}"
        ]:
            problems.append(
                f"{where}: the solution's saved output must be the verdict "
                f"'{label}: {exercises_mod.PASSED}' alone (on every rank), nothing that gives "
                f"the answer away; it is {verdicts + shown}"
            )
    if not MIN_EXERCISES <= found <= MAX_EXERCISES:
        problems.append(
            f"{name}: {found} exercises after the Exercises heading (each starts a line with "
            "'### Exercise N', '**Exercise N' or '**N.'); the house arc asks for "
            f"{MIN_EXERCISES}-{MAX_EXERCISES}"
        )
    return found, problems


@each_notebook
def test_notebook_ends_with_exercises_that_do_not_give_their_answers_away(path):
    """Each exercise: its text, a visible attempt cell whose check says "not attempted yet",
    and a solution collapsed source and output, whose output is only the check's verdict."""
    _, problems = _exercise_problems(_read(path), path.name)
    assert not problems, "\n".join(problems)


def test_exercise_shape_check_catches_a_spoiled_exercise():
    def notebook(solution_output: str, hidden: dict) -> nbformat.NotebookNode:
        nb = nbformat.v4.new_notebook()
        md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
        attempt = code('def f():\n    raise NotImplementedError\ncheck("Exercise 1", test)')
        attempt.outputs = [nbformat.v4.new_output("stream", text="Exercise 1: not attempted yet.")]
        solution = code('def f():\n    return 2\ncheck("Exercise 1", test)')
        solution.metadata["jupyter"] = hidden
        solution.outputs = [nbformat.v4.new_output("stream", text=solution_output)]
        nb.cells = [md("## Summary"), md("## Exercises"), md("**Exercise 1.** Do it."), attempt,
                    solution, md("**Exercise 2.** Again."), attempt, solution]
        nb.cells[6] = nbformat.from_dict(
            {**attempt, "source": attempt.source.replace("Exercise 1", "Exercise 2")}
        )
        return nb

    both = {"source_hidden": True, "outputs_hidden": True}
    good = notebook("[ranks 0-3] Exercise 1: ✓ correct\n", both)
    found, problems = _exercise_problems(good, "t")
    assert found == 2
    assert [p for p in problems if "exercise 1:" in p] == []
    spoiled = notebook("2 ZeroDivisionError [0, 1]\nExercise 1: ✓ correct\n", both)
    assert any("gives the answer away" in p for p in _exercise_problems(spoiled, "t")[1])
    shown = notebook("Exercise 1: ✓ correct\n", {"source_hidden": True})
    assert any("collapsed, source and output" in p for p in _exercise_problems(shown, "t")[1])


# -- (d) outputs are compared, or excused with a reason ---------------------------------------

# nbval markers and tags that skip a cell, expect it to fail, or only matter under --nbval-lax.
_FORBIDDEN_MARKERS = (
    "NBVAL_SKIP",
    "NBVAL_RAISES_EXCEPTION",
    "NBVAL_CHECK_OUTPUT",
    "PYTEST_VALIDATE_IGNORE_OUTPUT",
)
_FORBIDDEN_TAGS = (
    "nbval-skip",
    "nbval-raises-exception",
    "raises-exception",
    "nbval-check-output",
    "nbval-ignore-output",
)
_IGNORE = "NBVAL_IGNORE_OUTPUT"
_COMMENT = re.compile(r"^\s*#\s*(.*?)\s*$")


def _nbval_honours_ignore(line: str) -> bool:
    """Whether nbval itself reads this source line as an active NBVAL_IGNORE_OUTPUT marker."""
    from nbval.plugin import find_comment_markers

    return ("check", False) in list(find_comment_markers(line))


def _ignore_reason(lines: list[str], n: int) -> str:
    """The reason given for the marker on line n: after it on the same line, or on the next line."""
    same_line = lines[n].split(_IGNORE, 1)[1].lstrip(" :-").strip()
    if same_line:
        return same_line
    if n + 1 < len(lines):
        comment = _COMMENT.match(lines[n + 1])
        if comment and "NBVAL" not in comment.group(1):
            return re.sub(r"^reason\s*:\s*", "", comment.group(1), flags=re.IGNORECASE)
    return ""


@each_notebook
def test_outputs_are_only_excused_with_a_reason(path):
    for i, cell in _code_cells(_read(path)):
        tags = [t for t in cell.metadata.get("tags", []) if t in _FORBIDDEN_TAGS]
        assert not tags, (
            f"{path.name}: cell {i} has the nbval tag {tags[0]!r}. Every cell runs and is "
            "compared; mask honest run-to-run noise in notebooks/sanitize.cfg instead, or start "
            "the cell "
            f"with `# {_IGNORE}` and a reason"
        )
        lines = cell.source.splitlines()
        for n, line in enumerate(lines):
            for marker in _FORBIDDEN_MARKERS:
                assert marker not in line, (
                    f"{path.name}: cell {i} uses {marker}; every cell must run and be compared"
                )
            if _IGNORE not in line:
                continue
            assert _nbval_honours_ignore(line), (
                f"{path.name}: cell {i} line {n + 1} is {line.strip()!r}, which nbval does not "
                f"read as a marker (it only knows the exact comment `# {_IGNORE}`), so this "
                f"output is still compared. Write `# {_IGNORE}` alone on the cell's first line "
                "and the reason on the next one: `# reason: timings vary`"
            )
            assert n == 0, (
                f"{path.name}: cell {i}: put `# {_IGNORE}` on the cell's first line, where a "
                "reader sees it"
            )
            assert _ignore_reason(lines, n), (
                f"{path.name}: cell {i} ignores its output without saying why; add the reason "
                f"on the line after `# {_IGNORE}`, e.g. `# reason: timings vary`"
            )


# -- (e) lessons reach distlab through its public names ---------------------------------------

_PRIVATE = re.compile(r"\bdistlab\._\w+|\bfrom\s+distlab\s+import\s+(?:\(\s*)?_\w+")
#: Notebooks whose cells still reach a private module of distlab (its palette, `distlab._chart`,
#: for drawing in a lesson cell): each should move its picture into `distlab.pictures` and leave
#: this list. A notebook not listed must not start.
PRIVATE_STILL = {"19_mixed_precision", "20_activation_memory_and_checkpointing",
                 "21_tensor_and_sequence_parallel", "22_context_parallel", "23_expert_parallel",
                 "24_capstone_2d_parallel"}


def _reaches_private(nb) -> list[str]:
    return [m.group() for c in nb.cells if c.cell_type == "code"
            for m in _PRIVATE.finditer(c.source)]


@each_notebook
def test_lesson_cells_use_distlabs_public_names_only(path):
    found = _reaches_private(_read(path))
    if path.stem in PRIVATE_STILL:
        return
    assert not found, (
        f"{path.name} reaches distlab's private code from a lesson cell ({sorted(set(found))}): "
        "draw with a public function (distlab.pictures) and call it from the cell")


def test_the_private_name_finder_finds_a_palette_import():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("from distlab._chart import INK\nimport distlab")]
    assert _reaches_private(nb) == ["distlab._chart"]
    nb.cells = [nbformat.v4.new_code_cell("from distlab import _chart, pictures")]
    assert _reaches_private(nb) == ["from distlab import _chart"]
    nb.cells = [nbformat.v4.new_code_cell("from distlab import pictures, scale")]
    assert _reaches_private(nb) == []
