"""nbgrader's whole loop: the gradebook's scores (the CUDA checks as autograded scores, never
`needs_manual_grade`), lateness from nbgrader's own timestamp.txt, feedback pages where release_feedback takes
them, and `grader batch` on nbgrader's submitted/<student>/<assignment>/ layout.

The last test runs nbgrader's own exchange (release_assignment, fetch_assignment, submit, collect,
release_feedback, fetch_feedback, in-process through nbgrader's classes) around a real batch grade.
Needs the nbgrader extra: pip install '.[nbgrader]'.
"""

from __future__ import annotations

import copy
import functools
import csv
import datetime as dt
import os
import re
import sys
from pathlib import Path

import pytest

from grader import results as R
from grader.export.load import ExportError, Loaded, load_results
from grader.export.nbgrader_gradebook import to_nbgrader
from grader.export.times import SubmissionTimes, parse_nbgrader_time, read_nbgrader_timestamps, read_submission_times
from tests.conftest import COURSE, ROOT
from tests.test_export import ALICE, NORMALIZER, cli, make_result, write

api = pytest.importorskip("nbgrader.api", reason="nbgrader is an optional extra: pip install '.[nbgrader]'")

UTC = dt.timezone.utc
EXERCISE = "online_softmax"


_ALEMBIC_HEAD = functools.cache(api.get_alembic_version)


@pytest.fixture(autouse=True)
def _alembic_once(monkeypatch):
    """nbgrader's Gradebook runs the `alembic` command each time it opens (a second or more here): ask it once.
    The export puts this venv's scripts on PATH for it; nbgrader's exchange does not, so the tests do."""
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.setattr(api, "get_alembic_version", _ALEMBIC_HEAD)


def gpu_only(result: dict, checks: tuple[str, ...] = ("triton_speed",)) -> dict:
    """`result` as a GPU run with `--check triton_speed` grades it: that check graded, the others not run."""
    r = copy.deepcopy(result)
    for ex in r["exercises"]:
        for check in ex["checks"]:
            if check["id"] not in checks:
                check.update(status="not_graded", points=0.0, tests=[], message="not run: only some checks were selected")
    R.update_totals(r)
    R.validate(r)
    return r


def every_grade(db: str, scores: dict | None = None) -> list[tuple[str, str, str, float | None, bool]]:
    """(student, assignment, grade cell, auto_score, needs_manual_grade) of every grade; `scores` (when
    given) gets each submission's score, read in the same session (each one runs nbgrader's alembic check)."""
    with api.Gradebook(db) as gb:
        if scores is not None:
            scores.update({(s.assignment.name, s.student.id): s.score for s in gb.db.query(api.SubmittedAssignment)})
        return sorted((g.student.id, g.assignment.name, g.name, g.auto_score, g.needs_manual_grade)
                      for g in gb.db.query(api.Grade))


# --------------------------------------------------------------------------------------------------
# the CUDA checks' scores


def test_no_grade_needs_manual_grading_and_cuda_scores_land_as_autograded_in_either_order(tmp_path):
    """A CPU grade leaves the CUDA check without a score (not `needs_manual_grade`: formgrader cannot open a
    submission notebook this export never wrote); the GPU run's score lands as an auto_score, whether its
    results are exported before or after the CPU grade's, and the CPU grade's scores stay."""
    cpu, gpu = make_result("alice"), gpu_only(make_result("alice", speed=True))
    for order in ((cpu, gpu), (gpu, cpu)):
        db = f"sqlite:///{tmp_path / f'{len(list(tmp_path.iterdir()))}.db'}"
        summaries = [to_nbgrader([Loaded("alice", Path("alice.json"), r)], db, COURSE) for r in order]
        submissions: dict = {}
        grades = every_grade(db, submissions)
        assert not [g for g in grades if g[4]], "no grade may need manual grading"
        scores = {(a, name): score for _, a, name, score, _ in grades}
        assert scores[EXERCISE, "triton_speed"] == 8.0 and scores[EXERCISE, "merge_public"] == 2.5
        assert scores[EXERCISE, "normalizer"] == NORMALIZER.points
        assert submissions[EXERCISE, "alice"] == ALICE + 8.0
        assert sum(s.kept for s in summaries) > 0  # the second export kept the first one's other scores
    db = f"sqlite:///{tmp_path / 'cpu.db'}"
    cpu_only = to_nbgrader([Loaded("bob", Path("bob.json"), make_result("bob"))], db, COURSE)
    assert (cpu_only.not_graded, cpu_only.kept) == (1, 0)
    assert ("bob", EXERCISE, "triton_speed", None, False) in every_grade(db)


def test_a_resubmission_clears_the_cuda_score_of_the_earlier_submission(tmp_path):
    db = f"sqlite:///{tmp_path / 'gradebook.db'}"
    first = SubmissionTimes(exercises={("alice", EXERCISE): dt.datetime(2026, 11, 30, tzinfo=UTC)})
    later = SubmissionTimes(exercises={("alice", EXERCISE): dt.datetime(2026, 12, 1, tzinfo=UTC)})
    to_nbgrader([Loaded("alice", Path("a.json"), make_result("alice", speed=True))], db, COURSE, submitted=first)
    same: list[str] = []
    to_nbgrader([Loaded("alice", Path("a.json"), make_result("alice"))], db, COURSE, submitted=first, warnings=same)
    assert not same and ("alice", EXERCISE, "triton_speed", 8.0, False) in every_grade(db)
    notes: list[str] = []
    summary = to_nbgrader([Loaded("alice", Path("a.json"), make_result("alice"))], db, COURSE, submitted=later,
                          warnings=notes)
    assert ("alice", EXERCISE, "triton_speed", None, False) in every_grade(db) and summary.not_graded == 1
    assert notes == [f"alice: {EXERCISE}/triton_speed had 8 from an earlier export, for an earlier submission; this "
                     "result did not grade it (needs CUDA, or not selected): cleared, export a grade of it for the new one"]


def test_a_failure_of_the_grading_machine_writes_no_zero(tmp_path):
    db = f"sqlite:///{tmp_path / 'gradebook.db'}"
    to_nbgrader([Loaded("alice", Path("a.json"), make_result("alice"))], db, COURSE)
    failed = make_result("alice")
    R.grader_failure(failed, EXERCISE, "the grader's test process for online_softmax stopped: killed by SIGKILL")
    R.validate(failed)
    notes: list[str] = []
    summary = to_nbgrader([Loaded("alice", Path("a.json"), failed)], db, COURSE, warnings=notes)
    assert summary.skipped == 1 and notes[0].startswith(f"alice: {EXERCISE} not written (the grading machine failed on it")
    with api.Gradebook(db) as gb:
        assert gb.find_submission(EXERCISE, "alice").score == ALICE, "the earlier grade stays; no zero"
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    to_nbgrader([Loaded("alice", Path("a.json"), failed)], fresh, COURSE)
    with api.Gradebook(fresh) as gb, pytest.raises(api.MissingEntry):
        gb.find_submission(EXERCISE, "alice")


def test_only_exercises_someone_submitted_become_assignments_though_a_batch_result_lists_all(tmp_path):
    """`grader batch` (no --exercise) lists every exercise, those not submitted as "missing": they would be
    assignments reading 0.0 for everyone. An unreadable submission (no hash) names none either."""
    every = tuple(e.id for e in COURSE.exercises)
    alice = make_result("alice", exercises=every)  # online_softmax graded, the others missing
    for ex in alice["exercises"][1:]:
        ex["status"] = "missing"
        R.close_exercise(alice, ex["id"], f"not submitted: expected a file named {ex['id']}.py")
    assert [ex["status"] for ex in alice["exercises"]] == ["graded"] + ["missing"] * (len(every) - 1)
    unreadable = make_result("carol", gradable=False, exercises=every)
    unreadable["submission"]["sha256"] = ""
    db = f"sqlite:///{tmp_path / 'gradebook.db'}"
    summary = to_nbgrader([Loaded("alice", Path("a.json"), alice), Loaded("carol", Path("c.json"), unreadable)], db, COURSE)
    assert summary.assignments == 1
    with api.Gradebook(db) as gb:
        assert [a.name for a in gb.assignments] == [EXERCISE]
        assert gb.find_submission(EXERCISE, "carol").score == 0  # an assignment's unreadable submission: 0


# --------------------------------------------------------------------------------------------------
# lateness: nbgrader's timestamp.txt


@pytest.mark.parametrize("text,expected", [
    ("2026-12-01 23:59:00.123456 UTC", dt.datetime(2026, 12, 1, 23, 59, 0, 123456, tzinfo=UTC)),
    ("2026-12-01 23:59:00.5 CET\n", dt.datetime(2026, 12, 1, 22, 59, 0, 500000, tzinfo=UTC)),
    ("2026-12-01 23:59:00 America/New_York", dt.datetime(2026, 12, 2, 4, 59, tzinfo=UTC)),
    ("2026-12-01T23:59:00+01:00", dt.datetime(2026, 12, 1, 22, 59, tzinfo=UTC)),
    ("2026-12-01 23:59:00", dt.datetime(2026, 12, 1, 23, 59, tzinfo=UTC)),
])
def test_timestamps_read_as_nbgrader_reads_them(text, expected):
    from nbgrader.utils import parse_utc

    assert parse_nbgrader_time(text) == expected
    assert parse_utc(text.strip()) == expected.replace(tzinfo=None), "nbgrader's own reading (naive UTC)"


def nbgrader_tree(root: Path, times: dict[tuple[str, str], str]) -> Path:
    submitted = root / "submitted"
    for (student, assignment), text in times.items():
        folder = submitted / student / assignment
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{assignment}.py").write_text("# the student's file\n")
        if text is not None:
            (folder / "timestamp.txt").write_text(text)
    return submitted


def test_timestamp_files_give_each_assignment_its_time_and_each_csv_row_the_latest(tmp_path, capsys):
    submitted = nbgrader_tree(tmp_path, {("alice", EXERCISE): "2026-11-30 10:00:00.000001 UTC",
                                         ("alice", "paged_kv"): "2026-12-02 09:00:00 UTC",
                                         ("bob", EXERCISE): "2026-12-01 01:00:00 UTC",
                                         ("erin", EXERCISE): "2026-11-30 12:00:00 UTC",
                                         ("carol", EXERCISE): None, ("dave", EXERCISE): ""})
    (submitted / "bob" / "notes").mkdir()
    (submitted / "bob" / "notes" / "timestamp.txt").symlink_to("/etc/passwd")  # never followed
    times = read_submission_times(submitted)
    assert dict(times.exercises) == {("alice", EXERCISE): dt.datetime(2026, 11, 30, 10, 0, 0, 1, tzinfo=UTC),
                                     ("alice", "paged_kv"): dt.datetime(2026, 12, 2, 9, tzinfo=UTC),
                                     ("bob", EXERCISE): dt.datetime(2026, 12, 1, 1, tzinfo=UTC),
                                     ("erin", EXERCISE): dt.datetime(2026, 11, 30, 12, tzinfo=UTC)}
    assert times.when("alice", [EXERCISE, "paged_kv"]) == dt.datetime(2026, 12, 2, 9, tzinfo=UTC)
    assert times.when("alice", [EXERCISE]) == dt.datetime(2026, 11, 30, 10, 0, 0, 1, tzinfo=UTC)

    res = tmp_path / "res"
    for student in ("alice", "bob", "carol", "erin"):
        write(res, f"{student}.json", make_result(student))  # online_softmax and paged_kv (missing)
    out = tmp_path / "grades.csv"
    # carol's late is left empty for want of a time: the export finishes, and says she needs attention (3)
    assert cli("export", str(res), "--format", "csv", "--out", str(out), "--due", "2026-12-01T00:00:00+00:00",
               "--submitted-times", str(submitted)) == 3
    late = {row["student"]: row["late"] for row in csv.DictReader(out.read_text().splitlines())}
    assert late == {"alice": "yes", "bob": "yes", "carol": "", "erin": "no"}  # alice's paged_kv came late
    err = capsys.readouterr().err
    assert "no submission time for 'carol'" in err and "4 student(s) exported, 1 with problems: carol" in err

    db = tmp_path / "gradebook.db"
    assert cli("export", str(res), "--format", "nbgrader", "--out", str(db), "--due", "2026-12-01T00:00:00+00:00",
               "--submitted-times", str(submitted)) == 3
    assert f"carol: {EXERCISE} written without a submission time (none in the submission times)" in capsys.readouterr().err
    with api.Gradebook(f"sqlite:///{db}") as gb:
        assert gb.find_assignment(EXERCISE).duedate == dt.datetime(2026, 12, 1)
        assert gb.find_submission(EXERCISE, "alice").total_seconds_late == 0  # its own time, not the row's
        assert gb.find_submission(EXERCISE, "bob").total_seconds_late == 3600
        assert gb.find_submission(EXERCISE, "carol").timestamp is None


def test_a_bad_timestamp_file_costs_that_students_time_alone_and_is_named(tmp_path):
    """It used to stop the whole read (ExportError): one student's file is the student's, not the class's."""
    submitted = nbgrader_tree(tmp_path, {("alice", EXERCISE): "yesterday at noon",
                                         ("bob", EXERCISE): "2026-12-01 23:59:00 UTC"})
    times = read_nbgrader_timestamps(submitted)
    assert dict(times.exercises) == {("bob", EXERCISE): dt.datetime(2026, 12, 1, 23, 59, tzinfo=UTC)}
    assert list(times.unknown) == [("alice", EXERCISE)]
    assert re.search(r"skipped .*submitted/alice/online_softmax/timestamp.txt: .*expected a time as nbgrader submit "
                     r"writes it .* found 'yesterday at noon'", times.unknown["alice", EXERCISE])
    with pytest.raises(ValueError, match=r"unknown time zone 'CEST' \(an abbreviation"):
        parse_nbgrader_time("2026-12-01 23:59:00 CEST")
    empty = tmp_path / "empty" / "submitted"
    empty.mkdir(parents=True)
    with pytest.raises(ExportError, match="expected nbgrader's submitted/<student>/<assignment>/timestamp.txt"):
        read_nbgrader_timestamps(empty)  # no time at all: that is the whole source, not one student


# --------------------------------------------------------------------------------------------------
# the whole loop, through nbgrader's own exchange


def _exchange(kind, course: Path, exchange: Path, assignment: str, student: str | None = None, home: Path | None = None):
    from nbgrader.auth import Authenticator
    from nbgrader.coursedir import CourseDirectory

    coursedir = CourseDirectory(root=str(course), course_id="lab", assignment_id=assignment,
                                **({"student_id": student} if student else {}))
    extra = {"cache": str(home / "cache"), "assignment_dir": str(home)} if home else {}
    kind(coursedir=coursedir, authenticator=Authenticator(), root=str(exchange), **extra).start()


def test_batch_grades_nbgrader_submissions_and_the_feedback_reaches_the_student(tmp_path, monkeypatch):
    """nbgrader releases the assignment, two students fetch and submit it (alice the reference, bob the stub),
    nbgrader collects; `grader batch` grades submitted/, the export writes the gradebook with the times of
    timestamp.txt, `grader feedback --nbgrader` writes the pages, and nbgrader's release_feedback and the
    students' fetch_feedback deliver them."""
    import nbformat
    from nbgrader.exchange.default import (ExchangeCollect, ExchangeFetchAssignment, ExchangeFetchFeedback,
                                           ExchangeReleaseAssignment, ExchangeReleaseFeedback, ExchangeSubmit)

    from grader.options import GradeOptions
    from grader.scale.batch import BatchOptions, run_batch

    course, exchange = tmp_path / "course", tmp_path / "exchange"
    exchange.mkdir()
    release = course / "release" / EXERCISE
    release.mkdir(parents=True)
    nbformat.write(nbformat.v4.new_notebook(), release / f"{EXERCISE}.ipynb")
    stub = (ROOT / "exercises" / EXERCISE / f"{EXERCISE}.py").read_text()
    (release / f"{EXERCISE}.py").write_text(stub)
    _exchange(ExchangeReleaseAssignment, course, exchange, EXERCISE)
    homes = {}
    for student, source in (("alice", ROOT / "solutions" / EXERCISE / f"{EXERCISE}.py"), ("bob", None)):
        homes[student] = home = tmp_path / student
        home.mkdir()
        monkeypatch.chdir(home)
        _exchange(ExchangeFetchAssignment, course, exchange, EXERCISE, student, home)
        if source is not None:
            (home / EXERCISE / f"{EXERCISE}.py").write_text(source.read_text())
        _exchange(ExchangeSubmit, course, exchange, EXERCISE, student, home)
    monkeypatch.chdir(tmp_path)
    _exchange(ExchangeCollect, course, exchange, EXERCISE)
    submitted = course / "submitted"
    assert sorted(p.name for p in (submitted / "alice" / EXERCISE).iterdir()) == [
        f"{EXERCISE}.ipynb", f"{EXERCISE}.py", "submission_secret.txt", "timestamp.txt"]

    out = tmp_path / "results"
    grade = GradeOptions(exercises=[EXERCISE], seed=1234, tests="public", call_timeout_s=20, time_limit_s=120)
    from io import StringIO

    from rich.console import Console

    report = run_batch(COURSE, ROOT, BatchOptions(submitted, out, jobs=1, grade=grade),
                       console=Console(file=StringIO(), width=200))
    assert sorted(report.ids) == ["alice", "bob"] and not report.internal_errors
    scores = {item.student: item.result["score"] for item in load_results(out)[0]}
    public = sum(c.points for c in COURSE.exercise(EXERCISE).checks if c.visibility == "public" and not c.cuda)
    assert scores == {"alice": public, "bob": 0}, scores

    db = course / "gradebook.db"  # where nbgrader collect made it: one gradebook for nbgrader and the grader
    assert cli("export", str(out), "--format", "nbgrader", "--out", str(db), "--course-id", "lab",
               "--submitted-times", str(submitted)) == 0
    stamp = (submitted / "alice" / EXERCISE / "timestamp.txt").read_text()
    with api.Gradebook(f"sqlite:///{db}", course_id="lab") as gb:
        alice = gb.find_submission(EXERCISE, "alice")
        assert alice.score == public and alice.timestamp == parse_nbgrader_time(stamp).replace(tzinfo=None)
        assert not [g for g in gb.db.query(api.Grade) if g.needs_manual_grade]

    assert cli("feedback", str(out), "--nbgrader", str(course), "--no-plot") == 0
    page = course / "feedback" / "alice" / EXERCISE / f"{EXERCISE}.html"
    assert 'data-exercise="online_softmax"' in page.read_text() and "paged_kv" not in page.read_text()
    assert (page.parent / "submission_secret.txt").read_text() == \
        (submitted / "alice" / EXERCISE / "submission_secret.txt").read_text()
    _exchange(ExchangeReleaseFeedback, course, exchange, EXERCISE)
    for student, home in homes.items():
        monkeypatch.chdir(home)
        _exchange(ExchangeFetchFeedback, course, exchange, EXERCISE, student, home)
        fetched = list((home / EXERCISE / "feedback").glob(f"*/{EXERCISE}.html"))
        assert len(fetched) == 1, f"{student} got {fetched}"
        assert f'<span id="submission">{student}</span>' in fetched[0].read_text()


def test_feedback_is_not_written_where_release_feedback_could_not_take_it(tmp_path, capsys):
    submitted = nbgrader_tree(tmp_path / "course", {("alice", EXERCISE): "2026-11-30 10:00:00 UTC"})
    write(tmp_path / "res", "alice.json", make_result("alice"))
    write(tmp_path / "res", "bob.json", make_result("bob"))
    # finished, no page for either: both need attention (3)
    assert cli("feedback", str(tmp_path / "res"), "--nbgrader", str(tmp_path / "course"), "--no-plot") == 3
    err = capsys.readouterr().err
    assert "0 student(s) exported, 2 with problems: alice, bob" in err
    assert "alice/online_softmax: submission_secret.txt not in" in err
    assert "bob/online_softmax: no submitted/bob/online_softmax/ folder" in err
    assert "paged_kv" not in err  # not submitted, nothing to say
    assert not (tmp_path / "course" / "feedback").exists()
    (submitted / "alice" / EXERCISE / "submission_secret.txt").write_text("s3cret")
    assert cli("feedback", str(tmp_path / "res" / "alice.json"), "--nbgrader", str(tmp_path / "course"), "--no-plot") == 0
    assert sorted(p.name for p in (tmp_path / "course" / "feedback" / "alice" / EXERCISE).iterdir()) == [
        f"{EXERCISE}.html", "submission_secret.txt", "timestamp.txt"]
