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

from grader.export.checks import pts
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
           warnings: list[str] | None = None) -> str:
    """The gradebook as CSV text; `warnings` (when given) collects what an instructor should know (a student
    with no submission time while a due date is set). `submitted`: {student: time}, or the times of
    grader/export/times.py (nbgrader's timestamp.txt: a row's time is the latest of its exercises')."""
    times = as_times(submitted)
    exercises = exercise_columns(loaded, course)
    per_check = check_columns(loaded, course) if checks else []
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(FIXED_BEFORE + [_text(e) for e in exercises] + FIXED_AFTER + [_text(c) for c in per_check])
    for item in sorted(loaded, key=lambda x: x.student):
        r = item.result
        graded = [ex for ex in r["exercises"] if ex["id"] in exercises]
        cents = cents_that_add_up([float(ex["score"]) for ex in graded])
        scores = {ex["id"]: _cents(c) for ex, c in zip(graded, cents)}
        when = times.when(item.student, [ex["id"] for ex in r["exercises"]]) if times is not None else None
        if due is not None and when is None and times is not None and warnings is not None:
            warnings.append(f"no submission time for {inert(item.student)!r} in the submission times: its 'late' is empty")
        late = "" if due is None or when is None else ("yes" if when > aware(due) else "no")
        check_points = {f"{ex['id']}/{c['id']}": pts(c["points"]) for ex in r["exercises"] for c in ex["checks"]}
        writer.writerow([_text(item.student), _text(r["submission"]["id"]), *(scores.get(e, "") for e in exercises),
                         _cents(sum(cents)), pts(r["max_score"]), pts(r["gradable_max_score"]),
                         "yes" if r.get("gradable") is False else "no",
                         "no" if r["state"] == "complete" else "yes",
                         late, r["seed"], _text(r.get("finished_at") or ""),
                         *(check_points.get(c, "") for c in per_check)])
    return buffer.getvalue()
