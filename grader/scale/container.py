"""One container per submission: the docker and apptainer backends, the image's entry point, and
`grader doctor`.

The host side (`ContainerBackend`, used by ``grader grade|batch --backend docker``) starts one
container of the course image per submission::

    docker run --rm --init --interactive --network none --read-only --tmpfs /tmp:...,size=N
               --pids-limit N --memory M --memory-swap M --cpus C --shm-size S
               --cap-drop ALL --cap-add CHOWN,DAC_OVERRIDE,FOWNER,SETUID,SETGID,KILL
               --security-opt no-new-privileges [--gpus device=N]
               -v SUBMISSION:/submission:ro -v SCRATCH:/results  IMAGE grade --watch-stdin

It holds the container's stdin open (the entry point ends the grade when it closes, so the
container dies with the process that started it, even by SIGKILL) and enforces a wall-clock
budget from outside: past it the container is killed, the checks it finished are kept (the
runner rewrites /results/result.json after every test) and the rest score zero as "timeout".
The result the host keeps records the image's digest.

Inside the container (``python3 -m grader.scale.container grade``, the image's entry point) the trusted
side runs as the container's root, holding only the capabilities above: enough to stage the
submission, hand the worker its folder and drop the worker to the `student` user, who owns no
capability and cannot read the hidden checks or the solutions (owned by `grader`, mode 0700). The
container is the sandbox: no network, its own process table, a read-only file system but /tmp,
and the limits above. The entry point exits 0 whenever it wrote a result, whatever the score.

Apptainer (``--backend apptainer``, for clusters) runs the same image as a .sif file with
``--fakeroot``, so the same users and modes apply inside.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from grader import results
from grader.doctor import doctor, print_doctor
from grader.options import GradeOptions
from grader.proctree import descendants
from grader.results import read_result
from grader.scale.backend import BackendError, Job, JobRun

CONTAINER_SOURCE = "/submission"
CONTAINER_RESULTS = "/results"
RESULT_NAME = "result.json"
REQUEST_NAME = "request.json"
LABEL = "llm-efficiency-lab.grade"  # every grading container carries it; its value names the batch
# What the trusted side inside the container may still do, and why (everything else is dropped):
CAPABILITIES = (
    "CHOWN",  # give the worker its own folder
    "DAC_OVERRIDE",  # read the submission and clean up the worker's folder whatever their modes
    "FOWNER",  # chmod in the worker's folder
    "SETUID", "SETGID",  # drop the worker to the `student` user
    "KILL",  # stop a worker that runs as `student`
)
STUDENT_USER = "student"


class ContainerError(BackendError):
    """The container runtime cannot be used (not installed, no such image)."""


@dataclasses.dataclass
class ContainerLimits:
    memory_mb: int
    cpus: float
    pids: int
    tmpfs_mb: int
    shm_mb: int


# ---------------------------------------------------------------------------------------------
# The host side


def docker_command(image: str, source: Path, scratch: Path, name: str, batch_label: str, limits: ContainerLimits,
                   gpu: str | None) -> list[str]:
    """The `docker run` command line that grades `source` (a folder or an archive) into `scratch`."""
    source = Path(source).resolve()
    target = CONTAINER_SOURCE if source.is_dir() else f"{CONTAINER_SOURCE}/{source.name}"
    cmd = [
        "docker", "run", "--rm", "--init", "--interactive", "--name", name, "--label", f"{LABEL}={batch_label}",
        "--network", "none", "--read-only",
        "--tmpfs", f"/tmp:rw,exec,nosuid,nodev,size={limits.tmpfs_mb}m",
        "--pids-limit", str(limits.pids),
        "--memory", f"{limits.memory_mb}m", "--memory-swap", f"{limits.memory_mb}m",
        "--cpus", f"{limits.cpus:g}", "--shm-size", f"{limits.shm_mb}m",
        "--cap-drop", "ALL", *[a for cap in CAPABILITIES for a in ("--cap-add", cap)],
        "--security-opt", "no-new-privileges",
        "-v", f"{source}:{target}:ro", "-v", f"{Path(scratch).resolve()}:{CONTAINER_RESULTS}",
    ]
    if gpu is not None:  # one device ("3") or several ("2,3"): docker's --gpus wants the list quoted
        cmd += ["--gpus", f'"device={gpu}"' if "," in gpu else f"device={gpu}"]
    # --interactive with --watch-stdin: the backend holds the container's stdin open; if the backend
    # dies, even by SIGKILL, stdin closes and the container ends itself (it belongs to the daemon).
    return cmd + [image, "grade", "--source", target, "--watch-stdin"]


def apptainer_command(image: str, source: Path, scratch: Path, gpu: str | None) -> list[str]:
    """The `apptainer run` command line for the same grade (a .sif built from the course image)."""
    source = Path(source).resolve()
    target = CONTAINER_SOURCE if source.is_dir() else f"{CONTAINER_SOURCE}/{source.name}"
    # --fakeroot: the image's users and modes (hidden checks owned by `grader`, the worker dropped to
    # `student`) need a root inside; Apptainer maps it onto the caller's subordinate ids.
    cmd = ["apptainer", "run", "--fakeroot", "--containall", "--cleanenv", "--no-home", "--writable-tmpfs",
           "--net", "--network", "none",
           "--bind", f"{source}:{target}:ro", "--bind", f"{Path(scratch).resolve()}:{CONTAINER_RESULTS}"]
    if gpu is not None:
        cmd += ["--nv", "--env", f"CUDA_VISIBLE_DEVICES={gpu}"]
    return cmd + [image, "grade", "--source", target, "--watch-stdin"]


def image_digest(runtime: str, image: str) -> str:
    """The image's content digest; ContainerError (saying how to get one) when there is no such image."""
    if runtime == "apptainer":
        path = Path(image)
        if not path.is_file():
            raise ContainerError(f"expected an Apptainer image file (.sif) at {image}, found nothing there; build "
                                 f"one with `apptainer build course.sif docker-daemon://IMAGE`")
        stat = path.stat()  # hashing a multi-GB file in every array task would cost more than it tells
        return f"file:{stat.st_size}:{int(stat.st_mtime)}"
    if shutil.which("docker") is None:
        raise ContainerError("expected the `docker` command for --backend docker, found none on PATH")
    proc = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", image],
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        detail = (proc.stderr.strip().splitlines() or ["no such image"])[-1]
        raise ContainerError(f"expected a docker image named {image!r} (build it with `make image`, or pass "
                             f"--image), found none: {detail}")
    return proc.stdout.strip()


class ContainerBackend:
    """Grades each submission in a fresh container of the course image (see the module docstring)."""

    def __init__(self, root: Path, runtime: str = "docker", image: str | None = None, memory_mb: int | None = None,
                 cpus: float | None = None, pids: int | None = None, tmpfs_mb: int | None = None,
                 shm_mb: int | None = None):
        from grader.course import load_course

        if runtime not in ("docker", "apptainer"):
            raise ContainerError(f"expected the runtime docker or apptainer, found {runtime!r}")
        course = load_course(root)
        defaults = course.container
        self.root = Path(root)
        self.runtime = runtime
        self.name = runtime
        self.image = image or defaults.image
        self.limits = ContainerLimits(
            memory_mb=memory_mb or defaults.memory_mb, cpus=cpus or defaults.cpus, pids=pids or defaults.pids,
            tmpfs_mb=tmpfs_mb or defaults.tmpfs_mb, shm_mb=shm_mb or defaults.shm_mb)
        # Docker refuses --cpus beyond the machine's count: a course default sized for a grading
        # server still runs on a laptop (there it simply means "all of them").
        self.limits.cpus = min(self.limits.cpus, float(os.cpu_count() or 1))
        self.budget_s = defaults.budget_s
        self.digest = image_digest(runtime, self.image)
        self.batch_label = uuid.uuid4().hex[:12]
        self.lock = threading.Lock()
        self.running: dict[str, subprocess.Popen] = {}  # container name -> its `docker run`
        self.stopping = False

    def fingerprint(self) -> str:
        return f"{self.runtime}:{self.image}@{self.digest}"

    def image_record(self) -> dict:
        return {"runtime": self.runtime, "name": self.image, "digest": self.digest}

    def open_slot(self, gpu: str | None) -> "ContainerSlot":
        return ContainerSlot(self, gpu)

    def kill(self, name: str, proc: subprocess.Popen) -> None:
        """Remove the container `name` and end the `docker run` (or `apptainer run`) that started it.
        The container is removed again once that client is gone, in case the client created it only
        after the first removal."""
        if self.runtime == "docker":
            subprocess.run(["docker", "rm", "--force", name], capture_output=True, timeout=120)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if self.runtime == "docker":
            subprocess.run(["docker", "rm", "--force", name], capture_output=True, timeout=120)

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            running = dict(self.running)
        for name, proc in running.items():
            self.kill(name, proc)

    def leftovers(self) -> list[str]:
        """Containers of this backend still present (there should be none once a grade returns)."""
        if self.runtime != "docker":
            return []
        proc = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={LABEL}={self.batch_label}"],
                              capture_output=True, text=True, timeout=60)
        return proc.stdout.split()


class ContainerSlot:
    def __init__(self, backend: ContainerBackend, gpu: str | None):
        self.backend = backend
        self.gpu = gpu

    def grade(self, job: Job) -> JobRun:
        backend = self.backend
        started = time.monotonic()
        scratch = Path(tempfile.mkdtemp(prefix="grader-container-"))  # mode 0700: the student cannot enter
        try:
            (scratch / REQUEST_NAME).write_text(json.dumps({"id": job.id, "options": job.options.for_container().to_json()}))
            name = f"grade-{re.sub(r'[^a-zA-Z0-9_.-]', '-', job.id)[:40]}-{uuid.uuid4().hex[:8]}"
            if backend.runtime == "docker":
                cmd = docker_command(backend.image, job.source, scratch, name, backend.batch_label, backend.limits,
                                     self.gpu)
            else:
                cmd = apptainer_command(backend.image, job.source, scratch, self.gpu)
            timeout = min(job.timeout_s, backend.budget_s or job.timeout_s)
            with tempfile.TemporaryFile() as log:
                with backend.lock:
                    if backend.stopping:
                        raise InterruptedError("the batch is stopping")
                    # stdin stays open, and empty, for as long as this process lives (see docker_command).
                    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
                    backend.running[name] = proc
                try:
                    code = proc.wait(timeout=timeout)
                    timed_out = False
                except subprocess.TimeoutExpired:
                    backend.kill(name, proc)  # the container, not just the client that started it
                    code, timed_out = None, True
                except BaseException:  # Ctrl-C, or a Slurm task told to stop: the container goes too
                    backend.kill(name, proc)
                    raise
                finally:
                    with backend.lock:
                        backend.running.pop(name, None)
                    if proc.stdin is not None:
                        proc.stdin.close()
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - 2000))
                tail = log.read().decode(errors="replace").strip()
            duration = time.monotonic() - started
            if backend.stopping:
                return JobRun("the batch was stopped", duration)
            result = read_result(scratch / RESULT_NAME)
            if result is not None and (result.get("submission") or {}).get("id") != job.id:
                result = None
            if timed_out:
                if result is None:
                    return JobRun(f"the container did not finish within the submission's budget of {timeout:g} s "
                                  f"and wrote no result", duration)
                _close_as_timeout(result, f"the submission's time budget of {timeout:g} s ran out and its "
                                          f"container was stopped")
            elif result is None or result.get("state") != "complete":
                lines = [line for line in tail.splitlines() if line.strip() and "--help" not in line]
                last = " / ".join(lines[-2:])[-600:] if lines else "no output"
                return JobRun(f"the container exited with code {code} without a complete result: {last}", duration)
            result["image"] = backend.image_record()
            results.write_atomic(job.out, result)
            return JobRun(None, duration)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def close(self) -> None:
        pass


def _close_as_timeout(result: dict, reason: str) -> None:
    for ex in result["exercises"]:
        if ex["status"] in ("pending", "running"):
            ex["status"] = "graded"
            results.close_exercise(result, ex["id"], reason, status="timeout")
    results.finish(result)


# ---------------------------------------------------------------------------------------------
# Inside the container


def entry_grade(args: argparse.Namespace) -> int:
    """Grade /submission (or --source) into /results/result.json; 0 whenever a result was written."""
    from grader.course import find_root, load_course
    from grader.runner import grade

    results_dir = Path(args.results)
    out = results_dir / RESULT_NAME
    request = read_result(results_dir / REQUEST_NAME) or {}
    options = request.get("options") or {}
    root = find_root(Path(__file__).resolve().parents[2])
    course = load_course(root)
    # The host's options, less its own (for_container), as the container's trusted side runs them.
    opts = GradeOptions.from_json(options).for_container().replace(user=args.user)
    if args.watch_stdin:
        threading.Thread(target=_end_when_stdin_closes, daemon=True, name="watch-stdin").start()
    source = Path(args.source)
    sub_id = request.get("id") or args.id or source.name
    try:
        grade(course, root, source, out, opts, submission_id=sub_id)
    except Exception as exc:  # a result that says so beats none: the host then keeps it
        print(f"grading failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1 if not out.exists() else 0
    return 0


def _end_when_stdin_closes() -> None:
    """The process that started this container is gone: stop every process in it, then this one."""
    while sys.stdin.buffer.read(1 << 16):
        pass
    print("grading stopped: the process that started this container went away", file=sys.stderr)
    try:
        for pid in descendants(os.getpid()):  # pytest and the workers; the container's end takes the rest
            try:
                os.kill(pid, 9)
            except OSError:
                pass
    finally:
        os._exit(3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.scale.container",
                                     description="the grading image's entry point (see grader/scale/container.py)")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grade", help="grade /submission into /results/result.json")
    g.add_argument("--source", default=CONTAINER_SOURCE)
    g.add_argument("--results", default=CONTAINER_RESULTS)
    g.add_argument("--id", help="the submission's id (default: from /results/request.json, else the folder name)")
    g.add_argument("--user", default=STUDENT_USER, help="the unprivileged user the worker runs as")
    g.add_argument("--watch-stdin", action="store_true",
                   help="stop the grade when stdin closes (the backend runs `docker run --interactive` and holds it)")
    d = sub.add_parser("doctor", help="print GPU, driver, CUDA, torch and triton versions")
    d.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        report = doctor()
        print(json.dumps(report)) if args.json else print_doctor(report)
        return 0
    return entry_grade(args)


if __name__ == "__main__":
    sys.exit(main())
