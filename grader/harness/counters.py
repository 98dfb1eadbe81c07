"""The work counters: what one call did, by counts that vectorised code keeps whatever the input's size.

`LineCounter` counts the lines of one source file executed; `WorkCounter` adds the torch operators dispatched
and the tensor elements read back into Python (grader/harness/host_reads.py's `reads_counted`)."""

from __future__ import annotations

import sys
import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from grader.harness.host_reads import _extent, reads_counted
from grader.harness.integrity import GuardRemoved, _enter_mode, _leave_mode
from grader.harness.opfamilies import operator_name

class LineCounter:
    """Counts 'line' events in frames whose code comes from one file (all threads).

    It runs in the process that runs the student's code, so its count is the student's to forge; the
    trusted side cross-checks it (grader/structure.py). It does catch the plain ways of switching it
    off: when the call ends with another trace function installed (``sys.settrace(None)`` inside the
    call, a debugger's tracer), `count` is -1, which the session reports as tampering.
    """

    TAMPERED = -1

    def __init__(self, filename: str):
        self.filename = filename
        self.count = 0
        self._tracer = self._global  # one bound method, so that `is` can recognise it later

    def _local(self, frame, event, arg):
        if event == "line":
            self.count += 1
        return self._local

    def _global(self, frame, event, arg):
        if frame.f_code.co_filename == self.filename:
            return self._local
        return None

    def __enter__(self) -> "LineCounter":
        self._old = sys.gettrace()
        threading.settrace(self._tracer)
        sys.settrace(self._tracer)
        return self

    def __exit__(self, *exc) -> None:
        intact = sys.gettrace() is self._tracer
        sys.settrace(self._old)
        threading.settrace(None)
        if not intact:
            self.count = self.TAMPERED



# Operators that hand a tensor's value to Python (a number or a bool): each counts as one element read.
_SCALAR_READS = frozenset({"aten::_local_scalar_dense", "aten::equal", "aten::is_nonzero", "aten::is_same_size"})


class _OperatorCounter(TorchDispatchMode):
    """Counts the operators dispatched under it (and the scalars they hand to Python) into a WorkCounter."""

    def __init__(self, counter: "WorkCounter"):
        super().__init__()
        self.counter = counter

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counter.ops += 1
        name = operator_name(func)
        if name in _SCALAR_READS:
            self.counter.reads += 1
            self.counter.read_bytes += 8
        elif "nested" in name:
            # A nested tensor's pieces take their shapes from a tensor's values, read in C++ (the sizes or
            # offsets it is made from): counted as reads of every tensor it is handed (red team round 19).
            for arg in (*args, *(kwargs or {}).values()):
                if isinstance(arg, torch.Tensor):
                    elements, nbytes = _extent(arg, whole_storage=False)
                    self.counter.reads += elements
                    self.counter.read_bytes += nbytes
        return func(*args, **(kwargs or {}))


class WorkCounter(LineCounter):
    """What one call did, by three counts that vectorised code keeps whatever the input's size: the lines
    of the student's file it executed, the torch operators it dispatched, and the tensor elements it read
    back into Python (``.tolist()``, ``.item()``, ``.numpy()``, iteration, printing; `HOST_READS`).

    Lines alone miss a per-token loop that runs in C: ``list(map(f, t.tolist()))`` executes one line for
    any number of tokens, and so does ``list(map(torch.Tensor.sum, t.unbind()))``; the first reads every
    element back, the second dispatches an operator per token. Like the line count, these figures come from
    the process that runs the student's code: the trusted scan and the grader's clock back them.
    """

    def __init__(self, filename: str):
        super().__init__(filename)
        self.ops = 0
        self.reads = 0
        self.read_bytes = 0
        self._mode = _OperatorCounter(self)

    def __enter__(self) -> "WorkCounter":
        self._reads = reads_counted(self)
        self._reads.__enter__()
        _enter_mode(self._mode, "the operator counter")
        super().__enter__()
        return self

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        try:
            _leave_mode(self._mode, "the operator counter")
        except GuardRemoved:
            self.count = self.TAMPERED
        finally:
            self._reads.__exit__(None, None, None)
