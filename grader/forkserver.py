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

Protocol, over a Unix socket pair (SOCK_SEQPACKET, so that one message is one request): the client sends
one message per child, a JSON request with SCM_RIGHTS descriptors [a status socket, the child's own...];
the server forks, puts the child in a process group of its own and writes the child's pid on the status
socket; when the child ends it writes the exit status (as ``subprocess.Popen.returncode`` would read) there
and closes it. The client never writes on the status socket: when its end closes (the client is gone, or
gave the child up), the server kills the child's process group. The same server, with another child
function, starts the sandboxed worker warm (grader/harness/zygote.py).
"""

from __future__ import annotations

import array
import json
import os
import select
import signal
import socket
import sys
from typing import Callable

# What the server imports before it forks: the expensive, third-party part of every pytest child.
WARM_MODULES = ("torch", "numpy", "pytest", "_pytest.python", "pydantic", "yaml")
# The environment may differ from the server's only in these per grade: nothing imported reads them.
PER_GRADE_ENV = ("GRADER_SEED", "TMPDIR", "GRADER_WORKER_ZYGOTE")
MAX_MESSAGE = 1 << 20
MAX_FDS = 16


# --------------------------------------------------------------------------------------------------
# The client side (in runner.py's process)


class ForkedProcess:
    """The parts of subprocess.Popen that the grader uses, for a child of a fork server."""

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
                raise subprocess.TimeoutExpired(f"the fork server's child {self.pid}", timeout)
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


class Server:
    """One warm parent process (`python [flags] -m module FD`, its `serve` at the other end of FD); `request`
    starts a child of it. Safe to share between threads (one message per request, each answered on its own
    status socket)."""

    def __init__(self, env: dict[str, str], module: str, flags: tuple[str, ...] = (), cwd: str | None = None):
        import subprocess

        self.env = dict(env)
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen([sys.executable, *flags, "-m", module, str(child.fileno())],
                                     pass_fds=[child.fileno()], env=self.env, cwd=cwd, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        child.close()
        self.sock = parent
        self.sock.settimeout(120)
        if self.sock.recv(16) != b"ready":  # the imports done: the first spawn does not wait for them
            raise OSError(f"the fork server {module} did not start")

    def request(self, request: dict, fds: list[int]) -> ForkedProcess:
        """Start a child for `request`, handing it `fds` (the caller closes its own copies)."""
        return request_child(self.sock, request, fds)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            try:
                self.proc.wait(timeout=10)
            except Exception:  # noqa: BLE001 - it is a helper; make sure it is gone
                self.proc.kill()


def request_child(control: socket.socket, request: dict, fds: list[int]) -> ForkedProcess:
    """Ask the server at the other end of `control` for a child (any process holding the socket may)."""
    status_parent, status_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # a write, a message
    try:
        message = json.dumps(request).encode()
        control.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [status_child.fileno(), *fds]))])
    except OSError:
        status_parent.close()
        raise
    finally:
        status_child.close()
    status_parent.settimeout(120)
    try:
        answer = json.loads(status_parent.recv(64) or b"{}")
    except (OSError, ValueError) as exc:
        answer = {"error": f"no answer ({exc})"}
    status_parent.settimeout(None)
    if "pid" not in answer:
        status_parent.close()
        raise OSError(f"the fork server could not start its child: {answer.get('error', 'it is gone')}")
    return ForkedProcess(int(answer["pid"]), status_parent)


class ForkServer(Server):
    """The warm parent of the grader's pytest processes; `spawn` starts a pytest child from it."""

    def __init__(self, env: dict[str, str]):
        super().__init__(env, "grader.forkserver")

    def usable_for(self, env: dict[str, str]) -> bool:
        strip = lambda e: {k: v for k, v in e.items() if k not in PER_GRADE_ENV}  # noqa: E731
        return self.alive() and strip(env) == strip(self.env)

    def spawn(self, argv: list[str], env: dict[str, str], cwd: str, stdout: int, keep_fds: list[int]) -> ForkedProcess:
        """Start `python -m pytest argv[1:]`-to-be as a fork. `keep_fds` keep their numbers in the child."""
        devnull = os.open(os.devnull, os.O_RDONLY)
        try:
            return self.request({"argv": argv, "env": env, "cwd": cwd, "keep": keep_fds}, [devnull, stdout, *keep_fds])
        finally:
            os.close(devnull)


# --------------------------------------------------------------------------------------------------
# The server side


def reset_child(own: list[int]) -> None:
    """In a forked child: signals as a fresh interpreter has them (SIGPIPE stays ignored), and none of the
    server's descriptors (its socket, its wake-up pipe, the other children's status sockets)."""
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for fd in own:
        try:
            os.close(fd)
        except OSError:
            pass


def _pytest_child(request: dict, fds: list[int], own: list[int]) -> None:
    """In the forked child: become what a cold `python -m pytest ...` would have been, and run it."""
    import fcntl

    code = 70
    try:
        reset_child(own)
        # Move what was received out of the way, then put each where the cold start had it.
        moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 256) for fd in fds]
        for fd in fds:
            os.close(fd)
        stdin, stdout, *kept = moved
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


def _receive(control: socket.socket) -> tuple[bytes, list[int]]:
    message, ancillary, _flags, _addr = control.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(MAX_FDS * 4))
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(array.array("i", data[: len(data) - len(data) % 4]))
    return message, fds


def serve(control: socket.socket, warm: tuple[str, ...], child: Callable[[dict, list[int], list[int]], None]) -> None:
    """Import `warm`, then fork `child(request, fds, own)` for each request, where `fds` are the request's
    descriptors after the status socket and `own` the server's, for the child to close. Returns when the
    client closes the control socket."""
    for name in warm:
        try:
            __import__(name)
        except ImportError:
            pass
    import gc

    gc.collect()
    gc.freeze()  # the imports' objects are never scanned by a child's collector: fewer pages copied on write
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    control.sendall(b"ready")
    waiting: dict[int, int] = {}  # child pid -> its status socket's descriptor (-1: the client gave it up)
    while True:
        watched: list[socket.socket | int] = [control, wake_r, *(fd for fd in waiting.values() if fd >= 0)]
        ready = select.select(watched, [], [])[0]
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap(waiting)
        for pid, fd in list(waiting.items()):
            if fd >= 0 and fd in ready:  # the client closed its end (it never writes): it gave the child up, or died
                _kill_group(pid)
                os.close(fd)
                waiting[pid] = -1
        if control in ready:
            try:
                message, fds = _receive(control)
            except OSError:
                return
            if not message:
                return  # the client is gone: so is this server (its children end with their pipes)
            if not fds:
                continue
            status = fds[0]
            try:
                request = json.loads(message)
                pid = os.fork()
            except (ValueError, OSError) as exc:
                _answer(status, {"error": str(exc)})
                for fd in fds:
                    os.close(fd)
                continue
            if pid == 0:
                own = [control.fileno(), wake_r, wake_w, status, *(fd for fd in waiting.values() if fd >= 0)]
                # This frame stays live under the child: it keeps no other child's pid (nor the raw request).
                waiting.clear()
                del message
                child(request, fds[1:], own)
                os._exit(70)  # pragma: no cover - the child function exits
            try:
                os.setpgid(pid, pid)  # its own process group before anyone hears of it: killpg(pid) reaches it
            except OSError:
                pass
            for fd in fds[1:]:
                os.close(fd)
            if _answer(status, {"pid": pid}):
                waiting[pid] = status
            else:  # the client is already gone
                os.close(status)
                _kill_group(pid)
                waiting[pid] = -1


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _answer(fd: int, answer: dict) -> bool:
    try:
        os.write(fd, json.dumps(answer).encode() + b"\n")
        return True
    except OSError:
        return False


def _reap(waiting: dict[int, int]) -> None:
    while True:
        try:
            pid, wstatus = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = waiting.pop(pid, -1)
        if fd >= 0:
            try:
                os.write(fd, str(os.waitstatus_to_exitcode(wstatus)).encode())
            except OSError:
                pass
            os.close(fd)


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])), WARM_MODULES, _pytest_child)
