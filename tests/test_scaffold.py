"""`grader new <id>` (grader/scaffold.py): every file of a new exercise, registered in course.yaml, `grader validate`
passing, and the project's TODO detector naming each place still to write. No grading runs here."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grader import scaffold
from grader.course import load_course


def grader(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    # -P: the copy's own grader/ folder (hidden tests only, no __init__.py) must not shadow the grader package
    return subprocess.run([sys.executable, "-P", "-m", "grader", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"}, timeout=300)


@pytest.fixture
def course_copy(root, tmp_path) -> Path:
    """What `grader new`, `grader sync` and `grader validate` read and write: course.yaml, README.md, the
    exercises, the solutions, the hidden tests and the known-wrong submissions."""
    copy = tmp_path / "course"
    skip = shutil.ignore_patterns("__pycache__", "*.ipynb", ".progress.json")
    for rel in ("course.yaml", "README.md"):
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / rel, copy / rel)
    for rel in ("exercises", "solutions", "grader/hidden", "tests/known_wrong"):
        shutil.copytree(root / rel, copy / rel, ignore=skip)
    return copy


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_new_writes_every_file_and_the_course_validates(course_copy):
    original = (course_copy / "course.yaml").read_text()
    run = grader(course_copy, "new", "demo_ex", "--title", "A demo: the scaffold")
    assert run.returncode == 0, f"grader new failed:\n{run.stdout}{run.stderr}"
    for rel in scaffold.exercise_paths("demo_ex", "demo_ex.py"):
        assert (course_copy / rel).is_file(), f"grader new should write {rel}:\n{run.stdout}"
        assert f"wrote {rel}" in run.stdout, f"grader new should say it wrote {rel}:\n{run.stdout}"

    text = (course_copy / "course.yaml").read_text()
    assert text.startswith(original.rstrip("\n") + "\n"), "course.yaml's own text and comments must be kept as they were"
    assert "  # --- demo_ex ---\n  - id: demo_ex\n" in text[len(original.rstrip()):], "the block is appended at the end"
    course = load_course(course_copy)
    new = course.exercises[-1]
    assert (new.id, new.title, new.file) == ("demo_ex", "A demo: the scaffold", "demo_ex.py")
    assert new.points == sum(c.points for c in new.checks) and any(c.visibility == "public" for c in new.checks)

    run = grader(course_copy, "validate")
    count = f"{len(course.exercises)} exercises"  # the course's own and the new one
    assert run.returncode == 0 and count in run.stdout, f"grader validate on the scaffold:\n{run.stdout}{run.stderr}"
    run = grader(course_copy, "sync", "--check")
    assert run.returncode == 0, f"grader new must leave every derived block current (it runs grader sync):\n{run.stderr}"

    readme = (course_copy / "exercises/demo_ex/README.md").read_text()
    for section in ("## Why", "## The contract", "## How it is graded", "## Hints", "## Sources"):
        assert section in readme, f"the scaffold's README should have the section {section!r}"
    graded = readme.split("## How it is graded", 1)[1]
    assert "| `signature` | 5 |" in graded, "grader sync should have written the points table under its heading"
    assert re.search(r"\bsignature\b", graded) and "cannot see" in graded, (
        "'How it is graded' should name the signature and what its check cannot see (tests/test_exercise_files.py)")
    assert "1. TODO" in readme.split("## Hints", 1)[1], "grader sync should have rendered the hints from course.yaml"
    hidden = ast.get_docstring(ast.parse((course_copy / "grader/hidden/demo_ex/test_hidden.py").read_text()))
    assert hidden and "Contract clauses" in hidden and "| clause | tests |" in hidden

    stub = (course_copy / "exercises/demo_ex/demo_ex.py").read_text()
    assert "raise NotImplementedError" in stub and "NotImplementedError" not in (
        course_copy / "solutions/demo_ex/demo_ex.py").read_text()
    public = (course_copy / "exercises/demo_ex/test_public.py").read_text()
    assert '@pytest.mark.check("compute_public")' in public and 'student.load("demo_ex")' in public
    for rel in scaffold.exercise_paths("demo_ex", "demo_ex.py"):
        if rel.endswith(".py"):
            ast.parse((course_copy / rel).read_text(), rel)  # every generated file parses
    ruff = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--select", "F", "--line-length", "120",
                           "exercises/demo_ex", "solutions/demo_ex", "grader/hidden/demo_ex", "tests/known_wrong/demo_ex.py"],
                          cwd=course_copy, capture_output=True, text=True, timeout=120)
    assert ruff.returncode == 0, f"the scaffold's files must pass the project's pyflakes rules:\n{ruff.stdout}{ruff.stderr}"

    from tests.known_wrong import Mutant  # the mutants apply to the reference as written

    namespace: dict = {}
    exec(compile((course_copy / "tests/known_wrong/demo_ex.py").read_text(), "demo_ex.py", "exec"), namespace)
    reference = (course_copy / "solutions/demo_ex/demo_ex.py").read_text()
    mutants = namespace["MUTANTS"]
    assert len(mutants) >= 3 and all(isinstance(m, Mutant) for m in mutants)
    assert any(m.keeps and "signature" in m.loses for m in mutants), "a textbook mutant: loses the signature, keeps the rest"
    for mutant in mutants:
        assert mutant.apply(reference) != reference
        assert set(mutant.loses + mutant.keeps) <= {c.id for c in new.checks}, f"{mutant.name} names unknown checks"


def test_the_todo_detector_names_each_place_still_to_write(course_copy):
    assert scaffold.left_to_write(course_copy) == {}, "the shipped course has nothing left to write"
    last = load_course(course_copy).exercises[-1].id  # the block the new one is appended after
    scaffold.new_exercise(course_copy, "demo_ex")
    left = scaffold.left_to_write(course_copy)
    assert list(left) == ["demo_ex"], f"only the new exercise has TODO markers: {left}"
    named = [line.split(" still has ")[0] for line in left["demo_ex"]]
    written = [p for p in scaffold.exercise_paths("demo_ex", "demo_ex.py") if not p.endswith("__init__.py")]
    assert named == [*written, "course.yaml: the demo_ex block", "README.md: the demo_ex practice plan row"], named
    readme_line = left["demo_ex"][0]
    count = len(re.findall(r"\bTODO\b.*", (course_copy / "exercises/demo_ex/README.md").read_text()))
    assert re.match(rf"exercises/demo_ex/README.md still has {count} TODO markers: line \d+: ", readme_line), readme_line
    assert "; and " in readme_line, "past five markers, the line says how many more"

    # The author writes the oracle: the detector stops naming it, and names the rest as before.
    oracle = course_copy / "grader/hidden/demo_ex/oracle.py"
    oracle.write_text(oracle.read_text().replace("TODO: what it computes and how", "each row's sum"))
    after = [line.split(" still has ")[0] for line in scaffold.left_to_write(course_copy)["demo_ex"]]
    assert after == [p for p in named if p != "grader/hidden/demo_ex/oracle.py"], after

    # The course.yaml block ends where the exercise does: a TODO in the exercise before it is that one's.
    yaml_text = (course_copy / "course.yaml").read_text()
    (course_copy / "course.yaml").write_text(yaml_text.replace(
        "  # --- demo_ex ---", "  # TODO: an author's note on the exercise above\n  # --- demo_ex ---"))
    assert [text for _, text in scaffold.todo_markers(course_copy, last, f"course.yaml: the {last} block")] == [
        "# TODO: an author's note on the exercise above"], "a comment after a block belongs to that block"
    block = scaffold.todo_markers(course_copy, "demo_ex", "course.yaml: the demo_ex block")
    assert len(block) == 9 and block[0][1].startswith("budget:"), block


def test_a_second_new_of_the_same_id_refuses_and_writes_nothing(course_copy):
    assert grader(course_copy, "new", "demo_ex").returncode == 0
    before = snapshot(course_copy)
    run = grader(course_copy, "new", "demo_ex")
    assert run.returncode == 2, f"a second grader new demo_ex must refuse (exit 2):\n{run.stdout}{run.stderr}"
    assert "exercise 'demo_ex' already exists in course.yaml" in run.stderr, run.stderr
    assert snapshot(course_copy) == before, "a refused grader new must write nothing"


def test_files_of_an_unregistered_id_are_not_overwritten(course_copy):
    (course_copy / "solutions/demo_ex").mkdir()
    with pytest.raises(scaffold.ScaffoldError, match=r"'demo_ex' is not in course.yaml but its files exist already: "
                                                     r"\['solutions/demo_ex'\]"):
        scaffold.new_exercise(course_copy, "demo_ex")


@pytest.mark.parametrize("bad", ["Demo", "demo-ex", "2fast", "class", "_private", "déjà"])
def test_a_bad_id_refuses(course_copy, bad):
    before = snapshot(course_copy)
    with pytest.raises(scaffold.ScaffoldError, match=rf"exercise id {re.escape(repr(bad))} refused: expected a "
                                                     r"Python identifier in lower case"):
        scaffold.new_exercise(course_copy, bad)
    assert snapshot(course_copy) == before, f"a refused id ({bad!r}) must write nothing"


def test_a_bad_id_or_file_refuses_on_the_command_line(course_copy):
    run = grader(course_copy, "new", "demo-ex")
    assert run.returncode == 2 and "exercise id 'demo-ex' refused: expected a Python identifier" in run.stderr, (
        run.stdout + run.stderr)
    with pytest.raises(scaffold.ScaffoldError, match=r"--file 'test_x.py' refused: expected a Python module's file name"):
        scaffold.new_exercise(course_copy, "demo_ex", file="test_x.py")
    assert not (course_copy / "exercises/demo_ex").exists()
