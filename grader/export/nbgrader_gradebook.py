"""Write scores into an nbgrader gradebook through nbgrader's own API (``nbgrader.api.Gradebook``).

The mapping (so that nbgrader's formgrader and ``nbgrader export`` show the course as instructors expect):

* each exercise the results graded is an nbgrader **assignment** named by its id (``online_softmax``),
  holding one **notebook** of the same name (an exercise no result graded gets none: it would read 0.0
  for every student);
* each check is a **grade cell** of that notebook, named by the check's id, ``cell_type`` "code",
  ``max_score`` its points in course.yaml;
* each result file is a **student** (the file's name without ``.json``) with one **submission** per
  exercise the result graded; each check's points become that grade's ``auto_score``.
* A check not graded on the grading machine (it needs CUDA) gets no ``auto_score`` and
  ``needs_manual_grade = True``: formgrader lists it for the instructor, who enters the score of a GPU
  run; until then nbgrader counts it as 0. Every other grade has ``needs_manual_grade = False``.
* An exercise the submission did not contain (``missing``) or that could not be read is still a
  submission, with every check at 0, so the gradebook shows the zero rather than a gap.

Exporting again updates the same rows (students, submissions and grades are found or created), so a
regrade replaces the old scores. Only ids and numbers are written; a student id (a result file's name)
holding an escape sequence or a control character is refused before anything is written, rather than
stored under another name that a second student's id could also become. nbgrader is an optional dependency: ``pip install .[nbgrader]``.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Any

from grader.export.load import ExportError, Loaded
from grader.text import inert


@dataclass(frozen=True)
class NbgraderSummary:
    students: int
    assignments: int
    grades: int
    needs_manual_grade: int


def _gradebook():
    try:
        from nbgrader import api
    except ImportError:
        raise ExportError("the nbgrader export needs nbgrader: pip install '.[nbgrader]' (nbgrader>=0.9), "
                          "found it not installed") from None
    # nbgrader runs the `alembic` command to check its schema; from an environment that was not
    # activated (.venv/bin/grader export ...), put this interpreter's scripts on PATH so it is found.
    scripts = os.path.dirname(sys.executable)
    if scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")
    return api


def to_nbgrader(loaded: list[Loaded], db_url: str, course: Any = None, course_id: str = "default_course",
                submitted: dict[str, dt.datetime] | None = None) -> NbgraderSummary:
    """Write every result into the gradebook at `db_url` (e.g. ``sqlite:////path/gradebook.db``)."""
    bad = [item.path.name for item in loaded if inert(item.student) != item.student]
    if bad:
        raise ExportError(f"expected student ids (result file names) of plain text, found control characters or "
                          f"escape sequences in {', '.join(repr(name) for name in bad[:5])}; rename those files")
    api = _gradebook()
    cells = _grade_cells(loaded, course)
    grades = manual = 0
    with warnings.catch_warnings(), api.Gradebook(db_url, course_id=course_id) as gb:
        # nbgrader's add_submission builds its rows before adding them to the session, which newer
        # SQLAlchemy reports as a harmless SAWarning per row; the rows are stored all the same.
        warnings.filterwarnings("ignore", message=".*not in session.*")
        for exercise_id, checks in cells.items():
            gb.update_or_create_assignment(exercise_id)
            gb.update_or_create_notebook(exercise_id, exercise_id)
            for check_id, max_score in checks.items():
                gb.update_or_create_grade_cell(check_id, exercise_id, exercise_id, max_score=max_score, cell_type="code")
        for item in sorted(loaded, key=lambda x: x.student):
            gb.update_or_create_student(item.student)
            when = (submitted or {}).get(item.student)
            for ex in item.result["exercises"]:
                kwargs = {"timestamp": when.isoformat()} if when else {}
                gb.update_or_create_submission(ex["id"], item.student, **kwargs)
                for check in ex["checks"]:
                    grade = _find_or_add_grade(api, gb, check["id"], ex["id"], item.student)
                    not_graded = check["status"] == "not_graded"
                    grade.auto_score = None if not_graded else float(check["points"])
                    grade.needs_manual_grade = not_graded
                    grades += 1
                    manual += not_graded
            gb.db.commit()
    return NbgraderSummary(len(loaded), len(cells), grades, manual)


def _grade_cells(loaded: list[Loaded], course: Any) -> dict[str, dict[str, float]]:
    """exercise id -> check id -> max score, for the exercises the results graded (an assignment nobody was
    graded on would read 0 for everyone in nbgrader's exports): course.yaml's rubric first, then anything
    else the results hold."""
    graded = {ex["id"] for item in loaded for ex in item.result["exercises"]}
    cells: dict[str, dict[str, float]] = {}
    if course is not None:
        for ex in course.exercises:
            if ex.id in graded:
                cells[ex.id] = {c.id: float(c.points) for c in ex.checks}
    for item in loaded:
        for ex in item.result["exercises"]:
            for check in ex["checks"]:
                cells.setdefault(ex["id"], {}).setdefault(check["id"], float(check["max_points"]))
    return cells


def _find_or_add_grade(api, gb, check_id: str, exercise_id: str, student: str):
    """The student's grade for a grade cell; a cell added after the submission was made gets its grade now."""
    try:
        return gb.find_grade(check_id, exercise_id, exercise_id, student)
    except api.MissingEntry:
        cell = gb.find_grade_cell(check_id, exercise_id, exercise_id)
        notebook = gb.find_submission_notebook(exercise_id, exercise_id, student)
        grade = api.Grade(cell_id=cell.id, notebook=notebook)
        gb.db.add(grade)
        gb.db.flush()
        return grade
