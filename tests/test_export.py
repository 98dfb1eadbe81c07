"""Exports of the canonical result: CSV, Gradescope, PrairieLearn, nbgrader, the feedback page, the
Gradescope bundle and PrairieLearn's entry point.

Most results here are built with grader.results' own helpers (no grading); one module fixture runs the
Gradescope bundle's run_autograder for real on the reference online_softmax (public tests), and the
exports of that real result are checked too.
"""

from __future__ import annotations

import argparse
import base64
import csv
import html
import datetime as dt
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import pytest

from grader import results as R
from grader.course import CourseError
from grader.export.bundle import build_bundle
from grader.export.checks import check_output
from grader.export.cli import add_commands
from grader.export.csv_gradebook import to_csv
from grader.export.feedback import render_feedback, student_traceback
from grader.export.gradescope import to_gradescope
from grader.export.load import Loaded, load_results
from grader.export.prairielearn import to_prairielearn
from grader.export.settings import ExportSettings, load_settings, parse_settings
from tests.conftest import COURSE, ROOT

SCHEMAS = ROOT / "grader" / "schemas"
FINISHED = "2026-11-29T12:00:00+00:00"
INJECTED = "row 3: sum is 1.37 <script>document.title='owned'</script>"
TRACEBACK = ('Traceback (most recent call last):\n  File "/srv/grade/files/online_softmax.py", line 12, in merge_states\n'
             '    return l_a / l_b\nZeroDivisionError: division by zero')
SPEED = {"gbps": 2100.0, "copy_gbps": 3900.0, "torch_softmax_gbps": 2500.0, "ratio_to_torch_softmax": 0.84,
         "fraction_of_copy_bandwidth": 0.54, "bar": 0.5, "floor": 0.2}


def _points(check: str) -> float:
    return COURSE.exercise("online_softmax").check(check).points


# make_result's online_softmax: both normalizer_public tests, half of merge_public and all of normalizer passed.
# Derived from course.yaml, so that rebalancing the exercise's points does not break the exports' tests.
ALICE = _points("normalizer_public") + _points("merge_public") / 2 + _points("normalizer")
NORMALIZER = COURSE.exercise("online_softmax").check("normalizer")


def _cuda_points(exercise: str) -> float:
    return sum(c.points for c in COURSE.exercise(exercise).checks if c.cuda)


# make_result's two exercises: every point, and what a host without CUDA grades (the same for every student,
# whether their file was graded, missing or unreadable).
MAX = COURSE.exercise("online_softmax").points + COURSE.exercise("paged_kv").points
CUDA = _cuda_points("online_softmax") + _cuda_points("paged_kv")
GRADABLE_ON_CPU = MAX - CUDA


def schema(name: str) -> dict:
    return json.loads((SCHEMAS / f"{name}.schema.json").read_text())


def make_result(student: str = "alice", *, speed: bool = False, gradable: bool = True, complete: bool = True,
                exercises: tuple[str, ...] = ("online_softmax", "paged_kv")) -> dict:
    """A result as the runner would write it: online_softmax partly passed, paged_kv not submitted.

    With `speed`, triton_speed was measured (as on a GPU); otherwise it is "not graded" (no CUDA)."""
    exs = [COURSE.exercise(e) for e in exercises]
    r = R.new_result(COURSE, student, "ab" * 32, "cd" * 32, 1234, "sandbox", exs)
    r["device"]["gpu"] = "NVIDIA H100 80GB HBM3" if speed else None  # the host, not this machine, decides
    if not gradable:
        r["gradable"] = False
        r["format_errors"] = ["archive member '../x.py' points outside the archive (absolute path or '..'); refused"]
        for ex in exs:
            R.find_exercise(r, ex.id)["status"] = "ungradable"
            R.close_exercise(r, ex.id, "the submission could not be read: archive member '../x.py' ...")
    else:
        r["gradable"] = True

        def test(check, name, status, **extra):
            R.record_test(r, {"event": "test", "exercise": "online_softmax", "check": check, "test": name,
                              "status": status, "duration": 0.25, **extra})

        test("normalizer_public", "test_normalizer[2]", "passed", fraction=1.0)
        test("normalizer_public", "test_normalizer[3]", "passed", fraction=1.0)
        test("merge_public", "test_merge[0]", "passed", fraction=1.0)
        test("merge_public", "test_merge[3]", "failed", message=INJECTED, traceback=TRACEBACK)
        test("normalizer", "test_random_chunkings", "passed", fraction=1.0)
        if speed:
            test("triton_speed", "test_triton_bandwidth[4096-8192]", "passed", fraction=1.0, metrics=SPEED)
            test("triton_speed", "test_triton_bandwidth[64-262144]", "passed", fraction=0.6,
                 metrics={**SPEED, "gbps": 1400.0, "fraction_of_copy_bandwidth": 0.38})
        else:
            test("triton_speed", "test_triton_bandwidth[4096-8192]", "not_graded", message="not graded: no CUDA device")
        if complete:
            R.close_exercise(r, "online_softmax")
            if "paged_kv" in exercises:
                R.find_exercise(r, "paged_kv")["status"] = "missing"
                R.close_exercise(r, "paged_kv", "not submitted: expected a file named paged_kv.py")
    if complete:
        R.finish(r)
        r["started_at"], r["finished_at"] = "2026-11-29T11:59:00+00:00", FINISHED
    R.validate(r)
    return r


def write(folder: Path, name: str, data) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="grader")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    return args.fn(args)


# --------------------------------------------------------------------------------------------------
# reading a folder of results, and the settings


def test_load_results_skips_malformed_files_and_says_what_was_expected(tmp_path):
    write(tmp_path, "alice.json", make_result("alice"))
    write(tmp_path, "list.json", [1, 2])
    write(tmp_path, "truncated.json", '{"schema": "llm-efficiency-lab/result/v1", ')
    write(tmp_path, "other.json", {"schema": "someone-else/v3"})
    negative = make_result("neg")
    negative["exercises"][0]["score"] = -1
    write(tmp_path, "negative.json", negative)
    write(tmp_path, ".alice.json.tmp123.json", "half a fi")  # an atomic write in progress
    write(tmp_path, "summary.json", {"course": "x", "submissions": 1, "graded": 1, "exercises": []})  # grader batch's
    loaded, skipped = load_results(tmp_path)
    assert [x.student for x in loaded] == ["alice"]
    reasons = {s.path.name: str(s) for s in skipped}
    assert set(reasons) == {"list.json", "truncated.json", "other.json", "negative.json"}
    assert "skipped list.json: expected a grading result" in reasons["list.json"] and "found a JSON list" in reasons["list.json"]
    assert "not valid JSON (line 1" in reasons["truncated.json"]
    assert 'found "schema": "someone-else/v3"' in reasons["other.json"]
    assert "exercises[0].score" in reasons["negative.json"] and "less than the minimum" in reasons["negative.json"]


def test_cli_export_names_each_skipped_file_and_fails_only_when_nothing_is_valid(tmp_path, capsys):
    write(tmp_path / "ok", "alice.json", make_result("alice"))
    write(tmp_path / "ok", "bob.json", "not json")
    # finished, but bob's file is no result: 3 ("some students need attention"), not 0 (grader/export/README.md)
    assert cli("export", str(tmp_path / "ok"), "--format", "csv") == 3
    out, err = capsys.readouterr()
    assert out.startswith("student,submission,online_softmax,") and "\nalice,alice," in out
    assert "skipped bob.json: not valid JSON" in err and "1 student(s) exported, 1 with problems: bob" in err

    write(tmp_path / "bad", "bob.json", "not json")
    assert cli("export", str(tmp_path / "bad"), "--format", "gradescope") == 2
    assert "error: expected at least one valid result" in capsys.readouterr().err
    assert cli("export", str(tmp_path / "nowhere"), "--format", "csv") == 2
    assert "expected a folder of result files (one <student>.json each)" in capsys.readouterr().err


def test_export_settings_default_and_errors_name_the_field(tmp_path):
    assert load_settings(ROOT, COURSE) == ExportSettings()  # the course has no export: mapping yet
    (tmp_path / "course.yaml").write_text("course: x\nexport:\n  gradescope: {leaderboard: true, visibility: {hidden: visible}}\n")
    loaded = load_settings(tmp_path)
    assert loaded.gradescope.leaderboard and loaded.gradescope.visibility.hidden == "visible"
    assert loaded.gradescope.visibility.public == "visible" and not loaded.prairielearn.count_ungraded_cuda
    with pytest.raises(CourseError) as err:
        parse_settings({"gradescope": {"leaderboard": "maybe", "visibility": {"hidden": "later"}}, "due": "soon"})
    text = str(err.value)
    assert "course.yaml: export.gradescope.leaderboard: expected true or false, found 'maybe'" in text
    assert "export.gradescope.visibility.hidden: expected one of 'hidden', 'after_due_date', 'after_published' or 'visible', found 'later'" in text
    assert "export.due: expected an ISO 8601 date and time" in text


# --------------------------------------------------------------------------------------------------
# CSV


def test_csv_gradebook_snapshot(tmp_path):
    loaded = [Loaded("carol", Path("carol.json"), make_result("carol", gradable=False)),
              Loaded("alice", Path("alice.json"), make_result("alice")),
              Loaded("bob", Path("bob.json"), make_result("bob", complete=False, exercises=("online_softmax",)))]
    due = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)
    submitted = {"alice": dt.datetime(2026, 11, 30, tzinfo=dt.timezone.utc), "carol": dt.datetime(2026, 12, 2, tzinfo=dt.timezone.utc)}
    rows = list(csv.reader(io.StringIO(to_csv(loaded, COURSE, due, submitted))))
    assert rows[0] == ["student", "submission", *[e.id for e in COURSE.exercises], "total", "max_score",
                       "gradable_max_score", "ungradable", "incomplete", "late", "seed", "graded_at"]
    cols = {name: i for i, name in enumerate(rows[0])}
    by_student = {row[0]: row for row in rows[1:]}
    assert [row[0] for row in rows[1:]] == ["alice", "bob", "carol"]
    alice, bob, carol = by_student["alice"], by_student["bob"], by_student["carol"]
    # alice: normalizer_public + merge_public / 2 + normalizer = ALICE; paged_kv not submitted: 0
    assert [alice[cols[k]] for k in ("online_softmax", "paged_kv", "flash_attention", "total", "max_score",
                                      "gradable_max_score", "ungradable", "incomplete", "late", "seed", "graded_at")] == \
        [f"{ALICE:g}", "0", "", f"{ALICE:g}", f"{MAX:g}", f"{GRADABLE_ON_CPU:g}", "no", "no", "no", "1234", FINISHED]
    assert bob[cols["incomplete"]] == "yes" and bob[cols["paged_kv"]] == "" and bob[cols["late"]] == ""
    assert carol[cols["ungradable"]] == "yes" and carol[cols["total"]] == "0" and carol[cols["late"]] == "yes"


def test_csv_cli_writes_a_file_and_reads_submission_times(tmp_path, capsys):
    write(tmp_path / "res", "alice.json", make_result("alice"))
    times = write(tmp_path, "times.csv", "student,submitted_at\nalice,2026-12-03T10:00:00+00:00\n")
    out = tmp_path / "grades.csv"
    assert cli("export", str(tmp_path / "res"), "--format", "csv", "--out", str(out),
               "--due", "2026-12-01T00:00:00+00:00", "--submitted-times", str(times)) == 0
    rows = list(csv.DictReader(out.read_text().splitlines()))
    assert rows[0]["late"] == "yes" and rows[0]["online_softmax"] == f"{ALICE:g}"
    bad = write(tmp_path, "bad_times.csv", "who,when\nalice,today\n")
    assert cli("export", str(tmp_path / "res"), "--format", "csv", "--submitted-times", str(bad)) == 2
    assert "expected columns 'student' and 'submitted_at', found ['who', 'when']" in capsys.readouterr().err


def test_csv_exercise_cells_add_up_to_the_total():
    from grader.export.csv_gradebook import cents_that_add_up

    # three thirds of 10: rounding each to 3.33 would sum to 9.99
    assert cents_that_add_up([10 / 3, 10 / 3, 10 / 3]) == [334, 333, 333]
    assert cents_that_add_up([5.8333, 16.5714, 0.0]) == [583, 1657, 0]
    assert cents_that_add_up([]) == []
    result = make_result("alice")
    for ex in result["exercises"][:3]:
        ex["score"] = 10 / 3
    result["score"] = sum(e["score"] for e in result["exercises"])
    row = next(csv.DictReader(to_csv([Loaded("alice", Path("a.json"), result)], COURSE).splitlines()))
    cells = [float(row[e.id]) for e in COURSE.exercises if row[e.id] != ""]
    assert round(sum(cells), 2) == float(row["total"]), f"the row's cells {cells} must add up to {row['total']}"


def test_csv_warns_of_a_student_without_a_submission_time_and_has_per_check_columns():
    loaded = [Loaded("alice", Path("alice.json"), make_result("alice")), Loaded("bob", Path("bob.json"), make_result("bob"))]
    warnings: list[str] = []
    due = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)
    text = to_csv(loaded, COURSE, due, {"alice": dt.datetime(2026, 11, 30, tzinfo=dt.timezone.utc)}, checks=True,
                  warnings=warnings)
    assert warnings == ["no submission time for 'bob' in the submission times: its 'late' is empty"]
    rows = list(csv.DictReader(text.splitlines()))
    assert rows[0]["late"] == "no" and rows[1]["late"] == ""
    assert rows[0]["online_softmax/normalizer_public"] == "5" and rows[0]["online_softmax/merge_public"] == "2.5"


@pytest.mark.parametrize("student,cell", [
    ("=HYPERLINK(\"http://evil\",\"x\")", "'=HYPERLINK(\"http://evil\",\"x\")"),
    ("+1+1", "'+1+1"), ("-2+3", "'-2+3"), ("@SUM(A1)", "'@SUM(A1)"), ("\tx", "'\tx"),
    ("\r=1", "' =1"), (" =1", "' =1"), ("a\nb", "a b"),  # one line; a formula start after blanks counts too
    ("\x1b[2Jeve", "eve"), ("\x1b[2J=1", "'=1"), ("mal\u202elory", "mallory"), ("bob", "bob"),
])
def test_csv_cells_are_inert_and_never_formulas(student, cell):
    """CSV injection: a text cell starting with = + - @ tab or CR gets an apostrophe, also once its escape
    sequences and control characters (which a spreadsheet or a terminal would act on) are stripped."""
    result = make_result("x")
    result["submission"]["id"] = student
    rows = list(csv.reader(io.StringIO(to_csv([Loaded(student, Path("x.json"), result)], COURSE))))
    assert rows[1][:2] == [cell, cell], f"expected {cell!r} for {student!r}, found {rows[1][:2]}"


# --------------------------------------------------------------------------------------------------
# Gradescope


def test_gradescope_results_snapshot():
    out = to_gradescope(make_result("alice"), ExportSettings(), COURSE)
    jsonschema.validate(out, schema("gradescope_results"))
    assert out["score"] == ALICE and out["execution_time"] == 60.0
    # hidden checks are withheld until published, so the visible headline holds no total (it would reveal them)
    assert "Score:" not in out["output"] and "Seed: 1234" in out["output"]
    assert f"{CUDA:g} points need a CUDA device and were not graded on Gradescope; they do not count here." \
        in out["output"]
    assert ("Not graded here (needs a CUDA device): online_softmax: softmax_triton bandwidth on CUDA, as a fraction "
            "of device copy bandwidth; paged_kv: ") in out["output"], "paged_kv is missing: its CUDA checks too"
    both = (COURSE.exercise("online_softmax"), COURSE.exercise("paged_kv"))
    checks, cuda = sum(len(e.checks) for e in both), sum(c.cuda for e in both for c in e.checks)
    assert len(out["tests"]) == checks - cuda, "the CUDA checks not graded here are left out (no status reads as passed)"
    assert all("status" in t for t in out["tests"])
    by_number = {t["number"]: t for t in out["tests"]}
    essentials = [(t["number"], t["name"], t["score"], t["max_score"], t.get("status"), t["visibility"], t["tags"])
                  for t in (by_number[n] for n in ("1.1", "1.2", "1.6", "2.1"))]
    assert essentials == [
        ("1.1", "online_softmax: online_normalizer on small matrices", 5.0, 5.0, "passed", "visible",
         ["online_softmax", "normalizer_public", "public"]),
        ("1.2", "online_softmax: merge_states on small states", 2.5, 5.0, "failed", "visible",
         ["online_softmax", "merge_public", "public"]),
        ("1.6", f"online_softmax: {NORMALIZER.title}", NORMALIZER.points, NORMALIZER.points,
         "passed", "after_published", ["online_softmax", "normalizer", "hidden"]),
        ("2.1", f"paged_kv: {COURSE.exercise('paged_kv').checks[0].title}", 0.0, 5.0, "failed", "visible",
         ["paged_kv", "manager_public", "public"]),
    ]
    merge = out["tests"][1]["output"]
    assert INJECTED in merge and "ZeroDivisionError: division by zero" in merge and "tests: 1 failed, 1 passed" in merge
    assert "not submitted: expected a file named paged_kv.py" in by_number["2.1"]["output"]
    assert "leaderboard" not in out


def test_gradescope_headline_shows_the_score_only_when_nothing_is_withheld_and_never_the_warnings():
    result = make_result("alice")
    result["warnings"] = ["no user namespaces: the worker runs without a private /tmp"]
    hidden = to_gradescope(result, ExportSettings(), COURSE)
    assert "Score:" not in hidden["output"] and "namespaces" not in hidden["output"]
    assert hidden["extra_data"]["warnings"] == result["warnings"], "warnings are for the instructor: extra_data"
    shown = to_gradescope(result, parse_settings({"gradescope": {"visibility": {"hidden": "visible"}}}), COURSE)
    assert f"Score: {ALICE:g}/{GRADABLE_ON_CPU:g}" in shown["output"] and "namespaces" not in shown["output"]


def test_gradescope_settings_visibility_cuda_and_leaderboard():
    settings = parse_settings({"gradescope": {"visibility": {"public": "after_due_date", "hidden": "hidden"},
                                              "leaderboard": True, "count_ungraded_cuda": True}})
    cpu = to_gradescope(make_result("alice"), settings, COURSE)
    jsonschema.validate(cpu, schema("gradescope_results"))
    assert {t["visibility"] for t in cpu["tests"] if "public" in t["tags"]} == {"after_due_date"}
    assert {t["visibility"] for t in cpu["tests"] if "hidden" in t["tags"]} == {"hidden"}
    speed = next(t for t in cpu["tests"] if "triton_speed" in t["tags"])
    assert (speed["max_score"], speed["status"]) == (10.0, "failed")
    assert "they count as 0 until graded on a CUDA machine" in cpu["output"]
    assert cpu["leaderboard"] == []  # nothing was measured without CUDA
    gpu = to_gradescope(make_result("alice", speed=True), settings, COURSE)
    jsonschema.validate(gpu, schema("gradescope_results"))
    assert gpu["leaderboard"] == [{"name": "online_softmax/triton_speed: fraction_of_copy_bandwidth",
                                   "value": 0.46, "order": "desc"}]
    speed = next(t for t in gpu["tests"] if "triton_speed" in t["tags"])
    assert speed["score"] == 8.0 and "gbps = 2100" in speed["output"]


def speed_result() -> dict:
    """Speed checks as measured on a GPU, each recording what its hidden test records (grader/hidden/...)."""
    exs = [COURSE.exercise(e) for e in ("flash_attention", "moe_router", "gptq")]
    r = R.new_result(COURSE, "dana", "ab" * 32, "cd" * 32, 7, "sandbox", exs)
    r["gradable"] = True

    def test(ex, check, name, fraction, **metrics):
        R.record_test(r, {"event": "test", "exercise": ex, "check": check, "test": name, "status": "passed",
                          "duration": 1.0, "fraction": fraction, "metrics": metrics})

    # flash_attention: scored on fraction_of_sdpa (a library baseline), but it also records fraction_of_matmul.
    test("flash_attention", "forward_speed", "test_forward_speed[64-full]", 1.0, tflops=300.0, sdpa_tflops=400.0,
         fraction_of_matmul=0.4, matmul_tflops=750.0, fraction_of_sdpa=0.75, bar=0.6, floor=0.2)
    test("flash_attention", "forward_speed", "test_forward_speed[128-causal]", 0.5, tflops=150.0, sdpa_tflops=375.0,
         fraction_of_matmul=0.2, matmul_tflops=750.0, fraction_of_sdpa=0.4, bar=0.6, floor=0.2)
    # moe_router is timed against one topk + softmax only: no ceiling to be a fraction of.
    test("moe_router", "route_speed", "test_route_speed", 1.0, route_us=900.0, topk_softmax_us=45.0,
         ratio_to_topk_plus_softmax=0.05, bar=0.04, floor=0.01)
    for ex in exs:
        R.close_exercise(r, ex.id)
    R.finish(r)
    R.validate(r)
    return r


def test_gradescope_leaderboard_is_the_achieved_fraction_of_the_measured_ceiling():
    settings = parse_settings({"gradescope": {"leaderboard": True}})
    out = to_gradescope(speed_result(), settings, COURSE)
    jsonschema.validate(out, schema("gradescope_results"))
    # One entry per measured speed check: flash_attention's forward as its fraction of the bf16 matmul
    # (mean of 0.4 and 0.2), not of SDPA; backward_speed and gptq's speed_cuda were not measured.
    assert out["leaderboard"] == [
        {"name": "flash_attention/forward_speed: fraction_of_matmul", "value": 0.3, "order": "desc"},
        {"name": "moe_router/route_speed: ratio_to_topk_plus_softmax (no ceiling measured)", "value": 0.05, "order": "desc"},
    ]
    # A test that records only a rate and its ceiling gets the fraction worked out.
    from grader.export.checks import ceiling_fraction

    check = {"tests": [{"metrics": {"gbps": 1000.0, "copy_gbps": 4000.0}},
                       {"metrics": {"student_tflops": 5.0, "matmul_tflops": 500.0}}, {"metrics": {}}]}
    assert ceiling_fraction(check) == ("fraction_of_copy_bandwidth", 0.25)
    assert ceiling_fraction({"tests": [{"metrics": {"student_tflops": 5.0, "matmul_tflops": 500.0}}]}) == \
        ("fraction_of_matmul", 0.01)
    assert ceiling_fraction({"tests": []}, "fraction_of_copy_bandwidth") is None  # nothing measured: no entry


def test_gradescope_schema_rejects_what_gradescope_would():
    good = to_gradescope(make_result("alice"))
    for broken in ({**good, "tests": [{**good["tests"][0], "visibility": "sometimes"}]},
                   {**good, "tests": [{**good["tests"][0], "status": "skipped"}]},
                   {**good, "leaderboard": [{"name": "x", "value": 1, "order": "up"}]},
                   {k: v for k, v in good.items() if k != "score"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, schema("gradescope_results"))


def test_gradescope_output_is_bounded_per_check():
    r = make_result("alice")
    merge = R.find_exercise(r, "online_softmax")["checks"][1]
    merge["tests"][1]["message"] = "x" * 200_000
    text = check_output(merge)
    assert len(text) < 9000 and text.endswith("more characters cut)")


# --------------------------------------------------------------------------------------------------
# PrairieLearn


def test_prairielearn_results_snapshot_and_ungradable():
    out = to_prairielearn(make_result("alice"))
    jsonschema.validate(out, schema("prairielearn_results"))
    assert out["gradable"] is True and out["score"] == pytest.approx(ALICE / GRADABLE_ON_CPU, abs=1e-6)
    first, merge = out["tests"][0], out["tests"][1]
    assert (first["name"], first["description"], first["points"], first["max_points"], first["message"]) == \
        ("online_softmax: normalizer_public", "online_normalizer on small matrices", 5.0, 5.0, "passed")
    assert merge["points"] == 2.5 and merge["message"].startswith("test_merge[3]: row 3") and TRACEBACK.splitlines()[-1] in merge["output"]
    assert f"online_softmax         {ALICE:g}/100    graded" in out["output"]
    counted = to_prairielearn(make_result("alice"), parse_settings({"prairielearn": {"count_ungraded_cuda": True}}))
    assert counted["score"] == pytest.approx(ALICE / 200, abs=1e-6)

    bad = to_prairielearn(make_result("carol", gradable=False))
    jsonschema.validate(bad, schema("prairielearn_results"))
    assert bad["gradable"] is False and "score" not in bad
    assert bad["format_errors"] == ["archive member '../x.py' points outside the archive (absolute path or '..'); refused"]


def test_prairielearn_speed_check_carries_its_plot_and_the_file_stays_under_1mb():
    out = to_prairielearn(make_result("alice", speed=True))
    jsonschema.validate(out, schema("prairielearn_results"))
    speed = next(t for t in out["tests"] if t["name"] == "online_softmax: triton_speed")
    png = base64.b64decode(speed["images"][0]["url"].split(",", 1)[1])
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000
    huge = make_result("alice", speed=True)
    for ex in huge["exercises"]:
        for check in ex["checks"]:
            check["message"] = "y" * 60_000  # 20 checks: 1.2 MB of messages
    fitted = to_prairielearn(huge)
    assert len(json.dumps(fitted)) <= 1_000_000 and fitted["tests"][0]["message"].endswith("more characters cut)")
    jsonschema.validate(fitted, schema("prairielearn_results"))
    from grader.export.prairielearn import fit

    small = fit(to_prairielearn(huge), limit=20_000)
    assert len(json.dumps(small)) <= 20_000 and all("images" not in t for t in small["tests"])
    assert small["tests"][0]["message"].endswith("more characters cut)")


def test_prairielearn_schema_rejects_what_prairielearn_would():
    for broken in ({"gradable": False}, {"gradable": True}, {"score": 1.5}, {"score": 0.5, "tests": [{"name": "t"}]}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, schema("prairielearn_results"))


def test_cli_writes_one_results_json_per_student(tmp_path):
    write(tmp_path / "res", "alice.json", make_result("alice"))
    write(tmp_path / "res", "carol.json", make_result("carol", gradable=False))
    assert cli("export", str(tmp_path / "res"), "--format", "prairielearn", "--out", str(tmp_path / "pl")) == 0
    assert cli("export", str(tmp_path / "res"), "--format", "gradescope") == 0
    pl = {p.parent.name: json.loads(p.read_text()) for p in (tmp_path / "pl").glob("*/results.json")}
    assert set(pl) == {"alice", "carol"} and pl["carol"]["gradable"] is False
    gs = json.loads((tmp_path / "res" / "gradescope" / "alice" / "results.json").read_text())
    jsonschema.validate(gs, schema("gradescope_results"))


# --------------------------------------------------------------------------------------------------
# nbgrader, through its own API


def test_nbgrader_refuses_student_ids_with_control_characters_before_writing(tmp_path):
    """Stripping them would file one student under a name another's id may also become: refused instead,
    before nbgrader is even imported, naming the file."""
    from grader.export.load import ExportError
    from grader.export.nbgrader_gradebook import to_nbgrader

    db = tmp_path / "gradebook.db"
    loaded = [Loaded("alice", Path("alice.json"), make_result("alice")),
              Loaded("eve\x1b[2J", Path("eve\x1b[2J.json"), make_result("eve"))]
    with pytest.raises(ExportError, match=r"control characters or escape sequences in 'eve\\x1b\[2J.json'"):
        to_nbgrader(loaded, f"sqlite:///{db}", COURSE)
    assert not db.exists()


def test_nbgrader_gradebook_holds_the_scores_and_a_regrade_replaces_them(tmp_path):
    api = pytest.importorskip("nbgrader.api", reason="nbgrader is an optional extra: pip install '.[nbgrader]'")
    from grader.export.nbgrader_gradebook import to_nbgrader

    db = f"sqlite:///{tmp_path / 'gradebook.db'}"
    loaded = [Loaded("alice", Path("alice.json"), make_result("alice")),
              Loaded("carol", Path("carol.json"), make_result("carol", gradable=False))]
    summary = to_nbgrader(loaded, db, COURSE)
    graded = sorted({ex["id"] for item in loaded for ex in item.result["exercises"]})
    assert len(graded) < len(COURSE.exercises), "the test needs a course exercise that no result graded"
    cuda_checks = sum(c.cuda for e in graded for c in COURSE.exercise(e).checks)
    assert (summary.students, summary.assignments, summary.not_graded) == (2, len(graded), 2 * cuda_checks), (
        "a host without CUDA grades no CUDA check, for alice (graded, one exercise missing) or carol (unreadable)")
    with api.Gradebook(db) as gb:
        assert sorted(a.name for a in gb.assignments) == graded, "an assignment nobody was graded on reads 0.0"
        sub = gb.find_submission("online_softmax", "alice")
        assert sub.score == ALICE and sub.max_score == 100
        grade = gb.find_grade("merge_public", "online_softmax", "online_softmax", "alice")
        assert (grade.auto_score, grade.max_score, grade.needs_manual_grade) == (2.5, 5.0, False)
        cuda = gb.find_grade("triton_speed", "online_softmax", "online_softmax", "alice")
        assert cuda.auto_score is None and not cuda.needs_manual_grade  # formgrader could not open it (tests/test_export_nbgrader.py)
        assert gb.find_submission("paged_kv", "carol").score == 0
        with pytest.raises(api.MissingEntry):
            gb.find_submission("flash_attention", "alice")  # never graded: no submission, not a zero
    # nbgrader's own CSV export (what `nbgrader export` writes) reads the same scores.
    from nbgrader.plugins.export import CsvExportPlugin

    with api.Gradebook(db) as gb:
        CsvExportPlugin(to=str(tmp_path / "nbgrader_grades.csv")).export(gb)
    exported = {(row["assignment"], row["student_id"]): row
                for row in csv.DictReader((tmp_path / "nbgrader_grades.csv").read_text().splitlines())}
    assert len(exported) == 2 * len(graded)
    assert (exported["online_softmax", "alice"]["score"], exported["online_softmax", "alice"]["max_score"]) == (f"{ALICE:g}", "100.0")
    assert exported["online_softmax", "carol"]["score"] == "0.0"
    regraded = make_result("alice", speed=True)
    to_nbgrader([Loaded("alice", Path("alice.json"), regraded)], db, COURSE)
    with api.Gradebook(db) as gb:
        assert gb.find_submission("online_softmax", "alice").score == ALICE + 8.0
        assert len(gb.find_student("alice").submissions) == 2  # updated in place, not duplicated
        assert not gb.find_grade("triton_speed", "online_softmax", "online_softmax", "alice").needs_manual_grade


# --------------------------------------------------------------------------------------------------
# the feedback page


def test_feedback_page_escapes_student_text_and_shows_every_check():
    page = render_feedback(make_result("alice", speed=True), COURSE)
    assert "<script" not in page and "&lt;script&gt;document.title=" in page
    assert page.count('<tr class="check"') == len(COURSE.exercise("online_softmax").checks) + len(COURSE.exercise("paged_kv").checks)
    assert 'id="seed">1234<' in page and "ZeroDivisionError: division by zero" in page
    assert 'src="data:image/png;base64,' in page and "scored on fraction_of_copy_bandwidth" in page
    assert "http://" not in page and "https://" not in page  # self-contained


def test_exports_strip_escape_sequences_and_controls_from_student_text():
    """Defence in depth: each export strips what record_test would have, even from a result that holds it."""
    result = make_result("alice")
    evil = "[/] \x1b[2J\x1b]0;title\x07\x9b2J\u202eabc\u202c\rok\x00"
    test = next(t for c in result["exercises"][0]["checks"] for t in c["tests"] if t["status"] == "failed")
    test["message"], test["traceback"] = evil, evil
    result["warnings"], result["submission"]["id"] = [evil], "alice" + evil
    R.rescore_check(next(c for c in result["exercises"][0]["checks"] if test in c["tests"]))
    outputs = {"feedback": render_feedback(result, COURSE, plots=False),
               "gradescope": json.dumps(to_gradescope(result, ExportSettings(), COURSE), ensure_ascii=False),
               "prairielearn": json.dumps(to_prairielearn(result, images=False), ensure_ascii=False),
               "csv": to_csv([Loaded("alice", Path("alice.json"), result)], COURSE)}
    for name, text in outputs.items():
        found = sorted({repr(c) for c in re.findall("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", text)})
        assert not found, f"{name} holds control characters {found}"
        if name != "csv":
            assert "[/] abc\nok" in text.replace("\\n", "\n"), f"{name} lost the student's text"


def test_feedback_page_opens_failures_only_and_says_a_refusal_once():
    page = render_feedback(make_result("alice", speed=True), COURSE, plots=False)
    assert re.search(r'<details class="check-detail" id="detail-online_softmax-merge_public" open>', page), (
        "a failing check's details are open")
    assert re.search(r'<details class="check-detail" id="detail-online_softmax-triton_speed">', page), (
        "a passed check's measurements are folded away: the page stays short")
    refused = make_result("bob", gradable=False)
    page = render_feedback(refused, COURSE, plots=False)
    reason = refused["format_errors"][0]
    shown = re.findall(re.escape(html.escape(reason[:40])), page)
    assert len(shown) == 1, f"a refusal's reason is said once, not in every row: {len(shown)} times"
    assert "(the reason above)" in page or "the reason is at the top of this page" in page


def test_feedback_drops_frames_of_hidden_tests_from_a_traceback():
    trace = ('Traceback (most recent call last):\n'
             '  File "/work/grader/hidden/online_softmax/test_hidden.py", line 40, in test_secret\n'
             '    assert secret_oracle(x) == 17\n'
             '  File "/tmp/files/online_softmax.py", line 3, in f\n'
             '    return 1 / 0\n'
             'ZeroDivisionError: division by zero')
    kept = student_traceback(trace)
    assert "secret_oracle" not in kept and "test_hidden.py" not in kept
    assert 'File "/tmp/files/online_softmax.py", line 3' in kept and kept.endswith("ZeroDivisionError: division by zero")


def test_roofline_plots_rates_against_the_measured_ceilings_and_places_runs_under_both_roofs():
    from grader.export.roofline import panels, roofline_png, roofline_points

    check = {"id": "decode_speed", "tests": [
        {"name": "test_decode[4096]", "metrics": {"gbps": 2000.0, "copy_gbps": 4000.0, "tflops": 50.0,
                                                 "matmul_tflops": 800.0, "torch_gbps": 2500.0}},
        {"name": "test_decode[8192]", "metrics": {"gbps": 3000.0, "copy_gbps": 4000.0, "tflops": 120.0,
                                                 "matmul_tflops": 800.0}},
    ]}
    bandwidth, compute = panels(check)
    assert (bandwidth.unit, bandwidth.roof, bandwidth.achieved) == ("GB/s", 4000.0, [2000.0, 3000.0])
    assert bandwidth.baselines[0] == {"torch_gbps": 2500.0}  # the ceiling is the roof, not a baseline
    assert (compute.unit, compute.roof, compute.achieved, compute.labels) == \
        ("TFLOP/s", 800.0, [50.0, 120.0], ["4096", "8192"])
    bw, peak, points = roofline_points(check)
    # arithmetic intensity = FLOP/s / bytes/s: 50e12 / 2000e9 = 25 FLOP per byte
    assert (bw, peak) == (4000.0, 800.0) and points == [("4096", 25.0, 50.0), ("8192", 40.0, 120.0)]
    png = roofline_png(check, "demo")
    bandwidth_only = roofline_png({"id": "x", "tests": [{"name": "t", "metrics": {"gbps": 1.0, "copy_gbps": 2.0}}]}, "demo")
    height = lambda data: int.from_bytes(data[20:24], "big")  # the PNG's IHDR height
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and height(png) > 2 * height(bandwidth_only)  # three panels, not one
    assert roofline_png({"id": "x", "tests": [{"name": "t", "metrics": {}}]}, "demo") is None  # nothing measured


CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y chromium)")
def test_feedback_page_in_headless_chromium(tmp_path, capsys):
    result_file = write(tmp_path, "alice.json", make_result("alice", speed=True))
    page = tmp_path / "alice.html"
    assert cli("feedback", str(result_file), "--out", str(page)) == 0
    # A copy with one probe script: once loaded, it records each image's decoded width in the DOM.
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace(
        "</body>", "<script>addEventListener('load', () => { document.body.dataset.images = "
        "[...document.images].map(i => i.naturalWidth).join(','); });</script></body>"))
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}"]
    run = subprocess.run([*flags, "--virtual-time-budget=3000", "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=120, check=False)
    dom = run.stdout
    assert "<title>Feedback: alice" in dom, run.stderr[-2000:]
    assert dom.count("<script") == 1  # the probe only: the student's "<script>" stayed text
    assert "&lt;script&gt;document.title='owned'&lt;/script&gt;" in dom
    widths = dom.split('data-images="', 1)[1].split('"', 1)[0].split(",")
    assert len(widths) == 1 and int(widths[0]) >= 600  # the roofline PNG decoded
    assert '<dd id="seed">1234</dd>' in dom and 'id="total"' in dom
    assert 'id="check-online_softmax-merge_public" data-check="merge_public" data-status="failed"' in dom
    assert 'id="check-online_softmax-triton_speed" data-check="triton_speed" data-status="passed"' in dom
    assert '<pre class="traceback">' in dom and "ZeroDivisionError: division by zero" in dom
    shot = tmp_path / "feedback.png"
    subprocess.run([*flags, "--window-size=1200,1600", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120, check=False)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


# --------------------------------------------------------------------------------------------------
# the Gradescope bundle


def test_bundle_holds_the_course_and_never_the_solutions(tmp_path):
    out = tmp_path / "autograder.zip"
    names = build_bundle(ROOT, out, COURSE, ["online_softmax"], "public")
    with zipfile.ZipFile(out) as zf:
        listed = zf.namelist()
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in zf.infolist()}
        config = json.loads(zf.read("autograder.json"))
        setup = zf.read("setup.sh").decode()
        pins = zf.read("constraints.txt").decode()
    assert listed == names and listed[:4] == ["setup.sh", "run_autograder", "autograder.json", "constraints.txt"]
    # setup.sh installs what the bundle was built with, not the index's newest (it once got pytest 9.2)
    from importlib import metadata

    assert f"pytest=={metadata.version('pytest')}" in pins.splitlines()
    assert f"torch=={metadata.version('torch').split('+')[0]}" in pins.splitlines()
    installs = [line for line in setup.splitlines() if "pip install" in line and "--upgrade pip" not in line]
    assert installs and all("-c /autograder/source/constraints.txt" in line for line in installs), installs
    assert modes["setup.sh"] == modes["run_autograder"] == 0o755
    assert config == {"exercises": ["online_softmax"], "tests": "public", "user": "student"}
    assert "course.yaml" in listed and "grader/hidden/online_softmax/test_hidden.py" in listed
    assert "exercises/online_softmax/test_public.py" in listed and "grader/export/gradescope_run.py" in listed
    assert not [n for n in listed if n.startswith(("solutions/", "tests/", ".venv/")) or "__pycache__" in n]
    assert "useradd" in setup and "chmod -R go-rwx /autograder/source/grader/hidden" in setup
    for script in ("setup.sh", "run_autograder"):  # both parse as bash
        with zipfile.ZipFile(out) as zf:
            (tmp_path / script).write_bytes(zf.read(script))
        check = subprocess.run(["bash", "-n", str(tmp_path / script)], capture_output=True, text=True, check=False)
        assert check.returncode == 0, check.stderr


def test_cli_feedback_for_a_folder_and_gradescope_bundle(tmp_path, monkeypatch, capsys):
    write(tmp_path / "res", "alice.json", make_result("alice"))
    write(tmp_path / "res", "bob.json", {"schema": "llm-efficiency-lab/result/v1"})
    assert cli("feedback", str(tmp_path / "res"), "--out", str(tmp_path / "pages"), "--no-plot") == 3  # bob skipped
    assert [p.name for p in (tmp_path / "pages").iterdir()] == ["alice.html"]
    assert "skipped bob.json: does not match the result schema" in capsys.readouterr().err
    assert cli("feedback", str(tmp_path / "res" / "bob.json")) == 2
    assert "bob.json: does not match the result schema (`grader schema result`) at (top level)" in capsys.readouterr().err
    monkeypatch.chdir(ROOT)
    assert cli("gradescope-bundle", "--out", str(tmp_path / "ag.zip"), "-e", "online_softmax") == 0
    said = " ".join(capsys.readouterr().err.split())
    assert "grades online_softmax, all tests" in said and "it fits Gradescope's default memory (768 MiB" in said, said
    assert cli("gradescope-bundle", "--out", str(tmp_path / "ring.zip"), "-e", "ring_allreduce") == 0
    needs = COURSE.exercise("ring_allreduce").memory_mb
    assert f"set the assignment's autograder memory to at least {needs} MiB" in " ".join(
        capsys.readouterr().err.split()), "the bundle says the memory an assignment that does not fit needs"
    with zipfile.ZipFile(tmp_path / "ag.zip") as zf:
        assert json.loads(zf.read("autograder.json"))["exercises"] == ["online_softmax"]


def test_bundle_refuses_a_file_equal_to_a_solution(tmp_path):
    shutil.copy(ROOT / "course.yaml", tmp_path / "course.yaml")
    (tmp_path / "solutions" / "online_softmax").mkdir(parents=True)
    (tmp_path / "exercises" / "online_softmax").mkdir(parents=True)
    source = (ROOT / "solutions" / "online_softmax" / "online_softmax.py").read_bytes()
    (tmp_path / "solutions" / "online_softmax" / "online_softmax.py").write_bytes(source)
    (tmp_path / "exercises" / "online_softmax" / "online_softmax.py").write_bytes(source)
    from grader.export.load import ExportError

    with pytest.raises(ExportError, match="exercises/online_softmax/online_softmax.py has the same bytes as "
                                          "solutions/online_softmax/online_softmax.py"):
        build_bundle(tmp_path, tmp_path / "a.zip", COURSE)
    assert not (tmp_path / "a.zip").exists()
    with pytest.raises(ExportError, match=r"unknown exercise 'nope'; expected one of \['online_softmax'"):
        build_bundle(ROOT, tmp_path / "b.zip", COURSE, ["nope"])


def run_autograder(root: Path, submission: bytes) -> subprocess.CompletedProcess:
    """Gradescope's run, in a temporary /autograder: unzip the bundle, copy run_autograder, grade."""
    bundle = root.parent / "autograder.zip"
    build_bundle(ROOT, bundle, COURSE, ["online_softmax"], "public")
    with zipfile.ZipFile(bundle) as zf:
        zf.extractall(root / "source")
    shutil.copy(root / "source" / "run_autograder", root / "run_autograder")
    os.chmod(root / "run_autograder", stat.S_IRWXU)
    (root / "submission").mkdir()
    (root / "submission" / "online_softmax.py").write_bytes(submission)
    (root / "submission_metadata.json").write_text(json.dumps({"id": 4242, "users": [{"name": "Ada"}]}))
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "GRADER_PYTHON": sys.executable, "GRADER_USER": "nobody"}
    return subprocess.run([str(root / "run_autograder")], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600, check=False)


@pytest.fixture(scope="module")
def gradescope_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("gs") / "autograder"
    return root, run_autograder(root, (ROOT / "solutions" / "online_softmax" / "online_softmax.py").read_bytes())


def test_run_autograder_grades_the_submission_into_results_json(gradescope_run):
    root, run = gradescope_run
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = json.loads((root / "results" / "results.json").read_text())
    jsonschema.validate(out, schema("gradescope_results"))
    canonical = json.loads((root / "results" / "result.json").read_text())
    R.validate(canonical)
    assert canonical["submission"]["id"] == "gradescope-4242" and canonical["state"] == "complete"
    public = [t for t in out["tests"] if "public" in t["tags"]]
    assert [t["status"] for t in public] == ["passed"] * 5 and sum(t["score"] for t in public) == 22
    # Public tests only: the hidden checks never ran, so they score 0 (triton_speed too: it is hidden).
    assert out["score"] == canonical["score"] == 22
    # the hidden checks are listed (withheld until published), so the visible headline holds no total
    assert "Score:" not in out["output"] and f"Seed: {canonical['seed']}" in out["output"]


def test_run_autograder_runs_the_student_code_as_another_user(tmp_path):
    # The submission reports who imports it: on Gradescope run_autograder runs as root, and the worker
    # that imports student code must not (the grader drops it to GRADER_USER, here nobody).
    probe = b"import os\nraise RuntimeError(f'worker euid={os.geteuid()} egid={os.getegid()}')\n"
    run = run_autograder(tmp_path / "autograder", probe)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = json.loads((tmp_path / "autograder" / "results" / "results.json").read_text())
    jsonschema.validate(out, schema("gradescope_results"))
    seen = {m for t in out["tests"] for m in re.findall(r"worker euid=(\d+)", t["output"])}  # not the source line
    assert seen, "expected the probe's RuntimeError in some check's output; got:\n" + out["tests"][0]["output"]
    import pwd

    expected = pwd.getpwnam("nobody").pw_uid if os.geteuid() == 0 else os.geteuid()  # only root can drop
    assert seen == {str(expected)}, f"student code ran as uid {seen}, expected {expected} (nobody)"
    assert out["score"] == 0 and all(t["status"] == "failed" for t in out["tests"] if "public" in t["tags"])


def grader_failed(student: str) -> dict:
    """online_softmax graded (some points), then the grading machine failed on paged_kv: an error of the grade."""
    r = make_result(student, complete=False)
    R.close_exercise(r, "online_softmax")
    R.grader_failure(r, "paged_kv", "the grader's test process for paged_kv stopped before it finished: SIGKILL")
    R.finish(r)
    R.validate(r)
    assert r["score"] > 0 and R.failed_by_grader(r), "the case holds points that must not be posted"
    return r


def test_a_grade_the_grader_failed_on_is_posted_nowhere_as_a_score(tmp_path, capsys):
    """Its partial points are no verdict: Gradescope and the CSV gradebook write nothing for that student (exit
    1, the student named), PrairieLearn answers gradable false (no attempt charged), nbgrader writes nothing."""
    write(tmp_path / "res", "alice.json", make_result("alice"))
    write(tmp_path / "res", "erin.json", grader_failed("erin"))
    assert cli("export", str(tmp_path / "res"), "--format", "gradescope", "--out", str(tmp_path / "gs")) == 1
    err = capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "gs").iterdir()) == ["alice"], "nothing is written for erin"
    assert re.search(r"not exported \S*erin.json: its gradescope results.json: the grade failed on the grader's side "
                     r"\(the grader's test process for paged_kv stopped", err), err
    assert cli("export", str(tmp_path / "res"), "--format", "csv", "--out", str(tmp_path / "grades.csv")) == 1
    rows = list(csv.DictReader((tmp_path / "grades.csv").read_text().splitlines()))
    assert [r["student"] for r in rows] == ["alice"], f"no row of partial points for erin: {rows}"
    assert "erin" in capsys.readouterr().err
    pl = to_prairielearn(grader_failed("erin"))
    assert pl["gradable"] is False and "score" not in pl, pl
    assert any("paged_kv stopped before it finished" in e for e in pl["format_errors"]), pl


def _gradescope_tree(root: Path) -> Path:
    build_bundle(ROOT, root.parent / "autograder.zip", COURSE, ["ring_allreduce"], "all")
    with zipfile.ZipFile(root.parent / "autograder.zip") as zf:
        zf.extractall(root / "source")
    (root / "submission").mkdir()
    (root / "results").mkdir()
    (root / "results" / "results.json").write_text("{}")  # an earlier run's: it must not stand as this one's
    return root


def test_run_autograder_refuses_up_front_with_the_memory_to_set(tmp_path, monkeypatch, capsys):
    from grader.export import gradescope_run
    from grader.harness import cgroup

    root = _gradescope_tree(tmp_path / "autograder")
    monkeypatch.setattr(cgroup, "memory_limit_mb", lambda: 768)
    monkeypatch.delenv("GRADER_IGNORE_MEMORY", raising=False)
    graded = []
    monkeypatch.setattr("grader.runner.grade", lambda *a, **k: graded.append(a))
    needs = gradescope_run.memory_needed_mb(COURSE, ["ring_allreduce"])
    assert needs > 768, "ring_allreduce's measured peak is above Gradescope's default"
    assert gradescope_run.run(root) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert not graded, "nothing is graded when the container is too small for the assignment"
    assert not (root / "results" / "results.json").exists(), "a failed run leaves no results.json: no score posted"
    assert (f"this autograder container allows 768 MiB of memory, and this assignment needs about {needs} MiB "
            f"(its largest exercise's measured peak): set the assignment's autograder memory to at least {needs} "
            "MiB") in out, out


def test_run_autograder_posts_no_partial_score_when_the_grader_fails(tmp_path, monkeypatch, capsys):
    from grader.export import gradescope_run

    root = _gradescope_tree(tmp_path / "autograder")
    monkeypatch.setenv("GRADER_IGNORE_MEMORY", "1")
    monkeypatch.setenv("GRADER_USER", "nobody")  # an account this machine has (setup.sh makes 'student')
    monkeypatch.setattr("grader.runner.grade", lambda *a, **k: grader_failed("erin"))
    assert gradescope_run.run(root) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert not (root / "results" / "results.json").exists(), "a failed run leaves no results.json: no score posted"
    assert "The autograder failed, not the submission: the grade failed on the grader's side" in out, out


@pytest.mark.skipif(os.geteuid() != 0, reason="the account is looked up only as root, where the worker drops to it")
def test_run_autograder_without_the_student_account_says_so(tmp_path, monkeypatch, capsys):
    """run_autograder before setup.sh made the account 'student': one line naming the account and the way out,
    not "the grader's test process for online_softmax stopped before it finished: it exited with code 3"."""
    from grader.export import gradescope_run

    root = _gradescope_tree(tmp_path / "autograder")
    monkeypatch.setenv("GRADER_IGNORE_MEMORY", "1")
    monkeypatch.setenv("GRADER_USER", "no-such-account-for-the-course")
    graded = []
    monkeypatch.setattr("grader.runner.grade", lambda *a, **k: graded.append(a))
    assert gradescope_run.run(root) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert not graded and not (root / "results" / "results.json").exists(), "nothing graded, no score posted"
    assert ("expected --user 'no-such-account-for-the-course' to name an account on this machine (as root, the "
            "student's code runs as it), found none: create it (the Gradescope bundle's setup.sh creates 'student'), "
            "or use --user auto (GRADER_USER=auto)") in out, out


def test_a_real_result_exports_to_every_format(gradescope_run, tmp_path):
    root, _ = gradescope_run
    shutil.copy(root / "results" / "result.json", tmp_path / "ada.json")
    loaded, skipped = load_results(tmp_path)
    assert not skipped
    rows = list(csv.DictReader(to_csv(loaded, COURSE).splitlines()))
    assert rows[0]["student"] == "ada" and rows[0]["online_softmax"] == "22" and rows[0]["incomplete"] == "no"
    pl = to_prairielearn(loaded[0].result)
    jsonschema.validate(pl, schema("prairielearn_results"))
    assert pl["score"] == pytest.approx(22 / (100 - _cuda_points("online_softmax")), abs=1e-6)
    page = render_feedback(loaded[0].result, COURSE)
    assert page.count('data-status="passed"') >= 4 and "triton_speed" in page


# --------------------------------------------------------------------------------------------------
# PrairieLearn's entry point


def run_prairielearn(grade_root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "GRADE_ROOT": str(grade_root), "GRADER_COURSE_ROOT": str(ROOT),
           "GRADER_EXERCISES": "online_softmax", "GRADER_TESTS": "public"}
    return subprocess.run([sys.executable, "-m", "grader.export.prairielearn_run"], cwd=grade_root, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_prairielearn_entry_point_on_a_fake_grade_tree(tmp_path):
    # No /grade/student at all: ungradable, no attempt charged.
    missing = tmp_path / "missing"
    missing.mkdir()
    run = run_prairielearn(missing)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads((missing / "results" / "results.json").read_text())
    jsonschema.validate(out, schema("prairielearn_results"))
    assert out["gradable"] is False and "no submission at" in out["format_errors"][0]

    # The reference solution in /grade/student: graded, public tests only, score in [0, 1].
    good = tmp_path / "good"
    (good / "student").mkdir(parents=True)
    shutil.copy(ROOT / "solutions" / "online_softmax" / "online_softmax.py", good / "student")
    run = run_prairielearn(good)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads((good / "results" / "results.json").read_text())
    jsonschema.validate(out, schema("prairielearn_results"))
    gradable = 100 - _cuda_points("online_softmax")  # the public tests only, on a host without CUDA
    assert out["gradable"] is True and out["score"] == pytest.approx(22 / gradable, abs=1e-6), out["message"]
    public = [t for t in out["tests"] if t["name"].endswith("_public")]
    assert len(public) == 5 and all(t["points"] == t["max_points"] > 0 for t in public)
    assert f"Score: 22/{gradable:g}" in out["message"] and len(json.dumps(out)) <= 1_000_000
    canonical = json.loads((good / "results" / "result.json").read_text())
    R.validate(canonical)
    assert canonical["submission"]["id"] == "student" and canonical["state"] == "complete"

    # A student folder without the exercise's file: nothing to grade, so no attempt charged; the
    # canonical result still records the exercise as missing.
    empty = tmp_path / "empty"
    (empty / "student").mkdir(parents=True)
    (empty / "student" / "notes.txt").write_text("I ran out of time")
    (empty / "data").mkdir()
    (empty / "data" / "data.json").write_text("{}")
    run = run_prairielearn(empty)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads((empty / "results" / "results.json").read_text())
    jsonschema.validate(out, schema("prairielearn_results"))
    assert out["gradable"] is False
    assert "no file to grade: expected one of ['online_softmax.py']" in out["format_errors"][0]
    assert R.find_exercise(json.loads((empty / "results" / "result.json").read_text()), "online_softmax")["status"] == "missing"


def test_the_documented_info_json_matches_the_image():
    """The README's info.json is what instructors copy: its course root must be where the image installs the
    course, its image the one `make image` builds, its entry point a module that runs."""
    import re

    text = (ROOT / "grader" / "export" / "README.md").read_text()
    info = json.loads(re.search(r"```json\n(\{\n  \"gradingMethod\".*?)\n```", text, re.S).group(1))
    options = info["externalGradingOptions"]
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    installed = re.search(r"^COPY \. (\S+)$", dockerfile, re.M).group(1)
    assert options["environment"]["GRADER_COURSE_ROOT"] == installed, (options, installed)
    assert options["image"] == COURSE.container.image, options["image"]
    module = options["entrypoint"].split()[2]
    assert options["entrypoint"].startswith("python3 -m ") and (ROOT / (module.replace(".", "/") + ".py")).is_file()
    assert options["timeout"] <= 600


def test_prairielearn_a_file_that_does_not_compile_costs_no_attempt(tmp_path):
    bad = tmp_path / "bad"
    (bad / "student").mkdir(parents=True)
    (bad / "student" / "online_softmax.py").write_text("def online_softmax(x:\n    return x\n")
    run = run_prairielearn(bad)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads((bad / "results" / "results.json").read_text())
    jsonschema.validate(out, schema("prairielearn_results"))
    assert out["gradable"] is False, out
    assert out["format_errors"][0].startswith("online_softmax.py does not compile: SyntaxError at line 1"), out


def test_prairielearn_keeps_results_json_when_the_grader_itself_fails(tmp_path):
    """PrairieLearn throws away results.json of a job that exits non-zero: a grader failure must exit 0 with
    its results.json saying not gradable (no attempt charged), never 1."""
    broken = tmp_path / "broken"
    (broken / "student").mkdir(parents=True)
    shutil.copy(ROOT / "solutions" / "online_softmax" / "online_softmax.py", broken / "student")
    env = {**os.environ, "GRADE_ROOT": str(broken), "GRADER_COURSE_ROOT": str(tmp_path / "no-course-here"),
           "GRADER_EXERCISES": "online_softmax", "GRADER_TESTS": "public"}
    run = subprocess.run([sys.executable, "-m", "grader.export.prairielearn_run"], cwd=broken, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads((broken / "results" / "results.json").read_text())
    jsonschema.validate(out, schema("prairielearn_results"))
    assert out["gradable"] is False and "the autograder itself failed" in out["format_errors"][0], out


# Snapshots of every export, pinned to stored files: tests/test_export_snapshots.py


def test_a_student_id_with_control_characters_is_skipped_with_the_reason(tmp_path):
    from grader.export.load import load_results

    (tmp_path / "alice.json").write_text(json.dumps(make_result("alice")))
    (tmp_path / "\x1b[2Jmallory.json").write_text(json.dumps(make_result("mallory")))
    loaded, skipped = load_results(tmp_path)
    assert [item.student for item in loaded] == ["alice"]
    assert len(skipped) == 1 and "without control characters" in skipped[0].reason
