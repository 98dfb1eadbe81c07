"""The worker: the only process that imports student code.

It serves requests from the grader over one socket: import the student's module, read an attribute,
call a function or method. Values that cannot travel (objects of the student's classes) stay here in
a handle table; the grader holds their ids. Exceptions come back as the student's traceback, trimmed
to the student's own frames. Nothing this process sends is trusted by the grader (see wire.py).

Run as ``python -I -m grader.harness.worker FD MODULE_PATH`` by the sandbox launcher.
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import os
import socket
import sys
import traceback
from pathlib import Path
from typing import Any

from grader.harness import host_reads, integrity, interpreter_bound, probes, wire
from grader.harness.lookup import student_attribute



def import_file(path: str | Path, name: str | None = None) -> Any:
    """Import a Python file as module `name` (default: its stem), registered in sys.modules so that
    dataclasses and pickling inside it work. A failed import leaves no half-made module behind."""
    name = name or Path(path).stem
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"expected a Python file at {path}, found none")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


class LoadFailed(Exception):
    """The student's file raised while it was imported: every request that needs the module fails with this,
    never with the file's own exception, so that an import-time ``raise ValueError`` answers no test that expects
    a ValueError from a call."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


class Worker:
    def __init__(self, sock: socket.socket, module_path: str):
        self.pinned: list[Any] = []  # a request's objects, kept until its reply is sent (`release`)
        self.rules: dict[str, Any] = {"forbid": (), "forbid_why": ""}  # the last request's, for its release
        self.sock = sock
        self.module_path = str(Path(module_path).resolve())
        self.module: Any = None
        self.handles: dict[int, Any] = {}

    # -- handles ------------------------------------------------------------------------------

    def keep(self, obj: Any) -> int:
        hid = len(self.handles) + 1
        self.handles[hid] = obj
        return hid

    def resolve(self, target: Any) -> Any:
        if target == wire.MODULE:
            return self.load()
        if isinstance(target, int) and target in self.handles:
            return self.handles[target]
        raise LookupError(f"unknown handle {target!r}")

    def unwrap(self, value: Any) -> Any:
        """Replace handle references in call arguments by the objects they stand for."""
        if isinstance(value, wire.HandleRef):
            return self.resolve(value.id)
        if isinstance(value, list):
            return [self.unwrap(v) for v in value]
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            return tuple(self.unwrap(v) for v in value)
        if isinstance(value, dict):
            return {k: self.unwrap(v) for k, v in value.items()}
        return value

    # -- operations ---------------------------------------------------------------------------

    def load(self) -> Any:
        if self.module is None:
            try:
                self.module = import_file(self.module_path)
            except BaseException as exc:  # noqa: BLE001 - whatever the file raised, it did not load
                raise LoadFailed(exc) from exc
        return self.module

    def op_getattr(self, target: Any, name: str, options: dict | None = None) -> dict:
        owner = self.resolve(target)
        options = options or {}
        self.pinned.append(owner)
        self.rules = {"forbid": options.get("forbid", ()), "forbid_why": options.get("forbid_why", "")}
        # A property or any descriptor of the student's runs here: under the same rules as a call (round 13's
        # lead), and with the same window to the reply (op_call).
        with probes.around_call(self.module_path, **self.rules):
            gc.enable()
            try:
                value = student_attribute(owner, name)
            finally:
                gc.disable()
        self.pinned.append(value)
        if isinstance(value, type) and issubclass(value, BaseException):
            return {"kind": "exception", "mro": [c.__name__ for c in value.__mro__]}
        if isinstance(value, type):
            return {"kind": "class"}
        if callable(value):
            return {"kind": "callable"}
        return {"kind": "value", "value": value}

    def op_call(self, target: Any, path: list[str], args: tuple, kwargs: dict, options: dict) -> dict:
        fn = self.resolve(target)
        for name in path:
            fn = getattr(fn, name)
        args, kwargs = self.unwrap(args), self.unwrap(kwargs)
        driver = options.get("driver")
        if driver:  # a course-provided function that runs the student's fn (a ring, an autograd pass)
            fn, args = _import_driver(driver), (fn, *args)
        snapshots = snapshot_tensors((args, kwargs))
        self.pinned += [fn, args, kwargs]  # alive until the reply is sent (serve): no finaliser of theirs runs before
        self.rules = {"forbid": options.get("forbid", ()), "forbid_why": options.get("forbid_why", "")}
        with probes.around_call(
            self.module_path,
            forbid=options.get("forbid", ()),
            forbid_why=options.get("forbid_why", ""),
            count_lines=options.get("count_lines", False),
        ) as counter:
            gc.enable()  # the collector runs only inside guarded code (serve keeps it off everywhere else)
            try:
                value = fn(*args, **kwargs)
            finally:
                # From here until the reply is sent no code of the student's may run: a generator's `finally`
                # collected by the cyclic GC just after a guarded call wrote torch.softmax's answer into the
                # returned tensor before it was sent (red team round 12: online_softmax 88 of 90 with a kernel
                # that copied its input). The collector is off, and everything the call touched stays alive.
                gc.disable()
        self.pinned.append(value)
        reply = {"value": value, "mutated": changed_tensors(snapshots)}
        if counter is not None:
            reply["work"] = {"lines": counter.count, "ops": counter.ops, "reads": counter.reads,
                             "read_bytes": counter.read_bytes}
        return reply

    def handle(self, request: dict) -> dict:
        op = request["op"]
        if op == "ping":
            return {"pid": os.getpid()}
        if op == "load":
            self.load()
            return {}
        if op == "getattr":
            return self.op_getattr(request["target"], request["name"], request.get("options"))
        if op == "call":
            return self.op_call(
                request["target"], request["path"], request["args"], request["kwargs"], request.get("options", {})
            )
        if op == "release":  # the object dies after the reply, under the rules (serve's release)
            self.pinned.append(self.handles.pop(request["target"], None))
            return {}
        raise ValueError(f"unknown op {op!r}")

    def serve(self) -> None:
        """Answer requests until the grader closes the socket. No code of the student's runs in this loop's own
        steps: the cyclic collector is on only inside guarded code (op_call, op_getattr), every object a request
        touched is released after its reply is sent, under that request's rules (`release`), and the socket is
        checked to be the grader's before every send (a finaliser that ran between calls could have put another
        socket on its descriptor number with os.dup2: red team round 13's lead)."""
        max_bytes = 1 << 40
        gc.disable()
        identity = _socket_identity(self.sock)
        request: dict | None  # None once the reply is sent (see below)
        reply: dict | None
        while True:
            try:
                request = wire.decode_request(wire.recv_frame(self.sock, max_bytes))
            except EOFError:
                return
            nonce = request.pop("nonce", None)
            self.pinned = [request]
            try:
                reply = {"ok": True, **self.handle(request)}
            except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt included
                self.pinned.append(exc)  # its traceback holds the call's frames: they die in `release`
                reply = {"ok": False, "error": self.describe(exc)}
            try:
                with host_reads.harness_io():
                    payload = wire.encode_reply({**reply, "nonce": nonce}, self.keep)
            except BaseException as exc:  # noqa: BLE001 - a value that cannot be encoded
                with host_reads.harness_io():
                    payload = wire.encode_reply(
                        {"ok": False, "error": self.describe(exc, prefix="the result could not be sent back: "),
                         "nonce": nonce},
                        self.keep,
                    )
            self.pinned.append(reply)
            reply = request = None
            if _socket_identity(self.sock) != identity:  # send nothing, end the worker: the student's crash
                print("grader: the worker's socket descriptor was replaced (os.dup2 onto it?): the worker stops",
                      file=sys.stderr, flush=True)
                os._exit(70)
            wire.send_frame(self.sock, payload)
            self.release()

    def release(self) -> None:
        """Drop the last request's objects under its rules: a finaliser of the student's runs guarded, never in
        the worker's own steps."""
        with probes.around_call(self.module_path, **self.rules):
            gc.enable()
            try:
                self.pinned = []  # a cycle among them waits for a collection, which runs inside guarded code only
            finally:
                gc.disable()
    def describe(self, exc: BaseException, prefix: str = "") -> dict:
        if isinstance(exc, LoadFailed):  # the import's own exception, marked: it is no answer to any call
            return {**self.describe(exc.cause, prefix), "load_failed": True}
        return {
            "type": type(exc).__name__,
            "mro": [c.__name__ for c in type(exc).__mro__],
            "message": prefix + _exception_text(exc),
            "traceback": student_traceback(exc, self.module_path),
        }


def _import_driver(spec: str):
    module_name, _, attr = spec.partition(":")
    if not module_name.startswith("grader.support."):
        raise ValueError(f"drivers live in grader.support, found {spec!r}")
    return getattr(importlib.import_module(module_name), attr)


MAX_TEXT = wire.MAX_TEXT  # characters of an exception's text or traceback sent to the grader


def _bounded(text: str) -> str:
    """The grader reads what the worker sends: a 200 MB exception message cost it gigabytes and minutes."""
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + f"... ({len(text) - MAX_TEXT:,} more characters)"


def _socket_identity(sock: socket.socket) -> tuple:
    """What the worker's descriptor is: the inode of the socket it was handed, and the fd number."""
    info = os.fstat(sock.fileno())
    return sock.fileno(), info.st_dev, info.st_ino


def _exception_text(exc: BaseException) -> str:
    return _bounded(_exception_text_whole(exc))


LOCKED = ("the grader's worker starts no thread or process once your module is imported: the checks watch the "
          "thread that calls your function, so do the work in that call")


def _exception_text_whole(exc: BaseException) -> str:
    if isinstance(exc, RuntimeError) and "can't start new thread" in str(exc):
        return f"{exc} ({LOCKED})"
    if isinstance(exc, PermissionError) and exc.errno == 1 and _raised_by_spawn(exc):
        return f"{exc} ({LOCKED})"
    if isinstance(exc, SystemExit):
        code = exc.code if type(exc.code) in (int, str, type(None)) else f"<{wire.type_name(type(exc.code))}>"
        return f"your code called sys.exit({code!r}); a graded function must return, not exit"
    if isinstance(exc, KeyboardInterrupt):
        return "KeyboardInterrupt raised inside your code"
    return _plain_text(exc)


@functools.lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
    import numpy
    import torch

    dirs = [os.path.dirname(os.__file__), os.path.dirname(os.path.dirname(__file__)),
            os.path.dirname(torch.__file__), os.path.dirname(numpy.__file__)]
    try:
        import triton

        dirs.append(os.path.dirname(triton.__file__))
    except ImportError:  # pragma: no cover
        pass
    return tuple(d + os.sep for d in dirs)


def _library_code(fn: Any) -> bool:
    """Is `fn` C code or Python code of the standard library, torch, numpy, Triton or the grader?"""
    code = getattr(fn, "__code__", None)
    return code is None or str(code.co_filename).startswith(_library_dirs())


def _plain_text(exc: BaseException) -> str:
    """str(exc), without running the student's code outside a guarded call: an exception class of the student's
    (or one whose arguments are objects of the student's) is described from its plain arguments only, since its
    __str__ would run here, after the call, where no probe watches."""
    kind = type(exc)
    trusted_class = _library_code(kind.__str__) and _library_code(kind.__repr__)
    plain_args = all(type(a) in (str, int, float, bool, type(None)) for a in exc.args)
    if trusted_class and plain_args:
        return str(exc)
    parts = [a if type(a) is str else repr(a) if type(a) in (int, float, bool, type(None))
             else f"<{wire.type_name(type(a))}>" for a in exc.args]
    return parts[0] if len(parts) == 1 else ", ".join(parts)


def _raised_by_spawn(exc: BaseException) -> bool:
    """Was this EPERM raised by starting a process (os.fork, subprocess, multiprocessing)?"""
    frames = traceback.extract_tb(exc.__traceback__)
    return any(f.name in ("fork", "_fork_exec", "_execute_child", "_launch", "posix_spawn", "execv", "execve")
               or "subprocess" in f.filename or "multiprocessing" in f.filename for f in frames[-4:])


def student_traceback(exc: BaseException, module_path: str) -> str:
    """The traceback with only the student's frames (and the frame that raised), paths shortened."""
    frames = traceback.extract_tb(exc.__traceback__)
    keep = [f for f in frames if f.filename == module_path]
    if frames and (not keep or frames[-1] is not keep[-1]):
        keep.append(frames[-1])
    lines = ["Traceback (most recent call last, your code only):"]
    for f in keep:
        where = Path(f.filename).name if f.filename == module_path else _short(f.filename)
        lines.append(f'  File "{where}", line {f.lineno}, in {f.name}')
        if f.line:
            lines.append(f"    {f.line.strip()}")
    lines.extend(_bounded(line) for line in traceback.format_exception_only(type(exc), exc))
    return _bounded("\n".join(line.rstrip("\n") for line in lines))


def _short(filename: str) -> str:
    parts = Path(filename).parts
    for anchor in ("site-packages", "lib"):
        if anchor in parts:
            return str(Path(*parts[parts.index(anchor) + 1 :]))
    return Path(filename).name


def _tensors(tree: Any, path: tuple = ()):
    import torch

    if isinstance(tree, torch.Tensor):
        yield path, tree
    elif isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        for i, v in enumerate(tree):
            yield from _tensors(v, path + (i,))
    elif isinstance(tree, dict):
        for k, v in tree.items():
            if isinstance(k, str):
                yield from _tensors(v, path + (k,))


_SNAPSHOT_LIMIT = 256 << 20


def snapshot_tensors(tree: Any) -> list:
    """Copies of the tensor arguments, to tell afterwards which ones the call changed."""
    snaps = []
    for path, t in _tensors(tree):
        if t.numel() * t.element_size() <= _SNAPSHOT_LIMIT:
            snaps.append((path, t, t.detach().clone()))
    return snaps


def same_tensor(a: Any, b: Any) -> bool:
    """Same shape, dtype and values, where NaN equals NaN: an input holding NaN is not "changed"."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return torch.equal(a, b)


def changed_tensors(snapshots: list) -> list:
    """[(path, tensor)] for each snapshotted argument the call changed (values, shape or dtype)."""
    return [(list(path), t.detach()) for path, t, before in snapshots if not same_tensor(t.detach(), before)]


PR_SET_DUMPABLE = 4


def not_dumpable() -> None:
    """Make this process non-dumpable before any student code runs.

    The probes (forbidden-call guard, kernel rule, line counter) live in this process's memory, and
    /proc/self/mem would let the student's code rewrite them. A non-dumpable process's /proc files
    belong to root, so the worker's own uid cannot open them, and no other process of that uid may
    ptrace it or read its memory (process_vm_readv). exec resets the flag, so it is set here, after
    the launcher's exec.
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def lock(kind: str) -> None:
    """Start no thread (and with kind "all" no process or program) from here on: grader/harness/seccomp.py.

    What must start threads later is started first: on CUDA, the context (the driver's threads) and
    autograd's device threads (a first backward pass)."""
    if kind == "none":
        return
    from grader.harness import seccomp

    if kind == "threads":  # CUDA: the driver and autograd start their threads now, not inside a graded call
        import torch

        if torch.cuda.is_available():
            x = torch.ones(1, device="cuda", requires_grad=True)
            (x * 2).sum().backward()
            torch.cuda.synchronize()
    try:
        seccomp.install_lock(processes=kind == "all")
    except OSError as exc:  # the launcher's own filter failed the same way, and the result warns of it
        print(f"grader: no thread lock for the worker ({exc})", file=sys.stderr)


def main(argv: list[str]) -> None:
    fd, module_path = int(argv[1]), argv[2]
    not_dumpable()
    host_reads.install_host_read_watch()  # before the student's module: a reference it takes is the watched one
    host_reads.arm_aliasing()
    interpreter_bound.bound_interpreter_memory()  # an interpreted kernel touches only its launch's tensors
    integrity.seal()  # the probes by identity: a guarded call that rebinds one fails (integrity.assert_sealed)
    lock(argv[3] if len(argv) > 3 else "none")  # before the student's module, too: it may start no helper
    sock = socket.socket(fileno=fd)
    Worker(sock, module_path).serve()


if __name__ == "__main__":
    main(sys.argv)
