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
(grader/container.py) start one container of the course image per submission in `Slot.grade`.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import queue
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from grader import results
from grader.course import Course, CourseError, Exercise, find_root, load_course
from grader.harness import identity
from grader.runner import GradeOptions, selected_exercises, suite_sha256
from grader.submission import SubmissionError, locate, raw_digest
from grader.text import inert

STATE_FILE = ".batch-state.json"
STATE_SCHEMA = "llm-efficiency-lab/batch-state/v1"
SUMMARY_FILE = "summary.json"
HISTOGRAM_FILE = "scores.png"
RESERVED_IDS = {Path(SUMMARY_FILE).stem}
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".zip", ".tar")
INTERNAL_ERROR = results.INTERNAL_ERROR
# How long after the exercises' own time limits the grade of one submission may take before the batch
# stops it: the runner waits up to 30 s for each pytest to exit, plus starting and writing.
SLACK_PER_EXERCISE_S = 30.0
SLACK_PER_SUBMISSION_S = 120.0


class BatchError(ValueError):
    """Bad input to the batch (the message says what was expected and what was found)."""


# ---------------------------------------------------------------------------------------------
# Finding the submissions


@dataclass(frozen=True)
class Entry:
    id: str
    path: Path


def submission_id(path: Path) -> str:
    """The id of the submission at `path`: its name without an archive suffix, made safe to be a file
    name in the results folder (see `safe_id`)."""
    return safe_id(_natural_id(path))


def _natural_id(path: Path) -> str:
    name = path.name
    if path.is_file():
        for suffix in ARCHIVE_SUFFIXES:
            if name.lower().endswith(suffix) and len(name) > len(suffix):
                return name[: -len(suffix)]
        return path.stem or name
    return name


# A result is RESULTS_DIR/<id>.json, written through a temporary ".<id>.json.XXXXXXXX" beside it: an id
# of at most this many bytes keeps both within the 255 bytes most file systems allow in one name.
MAX_ID_BYTES = 200


def safe_id(natural: str) -> str:
    """`natural` itself where it can name a result file; otherwise a stable id that can, made of its
    first printable characters, "~" and 12 hex digits of its hash. That covers an id the batch keeps for
    itself ("summary", in any case: a case-insensitive file system would mix the two files up), one too
    long for a file name, and one whose bytes are not text (or hold control characters). Grading one
    student must never depend on another's choice of name, and never stop the batch."""
    raw = natural.encode("utf-8", "surrogateescape")
    printable = natural.isprintable() and not any(0xD800 <= ord(c) <= 0xDFFF for c in natural)
    if printable and len(raw) <= MAX_ID_BYTES and natural.lower() not in RESERVED_IDS and natural:
        return natural
    return _hashed_id(natural)


def _hashed_id(natural: str) -> str:
    raw = natural.encode("utf-8", "surrogateescape")
    head = "".join(c for c in natural if c.isprintable() and not 0xD800 <= ord(c) <= 0xDFFF)
    while len(head.encode()) > 96:
        head = head[:-1]
    return f"{head}~{hashlib.sha256(raw).hexdigest()[:12]}"


def hidden_entries(folder: Path) -> list[str]:
    """Names in `folder` that are not submissions: dot files and macOS's "__MACOSX" archive folders."""
    return sorted(p.name for p in Path(folder).iterdir() if p.name.startswith((".", "__MACOSX")))


def discover(folder: Path) -> tuple[list[Entry], dict[str, list[Path]]]:
    """The submissions in `folder`, by id; and the ids that cannot be graded (id -> paths): claimed by
    more than one entry, or a symbolic link (never followed: it could point at the course's solutions)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise BatchError(f"expected a folder of submissions at {folder}, found "
                         f"{'a file' if folder.exists() else 'nothing'} there")
    by_id: dict[str, list[Path]] = {}
    for path in sorted(folder.iterdir()):
        if path.name.startswith((".", "__MACOSX")):
            continue
        by_id.setdefault(submission_id(path), []).append(path)
    # Ids that differ only in letter case ("Bob", "bob") would share one result file on a case-insensitive file
    # system (macOS, Windows): each gets its hash, as an unusable name does.
    folded: dict[str, list[str]] = {}
    for i in by_id:
        folded.setdefault(i.casefold(), []).append(i)
    for group in (g for g in folded.values() if len(g) > 1):
        for i in group:
            by_id.setdefault(_hashed_id(i), []).extend(by_id.pop(i))
    entries = [Entry(i, paths[0]) for i, paths in sorted(by_id.items())]
    conflicts = {i: paths for i, paths in by_id.items() if len(paths) > 1 or any(p.is_symlink() for p in paths)}
    return entries, conflicts


def describe_entries(folder: Path, entries: list[Entry]) -> list[str]:
    """Lines for the console about entries graded under another name, and names that are not graded."""
    lines = [f"{e.path.name!r} is graded as {e.id!r} (its own name cannot name a result file: reserved, "
             f"too long, not printable, or another entry's but for letter case)" for e in entries
             if e.id != _natural_id(e.path)]
    hidden = hidden_entries(folder)
    if hidden:
        shown = ", ".join(repr(n) for n in hidden[:5]) + (f" and {len(hidden) - 5} more" if len(hidden) > 5 else "")
        lines.append(f"not submissions, skipped: {shown} (names starting with '.' or '__MACOSX'; rename to grade)")
    return lines


def content_fingerprint(course: Course, entry: Entry, exercise_ids: list[str]) -> tuple[str | None, str | None]:
    """(the submission hash a result graded now would record, a key for the state file).

    A readable submission: its hash, exactly as the runner computes it. An unreadable one records
    an empty hash, so the key holds the hash of the archive's bytes: replacing a bad archive with
    another bad archive is noticed. (None, None) if even that fails: grade it and see.

    Bounded like the grade itself: `locate` refuses any archive within its limits (count, sizes,
    ratio, headers) without unpacking more than they allow, and the raw hash reads at most
    `submission.RAW_HASH_BYTES` of a plain file (never a FIFO or a link).
    """
    try:
        sub = locate(course, entry.path, exercise_ids, entry.id)
    except SubmissionError:
        raw = raw_digest(entry.path)
        return ("", "raw:" + raw) if raw is not None else (None, None)
    except OSError:
        return None, None
    sub.cleanup()
    return sub.sha256, sub.sha256


# ---------------------------------------------------------------------------------------------
# Backends: grade one submission into one result file


@dataclass
class Job:
    id: str
    source: Path
    out: Path
    options: GradeOptions
    timeout_s: float


@dataclass
class JobRun:
    """How grading one submission went, from the backend's side (the result file says the rest)."""
    error: str | None = None  # None: the backend saw nothing wrong
    duration_s: float = 0.0


class Slot(Protocol):
    """One lane of the batch: grades one submission at a time, bound to at most one GPU."""

    def grade(self, job: Job) -> JobRun: ...

    def close(self) -> None: ...


class Backend(Protocol):
    name: str

    def fingerprint(self) -> str:
        """What besides the tests decides a grade (a container image digest); part of the resume key."""

    def open_slot(self, gpu: str | None) -> Slot: ...

    def stop(self) -> None:
        """Stop everything now (Ctrl-C): running grades die; their results stay "running"."""


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _wait_stopped(pid: int, timeout_s: float = 1.0) -> None:
    """Until `pid` is stopped (or gone), at most `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state in ("T", "t", "Z", "X"):
            return
        time.sleep(0.001)


def kill_tree(pid: int) -> None:
    """Kill `pid` and everything it started, including processes in sessions of their own.

    Each process is stopped before its children are listed, so none can fork or be orphaned away
    while the tree is walked; then all are killed.
    """
    if not Path("/proc/self/stat").exists():  # not Linux: the process group is the best we have
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return
    stopped: list[int] = []
    frontier = [pid]
    for _ in range(100):
        for p in frontier:
            try:
                os.kill(p, signal.SIGSTOP)
                stopped.append(p)
            except (ProcessLookupError, PermissionError):
                pass
        for p in frontier:  # SIGSTOP lands asynchronously: one still finishing a fork would add a child unseen
            _wait_stopped(p)
        frontier = [p for p in descendants(pid) if p not in stopped]
        if not frontier:
            break
    for p in stopped:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _options_json(opts: GradeOptions) -> dict:
    data = dataclasses.asdict(opts)
    data["log_dir"] = str(opts.log_dir) if opts.log_dir else None
    data["hide"] = list(opts.hide)
    return data


def _options_from_json(data: dict) -> GradeOptions:
    data = dict(data)
    data["log_dir"] = Path(data["log_dir"]) if data.get("log_dir") else None
    data["hide"] = tuple(data.get("hide") or ())
    return GradeOptions(**data)


class LocalSlot:
    """A lane of the local backend: one long-lived grading process (``python -m grader.batch _serve``)
    that grades the submissions it is sent one after another, so torch and the grader are imported
    once per lane, not once per submission. A grade that overruns its budget kills that process and
    everything under it; the next submission gets a fresh one."""

    RECYCLE_AFTER = 100  # submissions per grading process, to bound anything that accumulates

    def __init__(self, backend: "LocalBackend", gpu: str | None):
        self.backend = backend
        self.gpu = gpu
        self.proc: subprocess.Popen | None = None
        self.log: tempfile._TemporaryFileWrapper | None = None
        self.served = 0
        self._buffer = b""

    def _start(self) -> None:
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        if self.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.gpu
        if self.log is not None:
            self.log.close()
        self.log = tempfile.TemporaryFile(prefix="grader-batch-lane-")
        with self.backend.lock:
            if self.backend.stopping:
                raise InterruptedError("the batch is stopping")
            self.proc = subprocess.Popen(self.backend.command, cwd=self.backend.root, env=env, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self.log, start_new_session=True)
            self.backend.procs.add(self.proc)
        self.served = 0
        self._buffer = b""

    def _kill(self) -> None:
        if self.proc is None:
            return
        with self.backend.lock:
            self.backend.procs.discard(self.proc)
        if self.proc.poll() is None:  # an unreaped process still owns its pid: safe to signal
            kill_tree(self.proc.pid)
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self.proc = None

    def _log_tail(self, limit: int = 1500) -> str:
        if self.log is None:
            return ""
        self.log.seek(0, os.SEEK_END)
        size = self.log.tell()
        self.log.seek(max(0, size - limit))
        return self.log.read().decode(errors="replace").strip()

    def _read_reply(self, deadline: float) -> bytes | str:
        """One reply line from the grading process, or "eof" (it died) or "late" (the deadline passed)."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return "late"
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return "eof"
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def grade(self, job: Job) -> JobRun:
        started = time.monotonic()
        if self.proc is None or self.proc.poll() is not None or self.served >= self.RECYCLE_AFTER:
            self._kill()
            self._start()
        request = {"id": job.id, "source": str(job.source), "out": str(job.out), "options": _options_json(job.options)}
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            self._kill()
            return JobRun(f"could not hand the submission to the grading process ({exc})", time.monotonic() - started)
        self.served += 1
        line = self._read_reply(started + job.timeout_s)
        duration = time.monotonic() - started
        if line == "late":
            self._kill()
            return JobRun(f"grading did not finish within the submission's budget of {job.timeout_s:g} s "
                          f"and was stopped", duration)
        if line == "eof":
            try:
                code = self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                code = "unknown: it closed its replies but did not exit"
            self._kill()
            tail = self._log_tail()
            return JobRun(f"the grading process died (exit code {code})"
                          + (f": {tail.splitlines()[-1]}" if tail else ""), duration)
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            self._kill()
            return JobRun(f"the grading process replied {line[:200]!r}, expected one JSON line", duration)
        return JobRun(None if reply.get("ok") else str(reply.get("error") or "unknown failure"), duration)

    def close(self) -> None:
        if self.proc is not None:
            try:
                self.proc.stdin.close()  # end of requests: the grading process exits by itself
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
            self._kill()
        if self.log is not None:
            self.log.close()


class LocalBackend:
    """Grades on this machine: the runner's own sandbox isolates each student's code."""

    name = "local"

    def __init__(self, root: Path, command: list[str] | None = None):
        self.root = Path(root)
        # The grading process is bound to this one: the kernel kills it if this process dies, even
        # by SIGKILL, so it can never go on to write a verdict for a batch that was stopped.
        self.command = command or [sys.executable, "-m", "grader.batch", "_serve", str(os.getpid())]
        self.lock = threading.Lock()
        self.procs: set[subprocess.Popen] = set()
        self.stopping = False

    def fingerprint(self) -> str:
        return self.name

    def open_slot(self, gpu: str | None) -> LocalSlot:
        return LocalSlot(self, gpu)

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            for proc in self.procs:
                if proc.poll() is None:
                    kill_tree(proc.pid)


BACKENDS = ("local", "docker", "apptainer")


def make_backend(name: str, root: Path, image: str | None = None, **container_options) -> Backend:
    """The backend called `name`: "local" (this machine, the runner's own sandbox), "docker" or
    "apptainer" (one container of the course image per submission; see grader/container.py)."""
    if name == "local":
        return LocalBackend(root)
    if name in ("docker", "apptainer"):
        from grader.container import ContainerBackend

        return ContainerBackend(root, runtime=name, image=image, **container_options)
    raise BatchError(f"expected a backend among {list(BACKENDS)}, found {name!r}")


def serve() -> int:
    """The grading process of a local lane: one JSON request per line on stdin, one reply per line."""
    from grader.runner import grade

    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything printed while grading goes to the log, never into the replies
    root = find_root()
    course = load_course(root)
    import torch  # noqa: F401  (the result's device record needs it: import it once, up front)

    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            grade(course, root, Path(request["source"]), Path(request["out"]), _options_from_json(request["options"]),
                  submission_id=request["id"])
            reply = {"ok": True}
        except Exception:  # the batch writes the failure into the result and goes on
            reply = {"ok": False, "error": traceback.format_exc(limit=8)[-3000:]}
        replies.write(json.dumps(reply) + "\n")
    return 0


# ---------------------------------------------------------------------------------------------
# Resuming: is a result current?


def read_result(path: Path) -> dict | None:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def options_key(opts: GradeOptions) -> dict:
    """The grading options that change a grade but that a result does not record."""
    return {"tests": opts.tests, "checks": sorted(opts.checks or []), "mode": opts.mode, "isolate": opts.isolate,
            "call_timeout_s": opts.call_timeout_s, "time_limit_s": opts.time_limit_s}


def state_key(content: str, opts: GradeOptions, backend: Backend) -> str:
    blob = json.dumps({"content": content, "options": options_key(opts), "backend": backend.fingerprint()},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def staleness(result: dict | None, sub_id: str, expected_sha: str | None, suite: str, exercise_ids: list[str],
              seed: int | None, recorded_key: str | None, key: str | None) -> str | None:
    """Why `result` must be graded again, or None when it is current."""
    if result is None:
        return "no result yet"
    if result.get("state") != "complete":
        return "the last grade failed on the grader's side" if result.get("state") == "error" else "the last grade did not finish"
    if (result.get("submission") or {}).get("id") != sub_id:
        return "the result belongs to another submission id"
    if expected_sha is None:
        return "the submission could not be read to compare it with the result"
    if result["submission"].get("sha256") != expected_sha:
        return "the submission changed"
    if result.get("suite_sha256") != suite:
        return "the tests changed"
    if [e.get("id") for e in result.get("exercises", [])] != exercise_ids:
        return "other exercises were graded"
    if seed is not None and result.get("seed") != seed:
        return f"graded with seed {result.get('seed')}, not {seed}"
    if key is None or recorded_key != key:
        return "graded with other options or another backend"
    return None


def load_state(out_dir: Path) -> dict[str, str]:
    data = read_result(out_dir / STATE_FILE)
    if not data or data.get("schema") != STATE_SCHEMA or not isinstance(data.get("keys"), dict):
        return {}
    return {str(k): str(v) for k, v in data["keys"].items()}


def save_state(out_dir: Path, keys: dict[str, str]) -> None:
    results.write_atomic(out_dir / STATE_FILE, {"schema": STATE_SCHEMA, "keys": dict(sorted(keys.items()))})


# ---------------------------------------------------------------------------------------------
# The batch


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


def write_conflict_result(course: Course, exercises: list[Exercise], out: Path, sub_id: str, paths: list[Path],
                          grade: GradeOptions, suite: str, then: str = "rerun") -> None:
    """Two entries claim one id, or the entry is a symbolic link: a complete, not-gradable result that
    names them."""
    names = ", ".join(p.name for p in paths)
    result = results.new_result(course, sub_id, "", suite, grade.seed or 0, grade.mode, exercises)
    result["gradable"] = False
    if len(paths) == 1:
        result["format_errors"] = [f"expected a folder or an archive at {paths[0].name}, found a symbolic link "
                                   f"(to {os.readlink(paths[0])!r}); links are never followed: hand in a copy"]
    else:
        result["format_errors"] = [f"expected one submission named {sub_id!r}, found {len(paths)}: {names}; "
                                   f"keep one and {then}"]
    for ex in result["exercises"]:
        ex["status"] = "ungradable"
        results.close_exercise(result, ex["id"], result["format_errors"][0])
    results.finish(result)
    results.write_atomic(out, result)


def submission_budget(exercises: list[Exercise], opts: GradeOptions) -> float:
    per_exercise = [(opts.time_limit_s or ex.time_limit_s) + SLACK_PER_EXERCISE_S for ex in exercises]
    return sum(per_exercise) + SLACK_PER_SUBMISSION_S


def internal_error_result(course: Course, exercises: list[Exercise], job: Job, suite: str, sha: str | None,
                          reason: str) -> dict:
    """What the batch writes when the grader failed on a submission: what it finished, and why it stopped."""
    result = read_result(job.out)
    if result is None or result.get("submission", {}).get("id") != job.id or result.get("state") == "complete":
        seed = job.options.seed if job.options.seed is not None else 0
        result = results.new_result(course, job.id, sha or "", suite, seed, job.options.mode, exercises)
    message = f"{INTERNAL_ERROR}, not a fault of the submission: {reason.strip()}; rerun the batch to retry"
    result["gradable"] = False
    result["format_errors"] = [message]
    for ex in result["exercises"]:
        if ex["status"] in ("pending", "running"):
            ex["status"] = "ungradable"
        results.close_exercise(result, ex["id"], message)
    result["state"] = "running"  # not complete: the next run grades it again
    return result


def _grade_options_for(opts: BatchOptions, root: Path) -> GradeOptions:
    """The batch's grade options, with the submissions and results folders hidden from the workers."""
    hide = list(opts.grade.hide)
    protected = [Path(tempfile.gettempdir()).resolve(), root.resolve()]
    for folder in (opts.submissions, opts.out):
        folder = Path(folder).resolve()
        # Never hide a folder that holds the workers' own files or the course.
        if not any(p == folder or folder in p.parents for p in protected):
            hide.append(str(folder))
    return dataclasses.replace(opts.grade, hide=tuple(hide))


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
    backend = backend or LocalBackend(root)
    grade_opts = _grade_options_for(opts, root)
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
    budget = opts.job_timeout_s or submission_budget(exercises, grade_opts)

    # Which submissions need grading, and why.
    todo: list[tuple[Job, str | None, str | None]] = []  # (job, expected sha, state key)
    why: dict[str, str] = {}
    skipped: list[str] = []
    for entry in entries:
        out = out_dir / f"{entry.id}.json"
        if entry.id in conflicts:
            write_conflict_result(course, exercises, out, entry.id, conflicts[entry.id], grade_opts, suite)
            state.pop(entry.id, None)
            continue
        if opts.only and entry.id not in opts.only:
            skipped.append(entry.id)
            continue
        sha, content = content_fingerprint(course, entry, exercise_ids)
        key = state_key(content, grade_opts, backend) if content is not None else None
        if opts.regrade or opts.only:
            reason = "--regrade" if opts.regrade else "--only"
        else:
            reason = staleness(read_result(out), entry.id, sha, suite, exercise_ids, grade_opts.seed,
                               state.get(entry.id), key)
        if reason is None:
            skipped.append(entry.id)
            continue
        why[entry.id] = reason
        todo.append((Job(entry.id, entry.path, out, grade_opts, budget), sha, key))
    save_state(out_dir, state)

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
    try:
        with Progress(*columns, console=console, transient=False, disable=not todo) as progress:
            task = progress.add_task("grading", total=len(todo), tally="")
            for t in threads:
                t.start()
            finished = 0
            while finished < len(todo):
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
                save_state(out_dir, state)
                line = _one_line(job_id, result, error)
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
        for t in threads:
            t.join(timeout=60)
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
    job = Job(entry.id, entry.path, Path(out_dir) / f"{entry.id}.json", grade,
              timeout_s or submission_budget(exercises, grade))
    slot = backend.open_slot(gpu)
    try:
        _, _, _, result, error = _grade_one(slot, job, sha, None, course, exercises, suite, threading.Event())
    finally:
        slot.close()
    return result, error


def _one_line(job_id: str, result: dict | None, error: str | None) -> str:
    """One line per graded submission, inert (ids and reasons can hold anything): print it without markup."""
    job_id = inert(job_id)[:200].replace("\n", " ")
    if error is not None:
        last = error.strip().splitlines()[-1] if error.strip() else error
        return f"{job_id}: {INTERNAL_ERROR}: {inert(last)[:200]}"
    kind, reason = classify(result)
    if kind != "graded":
        return f"{job_id}: {kind.replace('_', ' ')}: " + inert(reason)[:200].replace("\n", " ")
    return f"{job_id}: {result['score']:g}/{result['gradable_max_score']:g}"


# ---------------------------------------------------------------------------------------------
# The summary


def _failed(check: dict) -> bool:
    """Lost points on a check that was graded (a check not run or not gradable here is not a failure)."""
    if check["status"] == "not_graded":
        return False
    return check["status"] != "passed" or check["points"] < check["max_points"] - 1e-9


def _gradable_max(exercise: dict) -> float:
    return sum(c["max_points"] for c in exercise["checks"] if c["status"] != "not_graded")


def classify(result: dict | None) -> tuple[str, str]:
    """(kind, reason): graded, not_gradable, internal_error, unfinished or no_result."""
    if result is None:
        return "no_result", "no result yet"
    errors = "; ".join(result.get("format_errors") or [])
    if result.get("state") != "complete":
        if errors.startswith(INTERNAL_ERROR):
            return "internal_error", errors
        return "unfinished", "the grade did not finish (killed half-way?)"
    if result.get("gradable") is False:
        return "not_gradable", errors or "the submission could not be read"
    exercises = result.get("exercises") or []
    if exercises and all(e["status"] == "missing" for e in exercises):
        return "not_gradable", "nothing to grade: " + "; ".join(e["message"] for e in exercises)
    return "graded", ""


def _stats(values: list[float]) -> dict:
    if not values:
        return {"mean": None, "median": None, "min": None, "max": None}
    return {"mean": round(statistics.fmean(values), 3), "median": round(statistics.median(values), 3),
            "min": round(min(values), 3), "max": round(max(values), 3)}


def histogram(values: list[float], bins: int = 10, top: float = 100.0) -> dict:
    """Counts of `values` (percentages) in `bins` equal bins from 0 to `top`; the last bin holds `top`."""
    edges = [round(top * i / bins, 6) for i in range(bins + 1)]
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, max(0, int(v / top * bins)))] += 1
    return {"edges": edges, "counts": counts}


def summarize(course: Course, out_dir: Path, ids: list[str], exercise_ids: list[str]) -> dict:
    """Per-exercise statistics over the graded submissions; the submissions that could not be graded."""
    by_kind: dict[str, list[dict]] = {k: [] for k in ("not_gradable", "internal_error", "unfinished", "no_result")}
    graded: list[dict] = []
    for sub_id in ids:
        result = read_result(out_dir / f"{sub_id}.json")
        kind, reason = classify(result)
        if kind == "graded":
            graded.append(result)
        else:
            by_kind[kind].append({"id": sub_id, "reason": reason})
    per_exercise = []
    for ex_id in exercise_ids:
        course_ex = course.exercise(ex_id)
        scores, percents, tops, full, not_submitted = [], [], [], 0, 0
        failures: dict[str, list[str]] = {}
        titles: dict[str, str] = {}
        for result in graded:
            ex = next((e for e in result["exercises"] if e["id"] == ex_id), None)
            if ex is None:
                continue
            top = _gradable_max(ex)
            scores.append(ex["score"])
            percents.append(100 * ex["score"] / top if top > 0 else 0.0)
            tops.append(top)
            if ex["status"] == "missing":
                not_submitted += 1
                continue
            full += top > 0 and ex["score"] >= top - 1e-9
            for check in ex["checks"]:
                titles[check["id"]] = check["title"]
                if _failed(check):
                    failures.setdefault(check["id"], []).append(check["message"])
        most_failed = []
        for check_id, messages in sorted(failures.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:5]:
            message, count = Counter(m for m in messages if m).most_common(1)[0] if any(messages) else ("", 0)
            most_failed.append({"check": check_id, "title": titles[check_id], "failed": len(messages),
                                "message": message[:300], "with_this_message": count})
        per_exercise.append({"id": ex_id, "max_score": course_ex.points,
                             "gradable_max_score": max(tops) if tops else course_ex.points,
                             "graded": len(scores), **_stats(scores), "full_marks": int(full),
                             "not_submitted": not_submitted, "most_failed": most_failed,
                             "histogram": histogram(percents)})
    percents = [100 * r["score"] / r["gradable_max_score"] for r in graded if r["gradable_max_score"] > 0]
    return {
        "course": course.course,
        "generated_at": results.now(),
        "submissions": len(ids),
        "graded": len(graded),
        "total": {**_stats([r["score"] for r in graded]), "percent_of_gradable": _stats(percents),
                  "histogram": histogram(percents)},
        "exercises": per_exercise,
        **by_kind,
        "histogram_png": None,
    }


def draw_histogram(summary: dict, path: Path) -> None:
    """Histograms of the total (percent of gradable points) and of each exercise (percent of its points)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("total (% of gradable points)", summary["total"]["histogram"])]
    if len(summary["exercises"]) > 1:
        panels += [(f"{e['id']} (% of gradable points)", e["histogram"]) for e in summary["exercises"]]
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 2.4 * len(panels)), squeeze=False)
    for ax, (title, hist) in zip(axes[:, 0], panels):
        edges, counts = hist["edges"], hist["counts"]
        ax.bar(edges[:-1], counts, width=[b - a for a, b in zip(edges, edges[1:])], align="edge", edgecolor="black")
        ax.set_title(title, fontsize=10)
        ax.set_xlim(edges[0], edges[-1])
        ax.set_ylabel("submissions")
        ax.yaxis.get_major_locator().set_params(integer=True)
    axes[-1, 0].set_xlabel("score (%)")
    fig.suptitle(f"{summary['course']}: {summary['graded']} graded of {summary['submissions']} submissions")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_summary(out_dir: Path, summary: dict) -> None:
    try:
        draw_histogram(summary, out_dir / HISTOGRAM_FILE)
        summary["histogram_png"] = HISTOGRAM_FILE
    except ImportError:
        summary["histogram_png"] = None
        summary["histogram_note"] = "not drawn: matplotlib is not installed (pip install matplotlib)"
    results.write_atomic(out_dir / SUMMARY_FILE, summary)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def print_summary(summary: dict, console: Console) -> None:
    table = Table(title=f"batch summary: {summary['graded']} graded of {summary['submissions']} submissions",
                  box=box.SIMPLE_HEAVY, title_justify="left")
    for col in ("exercise", "graded", "mean", "median", "min", "max", "of", "full marks", "not submitted"):
        table.add_column(col, justify="left" if col == "exercise" else "right")
    for e in summary["exercises"]:
        of = f"{e['gradable_max_score']:g}" + (f" (of {e['max_score']:g})" if e["gradable_max_score"] != e["max_score"] else "")
        table.add_row(e["id"], str(e["graded"]), _num(e["mean"]), _num(e["median"]), _num(e["min"]), _num(e["max"]),
                      of, str(e["full_marks"]), str(e["not_submitted"]))
    console.print(table)
    for e in summary["exercises"]:
        if not e["most_failed"]:
            continue
        fails = Table(title=f"{e['id']}: most-failed checks", box=box.SIMPLE, title_justify="left")
        for col in ("check", "failed", "most common message"):
            fails.add_column(col, overflow="fold")
        for f in e["most_failed"]:
            fails.add_row(Text(inert(f["check"])), f"{f['failed']}/{e['graded'] - e['not_submitted']}",
                          Text(inert(f["message"])[:160]))
        console.print(fails)
    labels = {"not_gradable": "not gradable", "internal_error": INTERNAL_ERROR + " (retried on the next run)",
              "unfinished": "unfinished (retried on the next run)", "no_result": "no result yet"}
    rows = [(s["id"], labels[kind], s["reason"]) for kind in labels for s in summary[kind]]
    if rows:
        problems = Table(title="submissions without a full grade", box=box.SIMPLE, title_justify="left")
        for col in ("submission", "kind", "reason"):
            problems.add_column(col, overflow="fold")
        for row in rows:
            problems.add_row(Text(inert(row[0])), row[1], Text(inert(row[2])[:200]))
        console.print(problems)
    png = f" and {summary['histogram_png']}" if summary.get("histogram_png") else f" ({summary.get('histogram_note')})"
    console.print(f"summary written to {SUMMARY_FILE}{png}", markup=False, highlight=False)


# ---------------------------------------------------------------------------------------------
# Command line


def cmd_batch(args: argparse.Namespace) -> int:
    from grader.container import ContainerError, backend_from_args

    err = Console(stderr=True)
    try:
        root = find_root()
        course = load_course(root)
        gpus = [g.strip() for g in args.gpus.split(",") if g.strip()] if args.gpus else None
        if args.gpus is not None and not gpus:
            raise BatchError(f"expected --gpus as a comma-separated list of device numbers, found {args.gpus!r}")
        opts = BatchOptions(
            submissions=Path(args.submissions).absolute(), out=Path(args.out).absolute(), jobs=args.jobs or (len(gpus) if gpus else 1),
            gpus=gpus, regrade=args.regrade, only=args.only or None, allow_shared_identity=args.allow_shared_identity,
            grade=GradeOptions(exercises=args.exercise or None, seed=args.seed, tests=args.tests, checks=args.check or None,
                               call_timeout_s=args.call_timeout, time_limit_s=args.time_limit),
        )
        backend = backend_from_args(args, root)
        report = run_batch(course, root, opts, backend=backend)
    except (BatchError, CourseError, ContainerError) as exc:
        err.print(Text.assemble(("error:", "red"), " ", inert(str(exc))))
        return 2
    if report.interrupted:
        return 130
    return 1 if report.internal_errors else 0


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
    b.add_argument("--seed", type=int, help="seed for the hidden tests' inputs (default: a fresh secret one each)")
    b.add_argument("--exercise", "-e", action="append", help="grade only this exercise (repeatable)")
    b.add_argument("--tests", choices=("all", "public"), default="all")
    b.add_argument("--check", action="append", help="run only this check's tests (repeatable); the others: not run")
    b.add_argument("--call-timeout", type=float, help="override course.yaml's per-call limit (seconds)")
    b.add_argument("--time-limit", type=float, help="override course.yaml's per-exercise limit (seconds)")
    from grader.container import add_backend_options

    add_backend_options(b)
    b.set_defaults(fn=cmd_batch)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_serve"]:
        if len(argv) == 2 and argv[1].isdigit():
            from grader.harness.launch import die_with_parent

            die_with_parent()
            if os.getppid() != int(argv[1]):  # the batch died before the line above took effect
                return 1
        return serve()
    parser = argparse.ArgumentParser(prog="python -m grader.batch")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
