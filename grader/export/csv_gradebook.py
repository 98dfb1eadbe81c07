"""The CSV gradebook: one row per student, one column per exercise, in course.yaml's order.

Columns: ``student`` (the result file's name), ``submission`` (the submission's id), one column per
exercise (its points; empty if that result did not grade the exercise), ``total``, ``max_score``,
``gradable_max_score`` (points gradable on the machine that graded it: no CUDA, no speed checks),
``ungradable`` (yes when the submission could not be read at all), ``incomplete`` (yes when the grade
stopped half-way), ``late`` (yes/no when a due date and the student's submission time are known, else
empty), ``seed`` and ``graded_at``. Rows are sorted by student.

Text cells are made inert (grader/text.py: no escape sequence or control character) and kept on one
line, and a cell that starts (after any spaces) with ``=``, ``+``, ``-``, ``@``, a tab or a carriage
return gets a leading apostrophe, so a spreadsheet never reads it as a formula (CSV injection).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from grader.export.checks import pts
from grader.export.load import ExportError, Loaded
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


def read_submission_times(path: Path) -> dict[str, dt.datetime]:
    """A CSV with columns ``student`` and ``submitted_at`` (ISO 8601), as an LMS export gives them."""
    try:
        rows = list(csv.DictReader(Path(path).read_text(encoding="utf-8").splitlines()))
    except OSError as exc:
        raise ExportError(f"cannot read the submission times at {path}: {exc.strerror}") from None
    if rows and not {"student", "submitted_at"} <= set(rows[0]):
        raise ExportError(f"{path}: expected columns 'student' and 'submitted_at', found {list(rows[0])}")
    times = {}
    for n, row in enumerate(rows, 2):
        try:
            times[row["student"]] = _aware(dt.datetime.fromisoformat(row["submitted_at"].strip()))
        except (TypeError, ValueError):
            raise ExportError(f"{path}, line {n}: expected an ISO 8601 time in submitted_at, "
                              f"found {row['submitted_at']!r}") from None
    return times


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _text(value: Any) -> str:
    """A text cell: inert, on one line, and never read by a spreadsheet as a formula (CSV injection),
    even after leading blanks."""
    value = inert(value).replace("\n", " ")
    return "'" + value if value.lstrip(" ").startswith(FORMULA_STARTS) else value


def _aware(moment: dt.datetime) -> dt.datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.timezone.utc)


def to_csv(loaded: list[Loaded], course: Any = None, due: dt.datetime | None = None,
           submitted: dict[str, dt.datetime] | None = None) -> str:
    exercises = exercise_columns(loaded, course)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(FIXED_BEFORE + [_text(e) for e in exercises] + FIXED_AFTER)
    for item in sorted(loaded, key=lambda x: x.student):
        r = item.result
        scores = {ex["id"]: pts(ex["score"]) for ex in r["exercises"]}
        when = (submitted or {}).get(item.student)
        late = "" if due is None or when is None else ("yes" if when > _aware(due) else "no")
        writer.writerow([_text(item.student), _text(r["submission"]["id"]), *(scores.get(e, "") for e in exercises),
                         pts(r["score"]), pts(r["max_score"]), pts(r["gradable_max_score"]),
                         "yes" if r.get("gradable") is False else "no",
                         "no" if r["state"] == "complete" else "yes",
                         late, r["seed"], _text(r.get("finished_at") or "")])
    return buffer.getvalue()
