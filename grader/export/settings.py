"""Course-level export settings: the optional ``export:`` mapping of course.yaml.

    export:
      due: "2026-12-15T23:59:00+00:00"   # the CSV gradebook's `late` flag compares submission times with this
      gradescope:
        visibility: {public: visible, hidden: after_published}   # per check visibility on Gradescope
        stdout_visibility: hidden        # run_autograder's own log, for instructors
        leaderboard: false               # a leaderboard entry per speed check (its achieved metric)
        count_ungraded_cuda: false       # do checks that need CUDA (never graded on Gradescope) count?
      prairielearn:
        count_ungraded_cuda: false       # score = points / (gradable points) when false, / (all points) when true

Every field is optional; `Course.export` holds them once course.yaml is loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from grader.course import (
    COURSE_FILE,
    CourseError,
    ExportSettings,
    GradescopeSettings,
    PrairieLearnSettings,
    VisibilityMap,
    _format_error,
)

# The models live in grader/course.py (course.yaml's `export:` field); re-exported here.
__all__ = ["ExportSettings", "GradescopeSettings", "PrairieLearnSettings", "VisibilityMap", "load_settings", "parse_settings"]


def parse_settings(data: Any, source: str = COURSE_FILE) -> ExportSettings:
    """Validate an ``export:`` mapping; errors name the field, what was expected and what was found."""
    if data is None:
        return ExportSettings()
    if not isinstance(data, dict):
        raise CourseError(f"{source}: export: expected a mapping, found {type(data).__name__}")
    try:
        return ExportSettings.model_validate(data)
    except ValidationError as exc:
        errors = [{**e, "loc": ("export", *e["loc"])} for e in exc.errors(include_url=False)]
        raise CourseError("\n".join(_describe_error(e, source) for e in errors)) from None


def _describe_error(err: dict, source: str) -> str:
    path = ".".join(str(part) for part in err["loc"])
    found = repr(err.get("input"))
    if err["type"].startswith("bool_"):
        return f"{source}: {path}: expected true or false, found {found}"
    if err["type"].startswith(("datetime_", "date_")):
        return f"{source}: {path}: expected an ISO 8601 date and time such as '2026-12-15T23:59:00+00:00', found {found}"
    return _format_error(err, source)


def load_settings(root: Path | None, course: Any = None) -> ExportSettings:
    """The course's export settings: `course.export` if the model has it, else course.yaml's raw mapping."""
    exported = getattr(course, "export", None)
    if isinstance(exported, ExportSettings):
        return exported
    if exported is not None:  # the lead's own model with the same fields
        return parse_settings(exported.model_dump() if hasattr(exported, "model_dump") else exported)
    if root is None or not (Path(root) / COURSE_FILE).is_file():
        return ExportSettings()
    try:
        data = yaml.safe_load((Path(root) / COURSE_FILE).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise CourseError(f"{COURSE_FILE}: cannot read the export settings: {exc}") from None
    return parse_settings(data.get("export") if isinstance(data, dict) else None)
