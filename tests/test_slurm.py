"""`grader slurm`: a folder of submissions graded as a Slurm job array, on a real one-node cluster.

The cluster is Debian's slurm-wlm and munge on this machine (.ci/slurm-up starts it; the session
fixture tries it once when sinfo does not answer, and skips only if that fails). Graded on
online_softmax's public checks with short limits, as tests/test_batch.py does: the reference scores
20/20 there, the stub 0. The dry-run and bad-input tests need no Slurm at all."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grader import exitcodes, results
from grader.options import GradeOptions
from grader.scale import slurm
from grader.cli import main as grader_main
from tests.conftest import COURSE, ROOT, checks_of
from tests.known_wrong import load_mutants

EXERCISE = "online_softmax"
PUBLIC_CHECKS = ["normalizer_public", "merge_public", "softmax_public", "triton_public"]
REFERENCE = (ROOT / "solutions" / EXERCISE / f"{EXERCISE}.py").read_text()
STUB = (ROOT / "exercises" / EXERCISE / f"{EXERCISE}.py").read_text()
HOSTILE = (ROOT / "tests" / "hostile" / "patch_asserts.py").read_text()
# Slow only at import: long enough to be killed mid-grade, short enough to finish when resubmitted.
FUTURE = "from __future__ import annotations\n"
assert REFERENCE.count(FUTURE) == 1
SLOW = REFERENCE.replace(FUTURE, FUTURE + "import time\ntime.sleep(8)\n")
FAST = ["-e", EXERCISE, "--tests", "public", "--seed", "1234", "--call-timeout", "20", "--time-limit", "120",
        *[arg for c in PUBLIC_CHECKS for arg in ("--check", c)]]
# One cluster, one machine's CPUs: these tests run in one process, one at a time.
pytestmark = pytest.mark.xdist_group("slurm")


def sinfo_says() -> tuple[bool, str]:
    if shutil.which("sinfo") is None:
        return False, "sinfo is not on PATH"
    run = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, timeout=30, check=False)
    states = run.stdout.split()
    if run.returncode != 0 or not any(s.startswith(("idle", "mixed", "allocated", "completing")) for s in states):
        return False, f"sinfo exit {run.returncode}, nodes {states}, {run.stderr.strip()[-300:]}"
    return True, ""


@pytest.fixture(scope="session")
def cluster():
    """A Slurm cluster that answers; started with .ci/slurm-up if sinfo does not answer."""
    ok, why = sinfo_says()
    if not ok:
        up = subprocess.run([str(ROOT / ".ci" / "slurm-up")], capture_output=True, text=True, timeout=900, check=False)
        ok, again = sinfo_says()
        if up.returncode != 0 or not ok:
            pytest.skip(f"no Slurm cluster here ({why}) and .ci/slurm-up could not start one "
                        f"(exit {up.returncode}): {(up.stderr or up.stdout).strip()[-600:]} {again}")
    return True


def grader_slurm(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grader", "slurm", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "220", **(env or {})}, timeout=300, check=False)


def rows_by_id(out: Path) -> dict[str, slurm.Row]:
    return {r.id: r for r in slurm.task_rows(COURSE, slurm.load_manifest(out))}


def wait_until_ended(out: Path, timeout_s: float = 150) -> dict[str, slurm.Row]:
    deadline = time.monotonic() + timeout_s
    while True:
        rows = rows_by_id(out)
        # done or failed, and Slurm agrees the task has ended (a task that has written its result may still be exiting)
        if all(r.state not in ("pending", "running") and r.slurm.split()[-1] not in slurm.RUNNING_STATES
               for r in rows.values()):
            return rows
        assert time.monotonic() < deadline, f"the array did not end within {timeout_s:g} s: " + \
            ", ".join(f"{r.id} {r.state} ({r.slurm})" for r in rows.values())
        time.sleep(1)


def result_of(out: Path, sub_id: str) -> dict:
    return json.loads((out / f"{sub_id}.json").read_text())


def job_ids(stdout: str) -> list[str]:
    return [w for line in stdout.splitlines() if "submitted job array" in line for w in line.split()[3:4]]


# --- A real array: four submissions, one of each kind


MUTANT = next(m for m in load_mutants(EXERCISE) if m.name == "no_rescale")


def grade_the_array(base: Path) -> dict:
    subs, out = base / "submissions", base / "results"
    for sub_id, source in (("reference", REFERENCE), ("stub", STUB), ("wrong", MUTANT.apply(REFERENCE)),
                           ("hostile", HOSTILE)):
        (subs / sub_id).mkdir(parents=True)
        (subs / sub_id / f"{EXERCISE}.py").write_text(source)
    started = time.monotonic()
    run = grader_slurm(str(subs), "--out", str(out), "--max-parallel", "2", "--time", "00:05:00", *FAST)
    assert run.returncode == 0, f"grader slurm failed to submit:\n{run.stdout}\n{run.stderr}"
    wait_until_ended(out)
    wall_s = time.monotonic() - started
    status = grader_slurm("--status", str(out))
    return {"subs": str(subs), "out": str(out), "submit": run.stdout, "status": [status.returncode, status.stdout,
            status.stderr], "wall_s": wall_s}


@pytest.fixture(scope="module")
def graded(cluster, tmp_path_factory):
    """The array, graded once per test run. (Under pytest-xdist each worker sets up module fixtures of
    its own when a module's tests are spread over workers, which the xdist_group mark should prevent
    but does not with pytest 9: the first worker grades, the other reads what it wrote.)"""
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run_id is None:
        data = grade_the_array(tmp_path_factory.mktemp("slurm"))
    else:
        shared = tmp_path_factory.getbasetemp().parent / f"slurm-array-{run_id}"
        shared.mkdir(exist_ok=True)
        with open(shared / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (shared / "graded.json").exists():
                results.write_atomic(shared / "graded.json", grade_the_array(shared))
            data = json.loads((shared / "graded.json").read_text())
    out = Path(data["out"])
    return {**data, "subs": Path(data["subs"]), "out": out, "rows": rows_by_id(out),
            "status": subprocess.CompletedProcess([], *data["status"])}


IDS = ["hostile", "reference", "stub", "wrong"]


def test_the_array_has_one_task_per_submission_and_a_manifest(graded):
    out = graded["out"]
    manifest = slurm.load_manifest(out)
    assert [(t["index"], t["id"]) for t in manifest["tasks"]] == list(enumerate(IDS))
    assert all(Path(t["path"]) == graded["subs"] / t["id"] for t in manifest["tasks"])
    assert (manifest["runtime"], manifest["image"], manifest["python"]) == ("local", None, sys.executable)
    assert manifest["options"]["checks"] == PUBLIC_CHECKS and manifest["options"]["seed"] == 1234
    [job] = manifest["jobs"]
    assert job_ids(graded["submit"]) == [job["job_id"]], graded["submit"]
    assert job["indices"] == [0, 1, 2, 3] and "#SBATCH --array=0-3%2" in Path(job["script"]).read_text()
    # Slurm's own logs, one pair per task: the task prints its one-line result
    assert (out / "logs" / f"{job['job_id']}_1.out").read_text().strip() == "reference: 20/20"


def test_every_task_writes_an_honest_result(graded):
    out, rows = graded["out"], graded["rows"]
    assert {i: r.state for i, r in rows.items()} == {i: "done" for i in IDS}, \
        {i: (r.state, r.slurm, r.detail) for i, r in rows.items()}
    assert all(r.slurm.endswith("COMPLETED") for r in rows.values())
    for sub_id in IDS:
        result = result_of(out, sub_id)
        results.validate(result)
        assert result["state"] == "complete" and result["submission"]["id"] == sub_id and result["seed"] == 1234
    reference, stub, wrong, hostile = (result_of(out, i) for i in ("reference", "stub", "wrong", "hostile"))
    assert (reference["score"], reference["gradable_max_score"]) == (20, 20)
    assert stub["score"] == 0 and stub["gradable"] is True
    lost = {c["id"] for c in checks_of(wrong, EXERCISE).values() if c["points"] < c["max_points"]
            and c["status"] not in ("not_graded",) and c["id"] in PUBLIC_CHECKS}
    must_lose = set(MUTANT.loses) & set(PUBLIC_CHECKS)  # the checks its bug must cost, at least
    assert must_lose <= lost and "triton_public" not in lost, f"the mutant should lose {sorted(must_lose)}, lost {lost}"
    assert 0 < wrong["score"] < 20
    # patching torch.allclose in the student's process changes nothing in the grader's
    assert hostile["score"] == 0 and hostile["gradable"] is True


def test_status_prints_the_table_and_writes_the_batch_summary(graded):
    status, out = graded["status"], graded["out"]
    assert status.returncode == 0, status.stderr
    assert "done 4  running 0  pending 0  failed 0  (of 4)" in status.stdout, status.stdout
    assert "reference" in status.stdout and "20/20" in status.stdout
    assert "batch summary: 4 graded of 4 submissions" in status.stdout
    summary = json.loads((out / "summary.json").read_text())
    scores = [result_of(out, i)["score"] for i in IDS]
    ex = summary["exercises"][0]
    assert (summary["submissions"], summary["graded"], ex["full_marks"]) == (4, 4, 1)
    assert ex["mean"] == pytest.approx(statistics.fmean(scores), abs=1e-3)
    assert summary["internal_error"] == summary["unfinished"] == summary["no_result"] == []
    assert summary["slurm"]["counts"] == {"done": 4, "running": 0, "pending": 0, "failed": 0}
    assert (out / "scores.png").read_bytes()[:4] == b"\x89PNG"


def test_resubmit_with_nothing_failed_submits_nothing(graded):
    before = slurm.load_manifest(graded["out"])["jobs"]
    run = grader_slurm("--resubmit-failed", str(graded["out"]))
    assert run.returncode == 0 and "nothing to resubmit: no task failed (done 4" in run.stdout, run.stdout + run.stderr
    assert slurm.load_manifest(graded["out"])["jobs"] == before


def test_the_array_stayed_fast(graded):
    # 4 submissions, 2 at a time on this 2-core machine, about 10-20 s each. Generous: it is shared.
    assert graded["wall_s"] < 120, f"the array took {graded['wall_s']:.0f} s"


# --- Tasks killed mid-grade: --status says so, --resubmit-failed finishes the set


def wait_for(what: str, predicate, timeout_s: float = 90):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting {timeout_s:g} s for {what}"
        time.sleep(0.5)


def task_pid(out: Path, index: int) -> int:
    """The process of array task `index` of the array graded into `out` (it runs on this node)."""
    manifest = str(slurm.manifest_path(out)).encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"_task" in cmdline and manifest in cmdline and f"SLURM_ARRAY_TASK_ID={index}".encode() in environ:
            found.append(int(pid))
    assert len(found) == 1, f"expected one process for array task {index}, found {found}"
    return found[0]


def grading_processes_of(task: int) -> list[int]:
    """The local runtime's grading processes started by the array task process `task`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline[-3:-1] == [b"_serve", str(task).encode()]:
            found.append(int(pid))
    return found


def test_killed_tasks_are_failed_and_resubmitting_completes_the_set(cluster, tmp_path):
    subs, out = tmp_path / "submissions", tmp_path / "results"
    (subs / "fine").mkdir(parents=True)
    (subs / "fine" / "notes.txt").write_text("nothing to grade: a complete, not-gradable result in a second")
    for sub_id in ("cancelled", "killed"):
        (subs / sub_id).mkdir()
        (subs / sub_id / f"{EXERCISE}.py").write_text(SLOW)
    run = grader_slurm(str(subs), "--out", str(out), "--time", "00:05:00", *FAST)
    assert run.returncode == 0, run.stdout + run.stderr
    [job] = job_ids(run.stdout)
    assert [t["id"] for t in slurm.load_manifest(out)["tasks"]] == ["cancelled", "fine", "killed"]

    # "cancelled" gets scancel (SIGTERM, then SIGKILL): it writes its own result on the way out.
    # "killed" gets SIGKILL alone, as the OOM killer or a node failure would: it writes nothing and
    # Slurm says FAILED; --status must notice.
    wait_for("'fine' to finish", lambda: rows_by_id(out)["fine"].state == "done")
    wait_for("both slow grades to start", lambda: all((out / f"{i}.json").exists() for i in ("cancelled", "killed")))
    subprocess.run(["scancel", f"{job}_0"], check=True, timeout=30)
    killed_pid = task_pid(out, 2)
    assert grading_processes_of(killed_pid), "expected the task's grading process to be running (it wrote the result)"
    os.kill(killed_pid, signal.SIGKILL)  # scancel --signal=KILL would cancel it, with SIGTERM first
    wait_for("the killed task's grading process to die with it", lambda: not grading_processes_of(killed_pid), 10)
    wait_for("both tasks to end", lambda: all(rows_by_id(out)[i].state == "failed" for i in ("cancelled", "killed")))

    status = grader_slurm("--status", str(out))
    assert status.returncode == exitcodes.GRADER_FAILED, f"two tasks failed: exit 1 (rerun them)\n{status.stderr}"
    assert "done 1  running 0  pending 0  failed 2  (of 3)" in status.stdout, status.stdout
    rows = rows_by_id(out)
    assert rows["cancelled"].slurm == f"{job}_0 CANCELLED", rows["cancelled"]
    for sub_id in ("cancelled", "killed"):
        result = result_of(out, sub_id)
        results.validate(result)
        assert result["state"] != "complete", f"{sub_id}: a killed grade must never look complete"
        assert result["failure"]["by"] == "grader", result.get("failure")
        assert result["format_errors"][0].startswith(results.INTERNAL_ERROR), result["format_errors"]
        assert "--resubmit-failed" in result["format_errors"][0]
    assert "received SIGTERM" in result_of(out, "cancelled")["format_errors"][0]
    assert rows["killed"].slurm == f"{job}_2 FAILED", rows["killed"]
    assert f"Slurm task {job}_2 ended FAILED without a complete result" in result_of(out, "killed")["format_errors"][0]
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(s["id"] for s in summary["internal_error"]) == ["cancelled", "killed"]
    assert summary["graded"] + len(summary["not_gradable"]) == 1

    finished = out / "fine.json"
    before = (finished.read_bytes(), finished.stat().st_mtime_ns)
    again = grader_slurm("--resubmit-failed", str(out), "--max-parallel", "2")
    assert again.returncode == 0, again.stdout + again.stderr
    [job2] = job_ids(again.stdout)
    jobs = slurm.load_manifest(out)["jobs"]
    assert [(j["job_id"], j["indices"]) for j in jobs] == [(job, [0, 1, 2]), (job2, [0, 2])]
    assert "#SBATCH --array=0,2%2" in Path(jobs[1]["script"]).read_text()
    rows = wait_until_ended(out)
    assert {i: r.state for i, r in rows.items()} == {"cancelled": "done", "fine": "done", "killed": "done"}, rows
    assert all(result_of(out, i)["score"] == 20 for i in ("cancelled", "killed"))
    assert (finished.read_bytes(), finished.stat().st_mtime_ns) == before, "a finished result was touched"
    final = grader_slurm("--status", str(out))
    assert "done 3  running 0  pending 0  failed 0  (of 3)" in final.stdout, final.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["internal_error"] == [] and summary["graded"] == 2 and [s["id"] for s in summary["not_gradable"]] == ["fine"]


def test_a_task_slurm_has_forgotten_without_a_result_is_failed(cluster, tmp_path):
    # A manifest whose job Slurm never heard of (as after MinJobAge with no accounting database).
    subs, out = tmp_path / "submissions", tmp_path / "results"
    (subs / "lost").mkdir(parents=True)
    manifest = {"schema": slurm.MANIFEST_SCHEMA, "root": str(ROOT), "python": sys.executable, "submissions": str(subs),
                "results": str(out), "runtime": "local", "image": None,
                "options": GradeOptions(exercises=[EXERCISE]).to_json(), "slurm": {},
                "tasks": [{"index": 0, "id": "lost", "path": str(subs / "lost")}],
                "jobs": [{"job_id": "987654321", "indices": [0], "submitted_at": results.now()}], "conflicts": []}
    results.write_atomic(slurm.manifest_path(out), manifest)
    status = grader_slurm("--status", str(out))
    assert status.returncode == exitcodes.GRADER_FAILED, f"a task with no result failed: exit 1\n{status.stderr}"
    assert "failed 1" in status.stdout and "unknown to Slurm" in status.stdout, status.stdout
    lost = result_of(out, "lost")
    assert lost["state"] != "complete" and "Slurm no longer knows task 987654321_0" in lost["format_errors"][0]
    assert [s["id"] for s in json.loads((out / "summary.json").read_text())["internal_error"]] == ["lost"]


# --- Without Slurm: the script, the manifest, bad input


def three_submissions(folder: Path) -> Path:
    subs = folder / "submissions"
    for sub_id in ("ann", "ben", "cat"):
        (subs / sub_id).mkdir(parents=True)
    return subs


def fake_sbatch(folder: Path, job_id: str = "4242") -> Path:
    """A `sbatch` that records its arguments and answers like `sbatch --parsable`."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\necho "$@" >> {folder}/sbatch-calls\necho "{job_id};cluster"\n')
    (bin_dir / "sbatch").chmod(0o755)
    return bin_dir


def test_dry_run_prints_the_script_and_submits_nothing(tmp_path):
    subs, out = three_submissions(tmp_path), tmp_path / "results"
    bin_dir = fake_sbatch(tmp_path)
    run = grader_slurm(str(subs), "--out", str(out), "--dry-run", "--max-parallel", "2", "--gpus-per-task", "1",
                       "--partition", "gpu", "--account", "lab", "--time", "1-00:30:00", "--runtime", "apptainer",
                       "--image", "/shared/course.sif", *FAST, env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert run.returncode == 0, run.stderr
    script = run.stdout
    for line in ("#!/bin/bash", "#SBATCH --array=0-2%2", "#SBATCH --gres=gpu:1", "#SBATCH --partition=gpu",
                 "#SBATCH --account=lab", "#SBATCH --time=1-00:30:00", f"#SBATCH --output={out}/logs/%A_%a.out",
                 f"#SBATCH --error={out}/logs/%A_%a.err", f"cd {ROOT} || exit 1",
                 f"exec {sys.executable} -m grader.scale.slurm _task {out}/.slurm/manifest.json"):
        assert line in script.splitlines(), f"expected the line {line!r} in the script:\n{script}"
    assert "apptainer" in script and "/shared/course.sif" in script
    assert "dry run: 3 task(s); nothing written, nothing submitted" in run.stderr
    assert not out.exists(), "a dry run must write nothing"
    assert not (tmp_path / "sbatch-calls").exists(), "a dry run must not call sbatch"


def test_submit_writes_the_manifest_and_records_the_job_id(tmp_path, monkeypatch, capsys):
    subs, out = three_submissions(tmp_path), tmp_path / "results"
    monkeypatch.setenv("PATH", f"{fake_sbatch(tmp_path, '777')}:{os.environ['PATH']}")
    monkeypatch.setenv("COLUMNS", "200")
    code = grader_main(["slurm", str(subs), "--out", str(out), "--runtime", "docker", "--image", "lab:1.0",
                        "--max-parallel", "8", *FAST])
    assert code == 0, capsys.readouterr()
    manifest = slurm.load_manifest(out)
    assert (manifest["runtime"], manifest["image"]) == ("docker", "lab:1.0")
    assert [(t["index"], t["id"], t["path"]) for t in manifest["tasks"]] == \
        [(i, s, str(subs / s)) for i, s in enumerate(("ann", "ben", "cat"))]
    [job] = manifest["jobs"]
    assert job["job_id"] == "777" and job["indices"] == [0, 1, 2] and job["slurm"]["max_parallel"] == 8
    assert (tmp_path / "sbatch-calls").read_text().split() == ["--parsable", job["script"]]
    assert "#SBATCH --array=0-2%8" in Path(job["script"]).read_text() and (out / "logs").is_dir()
    assert "submitted job array 777 (3 tasks, --array=0-2%8)" in capsys.readouterr().out


def test_two_entries_with_one_id_get_a_not_gradable_result_and_no_task(tmp_path, monkeypatch, capsys):
    subs, out = three_submissions(tmp_path), tmp_path / "results"
    (subs / "ann.zip").write_bytes(b"PK")  # "ann" twice: the folder and the archive
    monkeypatch.setenv("PATH", f"{fake_sbatch(tmp_path, '778')}:{os.environ['PATH']}")
    assert grader_main(["slurm", str(subs), "--out", str(out), *FAST]) == 0, capsys.readouterr()
    assert [t["id"] for t in slurm.load_manifest(out)["tasks"]] == ["ben", "cat"], "no task grades a conflict"
    ann = json.loads((out / "ann.json").read_text())
    assert ann["state"] == "complete" and ann["gradable"] is False
    assert ann["format_errors"] == ["expected one submission named 'ann', found 2: ann, ann.zip; keep one and resubmit"]


def test_array_spec_and_slurm_task_names():
    assert slurm.array_spec([7, 0, 1, 2, 5, 8], 4) == "0-2,5,7-8%4"
    assert slurm.array_spec([3], None) == "3"
    assert slurm._parse_array_ids("12_3") == ("12", [3])
    assert slurm._parse_array_ids("12_[0-2,5%2]") == ("12", [0, 1, 2, 5])
    assert slurm._parse_array_ids("12.batch") is None


@pytest.mark.parametrize("args, message", [
    (["--time", "90m"], ("expected --time in a form Slurm accepts (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, "
                         "e.g. 00:30:00), found '90m'")),
    (["--time", "01:75:00"], "expected minutes and seconds below 60 in --time, found '01:75:00'"),
    (["--max-parallel", "0"], "expected --max-parallel of at least 1 (tasks running at once), found 0"),
    (["--runtime", "podman"], "expected --runtime among local, docker, apptainer, found 'podman'"),
    (["--image", "x.sif"], "expected --image only with --runtime docker or apptainer"),
])
def test_bad_options_exit_2_with_a_message(tmp_path, capsys, args, message):
    subs = three_submissions(tmp_path)
    code = grader_main(["slurm", str(subs), "--out", str(tmp_path / "r"), *args])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and message in err, err
    assert not (tmp_path / "r").exists()


def test_missing_folder_sbatch_and_manifest_exit_2_with_a_message(tmp_path, capsys, monkeypatch):
    def error(*argv) -> str:
        assert grader_main(["slurm", *argv]) == 2
        return " ".join(capsys.readouterr().err.split())

    assert "expected a folder of submissions at" in error(str(tmp_path / "nowhere"), "--out", str(tmp_path / "r"))
    subs = three_submissions(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert "expected Slurm's `sbatch` on PATH (run this on a Slurm login node), found none" in \
        error(str(subs), "--out", str(tmp_path / "r"))
    assert "manifest.json, written when `grader slurm` submitted this results folder, found nothing there" in \
        error("--resubmit-failed", str(tmp_path / "r"))
    assert f"expected {tmp_path / 'r' / '.slurm' / 'manifest.json'}, written when `grader slurm` submitted this " \
           "results folder, found nothing there" in error("--status", str(tmp_path / "r"))
    assert "expected SUBMISSIONS_DIR and --out RESULTS_DIR" in error(str(subs))
    assert "expected only RESULTS_DIR after --status" in error("--status", str(tmp_path / "r"), str(subs))


def test_a_task_hands_its_slurm_gpus_to_the_container_runtime():
    env = {"SLURM_JOB_GPUS": "5", "CUDA_VISIBLE_DEVICES": "0"}  # cgroup-constrained: the task sees its GPU as 0
    assert slurm.task_gpu("docker", env) == "5", "docker's --gpus names the node's own device numbers"
    assert slurm.task_gpu("apptainer", env) == "0", "apptainer --nv sees the task's devices"
    assert slurm.task_gpu("local", env) is None, "the local runtime inherits CUDA_VISIBLE_DEVICES itself"
    assert slurm.task_gpu("docker", {}) is None, "no GPU asked for: none passed"


def test_each_task_draws_its_seed_from_the_arrays_and_keeps_it_on_resubmission():
    manifest = {"options": GradeOptions(exercises=[EXERCISE]).to_json(), "seed": 123456}
    ann, ben = ({"index": i, "id": name} for i, name in enumerate(("ann", "ben")))
    assert slurm.task_options(manifest, ann).seed == slurm.task_options(manifest, ann).seed != \
        slurm.task_options(manifest, ben).seed, "one student's seed is stable, and differs from another's"
    given = {**manifest, "options": GradeOptions(exercises=[EXERCISE], seed=7).to_json()}
    assert slurm.task_options(given, ann).seed == 7, "--seed wins over the array's secret seed"
