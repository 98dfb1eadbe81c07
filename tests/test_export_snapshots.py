"""Snapshot tests: each platform's output for fixed inputs, pinned in full and checked field by field against
what the platform documents.

Inputs: three results of a two-exercise course made up here (so the snapshots do not move when course.yaml's
rubric does), stored under tests/snapshots/inputs/: zoe (graded on a CPU: a public check passed, a hidden one
half passed with a traceback, a CUDA speed check not graded, an exercise missing), yves (graded on a GPU:
the speed check measured, everything graded) and xena (an archive that could not be read). They are built
by `build_inputs` below, and the stored copies are pinned too (a change to grader/results.py shows there).

Outputs, one stored file each under tests/snapshots/: Gradescope's and PrairieLearn's results.json per
student, the CSV gradebook, the nbgrader gradebook's rows (read back through nbgrader's API), the feedback
page of zoe and the nbgrader feedback pages. A mismatch fails with a unified diff of the stored file against
what the exporter writes now.

To accept a change on purpose, rewrite the stored files and review their diff in git:

    UPDATE_SNAPSHOTS=1 .venv/bin/pytest -q tests/test_export_snapshots.py
"""

from __future__ import annotations

import base64
import csv
import datetime as dt
import difflib
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from grader import results as R
from grader.export.csv_gradebook import FIXED_AFTER, FIXED_BEFORE, to_csv
from grader.export.feedback import render_feedback
from grader.export.gradescope import to_gradescope
from grader.export.load import Loaded
from grader.export.prairielearn import to_prairielearn
from grader.export.settings import parse_settings
from grader.export.times import SubmissionTimes
from tests.conftest import COURSE

SNAPSHOTS = Path(__file__).parent / "snapshots"
INPUTS = SNAPSHOTS / "inputs"
UPDATE = os.environ.get("UPDATE_SNAPSHOTS") == "1"
STUDENTS = ("xena", "yves", "zoe")
FINISHED = "2026-11-29T12:00:00+00:00"
DUE = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)
TIMES = SubmissionTimes(exercises={("zoe", "scan"): dt.datetime(2026, 11, 30, 9, 0, tzinfo=dt.timezone.utc),
                                   ("yves", "scan"): dt.datetime(2026, 12, 1, 0, 30, tzinfo=dt.timezone.utc),
                                   ("yves", "sort"): dt.datetime(2026, 11, 28, tzinfo=dt.timezone.utc)})


# --------------------------------------------------------------------------------------------------
# the snapshot files


def assert_snapshot(name: str, actual: Any) -> None:
    """`actual` (JSON-like, or text) equals tests/snapshots/<name>; with UPDATE_SNAPSHOTS=1, becomes it."""
    path = SNAPSHOTS / name
    text = actual if isinstance(actual, str) else json.dumps(actual, indent=2, ensure_ascii=False) + "\n"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    if not path.exists():
        pytest.fail(f"no snapshot {path.relative_to(SNAPSHOTS.parent.parent)}: write it with UPDATE_SNAPSHOTS=1 "
                    "and review it")
    stored = path.read_text(encoding="utf-8")
    same = stored == text if isinstance(actual, str) else json.loads(stored) == actual
    if not same:
        diff = "".join(list(difflib.unified_diff(stored.splitlines(keepends=True), text.splitlines(keepends=True),
                                                 f"stored {name}", "exported now", n=2))[:300])
        pytest.fail(f"the export no longer matches tests/snapshots/{name}:\n{diff}\n"
                    "If the change is intended: UPDATE_SNAPSHOTS=1 .venv/bin/pytest -q tests/test_export_snapshots.py, "
                    "then review the diff in git.", pytrace=False)


def tiny_course():
    """Two exercises; the rubric made up here, the rest of each exercise copied from course.yaml's first."""
    from grader.course import parse_course

    base = {k: v for k, v in COURSE.exercises[0].model_dump(mode="json", exclude_none=True).items() if k not in ("hints", "parts")}
    return parse_course({**COURSE.model_dump(mode="json", exclude_none=True), "course": "tiny-course", "version": "1.0",
                         "exercises": [
        {**base, "id": "scan", "title": "Scan", "file": "scan.py", "points": 10, "checks": [
            {"id": "basic_public", "title": "scan on small inputs", "points": 4, "visibility": "public"},
            {"id": "edge", "title": "scan: empty and long inputs", "points": 4},
            {"id": "scan_speed", "title": "scan bandwidth on CUDA", "points": 2, "cuda": True,
             "speed": {"metric": "fraction_of_copy_bandwidth", "bar": 0.5, "floor": 0.1}}]},
        {**base, "id": "sort", "title": "Sort", "file": "sort.py", "points": 5, "checks": [
            {"id": "sort_public", "title": "sort on small inputs", "points": 5, "visibility": "public"}]}]}, "tiny.yaml")


def build_inputs(course) -> dict[str, dict]:
    """The three results, as the runner writes them, with fixed times, versions and device."""
    made = {}
    for student in STUDENTS:
        r = R.new_result(course, student, "ab" * 32 if student != "xena" else "", "cd" * 32, 99, "sandbox",
                         course.exercises)

        def test(check, name, status, exercise="scan", **extra):
            R.record_test(r, {"event": "test", "exercise": exercise, "check": check, "test": name, "status": status,
                              "duration": 0.5, **extra})

        if student == "xena":
            R.mark_ungradable(r, "archive member '../x.py' points outside the archive (absolute path or '..'); refused")
        else:
            r["gradable"] = True
            test("basic_public", "test_basic[0]", "passed", fraction=1.0)
            test("basic_public", "test_basic[1]", "passed", fraction=1.0)
            test("edge", "test_empty", "passed", fraction=1.0)
            test("edge", "test_long", "failed", message="row 7: expected 3.0, got 2.5",
                 traceback='  File "/s/scan.py", line 4, in scan\n    return x[:-1]\nAssertionError')
            if student == "zoe":
                test("scan_speed", "test_bandwidth", "not_graded", message="not graded: no CUDA device")
            else:
                test("scan_speed", "test_bandwidth[4096]", "passed", fraction=1.0,
                     metrics={"gbps": 2100.0, "copy_gbps": 3900.0, "fraction_of_copy_bandwidth": 0.54, "bar": 0.5, "floor": 0.1})
                test("scan_speed", "test_bandwidth[65536]", "passed", fraction=0.5,
                     metrics={"gbps": 1200.0, "copy_gbps": 3900.0, "fraction_of_copy_bandwidth": 0.31, "bar": 0.5, "floor": 0.1})
            R.close_exercise(r, "scan")
            if student == "zoe":
                R.find_exercise(r, "sort")["status"] = "missing"
                R.close_exercise(r, "sort", "not submitted: expected a file named sort.py")
            else:
                test("sort_public", "test_sort", "passed", exercise="sort", fraction=1.0)
                R.close_exercise(r, "sort")
        R.finish(r)
        r["started_at"], r["finished_at"], r["grader_version"] = "2026-11-29T11:59:30+00:00", FINISHED, "9.9.9"
        r["device"] = {"platform": "Linux", "cpu": "test CPU", "python": "3.11", "torch": "2.5.0", "cuda": None,
                       "gpu": None, "triton": "3.1.0"}
        if student == "yves":
            r["device"].update(cuda="12.4", gpu="Test GPU 80GB")
        R.validate(r)
        made[student] = r
    return made


@pytest.fixture(scope="module")
def course():
    return tiny_course()


@pytest.fixture(scope="module")
def inputs(course) -> dict[str, dict]:
    """The stored inputs (tests/snapshots/inputs/<student>.json): what every export here reads."""
    if UPDATE:
        for student, result in build_inputs(course).items():
            assert_snapshot(f"inputs/{student}.json", result)
    return {s: json.loads((INPUTS / f"{s}.json").read_text()) for s in STUDENTS}


def loaded(inputs: dict[str, dict]) -> list[Loaded]:
    return [Loaded(s, INPUTS / f"{s}.json", r) for s, r in inputs.items()]


def test_the_stored_inputs_are_results_the_runner_makes(course, inputs):
    built = build_inputs(course)
    for student in STUDENTS:
        R.validate(inputs[student])
        assert_snapshot(f"inputs/{student}.json", built[student])


# --------------------------------------------------------------------------------------------------
# Gradescope: gradescope-autograders.readthedocs.io, "Autograder Specifications"

GS_VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}
GS_FORMATS = {"text", "html", "simple_format", "md", "ansi"}


def assert_gradescope_fields(out: dict, result: dict) -> None:
    """The fields Gradescope reads, their types, and what grader/export/README.md promises of them."""
    assert set(out) <= {"score", "execution_time", "output", "output_format", "test_output_format", "test_name_format",
                        "visibility", "stdout_visibility", "extra_data", "tests", "leaderboard"}, set(out)
    assert isinstance(out["score"], float) and out["score"] == result["score"] >= 0
    assert isinstance(out["execution_time"], (int, float)) and out["execution_time"] >= 0
    assert isinstance(out["output"], str) and out["output_format"] in GS_FORMATS and out["test_output_format"] in GS_FORMATS
    assert out["stdout_visibility"] in GS_VISIBILITY and isinstance(out["extra_data"], dict)
    assert out["extra_data"]["seed"] == result["seed"] and out["extra_data"]["warnings"] == result["warnings"]
    numbers = []
    for test in out["tests"]:
        assert set(test) <= {"name", "name_format", "number", "score", "max_score", "status", "output", "output_format",
                             "tags", "visibility", "extra_data"}, set(test)
        assert isinstance(test["name"], str) and test["name"]
        assert re.fullmatch(r"[0-9]+\.[0-9]+", test["number"]), test["number"]  # exercise.check
        assert isinstance(test["score"], float) and isinstance(test["max_score"], float)
        assert 0 <= test["score"] <= test["max_score"]
        # always a status (Gradescope shows a test without one as passed): full marks pass, no points fail
        assert test["status"] in ("passed", "failed")
        assert test["status"] == "passed" if test["score"] == test["max_score"] > 0 else True, test
        assert test["status"] == "failed" if test["score"] == 0 < test["max_score"] else True, test
        assert isinstance(test["output"], str) and len(test["output"]) <= 9000
        assert test["visibility"] in GS_VISIBILITY
        assert all(isinstance(tag, str) for tag in test["tags"]) and test["tags"][2] in ("public", "hidden")
        numbers.append(tuple(int(n) for n in test["number"].split(".")))
    assert numbers == sorted(numbers), "tests in course.yaml's order"
    assert round(sum(t["score"] for t in out["tests"]), 4) == out["score"], "the tests add up to the score"
    for entry in out.get("leaderboard", []):
        assert set(entry) <= {"name", "value", "order"} and isinstance(entry["name"], str)
        assert isinstance(entry["value"], (int, float)) and entry["order"] in ("asc", "desc")


def test_gradescope_snapshot(course, inputs):
    settings = parse_settings({"gradescope": {"leaderboard": True}})
    outs = {s: to_gradescope(r, settings, course) for s, r in inputs.items()}
    for student, out in outs.items():
        assert_gradescope_fields(out, inputs[student])
    # a CUDA check not graded is left out (no status would read as passed) and named in the output
    assert [t["number"] for t in outs["zoe"]["tests"]] == ["1.1", "1.2", "2.1"]
    assert "Not graded here (needs a CUDA device): scan: scan bandwidth on CUDA." in outs["zoe"]["output"]
    assert [t["number"] for t in outs["yves"]["tests"]] == ["1.1", "1.2", "1.3", "2.1"]
    # hidden checks are withheld until published: the visible headline holds no total
    assert not any("Score:" in out["output"] for out in outs.values())
    assert_snapshot("gradescope.json", outs)


# --------------------------------------------------------------------------------------------------
# PrairieLearn: prairielearn.readthedocs.io, "External grading", grading results


def assert_prairielearn_fields(out: dict) -> None:
    assert set(out) <= {"gradable", "score", "format_errors", "message", "output", "images", "tests"}, set(out)
    assert isinstance(out["gradable"], bool)
    assert len(json.dumps(out)) < 1_000_000
    if not out["gradable"]:
        assert "score" not in out, "an ungradable result charges no attempt: no score"
        assert out["format_errors"] and all(isinstance(e, str) and e for e in out["format_errors"])
        return
    assert isinstance(out["score"], float) and 0 <= out["score"] <= 1
    assert isinstance(out["message"], str) and isinstance(out["output"], str)
    for test in out["tests"]:
        assert set(test) <= {"name", "description", "points", "max_points", "message", "output", "images"}, set(test)
        assert re.fullmatch(r"\w+: \w+", test["name"]), test["name"]  # exercise: check
        assert isinstance(test["description"], str) and isinstance(test["message"], str) and isinstance(test["output"], str)
        assert isinstance(test["points"], float) and isinstance(test["max_points"], float)
        assert 0 <= test["points"] <= test["max_points"]
        for image in test.get("images", []):
            assert set(image) <= {"url", "label"} and image["url"].startswith("data:image/png;base64,")
    points, possible = sum(t["points"] for t in out["tests"]), sum(t["max_points"] for t in out["tests"])
    assert out["score"] == pytest.approx(points / possible, abs=1e-6), "score = points / points possible"


def without_image_bytes(out: dict) -> dict:
    """The PNGs' bytes depend on matplotlib's version: each is checked to decode, then pinned by its label only."""
    for test in out.get("tests", []):
        for image in test.get("images", []):
            data = base64.b64decode(image["url"].split(",", 1)[1])
            assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000
            image["url"] = "data:image/png;base64,(PNG bytes)"
    return out


def test_prairielearn_snapshot(inputs):
    outs = {s: to_prairielearn(r) for s, r in inputs.items()}
    for out in outs.values():
        assert_prairielearn_fields(out)
    assert outs["xena"]["gradable"] is False and outs["zoe"]["score"] == pytest.approx(6 / 13, abs=1e-6)
    assert [len(t.get("images", [])) for t in outs["yves"]["tests"]] == [0, 0, 1, 0], "the speed check's plot"
    assert_snapshot("prairielearn.json", {s: without_image_bytes(out) for s, out in outs.items()})


# --------------------------------------------------------------------------------------------------
# the CSV gradebook (grader/export/README.md, "The CSV gradebook")


def test_csv_snapshot(course, inputs):
    warnings: list[str] = []
    text = to_csv(loaded(inputs), course, DUE, TIMES, checks=True, warnings=warnings)
    assert warnings == ["no submission time for 'xena' in the submission times: its 'late' is empty"]
    rows = list(csv.reader(io.StringIO(text)))
    checks = [f"{e.id}/{c.id}" for e in course.exercises for c in e.checks]
    assert rows[0] == FIXED_BEFORE + [e.id for e in course.exercises] + FIXED_AFTER + checks
    assert rows[0][:2] == ["student", "submission"] and FIXED_AFTER == [
        "total", "max_score", "gradable_max_score", "ungradable", "incomplete", "late", "seed", "graded_at"]
    for row in csv.DictReader(io.StringIO(text)):
        cents = [round(float(row[e.id]) * 100) for e in course.exercises if row[e.id] != ""]
        assert all(re.fullmatch(r"\d+(\.\d{1,2})?", row[e.id]) for e in course.exercises if row[e.id] != "")
        assert sum(cents) == round(float(row["total"]) * 100), "the exercise cells add up to the total"
        assert float(row["max_score"]) == 15 and float(row["gradable_max_score"]) <= 15
        assert row["ungradable"] in ("yes", "no") and row["incomplete"] in ("yes", "no") and row["late"] in ("yes", "no", "")
        assert int(row["seed"]) == 99 and row["graded_at"] == FINISHED
        assert all(row[c] == "" or float(row[c]) >= 0 for c in checks)
    late = {row["student"]: row["late"] for row in csv.DictReader(io.StringIO(text))}
    assert late == {"xena": "", "yves": "yes", "zoe": "no"}  # yves's scan came after the due date
    assert_snapshot("csv_gradebook.csv", text)


# --------------------------------------------------------------------------------------------------
# nbgrader's gradebook (grader/export/nbgrader_gradebook.py), read back through nbgrader's API


def gradebook_rows(db: str) -> dict[str, list]:
    api = pytest.importorskip("nbgrader.api")

    def when(value):
        return value.isoformat() if value is not None else None

    with api.Gradebook(db) as gb:
        return {
            "assignments": [{"name": a.name, "duedate": when(a.duedate), "max_score": a.max_score,
                             "notebooks": [n.name for n in a.notebooks]} for a in sorted(gb.assignments, key=lambda a: a.name)],
            "grade_cells": sorted(({"assignment": c.notebook.assignment.name, "notebook": c.notebook.name, "name": c.name,
                                    "max_score": c.max_score, "cell_type": c.cell_type}
                                   for c in gb.db.query(api.GradeCell)), key=lambda c: (c["assignment"], c["name"])),
            "students": [s.id for s in gb.students],
            "submissions": sorted(({"assignment": s.assignment.name, "student": s.student.id, "timestamp": when(s.timestamp),
                                    "score": s.score, "max_score": s.max_score, "total_seconds_late": s.total_seconds_late,
                                    "needs_manual_grade": s.needs_manual_grade}
                                   for s in gb.db.query(api.SubmittedAssignment)), key=lambda s: (s["assignment"], s["student"])),
            "grades": sorted(({"assignment": g.assignment.name, "student": g.student.id, "name": g.name,
                               "auto_score": g.auto_score, "manual_score": g.manual_score, "score": g.score,
                               "max_score": g.max_score, "needs_manual_grade": g.needs_manual_grade}
                              for g in gb.db.query(api.Grade)), key=lambda g: (g["assignment"], g["student"], g["name"])),
        }


def test_nbgrader_gradebook_snapshot(course, inputs, tmp_path, monkeypatch):
    pytest.importorskip("nbgrader.api", reason="nbgrader is an optional extra: pip install '.[nbgrader]'")
    from grader.export.nbgrader_gradebook import to_nbgrader

    db = f"sqlite:///{tmp_path / 'gradebook.db'}"
    notes: list[str] = []
    summary = to_nbgrader(loaded(inputs), db, course, submitted=TIMES, due=DUE, warnings=notes)
    assert (summary.students, summary.assignments, summary.grades, summary.not_graded, summary.skipped) == (3, 2, 10, 2, 0), (
        "12 cells: zoe's and xena's CUDA speed checks are not graded on their CPU hosts, the other 10 written")
    rows = gradebook_rows(db)
    assert [a["name"] for a in rows["assignments"]] == ["scan", "sort"] and all(a["notebooks"] == [a["name"]] for a in rows["assignments"])
    for grade in rows["grades"]:
        assert grade["needs_manual_grade"] is False, "formgrader cannot open a notebook this export never wrote"
        assert grade["manual_score"] is None and (grade["auto_score"] is None or 0 <= grade["auto_score"] <= grade["max_score"])
    for sub in rows["submissions"]:
        mine = [g["score"] for g in rows["grades"] if (g["assignment"], g["student"]) == (sub["assignment"], sub["student"])]
        assert sub["score"] == pytest.approx(sum(mine)) and sub["needs_manual_grade"] is False
        result = inputs[sub["student"]]
        assert sub["score"] == pytest.approx(next(e["score"] for e in result["exercises"] if e["id"] == sub["assignment"]))
    assert_snapshot("nbgrader_gradebook.json", rows)


# --------------------------------------------------------------------------------------------------
# feedback pages


def test_feedback_page_snapshot(course, inputs):
    page = render_feedback(inputs["zoe"], course, plots=False)
    assert_snapshot("feedback_zoe.html", page[page.index("<body>"):])


def test_nbgrader_feedback_pages_snapshot(course, inputs, tmp_path):
    """One page per nbgrader assignment, holding that exercise alone."""
    from grader.export.nbgrader_feedback import write_nbgrader_feedback

    for student in ("yves", "zoe"):
        for exercise in ("scan", "sort"):
            folder = tmp_path / "submitted" / student / exercise
            folder.mkdir(parents=True)
            (folder / "timestamp.txt").write_text("2026-11-30 09:00:00.000000 UTC")
            (folder / "submission_secret.txt").write_text("s" * 128)
    report = write_nbgrader_feedback([Loaded("zoe", Path("zoe.json"), inputs["zoe"])], tmp_path, course, plots=False)
    assert report.warnings == [] and [p.relative_to(tmp_path).as_posix() for p in report.written] == [
        "feedback/zoe/scan/scan.html", "feedback/zoe/sort/sort.html"]
    pages = {p.parent.name: p.read_text() for p in report.written}
    assert_snapshot("nbgrader_feedback_zoe_scan.html", pages["scan"][pages["scan"].index("<body>"):])
    assert 'data-exercise="sort"' in pages["sort"] and 'data-exercise="scan"' not in pages["sort"]
    assert 'data-score="0" data-max="5"' in pages["sort"]
