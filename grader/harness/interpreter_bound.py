"""Kernel memory under Triton's interpreter: a kernel touches only the tensors handed to its launch.

On the CPU, TRITON_INTERPRET=1 runs a kernel's loads and stores on raw host addresses. A kernel that casts an
integer to a pointer (`addr.to(tl.pointer_type(tl.float32))`) reads and writes any memory of the worker: the red
team copied x into a Python array's buffer from a kernel, computed the softmax there with numpy, and copied it
back (online_softmax 90 of 100, "is a Triton kernel" passed), and the same write reaches the probes' own memory.
Every memory access of the interpreter goes through four functions of its native module; `bound_interpreter_memory`
replaces that module, for the worker's life and before the student's code is imported, by one that checks each
active lane's address against the storages of the tensors the launch was handed (recorded when the interpreter
sets up the launch's host arguments, their addresses read again at every access). On CUDA a kernel's addresses
are the device's, and this does not apply.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import torch

from grader.harness.host_reads import _ALIASED, _STORAGE_NBYTES, _aliased_elements, _aliased_read
from grader.harness.integrity import ForbiddenCall, _install
from grader.harness.kernel_rule import (
    _BOUND, _LAUNCH_MEMORY, _LAUNCH_STATE, _MEMORY_LOCK, _STORAGE_DATA_PTR, _TENSOR_STORAGE,
)
from grader.harness.launches import _OWN_LAUNCH_WRAPPERS, _tensors_of

def _launch_tensors(values: Iterable[Any], depth: int = 0) -> Iterator[torch.Tensor]:
    """Every tensor among a launch's arguments, through nested tuples and lists (`_tensors_of` each)."""
    for value in values:
        if isinstance(value, (tuple, list)) and depth < 8:
            yield from _launch_tensors(value, depth + 1)
        else:
            yield from _tensors_of(value)


def _aliased_launch(tensors: list[torch.Tensor]) -> None:
    """A launch handed memory shared with numpy or a buffer, during a watched call: a kernel would move values
    where Python reads them without torch (the launch's own copies run with the watch suspended), so it counts
    as a read of that memory, refused under the kernel rule."""
    if _ALIASED:
        _aliased_read(_aliased_elements(tensors), lambda: "a kernel launch handed a tensor that shares its memory "
                                                          "with numpy or a buffer, which Python reads without torch")


def _set_launch_memory(values: Iterable[Any]) -> None:
    if _LAUNCH_MEMORY.stack:
        _LAUNCH_MEMORY.stack[-1] = [_TENSOR_STORAGE(t) for t in _launch_tensors(values)]


def _launch_spans() -> tuple[Any, Any]:
    """(sorted starts, ends) of the innermost running launch's storages, as they are now."""
    import numpy as np

    storages = _LAUNCH_MEMORY.stack[-1] if _LAUNCH_MEMORY.stack else []
    spans = sorted({(int(_STORAGE_DATA_PTR(s)), int(_STORAGE_DATA_PTR(s)) + int(_STORAGE_NBYTES(s)))
                    for s in storages if int(_STORAGE_NBYTES(s)) > 0})
    merged: list[list[int]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return (np.array([m[0] for m in merged], dtype=np.uint64), np.array([m[1] for m in merged], dtype=np.uint64))


def _check_lanes(ptrs: Any, mask: Any, itemsize: int, what: str) -> None:
    import numpy as np

    if _LAUNCH_MEMORY.host:
        raise ForbiddenCall(
            f"the grid function of a kernel launch {what} memory with tl.load, tl.store or an atomic: under the "
            "interpreter it runs inside the launch, but it is host code, and only a kernel's body may touch memory. "
            "A grid function returns the number of programs, computed from its arguments' sizes and constants.")

    addresses = np.asarray(ptrs, dtype=np.uint64).reshape(-1)
    if mask is not None:
        addresses = addresses[np.broadcast_to(np.asarray(mask, dtype=bool), np.shape(ptrs)).reshape(-1)]
    if addresses.size == 0:
        return
    lo, hi = _launch_spans()
    if lo.size == 0:
        bad = addresses[:1]
    else:
        at = np.searchsorted(lo, addresses, side="right").astype(np.int64) - 1
        end = hi[np.maximum(at, 0)]
        size = np.uint64(itemsize)
        inside = (at >= 0) & (end >= size) & (addresses <= end - size)  # no wrap-around near 2**64
        bad = addresses[~inside][:1]
    if bad.size:
        raise ForbiddenCall(
            f"a kernel {what} memory outside the tensors handed to its launch (address {int(bad[0]):#x}): a kernel may "
            "load and store only through pointers into its tensor arguments (a pointer made from an integer reaches "
            "memory that is not the kernel's, the grader's own included)")


class _BoundedInterpreter:
    """Triton's native interpreter module, with every load, store and atomic checked by `_check_lanes`."""

    def __init__(self, native: Any):
        self._native = native

    def __getattr__(self, name: str) -> Any:
        return getattr(self._native, name)

    # Each check and the access it clears run under `_MEMORY_LOCK`, which a guarded thread's resize_ or set_
    # also takes (OperatorGuard): another thread cannot move a launch's storage between the two (round 9, in
    # ring_allreduce, whose threads run beside a launch).
    def load(self, ptrs, mask, other, dtype):
        with _MEMORY_LOCK:
            _check_lanes(ptrs, mask, _itemsize(dtype), "read")
            return self._native.load(ptrs, mask, other, dtype)

    def store(self, ptrs, value, mask):
        with _MEMORY_LOCK:
            _check_lanes(ptrs, mask, _itemsize(getattr(value, "dtype", None)), "wrote")
            return self._native.store(ptrs, value, mask)

    def atomic_rmw(self, op, ptrs, value, mask, sem):
        with _MEMORY_LOCK:
            _check_lanes(ptrs, mask, _itemsize(getattr(value, "dtype", None)), "changed")
            return self._native.atomic_rmw(op, ptrs, value, mask, sem)

    def atomic_cas(self, ptrs, cmp, value, sem):
        with _MEMORY_LOCK:
            _check_lanes(ptrs, None, _itemsize(getattr(value, "dtype", None)), "changed")
            return self._native.atomic_cas(ptrs, cmp, value, sem)


def _itemsize(dtype: Any) -> int:
    import numpy as np

    try:
        return max(1, int(np.dtype(dtype).itemsize))
    except TypeError:
        return 8  # the widest element a lane can touch


def _own_def_line(original: Any) -> Any:
    """Triton's interpreter re-executes a kernel's source from the LAST line that starts with "def ", so a
    string in the body holding such a line made it run code the grader's scan read as a string (red team round
    9: the probes switched off at import). The source must start at the function's own def: one def line only."""
    def _find_def(self, lines):
        found = original(self, lines)
        defs = [i + 1 for i, line in enumerate(lines) if line.strip().startswith("def ")]
        if defs and found != defs[0]:
            name = getattr(getattr(self, "fn", None), "__name__", "kernel")
            raise ForbiddenCall(
                f"the kernel {name}'s source has a second line that starts with 'def ' (line {found - defs[0] + 1} "
                "of it): Triton's interpreter would run the function from there, which is not the code the grader "
                "read. A kernel holds one def; keep such text out of its body")
        return found

    return _find_def


def bound_interpreter_memory() -> None:
    """Install the bound (idempotent; a no-op without Triton's interpreter). The worker calls it before it
    imports the student's module, so a launch at import is bounded too."""
    if _BOUND["installed"]:
        return
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    native = getattr(interpreter, "_interpreter", None)
    executor = getattr(interpreter, "GridExecutor", None)
    if native is None or executor is None or not {"_init_args_hst", "__call__"} <= set(vars(executor)):
        return
    original_init = vars(executor)["_init_args_hst"]
    original_restore = vars(executor)["_restore_args_dev"]
    original_call = vars(executor)["__call__"]
    original_cvt = getattr(interpreter, "_implicit_cvt", None)

    # Under the interpreter a launch is not suspended whole (`_wrap_run` leaves the depth alone once this is
    # installed): only Triton's own steps are, setting up the arguments (torch copies, data_ptr) and copying
    # results back. Everything else in the launch is the student's Python and runs under the rules: the kernel
    # body (round 8 ran a numpy softmax on x.numpy() there), the def the interpreter executes again to rewrite
    # the kernel (round 9 computed in a default argument's expression), grid callables.
    def trusted(step):
        def run_step(*args, **kwargs):
            _LAUNCH_STATE.depth += 1
            try:
                return step(*args, **kwargs)
            finally:
                _LAUNCH_STATE.depth -= 1
        return run_step

    def __call__(self, *args_dev, **kwargs):
        _LAUNCH_MEMORY.stack.append([])  # nothing is in bounds until the launch's arguments are set up
        try:
            return original_call(self, *args_dev, **kwargs)
        finally:
            _LAUNCH_MEMORY.stack.pop()

    def _init_args_hst(self, args_dev, kwargs):
        _aliased_launch(list(_launch_tensors([args_dev, list(kwargs.values())])))
        args_hst, kwargs_hst = trusted(original_init)(self, args_dev, kwargs)
        _set_launch_memory([args_hst, list(kwargs_hst.values())])
        return args_hst, kwargs_hst

    _restore_args_dev = trusted(original_restore)
    _OWN_LAUNCH_WRAPPERS.update({_init_args_hst, __call__, _restore_args_dev})
    _install(executor, "_init_args_hst", _init_args_hst)
    _install(executor, "__call__", __call__)
    _install(executor, "_restore_args_dev", _restore_args_dev)
    if original_cvt is not None:
        _install(interpreter, "_implicit_cvt", trusted(original_cvt))  # a tensor argument becomes its data_ptr
    rewriter = getattr(interpreter, "FunctionRewriter", None)
    if rewriter is not None and "_find_def" in vars(rewriter):
        _install(rewriter, "_find_def", _own_def_line(vars(rewriter)["_find_def"]))
    _install(interpreter, "_interpreter", _BoundedInterpreter(native))
    _BOUND["installed"] = True
