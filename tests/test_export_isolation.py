"""One student's bad material fails that student, never the class (grader/export/isolate.py).

Fault injection, not listed cases: each step of the exports (the CSV row, Gradescope's and PrairieLearn's
results.json, the nbgrader gradebook's rows, the feedback pages, nbgrader's feedback pages, a row of the times
CSV, a timestamp.txt) has the reader or renderer it uses replaced so that bob's material raises `Unforeseen`,
an exception type no code of the grader names. Every other student must come out exactly as in a run without
the fault, bob must be named (student and file) as an internal error of the grader, and the command must exit
3 ("finished, some students need attention"). Beside them, real timestamps in formats nobody expected: each
costs bob's late flag alone, named as his malformed file, never an internal error.
"""

from __future__ import annotations

import csv
import functools
import json
import os
import sys
from pathlib import Path

import pytest

from grader import exitcodes
from grader.export import csv_gradebook, feedback, gradescope, nbgrader_feedback, prairielearn, times
from tests.test_export import cli, make_result, write

STUDENTS = ("alice", "bob", "carol")
DUE = "2026-12-01T00:00:00+00:00"
GOOD_TIMES = {"alice": "2026-11-30 10:00:00 UTC", "bob": "2026-11-30 11:00:00 UTC", "carol": "2026-12-02 09:00:00 UTC"}
PARTIAL = exitcodes.NEEDS_ATTENTION  # some students' material could not be used
GRADER_FAILED = exitcodes.GRADER_FAILED  # the grader failed on some student: the others are exported all the same


class Unforeseen(Exception):
    """Raised by a replaced reader or renderer for bob's material; nothing in grader/ names it."""


def _is_bob(value) -> bool:
    """Whether a reader's or renderer's argument is bob's material (a result, a Loaded, a path, a time)."""
    if isinstance(value, dict):
        return value.get("submission", {}).get("id") == "bob"
    if hasattr(value, "student"):
        return value.student == "bob"
    return "bob" in str(value) or str(value).strip() in (GOOD_TIMES["bob"], GOOD_TIMES["bob"].replace(" UTC", "+00:00"))


def faulty(function, arg: int = 0):
    """`function`, except that it raises Unforeseen when its argument number `arg` is bob's."""
    @functools.wraps(function)
    def replaced(*args, **kwargs):
        if _is_bob(args[arg]):
            raise Unforeseen("injected: bob's material broke this step")
        return function(*args, **kwargs)
    return replaced


@pytest.fixture
def results(tmp_path) -> Path:
    folder = tmp_path / "res"
    for student in STUDENTS:
        write(folder, f"{student}.json", make_result(student))
    return folder


def nbgrader_course(root: Path, texts: dict[str, str | bytes] | None = None) -> Path:
    """COURSE/submitted/<student>/online_softmax/ with timestamp.txt (`texts`, default GOOD_TIMES) and a secret."""
    for student, text in (texts or GOOD_TIMES).items():
        folder = root / "submitted" / student / "online_softmax"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "online_softmax.py").write_text("# the student's file\n")
        (folder / "timestamp.txt").write_bytes(text if isinstance(text, bytes) else text.encode())
        (folder / "submission_secret.txt").write_text(f"secret of {student}")
    return root


def times_csv(path: Path, texts: dict[str, str | bytes] | None = None) -> Path:
    lines = [b"student,submitted_at"]
    for student, text in (texts or {s: t.replace(" UTC", "+00:00") for s, t in GOOD_TIMES.items()}).items():
        lines.append(student.encode() + b"," + (text if isinstance(text, bytes) else text.encode()))
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def csv_rows(path: Path) -> dict[str, dict[str, str]]:
    return {row["student"]: row for row in csv.DictReader(path.read_text().splitlines())}


def files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_bob_is_skipped(err: str, file: str) -> None:
    line = next((line for line in err.splitlines() if "skipped" in line and file in line), None)
    assert line is not None and "Unforeseen" in line and "internal error" not in err, \
        f"expected bob's file {file!r} named as skipped, with the exception's type, and no internal error:\n{err}"
    assert "with problems: bob" in err.splitlines()[-1], f"expected the count line last; stderr:\n{err}"


def assert_bob_is_an_internal_error(err: str, file: str, students: str = "bob") -> None:
    assert "internal error of the grader while exporting bob (Unforeseen: injected" in err, \
        f"expected bob's failure named as the grader's own, with its type; stderr:\n{err}"
    line = next(line for line in err.splitlines() if "internal error of the grader while exporting bob" in line)
    assert file in line, f"expected the warning to name bob's file {file!r}: {line}"
    assert f"with problems: {students}" in err.splitlines()[-1], f"expected the count line last; stderr:\n{err}"


# --------------------------------------------------------------------------------------------------
# fault injection: each step's reader or renderer raises for bob


def test_csv_row_fault_costs_bob_his_row_alone(results, tmp_path, monkeypatch, capsys):
    clean, broken = tmp_path / "clean.csv", tmp_path / "broken.csv"
    assert cli("export", str(results), "--format", "csv", "--out", str(clean)) == 0
    assert capsys.readouterr().err.splitlines()[-1] == "3 student(s) exported, 0 with problems"
    monkeypatch.setattr(csv_gradebook, "_row", faulty(csv_gradebook._row))
    assert cli("export", str(results), "--format", "csv", "--out", str(broken)) == GRADER_FAILED
    assert_bob_is_an_internal_error(capsys.readouterr().err, "bob.json")
    expected = csv_rows(clean)
    del expected["bob"]
    assert csv_rows(broken) == expected, "alice's and carol's rows must be those of a run without the fault"


@pytest.mark.parametrize("fmt,module,renderer", [("gradescope", gradescope, "to_gradescope"),
                                                 ("prairielearn", prairielearn, "to_prairielearn")])
def test_results_json_fault_costs_bob_his_file_alone(fmt, module, renderer, results, tmp_path, monkeypatch, capsys):
    assert cli("export", str(results), "--format", fmt, "--out", str(tmp_path / "clean")) == 0
    monkeypatch.setattr(module, renderer, faulty(getattr(module, renderer)))
    assert cli("export", str(results), "--format", fmt, "--out", str(tmp_path / "broken")) == GRADER_FAILED
    err = capsys.readouterr().err
    assert_bob_is_an_internal_error(err, "bob.json")
    assert f"{fmt} results.json for 2 student(s) written" in err
    expected = {name: text for name, text in files(tmp_path / "clean").items() if not name.startswith("bob/")}
    assert files(tmp_path / "broken") == expected


def test_feedback_pages_fault_costs_bob_his_page_alone(results, tmp_path, monkeypatch, capsys):
    assert cli("feedback", str(results), "--out", str(tmp_path / "clean"), "--no-plot") == 0
    monkeypatch.setattr(feedback, "render_feedback", faulty(feedback.render_feedback))
    assert cli("feedback", str(results), "--out", str(tmp_path / "broken"), "--no-plot") == GRADER_FAILED
    assert_bob_is_an_internal_error(capsys.readouterr().err, "bob.json")
    expected = files(tmp_path / "clean")
    del expected["bob.html"]
    assert files(tmp_path / "broken") == expected


def test_one_feedback_page_that_cannot_be_rendered_is_the_graders_error_not_a_crash(results, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(feedback, "render_feedback", faulty(feedback.render_feedback))
    assert cli("feedback", str(results / "bob.json"), "--out", str(tmp_path / "bob.html")) == GRADER_FAILED
    assert_bob_is_an_internal_error(capsys.readouterr().err, "bob.json")
    assert not (tmp_path / "bob.html").exists()


def test_nbgrader_feedback_fault_costs_bob_his_pages_alone(results, tmp_path, monkeypatch, capsys):
    clean, broken = nbgrader_course(tmp_path / "clean"), nbgrader_course(tmp_path / "broken")
    assert cli("feedback", str(results), "--nbgrader", str(clean), "--no-plot") == 0
    monkeypatch.setattr(nbgrader_feedback, "render_feedback", faulty(nbgrader_feedback.render_feedback))
    assert cli("feedback", str(results), "--nbgrader", str(broken), "--no-plot") == GRADER_FAILED
    assert_bob_is_an_internal_error(capsys.readouterr().err, "bob.json")
    expected = {name: text for name, text in files(clean / "feedback").items() if not name.startswith("bob/")}
    assert files(broken / "feedback") == expected, "no half-written folder for bob, the others' pages unchanged"


@pytest.mark.parametrize("source, reader, where", [
    ("csv", "parse_csv_time", "times.csv, line 3"),
    ("nbgrader", "read_small_file", "submitted/bob/online_softmax/timestamp.txt"),
])
def test_a_submission_time_fault_costs_bob_his_late_flag_alone(source, reader, where, results, tmp_path, monkeypatch,
                                                               capsys):
    given = times_csv(tmp_path / "times.csv") if source == "csv" else nbgrader_course(tmp_path / "course") / "submitted"
    clean, broken = tmp_path / "clean.csv", tmp_path / "broken.csv"
    assert cli("export", str(results), "--format", "csv", "--out", str(clean), "--due", DUE,
               "--submitted-times", str(given)) == 0
    monkeypatch.setattr(times, reader, faulty(getattr(times, reader)))
    assert cli("export", str(results), "--format", "csv", "--out", str(broken), "--due", DUE,
               "--submitted-times", str(given)) == PARTIAL
    assert_bob_is_skipped(capsys.readouterr().err, where)
    expected = csv_rows(clean)
    assert expected["bob"]["late"] == "no", "the test needs bob's flag to be known without the fault"
    expected["bob"]["late"] = ""
    assert csv_rows(broken) == expected


def test_a_student_folder_that_cannot_be_listed_costs_that_student_alone(results, tmp_path, monkeypatch, capsys):
    from grader.scale import discover

    submitted = nbgrader_course(tmp_path / "course") / "submitted"
    monkeypatch.setattr(discover, "submission_id", faulty(discover.submission_id))
    assert cli("export", str(results), "--format", "csv", "--out", str(tmp_path / "g.csv"), "--due", DUE,
               "--submitted-times", str(submitted)) == GRADER_FAILED
    assert_bob_is_an_internal_error(capsys.readouterr().err, "submitted/bob")
    late = {s: row["late"] for s, row in csv_rows(tmp_path / "g.csv").items()}
    assert late == {"alice": "no", "bob": "", "carol": "yes"}


# --------------------------------------------------------------------------------------------------
# the nbgrader gradebook


@pytest.fixture
def nbgrader_api(monkeypatch):
    api = pytest.importorskip("nbgrader.api", reason="nbgrader is an optional extra: pip install '.[nbgrader]'")
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.setattr(api, "get_alembic_version", _alembic_head(api))  # asked once, not per Gradebook
    return api


@functools.cache
def _alembic_head(api):
    version = api.get_alembic_version()
    return lambda: version


def gradebook_rows(api, db: Path) -> list[tuple]:
    """(student, assignment, cell, auto_score, submission time) of every grade."""
    with api.Gradebook(f"sqlite:///{db}") as gb:
        return sorted((g.student.id, g.assignment.name, g.name, g.auto_score, str(g.notebook.assignment.timestamp))
                      for g in gb.db.query(api.Grade))


@pytest.mark.parametrize("step,arg,note", [("_plan_student", 0, None),  # (item, ...)
                                           ("_write_student", 2, "may hold part of this export's rows")])  # (api, gb, student, ...)
def test_nbgrader_gradebook_fault_costs_bob_his_rows_alone(step, arg, note, nbgrader_api, results, tmp_path, monkeypatch,
                                                          capsys):
    from grader.export import nbgrader_gradebook

    submitted = nbgrader_course(tmp_path / "course") / "submitted"
    args = ["--format", "nbgrader", "--due", DUE, "--submitted-times", str(submitted)]
    assert cli("export", str(results), *args, "--out", str(tmp_path / "clean.db")) == 0
    monkeypatch.setattr(nbgrader_gradebook, step, faulty(getattr(nbgrader_gradebook, step), arg))
    assert cli("export", str(results), *args, "--out", str(tmp_path / "broken.db")) == GRADER_FAILED
    err = capsys.readouterr().err
    assert_bob_is_an_internal_error(err, "bob.json")
    assert "2 student(s), 1 assignment(s)" in err
    if note:
        assert note in err, "a failure once nbgrader's API has committed some rows must say so"
    expected = [row for row in gradebook_rows(nbgrader_api, tmp_path / "clean.db") if row[0] != "bob"]
    assert gradebook_rows(nbgrader_api, tmp_path / "broken.db") == expected
    assert {row[0] for row in expected} == {"alice", "carol"}


def test_nbgrader_gradebook_with_a_malformed_timestamp_writes_bob_without_a_time(nbgrader_api, results, tmp_path,
                                                                                 capsys):
    texts = {**GOOD_TIMES, "bob": b"\xff\xfe2026-12-01 \xc3"}
    submitted = nbgrader_course(tmp_path / "course", texts) / "submitted"
    db = tmp_path / "g.db"
    assert cli("export", str(results), "--format", "nbgrader", "--due", DUE, "--submitted-times", str(submitted),
               "--out", str(db)) == PARTIAL
    err = capsys.readouterr().err
    assert "skipped " in err and "submitted/bob/online_softmax/timestamp.txt" in err and "internal error" not in err
    assert "bob: online_softmax written without a submission time (it could not be read)" in err
    with nbgrader_api.Gradebook(f"sqlite:///{db}") as gb:
        assert gb.find_submission("online_softmax", "bob").timestamp is None
        assert gb.find_submission("online_softmax", "carol").total_seconds_late > 0
        assert gb.find_submission("online_softmax", "alice").total_seconds_late == 0


# --------------------------------------------------------------------------------------------------
# real malformed times: formats nobody expected


UNEXPECTED = {
    "words": "yesterday",
    "out_of_range": "2026-13-45 99:99",
    "epoch_seconds": "1733600000",
    "offset_over_a_day": "2026-12-01T23:59:00+25:00",
    "nul": "\x00",
    "10_kb_line": "2026-12-01 " + "9" * 10240,
    "not_utf8": b"\xff\xfe2026-12-01\xc3\x28",
    "ambiguous_zone": "2026-12-01 23:59:00 CEST",
}


@pytest.mark.parametrize("source", ["csv", "nbgrader"])
@pytest.mark.parametrize("text", UNEXPECTED.values(), ids=UNEXPECTED.keys())
def test_an_unexpected_time_costs_that_students_late_flag_alone(source, text, results, tmp_path, capsys):
    if source == "csv":
        given = times_csv(tmp_path / "times.csv", {"alice": "2026-11-30T10:00:00+00:00", "bob": text,
                                                   "carol": "2026-12-02T09:00:00+00:00"})
        where = "times.csv, line 3"
    else:
        given = nbgrader_course(tmp_path / "course", {**GOOD_TIMES, "bob": text}) / "submitted"
        where = "submitted/bob/online_softmax/timestamp.txt"
    out = tmp_path / "grades.csv"
    assert cli("export", str(results), "--format", "csv", "--out", str(out), "--due", DUE,
               "--submitted-times", str(given)) == PARTIAL
    err = capsys.readouterr().err
    late = {s: row["late"] for s, row in csv_rows(out).items()}
    assert late == {"alice": "no", "bob": "", "carol": "yes"}, "only bob's late flag may be lost"
    bad = [line for line in err.splitlines() if where in line]
    assert bad and bad[0].startswith(f"warning: skipped {tmp_path}"), f"expected bob's file named as skipped: {err}"
    assert "bob" in bad[0] and "internal error" not in err, "a student's malformed file is not the grader's error"
    assert max(map(len, err.splitlines())) < 1200, "a 10 KB line is quoted short"
    assert "\x00" not in err
    assert err.splitlines()[-1] == "3 student(s) exported, 1 with problems: bob"


# --------------------------------------------------------------------------------------------------
# what still stops the whole export: bad input to it, exit 2


def test_bad_input_to_the_whole_export_still_exits_2(results, tmp_path, capsys):
    assert cli("export", str(tmp_path / "nowhere"), "--format", "csv") == 2
    assert cli("export", str(results), "--format", "csv", "--due", "next friday") == 2
    assert "--due: expected an ISO 8601 time" in capsys.readouterr().err
    headerless = write(tmp_path, "times.csv", "alice,2026-11-30T10:00:00+00:00\n")
    assert cli("export", str(results), "--format", "csv", "--due", DUE, "--submitted-times", str(headerless)) == 2
    assert "expected columns 'student' and 'submitted_at'" in capsys.readouterr().err
    empty = tmp_path / "course" / "submitted"
    empty.mkdir(parents=True)
    assert cli("export", str(results), "--format", "csv", "--due", DUE, "--submitted-times", str(empty)) == 2


def test_a_malformed_result_file_is_skipped_not_an_internal_error(results, capsys):
    write(results, "dave.json", json.dumps({"schema": "llm-efficiency-lab/result/v1", "course": 3}))
    assert cli("export", str(results), "--format", "csv") == PARTIAL
    err = capsys.readouterr().err
    assert "warning: skipped dave.json: does not match the result schema" in err and "internal error" not in err
    assert err.splitlines()[-1] == "3 student(s) exported, 1 with problems: dave"
