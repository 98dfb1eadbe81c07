"""Read a folder of canonical results (one ``*.json`` per student), keeping going past malformed files."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import jsonschema

from grader.text import inert
from grader import results

EXPECTED = f"a grading result (JSON object with \"schema\": \"{results.SCHEMA_ID}\", as `grader grade --out` writes)"


class ExportError(ValueError):
    """Bad input to an export: the message says what was expected and what was found."""


@dataclass(frozen=True)
class Loaded:
    student: str  # the file's name without .json: the student's id in every export
    path: Path
    result: dict


@dataclass(frozen=True)
class Skipped:
    path: Path
    reason: str

    def __str__(self) -> str:
        return f"skipped {self.path.name}: {self.reason}"


def read_result(path: Path) -> dict:
    """One result file, validated against grader/schemas/result.schema.json; ExportError if it is not one."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ExportError(f"cannot read it ({exc}); expected {EXPECTED}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ExportError(f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); expected {EXPECTED}") from None
    if not isinstance(data, dict):
        raise ExportError(f"expected {EXPECTED}, found a JSON {type(data).__name__}")
    if "schema" not in data:
        keys = ", ".join(list(data)[:5]) or "none"
        raise ExportError(f"expected {EXPECTED}, found an object without \"schema\" (keys: {keys})")
    if data["schema"] != results.SCHEMA_ID:
        raise ExportError(f"expected {EXPECTED}, found \"schema\": {json.dumps(data['schema'])}")
    try:
        results.validate(data)
    except jsonschema.ValidationError as exc:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.absolute_path).lstrip(".") or "(top level)"
        raise ExportError(f"does not match the result schema (`grader schema result`) at {where}: {exc.message}") from None
    return data


def _is_batch_summary(path: Path) -> bool:
    """`grader batch` writes summary.json beside the results: not a student's, and not an error."""
    if path.name != "summary.json":
        return False
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "schema" not in data and {"submissions", "graded", "exercises"} <= set(data)


def load_results(folder: Path) -> tuple[list[Loaded], list[Skipped]]:
    """Every ``*.json`` result in `folder`, sorted by student; malformed files are skipped with the reason.

    Dotfiles (results being written) and `grader batch`'s summary.json are left out without a word.
    """
    folder = Path(folder)
    if not folder.is_dir():
        found = "a file" if folder.exists() else "nothing"
        raise ExportError(f"expected a folder of result files (one <student>.json each) at {folder}, found {found} there")
    loaded, skipped = [], []
    for path in sorted(folder.glob("*.json")):
        if path.name.startswith("."):  # a result being written atomically (results.write_atomic)
            continue
        if inert(path.stem) != path.stem:  # the id names folders and files in every export
            skipped.append(Skipped(path, f"expected a student id without control characters, found {path.stem!r}; "
                                         "rename the file"))
            continue
        try:
            loaded.append(Loaded(path.stem, path, read_result(path)))
        except ExportError as exc:
            if not _is_batch_summary(path):
                skipped.append(Skipped(path, str(exc)))
    if not loaded and not skipped:
        raise ExportError(f"expected result files (<student>.json) in {folder}, found none")
    return loaded, skipped
