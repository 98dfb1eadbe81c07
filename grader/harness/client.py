"""The grader's side of the harness: a worker process and proxies that call into it.

``RemoteModule`` stands for the student's module. Reading an attribute asks the worker what it is:
a function or class comes back as a ``RemoteCallable``, an exception class as a local stand-in that
``pytest.raises`` can match, a plain value as itself. Calling sends the arguments over, runs the call
in the worker, and returns the decoded result; an object the worker cannot send (an instance of the
student's class) comes back as a ``RemoteHandle`` whose attributes and methods are remote too.

Failures surface as three exceptions the test runner knows how to score:

* ``StudentError``: the student's code raised; carries the student's trimmed traceback. Exceptions
  of builtin types come back as subclasses of both, so ``pytest.raises(ValueError)`` still works.
* ``StudentCrash``: the worker died (segfault, ``os._exit``, out of memory) or sent a malformed reply.
* ``StudentTimeout``: a call ran past its time limit; the worker's whole process group is killed.

After a crash or timeout the next call starts a fresh worker, so one bad test costs one test.
"""

from __future__ import annotations

import builtins
import json
import os
import pwd
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from grader import forkserver
from grader.harness import cgroup, identity, wire, zygote
from grader.harness.ledger import LEDGER
from grader.text import inert


class StudentError(Exception):
    """The student's code raised an exception."""

    type_name = "Exception"
    student_traceback = ""

    def __str__(self) -> str:
        text = super().__str__()
        return f"{self.type_name}: {text}" if text else self.type_name


class StudentLoadError(StudentError):
    """The student's file did not load (it raised, or is not Python source). Deliberately a subclass of no
    builtin exception: whatever the file raised, ``pytest.raises(ValueError)`` around a call does not match it,
    since the call never ran. The runner scores every check of the exercise zero when any test saw it."""

    type_name = "the file did not load"

    def __str__(self) -> str:
        return f"your file did not load, so none of its functions could be called: {Exception.__str__(self)}"


class StudentCrash(Exception):
    """The worker running the student's code died or sent something that is not a valid reply."""


class StudentTimeout(Exception):
    """A call into the student's code ran past its time limit."""


_exception_classes: dict[tuple, type] = {}


def remote_exception_class(name: str, mro: list[str]) -> type:
    """A local class standing for the student's exception class `name` (with its base names)."""
    key = (name[:100], tuple(n[:100] for n in mro[:32]))
    if key not in _exception_classes:
        if len(_exception_classes) >= 256:  # reply data chooses the names: a bounded cache
            _exception_classes.clear()
        base = next(
            (
                getattr(builtins, n)
                for n in mro
                if isinstance(getattr(builtins, n, None), type)
                and issubclass(getattr(builtins, n), Exception)
                and n not in ("Exception",)
            ),
            None,
        )
        bases = (StudentError, base) if base is not None else (StudentError,)
        safe = name if name.isidentifier() else "StudentException"
        _exception_classes[key] = type(safe, bases, {"type_name": safe, "__module__": "student"})
    return _exception_classes[key]


# --------------------------------------------------------------------------------------------------
# Sandbox settings and the worker process


class SandboxError(RuntimeError):
    """The sandbox could not be set up: a failure of the grading machine, never the student's."""


@dataclass
class Sandbox:
    """How to isolate workers.

    `user`: "auto" runs each worker as a uid of its own when root (identity.py), or as an account
    named here (a shared identity). `course_root` and `hide` name what the worker must never see;
    its view of the file system is an allow-list (view.py), so these only matter where an
    allow-listed folder contains them."""

    isolate: bool = True
    user: str | None = "auto"
    hide: list[str] = field(default_factory=list)
    course_root: str | None = None
    memory_mb: int = 8192
    cpu_s: int = 900
    file_size_mb: int = 256
    processes: int = 256
    max_result_mb: int = 256
    scratch_mb: int = 1024
    shm_mb: int = 256
    uid_first: int = identity.DEFAULT_UID_FIRST
    uid_count: int = identity.DEFAULT_UID_COUNT
    threads: int = 1
    cuda: bool = False
    grade_tag: str | None = None  # names the worker's cgroups after the grade, whose runner reaps them

    def account(self) -> tuple[int, int] | None:
        """(uid, gid) of the named account when root and one is named (not "auto"); else None."""
        if os.geteuid() != 0 or not self.user or self.user == "auto":
            return None
        entry = pwd.getpwnam(self.user)
        return entry.pw_uid, entry.pw_gid


_PASS_ENV = ("CUDA_VISIBLE_DEVICES", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "LD_LIBRARY_PATH", "GRADER_IN_CONTAINER")
LOG_TAIL_BYTES = 4000
# Past a call's deadline, how long rebuilding its reply may take (an honest reply takes milliseconds; a
# hostile one is bounded by wire.check_archive and wire.MAX_NODES, and by this).
DECODE_GRACE_S = 5.0


def worker_environment(sandbox: Sandbox) -> dict[str, str]:
    """The worker's whole environment (nothing else of the grader's reaches it)."""
    env = {k: os.environ[k] for k in _PASS_ENV if k in os.environ}
    threads = str(sandbox.threads)
    home = "/tmp" if sandbox.isolate else tempfile.gettempdir()
    env.update(
        PATH="/usr/local/bin:/usr/bin:/bin",
        HOME=home,
        TMPDIR=home,
        USER="student",
        LOGNAME="student",
        LANG="C.UTF-8",
        OMP_NUM_THREADS=threads,
        MKL_NUM_THREADS=threads,
        TRITON_CACHE_DIR=os.path.join(home, ".triton"),
        # torch.compile runs eagerly here: the probes must see every operator (compiled code dispatches
        # none), and the lock lets no compiler start on CPU hosts.
        TORCHDYNAMO_DISABLE="1",
        # torch.load never unpickles arbitrary objects here, whatever the submission sets later (red team
        # round 11 set TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD at import and unpickled an exec of unscanned code)
        TORCH_FORCE_WEIGHTS_ONLY_LOAD="1",
    )
    if not sandbox.cuda:
        env["TRITON_INTERPRET"] = "1"
    return env


class WorkerProcess:
    """One sandboxed worker serving one student module; restarted on demand after a failure.

    The worker's identity (a leased uid when root) is held for the life of this object, across
    restarts, and given back by `shutdown`. Nothing of the worker lives on this machine's disk
    under a name: its log is an unlinked file this process holds open, its files are in its own
    mount namespace, and a scratch folder (only without namespaces) sits in a folder only this
    process can write."""

    def __init__(self, module_path: Path, sandbox: Sandbox, call_timeout: float, spawns: bool = False):
        self.module_path = Path(module_path)
        self.sandbox = sandbox
        self.call_timeout = call_timeout
        # The lock (seccomp.install_lock), unless the exercise's own drivers start threads or processes: on CUDA
        # no new thread (Triton runs ptxas, a process, to compile), elsewhere no new thread, process or program.
        self.lock = "none" if spawns else ("threads" if sandbox.cuda else "all")
        self.generation = 0
        self.proc: subprocess.Popen | forkserver.ForkedProcess | None = None
        self.sock: socket.socket | None = None
        self.log: IO[bytes] | None = None  # the worker's stdout and stderr: an unlinked temporary file
        self.status_fd: int | None = None
        self.scratch_parent: str | None = None
        self.lease: identity.UidLease | None = None
        self.group: cgroup.WorkerGroup | None = None
        self.group_warning: str | None = None
        self.warnings: list[str] = []
        self.starts = 0
        self.warm_starts = 0  # of `starts`, forked from the zygote
        self._starting = False

    # -- identity -----------------------------------------------------------------------------

    def identity(self) -> tuple[int | None, int | None]:
        """(uid, gid) the worker runs as; (None, None) when it keeps this process's own (not root)."""
        account = self.sandbox.account()
        if account is not None:
            return account
        if os.geteuid() != 0:
            return None, None
        if self.lease is None:
            try:
                self.lease = identity.lease(self.sandbox.uid_first, self.sandbox.uid_count)
            except identity.IdentityError as exc:
                raise SandboxError(f"no identity for the worker: {exc}") from None
        return self.lease.uid, self.lease.gid

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start a fresh worker and wait until it answers."""
        self.spawn()
        self.wait_ready()

    def wait_ready(self) -> None:
        if not self._starting:
            return
        self._starting = False
        deadline = time.monotonic() + max(60.0, self.call_timeout)
        status = self._read_status(deadline)
        if "error" in status:
            self.close()
            raise SandboxError(f"the sandbox for your code could not start: {status['error']}")
        self.warnings = [str(w) for w in status.get("warnings", [])] + ([self.group_warning] if self.group_warning else [])
        self._request({"op": "ping"}, deadline - time.monotonic())

    def _read_status(self, deadline: float) -> dict:
        """The launcher's one status line (warnings, or the error that stopped it), read with a deadline."""
        assert self.status_fd is not None
        data = b""
        try:
            while len(data) < 65536:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                ready, _, _ = select.select([self.status_fd], [], [], min(left, 0.5))
                if not ready:
                    if self.proc is not None and self.proc.poll() is not None and not data:
                        break
                    continue
                chunk = os.read(self.status_fd, 65536)
                if not chunk:
                    break
                data += chunk
        finally:
            os.close(self.status_fd)
            self.status_fd = None
        try:
            status = json.loads(data.split(b"\n", 1)[0] or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError):
            status = None
        if not isinstance(status, dict):
            code = self.proc.poll() if self.proc is not None else None
            tail = self.log_tail()
            return {"error": f"the launcher ended before reporting ({describe_exit(code)})"
                             + (f": {tail.strip().splitlines()[-1]}" if tail.strip() else "")}
        return status

    def spawn(self) -> None:
        """Start a fresh worker without waiting for it (it imports torch meanwhile)."""
        self.close()
        uid, gid = self.identity()
        self.scratch_parent = tempfile.mkdtemp(prefix="grader-worker-")  # 0700, ours: used without namespaces
        self.log = tempfile.TemporaryFile(prefix="grader-worker-log-")  # unlinked: no name anyone can reach
        parent_sock, child_sock = socket.socketpair()
        status_r, status_w = os.pipe()
        module_fd = os.open(self.module_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        root = self.sandbox.course_root or ""
        self.group_warning = None
        # In a container the container's own memory and pids limits are the worker's (one grade per container).
        if os.geteuid() == 0 and self.sandbox.isolate and os.environ.get("GRADER_IN_CONTAINER") != "1":
            try:
                self.group = cgroup.WorkerGroup.create(self.sandbox.memory_mb, self.sandbox.processes,
                                                      self.sandbox.grade_tag)
            except cgroup.CgroupError as exc:
                self.group_warning = (f"{exc}: the worker's memory limit holds per process, so a worker that forks "
                                      "can hold a multiple of it")
        config = {
            "isolate": self.sandbox.isolate,
            "uid": uid,
            "gid": gid,
            "course_root": root,
            "masks": [str(Path(p).resolve()) for p in self.sandbox.hide],
            "module_fd": module_fd,
            "module_name": self.module_path.name,
            "status_fd": status_w,
            "sock_fd": child_sock.fileno(),
            "scratch_parent": self.scratch_parent,
            "scratch_mb": self.sandbox.scratch_mb,
            "shm_mb": self.sandbox.shm_mb,
            "cuda": self.sandbox.cuda,
            "cgroup_procs": self.group.procs_files if self.group is not None else [],
            "lock": self.lock,
            "limits": {
                "cpu_s": self.sandbox.cpu_s,
                "file_size_mb": self.sandbox.file_size_mb,
                "memory_mb": 0 if self.sandbox.cuda else self.sandbox.memory_mb,
                "processes": self.sandbox.processes,
            },
        }
        env = worker_environment(self.sandbox)
        try:
            self.proc = self._warm_start(config, env)
            if self.proc is None:
                self.proc = subprocess.Popen(
                    [sys.executable, "-I", "-m", "grader.harness.launch", json.dumps(config)],
                    pass_fds=[child_sock.fileno(), status_w, module_fd],
                    start_new_session=True,
                    env=env,
                    cwd="/",
                    stdin=subprocess.DEVNULL,
                    stdout=self.log,
                    stderr=self.log,
                )
        finally:
            child_sock.close()
            os.close(status_w)
            os.close(module_fd)
        self.status_fd = status_r
        self.sock = parent_sock
        self.generation += 1
        self.starts += 1
        self._starting = True

    def _warm_start(self, config: dict, env: dict[str, str]) -> "forkserver.ForkedProcess | None":
        """The worker forked from the grading process's zygote (grader/harness/zygote.py), or None: start it
        cold (no zygote, another environment, CUDA, or the zygote failed, which costs only the warm start)."""
        control = None if self.sandbox.cuda else zygote.from_environment(env)
        if control is None:
            return None
        assert self.log is not None
        try:
            proc = zygote.launch(control, config, {k: config[k] for k in ("sock_fd", "status_fd", "module_fd")},
                                 self.log.fileno())
        except OSError:
            return None
        finally:
            control.close()
        self.warm_starts += 1
        return proc

    def close(self) -> None:
        """Stop the worker and everything it started; keep the identity for the next start."""
        self._starting = False
        if self.proc is not None:
            try:
                # A warm worker's launcher reaped by the zygote: its pid may be another process's by now (the
                # zygote itself kills the group of a child it has not reaped once its status socket closes).
                if not isinstance(self.proc, forkserver.ForkedProcess) or self.proc.poll() is None:
                    os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - a process SIGKILL cannot stop
                pass
            self.proc = None
        if self.lease is not None:
            self.lease.sweep()  # without a PID namespace, whatever the worker left behind
        if self.group is not None:
            self.group.remove()
            self.group = None
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.status_fd is not None:
            os.close(self.status_fd)
            self.status_fd = None
        if self.log is not None:
            self.log.close()
            self.log = None
        if self.scratch_parent is not None:
            shutil.rmtree(self.scratch_parent, ignore_errors=True)
            self.scratch_parent = None

    def shutdown(self) -> None:
        """Stop the worker for good and give its identity back."""
        self.close()
        if self.lease is not None:
            self.lease.release()
            self.lease = None

    def log_tail(self, limit: int = LOG_TAIL_BYTES) -> str:
        """The end of the worker's output, at most `limit` bytes, decoded and made inert."""
        if self.log is None:
            return ""
        fd = self.log.fileno()
        size = os.fstat(fd).st_size
        data = os.pread(fd, limit, max(0, size - limit))
        return inert(data.decode("utf-8", "replace"))

    # -- requests -----------------------------------------------------------------------------

    def request(self, message: dict, timeout: float | None = None) -> dict:
        if self.proc is None or (self.proc.poll() is not None and not self._starting):
            self.start()
        self.wait_ready()
        return self._request(message, timeout if timeout is not None else self.call_timeout)

    def _timeout(self, timeout: float, what: str = "") -> StudentTimeout:
        self.close()
        return StudentTimeout(
            f"your code ran for more than {timeout:g} s (the time limit for one call) and was stopped{what}"
        )

    def _request(self, message: dict, timeout: float) -> dict:
        """Send one request and read its reply. Every read and write has the call's deadline: a silent
        worker, or one that sends half a reply and stops, is a timeout, never a hang."""
        assert self.sock is not None
        deadline = time.monotonic() + timeout
        # A fresh nonce the reply must echo: a frame the worker wrote before this request arrived (or a
        # second reply to an earlier one) cannot be taken for this request's answer.
        nonce = secrets.randbits(63)
        try:
            wire.send_frame(self.sock, wire.encode_request({**message, "nonce": nonce}), deadline)
        except wire.FrameTimeout:
            raise self._timeout(timeout, " (it stopped reading requests)") from None
        except OSError:
            self._crashed("the worker stopped accepting requests")
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._timeout(timeout)
            ready, _, _ = select.select([self.sock], [], [], min(left, 0.5))
            if ready:
                break
            if self.proc is not None and self.proc.poll() is not None:
                self._crashed()
        try:
            payload = wire.recv_frame(self.sock, self.sandbox.max_result_mb << 20, deadline)
        except wire.FrameTimeout:
            raise self._timeout(timeout, " (its reply stopped part-way)") from None
        except (EOFError, OSError):
            self._crashed()
        except wire.MalformedReply as exc:
            self.close()
            raise StudentCrash(f"your code returned an unusable result: {exc}") from None
        try:
            reply, problem = wire.decode_reply(payload, self._make_handle, self.sandbox.max_result_mb << 20,
                                               deadline + DECODE_GRACE_S), None
        except wire.MalformedReply as exc:
            reply, problem = None, str(exc)
        del payload
        if problem is not None:  # raised outside the handler: no __context__ keeps the half-decoded reply alive
            self.close()
            raise StudentCrash(problem)
        if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
            self.close()
            raise StudentCrash("the worker's reply is not a well-formed reply")
        if type(reply.get("nonce")) is not int or reply["nonce"] != nonce:  # a forged tensor compares elementwise
            self.close()
            raise StudentCrash("the worker's reply does not answer the request it was sent (a frame written "
                               "ahead of the request, or a second reply to an earlier one)")
        if not reply["ok"]:
            raise self._student_error(reply.get("error"))
        return reply

    def _student_error(self, error: Any) -> Exception:
        if not isinstance(error, dict):
            return StudentCrash("the worker reported an error in an unreadable form")
        def text(key: str, default: str, limit: int) -> str:  # the reply is the student's to forge: strings only
            value = error.get(key, default)
            return value[:limit] if isinstance(value, str) else default

        if error.get("load_failed") is True:
            failed = StudentLoadError(inert(f"{text('type', 'Exception', 100)}: {text('message', '', wire.MAX_TEXT)}"))
            failed.student_traceback = inert(text("traceback", "", wire.MAX_TEXT))
            return failed
        mro = error.get("mro", [])
        cls = remote_exception_class(text("type", "Exception", 100),
                                     [n[:100] for n in (mro[:32] if isinstance(mro, list) else []) if isinstance(n, str)])
        # The worker cuts these to wire.MAX_TEXT, but the reply is the student's to forge: cut them again here.
        exc = cls(inert(text("message", "", wire.MAX_TEXT)))
        exc.student_traceback = inert(text("traceback", "", wire.MAX_TEXT))
        return exc

    def _crashed(self, why: str | None = None) -> None:
        code = None
        if self.proc is not None:
            try:
                code = self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
        tail = self.log_tail(2000)
        self.close()
        if why is None:
            why = describe_exit(code)
        message = f"the process running your code died: {why}"
        if tail.strip():
            message += f"\n--- last output of your code ---\n{tail.strip()}"
        raise StudentCrash(message)

    def _make_handle(self, hid: int, type_name: str) -> "RemoteHandle":
        return RemoteHandle(self, hid, type_name, self.generation, {})


def describe_exit(code: int | None) -> str:
    if code is None:
        return "it stopped answering"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = {
            "SIGSEGV": " (a segmentation fault)",
            "SIGKILL": " (killed: out of memory or a resource limit)",
            "SIGXCPU": " (CPU time limit)",
            "SIGABRT": " (aborted)",
        }.get(name, "")
        return f"killed by {name}{hint}"
    return f"it exited with code {code} (did your code call os._exit or exit the interpreter?)"


# --------------------------------------------------------------------------------------------------
# Proxies


@dataclass
class CallOptions:
    forbid: tuple[str, ...] = ()
    forbid_why: str = ""
    # The contract on arguments: "function" or "Class.method" -> the parameter names it may change in
    # place, and -> its parameter names in order (from the course's own stub), to name positions.
    mutates: dict[str, tuple[str, ...]] = field(default_factory=dict)
    parameters: dict[str, tuple[str, ...]] = field(default_factory=dict)


class InputModified(AssertionError):
    """A call changed a tensor argument that its contract says it only reads."""


def argument_name(path: list, parameters: tuple[str, ...]) -> str:
    """A mutated tensor's place in (args, kwargs) as the student would name it: "x", "H[2]"."""
    where, key, *rest = path
    if where == 1:
        name = str(key)
    elif isinstance(key, int) and key < len(parameters):
        name = parameters[key]
    else:
        name = f"argument {key + 1 if isinstance(key, int) else key}"
    return name + "".join(f"[{k!r}]" for k in rest)


def allowed_mutations(qualname: str, mutated: list, options: CallOptions) -> list:
    """The entries of `mutated` (paths into (args, kwargs)) the contract allows. Raises InputModified,
    naming the argument, for a change it does not allow."""
    parameters = options.parameters.get(qualname, ())
    allowed = set(options.mutates.get(qualname, ()))
    ok = []
    for entry in mutated:
        path = list(entry[0]) if isinstance(entry, (list, tuple)) and entry else []
        if len(path) < 2 or path[0] not in (0, 1) or not _plain_path(path):
            continue
        name = argument_name(path, parameters)
        if name.split("[", 1)[0] in allowed:
            ok.append(entry)
            continue
        may = f" (it may change only {', '.join(sorted(allowed))})" if allowed else ""
        raise InputModified(
            f"{qualname or 'the call'} changed its argument {name} in place{may}; the contract says it only "
            "reads it. Build the result in a new tensor (e.g. work on x.clone()); the tests' oracle is "
            "computed from the argument as it was before the call"
        )
    return ok


def _outgoing(value: Any, worker: WorkerProcess) -> Any:
    """Prepare call arguments: handles become references, one-shot iterators become lists."""
    if isinstance(value, RemoteHandle):
        if value._generation != worker.generation:
            raise StudentCrash("this object lived in a worker that has since been restarted")
        return wire.HandleRef(value._id)
    if isinstance(value, wire.OnceIterable):
        return value
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return wire.portable(value)
    if isinstance(value, (types.GeneratorType, map, filter, zip)) or (
        hasattr(value, "__next__") and hasattr(value, "__iter__")
    ):
        return iter_arg(list(value))
    if isinstance(value, list):
        return [_outgoing(v, worker) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_outgoing(v, worker) for v in value)
    if isinstance(value, dict):
        return {k: _outgoing(v, worker) for k, v in value.items()}
    return value


def iter_arg(items: list):
    """An iterator argument travels as its items and is rebuilt as an iterator in the worker."""
    return _IterArg(items)


class _IterArg:
    def __init__(self, items):
        self.items = items

    def __reduce__(self):
        return (iter, (self.items,))


def _plain_path(path: Any) -> bool:
    """A path into the call's arguments as the worker writes it: a short list of ints and strs. The path comes
    from the worker's reply, so a key that indexes by more (a tensor, a tuple of tensors: advanced indexing that
    builds a huge tensor here) is refused."""
    return isinstance(path, list) and len(path) <= 32 and all(type(k) in (int, str) for k in path)


def _copy_back(args: Any, mutated: list) -> None:
    """Apply in-place changes the student made to tensor arguments, as an in-process call would."""
    import torch

    for entry in mutated:
        try:
            path, new = entry
        except (TypeError, ValueError):
            continue
        if not _plain_path(path):
            continue
        target = args
        try:
            for key in path:
                target = target[key]
        except (KeyError, IndexError, TypeError):
            continue
        if isinstance(target, torch.Tensor) and isinstance(new, torch.Tensor) and target.shape == new.shape:
            with torch.no_grad():
                target.copy_(new.to(target.device))


def _guard_options(options: CallOptions) -> dict:
    """The rules an attribute read runs under in the worker: a property is the student's code, like a call."""
    return {"forbid": list(options.forbid), "forbid_why": options.forbid_why}


class RemoteCallable:
    """A function, class or method that lives in the worker."""

    def __init__(self, worker: WorkerProcess, target: Any, path: list[str], options: CallOptions, generation: int,
                 owner: str = ""):
        self._worker, self._target, self._path = worker, target, path
        self._options, self._generation = options, generation
        self._qualname = ".".join([owner, *path] if owner else path)

    def _invoke(self, args: tuple, kwargs: dict, count_lines: bool = False, driver: str | None = None) -> tuple[Any, Any]:
        """The call's value, and (with `count_lines`) the worker's counts of its work, unchecked."""
        worker = self._worker
        if isinstance(self._target, int) and self._generation != worker.generation:
            raise StudentCrash("this object lived in a worker that has since been restarted")
        request = {
            "op": "call",
            "target": self._target,
            "path": self._path,
            "args": _outgoing(args, worker),
            "kwargs": _outgoing(kwargs, worker),
            "options": {
                "forbid": list(self._options.forbid),
                "forbid_why": self._options.forbid_why,
                "count_lines": count_lines,
                "driver": driver,
            },
        }
        try:
            reply = worker.request(request)
        except StudentLoadError:
            raise
        except StudentError:
            LEDGER.record(self._qualname, raised=True)
            raise
        LEDGER.record(self._qualname, raised=False)
        mutated = reply.get("mutated", [])
        if not driver and isinstance(mutated, list) and mutated:
            # This process's own tensors were never touched: only changes the contract allows are
            # copied in, as an in-process call would have made them. A driver owns its arguments.
            _copy_back((args, kwargs), allowed_mutations(self._qualname, mutated, self._options))
        value = _attach_options(reply.get("value"), self._options)
        return value, reply.get("work")

    def __call__(self, *args, **kwargs):
        return self._invoke(args, kwargs)[0]

    def __repr__(self) -> str:
        return f"<remote {'.'.join(self._path) or 'callable'}>"


def _attach_options(value: Any, options: CallOptions) -> Any:
    if isinstance(value, RemoteHandle):
        object.__setattr__(value, "_options", options)
    return value


class RemoteHandle:
    """An object of the student's that stays in the worker; attributes and methods are remote."""

    def __init__(self, worker: WorkerProcess, hid: int, type_name: str, generation: int, _unused: dict):
        object.__setattr__(self, "_worker", worker)
        object.__setattr__(self, "_id", hid)
        object.__setattr__(self, "_type", type_name)
        object.__setattr__(self, "_generation", generation)
        object.__setattr__(self, "_options", CallOptions())

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        worker = self._worker
        if self._generation != worker.generation:
            raise StudentCrash("this object lived in a worker that has since been restarted")
        reply = worker.request({"op": "getattr", "target": self._id, "name": name,
                                "options": _guard_options(self._options)})
        return _attribute(reply, worker, self._id, [name], self._options, self._type)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("attributes of a remote object are read-only from the tests")

    def _method(self, name: str, *args, **kwargs):
        return RemoteCallable(self._worker, self._id, [name], self._options, self._generation, self._type)(*args, **kwargs)

    def __len__(self) -> int:
        return self._method("__len__")

    def __getitem__(self, key):
        return self._method("__getitem__", key)

    def __call__(self, *args, **kwargs):
        return RemoteCallable(self._worker, self._id, [], self._options, self._generation, self._type)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<remote {self._type} object #{self._id}>"


def _attribute(reply: dict, worker: WorkerProcess, target: Any, path: list[str], options: CallOptions,
               owner: str = "") -> Any:
    kind = reply.get("kind")
    if kind == "exception":
        mro = reply.get("mro", [])
        # The reply is the student's to forge: names only as a short list of short strings, never str() of a value
        # (str() of a list of a thousand references to one tensor took 7 s an entry, past every deadline).
        if not isinstance(mro, list) or len(mro) > 64 or not all(isinstance(n, str) and len(n) <= 100 for n in mro):
            raise StudentCrash(f"the worker described attribute {path[-1]!r} in an unreadable form")
        return remote_exception_class(mro[0] if mro else "Exception", mro)
    if kind in ("class", "callable"):
        return RemoteCallable(worker, target, path, options, worker.generation, owner)
    if kind == "value":
        return _attach_options(reply.get("value"), options)
    raise StudentCrash(f"the worker described attribute {path[-1]!r} in an unreadable form")


class RemoteModule:
    """The student's module, as seen from the grader."""

    def __init__(self, worker: WorkerProcess, name: str, options: CallOptions):
        self._worker, self._name, self._options = worker, name, options
        self._cache: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        cached = self._cache.get(name)
        if cached is not None and (not isinstance(cached, RemoteCallable) or cached._generation == self._worker.generation):
            return cached
        reply = self._worker.request({"op": "getattr", "target": wire.MODULE, "name": name,
                                      "options": _guard_options(self._options)})
        value = _attribute(reply, self._worker, wire.MODULE, [name], self._options)
        if isinstance(value, (RemoteCallable, type)):
            self._cache[name] = value
        return value

    def __repr__(self) -> str:
        return f"<student module {self._name} (sandboxed)>"
