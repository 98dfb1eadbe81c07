"""Grade a folder of submissions in parallel, resumably, and summarise the batch.

    grader batch SUBMISSIONS_DIR --out RESULTS_DIR [--jobs N] [--gpus 0,1,...] [--regrade] [--only ID ...]
                 [--seed N] [--exercise ID ...] [--tests all|public] [--check ID ...]
                 [--backend local|docker|apptainer] [--image IMAGE] [--memory MB] [--cpus N] ...

Each sub-folder or archive of SUBMISSIONS_DIR is one submission, named by the student's id (the
archive's name without .zip/.tar/.tar.gz/.tgz; a name that cannot name a result file, such as
"summary" or one over 200 bytes, gets a stable safe id and the console says which; entries starting
with "." or "__MACOSX" are not submissions and are listed as skipped). Its canonical result is written atomically to
RESULTS_DIR/<id>.json (the runner rewrites it after every test, so a batch killed half-way leaves
``"state": "running"`` files that the next run regrades). At the end RESULTS_DIR/summary.json and
RESULTS_DIR/scores.png summarise the whole batch, and the same tables are printed.

Seeds. Without --seed, the batch draws a secret seed on its first run and keeps it in
RESULTS_DIR/.batch-state.json; each submission's seed comes from it and the student's id, so students'
hidden inputs differ, and a regrade (--regrade, --only, a changed file) draws the same inputs as the first
grade: a partially wrong submission keeps its score. ``--new-seed`` draws a new batch seed.

Resuming. A rerun skips a submission when its result is complete and was graded from the same
files (the submission hash), the same tests (the suite hash), the same exercises, the same seed
(when --seed is given), the same grading options and the same backend (RESULTS_DIR/.batch-state.json
keeps the options and backend each result was graded with). ``--regrade`` grades everything again;
``--only ID ...`` grades exactly those submissions and leaves the others as they are.

Failures stay local. A submission that cannot be read (bad archive, nothing to grade) gets a result
with ``"gradable": false`` and the reason; a crash, timeout or hostile code costs that submission
its points, as in `grader grade`. If the grader itself fails on a submission (an exception, a hang
past the submission's time budget), the batch writes a result that says so (``"gradable": false``,
a message starting with "internal error of the grader", ``"state": "running"`` so the next run
retries it) and goes on.

Backends. The scheduler runs ``lanes``: one per job (``--jobs``), or one per GPU when --gpus is given
(each lane owns its GPU: CUDA_VISIBLE_DEVICES is set for everything it starts; further jobs queue).
A backend opens one `Slot` per lane, and a slot grades one submission into one result file at a
time. The local backend's slot keeps one grading process alive (torch and the grader imported
once) and sends it one submission after another; the docker and apptainer backends
(grader/scale/container.py) start one container of the course image per submission in `Slot.grade`.
"""

from __future__ import annotations

import argparse
import os
import queue
import secrets
import signal
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

from grader import exitcodes, results
from grader.course import Course, CourseError, Exercise, find_root, load_course
from grader.harness import identity
from grader.options import GradeOptions, OptionsError, add_grade_options
from grader.results import INTERNAL_ERROR, read_result
from grader.runner import selected_exercises, suite_sha256
from grader.scale.backend import Backend, Job, Slot
from grader.scale.backends import BackendError, add_backend_options, backend_from_args, make_backend
from grader.scale.discover import Entry, content_fingerprint, describe_entries, discover
from grader.scale.errors import BatchError
from grader.scale.resume import load_seed, load_state, save_state, staleness, state_key, submission_seed
from grader.scale.summary import one_line, print_summary, summarize, write_summary
from grader.text import inert

# How long after the exercises' own time limits the grade of one submission may take before the batch
# stops it: the runner waits up to 30 s for each pytest to exit, plus starting and writing.
SLACK_PER_EXERCISE_S = 30.0


SLACK_PER_SUBMISSION_S = 120.0


@dataclass
class BatchOptions:
    submissions: Path
    out: Path
    jobs: int = 1
    gpus: list[str] | None = None
    regrade: bool = False
    only: list[str] | None = None
    grade: GradeOptions = field(default_factory=GradeOptions)
    job_timeout_s: float | None = None  # default: the exercises' time limits plus slack
    allow_shared_identity: bool = False  # --jobs > 1 even where workers of different grades share an identity
    new_seed: bool = False  # draw a new secret seed for the batch (default: the one its state keeps)


@dataclass
class BatchReport:
    ids: list[str]
    graded: list[str]  # graded in this run
    skipped: list[str]  # current results kept
    internal_errors: list[str]
    why: dict[str, str]  # id -> why it was (re)graded
    summary: dict
    wall_s: float
    interrupted: bool = False


def conflict_result(course: Course, exercises: list[Exercise], sub_id: str, paths: list[Path], grade: GradeOptions,
                    suite: str, then: str = "rerun") -> dict:
    """Two entries claim one id, or the entry is a symbolic link: a complete, not-gradable result that
    names them."""
    if len(paths) == 1:
        try:
            target = f" (to {os.readlink(paths[0])!r})"
        except OSError:  # gone, or replaced, since the folder was listed
            target = ""
        reason = (f"expected a folder or an archive at {paths[0].name}, found a symbolic link{target}; links are "
                  "never followed: hand in a copy")
    else:
        reason = (f"expected one submission named {sub_id!r}, found {len(paths)}: "
                  f"{', '.join(p.name for p in paths)}; keep one and {then}")
    return results.ungradable(course, exercises, sub_id, reason, suite_sha=suite, seed=grade.seed or 0, mode=grade.mode)


def submission_budget(exercises: list[Exercise], opts: GradeOptions) -> float:
    per_exercise = [(opts.time_limit_s or ex.time_limit_s) + SLACK_PER_EXERCISE_S for ex in exercises]
    return sum(per_exercise) + SLACK_PER_SUBMISSION_S


RETRY = "rerun the batch to retry"


def internal_error_result(course: Course, exercises: list[Exercise], job: Job, suite: str, sha: str | None,
                          reason: str, retry: str = RETRY) -> dict:
    """What the batch writes when the grader failed on a submission: what it finished, and why it stopped.
    Not complete ("running"): the next run grades it again."""
    result = read_result(job.out)
    if result is None or result.get("submission", {}).get("id") != job.id or result.get("state") == "complete":
        seed = job.options.seed if job.options.seed is not None else 0
        result = results.new_result(course, job.id, sha or "", suite, seed, job.options.mode, exercises)
    results.mark_ungradable(result, reason, by="grader", retry=retry, state="running", replace=True)
    return result


def grade_options_for(opts: BatchOptions, root: Path) -> GradeOptions:
    """The batch's grade options, with the submissions and results folders hidden from the workers."""
    hide = list(opts.grade.hide)
    protected = [Path(tempfile.gettempdir()).resolve(), root.resolve()]
    for folder in (opts.submissions, opts.out):
        folder = Path(folder).resolve()
        # Never hide a folder that holds the workers' own files or the course.
        if not any(p == folder or folder in p.parents for p in protected):
            hide.append(str(folder))
    return opts.grade.replace(hide=tuple(hide))


def options_of(grade: GradeOptions, sub_id: str, batch_seed: int | None = None) -> GradeOptions:
    """One submission's options: the batch's, with its pytest logs (--log-dir) in a folder of its own, and,
    without --seed, its seed drawn from the batch's secret seed and its id (resume.submission_seed)."""
    if grade.log_dir:
        grade = grade.replace(log_dir=grade.log_dir / sub_id)
    if grade.seed is None and batch_seed is not None:
        grade = grade.replace(seed=submission_seed(batch_seed, sub_id))
    return grade


def run_batch(course: Course, root: Path, opts: BatchOptions, backend: Backend | None = None,
              console: Console | None = None) -> BatchReport:
    """Grade every submission of `opts.submissions` that needs it; summarise them all. Never raises
    for one submission's sake; BatchError for bad input to the batch itself."""
    console = console or Console()
    started = time.monotonic()
    if opts.jobs < 1:
        raise BatchError(f"expected --jobs of at least 1, found {opts.jobs}")
    exercises = selected_exercises(course, opts.grade)
    unknown = sorted(set(opts.grade.exercises or []) - {e.id for e in course.exercises})
    if unknown:
        raise BatchError(f"unknown exercise {unknown[0]!r}; expected one of {[e.id for e in course.exercises]}")
    exercise_ids = [e.id for e in exercises]
    entries, conflicts = discover(opts.submissions)
    ids = [e.id for e in entries]
    for line in describe_entries(opts.submissions, entries):
        console.print(inert(line), markup=False, highlight=False)
    if opts.only:
        missing = sorted(set(opts.only) - set(ids))
        if missing:
            raise BatchError(f"--only names {missing[0]!r}, which is not a submission in {opts.submissions}; "
                             f"expected one of {ids[:20]}{' ...' if len(ids) > 20 else ''}")
    out_dir = Path(opts.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    backend = backend or make_backend("local", root)
    grade_opts = grade_options_for(opts, root)
    lanes_wanted = min(opts.jobs, len(opts.gpus)) if opts.gpus else opts.jobs
    if backend.name == "local" and lanes_wanted > 1 and not opts.allow_shared_identity:
        problem = identity.shared_identity_problem(grade_opts.user, grade_opts.isolate)
        if problem:
            raise BatchError(f"--jobs {opts.jobs} would grade submissions at once while {problem}: one student's code "
                             "could read, change or starve a classmate's grade. Run as root (each worker then runs as "
                             "a uid of its own), use --jobs 1 or --backend docker, or pass --allow-shared-identity "
                             "to accept the risk")
    suite = suite_sha256(root, exercises)
    state = load_state(out_dir)
    batch_seed = None  # with --seed, every submission has that one
    if grade_opts.seed is None:
        kept = None if opts.new_seed else load_seed(out_dir)
        batch_seed = kept if kept is not None else secrets.randbelow(2**31)
    budget = opts.job_timeout_s or submission_budget(exercises, grade_opts)

    # Which submissions need grading, and why.
    todo: list[tuple[Job, str | None, str | None]] = []  # (job, expected sha, state key)
    why: dict[str, str] = {}
    skipped: list[str] = []
    for entry in entries:
        out = out_dir / f"{entry.id}.json"
        if entry.id in conflicts:
            results.write_atomic(out, conflict_result(course, exercises, entry.id, conflicts[entry.id], grade_opts, suite))
            state.pop(entry.id, None)
            continue
        if opts.only and entry.id not in opts.only:
            skipped.append(entry.id)
            continue
        sha, content = content_fingerprint(course, entry, exercise_ids)
        key = state_key(content, grade_opts, backend) if content is not None else None
        reason: str | None  # None: the result is current
        if opts.regrade or opts.only:
            reason = "--regrade" if opts.regrade else "--only"
        else:
            try:
                reason = staleness(read_result(out), entry.id, sha, suite, exercise_ids, grade_opts.seed,
                                   state.get(entry.id), key)
            except Exception as exc:  # noqa: BLE001 -- a result file no grade of ours wrote: grade it again
                reason = f"its last result could not be read ({type(exc).__name__}: {str(exc)[:200]})"
        if reason is None:
            skipped.append(entry.id)
            continue
        why[entry.id] = reason
        todo.append((Job(entry.id, entry.path, out, options_of(grade_opts, entry.id, batch_seed), budget), sha, key))
    save_state(out_dir, state, batch_seed)

    lanes = min(opts.jobs, len(opts.gpus)) if opts.gpus else opts.jobs
    lanes = max(1, min(lanes, len(todo) or 1))
    console.print(inert(f"{len(entries)} submissions in {opts.submissions}: {len(todo)} to grade, {len(skipped)} current "
                        f"(kept); {lanes} in parallel" + (f" on GPUs {','.join(opts.gpus[:lanes])}" if opts.gpus else "")),
                  markup=False, highlight=False)

    jobs: queue.Queue = queue.Queue()
    for item in todo:
        jobs.put(item)
    done: queue.Queue = queue.Queue()
    stop = threading.Event()

    def lane(gpu: str | None) -> None:
        slot = None
        try:
            slot = backend.open_slot(gpu)
            while not stop.is_set():
                try:
                    job, sha, key = jobs.get_nowait()
                except queue.Empty:
                    return
                done.put(("job", *_grade_one(slot, job, sha, key, course, exercises, suite, stop)))
        except Exception:  # a lane that cannot work at all: its jobs go to the others, or fail below
            done.put(("lane", traceback.format_exc(limit=4)))
        finally:
            if slot is not None:
                try:
                    slot.close()
                except Exception:
                    pass

    gpus: list[str | None] = list(opts.gpus[:lanes]) if opts.gpus else [None] * lanes
    threads = [threading.Thread(target=lane, args=(g,), daemon=True, name=f"grader-lane-{i}") for i, g in enumerate(gpus)]
    graded: list[str] = []
    internal: list[str] = []
    problems = 0
    interrupted = False
    columns = [TextColumn("[bold]grading"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[tally]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn()]
    # Ctrl-C only sets a flag, and the loop below raises it where it stands: a KeyboardInterrupt raised inside
    # a queue's lock (done.get) could leave the lock held, and the lanes, putting their results, waited on it
    # for good (the batch then outlived its interruption by minutes).
    interrupt = threading.Event()
    previous = (signal.signal(signal.SIGINT, lambda *_: interrupt.set())
                if threading.current_thread() is threading.main_thread() else None)
    try:
        with Progress(*columns, console=console, transient=False, disable=not todo) as progress:
            task = progress.add_task("grading", total=len(todo), tally="")
            for t in threads:
                t.start()
            finished = 0
            while finished < len(todo):
                if interrupt.is_set():
                    raise KeyboardInterrupt
                try:
                    item = done.get(timeout=0.5)
                except queue.Empty:
                    if not any(t.is_alive() for t in threads) and done.empty():
                        break  # every lane failed to start: the rest of the jobs cannot run
                    continue
                if item[0] == "lane":
                    progress.console.print(Text.assemble(("a grading lane failed:", "red"), " ", inert(item[1])))
                    continue
                _, job_id, sha, key, result, error = item
                finished += 1
                graded.append(job_id)
                if error is None and result is not None and result.get("state") == "complete" \
                        and (result.get("submission") or {}).get("sha256") == sha and key is not None:
                    state[job_id] = key
                else:
                    state.pop(job_id, None)
                save_state(out_dir, state, batch_seed)
                line = one_line(job_id, result, error)
                if error is not None:
                    internal.append(job_id)
                if error is not None or (result or {}).get("gradable") is False:
                    problems += 1
                progress.console.print(line, markup=False, highlight=False)
                progress.update(task, advance=1, tally=f"done {finished - problems} · failed {problems}")
            for job, sha, _key in _drain(jobs):  # only when no lane could start at all
                reason = "no grading lane could start (see the messages above)"
                results.write_atomic(job.out, internal_error_result(course, exercises, job, suite, sha, reason))
                progress.console.print(f"{job.id}: {INTERNAL_ERROR}: {reason}", markup=False, highlight=False)
                internal.append(job.id)
    except KeyboardInterrupt:
        interrupted = True
        stop.set()
        _drain(jobs)
        backend.stop()
        console.print("[yellow]interrupted: the submissions being graded keep a \"running\" result; "
                      "rerun the same command to finish the batch[/]")
    finally:
        stop.set()
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        deadline = time.monotonic() + 60
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))  # one minute for all lanes, not one each
    summary = summarize(course, out_dir, ids, exercise_ids)
    summary["run"] = {"graded": graded, "kept": skipped, "why": why, "internal_errors": internal,
                      "interrupted": interrupted, "wall_s": round(time.monotonic() - started, 2),
                      "backend": backend.fingerprint(), "lanes": lanes}
    write_summary(out_dir, summary)
    print_summary(summary, console)
    return BatchReport(ids, graded, skipped, internal, why, summary, time.monotonic() - started, interrupted)


def _drain(q: queue.Queue) -> list:
    items = []
    while True:
        try:
            items.append(q.get_nowait())
        except queue.Empty:
            return items


def _grade_one(slot: Slot, job: Job, sha: str | None, key: str | None, course: Course, exercises: list[Exercise],
               suite: str, stop: threading.Event) -> tuple:
    """Grade one submission through a slot; make sure a result file exists afterwards, whatever happened
    (except when the batch is being stopped: then what the grade finished stays, marked "running")."""
    try:
        run = slot.grade(job)
        error = run.error
    except InterruptedError:
        raise
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    result = read_result(job.out)
    if error is None and (result is None or result.get("state") != "complete"
                          or (result.get("submission") or {}).get("id") != job.id):
        error = "the grader finished without writing a complete result"
    if error is not None and not stop.is_set():
        try:
            result = internal_error_result(course, exercises, job, suite, sha, error)
            results.write_atomic(job.out, result)
        except Exception:
            result = None
    return job.id, sha, key, result, error


def grade_submission(course: Course, root: Path, entry: Entry, out_dir: Path, grade: GradeOptions,
                     backend: "Backend", timeout_s: float | None = None,
                     gpu: str | None = None) -> tuple[dict | None, str | None]:
    """Grade one submission exactly as a batch lane does, outside a batch (a Slurm array task, say):
    the result lands atomically in ``out_dir/<id>.json``, whatever happens. Returns (result, error),
    error being the backend's reason when the grader itself failed (the result then says so too).
    `gpu`: the device the grade may use, as the backend's lanes take it (a container gets it)."""
    exercises = selected_exercises(course, grade)
    exercise_ids = [e.id for e in exercises]
    suite = suite_sha256(root, exercises)
    sha, _content = content_fingerprint(course, entry, exercise_ids)
    job = Job(entry.id, entry.path, Path(out_dir) / f"{entry.id}.json", options_of(grade, entry.id),
              timeout_s or submission_budget(exercises, grade))
    slot = backend.open_slot(gpu)
    try:
        _, _, _, result, error = _grade_one(slot, job, sha, None, course, exercises, suite, threading.Event())
    finally:
        slot.close()
    return result, error


def cmd_batch(args: argparse.Namespace) -> int:
    err = Console(stderr=True)
    try:
        root = find_root()
        course = load_course(root)
        gpus = [g.strip() for g in args.gpus.split(",") if g.strip()] if args.gpus else None
        if args.gpus is not None and not gpus:
            raise BatchError(f"expected --gpus as a comma-separated list of device numbers, found {args.gpus!r}")
        grade = GradeOptions.from_args(args)
        opts = BatchOptions(
            submissions=Path(args.submissions).absolute(), out=Path(args.out).absolute(),
            jobs=args.jobs or (len(gpus) if gpus else 1), gpus=gpus, regrade=args.regrade, only=args.only or None,
            allow_shared_identity=args.allow_shared_identity, new_seed=args.new_seed, grade=grade)
        backend = backend_from_args(args, root, grade)
        if args.backend == "local":
            grade.check_account()
        report = run_batch(course, root, opts, backend=backend)
    except (BatchError, CourseError, BackendError, OptionsError) as exc:
        err.print(Text.assemble(("error:", "red"), " ", inert(str(exc))))
        return exitcodes.BAD_INPUT
    if report.interrupted:
        return exitcodes.INTERRUPTED
    return batch_status(report)


def batch_status(report: BatchReport) -> int:
    """The batch's exit status (grader/exitcodes.py), over every submission, those kept from an earlier run
    too: 1 when the grader failed on any, else 3 when any is not gradable, else 0."""
    failed = set(report.internal_errors) | {s["id"] for s in report.summary["internal_error"]}
    return exitcodes.of(len(failed), len(report.summary["not_gradable"]))


def add_commands(subparsers) -> None:
    """Register `grader batch` on the CLI's subparsers."""
    b = subparsers.add_parser("batch", help="grade a folder of submissions in parallel, resumably, with a summary",
                              description=__doc__.split("\n\n")[2] if __doc__ else None,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("submissions", help="a folder whose sub-folders and archives are the submissions, named by student id")
    b.add_argument("--out", "-o", required=True, help="results folder: <id>.json per submission, summary.json, scores.png")
    b.add_argument("--jobs", "-j", type=int, help="submissions graded at once (default 1, or one per GPU)")
    b.add_argument("--gpus", help="comma-separated GPU numbers; each parallel job owns one (CUDA_VISIBLE_DEVICES)")
    b.add_argument("--regrade", action="store_true", help="grade every submission again, current results or not")
    b.add_argument("--allow-shared-identity", action="store_true",
                   help="allow --jobs > 1 where workers of different grades would share an identity (not root, "
                        "no user namespaces, --user NAME or --no-isolate); the batch refuses otherwise")
    b.add_argument("--only", nargs="+", metavar="ID", help="grade only these submissions (again); keep the others")
    b.add_argument("--new-seed", action="store_true", help="draw a new secret seed for this batch (default: the one "
                   "RESULTS_DIR/.batch-state.json keeps, so that a regrade draws the same hidden inputs)")
    add_grade_options(b)
    add_backend_options(b)
    b.set_defaults(fn=cmd_batch)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.scale.batch")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
