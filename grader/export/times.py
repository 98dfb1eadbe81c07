"""When each student submitted: what the CSV's ``late`` column and the nbgrader gradebook's lateness read.

`grader export --submitted-times SOURCE` takes either

* a **CSV file** with columns ``student`` and ``submitted_at`` (ISO 8601), as an LMS exports them: one
  time per student; or
* **nbgrader's ``submitted/`` folder** (what ``nbgrader collect`` writes, and what ``grader batch`` grades):
  ``submitted/<student>/<assignment>/timestamp.txt``, the time ``nbgrader submit`` recorded (nbgrader's
  format, ``2026-12-01 23:59:00.123456 UTC``; the same file nbgrader's own autograde reads for lateness):
  one time per student and assignment, each assignment an exercise of the same id. The student is the id
  ``grader batch`` gives that student's folder (its name, unless it cannot name a result file).

A student's time for a whole row (the CSV) is the latest time of the exercises their result holds; the
nbgrader export gives each assignment its own.

Every time is timezone-aware; one written without a zone is taken as UTC. A ``timestamp.txt`` is read
like a student's file (nbgrader's submit runs as the student): a plain file only, never through a symbolic
link, at most `MAX_TIMESTAMP_BYTES`.

One student's time that cannot be read (a CSV row or a ``timestamp.txt`` in a format nobody expected, or any
error while reading it: grader/export/isolate.py) costs that student's time alone: it is left out and
`SubmissionTimes.unknown` says why, naming the student and the file; the exports leave that student's
lateness empty and count the student as one with problems. Only a source that is no source at all (nothing
there, a CSV without the ``student`` and ``submitted_at`` columns, a ``submitted/`` folder without any
``timestamp.txt``) stops the export (ExportError).
"""

from __future__ import annotations

import csv
import datetime as dt
import os
import re
import stat
import zoneinfo
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from grader.export.isolate import Problems, per_student
from grader.export.load import ExportError
from grader.text import inert

TIMESTAMP_FILE = "timestamp.txt"
MAX_TIMESTAMP_BYTES = 256
_OFFSET = re.compile(r"^([+-])(\d\d):?(\d\d)$")
_UTC_NAMES = {"UTC", "GMT", "Z", "UCT"}


@dataclass(frozen=True)
class SubmissionTimes:
    """Submission times by student (a CSV file) and by (student, exercise) (nbgrader's folder). `unknown`:
    the times that could not be read, by (student, exercise) or (student, None) for a student's only time,
    each with the warning that says why (naming the student and the file)."""

    students: Mapping[str, dt.datetime] = field(default_factory=dict)
    exercises: Mapping[tuple[str, str], dt.datetime] = field(default_factory=dict)
    source: str = ""
    unknown: Mapping[tuple[str, str | None], str] = field(default_factory=dict)

    def when(self, student: str, exercise_ids: Iterable[str]) -> dt.datetime | None:
        """The latest time of `student`'s exercises among `exercise_ids`, else the student's own time."""
        per_exercise = [self.exercises[student, e] for e in exercise_ids if (student, e) in self.exercises]
        return max(per_exercise) if per_exercise else self.students.get(student)

    def unreadable(self, student: str, exercise_ids: Iterable[str]) -> list[str]:
        """Why `student`'s time for these exercises is not known, if it could not be read (else [])."""
        keys = [(student, None), *((student, e) for e in exercise_ids)]
        return [self.unknown[k] for k in keys if k in self.unknown]


def as_times(value: SubmissionTimes | Mapping[str, dt.datetime] | None) -> SubmissionTimes | None:
    """Accept a plain {student: time} mapping where a SubmissionTimes is expected."""
    if value is None or isinstance(value, SubmissionTimes):
        return value
    return SubmissionTimes(students=dict(value))


def aware(moment: dt.datetime) -> dt.datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.timezone.utc)


def read_submission_times(path: Path) -> SubmissionTimes:
    """The times at `path`: nbgrader's ``submitted/`` folder when it is a folder, else a CSV file."""
    path = Path(path)
    if path.is_dir():
        return read_nbgrader_timestamps(path)
    return read_times_csv(path)


def _shown(text: str) -> str:
    """A student's text quoted in a warning: inert and short (a line can be kilobytes)."""
    return repr(inert(text.strip(), 60))


def parse_csv_time(text: str) -> dt.datetime:
    """A ``submitted_at`` cell: ISO 8601, timezone-aware (a time without a zone is UTC)."""
    return aware(dt.datetime.fromisoformat(text.strip()))


def read_times_csv(path: Path) -> SubmissionTimes:
    """A CSV with columns ``student`` and ``submitted_at`` (ISO 8601), as an LMS export gives them. A row whose
    time cannot be read costs that student's time alone (`SubmissionTimes.unknown`)."""
    try:
        # undecodable bytes become U+FFFD: they cost the row that holds them, not the file
        lines = Path(path).read_bytes().decode("utf-8", "replace").splitlines()
    except OSError as exc:
        raise ExportError(f"cannot read the submission times at {path}: {exc.strerror}; expected a CSV file with "
                          "columns student,submitted_at or nbgrader's submitted/ folder") from None
    header = next(csv.reader(lines[:1]), [])
    if lines and not {"student", "submitted_at"} <= set(header):
        raise ExportError(f"{path}: expected columns 'student' and 'submitted_at', found {[inert(h, 60) for h in header[:10]]}")
    times: dict[str, dt.datetime] = {}
    unknown: dict[tuple[str, str | None], str] = {}
    problems = Problems()  # per_student's record; each failure's message goes to `unknown`
    for n, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue
        where = f"{path}, line {n}"
        # one line at a time: a line the csv module refuses (a field over its size limit) is that line's alone
        row: dict[str, str] = {}
        with per_student(problems, f"line {n}", where, "its row", material=True) as outcome:
            row = dict(zip(header, next(csv.reader([line]), [])))
        student = row.get("student") or f"line {n}"
        if not outcome.failed:
            with per_student(problems, student, where, f"the submission time of {inert(student, 60)!r}",
                             material=True) as outcome:
                if "submitted_at" not in row:
                    raise ExportError(f"expected a submitted_at cell, found only {len(row)} cell(s)")
                try:
                    times[student] = parse_csv_time(row["submitted_at"])
                except ValueError as exc:
                    raise ExportError(f"expected an ISO 8601 time (2026-12-01T23:59:00+00:00), found "
                                      f"{_shown(row['submitted_at'])} ({inert(exc, 80)})") from None
        if outcome.failed:
            times.pop(student, None)
            unknown[student, None] = outcome.message
    return SubmissionTimes(students=times, source=str(path), unknown=unknown)


def nbgrader_folders(submitted: Path, problems: Problems | None = None) -> dict[tuple[str, str], Path]:
    """(student id, assignment) -> nbgrader's ``submitted/<student>/<assignment>`` folder. The student id is the
    one ``grader batch SUBMITTED`` gives the student's folder; folders that are links or dot files are left out,
    as the batch leaves them. With `problems`, a student's folder that cannot be listed is that student's problem."""
    from grader.scale.discover import submission_id

    submitted = Path(submitted)
    if not submitted.is_dir():
        raise ExportError(f"expected nbgrader's submitted/ folder (submitted/<student>/<assignment>/) at {submitted}, "
                          f"found {'a file' if submitted.exists() else 'nothing'} there")
    found: dict[tuple[str, str], Path] = {}
    for student in sorted(submitted.iterdir()):
        with per_student(problems, student.name, student, "its submitted/ folder"):
            if student.name.startswith((".", "__MACOSX")) or student.is_symlink() or not student.is_dir():
                continue
            sid = submission_id(student)
            for assignment in sorted(student.iterdir()):
                if assignment.is_dir() and not assignment.is_symlink() and not assignment.name.startswith("."):
                    found[sid, assignment.name] = assignment
    return found


def read_nbgrader_timestamps(submitted: Path) -> SubmissionTimes:
    """Every ``submitted/<student>/<assignment>/timestamp.txt`` under `submitted`; one that cannot be read costs
    that student's time for that assignment alone (`SubmissionTimes.unknown`)."""
    times: dict[tuple[str, str], dt.datetime] = {}
    unknown: dict[tuple[str, str | None], str] = {}
    folders_problems = Problems()
    folders = nbgrader_folders(submitted, folders_problems)
    for student, messages in folders_problems.by_student.items():
        unknown[student, None] = "; ".join(messages)
    for key, folder in folders.items():
        path = folder / TIMESTAMP_FILE
        with per_student(Problems(), key[0], path, f"the {key[1]} submission time of {inert(key[0], 60)!r}",
                         material=True) as outcome:
            text = read_small_file(path)
            if text is None or not text.strip():
                continue  # nbgrader too reads a missing or empty timestamp as "no time"
            try:
                times[key] = parse_nbgrader_time(text)
            except ValueError as exc:
                raise ExportError(f"expected a time as nbgrader submit writes it (2026-12-01 23:59:00.123456 UTC) "
                                  f"or ISO 8601, found {_shown(text)} ({inert(exc, 80)})") from None
        if outcome.failed:
            times.pop(key, None)
            unknown[key] = outcome.message
    if not times and not unknown:
        raise ExportError(f"expected nbgrader's submitted/<student>/<assignment>/{TIMESTAMP_FILE} under {submitted}, "
                          "found none")
    return SubmissionTimes(exercises=times, source=str(submitted), unknown=unknown)


def read_small_file(path: Path, limit: int = MAX_TIMESTAMP_BYTES) -> str | None:
    """The text of a plain file at `path` (never through a link), at most `limit` bytes; None if there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit).decode("utf-8", "replace")
    finally:
        os.close(fd)


def parse_nbgrader_time(text: str) -> dt.datetime:
    """A time as ``nbgrader submit`` writes it (``%Y-%m-%d %H:%M:%S.%f %Z``: ``2026-12-01 23:59:00.123456 UTC``,
    the zone a name or a ``+HHMM`` offset), or ISO 8601; timezone-aware (a time without a zone is UTC)."""
    parts = text.strip().split(" ")
    if len(parts) == 3:
        moment = dt.datetime.fromisoformat(f"{parts[0]} {parts[1]}")
        if moment.tzinfo is not None:
            raise ValueError("two time zones")
        return moment.replace(tzinfo=_zone(parts[2]))
    return aware(dt.datetime.fromisoformat(text.strip()))


def _zone(name: str) -> dt.tzinfo:
    if name.upper() in _UTC_NAMES:
        return dt.timezone.utc
    offset = _OFFSET.match(name)
    if offset:
        sign = -1 if offset.group(1) == "-" else 1
        return dt.timezone(sign * dt.timedelta(hours=int(offset.group(2)), minutes=int(offset.group(3))))
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r} (an abbreviation such as CEST names no one zone); nbgrader's "
                         "default Exchange.timezone, UTC, writes times that read unambiguously") from None
