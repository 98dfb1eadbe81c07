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
from typing import Any

from grader.harness import wire
from grader.harness.worker import MODULE


class StudentError(Exception):
    """The student's code raised an exception."""

    type_name = "Exception"
    student_traceback = ""

    def __str__(self) -> str:
        text = super().__str__()
        return f"{self.type_name}: {text}" if text else self.type_name


class StudentCrash(Exception):
    """The worker running the student's code died or sent something that is not a valid reply."""


class StudentTimeout(Exception):
    """A call into the student's code ran past its time limit."""


_exception_classes: dict[tuple, type] = {}


def remote_exception_class(name: str, mro: list[str]) -> type:
    """A local class standing for the student's exception class `name` (with its base names)."""
    key = (name, tuple(mro))
    if key not in _exception_classes:
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


@dataclass
class Sandbox:
    """How to isolate workers. `hide` lists folders the worker must not be able to read."""

    isolate: bool = True
    user: str | None = "nobody"
    hide: list[str] = field(default_factory=list)
    memory_mb: int = 8192
    cpu_s: int = 900
    file_size_mb: int = 256
    processes: int = 256
    max_result_mb: int = 1024
    threads: int = 1
    cuda: bool = False

    def uid_gid(self) -> tuple[int | None, int | None]:
        if os.geteuid() != 0 or not self.user:
            return None, None
        entry = pwd.getpwnam(self.user)
        return entry.pw_uid, entry.pw_gid


_PASS_ENV = ("CUDA_VISIBLE_DEVICES", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "LD_LIBRARY_PATH", "GRADER_IN_CONTAINER")


class WorkerProcess:
    """One sandboxed worker serving one student module; restarted on demand after a failure."""

    def __init__(self, module_path: Path, sandbox: Sandbox, call_timeout: float):
        self.module_path = Path(module_path)
        self.sandbox = sandbox
        self.call_timeout = call_timeout
        self.generation = 0
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.workdir: Path | None = None
        self.warnings: list[str] = []
        self.starts = 0
        self._starting = False

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start a fresh worker and wait until it answers."""
        self.spawn()
        self.wait_ready()

    def wait_ready(self) -> None:
        if not self._starting:
            return
        self._starting = False
        self._request({"op": "ping"}, timeout=max(60.0, self.call_timeout))
        self.warnings = [
            line.split(":", 1)[1].strip()
            for line in self.log_tail(8000).splitlines()
            if line.startswith("grader-sandbox-warning:")
        ]

    def spawn(self) -> None:
        """Start a fresh worker without waiting for it (it imports torch meanwhile)."""
        self.close()
        self.workdir = Path(tempfile.mkdtemp(prefix="grader-worker-"))
        target = self.workdir / self.module_path.name
        shutil.copyfile(self.module_path, target)
        uid, gid = self.sandbox.uid_gid()
        if uid is not None:
            os.chown(self.workdir, uid, gid)
            os.chown(target, uid, gid)
        parent_sock, child_sock = socket.socketpair()
        config = {
            "isolate": self.sandbox.isolate,
            "hide": [str(Path(p).resolve()) for p in self.sandbox.hide],
            "uid": uid,
            "gid": gid,
            "workdir": str(self.workdir),
            "log": str(self.workdir / "output.log"),
            "limits": {
                "cpu_s": self.sandbox.cpu_s,
                "file_size_mb": self.sandbox.file_size_mb,
                "memory_mb": 0 if self.sandbox.cuda else self.sandbox.memory_mb,
                "processes": self.sandbox.processes,
            },
            "argv": [str(child_sock.fileno()), str(target)],
        }
        env = {k: os.environ[k] for k in _PASS_ENV if k in os.environ}
        threads = str(self.sandbox.threads)
        env.update(
            PATH="/usr/local/bin:/usr/bin:/bin",
            HOME=str(self.workdir),
            TMPDIR=str(self.workdir),
            LANG="C.UTF-8",
            OMP_NUM_THREADS=threads,
            MKL_NUM_THREADS=threads,
            TRITON_CACHE_DIR=str(self.workdir / ".triton"),
        )
        if not self.sandbox.cuda:
            env["TRITON_INTERPRET"] = "1"
        launch_err = open(self.workdir / "launch.log", "wb")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-m", "grader.harness.launch", json.dumps(config)],
                pass_fds=[child_sock.fileno()],
                start_new_session=True,
                env=env,
                cwd=str(self.workdir),
                stdin=subprocess.DEVNULL,
                stdout=launch_err,
                stderr=launch_err,
            )
        finally:
            launch_err.close()
            child_sock.close()
        self.sock = parent_sock
        self.generation += 1
        self.starts += 1
        self._starting = True

    def close(self) -> None:
        self._starting = False
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - a process SIGKILL cannot stop
                pass
            self.proc = None
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def log_tail(self, limit: int = 2000) -> str:
        if self.workdir is None:
            return ""
        texts = []
        for name in ("launch.log", "output.log"):
            path = self.workdir / name
            try:
                with open(path, "rb") as f:
                    f.seek(max(0, path.stat().st_size - limit))
                    texts.append(f.read().decode("utf-8", "replace"))
            except OSError:
                continue
        return "".join(texts)[-limit:]

    # -- requests -----------------------------------------------------------------------------

    def request(self, message: dict, timeout: float | None = None) -> dict:
        if self.proc is None or (self.proc.poll() is not None and not self._starting):
            self.start()
        self.wait_ready()
        return self._request(message, timeout if timeout is not None else self.call_timeout)

    def _request(self, message: dict, timeout: float) -> dict:
        assert self.sock is not None
        try:
            wire.send_frame(self.sock, wire.encode_request(message))
        except OSError:
            self._crashed("the worker stopped accepting requests")
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise StudentTimeout(
                    f"your code ran for more than {timeout:g} s (the time limit for one call) and was stopped"
                )
            ready, _, _ = select.select([self.sock], [], [], min(left, 0.5))
            if ready:
                break
            if self.proc is not None and self.proc.poll() is not None:
                self._crashed()
        try:
            payload = wire.recv_frame(self.sock, self.sandbox.max_result_mb << 20)
        except (EOFError, OSError):
            self._crashed()
        except wire.MalformedReply as exc:
            self.close()
            raise StudentCrash(f"your code returned an unusable result: {exc}") from None
        try:
            reply = wire.decode_reply(payload, self._make_handle)
        except wire.MalformedReply as exc:
            self.close()
            raise StudentCrash(str(exc)) from None
        if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
            self.close()
            raise StudentCrash("the worker's reply is not a well-formed reply")
        if not reply["ok"]:
            raise self._student_error(reply.get("error"))
        return reply

    def _student_error(self, error: Any) -> Exception:
        if not isinstance(error, dict):
            return StudentCrash("the worker reported an error in an unreadable form")
        cls = remote_exception_class(str(error.get("type", "Exception")), [str(n) for n in error.get("mro", [])])
        exc = cls(str(error.get("message", "")))
        exc.student_traceback = str(error.get("traceback", ""))
        return exc

    def _crashed(self, why: str | None = None) -> None:
        code = None
        if self.proc is not None:
            try:
                code = self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
        tail = self.log_tail()
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


def _copy_back(args: Any, mutated: list) -> None:
    """Apply in-place changes the student made to tensor arguments, as an in-process call would."""
    import torch

    for path, new in mutated:
        target = args
        try:
            for key in path:
                target = target[key]
        except (KeyError, IndexError, TypeError):
            continue
        if isinstance(target, torch.Tensor) and target.shape == new.shape:
            with torch.no_grad():
                target.copy_(new.to(target.device))


class RemoteCallable:
    """A function, class or method that lives in the worker."""

    def __init__(self, worker: WorkerProcess, target: Any, path: list[str], options: CallOptions, generation: int):
        self._worker, self._target, self._path = worker, target, path
        self._options, self._generation = options, generation

    def _invoke(self, args: tuple, kwargs: dict, count_lines: bool = False, driver: str | None = None) -> tuple[Any, int | None]:
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
        reply = worker.request(request)
        _copy_back((args, kwargs), reply.get("mutated", []))
        value = _attach_options(reply.get("value"), self._options)
        return value, reply.get("lines")

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
        reply = worker.request({"op": "getattr", "target": self._id, "name": name})
        return _attribute(reply, worker, self._id, [name], self._options)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("attributes of a remote object are read-only from the tests")

    def _method(self, name: str, *args, **kwargs):
        return RemoteCallable(self._worker, self._id, [name], self._options, self._generation)(*args, **kwargs)

    def __len__(self) -> int:
        return self._method("__len__")

    def __getitem__(self, key):
        return self._method("__getitem__", key)

    def __call__(self, *args, **kwargs):
        return RemoteCallable(self._worker, self._id, [], self._options, self._generation)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<remote {self._type} object #{self._id}>"


def _attribute(reply: dict, worker: WorkerProcess, target: Any, path: list[str], options: CallOptions) -> Any:
    kind = reply.get("kind")
    if kind == "exception":
        mro = [str(n) for n in reply.get("mro", [])]
        return remote_exception_class(mro[0] if mro else "Exception", mro)
    if kind in ("class", "callable"):
        return RemoteCallable(worker, target, path, options, worker.generation)
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
        reply = self._worker.request({"op": "getattr", "target": MODULE, "name": name})
        value = _attribute(reply, self._worker, MODULE, [name], self._options)
        if isinstance(value, (RemoteCallable, type)):
            self._cache[name] = value
        return value

    def __repr__(self) -> str:
        return f"<student module {self._name} (sandboxed)>"
