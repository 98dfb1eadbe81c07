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

from grader.export.load import ExportError
from grader.text import inert

TIMESTAMP_FILE = "timestamp.txt"
MAX_TIMESTAMP_BYTES = 256
_OFFSET = re.compile(r"^([+-])(\d\d):?(\d\d)$")
_UTC_NAMES = {"UTC", "GMT", "Z", "UCT"}


@dataclass(frozen=True)
class SubmissionTimes:
    """Submission times by student (a CSV file) and by (student, exercise) (nbgrader's folder)."""

    students: Mapping[str, dt.datetime] = field(default_factory=dict)
    exercises: Mapping[tuple[str, str], dt.datetime] = field(default_factory=dict)
    source: str = ""

    def when(self, student: str, exercise_ids: Iterable[str]) -> dt.datetime | None:
        """The latest time of `student`'s exercises among `exercise_ids`, else the student's own time."""
        per_exercise = [self.exercises[student, e] for e in exercise_ids if (student, e) in self.exercises]
        return max(per_exercise) if per_exercise else self.students.get(student)


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
    return SubmissionTimes(students=read_times_csv(path), source=str(path))


def read_times_csv(path: Path) -> dict[str, dt.datetime]:
    """A CSV with columns ``student`` and ``submitted_at`` (ISO 8601), as an LMS export gives them."""
    try:
        rows = list(csv.DictReader(Path(path).read_text(encoding="utf-8").splitlines()))
    except OSError as exc:
        raise ExportError(f"cannot read the submission times at {path}: {exc.strerror}; expected a CSV file with "
                          "columns student,submitted_at or nbgrader's submitted/ folder") from None
    if rows and not {"student", "submitted_at"} <= set(rows[0]):
        raise ExportError(f"{path}: expected columns 'student' and 'submitted_at', found {list(rows[0])}")
    times = {}
    for n, row in enumerate(rows, 2):
        try:
            times[row["student"]] = aware(dt.datetime.fromisoformat(row["submitted_at"].strip()))
        except (TypeError, ValueError, AttributeError):
            raise ExportError(f"{path}, line {n}: expected an ISO 8601 time in submitted_at, "
                              f"found {row['submitted_at']!r}") from None
    return times


def nbgrader_folders(submitted: Path) -> dict[tuple[str, str], Path]:
    """(student id, assignment) -> nbgrader's ``submitted/<student>/<assignment>`` folder. The student id is the
    one ``grader batch SUBMITTED`` gives the student's folder; folders that are links or dot files are left out,
    as the batch leaves them."""
    from grader.scale.discover import submission_id

    submitted = Path(submitted)
    if not submitted.is_dir():
        raise ExportError(f"expected nbgrader's submitted/ folder (submitted/<student>/<assignment>/) at {submitted}, "
                          f"found {'a file' if submitted.exists() else 'nothing'} there")
    found: dict[tuple[str, str], Path] = {}
    for student in sorted(submitted.iterdir()):
        if student.name.startswith((".", "__MACOSX")) or student.is_symlink() or not student.is_dir():
            continue
        for assignment in sorted(student.iterdir()):
            if assignment.is_dir() and not assignment.is_symlink() and not assignment.name.startswith("."):
                found[submission_id(student), assignment.name] = assignment
    return found


def read_nbgrader_timestamps(submitted: Path) -> SubmissionTimes:
    """Every ``submitted/<student>/<assignment>/timestamp.txt`` under `submitted`."""
    times: dict[tuple[str, str], dt.datetime] = {}
    for key, folder in nbgrader_folders(submitted).items():
        text = read_small_file(folder / TIMESTAMP_FILE)
        if text is None or not text.strip():
            continue  # nbgrader too reads a missing or empty timestamp as "no time"
        try:
            times[key] = parse_nbgrader_time(text)
        except ValueError as exc:
            raise ExportError(f"{folder / TIMESTAMP_FILE}: expected a time as nbgrader submit writes it "
                              f"(2026-12-01 23:59:00.123456 UTC) or ISO 8601, found {inert(text.strip())[:60]!r} "
                              f"({exc})") from None
    if not times:
        raise ExportError(f"expected nbgrader's submitted/<student>/<assignment>/{TIMESTAMP_FILE} under {submitted}, "
                          "found none")
    return SubmissionTimes(exercises=times, source=str(submitted))


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
