"""Write scores into an nbgrader gradebook through nbgrader's own API (``nbgrader.api.Gradebook``).

The mapping (so that nbgrader's formgrader and ``nbgrader export`` show the course as instructors expect):

* each exercise some result graded is an nbgrader **assignment** named by its id (``online_softmax``),
  holding one **notebook** of the same name; an exercise nobody submitted gets none (it would read 0.0 for
  every student), though a ``grader batch`` result lists every exercise, the others as "missing";
* each check is a **grade cell** of that notebook, named by the check's id, ``cell_type`` "code",
  ``max_score`` its points in course.yaml;
* each result file is a **student** (the file's name without ``.json``) with one **submission** per
  exercise the result graded; each check the result graded becomes that grade's ``auto_score``, and no grade
  is ever ``needs_manual_grade`` (formgrader would send the instructor to a submission notebook that this
  export does not write: "Submission notebook file not found").
* A check this result did not grade (it needs CUDA and was graded on a CPU, or ``--check`` left it out) keeps
  the score an earlier export wrote for it (a GPU run's), so the CUDA checks' scores land as autograded
  scores from the run that graded them, in either order. That earlier score is cleared (with a warning)
  when the submission's time says it was resubmitted since; with no score yet it has no ``auto_score``
  and nbgrader counts it as 0 (nbgrader has no "not graded"): the export's summary counts these.
* A manual score an instructor entered in formgrader is never touched (nbgrader prefers it to
  ``auto_score``).
* An assignment's exercise that this submission did not contain (``missing``) or that could not be read
  is still a submission, with every check at 0, so the gradebook shows the zero rather than a gap. An exercise the
  grading machine failed on (a regrade: ``failure.by`` "grader") or that never finished writes nothing,
  with a warning: never a zero for the student.
* With submission times (grader/export/times.py: nbgrader's own ``timestamp.txt``, or a CSV), each
  submission gets its time, and with a due date (``--due`` or course.yaml ``export.due``) each assignment its
  ``duedate``: nbgrader's ``total_seconds_late`` then reads the lateness.

Exporting again updates the same rows (students, submissions and grades are found or created), so a
regrade replaces the old scores. Only ids and numbers are written; a student id (a result file's name)
holding an escape sequence or a control character is refused before anything is written, rather than
stored under another name that a second student's id could also become. nbgrader is an optional dependency: ``pip install .[nbgrader]``.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import warnings as warnings_module
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from grader.export.isolate import Problems, per_student, usable
from grader.export.load import ExportError, Loaded
from grader.export.times import SubmissionTimes, as_times, aware
from grader.results import failed_by_grader
from grader.text import inert


@dataclass(frozen=True)
class NbgraderSummary:
    students: int
    assignments: int
    grades: int  # scores written: each check a result graded
    kept: int  # checks a result did not grade, whose earlier score (a GPU run's) was kept
    not_graded: int  # checks no export has graded yet: no score, which nbgrader counts as 0
    skipped: int  # exercises not written: the grading machine failed on them, or their grade did not finish


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
                submitted: SubmissionTimes | Mapping[str, dt.datetime] | None = None,
                due: dt.datetime | None = None, warnings: list[str] | None = None,
                problems: Problems | None = None) -> NbgraderSummary:
    """Write every result into the gradebook at `db_url` (e.g. ``sqlite:////path/gradebook.db``); `warnings`
    (when given) collects what the instructor should know (scores cleared, exercises left for a regrade).

    With `problems` (grader/export/isolate.py) each student is written in a transaction of its own: one whose
    rows raise is rolled back (the gradebook keeps what it held for that student) and recorded there, with the
    students whose exercises were left for a regrade or whose submission time could not be read; the others
    are written. Without it an exception goes to the caller."""
    bad = [item.path.name for item in loaded if inert(item.student) != item.student]
    if bad:
        raise ExportError(f"expected student ids (result file names) of plain text, found control characters or "
                          f"escape sequences in {', '.join(repr(name) for name in bad[:5])}; rename those files")
    api = _gradebook()
    loaded = usable(problems, loaded, "its exercises and checks", lambda item: _grade_cells([item], None))
    times = as_times(submitted)
    said = warnings if warnings is not None else []
    cells = _grade_cells(loaded, course)
    graded = kept = empty = skipped = 0
    with warnings_module.catch_warnings(), api.Gradebook(db_url, course_id=course_id) as gb:
        # nbgrader's add_submission builds its rows before adding them to the session, which newer
        # SQLAlchemy reports as a harmless SAWarning per row; the rows are stored all the same.
        warnings_module.filterwarnings("ignore", message=".*not in session.*")
        for exercise_id, checks in cells.items():
            gb.update_or_create_assignment(exercise_id, **({"duedate": _utc(due).isoformat()} if due else {}))
            gb.update_or_create_notebook(exercise_id, exercise_id)
            for check_id, max_score in checks.items():
                gb.update_or_create_grade_cell(check_id, exercise_id, exercise_id, max_score=max_score, cell_type="code")
        gb.db.commit()  # the assignments and cells, before any student's rows
        written = 0
        for item in sorted(loaded, key=lambda x: x.student):
            notes: list[str] = []
            writing = False
            with per_student(problems, item.student, item.path, "its nbgrader gradebook rows") as outcome:
                plan = _plan_student(item, cells, times, due, notes, problems)  # everything read from the student's result
                writing = True
                try:
                    counts = _write_student(api, gb, item.student, plan, notes)
                    gb.db.commit()
                except BaseException:
                    gb.db.rollback()
                    raise
            if outcome.failed:
                if writing and problems is not None:
                    problems.add(item.student, f"{item.student}: nbgrader's API commits as it goes, so the gradebook may "
                                               "hold part of this export's rows for them: export again once this is fixed")
                continue
            said.extend(notes)
            written += 1
            graded, kept, empty, skipped = (a + b for a, b in zip((graded, kept, empty, skipped), counts))
    return NbgraderSummary(written, len(cells), graded, kept, empty, skipped)


@dataclass(frozen=True)
class _Submission:
    exercise: str
    when: dt.datetime | None
    checks: list[tuple[str, float | None]]  # (check id, points; None: this result did not grade it)


def _plan_student(item: Loaded, cells: dict[str, dict[str, float]], times: SubmissionTimes | None,
                  due: dt.datetime | None, notes: list[str], problems: Problems | None) -> tuple[list[_Submission], int]:
    """What one student's result asks to write (their submissions, each check's points), and how many exercises
    are left for a regrade; all of the student's material is read here, before anything is written."""
    plan, skipped = [], 0
    for ex in item.result["exercises"]:
        if ex["id"] not in cells:
            continue  # nobody submitted it: no assignment
        why = _not_a_verdict(item.result, ex)
        if why:
            note = f"{item.student}: {ex['id']} not written ({why}); the gradebook keeps what it held"
            problems.add(item.student, note) if problems is not None else notes.append(note)
            skipped += 1
            continue
        unreadable = times.unreadable(item.student, [ex["id"]]) if times is not None else []
        when = times.when(item.student, [ex["id"]]) if times is not None and not unreadable else None
        late_unknown = unreadable or (due is not None and ex["status"] != "missing")  # not submitted: no time, rightly
        if times is not None and when is None and late_unknown and problems is not None:
            why = "it could not be read" if unreadable else "none in the submission times"
            problems.add(item.student, f"{item.student}: {ex['id']} written without a submission time ({why}): "
                                       "nbgrader reads it as on time")
        checks = [(str(c["id"]), None if c["status"] == "not_graded" else float(c["points"])) for c in ex["checks"]]
        plan.append(_Submission(str(ex["id"]), when, checks))
    return plan, skipped


def _write_student(api, gb, student: str, plan: tuple[list[_Submission], int],
                   notes: list[str]) -> tuple[int, int, int, int]:
    """One student's submissions and grades; (graded, kept, not graded, skipped) counts."""
    submissions, skipped = plan
    graded = kept = empty = 0
    gb.update_or_create_student(student)
    for sub in submissions:
        resubmitted = sub.when is not None and _stored_time(api, gb, sub.exercise, student) not in (None, _naive(sub.when))
        gb.update_or_create_submission(sub.exercise, student, **({"timestamp": _utc(sub.when).isoformat()} if sub.when else {}))
        for check_id, points in sub.checks:
            grade = _find_or_add_grade(api, gb, check_id, sub.exercise, student)
            grade.needs_manual_grade = False
            if points is not None:
                grade.auto_score = points
                graded += 1
            elif grade.auto_score is not None and not resubmitted:
                kept += 1
            else:
                if grade.auto_score is not None:
                    notes.append(f"{student}: {sub.exercise}/{check_id} had {grade.auto_score:g} from an "
                                 "earlier export, for an earlier submission; this result did not grade it "
                                 "(needs CUDA, or not selected): cleared, export a grade of it for the new one")
                grade.auto_score = None
                empty += 1
    return graded, kept, empty, skipped


def _not_a_verdict(result: dict, ex: dict) -> str | None:
    """Why this exercise's points are no verdict on the student (nothing to write), or None."""
    if ex["status"] in ("pending", "running"):
        return "its grade did not finish: regrade it"
    if ex["status"] == "ungradable" and failed_by_grader(result):
        return f"the grading machine failed on it: {(result.get('failure') or {}).get('retry') or 'regrade it'}"
    return None


def _utc(moment: dt.datetime) -> dt.datetime:
    return aware(moment).astimezone(dt.timezone.utc)


def _naive(moment: dt.datetime) -> dt.datetime:
    """As nbgrader stores a time: naive UTC."""
    return _utc(moment).replace(tzinfo=None)


def _stored_time(api, gb, exercise_id: str, student: str) -> dt.datetime | None:
    try:
        return gb.find_submission(exercise_id, student).timestamp
    except api.MissingEntry:
        return None


def _grade_cells(loaded: list[Loaded], course: Any) -> dict[str, dict[str, float]]:
    """exercise id -> check id -> max score, for the exercises some result graded (an assignment nobody was
    graded on would read 0 for everyone in nbgrader's exports): course.yaml's rubric first, then anything
    else the results hold. A `grader batch` result lists every exercise, the ones not submitted as
    "missing"; an exercise counts as graded when some readable submission held it (graded, or ungradable
    on its own: a file that does not compile)."""
    graded = submitted_exercises(loaded)
    cells: dict[str, dict[str, float]] = {}
    if course is not None:
        for ex in course.exercises:
            if ex.id in graded:
                cells[ex.id] = {c.id: float(c.points) for c in ex.checks}
    for item in loaded:
        for ex in item.result["exercises"]:
            if ex["id"] not in graded:
                continue
            for check in ex["checks"]:
                cells.setdefault(ex["id"], {}).setdefault(check["id"], float(check["max_points"]))
    return cells


def submitted_exercises(loaded: list[Loaded]) -> set[str]:
    """The exercises some readable submission held (an unreadable one has no hash and says nothing of them)."""
    return {ex["id"] for item in loaded if item.result["submission"]["sha256"]
            for ex in item.result["exercises"] if ex["status"] in ("graded", "ungradable")}


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
