"""The CSV gradebook: one row per student, one column per exercise, in course.yaml's order.

Columns: ``student`` (the result file's name), ``submission`` (the submission's id), one column per
exercise (its points; empty if that result did not grade the exercise), ``total``, ``max_score`` (the
course's points: every check, the CUDA and speed checks included), ``gradable_max_score`` (the points the
machine that graded it could give: a CPU grade cannot give the CUDA checks' points, so a perfect CPU grade
reads total = gradable_max_score < max_score), ``ungradable`` (yes when the submission could not be read at
all), ``incomplete`` (yes when the grade stopped half-way), ``late`` (yes/no when a due date and the
student's submission time are known (grader/export/times.py: an LMS's CSV, or nbgrader's timestamp.txt files,
the latest of the row's exercises), else empty, with a warning naming each student whose time is
missing), ``seed`` and ``graded_at``; with ``checks=True`` (``--checks``), then one column per check,
``<exercise>/<check>``, for regrade requests. Rows are sorted by student.

Points are written to two decimals, and a row's exercise cells add up to its total exactly: each cell is
rounded down to a cent and the cents left over go to the cells with the largest remainders (the largest
remainder method), so a spreadsheet's SUM of the row is the total.

Text cells are made inert (grader/text.py: no escape sequence or control character) and kept on one
line, and a cell that starts (after any spaces) with ``=``, ``+``, ``-``, ``@``, a tab or a carriage
return gets a leading apostrophe, so a spreadsheet never reads it as a formula (CSV injection).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import math
from collections.abc import Iterable, Mapping
from typing import Any

from grader.export.checks import pts, refuse_grader_failure
from grader.export.isolate import Problems, per_student, usable
from grader.export.load import Loaded
from grader.export.times import SubmissionTimes, as_times, aware
from grader.text import inert

FIXED_BEFORE = ["student", "submission"]
FIXED_AFTER = ["total", "max_score", "gradable_max_score", "ungradable", "incomplete", "late", "seed", "graded_at"]


def exercise_columns(loaded: Iterable[Loaded], course: Any = None) -> list[str]:
    """course.yaml's exercise order, then any other exercise found in the results, in first-seen order."""
    order = [e.id for e in course.exercises] if course is not None else []
    for item in loaded:
        for ex in item.result["exercises"]:
            if ex["id"] not in order:
                order.append(ex["id"])
    return order


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _text(value: Any) -> str:
    """A text cell: inert, on one line, and never read by a spreadsheet as a formula (CSV injection),
    even after leading blanks."""
    value = inert(value).replace("\n", " ")
    return "'" + value if value.lstrip(" ").startswith(FORMULA_STARTS) else value


def cents_that_add_up(values: list[float]) -> list[int]:
    """Each value in whole cents, rounded so that they add up to the rounded sum (largest remainders first)."""
    exact = [round(v * 100, 6) for v in values]
    floors = [int(math.floor(x)) for x in exact]
    left = int(round(sum(exact))) - sum(floors)
    order = sorted(range(len(exact)), key=lambda i: exact[i] - floors[i], reverse=True)
    for i in order[:max(0, left)]:
        floors[i] += 1
    return floors


def _cents(value: int) -> str:
    return pts(value / 100)


def check_columns(loaded: Iterable[Loaded], course: Any = None) -> list[str]:
    """``<exercise>/<check>`` in course.yaml's order, then any other check found in the results."""
    order = [f"{e.id}/{c.id}" for e in course.exercises for c in e.checks] if course is not None else []
    for item in loaded:
        for ex in item.result["exercises"]:
            for check in ex["checks"]:
                if f"{ex['id']}/{check['id']}" not in order:
                    order.append(f"{ex['id']}/{check['id']}")
    return order


def to_csv(loaded: list[Loaded], course: Any = None, due: dt.datetime | None = None,
           submitted: SubmissionTimes | Mapping[str, dt.datetime] | None = None, checks: bool = False,
           warnings: list[str] | None = None, problems: Problems | None = None) -> str:
    """The gradebook as CSV text; `warnings` (when given) collects what an instructor should know (a student
    with no submission time while a due date is set). `submitted`: {student: time}, or the times of
    grader/export/times.py (nbgrader's timestamp.txt: a row's time is the latest of its exercises').

    With `problems` (grader/export/isolate.py), each student's row is made on its own: one that raises is
    left out and recorded there, and a student whose `late` is left empty is recorded there too (in place of
    `warnings`); without it an exception goes to the caller."""
    times = as_times(submitted)
    said = (lambda student, text: problems.add(student, text)) if problems is not None else \
        (lambda student, text: warnings.append(text) if warnings is not None else None)
    rows_of = usable(problems, sorted(loaded, key=lambda x: x.student), "its exercises and checks",
                     lambda item: (exercise_columns([item]), check_columns([item])))  # else the student has no row
    exercises = exercise_columns(rows_of, course)
    per_check = check_columns(rows_of, course) if checks else []
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(FIXED_BEFORE + [_text(e) for e in exercises] + FIXED_AFTER + [_text(c) for c in per_check])
    for item in rows_of:
        with per_student(problems, item.student, item.path, "its CSV row"):
            row = _row(item, exercises, per_check, due, times, said)
            writer.writerow(row)  # whole, or not at all: _row raises before anything is written
    return buffer.getvalue()


def _row(item: Loaded, exercises: list[str], per_check: list[str], due: dt.datetime | None,
         times: SubmissionTimes | None, said: Any) -> list[Any]:
    """One student's row of the gradebook."""
    r = item.result
    refuse_grader_failure(r)  # no row of partial points for a grade that failed on the grader's side
    graded = [ex for ex in r["exercises"] if ex["id"] in exercises]
    cents = cents_that_add_up([float(ex["score"]) for ex in graded])
    scores = {ex["id"]: _cents(c) for ex, c in zip(graded, cents)}
    ids = [ex["id"] for ex in r["exercises"]]
    unreadable = times.unreadable(item.student, ids) if times is not None else []
    when = times.when(item.student, ids) if times is not None and not unreadable else None
    if due is not None and unreadable:
        said(item.student, f"{inert(item.student)!r}: its 'late' is empty: its submission time could not be read")
    elif due is not None and when is None and times is not None:
        said(item.student, f"no submission time for {inert(item.student)!r} in the submission times: its 'late' is empty")
    late = "" if due is None or when is None else ("yes" if when > aware(due) else "no")
    check_points = {f"{ex['id']}/{c['id']}": pts(c["points"]) for ex in r["exercises"] for c in ex["checks"]}
    return [_text(item.student), _text(r["submission"]["id"]), *(scores.get(e, "") for e in exercises),
            _cents(sum(cents)), pts(r["max_score"]), pts(r["gradable_max_score"]),
            "yes" if r.get("gradable") is False else "no",
            "no" if r["state"] == "complete" else "yes",
            late, r["seed"], _text(r.get("finished_at") or ""),
            *(check_points.get(c, "") for c in per_check)]
