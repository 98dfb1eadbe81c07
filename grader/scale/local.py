"""The local backend: grades on this machine, where the runner's own sandbox isolates each student.

Each lane keeps one grading process (``python -m grader.scale.local _serve PID``) that imports torch
and the grader once and grades the submissions it is sent one after another: one JSON request per
line on its stdin, one reply per line. A grade that overruns its budget kills that process and
everything under it; the next submission gets a fresh one.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import IO

from grader.course import find_root, load_course
from grader.options import GradeOptions
from grader.proctree import kill_tree
from grader.scale.backend import Job, JobRun


class LocalSlot:
    """A lane of the local backend: one long-lived grading process (``python -m grader.scale.local _serve``)
    that grades the submissions it is sent one after another, so torch and the grader are imported
    once per lane, not once per submission. A grade that overruns its budget kills that process and
    everything under it; the next submission gets a fresh one."""

    RECYCLE_AFTER = 100  # submissions per grading process, to bound anything that accumulates

    def __init__(self, backend: "LocalBackend", gpu: str | None):
        self.backend = backend
        self.gpu = gpu
        self.proc: subprocess.Popen | None = None
        self.log: IO[bytes] | None = None
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
            assert stream is not None  # both are pipes (_start)
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
        assert self.proc is not None and self.proc.stdout is not None  # grade started it, with pipes
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
        request = {"id": job.id, "source": str(job.source), "out": str(job.out), "options": job.options.to_json()}
        assert self.proc is not None and self.proc.stdin is not None  # _start made it, with pipes
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
            code: int | str  # the exit code, or why there is none
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
            assert self.proc.stdin is not None  # a pipe (_start)
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
        self.command = command or [sys.executable, "-m", "grader.scale.local", "_serve", str(os.getpid())]
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
            grade(course, root, Path(request["source"]), Path(request["out"]), GradeOptions.from_json(request["options"]),
                  submission_id=request["id"])
            reply: dict[str, object] = {"ok": True}
        except Exception:  # the batch writes the failure into the result and goes on
            reply = {"ok": False, "error": traceback.format_exc(limit=8)[-3000:]}
        replies.write(json.dumps(reply) + "\n")
    return 0



def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["_serve"] or len(argv) > 2 or (len(argv) == 2 and not argv[1].isdigit()):
        print("usage: python -m grader.scale.local _serve [PARENT_PID] (a local batch lane's grading process)",
              file=sys.stderr)
        return 2
    if len(argv) == 2:
        from grader.harness.launch import die_with_parent

        die_with_parent()
        if os.getppid() != int(argv[1]):  # the batch died before the line above took effect
            return 1
    return serve()


if __name__ == "__main__":
    sys.exit(main())
