"""The command line as people use it: make check's table, hints, JSON output, exit codes."""

import json
import os
import subprocess
import sys

import pytest

from grader import results
from tests.conftest import COURSE

# These tests share the course root's .progress.json: run them in one process, one after another.
pytestmark = pytest.mark.xdist_group("progress-file")


def grader(root, *args, env=None):
    return subprocess.run([sys.executable, "-m", "grader", *args], cwd=root, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "160", **(env or {})}, timeout=600)


def test_check_on_the_stub_says_where_to_start(root):
    run = grader(root, "check", "online_softmax")
    assert run.returncode == 1, f"a failing public test must fail `make check` (exit 1), as pytest does: {run.stderr}"
    assert "your progress (public tests)" in run.stdout
    line = next(l for l in run.stdout.splitlines() if l.strip().startswith("online_softmax") and "/" in l)
    assert "0/18" in line and "0/22" in line, line
    assert "start here: read exercises/online_softmax/README.md" in run.stdout
    assert "online_softmax/triton_speed" in run.stdout, "make check must say which checks need CUDA"


def test_check_on_the_solution_is_all_green(root):
    run = grader(root, "check", "online_softmax", "--from", "solutions")
    assert run.returncode == 0, run.stderr
    line = next(l for l in run.stdout.splitlines() if l.strip().startswith("online_softmax") and "/" in l)
    assert "18/18" in line and "22/22" in line, line
    assert "all public tests pass" in run.stdout


def test_check_shows_the_first_failure_and_its_message(root, tmp_path):
    folder = tmp_path / "online_softmax"
    folder.mkdir()
    source = (root / "solutions/online_softmax/online_softmax.py").read_text()
    (folder / "online_softmax.py").write_text(source.replace("    shift = _safe_max(m)\n    # Each", "    shift = m\n    # Each"))
    run = grader(root, "check", "online_softmax", "--from", str(tmp_path))
    assert run.returncode == 1
    failed = [line for line in run.stdout.splitlines() if line.startswith("FAILED online_softmax, check ")]
    assert failed, f"every failing test gets one FAILED line: {run.stdout}"
    assert "exp(-inf - (-inf)) is NaN" in run.stdout, run.stdout
    assert "make check V=1" in run.stdout
    assert "\nassert " not in run.stdout, "pytest's introspection of the assert must not bury the message"
    verbose = grader(root, "check", "online_softmax", "--from", str(tmp_path), "-v")
    assert "exp(-inf - (-inf)) is NaN" in verbose.stdout and "make check V=1" not in verbose.stdout, verbose.stdout


def test_check_warns_of_what_the_graded_scan_will_fail(root, tmp_path):
    """zero_sharding's public tests do not scan; its graded run does, and an outsider's file using `self._grad`
    (a private name torch's tensors have) passed every public test and scored 10 of 100. make check says so.
    online_softmax's public tests scan: their failure says it, and no SCAN line repeats it."""
    keeps = ("\n\nclass _Keeps:\n    def __init__(self):\n        self._grad = None\n\n"
             "    def grad(self):\n        return self._grad\n")
    for exercise in ("zero_sharding", "online_softmax"):
        folder = tmp_path / exercise
        folder.mkdir()
        source = (root / f"solutions/{exercise}/{exercise}.py").read_text()
        (folder / f"{exercise}.py").write_text(source + keeps)
    run = grader(root, "check", "zero_sharding", "--from", str(tmp_path))
    assert run.returncode == 0, f"the public tests pass: the warning does not fail make check: {run.stdout}"
    scan = [line for line in run.stdout.splitlines() if line.startswith("SCAN zero_sharding")]
    assert scan and "_grad is a name your file defines" in run.stdout and "rename yours" in run.stdout, run.stdout
    scanned_publicly = grader(root, "check", "online_softmax", "--from", str(tmp_path))
    assert scanned_publicly.returncode == 1 and "_grad is a name your file defines" in scanned_publicly.stdout
    assert "SCAN" not in scanned_publicly.stdout, "the failing public tests already say it"
    clean = grader(root, "check", "zero_sharding", "--from", "solutions")
    assert clean.returncode == 0 and "SCAN" not in clean.stdout, clean.stdout


def test_points_are_rounded_for_people():
    from grader.report import _points

    assert _points(35 / 6, 20) == "5.83/20"
    assert _points(92.428571, 100) == "92.43/100"
    assert _points(0, 22) == "0/22"


def test_hint_takes_a_practice_round_id(root):
    progress = root / ".progress.json"
    saved = progress.read_bytes() if progress.exists() else None
    try:
        run = grader(root, "hint", "online_softmax/normalizer")
        assert run.returncode == 0 and "hint 1/" in run.stdout, run.stdout + run.stderr
    finally:
        progress.unlink(missing_ok=True)
        if saved is not None:
            progress.write_bytes(saved)


def test_hints_are_revealed_one_at_a_time_and_remembered(root):
    progress = root / ".progress.json"
    saved = progress.read_bytes() if progress.exists() else None
    progress.unlink(missing_ok=True)
    try:
        first = grader(root, "hint", "online_softmax").stdout
        second = grader(root, "hint", "online_softmax").stdout
        assert "hint 1/5" in first and "hint 2/5" not in first
        assert "hint 2/5" in second
        assert json.loads(progress.read_text())["exercises"]["online_softmax"]["hints"] == 2
        assert "2/5" in grader(root, "progress").stdout
    finally:
        progress.unlink(missing_ok=True)
        if saved is not None:
            progress.write_bytes(saved)


def test_grade_json_output_is_a_valid_result(root):
    run = grader(root, "grade", "solutions", "-e", "online_softmax", "--tests", "public", "--format", "json", "--seed", "7")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    results.validate(result)
    assert result["seed"] == 7 and result["score"] == 22


@pytest.mark.parametrize("args,message", [
    (("grade", "no/such/folder"), "expected a submission folder or archive at no/such/folder, found nothing there"),
    (("grade", "solutions", "-e", "nope"), "no exercise 'nope' in course.yaml; expected one of"),
    (("hint", "nope"), "no exercise 'nope'"),
])
def test_bad_input_exits_2_with_a_clear_message(root, args, message):
    run = grader(root, *args)
    assert run.returncode == 2
    assert message in " ".join(run.stderr.split()), run.stderr


def test_grade_writes_the_result_incrementally(root, tmp_path):
    """The result file exists from the start and is complete at the end; each write is atomic."""
    out = tmp_path / "r.json"
    run = grader(root, "grade", "exercises", "-e", "online_softmax", "--tests", "public", "-o", str(out))
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert result["state"] == "complete" and result["score"] == 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".r.json")], "temporary files left behind"


def test_validate(root):
    run = grader(root, "validate")
    assert run.returncode == 0, run.stdout + run.stderr


def test_start_here_points_at_the_first_exercise_not_started():
    from rich.console import Console

    from grader import report

    def stub(ex_id):
        test = {"name": "test_a", "status": "error", "message": "your code raised NotImplementedError: fill me in"}
        return {"id": ex_id, "message": "", "checks": [{"id": "a", "visibility": "public", "points": 0,
                                                          "max_points": 5, "tests": [test]}]}

    console = Console(width=200, record=True)
    console.print(report.progress_table({"exercises": [stub("online_softmax"), stub("paged_kv")]}))
    text = console.export_text()
    assert text.count("start here") == 1 and "start here: read exercises/online_softmax/README.md" in text, text
    assert "not started" in text.split("paged_kv", 1)[1], text


def test_progress_of_one_exercise_shows_every_check_it_is_graded_on(root):
    """The hidden categories too, with their points, and the public checks that practise the same thing."""
    out = grader(root, "progress", "moe_router").stdout
    for check in COURSE.exercise("moe_router").checks:
        assert check.id in out, f"{check.id} is graded, so the student should see it: {out[-1500:]}"
    assert "hidden tests" in out and "public tests (make check)" in out
    assert "route_public" in out.split("drops:", 1)[1].split("\n")[0], "drops is practised by route_public's hints"


def test_tables_fit_80_columns_and_wrap_a_cause_never_cut_it():
    """At 80 columns every table wraps a long cause whole: no ellipsis, no line past the edge."""
    from rich.console import Console

    from grader import report
    from grader.scale import summary as batch_summary

    cause = ("online_softmax.ipynb cannot be graded: cell 7 holds a shell or magic line ('%timeit online_softmax(x)'); "
             "tag the cell 'scratch' or start it with '# scratch' to keep it out of the grade")
    failing = {"name": "test_softmax_matches_the_textbook[1024]", "status": "failed",
               "message": "the softmax of a row of 1,024 values differs from the textbook's by 3.2e-02 at column 517: "
                          "is the last, partial block included in pass 1?"}
    progress = {"exercises": [
        {"id": "online_softmax", "message": cause, "checks": [{"id": "a", "visibility": "public", "points": 0,
                                                               "max_points": 5, "tests": []}]},
        {"id": "flash_attention", "message": "", "checks": [{"id": "b", "visibility": "public", "points": 0,
                                                             "max_points": 5, "tests": [failing]}]}]}
    ex = COURSE.exercise("speculative")
    summary = {"graded": 3, "submissions": 4, "histogram_note": "not drawn", "not_gradable": [], "unfinished": [],
               "no_result": [], "internal_error": [{"id": "submission-of-a-student-with-a-long-name", "reason": cause}],
               "exercises": [{"id": e.id, "graded": 3, "mean": 88.25, "median": 91.5, "min": 12.5, "max": 100,
                              "gradable_max_score": e.points - 5, "max_score": e.points, "full_marks": 1,
                              "not_submitted": 1,
                              "most_failed": [{"check": "speculative_accept", "failed": 2, "message": cause}]
                              if e.id == ex.id else []}
                             for e in COURSE.exercises]}
    console = Console(width=80, record=True, color_system=None)
    console.print(report.progress_table(progress))
    batch_summary.print_summary(summary, console)
    text = console.export_text()
    wide = [line for line in text.splitlines() if len(line) > 80]
    assert not wide, f"lines past 80 columns: {wide}"
    assert "…" not in text, f"a cell was cut with an ellipsis:\n{text}"
    words = " ".join(text.split())
    for part in ("'%timeit online_softmax(x)'", "is the last, partial block included in pass 1?",
                 "'# scratch' to keep it out of the grade", *(e.id for e in COURSE.exercises)):
        assert part in words, f"{part!r} must be shown whole (wrapped), found:\n{text}"


def test_a_batch_line_keeps_the_whole_reason():
    """A refused submission's reason is printed whole (the terminal wraps it), however long."""
    from grader import results
    from grader.scale.summary import one_line

    reason = ("'online_softmax.ipynb' in the submission: cell 2 (code cell 2, starting '%timeit 1'), line 1: a shell "
              "or magic line ('%timeit 1'); the notebook is graded as a Python file, where only Python runs: delete "
              "the line, or mark the cell as scratch (tag it 'scratch', or make its first line '# scratch'); refused")
    result = results.ungradable(COURSE, [COURSE.exercise("online_softmax")], "erin", reason, suite_sha="ab" * 32, seed=1)
    line = one_line("erin", result, None)
    assert line.endswith("make its first line '# scratch'); refused"), f"the reason was cut: {line}"
