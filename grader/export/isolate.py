"""One student's bad material fails that student, never the class.

Every per-student step of an export (a CSV row, a results.json, a feedback page, a gradebook row, a
submission time) runs inside `per_student`: whatever it raises becomes that student's outcome, recorded in
`Problems`, and the export goes on with the next student.

* `ExportError` is the export's own verdict on the student's material (a timestamp nobody can read, a result
  that is no result): "skipped <file>: <what was expected, what was found>". So is any exception at all from
  a step that reads what the student wrote (``material=True``: a timestamp, a line of the times CSV): the
  parsers of such text raise many types, and none of them is the grader's fault.
* `GradeFailed`: the result records that the grade failed on the grader's side (a regrade): nothing is exported
  for that student, never the partial points it holds; the grader's failure (exit 1).
* Any other exception is an error of the grader itself, never blamed on the student: "internal error of the
  grader while exporting <student> (<Type>: message) [<step>, <file>]".

Both are the student's outcome, and the export goes on. The command ends with "N students exported, K with
problems: a, b, c" and exits (grader/exitcodes.py) 1 when the grader failed on anyone, else 3 when some
student's material could not be used, else 0 (grader/export/README.md, "When some students need attention").
Errors of the whole export (the results folder missing, a bad --due, a times CSV without its header) still
raise ExportError: exit 2.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grader import exitcodes
from grader.results import INTERNAL_ERROR
from grader.export.checks import GradeFailed
from grader.export.load import ExportError
from grader.text import inert

OK, BAD_INPUT, PARTIAL = exitcodes.DONE, exitcodes.BAD_INPUT, exitcodes.NEEDS_ATTENTION
SHOWN = 300  # characters of an exception's message kept in a warning (messages can quote a student's file)


@dataclass
class Problems:
    """The students who need attention after an export, each with what went wrong (in order)."""

    by_student: dict[str, list[str]] = field(default_factory=dict)
    failed_by_grader: set[str] = field(default_factory=set)  # students whose problem is the grader's error

    def add(self, student: str, message: str, by_grader: bool = False) -> None:
        self.by_student.setdefault(inert(student, 200), []).append(inert(message, 2 * SHOWN))
        if by_grader:
            self.failed_by_grader.add(inert(student, 200))

    def status(self) -> int:
        """The export's exit status: 1 when the grader failed on anyone, else 3 when anyone needs attention."""
        return exitcodes.of(len(self.failed_by_grader), len(self.by_student))

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
def per_student(problems: Problems | None, student: str, path: Path | str, what: str,
                material: bool = False) -> Iterator[Outcome]:
    """Run one student's step of an export; whatever it raises becomes that student's problem.

    `path` is the student's file the step reads (named in the warning), `what` the step ("its CSV row").
    `material`: the step reads text the student wrote, so whatever it raises is that text's fault.
    Without `problems` (a library call) nothing is caught: the exception goes to the caller as before."""
    outcome = Outcome()
    if problems is None:
        yield outcome
        return
    try:
        yield outcome
    except GradeFailed as exc:  # the grade itself failed on the grader's side: no score goes anywhere
        outcome.failed, outcome.message = True, f"not exported {path}: {what}: {exc}"
        problems.add(student, outcome.message, by_grader=True)
    except ExportError as exc:  # the export's verdict on the student's own material
        outcome.failed, outcome.message = True, f"skipped {path}: {what}: {inert(exc, SHOWN)}"
        problems.add(student, outcome.message)
    except Exception as exc:
        outcome.failed = True
        if material:  # a parser of the student's text met something nobody planned for
            outcome.message = f"skipped {path}: {what}: cannot be read ({type(exc).__name__}: {inert(exc, SHOWN)})"
            problems.add(student, outcome.message)
        else:  # the grader's own fault, not the student's
            outcome.message = internal_error(student, path, what, exc)
            problems.add(student, outcome.message, by_grader=True)


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
    return (f"{INTERNAL_ERROR} while exporting {inert(student, 200)} ({type(exc).__name__}: "
            f"{inert(exc, SHOWN)}) [{what}, {path}]; the other students are exported, report this with the file")
