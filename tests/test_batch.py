"""`grader batch`: many submissions graded in parallel, resumably, with a summary; one broken or
hostile submission never stops the batch, and no process outlives it.

Graded on online_softmax's public checks only, with short limits, to keep the file fast: the
reference scores 20/20 there, the stub 0."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from collections import Counter
from pathlib import Path

import pytest
from rich.console import Console

from grader import exitcodes, proctree, results
from grader.options import GradeOptions
from grader.scale import batch, discover, resume
from grader.scale.backend import JobRun
from grader.scale.batch import BatchOptions, run_batch
from grader.scale.errors import BatchError
from grader.scale.local import LocalBackend
from tests.conftest import COURSE, ROOT, checks_of, left_running
from tests.known_wrong import load_mutants

EXERCISE = "online_softmax"
PUBLIC_CHECKS = ["normalizer_public", "merge_public", "softmax_public", "triton_public"]
REFERENCE = (ROOT / "solutions" / EXERCISE / f"{EXERCISE}.py").read_text()
STUB = (ROOT / "exercises" / EXERCISE / f"{EXERCISE}.py").read_text()
# These tests look for their own leftover processes by name: run them in one process, one at a time.
pytestmark = pytest.mark.xdist_group("batch")

SLEEP_MARK = "4271"  # the hostile submission's orphan: `sleep 4271` (test_hostile.py uses 4242)


def fast_options(**overrides) -> GradeOptions:
    return GradeOptions(**{"exercises": [EXERCISE], "seed": 1234, "tests": "public", "checks": PUBLIC_CHECKS,
                           "call_timeout_s": 20, "time_limit_s": 120, **overrides})


def quiet() -> Console:
    return Console(file=io.StringIO(), width=200)


def batch_run(subs: Path, out: Path, backend=None, console=None, **options) -> batch.BatchReport:
    grade = options.pop("grade", None) or fast_options()
    return run_batch(COURSE, ROOT, BatchOptions(subs, out, grade=grade, **{"jobs": 2, **options}),
                     backend=backend, console=console or quiet())


def result_of(out: Path, sub_id: str) -> dict:
    return json.loads((out / f"{sub_id}.json").read_text())


def messages(result: dict) -> str:
    return "\n".join(t["message"] for c in checks_of(result, EXERCISE).values() for t in c["tests"])


def write_zip(path: Path, members: dict[str, str]) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in members.items():
            zf.writestr(name, text)


def write_tar_gz(path: Path, members: dict[str, str]) -> None:
    with tarfile.open(path, "w:gz") as tf:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def hostile_source(subs: Path, out: Path) -> str:
    """tests/hostile/outlives_grade.py (an orphan process in a session of its own), which also tries
    to read another student's submission and the batch's results folder."""
    source = (ROOT / "tests" / "hostile" / "outlives_grade.py").read_text()
    assert '"4242"' in source and "raise NotImplementedError" in source
    source = source.replace('"4242"', f'"{SLEEP_MARK}"').replace("raise NotImplementedError", "raise RuntimeError(PEEK)")
    popen = next(line for line in source.splitlines() if line.startswith("subprocess.Popen("))
    # The worker's lock refuses the orphan where the exercise's drivers do not spawn: go on to the peeks.
    source = source.replace(popen, f"try:\n    {popen}\nexcept PermissionError:\n    pass")
    targets = [str(subs / "reference" / f"{EXERCISE}.py"), str(out / resume.STATE_FILE)]
    return source + (
        "\n\ndef _peek(path):\n"
        "    try:\n"
        "        return f'READ {path}: {len(open(path).read())} characters'\n"
        "    except OSError as exc:\n"
        "        return f'blocked {path}: {type(exc).__name__}'\n\n\n"
        f"PEEK = '; '.join(_peek(p) for p in {targets!r})\n"
    )


def sleepers(mark: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", f"sleep {mark}"], capture_output=True, text=True).stdout.split()


def kill_and_report(pids: list[str]) -> None:
    for pid in pids:  # clean up before failing, so one failure does not leak into the next run
        subprocess.run(["kill", "-9", pid])


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Six submissions, one of each kind, graded with --jobs 2."""
    base = tmp_path_factory.mktemp("batch")
    subs, out = base / "submissions", base / "results"
    subs.mkdir()
    (subs / "reference").mkdir()
    (subs / "reference" / f"{EXERCISE}.py").write_text(REFERENCE)
    write_tar_gz(subs / "stub.tar.gz", {f"exercises/{EXERCISE}/{EXERCISE}.py": STUB})
    mutant = next(m for m in load_mutants(EXERCISE) if m.name == "no_rescale")
    write_zip(subs / "wrong.zip", {f"wrong-hw/{EXERCISE}.py": mutant.apply(REFERENCE)})
    (subs / "broken.zip").write_bytes(b"this is not a zip archive")
    (subs / "hostile").mkdir()
    (subs / "hostile" / f"{EXERCISE}.py").write_text(hostile_source(subs, out))
    (subs / "missing").mkdir()
    (subs / "missing" / "notes.txt").write_text("I forgot the file")
    console = quiet()
    started = time.monotonic()
    report = batch_run(subs, out, console=console)
    return {"subs": subs, "out": out, "report": report, "console": console.file.getvalue(),
            "wall_s": time.monotonic() - started, "mutant": mutant}


IDS = ["broken", "hostile", "missing", "reference", "stub", "wrong"]


def test_every_submission_gets_an_honest_result(graded):
    out, report = graded["out"], graded["report"]
    assert sorted(report.graded) == IDS and report.skipped == [] and report.internal_errors == []
    for sub_id in IDS:
        result = result_of(out, sub_id)
        results.validate(result)
        assert result["state"] == "complete", f"{sub_id}: expected a complete result, found {result['state']!r}"
        assert result["submission"]["id"] == sub_id
    reference, stub, wrong = (result_of(out, i) for i in ("reference", "stub", "wrong"))
    assert (reference["score"], reference["gradable_max_score"]) == (20, 20)
    assert stub["score"] == 0 and stub["gradable"] is True
    lost = {c["id"] for c in checks_of(wrong, EXERCISE).values() if c["points"] < c["max_points"] and c["status"] != "not_graded"}
    assert {"normalizer_public", "merge_public"} <= lost and "triton_public" not in lost, lost
    assert 0 < wrong["score"] < 20


def test_broken_and_missing_submissions_say_why(graded):
    broken, missing = result_of(graded["out"], "broken"), result_of(graded["out"], "missing")
    assert broken["gradable"] is False
    assert "not a readable archive" in broken["format_errors"][0]
    assert missing["exercises"][0]["status"] == "missing"
    assert f"expected a file named {EXERCISE}.py" in missing["exercises"][0]["message"]
    listed = {s["id"]: s["reason"] for s in json.loads((graded["out"] / "summary.json").read_text())["not_gradable"]}
    assert set(listed) == {"broken", "missing"}
    assert "not a readable archive" in listed["broken"] and f"{EXERCISE}.py" in listed["missing"]


def test_hostile_submission_scores_zero_and_leaves_nothing_behind(graded):
    hostile = result_of(graded["out"], "hostile")
    assert hostile["score"] == 0 and len([t for c in checks_of(hostile, EXERCISE).values() for t in c["tests"]]) >= 10
    left = sleepers(SLEEP_MARK)
    kill_and_report(left)
    assert not left, "a process started by a submission outlived the batch"
    assert left_running() == [], "the batch left grading processes running"
    if os.geteuid() == 0:  # the worker's mount namespace hides the other submissions and the results
        text = messages(hostile)
        assert "READ " not in text, f"the worker read another submission or the results: {text[:400]}"
        assert text.count("blocked") >= 2, text[:400]


def test_summary_and_histogram_hold_the_numbers(graded):
    out = graded["out"]
    summary = json.loads((out / "summary.json").read_text())
    scores = {i: result_of(out, i)["score"] for i in ("reference", "stub", "wrong", "hostile")}
    ex = summary["exercises"][0]
    assert (summary["submissions"], summary["graded"], ex["graded"]) == (6, 4, 4)
    assert ex["mean"] == pytest.approx(statistics.fmean(scores.values()), abs=1e-3)
    assert ex["median"] == pytest.approx(statistics.median(scores.values()), abs=1e-3)
    assert (ex["full_marks"], ex["max"], ex["min"], ex["gradable_max_score"]) == (1, 20, 0, 20)
    failed = {f["check"]: f["failed"] for f in ex["most_failed"]}
    lost = Counter(check_id for i in scores for check_id, c in checks_of(result_of(out, i), EXERCISE).items()
                   if c["status"] != "not_graded" and c["points"] < c["max_points"])
    assert failed == dict(lost) and failed["normalizer_public"] == failed["merge_public"] == 3  # stub, wrong, hostile
    assert [f["failed"] for f in ex["most_failed"]] == sorted(failed.values(), reverse=True)
    top = ex["most_failed"][0]
    assert top["message"] and 1 <= top["with_this_message"] <= top["failed"]
    assert summary["internal_error"] == [] and summary["unfinished"] == []
    # percent of gradable points: reference 100, stub 0, hostile 0, wrong in between
    counts = summary["total"]["histogram"]["counts"]
    assert sum(counts) == 4 and counts[0] == 2 and counts[-1] == 1
    assert counts[int(scores["wrong"] / 20 * 10)] == 1
    png = out / "scores.png"
    assert summary["histogram_png"] == "scores.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    assert matplotlib.image.imread(png).shape[0] > 100
    printed = graded["console"]
    assert "batch summary: 4 graded of 6 submissions" in printed and "most-failed checks" in printed
    assert "broken" in printed and "not a readable archive" in printed


def test_a_rerun_grades_nothing(graded):
    out = graded["out"]
    before = {p.name: p.read_bytes() for p in out.glob("*.json") if p.name != "summary.json"}
    report = batch_run(graded["subs"], out)
    assert report.graded == [] and sorted(report.skipped) == IDS, report.why
    assert {p.name: p.read_bytes() for p in out.glob("*.json") if p.name != "summary.json"} == before


def test_a_changed_submission_and_a_half_written_result_are_regraded_alone(graded):
    subs, out = graded["subs"], graded["out"]
    write_zip(subs / "wrong.zip", {f"wrong-hw/{EXERCISE}.py": REFERENCE})  # the student fixed the bug
    killed = result_of(out, "missing")
    killed.update(state="running", finished_at=None)  # as a grade killed half-way leaves it
    results.write_atomic(out / "missing.json", killed)
    kept = {i: (out / f"{i}.json").read_bytes() for i in ("reference", "stub", "hostile", "broken")}
    report = batch_run(subs, out)
    assert sorted(report.graded) == ["missing", "wrong"], report.why
    assert report.why == {"missing": "the last grade did not finish", "wrong": "the submission changed"}
    assert result_of(out, "wrong")["score"] == 20 and result_of(out, "missing")["state"] == "complete"
    assert {i: (out / f"{i}.json").read_bytes() for i in kept} == kept


def test_only_regrades_the_named_submissions(graded):
    out = graded["out"]
    before = result_of(out, "broken")["started_at"], (out / "stub.json").read_bytes()
    time.sleep(1.1)  # started_at has one-second resolution
    report = batch_run(graded["subs"], out, only=["broken"])
    assert report.graded == ["broken"] and report.why == {"broken": "--only"}
    assert result_of(out, "broken")["started_at"] != before[0]
    assert (out / "stub.json").read_bytes() == before[1]
    with pytest.raises(BatchError, match=r"--only names 'nobody'.*expected one of \['broken'"):
        batch_run(graded["subs"], out, only=["nobody"])


def test_the_batch_ran_two_lanes_and_stayed_fast(graded):
    assert graded["report"].summary["run"]["lanes"] == 2
    # 4 submissions reach pytest, about 6-12 s each on this 2-core machine. Generous: it is shared.
    assert graded["wall_s"] < 90, f"grading the batch took {graded['wall_s']:.0f} s"


# --- Cheap submissions (nothing reaches pytest): the CLI, --regrade, options, failures of the grader


def cheap_batch(folder: Path) -> Path:
    subs = folder / "submissions"
    subs.mkdir(parents=True)
    (subs / "ann.tgz").write_bytes(b"\x1f\x8b not really gzip")
    (subs / "ben").mkdir()
    (subs / "ben" / "README.md").write_text("no code here")
    return subs


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grader.scale.batch", "batch", *args], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "COLUMNS": "160"}, timeout=300)


def test_cli_resumes_regrades_and_notices_changed_options(tmp_path):
    subs, out = cheap_batch(tmp_path), tmp_path / "results"
    common = [str(subs), "--out", str(out), "-e", EXERCISE, "--tests", "public", "--jobs", "2"]
    runs = []
    for extra in ([], [], ["--call-timeout", "9"], ["--call-timeout", "9", "--regrade"]):
        run = cli(*common, *extra)
        assert run.returncode == exitcodes.NEEDS_ATTENTION, (
            "both submissions are not gradable: the batch finishes and exits 3 (students to chase)\n"
            + run.stdout + run.stderr)
        runs.append(json.loads((out / "summary.json").read_text())["run"])
    assert [sorted(r["graded"]) for r in runs] == [["ann", "ben"], [], ["ann", "ben"], ["ann", "ben"]]
    assert runs[2]["why"]["ann"] == "graded with other options or another backend"
    assert set(runs[3]["why"].values()) == {"--regrade"}
    assert "ann: not gradable" in run.stdout and "not a readable archive" in run.stdout


def test_cli_takes_folders_relative_to_where_it_runs(tmp_path):
    """`grader batch subs --out results` from the folder holding them: every grade once failed with "no
    submission at subs/ann" (the grading child runs elsewhere)."""
    (tmp_path / "subs" / "ann").mkdir(parents=True)
    (tmp_path / "subs" / "ann" / f"{EXERCISE}.py").write_text("x = 1\n")
    run = subprocess.run([sys.executable, "-m", "grader.scale.batch", "batch", "subs", "--out", "results", "-e", EXERCISE,
                          "--tests", "public", "--check", "normalizer_public"], cwd=tmp_path, capture_output=True,
                         text=True, env={**os.environ, "COLUMNS": "160", "GRADER_COURSE_ROOT": str(ROOT)}, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    result = result_of(tmp_path / "results", "ann")
    assert result["state"] == "complete", result.get("errors")


def test_cli_bad_input_exits_2_with_a_message(tmp_path, capsys):
    parser = __import__("argparse").ArgumentParser()
    batch.add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["batch", str(tmp_path / "nowhere"), "--out", str(tmp_path / "r"), "--jobs", "3",
                              "--gpus", "0,1", "--only", "a", "b", "--seed", "7", "-e", EXERCISE, "--regrade"])
    assert (args.jobs, args.gpus, args.only, args.seed, args.exercise, args.regrade) == (3, "0,1", ["a", "b"], 7, [EXERCISE], True)
    assert args.fn(args) == 2
    assert "expected a folder of submissions" in capsys.readouterr().err


def test_conflicting_ids(tmp_path):
    subs = tmp_path / "subs"
    (subs / "alice").mkdir(parents=True)
    (subs / "alice.zip").write_bytes(b"PK")
    report = batch_run(subs, tmp_path / "out")
    alice = result_of(tmp_path / "out", "alice")
    assert report.graded == [] and alice["gradable"] is False
    assert "found 2: alice, alice.zip" in alice["format_errors"][0]


@pytest.mark.parametrize("natural, why", [
    ("summary", "the batch's own summary.json"),
    ("SUMMARY", "summary.json on a case-insensitive file system"),
    ("s" * 250, "too long for <id>.json and its temporary file"),
    ("tab\there", "a control character"),
    ("bad-\udcff-bytes", "bytes that are not UTF-8"),
])
def test_an_id_that_cannot_name_a_result_file_gets_a_stable_one_that_can(natural, why):
    safe = discover.safe_id(natural)
    assert safe != natural and safe == discover.safe_id(natural), f"{why}: expected a stable replacement, found {safe!r}"
    assert safe.isprintable() and len(safe.encode()) <= discover.MAX_ID_BYTES and safe.lower() != "summary", safe
    assert discover.safe_id(natural + "x") != safe, "two names must not share a replacement"


def test_names_the_batch_cannot_use_are_graded_under_safe_ids_and_the_batch_goes_on(tmp_path):
    """A submission called `summary` used to refuse the whole batch, and one whose name is too long for
    a file name was an internal error on every rerun; names starting with a dot were skipped silently."""
    subs, out = tmp_path / "subs", tmp_path / "out"
    long_name = "student-" + "x" * 240
    for name in ("summary", long_name):
        (subs / name).mkdir(parents=True)
        (subs / name / f"{EXERCISE}.py").write_text(STUB)
    (subs / ".DS_Store").write_text("")
    console = quiet()
    report = batch_run(subs, out, console=console, jobs=1)
    printed = console.file.getvalue()
    assert len(report.graded) == 2 and report.internal_errors == [], report
    for natural in ("summary", long_name):
        safe = discover.safe_id(natural)
        result = result_of(out, safe)
        assert result["state"] == "complete" and result["gradable"] is True and result["score"] == 0, result
        assert f"is graded as {safe!r}" in printed, printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["submissions"] == 2, "summary.json must be the batch's summary, not a submission's result"
    assert "'.DS_Store'" in printed and "skipped" in printed, printed


def test_ids_that_differ_only_in_letter_case_get_result_files_of_their_own(tmp_path):
    """"Bob" and "bob" would share one result file on a case-insensitive file system (macOS, Windows)."""
    for name in ("Bob", "bob", "carol"):
        (tmp_path / name).mkdir()
    entries, conflicts = discover.discover(tmp_path)
    ids = sorted(e.id for e in entries)
    assert not conflicts and len({i.casefold() for i in ids}) == 3, ids
    assert "carol" in ids and all(i.startswith(("Bob~", "bob~")) for i in ids if i != "carol"), ids
    assert [e.id for e in discover.discover(tmp_path)[0]] == [e.id for e in entries], "the ids must be stable"
    lines = discover.describe_entries(tmp_path, entries)
    assert sum("but for letter case" in line for line in lines) == 2, lines


class FlakyBackend(LocalBackend):
    """The local backend, except that grading the submission `boom` raises (a bug in the grader)."""

    def open_slot(self, gpu):
        slot = super().open_slot(gpu)
        real = slot.grade

        def grade(job):
            if job.id == "boom":
                raise RuntimeError("grader bug on purpose")
            return real(job)

        slot.grade = grade
        return slot


def test_an_exception_in_the_grader_writes_a_result_and_the_batch_goes_on(tmp_path):
    subs, out = cheap_batch(tmp_path), tmp_path / "results"
    (subs / "boom.zip").write_bytes(b"not a zip either")
    report = batch_run(subs, out, backend=FlakyBackend(ROOT))
    assert report.internal_errors == ["boom"] and sorted(report.graded) == ["ann", "ben", "boom"]
    boom = result_of(out, "boom")
    results.validate(boom)
    assert boom["gradable"] is False and boom["state"] == "running"
    assert boom["failure"]["by"] == "grader" and "RuntimeError: grader bug on purpose" in boom["failure"]["reason"]
    assert boom["format_errors"][0].startswith(results.INTERNAL_ERROR) and boom["failure"]["retry"] == batch.RETRY
    here = bool(boom["device"]["gpu"])  # a host without CUDA grades no CUDA check, for anyone
    assert all(c["status"] == "error" and "grader bug" in c["message"]
               for c in checks_of(boom, EXERCISE).values() if here or not c["cuda"])
    summary = json.loads((out / "summary.json").read_text())
    assert [s["id"] for s in summary["internal_error"]] == ["boom"]
    again = batch_run(subs, out)  # the next run retries it, and only it
    assert again.graded == ["boom"] and again.why["boom"] == "the last grade did not finish"
    assert "not a readable archive" in result_of(out, "boom")["format_errors"][0]


HANGS = f"""
import subprocess, time
subprocess.Popen(["sleep", "{int(SLEEP_MARK) + 1}"], start_new_session=True)
time.sleep(600)
"""


def test_a_hung_grader_is_killed_with_everything_it_started(tmp_path):
    subs, out = cheap_batch(tmp_path), tmp_path / "results"
    report = batch_run(subs, out, backend=LocalBackend(ROOT, [sys.executable, "-c", HANGS]), job_timeout_s=4)
    left = sleepers(str(int(SLEEP_MARK) + 1))
    kill_and_report(left)
    assert not left, "a process started under a hung grading process survived the batch"
    assert sorted(report.internal_errors) == ["ann", "ben"]
    assert "did not finish within the submission's budget of 4 s" in result_of(out, "ann")["format_errors"][0]
    assert left_running() == []


def test_a_dying_grading_process_is_reported(tmp_path):
    subs, out = cheap_batch(tmp_path), tmp_path / "results"
    dies = "import sys; sys.stdin.readline(); sys.stderr.write('exploded on purpose\\n'); sys.exit(3)"
    report = batch_run(subs, out, backend=LocalBackend(ROOT, [sys.executable, "-c", dies]), jobs=1)
    assert sorted(report.internal_errors) == ["ann", "ben"]
    assert "the grading process died (exit code 3): exploded on purpose" in result_of(out, "ben")["format_errors"][0]


RECORDS_GPU = """
import json, os, sys
for line in sys.stdin:
    out = json.loads(line)["out"]
    open(out + ".gpu", "w").write(os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
    print(json.dumps({"ok": True}), flush=True)
"""


def test_each_lane_pins_one_gpu_for_everything_it_starts(tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "results"
    for i in range(6):
        (subs / f"s{i}").mkdir(parents=True)
    report = batch_run(subs, out, backend=LocalBackend(ROOT, [sys.executable, "-c", RECORDS_GPU]), jobs=4,
                       gpus=["0", "1"])
    seen = {p.name: p.read_text() for p in out.glob("*.gpu")}
    assert len(seen) == 6 and set(seen.values()) <= {"0", "1"}, seen
    assert report.summary["run"]["lanes"] == 2
    # the stand-in grader writes no result: each submission says so, and is retried next time
    assert "without writing a complete result" in result_of(out, "s0")["format_errors"][0]


class TimedBackend:
    """In-process: records when each submission was graded on which GPU, and writes a real result."""

    name = "timed"

    def __init__(self):
        self.spans: list[tuple[str, str, float, float]] = []
        self.lock = threading.Lock()

    def fingerprint(self):
        return self.name

    def stop(self):
        pass

    def open_slot(self, gpu):
        backend = self

        class Slot:
            def grade(self, job):
                start = time.monotonic()
                time.sleep(0.3)
                result = results.new_result(COURSE, job.id, "", "", 0, "sandbox", [COURSE.exercise(EXERCISE)])
                results.close_exercise(result, EXERCISE)
                results.finish(result)
                results.write_atomic(job.out, result)
                with backend.lock:
                    backend.spans.append((job.id, gpu, start, time.monotonic()))
                return JobRun()

            def close(self):
                pass

        return Slot()


def test_jobs_beyond_the_gpus_queue(tmp_path):
    subs = tmp_path / "subs"
    for i in range(6):
        (subs / f"s{i}").mkdir(parents=True)
    backend = TimedBackend()
    batch_run(subs, tmp_path / "out", backend=backend, jobs=5, gpus=["3", "5"])
    spans = backend.spans
    assert len(spans) == 6 and {g for _, g, _, _ in spans} <= {"3", "5"}
    for i, (_, gpu_a, start_a, end_a) in enumerate(spans):
        for _, gpu_b, start_b, end_b in spans[i + 1:]:
            overlap = start_a < end_b and start_b < end_a
            assert not (overlap and gpu_a == gpu_b), "two submissions were graded on one GPU at once"
    busiest = max(sum(s < t < e for _, _, s, e in spans) for t in [s + 0.01 for _, _, s, _ in spans])
    assert busiest == 2, f"expected 2 submissions at once (one per GPU), found at most {busiest}"


def test_no_process_is_left_running():
    assert left_running() == []
    assert shutil.which("pgrep") is None or not sleepers(SLEEP_MARK)


INTERRUPTED_BATCH = """
import json, os, sys
from pathlib import Path
from grader.scale.local import LocalBackend
from tests.conftest import left_running
from tests.test_batch import HANGS, ROOT, batch_run
report = batch_run(Path(sys.argv[1]), Path(sys.argv[2]), backend=LocalBackend(ROOT, [sys.executable, "-c", HANGS]))
print(json.dumps({"interrupted": report.interrupted, "no_result": [s["id"] for s in report.summary["no_result"]],
                  "left_running": left_running()}))
"""


def test_ctrl_c_stops_every_grade_and_writes_no_false_verdict(tmp_path):
    # The batch runs in its own process group and gets SIGINT as a terminal's Ctrl-C delivers it,
    # once both lanes' grading processes are up (each has started its `sleep`), not after a fixed
    # delay: on a loaded machine the batch may not have started them yet.
    subs, out = cheap_batch(tmp_path), tmp_path / "results"
    mark = str(int(SLEEP_MARK) + 1)
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPTED_BATCH, str(subs), str(out)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(sleepers(mark)) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None, f"the batch ended before it was interrupted: {proc.communicate()}"
        assert len(sleepers(mark)) >= 2, "the two grading processes did not start within 120 s"
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    left = sleepers(mark)
    kill_and_report(left)
    assert proc.returncode == 0, f"the batch did not handle Ctrl-C (exit {proc.returncode}):\n{stderr[-2000:]}"
    report = json.loads(stdout.strip().splitlines()[-1])
    assert report["interrupted"], report
    assert not left and report["left_running"] == [], f"processes outlived the interrupted batch: {left or report}"
    assert not (out / "ann.json").exists() and not (out / "ben.json").exists(), "an interrupted grade must not be given a verdict"
    assert report["no_result"] == ["ann", "ben"]


KILLED_BATCH = """
import sys
from pathlib import Path
from tests.test_batch import batch_run
batch_run(Path(sys.argv[1]), Path(sys.argv[2]))
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_a_killed_batch_takes_every_grading_process_with_it(tmp_path):
    # SIGKILL gives the batch no chance to clean up: its grading process, that process's pytest and
    # the sandboxed worker must die by themselves (the kernel's parent-death signal), or they would
    # go on grading for nobody and could write a verdict for a batch that was stopped.
    subs, out = tmp_path / "submissions", tmp_path / "results"
    (subs / "slow").mkdir(parents=True)
    (subs / "slow" / f"{EXERCISE}.py").write_text(
        REFERENCE + "\n\nimport time\n\n\ndef online_normalizer(chunks):\n    time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_BATCH, str(subs), str(out)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        # The serve process, its pytest, and the worker's launcher: a grade is under way.
        while len(proctree.descendants(proc.pid)) < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        time.sleep(2)
        running = proctree.descendants(proc.pid)
        assert len(running) >= 3, f"the grade did not get under way within 120 s: {running}"
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 30
        while any(alive(p) for p in running) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [p for p in running if alive(p)]
    finally:
        if proc.poll() is None:
            proc.kill()
    kill_and_report([str(p) for p in left])
    assert left == [], "grading processes outlived the batch that was SIGKILLed"
    result = results.read_result(out / "slow.json")
    assert result is None or result["state"] != "complete", "a killed grade must not end with a verdict"


def test_parallel_jobs_refuse_a_shared_identity_unless_accepted(tmp_path):
    """--jobs > 1 grades classmates at once: refused where their workers would share an identity."""
    subs = tmp_path / "subs"
    (subs / "a").mkdir(parents=True)
    (subs / "a" / f"{EXERCISE}.py").write_text("x = 1\n")
    shared = fast_options(user="nobody") if os.geteuid() == 0 else fast_options(isolate=False)
    with pytest.raises(BatchError, match=r"--jobs 2 would grade submissions at once while .*--allow-shared-identity"):
        batch_run(subs, tmp_path / "out", grade=shared)
    assert not (tmp_path / "out" / "a.json").exists(), "nothing is graded when the batch refuses"
    report = batch_run(subs, tmp_path / "out2", grade=shared, allow_shared_identity=True)
    assert report.graded == ["a"]


def test_a_submission_that_is_a_symbolic_link_is_refused_not_followed(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "mallory").symlink_to(ROOT / "solutions")  # unpacked from an LMS download, say
    report = batch_run(subs, tmp_path / "out", jobs=1)
    result = result_of(tmp_path / "out", "mallory")
    assert result["gradable"] is False and result["score"] == 0, result["score"]
    assert "found a symbolic link" in result["format_errors"][0] and "never followed" in result["format_errors"][0]
    assert report.graded == [] or "mallory" not in report.graded


def test_a_regrade_draws_the_same_hidden_inputs_unless_a_new_seed_is_asked_for(tmp_path):
    subs, out = tmp_path / "submissions", tmp_path / "results"
    for name in ("ann", "ben"):
        (subs / name).mkdir(parents=True)
        (subs / name / f"{EXERCISE}.py").write_text(REFERENCE)
    grade = fast_options(seed=None, checks=["normalizer_public"])  # no --seed: the batch keeps a secret one
    batch_run(subs, out, grade=grade)
    first = {s: result_of(out, s)["seed"] for s in ("ann", "ben")}
    assert first["ann"] != first["ben"], "each student's hidden inputs should differ"
    assert resume.load_seed(out) is not None, "the batch's secret seed must be kept in its state"
    batch_run(subs, out, grade=grade, only=["ann"])
    assert result_of(out, "ann")["seed"] == first["ann"], (
        "a regrade must draw the same inputs as the first grade, or a partially wrong submission's score moves")
    batch_run(subs, out, grade=grade, only=["ann"], new_seed=True)
    assert result_of(out, "ann")["seed"] != first["ann"], "--new-seed must draw new inputs"
