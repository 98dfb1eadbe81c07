"""One student's bad material fails that student, never the class.

Every per-student step of an export (a CSV row, a results.json, a feedback page, a gradebook row, a
submission time) runs inside `per_student`: whatever it raises becomes that student's outcome, recorded in
`Problems`, and the export goes on with the next student.

* `ExportError` is the export's own verdict on the student's material (a timestamp nobody can read, a result
  that is no result): "skipped <file>: <what was expected, what was found>".
* Any other exception is an error of the grader itself, never blamed on the student: "internal error of the
  grader while exporting <student> (<Type>: message) [<step>, <file>]".

Both count: the command exits `PARTIAL` (3) instead of 0 and ends with "N students exported, K with problems:
a, b, c" (grader/export/README.md, "When some students need attention"). Errors of the whole export (the
results folder missing, a bad --due, a times CSV without its header) still raise ExportError: exit 2.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grader.export.load import ExportError
from grader.text import inert

OK, BAD_INPUT, PARTIAL = 0, 2, 3  # the export commands' exit statuses
SHOWN = 300  # characters of an exception's message kept in a warning (messages can quote a student's file)


@dataclass
class Problems:
    """The students who need attention after an export, each with what went wrong (in order)."""

    by_student: dict[str, list[str]] = field(default_factory=dict)

    def add(self, student: str, message: str) -> None:
        self.by_student.setdefault(inert(student, 200), []).append(inert(message, 2 * SHOWN))

    def __contains__(self, student: str) -> bool:
        return inert(student, 200) in self.by_student

    def __bool__(self) -> bool:
        return bool(self.by_student)

    def messages(self) -> list[str]:
        return [m for ms in self.by_student.values() for m in ms]

    def count_line(self, exported: int) -> str:
        names = ", ".join(sorted(self.by_student))
        return f"{exported} student(s) exported, {len(self.by_student)} with problems" + (f": {names}" if names else "")


@dataclass
class Outcome:
    """What `per_student` saw: `failed` is True when the step raised; `message` is then the warning recorded."""

    failed: bool = False
    message: str = ""


@contextmanager
def per_student(problems: Problems | None, student: str, path: Path | str, what: str) -> Iterator[Outcome]:
    """Run one student's step of an export; whatever it raises becomes that student's problem.

    `path` is the student's file the step reads (named in the warning), `what` the step ("its CSV row").
    Without `problems` (a library call) nothing is caught: the exception goes to the caller as before."""
    outcome = Outcome()
    if problems is None:
        yield outcome
        return
    try:
        yield outcome
    except ExportError as exc:  # the export's verdict on the student's own material
        outcome.failed, outcome.message = True, f"skipped {path}: {what}: {inert(exc, SHOWN)}"
        problems.add(student, outcome.message)
    except Exception as exc:  # anything else is the grader's own fault, not the student's
        outcome.failed, outcome.message = True, internal_error(student, path, what, exc)
        problems.add(student, outcome.message)


def usable(problems: Problems | None, loaded: list, what: str, read: Callable[[Any], Any]) -> list:
    """The results among `loaded` (each with .student and .path) that `read` (a look at what the whole export
    takes from each, such as its exercise ids) gets through; the others are recorded in `problems`."""
    kept = []
    for item in loaded:
        with per_student(problems, item.student, item.path, what) as outcome:
            read(item)
        if not outcome.failed:
            kept.append(item)
    return kept


def internal_error(student: str, path: Path | str, what: str, exc: BaseException) -> str:
    return (f"internal error of the grader while exporting {inert(student, 200)} ({type(exc).__name__}: "
            f"{inert(exc, SHOWN)}) [{what}, {path}]; the other students are exported, report this with the file")
