"""Grade a submission: one pytest process per exercise, its verdicts streamed to this process.

This process is the trusted side. It never imports student code and never runs it: for each
exercise it starts ``python -m pytest`` on the course's own public and hidden tests (never the
student's copy of them), whose `student` fixture runs the student's file in a sandboxed worker.
The plugin sends one JSON line per test over a pipe that only this process and its pytest child
hold. The result file is rewritten atomically after every test, so a grade killed half-way keeps
what it finished; when an exercise's pytest dies or runs out of time, its unfinished checks score
zero with the reason (fail closed).
"""

from __future__ import annotations

import ast
import fcntl
import glob
import hashlib
import json
import os
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Literal

from grader import forkserver, results, torchbuild
from grader.course import Course, Exercise
from grader.harness import cgroup, zygote
from grader.harness.client import describe_exit
from grader.options import GradeOptions
from grader.submission import Submission, SubmissionError, locate
from grader.text import inert


def selected_exercises(course: Course, opts: GradeOptions) -> list[Exercise]:
    """The exercises `opts` grades, in course order (all of them when it names none)."""
    return [e for e in course.exercises if not opts.exercises or e.id in opts.exercises]


def suite_sha256(root: Path, exercises: list[Exercise]) -> str:
    """A hash of everything of the course that decides a grade: course.yaml, and for each exercise its tests,
    its oracles, its speed cases (grader/cases/<id>.py: the graded shapes) and its drivers
    (grader/support/<id>.py). A batch regrades a result whose hash differs."""
    digest = hashlib.sha256((root / "course.yaml").read_bytes())
    for ex in exercises:
        paths = sorted((root / "exercises" / ex.id).glob("test*.py"))
        hidden = root / "grader" / "hidden" / ex.id
        paths += sorted(hidden.rglob("*.py")) if hidden.is_dir() else []
        paths += [p for p in (root / "grader" / "cases" / f"{ex.id}.py", root / "grader" / "support" / f"{ex.id}.py")
                  if p.is_file()]
        for path in paths:
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def test_paths(root: Path, exercise: Exercise, tests: str) -> list[Path]:
    paths = [root / "exercises" / exercise.id / "test_public.py"]
    hidden = root / "grader" / "hidden" / exercise.id
    if tests == "all" and hidden.is_dir():
        paths.append(hidden)
    return [p for p in paths if p.exists()]


def hidden_folders(root: Path) -> list[str]:
    return [str(root / name) for name in ("solutions", "grader/hidden", "tests")]


def run_exercise(root: Path, exercise: Exercise, files_dir: Path | None, seed: int, opts: GradeOptions,
                 on_event: Callable[[dict], None], tmp_dir: str | None = None) -> str | None:
    """Run one exercise's tests; call `on_event` per event. Returns a reason if it ended abnormally."""
    paths = test_paths(root, exercise, opts.tests)
    if not paths:
        return "this exercise has no tests"
    read_fd, write_fd = os.pipe()
    cmd = [
        sys.executable, "-m", "pytest", *map(str, paths),
        "-q", "--tb=short", "-p", "no:cacheprovider", "-p", "grader.plugin", "--import-mode=importlib",
        "--rootdir", str(root), "-c", os.devnull, "-o", "addopts=",
        "--grader-mode", opts.mode, "--grader-events", str(write_fd),
        "--grader-user", opts.user, "--grader-prestart", exercise.id,
        "--grader-hide", os.pathsep.join([*hidden_folders(root), *opts.hide]),
    ]
    if files_dir is not None:
        cmd += ["--grader-submission", str(files_dir)]
    if not opts.isolate:
        cmd.append("--grader-no-isolate")
    if opts.checks:
        cmd += ["--grader-checks", ",".join(opts.checks)]
    if opts.call_timeout_s is not None:
        cmd += ["--grader-call-timeout", str(opts.call_timeout_s)]
    if opts.first_failure:
        cmd.append("--grader-first-failure")
    tag = grade_tag(tmp_dir)
    if tag is not None:
        cmd += ["--grader-grade-tag", tag]
    # The seed travels in the environment, which only this user can read (/proc/PID/environ), not on
    # the command line, which any process on the machine (or in the grading container) can.
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PYTHONDONTWRITEBYTECODE="1", GRADER_SEED=str(seed))
    env.pop("PYTEST_ADDOPTS", None)
    if tmp_dir is not None:
        env["TMPDIR"] = tmp_dir
    log_path = (opts.log_dir / f"{exercise.id}.log") if opts.log_dir else None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "wb") if log_path else open(os.devnull, "wb")
    keep = [write_fd]
    warm_worker = worker_zygote() if opts.mode == "sandbox" and opts.isolate else None
    if warm_worker is not None:  # the worker starts warm: its socket travels under its own number
        env[zygote.ENV_VAR] = warm_worker.handle()
        keep.append(warm_worker.sock.fileno())
    proc: subprocess.Popen | forkserver.ForkedProcess | None
    try:
        server = warm_server(env)
        proc = server.spawn(cmd, env, str(root), log.fileno(), keep) if server else None
    except OSError as exc:
        _warm_failed(exc)
        proc = None
    try:
        if proc is None:
            proc = subprocess.Popen(cmd, cwd=root, env=env, pass_fds=keep, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        os.close(write_fd)
        log.close()
    try:
        return _follow(proc, read_fd, exercise, opts, on_event)
    finally:
        _kill(proc)  # whatever happened here, no pytest (and no worker under it) outlives this call
        if tag is not None:  # nor a worker's cgroup, which a killed pytest could not remove
            cgroup.reap(tag)
        if log_path is not None:
            make_log_inert(log_path)


def make_log_inert(path: Path) -> None:
    """Rewrite a pytest log (--log-dir) without escape sequences or control characters: its failure
    messages quote what the student's code returned and raised, and an instructor reads it on a terminal
    (a class named with escapes drew a green "100/100 passed" there)."""
    tmp = path.with_name(path.name + ".inert")
    with open(path, "rb") as raw, open(tmp, "w", encoding="utf-8") as clean:
        for line in raw:
            clean.write(inert(line.decode("utf-8", errors="replace").rstrip("\r\n")) + "\n")
    os.replace(tmp, path)


SYNTAX_CHECK_BYTES = 256 << 10  # parsing costs ~500 bytes a byte: a larger file is left to the worker's import
DECODE_CHECK_BYTES = 16 << 20  # decoding is cheap: a file up to this size is checked to be text in its encoding


def syntax_error(path: Path) -> str | None:
    """Why the student's file cannot be compiled (its syntax error, where), or None. The file is parsed here,
    in the trusted process, never run; one that does not parse is not worth starting a worker for, and the
    student gets one message that points at the line instead of one failure per test."""
    try:
        with open(path, "rb") as f:
            source = f.read(DECODE_CHECK_BYTES + 1)
    except OSError:
        return None
    import io
    import tokenize

    from grader.harness.tamper import standard_encoding

    not_source = f"{path.name} is not Python source: {{}} (save it as UTF-8 text; a notebook is handed in as .ipynb)"
    try:  # an exotic coding cookie (punycode decodes in quadratic time) is left to the worker
        encoding = tokenize.detect_encoding(io.BytesIO(source).readline)[0]
        if not standard_encoding(encoding):
            return None
    except SyntaxError as exc:  # undecodable first lines, a BOM that contradicts the cookie, an unknown codec
        return inert(not_source.format(exc.msg), 1000)
    except LookupError as exc:
        return inert(not_source.format(f"its coding line names an unknown encoding ({exc})"), 1000)
    if len(source) <= DECODE_CHECK_BYTES:  # decoding is linear: a file too large to parse is still read through
        try:
            source[3 if source.startswith(b"\xef\xbb\xbf") else 0:].decode(encoding)
        except UnicodeDecodeError as exc:
            return inert(not_source.format(f"byte {exc.start} is not valid {encoding}"), 1000)
        null = source.find(bytes(1))
        if null >= 0:
            return inert(not_source.format(f"it holds a null byte at byte {null}"), 1000)
    if len(source) > SYNTAX_CHECK_BYTES:  # parsing costs ~500 bytes a byte: a larger file is left to the worker
        return None
    try:
        compile(source, path.name, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
    except SyntaxError as exc:
        where = f"line {exc.lineno}" + (f", column {exc.offset}" if exc.offset else "")
        code = f": {exc.text.strip()[:200]}" if exc.text and exc.text.strip() else ""
        return inert(f"{path.name} does not compile: SyntaxError at {where}: {exc.msg}{code}", 1000)
    except (ValueError, RecursionError, MemoryError) as exc:
        return inert(f"{path.name} does not compile: {type(exc).__name__}: {exc}", 1000)
    return None


def grade_exercise(root: Path, exercise: Exercise, files_dir: Path | None, seed: int, opts: GradeOptions,
                   result: dict, on_event: Callable[[dict], None] | None = None, tmp_dir: str | None = None) -> None:
    """Run one exercise's tests and record every outcome in `result` (one loop for grade, check and
    interview): each test as it reports, then, fail closed, every collected test that did not report
    and every check with no test at all, with the reason. A file that does not compile is not run: the
    exercise is ungradable, every check scores zero with the syntax error."""
    entry = results.find_exercise(result, exercise.id)
    problem = syntax_error((files_dir or root / "exercises" / exercise.id) / exercise.file)
    if problem is not None:
        entry["status"] = "ungradable"
        results.close_exercise(result, exercise.id, problem)  # its CUDA checks: not graded on a host without CUDA
        return
    # The machine's faults, found before they could cost the student a point: a torch CI never ran on, too
    # little memory for this exercise's measured peak.
    # (A student's `make check` runs in local mode: there an untested torch is only a warning.)
    short = torchbuild.untested_reason(opts.allow_untested_torch or opts.mode != "sandbox") or (
        memory_shortfall(exercise) if opts.mode == "sandbox" else None)
    if short is not None:  # the machine's fault, found before it could cost the student a point
        results.close_exercise(result, exercise.id, short)
        results.grader_failure(result, exercise.id, short)
        return
    collected: dict = {}
    not_loaded: list[str] = []  # why the student's file raised at import, when a test saw it (the plugin's event)
    started = time.perf_counter()

    def record(event: dict) -> None:
        if event.get("exercise") == exercise.id and event.get("event") == "collected":
            collected.update(event)
        elif event.get("exercise") == exercise.id and event.get("event") == "load_failed":
            not_loaded.append(str(event.get("message", "")))
        elif event.get("exercise") == exercise.id and event.get("event") == "test":
            results.record_test(result, event)
            results.update_totals(result)
        if on_event is not None:
            on_event(event)

    reason = run_exercise(root, exercise, files_dir, seed, opts, record, tmp_dir=tmp_dir)
    grader_faults = [t["message"] for c in entry["checks"] for t in c["tests"] if t.get("grader_error")]
    if isinstance(reason, GraderFault):
        grader_faults.insert(0, str(reason))
    entry["duration_s"] = time.perf_counter() - started
    entry["status"] = "graded"
    if opts.checks:
        for check in entry["checks"]:
            if check["id"] not in opts.checks and not check["tests"]:
                check.update(status="not_graded", message="not run: only some checks were selected")
    results.close_exercise(result, exercise.id, reason, status="timeout" if reason and "time limit" in reason else None,
                           collected=collected)
    if not_loaded:
        results.did_not_load(result, exercise.id, not_loaded[0])
    if grader_faults:  # the grading machine failed, not the student: an error of the grade, never a score
        results.grader_failure(result, exercise.id, grader_faults[0])


def torch_is_cuda_build() -> bool:
    """Whether the installed torch is a CUDA build (GPU or not): its processes need about twice the host memory.
    Read from torch's version file without importing torch (grader/torchbuild.py): the trusted side never pays
    for torch's import, which would count in the very peak this answer is for."""
    build = torchbuild.installed()
    return build is not None and build.cuda is not None


def memory_shortfall(exercise: Exercise) -> str | None:
    """Why this machine cannot grade `exercise` for want of memory, or None. A grade killed by the OOM killer
    part-way (Gradescope's default is 768 MiB) would read as the student's crash; so an exercise whose measured
    peak for this build of torch (course.yaml ``memory_mb``, or ``memory_mb_cuda_torch`` with a CUDA build) does
    not fit the limit is not graded at all: an error of the grade, with what to set. ``GRADER_IGNORE_MEMORY=1``
    grades anyway."""
    if os.environ.get("GRADER_IGNORE_MEMORY") == "1":
        return None
    cuda_torch = torch_is_cuda_build()
    needs = exercise.memory_needed(cuda_torch)
    if needs is None:
        return None
    from grader.harness.cgroup import memory_limit_mb

    limit = memory_limit_mb()
    if limit is None or limit >= needs:
        return None
    figure = "memory_mb_cuda_torch, with this machine's CUDA build of torch" if cuda_torch else "memory_mb"
    return (f"this machine lets a grade use {limit:,} MiB of memory, and grading {exercise.id} needs about "
            f"{needs:,} MiB at its peak (measured; course.yaml {figure}), so it was not graded: raise "
            "the memory limit (on Gradescope, the autograder's memory setting) and regrade")


class GraderFault(str):
    """Why a run ended that is the grading machine's fault (its pytest died), not the student's."""


_warm: dict[int, "forkserver.ForkServer | None"] = {}  # by this process's pid: a fork has a server of its own


def warm_server(env: dict[str, str]) -> "forkserver.ForkServer | None":
    """The fork server that starts this process's pytest children warm (grader/forkserver.py), or None for a
    cold start: GRADER_COLD_START=1, no fork on this platform, or the server could not start (warned once)."""
    if os.environ.get("GRADER_COLD_START") == "1" or not hasattr(os, "fork") or sys.platform != "linux":
        return None
    server: forkserver.ForkServer | None | Literal[False] = _warm.get(os.getpid(), False)  # False: none yet
    if server is None:
        return None  # it failed before
    if server and not server.usable_for(env):
        server.close()
        server = False
    if not server:
        try:
            server = forkserver.ForkServer({k: v for k, v in env.items() if k not in forkserver.PER_GRADE_ENV})
        except OSError as exc:
            _warm_failed(exc)
            return None
        _warm[os.getpid()] = server
    return server


def warm_server_pids() -> set[int]:
    """The fork servers this process keeps (helpers that outlive each grade by design, ended with this process):
    the pytest fork server and the worker's zygote."""
    servers = [*_warm.values(), *_zygotes.values()]
    return {server.proc.pid for server in servers if server and server.proc.poll() is None}


_zygotes: dict[int, "zygote.Zygote | None"] = {}  # by this process's pid, as _warm


def worker_zygote() -> "zygote.Zygote | None":
    """The zygote that starts this process's sandboxed workers warm (grader/harness/zygote.py), or None: they
    start cold (GRADER_COLD_START=1, not Linux, a GPU on this machine, or the zygote could not start)."""
    if os.environ.get("GRADER_COLD_START") == "1" or sys.platform != "linux" or glob.glob("/dev/nvidia[0-9]*"):
        return None
    if os.getpid() in _zygotes and _zygotes[os.getpid()] is None:
        return None  # it failed before
    server = _zygotes.get(os.getpid())
    if server is not None and server.alive():
        return server
    if server is not None:
        server.close()
    from grader.harness.client import Sandbox, worker_environment

    try:
        server = zygote.Zygote(worker_environment(Sandbox(isolate=True, cuda=False)))
    except OSError as exc:
        print(f"grader: starting each sandboxed worker cold ({exc})", file=sys.stderr)
        server = None
    _zygotes[os.getpid()] = server
    return server


def _warm_failed(exc: Exception) -> None:
    if _warm.get(os.getpid()) is not None or os.getpid() not in _warm:
        print(f"grader: starting each exercise's tests cold ({exc})", file=sys.stderr)
    server = _warm.get(os.getpid())
    if server:
        server.close()
    _warm[os.getpid()] = None


QUIET_S = 15.0  # after this long with no event, `_follow` tells its caller ("quiet" events), and again as often


def _follow(proc: "subprocess.Popen | forkserver.ForkedProcess", read_fd: int, exercise: Exercise, opts: GradeOptions,
            on_event: Callable[[dict], None]) -> str | None:
    """Read the events of a running pytest until it ends or runs out of time. Besides pytest's own events, a
    {"event": "quiet", "seconds": n} every QUIET_S seconds that pass without one (self-study says which test
    runs long)."""
    time_limit = opts.time_limit_s or exercise.time_limit_s
    deadline = time.monotonic() + time_limit
    buffer = b""
    reason = None
    saw_session_end = False
    heard = quiet_said = time.monotonic()
    with os.fdopen(read_fd, "rb", buffering=0) as pipe:
        while True:
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                reason = f"the exercise's time limit of {time_limit:g} s ended the run before this test"
                _kill(proc)
                break
            if now - quiet_said >= QUIET_S and now - heard >= QUIET_S:  # a long test, or a hang: say so
                quiet_said = now
                on_event({"event": "quiet", "exercise": exercise.id, "seconds": round(now - heard)})
            ready, _, _ = select.select([pipe], [], [], min(left, 1.0))
            if not ready:
                continue
            heard = quiet_said = time.monotonic()
            chunk = pipe.read(1 << 16)
            if not chunk:
                break
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue
                saw_session_end |= event.get("event") == "session"
                on_event(event)
    try:
        code = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        _kill(proc)
        code = proc.wait()
    if reason is None and (not saw_session_end or code not in (0, 1)):
        # pytest is the grader's own process: its dying (out of memory, a crash, a collection error
        # in the course's tests) is a failure of the grade, never the student's
        how = describe_exit(code) if code is not None and code < 0 else f"it exited with code {code}"
        hint = " (out of memory? raise the machine's memory limit)" if code == -signal.SIGKILL else ""
        reason = GraderFault(f"the grader's test process for {exercise.id} stopped before it finished: {how}{hint}")
    return reason


def _kill(proc: "subprocess.Popen | forkserver.ForkedProcess") -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


PRIVATE_PREFIX = "grader-grade-"
_held_locks: dict[str, int] = {}


def private_folder() -> str:
    """A fresh folder for one grade (mode 0711: only this process can list it; a worker may pass
    through to its own scratch folder), holding a lock for as long as this process lives. Folders of
    grades whose process died (the lock is free) are removed first."""
    reap_private_folders()
    folder = tempfile.mkdtemp(prefix=PRIVATE_PREFIX)
    os.chmod(folder, 0o711)
    fd = os.open(os.path.join(folder, ".lock"), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    _held_locks[folder] = fd
    return folder


def grade_tag(private: str | None) -> str | None:
    """The tag of the grade whose private folder is `private` (its random suffix): the grade's workers'
    cgroups carry it, so that the runner can remove them whatever became of the pytest that made them."""
    name = os.path.basename(private or "")
    if not name.startswith(PRIVATE_PREFIX):
        return None
    tag = name[len(PRIVATE_PREFIX):]
    return tag if cgroup.TAG.fullmatch(tag) else None


def reap_private_folders(parent: str | None = None) -> list[str]:
    """Remove the folders of grades that were killed: ours (same owner), real folders, lock free."""
    parent = parent or tempfile.gettempdir()
    removed = []
    for entry in os.scandir(parent):
        if not entry.name.startswith(PRIVATE_PREFIX) or entry.path in _held_locks:
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                continue
            fd = os.open(os.path.join(entry.path, ".lock"), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # a grade in progress
        shutil.rmtree(entry.path, ignore_errors=True)
        os.close(fd)
        tag = grade_tag(entry.path)
        if tag is not None:  # a grade killed outright: its workers' cgroups go with its folder
            cgroup.reap(tag)
        removed.append(entry.path)
    return removed


def grade(course: Course, root: Path, source: Path, out: Path | None = None, opts: GradeOptions | None = None,
          on_update: Callable[[dict], None] | None = None, submission_id: str | None = None) -> dict:
    """Grade one submission. Returns the canonical result and, with `out`, keeps it written there."""
    opts = opts or GradeOptions()
    exercises = selected_exercises(course, opts)
    if opts.exercises:
        unknown = sorted(set(opts.exercises) - {e.id for e in course.exercises})
        if unknown:
            raise KeyError(f"unknown exercise {unknown[0]!r}; expected one of {[e.id for e in course.exercises]}")
    seed = opts.seed if opts.seed is not None else secrets.randbelow(2**31)
    suite = suite_sha256(root, exercises)

    def save(result: dict) -> None:
        if out is not None:
            results.write_atomic(out, result)
        if on_update is not None:
            on_update(result)

    # Everything of this grade on disk goes in one folder of its own: the staged files, the pytest
    # processes' temporary files, the workers' scratch folders where there are no namespaces. It is
    # removed however the grade ends; one left by a grade that was killed is removed by the next.
    private = private_folder()
    try:
        return _grade(course, root, source, out, opts, save, exercises, seed, suite, submission_id, private)
    finally:
        shutil.rmtree(private, ignore_errors=True)
        fd = _held_locks.pop(private, None)
        if fd is not None:
            os.close(fd)


def _grade(course: Course, root: Path, source: Path, out: Path | None, opts: GradeOptions,
           save: Callable[[dict], None], exercises: list[Exercise], seed: int, suite: str,
           submission_id: str | None, private: str) -> dict:
    try:
        sub: Submission = locate(course, Path(source), [e.id for e in exercises], submission_id, private, root=root)
    except SubmissionError as exc:
        result = results.ungradable(course, exercises, submission_id or Path(source).name, str(exc), suite_sha=suite,
                                    seed=seed, mode=opts.mode, exercise_message=f"the submission could not be read: {exc}")
        save(result)
        return result
    except Exception as exc:  # noqa: BLE001 -- the grader failed while staging (StagingFault, or a bug): its error, not the student's
        reason = f"staging the submission failed ({type(exc).__name__}: {str(exc).strip()[:300]})"
        result = results.ungradable(course, exercises, submission_id or Path(source).name, reason, suite_sha=suite,
                                    seed=seed, mode=opts.mode, by="grader", retry="grade it again")
        result["state"] = "error"
        results.finish(result)
        save(result)
        return result

    result = results.new_result(course, sub.id, sub.sha256, suite, seed, opts.mode, exercises)
    result["warnings"].extend(inert(note, 2000) for note in sub.notes)
    untested = torchbuild.untested_warning() if opts.allow_untested_torch or opts.mode != "sandbox" else None
    if untested:
        result["warnings"].append(untested)
    result["gradable"] = True
    if not sub.files:
        inside = (f"; found {', '.join(repr(n) for n in sub.nested_archives[:5])} inside it, an archive in the "
                  "submission, which is never unpacked: hand in its contents (or that archive alone)"
                  if sub.nested_archives else "")
        results.record_failure(result, f"no file to grade: expected one of {sorted(e.file for e in exercises)} "
                                       "or its notebook <id>.ipynb (flat, in <id>/ or in exercises/<id>/)" + inside)
    save(result)
    try:
        for ex in exercises:
            entry = results.find_exercise(result, ex.id)
            if ex.id not in sub.files:
                entry["status"] = "missing"
                results.close_exercise(result, ex.id, f"not submitted: expected a file named {ex.file}")
                save(result)
                continue
            entry["status"] = "running"

            def on_event(event: dict) -> None:
                if event.get("event") == "test":
                    save(result)
                elif event.get("event") == "session":
                    for warning in event.get("warnings", []):
                        warning = inert(warning, 2000)
                        if warning not in result["warnings"]:
                            result["warnings"].append(warning)

            grade_exercise(root, ex, sub.folder / "files", seed, opts, result, on_event, tmp_dir=private)
            save(result)
    finally:
        sub.cleanup()
    results.finish(result)
    save(result)
    return result
