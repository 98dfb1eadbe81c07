"""The `student` fixture's object: one API, two modes.

* ``local`` (``make check``): the student's module is imported into the test process. Real
  tracebacks, a debugger works, no sandbox. For self-study, where the student is the only user.
* ``sandbox`` (``grader grade``): the module runs in a sandboxed worker process (client.py) and the
  test process never imports it.

Tests are written once against this API::

    sm = student.load("online_softmax", forbid=["torch.softmax"])
    out = sm.online_softmax(x)                      # a call, local or remote
    out, lines = student.lines_executed(sm.online_softmax, x)
    out, work = student.work_executed(sm.online_softmax, x)   # lines, torch operators, elements read back
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from grader.harness import host_reads, interpreter_bound, probes, tamper, wire
from grader.harness.lookup import student_attribute
from grader.harness.client import (
    CallOptions,
    SandboxError,
    RemoteCallable,
    RemoteModule,
    Sandbox,
    StudentLoadError,
    WorkerProcess,
)
from grader.harness.client import allowed_mutations
from grader.harness.worker import _import_driver as import_driver
from grader.harness.ledger import LEDGER
from grader.harness.worker import changed_tensors, import_file, snapshot_tensors, student_traceback
from grader.text import inert


class LocalModule:
    """The student's module imported in-process, with the same probes as the worker applies."""

    def __init__(self, module: Any, path: Path, options: CallOptions):
        self._module, self._path, self._options = module, str(path), options

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = student_attribute(self._module, name)
        if isinstance(value, type) and issubclass(value, BaseException):
            return value  # pytest.raises(sm.OutOfBlocks) matches the class itself
        if callable(value):
            return LocalCallable(value, self._path, self._options)
        return value

    def __repr__(self) -> str:
        return f"<student module {self._module.__name__} (in-process)>"


class LocalCallable:
    def __init__(self, fn: Callable, path: str, options: CallOptions, qualname: str = ""):
        self._fn, self._path, self._options = fn, path, options
        self._qualname = qualname or getattr(fn, "__qualname__", "")
        try:
            functools.update_wrapper(self, fn)
        except AttributeError:  # some callables lack __name__ and friends
            pass

    def _invoke(self, args: tuple, kwargs: dict, count_lines: bool = False, driver: str | None = None) -> tuple[Any, Any]:
        fn = self._fn
        if driver:
            fn, args = import_driver(driver), (fn, *args)
        snapshots = [] if driver else snapshot_tensors((args, kwargs))
        try:
            with probes.around_call(self._path, self._options.forbid, self._options.forbid_why, count_lines) as counter:
                value = fn(*args, **kwargs)
        except Exception:
            LEDGER.record(self._qualname, raised=True)
            raise
        LEDGER.record(self._qualname, raised=False)
        if snapshots:  # the same contract on arguments as the sandboxed worker's calls
            allowed_mutations(self._qualname, changed_tensors(snapshots), self._options)
        work = None if counter is None else {"lines": counter.count, "ops": counter.ops, "reads": counter.reads,
                                             "read_bytes": counter.read_bytes}
        return value, work

    def __call__(self, *args, **kwargs):
        return self._invoke(args, kwargs)[0]


@dataclass(frozen=True)
class Work:
    """What one call did, as the worker counted it (counters.WorkCounter)."""

    lines: int  # lines of the student's file executed
    ops: int  # torch operators dispatched
    reads: int  # tensor elements read back into Python
    read_bytes: int  # their bytes (values packed several to an element read few elements, all their bytes)

    @classmethod
    def from_reply(cls, counts: Any) -> "Work | None":
        """The counts of a reply, or None when they are missing, not plain integers, or show no line run."""
        if not isinstance(counts, dict):
            return None
        values: list[Any] = [counts.get(k) for k in ("lines", "ops", "reads", "read_bytes")]  # checked next
        if not all(type(v) is int and v >= 0 for v in values) or values[0] <= 0:
            return None
        return cls(*values)


_registered: list[Any] = []  # the session of this process (register_session)


def register_session(session: Any) -> None:
    """Where `grader.structure.clock(student.mode, ...)` finds the session: `StudentSession` registers itself
    here when it is made (one per grading process; the latest wins). Anything with what
    grader.structure.SupportsRoundTrip names (mode, round_trip, student_files) may stand in for it."""
    _registered[:] = [session]


def registered_session() -> Any:
    """The session registered last in this process, or None."""
    return _registered[0] if _registered else None


class StudentSession:
    """Loads the student's modules for the tests, in the mode the run was started in."""

    def __init__(self, mode: str, locate: Callable[[str], Path], sandbox: Sandbox | None = None,
                 call_timeout: Callable[[str], float] | None = None,
                 contract: Callable[[str], dict] | None = None, spawns: Callable[[str], bool] | None = None):
        if mode not in ("local", "sandbox"):
            raise ValueError(f"mode must be 'local' or 'sandbox', found {mode!r}")
        self.mode = mode
        self._locate = locate
        self._sandbox = sandbox or Sandbox()
        self._call_timeout = call_timeout or (lambda _id: 60.0)
        self._contract = contract or (lambda _id: {})  # CallOptions fields: mutates, parameters
        self._spawns = spawns or (lambda _id: False)  # course.yaml `spawns`: its drivers start threads or processes
        self._workers: dict[str, WorkerProcess] = {}
        self._local: dict[str, Any] = {}
        register_session(self)  # grader.structure.clock(student.mode, ...) finds the session here

    def load(self, exercise_id: str, forbid: Iterable[str] = (), forbid_why: str = "") -> Any:
        """The student's module for an exercise. `forbid` names library functions it must not call.

        With `forbid`, the student's file is first scanned here, as text (grader.harness.tamper): when it
        reaches for the machinery the guard is built on, the module comes back as a `TamperedModule`,
        whose every use fails with the findings, in local and sandboxed modes alike.
        """
        options = CallOptions(tuple(forbid), forbid_why, **self._contract(exercise_id))
        path = self._locate(exercise_id).resolve()  # code objects carry the absolute filename
        findings = tamper_findings(path) if options.forbid else []
        if findings:  # the guard runs beside the student's code: a file that reaches for it is not guarded
            return TamperedModule(exercise_id, findings)
        if self.mode == "local":
            return LocalModule(self._import(exercise_id, path), path, options)
        return RemoteModule(self._worker(exercise_id), exercise_id, options)

    def _worker(self, exercise_id: str) -> WorkerProcess:
        if exercise_id not in self._workers:
            self._workers[exercise_id] = WorkerProcess(self._locate(exercise_id), self._sandbox,
                                                       self._call_timeout(exercise_id), self._spawns(exercise_id))
        return self._workers[exercise_id]

    def prestart(self, exercise_id: str) -> None:
        """Start the exercise's worker now, so that it imports torch while pytest collects tests."""
        if self.mode == "sandbox" and self._locate(exercise_id).is_file():
            try:
                self._worker(exercise_id).spawn()
            except SandboxError:
                pass  # the first call starts it again and fails that test with the reason

    def _import(self, exercise_id: str, path: Path) -> Any:
        if exercise_id not in self._local:
            if not path.is_file():
                raise FileNotFoundError(f"expected the student's file at {path}, found nothing there")
            host_reads.install_host_read_watch()
            host_reads.arm_aliasing()
            interpreter_bound.bound_interpreter_memory()
            try:
                self._local[exercise_id] = import_file(path)
            except BaseException as exc:  # noqa: BLE001 - whatever the file raised, it did not load
                failed = StudentLoadError(inert(f"{type(exc).__name__}: {exc}", wire.MAX_TEXT))
                failed.student_traceback = student_traceback(exc, str(path))
                raise failed from exc
        return self._local[exercise_id]

    def lines_executed(self, fn: Any, *args, check: Callable[[Any], None], **kwargs) -> tuple[Any, int]:
        """Call `fn` and count the lines of the student's module it executed (`work_executed`'s lines)."""
        value, work = self.work_executed(fn, *args, check=check, **kwargs)
        return value, work.lines

    def work_executed(self, fn: Any, *args, check: Callable[[Any], None], **kwargs) -> tuple[Any, "Work"]:
        """Call `fn` and count its work: the lines of the student's module it executed, the torch operators
        it dispatched and the tensor elements it read back into Python (counters.WorkCounter).

        `check(value)` must fail (AssertionError) unless the call returned the right answer, and it is not
        optional: a count says nothing about a call that did not do the work. A submission can tell a counted
        call from the others (by its inputs, or by the counters' frames in a traceback) and return a
        placeholder there, looping everywhere else (red team round 15: speculative and paged_kv kept their
        "vectorised" points that way, whose counted results were thrown away).

        The structural test for vectorisation: a loop over tokens grows one of the three with the number of
        tokens, a Python loop the lines, a loop run by C (``map``) the operators or the elements read back;
        vectorised code keeps all three whatever the size. The counts are taken in the process that runs the
        student's code, so they are figures the student can forge: a file that the trusted static scan
        (grader.harness.tamper.scan_source) finds tampering with tracing or the harness fails here, and the tests
        cross-check flat counts with the grader's own clock (grader.structure.clock).
        """
        target = self._callable(fn)
        self.assert_untampered(target, "the count of lines your code executed")
        value, counts = target._invoke(args, kwargs, count_lines=True)
        check(value)
        work = Work.from_reply(counts)
        if work is None:
            raise AssertionError(
                f"no line of your module was counted during the call (found {inert(repr(counts), 200)}): "
                "line tracing was disabled or tampered with"
            )
        return value, work

    def assert_untampered(self, fn: Any, figure: str) -> None:
        """Fail when the student's file, scanned here as text, tampers with what measures `figure`.

        Tests call it before trusting a figure a driver counted beside the student's code.
        """
        tamper.assert_untampered(_student_file(self._callable(fn)), figure)

    def drive(self, driver: str, fn: Any, *args, **kwargs) -> Any:
        """Run a course-provided driver, ``"grader.support.<module>:<function>"``, on the student's `fn`.

        The driver runs where the student's code runs (the worker, or this process) and is called as
        ``driver(fn, *args, **kwargs)``. Use it for what must happen beside the student's code: a
        simulated ring of threads, a forward and backward pass, a timed loop.
        """
        return self._callable(fn)._invoke(args, kwargs, driver=driver)[0]

    def kernel_resources(self, fn: Any, *args, stop_at_misfit: bool = True, **kwargs) -> Any:
        """Call `fn` with its Triton launches recorded, then compile each distinct launch for a real GPU
        (grader.kernelmodel): a `KernelRun` with the call's result, the launch record and each compile's
        registers, stack (spills) and shared memory. The record comes from the worker, so the tamper gate runs
        before it is used; the kernels are read from the student's file here, as text. Judge the figures with
        `grader.kernelmodel.assert_fit`, and check `out` as usual: a record says nothing about a wrong answer."""
        from grader import kernelmodel

        got = self.drive("grader.support.kernels:launches", fn, *args, **kwargs)
        self.assert_untampered(fn, "the record of your Triton launches")
        launches = list(got["launches"]) if isinstance(got, dict) and isinstance(got.get("launches"), list) else []
        found = kernelmodel.resources(_student_file(self._callable(fn)), launches, stop_at_misfit=stop_at_misfit)
        return kernelmodel.KernelRun(got["out"], launches, list(got["handed"]), found)

    def _callable(self, fn: Any) -> RemoteCallable | LocalCallable:
        """A student function, class or method, ready for probes (in-process: wrapped on the spot)."""
        if isinstance(fn, (RemoteCallable, LocalCallable)):
            return fn
        if self.mode == "local" and callable(fn):
            code_file = _source_file(fn)
            if code_file is not None:
                return LocalCallable(fn, code_file, CallOptions())
        raise TypeError(f"expected a function, class or method of a module returned by student.load, found {fn!r}")

    def round_trip(self, *args: Any) -> bool:
        """A call with these arguments to a running worker that runs none of the student's code (the
        driver grader.support.baseline:nothing): what the request, the probes and the reply cost, which
        grader.structure.clock times beside the student's calls. False when no worker is running
        (in-process, or before the first call)."""
        for worker in self._workers.values():
            if worker.proc is not None and worker.proc.poll() is None:
                RemoteCallable(worker, wire.MODULE, [], CallOptions(), worker.generation)._invoke(
                    args, {}, driver="grader.support.baseline:nothing")
                return True
        return False

    def student_files(self) -> list[Path]:
        """The student's files this session has loaded, in either mode (grader.structure.clock scans them)."""
        return [*(Path(w.module_path) for w in self._workers.values()),
                *(self._locate(exercise_id).resolve() for exercise_id in self._local)]

    def warnings(self) -> list[str]:
        return sorted({w for worker in self._workers.values() for w in worker.warnings})

    def worker_starts(self) -> int:
        return sum(w.starts for w in self._workers.values())

    def warm_worker_starts(self) -> int:
        """Of `worker_starts`, those forked from the zygote (grader/harness/zygote.py)."""
        return sum(w.warm_starts for w in self._workers.values())

    def close(self) -> None:
        for worker in self._workers.values():
            worker.shutdown()
        self._workers.clear()


_findings_cache: dict[tuple[str, int, int], list[tamper.Finding]] = {}


def tamper_findings(path: Path) -> list[tamper.Finding]:
    """The trusted scan of the student's file (none for a missing file: loading it reports that)."""
    try:
        stat = path.stat()
    except OSError:
        return []
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    if key not in _findings_cache:
        _findings_cache[key] = tamper.scan_file(path)
    return _findings_cache[key]


class TamperedModule:
    """Stands in for a student module whose file tampers with the probes: every attribute fails."""

    def __init__(self, exercise_id: str, findings: list[tamper.Finding]):
        self._exercise_id, self._findings = exercise_id, findings

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise tamper.Tampered(tamper.tampered_message(self._findings))

    def __repr__(self) -> str:
        return f"<student module {self._exercise_id} (not guarded: {len(self._findings)} tamper findings)>"


def _student_file(target: RemoteCallable | LocalCallable) -> str:
    """The student's file a proxy's code comes from, as the trusted process knows it."""
    if isinstance(target, RemoteCallable):
        return str(target._worker.module_path)
    return target._path


def _source_file(fn: Any) -> str | None:
    target = getattr(fn, "__func__", fn)  # a bound method's function
    module = sys.modules.get(getattr(target, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    return str(Path(path).resolve()) if path else None
