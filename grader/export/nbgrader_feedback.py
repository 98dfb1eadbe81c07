"""Feedback pages where nbgrader delivers them: ``grader feedback RESULTS_DIR --nbgrader COURSE_DIR``.

nbgrader 0.9's loop (its default ``CourseDirectory.directory_structure``, ``{nbgrader_step}/{student_id}/
{assignment_id}``): ``nbgrader generate_feedback`` writes ``feedback/<student>/<assignment>/<notebook>.html``
beside the submission's ``timestamp.txt`` and ``submission_secret.txt``; ``nbgrader release_feedback`` copies
each page into the exchange under a hash of that secret and the notebook's name, and the student's
``nbgrader fetch_feedback`` (or the Assignments tab) finds it by the same hash, for each notebook of their own
submission, into ``<assignment>/feedback/<timestamp>/<notebook>.html``.

This writes the same files in place of ``generate_feedback``: per result and per exercise it holds (an
nbgrader assignment of the same id, whose notebook has that name too, as the gradebook export makes them),
``COURSE_DIR/feedback/<student>/<exercise>/<exercise>.html``, the feedback page of that exercise alone
(grader/export/feedback.py), with the two files copied from ``COURSE_DIR/submitted/<student>/<exercise>/``
(what ``nbgrader collect`` put there). Without both files there, ``release_feedback`` would stop at that
folder, so no page is written for it and a warning names it. The student is the id ``grader batch`` gives the
submitted folder (grader/export/times.py).

What ``fetch_feedback`` delivers is named by the student's notebooks: a page reaches a student whose submission
holds ``<exercise>.ipynb`` (the assignment's released notebook); a submission of ``<exercise>.py`` alone is
graded, and its page is released, but ``fetch_feedback`` finds no notebook to match it with.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grader.export.feedback import exercise_result, render_feedback
from grader.export.isolate import Problems, per_student, usable
from grader.export.load import Loaded
from grader.export.times import TIMESTAMP_FILE, nbgrader_folders, read_small_file

SECRET_FILE = "submission_secret.txt"
NEEDED = (TIMESTAMP_FILE, SECRET_FILE)


@dataclass
class FeedbackReport:
    written: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def write_nbgrader_feedback(loaded: list[Loaded], course_dir: Path, course: Any = None,
                            plots: bool = True, problems: Problems | None = None) -> FeedbackReport:
    """Each result's pages; with `problems` (grader/export/isolate.py) each student and exercise is written on
    its own: one that raises, or that gets no page, is recorded there (else in the report's warnings)."""
    course_dir = Path(course_dir)
    folders = nbgrader_folders(course_dir / "submitted", problems)
    report = FeedbackReport()

    def warn(student: str, text: str) -> None:
        problems.add(student, text) if problems is not None else report.warnings.append(text)

    for item in usable(problems, loaded, "its exercises", lambda item: [ex["id"] for ex in item.result["exercises"]]):
        for ex in item.result["exercises"]:
            with per_student(problems, item.student, item.path, f"its {ex['id']} feedback page"):
                page = _one_page(item, ex, folders, course_dir, course, plots, warn)
                if page is not None:
                    report.written.append(page)
    return report


def _one_page(item: Loaded, ex: dict, folders: dict[tuple[str, str], Path], course_dir: Path, course: Any,
              plots: bool, warn: Callable[[str, str], None]) -> Path | None:
    submitted = folders.get((item.student, ex["id"]))
    if submitted is None:
        if ex["status"] != "missing":
            warn(item.student, f"{item.student}/{ex['id']}: no submitted/{item.student}/{ex['id']}/ "
                               "folder (nbgrader collect makes it): no feedback page written")
        return None
    copied = {name: read_small_file(submitted / name, 4096) for name in NEEDED}
    absent = [name for name, text in copied.items() if text is None]
    if absent:
        warn(item.student, f"{item.student}/{ex['id']}: {' and '.join(absent)} not in {submitted} "
                           "(nbgrader submit writes them; release_feedback needs both): no page written")
        return None
    page_text = render_feedback(exercise_result(item.result, ex["id"]), course, plots=plots)  # before any file
    out = course_dir / "feedback" / submitted.parent.name / ex["id"]
    out.mkdir(parents=True, exist_ok=True)
    for name, text in copied.items():
        _write(out / name, text or "")
    page = out / f"{ex['id']}.html"
    _write(page, page_text)
    return page


def _write(path: Path, text: str) -> None:
    """Replace `path` whole (never through a link left there), readable as generate_feedback's files are (0644)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
