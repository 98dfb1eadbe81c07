"""A warm start for the grader's own test processes.

Each exercise of a grade runs in a fresh ``python -m pytest`` (runner.py), and half of that process's
start is importing torch (1-3 s on a loaded 2-core machine), once per exercise, 8 per submission. This
module is a fork server: one parent process, started once per grading process, imports torch, numpy,
pytest and the libraries the course's tests use, and then forks a child for each exercise, which runs
pytest in-process with the arguments, environment, working directory and descriptors a cold start would
have had. Nothing of one grade survives into the next: every child is a fresh fork of a parent that has
only imported modules (never run a test, never touched CUDA, never held a seed).

Only the trusted side uses it: the forked pytest is the grader's own process, as before; the student's
code still runs in the sandboxed worker that pytest starts (grader/harness/). Where fork cannot be used
(not Linux, the server did not start, an environment that differs in more than the seed and the
temporary folder), runner.py starts pytest cold, as it always did.

Protocol, over a Unix socket pair: the client sends one message per child, a JSON request with
SCM_RIGHTS descriptors [stdin, stdout (also stderr), a status socket, extra descriptors...]; the server
forks and answers with the child's pid; when the child ends it writes the exit status (as
``subprocess.Popen.returncode`` would read) to the status socket and closes it.
"""

from __future__ import annotations

import array
import json
import os
import select
import signal
import socket
import sys

# What the server imports before it forks: the expensive, third-party part of every pytest child.
WARM_MODULES = ("torch", "numpy", "pytest", "_pytest.python", "pydantic", "yaml")
# The environment may differ from the server's only in these per grade: nothing imported reads them.
PER_GRADE_ENV = ("GRADER_SEED", "TMPDIR")
MAX_MESSAGE = 1 << 20
MAX_FDS = 16


# --------------------------------------------------------------------------------------------------
# The client side (in runner.py's process)


class ForkedProcess:
    """The parts of subprocess.Popen that runner.py uses, for a child of the fork server."""

    def __init__(self, pid: int, status: socket.socket):
        self.pid, self._status = pid, status
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._status], [], [], 0)[0]:
            self._read_status()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            ready = select.select([self._status], [], [], timeout)[0]
            if not ready:
                import subprocess

                assert timeout is not None  # without one, select waits until the status is there
                raise subprocess.TimeoutExpired(f"pytest (pid {self.pid})", timeout)
            self._read_status()
        assert self.returncode is not None  # _read_status sets it
        return self.returncode

    def _read_status(self) -> None:
        data = self._status.recv(64)
        self._status.close()
        try:
            self.returncode = int(data.decode())
        except ValueError:  # the server died before reporting: the child went with it
            self.returncode = -signal.SIGKILL


class ForkServer:
    """One warm parent; `spawn` starts a pytest child from it."""

    def __init__(self, env: dict[str, str]):
        import subprocess

        import threading

        self.env = dict(env)
        self._lock = threading.Lock()  # one request and its answer at a time
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen([sys.executable, "-m", "grader.forkserver", str(child.fileno())],
                                     pass_fds=[child.fileno()], env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        child.close()
        self.sock = parent
        self.sock.settimeout(120)
        if self.sock.recv(16) != b"ready":  # the imports done: the first spawn does not wait for them
            raise OSError("the fork server did not start")

    def usable_for(self, env: dict[str, str]) -> bool:
        strip = lambda e: {k: v for k, v in e.items() if k not in PER_GRADE_ENV}  # noqa: E731
        return self.proc.poll() is None and strip(env) == strip(self.env)

    def spawn(self, argv: list[str], env: dict[str, str], cwd: str, stdout: int, keep_fds: list[int]) -> ForkedProcess:
        """Start `python -m pytest argv[1:]`-to-be as a fork. `keep_fds` keep their numbers in the child."""
        status_parent, status_child = socket.socketpair()
        devnull = os.open(os.devnull, os.O_RDONLY)
        try:
            request = json.dumps({"argv": argv, "env": env, "cwd": cwd, "keep": keep_fds}).encode()
            fds = [devnull, stdout, status_child.fileno(), *keep_fds]
            with self._lock:
                self.sock.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
                answer = json.loads(self.sock.recv(64))
        finally:
            os.close(devnull)
            status_child.close()
        if "pid" not in answer:
            status_parent.close()
            raise OSError(f"the fork server could not start pytest: {answer.get('error')}")
        return ForkedProcess(int(answer["pid"]), status_parent)

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            try:
                self.proc.wait(timeout=10)
            except Exception:  # noqa: BLE001 - it is a helper; make sure it is gone
                self.proc.kill()


# --------------------------------------------------------------------------------------------------
# The server side


def _child(request: dict, fds: list[int], own: list[int]) -> None:
    """In the forked child: become what a cold `python -m pytest ...` would have been, and run it."""
    import fcntl

    code = 70
    try:
        try:
            os.setpgid(0, 0)  # also done by the server: whichever runs first
        except OSError:
            pass
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM):  # as a fresh interpreter has them (SIGPIPE stays ignored)
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for fd in own:  # the server's socket and wake-up pipe
            os.close(fd)
        # Move what was received out of the way, then put each where the cold start had it.
        moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 256) for fd in fds]
        for fd in fds:
            os.close(fd)
        stdin, stdout, status, *kept = moved
        os.close(status)
        for target, fd in ((0, stdin), (1, stdout), (2, stdout), *zip(request["keep"], kept)):
            os.dup2(fd, target, inheritable=True)
        for fd in {stdin, stdout, *kept}:
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        import tempfile

        tempfile.tempdir = None  # read TMPDIR again: the grade's own private folder
        argv = request["argv"]
        sys.argv = argv
        import pytest

        code = int(pytest.main(argv[3:] if argv[1:3] == ["-m", "pytest"] else argv[1:]))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - report, then exit like a crashed interpreter
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(control: socket.socket) -> None:
    for name in WARM_MODULES:
        try:
            __import__(name)
        except ImportError:
            pass
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    control.sendall(b"ready")
    waiting: dict[int, int] = {}  # child pid -> its status socket's descriptor
    watched: list[socket.socket | int] = [control, wake_r]
    while True:
        ready = select.select(watched, [], [])[0]
        if wake_r in ready:
            os.read(wake_r, 4096)
            while waiting:
                try:
                    pid, wstatus = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                fd = waiting.pop(pid, None)
                if fd is not None:
                    try:
                        os.write(fd, str(os.waitstatus_to_exitcode(wstatus)).encode())
                    except OSError:
                        pass
                    os.close(fd)
        if control in ready:
            try:
                message, ancillary, _flags, _addr = control.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(MAX_FDS * 4))
            except OSError:
                return
            if not message:
                return  # the client is gone: so is this server (its children end with their pipes)
            fds: list[int] = []
            for level, kind, data in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.extend(array.array("i", data[: len(data) - len(data) % 4]))
            try:
                request = json.loads(message)
                pid = os.fork()
            except (ValueError, OSError) as exc:
                for fd in fds:
                    os.close(fd)
                control.sendall(json.dumps({"error": str(exc)}).encode())
                continue
            if pid == 0:
                _child(request, fds, [control.fileno(), wake_r, wake_w])
            try:
                os.setpgid(pid, pid)  # its own process group before anyone hears of it: killpg(pid) reaches it
            except OSError:
                pass
            waiting[pid] = fds[2]
            for fd in fds[:2] + fds[3:]:
                os.close(fd)
            control.sendall(json.dumps({"pid": pid}).encode())


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
