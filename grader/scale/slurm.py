"""Grade a folder of submissions on a Slurm cluster: one job array, one array task per submission.

    grader slurm SUBMISSIONS_DIR --out RESULTS_DIR [--partition P] [--gpus-per-task N] [--time 00:30:00]
                 [--max-parallel N] [--runtime local|docker|apptainer] [--image IMAGE] [--account A] [--dry-run]
                 [--seed N] [--exercise ID ...] [--tests all|public] [--check ID ...] [--log-dir DIR] ...
    grader slurm --status RESULTS_DIR            done / running / failed / pending per submission
    grader slurm --resubmit-failed RESULTS_DIR   a new array of the tasks that failed, nothing else

Submitting writes RESULTS_DIR/.slurm/manifest.json (array index -> submission id and path, the grading
options, the runtime and image, the arrays submitted) and an sbatch script RESULTS_DIR/.slurm/array-N.sbatch,
then runs `sbatch --parsable` and records the job id. Each array task runs
``python -m grader.scale.slurm _task MANIFEST`` with the submitting process's Python, in this checkout, so the
nodes must see the checkout and its virtual environment (a shared filesystem) or use a container image.
A task grades its submission exactly as `grader batch` does (grader.scale.batch.grade_submission), so its result
lands atomically in RESULTS_DIR/<id>.json and `grader export` and the summary work unchanged. Slurm's
logs go to RESULTS_DIR/logs/<job>_<index>.out and .err.

A task that Slurm stops (scancel, time limit, preemption: SIGTERM) writes a result that says so before it
exits; one that is killed outright (SIGKILL, node failure) cannot, so `--status` asks Slurm (sacct, and
squeue for what the controller still remembers) and writes that result for it. Either way the result is
"internal error of the grader", not complete, and never half-written. Once no task is pending or
running, `--status` writes summary.json and scores.png as `grader batch` does.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from grader import exitcodes, results
from grader.options import GradeOptions, OptionsError, add_grade_options
from grader.results import read_result
from grader.scale import batch
from grader.scale.backend import BACKENDS, Job
from grader.scale.backends import make_backend
from grader.scale.batch import BatchOptions
from grader.scale.discover import Entry, describe_entries, discover
from grader.scale.errors import BatchError
from grader.scale.resume import submission_seed
from grader.scale.summary import classify, one_line, print_summary, summarize, write_summary
from grader.course import Course, CourseError, find_root, load_course
from grader.runner import selected_exercises, suite_sha256
from grader.text import inert

MANIFEST_DIR = ".slurm"
MANIFEST_FILE = "manifest.json"
MANIFEST_SCHEMA = "llm-efficiency-lab/slurm-manifest/v1"
LOG_DIR = "logs"
RUNTIMES = BACKENDS

# Slurm's job states (squeue --states, sacct --state), by what they mean for one submission's grade.
PENDING_STATES = {"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD", "CONFIGURING",
                  "SUSPENDED", "RESIZING", "STOPPED"}
RUNNING_STATES = {"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT"}
FAILED_STATES = {"FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
                 "DEADLINE", "REVOKED", "SPECIAL_EXIT"}
COMPLETED_STATE = "COMPLETED"

# Slurm's --time formats: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds.
_TIME_FORMS = [r"\d+", r"\d+:\d{1,2}", r"\d+:\d{1,2}:\d{1,2}", r"\d+-\d+", r"\d+-\d+:\d{1,2}", r"\d+-\d+:\d{1,2}:\d{1,2}"]
_TIME_RE = re.compile("|".join(f"(?:{f})" for f in _TIME_FORMS))


class SlurmError(BatchError):
    """Bad input, or Slurm missing or refusing (the message says what was expected and what was found)."""


class TaskKilled(Exception):
    """Slurm asked this array task to stop (scancel, time limit, preemption)."""


@dataclass
class SlurmOptions:
    partition: str | None = None
    gpus_per_task: int | None = None
    time: str | None = None
    max_parallel: int | None = None
    account: str | None = None


# ---------------------------------------------------------------------------------------------
# Checking input


def check_time(text: str) -> str:
    """Slurm's --time value, checked: 30, 30:00, 01:30:00, 1-0, 1-12:00, 1-12:00:00."""
    value = text.strip()
    if value.upper() in ("UNLIMITED", "INFINITE"):
        return value
    if not _TIME_RE.fullmatch(value):
        raise SlurmError(f"expected --time in a form Slurm accepts (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or "
                         f"D-HH:MM:SS, e.g. 00:30:00), found {text!r}")
    parts = value.split("-")[-1].split(":")
    if len(parts) >= 2 and any(int(p) >= 60 for p in parts[1:]):
        raise SlurmError(f"expected minutes and seconds below 60 in --time, found {text!r}")
    return value


def check_slurm_options(opts: SlurmOptions) -> SlurmOptions:
    if opts.max_parallel is not None and opts.max_parallel < 1:
        raise SlurmError(f"expected --max-parallel of at least 1 (tasks running at once), found {opts.max_parallel}")
    if opts.gpus_per_task is not None and opts.gpus_per_task < 0:
        raise SlurmError(f"expected --gpus-per-task of 0 or more, found {opts.gpus_per_task}")
    if opts.time is not None:
        opts.time = check_time(opts.time)
    for name in ("partition", "account"):
        value = getattr(opts, name)
        if value is not None and (not value.strip() or any(c.isspace() for c in value)):
            raise SlurmError(f"expected --{name} to be one Slurm name without spaces, found {value!r}")
    return opts


def check_runtime(runtime: str, image: str | None) -> None:
    if runtime not in RUNTIMES:
        raise SlurmError(f"expected --runtime among {', '.join(RUNTIMES)}, found {runtime!r}")
    if image is not None and runtime == "local":
        raise SlurmError(f"expected --image only with --runtime docker or apptainer, found --image {image!r} "
                         f"with --runtime local")


def find_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SlurmError(f"expected Slurm's `{name}` on PATH (run this on a Slurm login node), found none "
                         f"in PATH={os.environ.get('PATH', '')!r}")
    return path


# ---------------------------------------------------------------------------------------------
# The manifest and the sbatch script


def manifest_path(out_dir: Path) -> Path:
    return Path(out_dir) / MANIFEST_DIR / MANIFEST_FILE


def load_manifest(out_dir: Path) -> dict:
    path = manifest_path(out_dir)
    try:
        data = json.loads(path.read_text())
    except OSError:
        raise SlurmError(f"expected {path}, written when `grader slurm` submitted this results folder, "
                         f"found nothing there") from None
    except ValueError as exc:
        raise SlurmError(f"expected JSON in {path}, found unreadable text ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise SlurmError(f"expected a manifest with schema {MANIFEST_SCHEMA!r} in {path}, found {found!r}")
    return data


def array_spec(indices: list[int], max_parallel: int | None) -> str:
    """Slurm's --array value: ranges of indices ("0-3,7,9-10") and the %N throttle."""
    indices = sorted(set(indices))
    parts: list[str] = []
    start = prev = indices[0]
    for i in indices[1:] + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(parts) + (f"%{max_parallel}" if max_parallel else "")


def render_script(manifest: dict, indices: list[int], opts: SlurmOptions) -> str:
    out_dir = Path(manifest["results"])
    logs = out_dir / LOG_DIR
    q = shlex.quote
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name=grade-{re.sub(r'[^A-Za-z0-9_.-]', '_', out_dir.name)[:40]}",
             f"#SBATCH --array={array_spec(indices, opts.max_parallel)}",
             "#SBATCH --ntasks=1",
             f"#SBATCH --output={logs}/%A_%a.out",
             f"#SBATCH --error={logs}/%A_%a.err"]
    if opts.time:
        lines.append(f"#SBATCH --time={opts.time}")
    if opts.partition:
        lines.append(f"#SBATCH --partition={opts.partition}")
    if opts.account:
        lines.append(f"#SBATCH --account={opts.account}")
    if opts.gpus_per_task:
        lines.append(f"#SBATCH --gres=gpu:{opts.gpus_per_task}")
    lines += [
        "",
        f"# One task per submission of {manifest['submissions']}; the manifest maps SLURM_ARRAY_TASK_ID to it.",
        f"# Runtime: {manifest['runtime']}" + (f", image {manifest['image']}" if manifest.get("image") else ""),
        f"cd {q(manifest['root'])} || exit 1",
        f"exec {q(manifest['python'])} -m grader.scale.slurm _task {q(str(manifest_path(out_dir)))}",
        "",
    ]
    return "\n".join(lines)


def _slurm_opts_json(opts: SlurmOptions) -> dict:
    return dataclasses.asdict(opts)


def sbatch(script: Path) -> str:
    """Submit `script`; the job id."""
    tool = find_tool("sbatch")
    try:
        run = subprocess.run([tool, "--parsable", str(script)], capture_output=True, text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        raise SlurmError("expected sbatch to answer within 120 s, it did not (is slurmctld up?)") from None
    if run.returncode != 0:
        raise SlurmError(f"sbatch refused the array (exit {run.returncode}): "
                         f"{(run.stderr or run.stdout).strip()[-1500:] or 'no message'}; script: {script}")
    job_id = run.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"expected sbatch --parsable to print a job id, found {run.stdout.strip()[:200]!r}")
    return job_id


def submit_array(manifest: dict, indices: list[int], opts: SlurmOptions, console: Console) -> str:
    """Write the script for `indices`, record it in the manifest, sbatch it; the job id."""
    out_dir = Path(manifest["results"])
    (out_dir / LOG_DIR).mkdir(parents=True, exist_ok=True)
    number = len(manifest["jobs"]) + 1
    script = out_dir / MANIFEST_DIR / f"array-{number}.sbatch"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(render_script(manifest, indices, opts))
    record: dict[str, Any] = {"job_id": None, "indices": sorted(indices), "script": str(script), "submitted_at": results.now(),
              "slurm": _slurm_opts_json(opts)}
    manifest["jobs"].append(record)
    results.write_atomic(manifest_path(out_dir), manifest)  # before sbatch: a task may start at once
    try:
        record["job_id"] = sbatch(script)
    except BaseException:
        manifest["jobs"].remove(record)
        results.write_atomic(manifest_path(out_dir), manifest)
        raise
    results.write_atomic(manifest_path(out_dir), manifest)
    console.print(f"submitted job array {record['job_id']} ({len(indices)} task{'s' * (len(indices) != 1)}, "
                  f"--array={array_spec(indices, opts.max_parallel)}); follow it with "
                  f"`grader slurm --status {out_dir}`", markup=False, highlight=False, soft_wrap=True)
    return record["job_id"]


def submit(course: Course, root: Path, submissions: Path, out_dir: Path, grade: GradeOptions, opts: SlurmOptions,
           runtime: str = "local", image: str | None = None, dry_run: bool = False,
           console: Console | None = None, new_seed: bool = False) -> dict:
    """Submit one array task per submission of `submissions`; the manifest (not written with dry_run)."""
    console = console or Console()
    check_runtime(runtime, image)
    check_slurm_options(opts)
    unknown = sorted(set(grade.exercises or []) - {e.id for e in course.exercises})
    if unknown:
        raise SlurmError(f"unknown exercise {unknown[0]!r}; expected one of {[e.id for e in course.exercises]}")
    entries, conflicts = discover(submissions)
    for line in describe_entries(submissions, entries):
        console.print(inert(line), markup=False, highlight=False)
    entries = [e for e in entries if e.id not in conflicts]
    if not entries and not conflicts:
        raise SlurmError(f"expected at least one submission (a folder or an archive) in {submissions}, found none")
    out_dir = Path(out_dir).resolve()
    if not dry_run:
        find_tool("sbatch")
        if manifest_path(out_dir).exists():
            old = load_manifest(out_dir)
            busy = [r for r in task_rows(course, old) if r.state in ("pending", "running")]
            if busy:
                raise SlurmError(f"expected no grade in progress in {out_dir}, found {len(busy)} task(s) pending or "
                                 f"running (e.g. {busy[0].id}); wait, or see `grader slurm --status {out_dir}`")
    grade_opts = batch.grade_options_for(BatchOptions(Path(submissions), out_dir, grade=grade), root)
    # Without --seed, the array's secret seed: kept from the manifest already here, so that a resubmission draws
    # each student's same hidden inputs (resume.submission_seed), unless --new-seed.
    batch_seed = None
    if grade_opts.seed is None:
        kept = None
        if not new_seed and manifest_path(out_dir).exists():
            try:
                kept = load_manifest(out_dir).get("seed")
            except SlurmError:
                kept = None
        batch_seed = kept if isinstance(kept, int) and not isinstance(kept, bool) else secrets.randbelow(2**31)
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "created_at": results.now(),
        "root": str(Path(root).resolve()),
        "python": sys.executable,
        "submissions": str(Path(submissions).resolve()),
        "results": str(out_dir),
        "runtime": runtime,
        "image": image,
        "options": grade_opts.to_json(),
        "seed": batch_seed,
        "slurm": _slurm_opts_json(opts),
        "tasks": [{"index": i, "id": e.id, "path": str(e.path.resolve())} for i, e in enumerate(entries)],
        "jobs": [],
        "conflicts": sorted(conflicts),  # ids more than one entry claims: not gradable, not in the array
    }
    indices = list(range(len(entries)))
    if dry_run:
        sys.stdout.write(render_script(manifest, indices, opts) if indices else "# nothing to submit\n")
        sys.stdout.flush()
        console.print(f"dry run: {len(entries)} task(s); nothing written, nothing submitted", highlight=False)
        return manifest
    out_dir.mkdir(parents=True, exist_ok=True)
    if conflicts:
        exercises = selected_exercises(course, grade_opts)
        suite = suite_sha256(root, exercises)
        for sub_id, paths in conflicts.items():
            results.write_atomic(out_dir / f"{sub_id}.json",
                                 batch.conflict_result(course, exercises, sub_id, paths, grade_opts, suite, then="resubmit"))
            console.print(inert(f"{sub_id}: not gradable: {len(paths)} entries claim this id"), markup=False,
                          highlight=False)
    if indices:
        submit_array(manifest, indices, opts, console)
    else:
        results.write_atomic(manifest_path(out_dir), manifest)
    return manifest


# ---------------------------------------------------------------------------------------------
# One array task


def failure_result(course: Course, root: Path, manifest: dict, task: dict, reason: str) -> dict:
    """The result of a task that did not finish: what it graded, and why it stopped (state "running").
    It never reads the submission again: what made the grade fail may be in it, and a result to be
    graded again needs no hash of it."""
    grade = GradeOptions.from_json(manifest["options"])
    exercises = selected_exercises(course, grade)
    job = Job(task["id"], Path(task["path"]), Path(manifest["results"]) / f"{task['id']}.json", grade, 0)
    retry = f"`grader slurm --resubmit-failed {manifest['results']}` grades it again"
    return batch.internal_error_result(course, exercises, job, suite_sha256(root, exercises), None, reason, retry=retry)


def task_options(manifest: dict, task: dict) -> GradeOptions:
    """A task's grading options: the array's, with the task's seed drawn from the array's secret seed and the
    student's id where no --seed was given (the same one on every resubmission)."""
    grade = GradeOptions.from_json(manifest["options"])
    seed = manifest.get("seed")
    if grade.seed is None and isinstance(seed, int) and not isinstance(seed, bool):
        grade = grade.replace(seed=submission_seed(seed, task["id"]))
    return grade


def task_gpu(runtime: str, env: Mapping[str, str] | None = None) -> str | None:
    """The GPU(s) Slurm gave this task, as the runtime names them: Docker's `--gpus device=` wants
    the node's own numbers (SLURM_STEP_GPUS / SLURM_JOB_GPUS); Apptainer and the local runtime see
    the task's devices through CUDA_VISIBLE_DEVICES, which the local runtime inherits anyway."""
    env = os.environ if env is None else env
    if runtime == "docker":
        return env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES") or None
    if runtime == "apptainer":
        return env.get("CUDA_VISIBLE_DEVICES") or None
    return None


def run_task(manifest_file: Path, index: int | None = None) -> int:
    """Grade the submission of this array task (SLURM_ARRAY_TASK_ID) into RESULTS_DIR/<id>.json."""
    manifest = json.loads(Path(manifest_file).read_text())
    if index is None:
        index = int(os.environ["SLURM_ARRAY_TASK_ID"])
    task = manifest["tasks"][index]
    where = f"{os.environ.get('SLURM_ARRAY_JOB_ID', '?')}_{index}"
    root = Path(manifest["root"])
    course = load_course(root)
    out = Path(manifest["results"]) / f"{task['id']}.json"
    stopped: list[str] = []

    def on_signal(signum, _frame):
        if stopped:
            return
        stopped.append(signal.Signals(signum).name)
        raise TaskKilled(f"Slurm task {where} received {stopped[0]} (cancelled, past its time limit or preempted) "
                         f"and stopped")

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, on_signal)
    error = None
    try:
        backend = make_backend(manifest["runtime"], root, image=manifest.get("image"))
        # A local backend's grading process dies with this task even when the task is SIGKILLed
        # (out of memory, a node agent's kill): LocalBackend binds it to this process.
        grade = task_options(manifest, task)
        _result, error = batch.grade_submission(course, root, Entry(task["id"], Path(task["path"])),
                                               Path(manifest["results"]), grade, backend,
                                               gpu=task_gpu(manifest["runtime"]))
    except TaskKilled:
        pass
    except Exception as exc:  # the grader failed outside grade_submission's own net (the backend, say)
        error = f"{type(exc).__name__}: {exc}"
    done = read_result(out)
    reason = ""
    complete = done is not None and done.get("state") == "complete" and done.get("submission", {}).get("id") == task["id"]
    if not complete and (stopped or error):
        reason = (f"Slurm task {where} received {stopped[0]} (cancelled, past its time limit or preempted) and "
                  f"stopped" if stopped else f"Slurm task {where}: {error.strip().splitlines()[-1][:500]}")  # type: ignore[union-attr]  # set if not stopped
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, signal.SIG_IGN)  # let nothing interrupt the last write
        results.write_atomic(out, failure_result(course, root, manifest, task, reason))
        done = read_result(out)
    print(one_line(task["id"], done, None if complete else reason if (stopped or error) else None), flush=True)
    if stopped:
        return 128 + signal.Signals[stopped[0]].value
    return 0 if complete else 1


# ---------------------------------------------------------------------------------------------
# Status: ask Slurm, read the results


def _parse_array_ids(text: str) -> tuple[str, list[int]] | None:
    """'12_3' -> ('12', [3]); '12_[0-2,5%2]' -> ('12', [0, 1, 2, 5]); anything else None."""
    m = re.fullmatch(r"(\d+)_(\d+|\[[^\]]*\])", text.strip())
    if not m:
        return None
    job, spec = m.groups()
    if not spec.startswith("["):
        return job, [int(spec)]
    indices: list[int] = []
    for part in spec[1:-1].split("%")[0].split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            indices.extend(range(int(lo), int(hi or lo) + 1))
    return job, indices


def slurm_states(job_ids: list[str]) -> dict[tuple[str, int], str]:
    """What Slurm says of each array task of `job_ids`: (job id, index) -> state (e.g. "CANCELLED").
    sacct where accounting is on; squeue for what the controller holds now (live, and ended jobs
    for MinJobAge). Tasks Slurm no longer knows are absent."""
    states: dict[tuple[str, int], str] = {}
    sacct, squeue = shutil.which("sacct"), shutil.which("squeue")
    if sacct is None and squeue is None:
        raise SlurmError(f"expected Slurm's sacct or squeue on PATH to ask for the tasks' states, found neither in "
                         f"PATH={os.environ.get('PATH', '')!r}")

    def take(lines: str) -> None:
        for line in lines.splitlines():
            name, _, state = line.partition("|")
            parsed = _parse_array_ids(name)
            if parsed and state.strip():
                for index in parsed[1]:
                    states[(parsed[0], index)] = state.split()[0].rstrip("+")

    if sacct and job_ids:
        run = subprocess.run([sacct, "-n", "-P", "-X", "-j", ",".join(job_ids), "-o", "JobID,State"],
                             capture_output=True, text=True, timeout=60, check=False)
        if run.returncode == 0:  # "Slurm accounting storage is disabled" otherwise
            take(run.stdout)
    if squeue:
        for job in job_ids:  # one at a time: squeue refuses the whole list if one id is forgotten
            run = subprocess.run([squeue, "-h", "-r", "--states=all", "-j", job, "-o", "%i|%T"],
                                 capture_output=True, text=True, timeout=60, check=False)
            if run.returncode == 0:
                take(run.stdout)
    return states


@dataclass
class Row:
    index: int
    id: str
    state: str  # done, running, pending, failed
    slurm: str  # "12_3 RUNNING", or "12_3 (unknown to Slurm)"
    detail: str
    result: dict | None


def _time(text: str | None) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(text) if text else None
    except ValueError:
        return None


def task_rows(course: Course, manifest: dict) -> list[Row]:
    out_dir = Path(manifest["results"])
    latest: dict[int, dict] = {}
    for job in manifest["jobs"]:
        if job.get("job_id"):
            for i in job["indices"]:
                latest[i] = job
    states = slurm_states(sorted({j["job_id"] for j in latest.values()}, key=int))
    rows = []
    for task in manifest["tasks"]:
        i, sub_id = task["index"], task["id"]
        job = latest.get(i)
        result = read_result(out_dir / f"{sub_id}.json")
        kind, reason = classify(result)  # "no_result" also for a file that is not a valid result
        finished = _time((result or {}).get("finished_at")) if kind != "no_result" else None
        submitted = _time(job["submitted_at"]) if job else None
        current = (kind != "no_result" and result is not None and result.get("state") == "complete"
                   and (result.get("submission") or {}).get("id") == sub_id
                   and finished is not None and (submitted is None or finished >= submitted))
        if job is None:
            rows.append(Row(i, sub_id, "failed", "never submitted", "no Slurm job graded it", result))
            continue
        name = f"{job['job_id']}_{i}"
        state = states.get((job["job_id"], i))
        slurm = f"{name} {state}" if state else f"{name} (unknown to Slurm now)"
        if state in PENDING_STATES:
            rows.append(Row(i, sub_id, "pending", slurm, "waiting for a node", result))
        elif state in RUNNING_STATES and not current:
            rows.append(Row(i, sub_id, "running", slurm, "grading", result))
        elif current:
            assert result is not None  # current: a complete result
            detail = (f"{result['score']:g}/{result['gradable_max_score']:g}" if kind == "graded"
                      else f"{kind.replace('_', ' ')}: {reason}")
            rows.append(Row(i, sub_id, "done", slurm, detail, result))
        elif state in FAILED_STATES:
            rows.append(Row(i, sub_id, "failed", slurm, f"Slurm task {name} ended {state} without a complete result",
                            result))
        elif state == COMPLETED_STATE or state is not None:
            rows.append(Row(i, sub_id, "failed", slurm,
                            f"Slurm task {name} ended {state} without writing a complete result", result))
        else:
            rows.append(Row(i, sub_id, "failed", slurm,
                            f"Slurm no longer knows task {name} and there is no complete result", result))
    return rows


def record_failures(course: Course, root: Path, manifest: dict, rows: list[Row]) -> None:
    """Give each failed task's submission a result that says why (never touching a complete one)."""
    out_dir = Path(manifest["results"])
    for row in rows:
        if row.state != "failed":
            continue
        result = read_result(out_dir / f"{row.id}.json")
        if result is not None and result.get("state") == "complete":
            continue  # complete, from an earlier grade: never overwritten here; a resubmitted task replaces it
        name = row.slurm.split()[0]
        if results.failed_by_grader(result) and name in str(result["failure"].get("reason")):
            continue  # the task (or an earlier --status) already said why
        task = manifest["tasks"][row.index]
        results.write_atomic(out_dir / f"{row.id}.json", failure_result(course, root, manifest, task, row.detail))


STYLE = {"done": "green", "running": "cyan", "pending": "yellow", "failed": "red"}


def print_rows(rows: list[Row], console: Console, title: str) -> dict[str, int]:
    counts = {k: sum(r.state == k for r in rows) for k in ("done", "running", "pending", "failed")}
    table = Table(title=title, box=box.SIMPLE_HEAVY, title_justify="left")
    for col in ("#", "submission", "state", "slurm task", "detail"):
        table.add_column(col, overflow="fold", justify="right" if col == "#" else "left")
    for r in rows:
        table.add_row(str(r.index), Text(inert(r.id)), Text(r.state, style=STYLE[r.state]), Text(inert(r.slurm)),
                      Text(inert(r.detail)[:200]))
    console.print(table)
    console.print("  ".join(f"{k} {v}" for k, v in counts.items()) + f"  (of {len(rows)})", highlight=False)
    return counts


def status(course: Course, root: Path, out_dir: Path, console: Console | None = None) -> tuple[list[Row], dict | None]:
    """The table; failures recorded; once nothing is pending or running, the batch summary (else None)."""
    console = console or Console()
    manifest = load_manifest(out_dir)
    rows = task_rows(course, manifest)
    record_failures(course, root, manifest, rows)
    counts = print_rows(rows, console, f"grader slurm: {manifest['results']}")
    if counts["pending"] or counts["running"]:
        return rows, None
    grade = GradeOptions.from_json(manifest["options"])
    ids = sorted({t["id"] for t in manifest["tasks"]} | set(manifest.get("conflicts") or []))
    summary = summarize(course, Path(manifest["results"]), ids, [e.id for e in selected_exercises(course, grade)])
    summary["slurm"] = {"jobs": [{"job_id": j["job_id"], "indices": j["indices"]} for j in manifest["jobs"]],
                        "counts": counts, "runtime": manifest["runtime"], "image": manifest.get("image")}
    write_summary(Path(manifest["results"]), summary)
    print_summary(summary, console)
    return rows, summary


def resubmit_failed(course: Course, root: Path, out_dir: Path, overrides: SlurmOptions,
                    console: Console | None = None) -> str | None:
    """A new array of the failed tasks only; the job id, or None when nothing failed."""
    console = console or Console()
    check_slurm_options(overrides)
    manifest = load_manifest(out_dir)
    find_tool("sbatch")
    rows = task_rows(course, manifest)
    record_failures(course, root, manifest, rows)
    failed = [r.index for r in rows if r.state == "failed"]
    if not failed:
        counts = {k: sum(r.state == k for r in rows) for k in ("done", "running", "pending")}
        console.print("nothing to resubmit: no task failed (" + ", ".join(f"{k} {v}" for k, v in counts.items()) + ")",
                      highlight=False)
        return None
    opts = SlurmOptions(**{**manifest["slurm"], **{k: v for k, v in dataclasses.asdict(overrides).items()
                                                   if v is not None}})
    manifest["slurm"] = _slurm_opts_json(opts)
    for r in rows:
        if r.state == "failed":
            console.print(inert(f"{r.id}: {r.detail}"), markup=False, highlight=False)
    return submit_array(manifest, failed, opts, console)


# ---------------------------------------------------------------------------------------------
# Command line


def cmd_slurm(args: argparse.Namespace) -> int:
    err = Console(stderr=True)
    console = Console()
    try:
        opts = SlurmOptions(partition=args.partition, gpus_per_task=args.gpus_per_task, time=args.time,
                            max_parallel=args.max_parallel, account=args.account)
        modes = [m for m in ("status", "resubmit_failed") if getattr(args, m)]
        if modes:
            if args.submissions or args.out:
                raise SlurmError(f"expected only RESULTS_DIR after --{modes[0].replace('_', '-')}, found "
                                 f"{'SUBMISSIONS_DIR ' + args.submissions if args.submissions else '--out ' + args.out}")
            root = find_root()
            course = load_course(root)
            if args.status:
                rows, summary = status(course, root, Path(args.status), console)
                if summary is None:  # still pending or running: nothing to chase yet
                    return exitcodes.DONE
                failed = {r.id for r in rows if r.state == "failed"} | {s["id"] for s in summary["internal_error"]}
                return exitcodes.of(len(failed), len(summary["not_gradable"]))
            resubmit_failed(course, root, Path(args.resubmit_failed), opts, console)
            return 0
        if not args.submissions or not args.out:
            raise SlurmError("expected SUBMISSIONS_DIR and --out RESULTS_DIR (or --status / --resubmit-failed "
                             f"RESULTS_DIR), found {'no SUBMISSIONS_DIR' if not args.submissions else 'no --out'}")
        root = find_root()
        course = load_course(root)
        grade = GradeOptions.from_args(args)
        host_only = grade.host_only_flags()
        if host_only and args.runtime != "local":
            raise SlurmError(f"{host_only[0]} applies to --runtime local (a container runs its own sandbox, as its "
                             f"own user, with its own files), found --runtime {args.runtime}")
        submit(course, root, Path(args.submissions), Path(args.out), grade, opts, runtime=args.runtime,
               image=args.image, dry_run=args.dry_run, console=err if args.dry_run else console, new_seed=args.new_seed)
    except (BatchError, CourseError, OptionsError) as exc:
        err.print(Text.assemble(("error:", "red"), " ", inert(str(exc))), soft_wrap=True)  # paths stay whole
        return exitcodes.BAD_INPUT
    return exitcodes.DONE


def add_commands(subparsers) -> None:
    """Register `grader slurm` on the CLI's subparsers."""
    s = subparsers.add_parser("slurm", help="grade a folder of submissions as a Slurm job array; status; resubmit",
                              description=__doc__.split("\n\n")[1] if __doc__ else None,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("submissions", nargs="?", help="a folder whose sub-folders and archives are the submissions")
    s.add_argument("--out", "-o", help="results folder: <id>.json per submission, logs/, .slurm/ (manifest, scripts)")
    mode = s.add_mutually_exclusive_group()
    mode.add_argument("--status", metavar="RESULTS_DIR", help="done / running / failed / pending per submission")
    mode.add_argument("--resubmit-failed", metavar="RESULTS_DIR", help="a new array of the failed tasks only")
    s.add_argument("--partition", "-p", help="Slurm partition (default: the cluster's default)")
    s.add_argument("--account", "-A", help="Slurm account to charge")
    s.add_argument("--gpus-per-task", type=int, help="GPUs per submission (#SBATCH --gres=gpu:N)")
    s.add_argument("--time", "-t", help="time limit per submission, in Slurm's format (e.g. 00:30:00)")
    s.add_argument("--max-parallel", type=int, help="at most this many tasks at once (the array's %%N throttle)")
    s.add_argument("--runtime", default="local", help=f"how each task grades: {', '.join(RUNTIMES)} (default local)")
    s.add_argument("--image", help="the course image, for --runtime docker or apptainer")
    s.add_argument("--dry-run", action="store_true", help="print the sbatch script; write and submit nothing")
    s.add_argument("--new-seed", action="store_true", help="draw a new secret seed for the array (default: the one "
                   "RESULTS_DIR's manifest keeps, so that a regrade draws the same hidden inputs)")
    add_grade_options(s)
    s.set_defaults(fn=cmd_slurm)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_task"]:
        if len(argv) != 2:
            print("usage: python -m grader.scale.slurm _task MANIFEST (inside a Slurm array task)", file=sys.stderr)
            return 2
        return run_task(Path(argv[1]))
    parser = argparse.ArgumentParser(prog="python -m grader.scale.slurm")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
