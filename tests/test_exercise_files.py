"""Each exercise's files agree with each other: the README's points table is course.yaml's, and the
code the stub gives the student (helpers, types, constants) is the solution's own; and nothing `grader new`
left for the author to write (a TODO marker) is still there.

(The README's hints are course.yaml's too: tests/test_selfstudy.py holds that. `grader sync` writes both;
tests/test_sync.py tests it.)"""

from __future__ import annotations

import ast
import re

import pytest

from grader import scaffold
from grader.course import find_root, load_course

ROOT = find_root()
COURSE = load_course(ROOT)
IDS = [e.id for e in COURSE.exercises]
POINTS_ROW = re.compile(r"^\| `([a-z0-9_]+)` \| ([0-9.]+) \|", re.M)


@pytest.mark.parametrize("exercise_id", IDS)
def test_the_readme_points_table_is_course_yaml(exercise_id):
    exercise = COURSE.exercise(exercise_id)
    readme = (ROOT / "exercises" / exercise_id / "README.md").read_text()
    table = {check: float(points) for check, points in POINTS_ROW.findall(readme)}
    expected = {c.id: float(c.points) for c in exercise.checks}
    assert table == expected, (
        f"exercises/{exercise_id}/README.md's points table must list every check of course.yaml with its points; "
        f"missing or different: { {k: v for k, v in expected.items() if table.get(k) != v} }, "
        f"not in course.yaml: {sorted(set(table) - set(expected))}; run `grader sync` (make sync)")


def _without_docstrings(node: ast.AST) -> str:
    node = ast.parse(ast.unparse(node)).body[0]
    for inner in ast.walk(node):
        if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and inner.body \
                and isinstance(inner.body[0], ast.Expr) and isinstance(inner.body[0].value, ast.Constant) \
                and isinstance(inner.body[0].value.value, str):
            inner.body = inner.body[1:] or [ast.Pass()]
    return ast.unparse(node)


def _name(node: ast.stmt) -> str | None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    return None


def given_code(exercise_id: str) -> dict[str, ast.stmt]:
    """What the stub defines that is not left to the student (no NotImplementedError in it)."""
    exercise = COURSE.exercise(exercise_id)
    tree = ast.parse((ROOT / "exercises" / exercise_id / exercise.file).read_text())
    return {_name(n): n for n in tree.body if _name(n) and "NotImplementedError" not in ast.dump(n)}


def test_every_stub_gives_some_code_the_test_can_compare():
    assert sum(len(given_code(i)) for i in IDS) >= 10, "the comparison below must have something to compare"


@pytest.mark.parametrize("exercise_id", IDS)
def test_the_code_a_stub_gives_is_the_solutions_own(exercise_id):
    exercise = COURSE.exercise(exercise_id)
    solution = ast.parse((ROOT / "solutions" / exercise_id / exercise.file).read_text())
    theirs = {_name(n): n for n in solution.body if _name(n)}
    for name, node in given_code(exercise_id).items():
        assert name in theirs, f"exercises/{exercise_id}/{exercise.file} gives {name}, which the solution lacks"
        assert _without_docstrings(node) == _without_docstrings(theirs[name]), (
            f"{name} in exercises/{exercise_id}/{exercise.file} differs from the solution's (docstrings aside): "
            "the stub's given code must be exactly what the reference runs, or a student debugs a different program")


@pytest.mark.parametrize("exercise_id", IDS)
def test_every_exercise_names_its_signature_and_maps_its_contract(exercise_id):
    """What full marks certify (AUTHORING.md): the README's "How it is graded" names the technique's signature,
    the check that observes it and what that check cannot see; the hidden test module opens with the contract's
    clauses and the tests that draw each."""
    readme = (ROOT / "exercises" / exercise_id / "README.md").read_text()
    graded = readme.split("## How it is graded", 1)[-1]
    assert "## How it is graded" in readme and re.search(r"\bsignature\b", graded, re.I), (
        f"exercises/{exercise_id}/README.md: 'How it is graded' should name the technique's signature and its check")
    assert re.search(r"cannot see|does not see|can't see", graded, re.I), (
        f"exercises/{exercise_id}/README.md: 'How it is graded' should say what the signature's check cannot see")
    module = ast.get_docstring(ast.parse((ROOT / "grader" / "hidden" / exercise_id / "test_hidden.py").read_text()))
    assert module and re.search(r"contract clauses?|clause by clause", module, re.I), (
        f"grader/hidden/{exercise_id}/test_hidden.py should open with the contract-clause table: every clause of "
        "the README's contract and the tests that draw it")


TODO_PLACES = [(i, place) for i in IDS for place in scaffold.places(ROOT, COURSE.exercise(i))]


@pytest.mark.parametrize("exercise_id,place", TODO_PLACES, ids=[place for _, place in TODO_PLACES])
def test_nothing_is_left_to_write(exercise_id, place):
    """`grader new` (grader/scaffold.py) marks every place the author writes with TODO: each file (and the
    course.yaml block, and README.md's practice plan row) that still holds one fails here, by name."""
    markers = scaffold.todo_markers(ROOT, exercise_id, place)
    assert not markers, (f"{scaffold.describe(place, markers)}; write them (grader/AUTHORING.md, "
                         "\"Starting an exercise\")")
