"""Host reads: the routes that hand a tensor's values to Python or numpy without reaching the dispatcher
(`HOST_READS`), watched from before the student's module is imported (`install_host_read_watch`), refused under
the kernel rule (`host_reads_refused`) or counted (`reads_counted`, `ReadCounter`); and the registry of memory
shared with numpy or a buffer (`_ALIASED`), every operator on which counts as a read during a watched call."""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Iterable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from grader.harness.integrity import _INHERITED, ForbiddenCall, _enter_mode, _install, _leave_mode, _resolve
from grader.harness.kernel_rule import _STORAGE_DATA_PTR, _TENSOR_STORAGE, host_read_refused, in_launch, storage_of
from grader.harness.opfamilies import operator_name

# Ways to read a tensor's values on the host that never reach the dispatcher, patched for a guarded call
# (`.item()`, `int(t)` and `bool(t)` reach aten::_local_scalar_dense, which HOST_OPS leaves out). A
# property is patched as a property. Reached through the base class, which cannot be patched
# (torch._C.TensorBase: super(torch.Tensor, t).tolist(), torch.Tensor.__base__.numpy(t)), they stay open at
# run time: that is the trusted scan's to flag (it flags torch._C; tests/test_probes.py shows the rest).
HOST_READS: dict[str, str] = {
    "torch.Tensor.numpy": "Tensor.numpy()",
    "torch.Tensor.tolist": "Tensor.tolist()",
    "torch.Tensor.__array__": "numpy.asarray(tensor) (Tensor.__array__)",
    "torch.Tensor.__dlpack__": "a DLPack export (Tensor.__dlpack__, numpy.from_dlpack)",
    "torch.Tensor.__cuda_array_interface__": "Tensor.__cuda_array_interface__",
    "torch.Tensor.__repr__": "repr() or print() of a tensor",
    "torch.Tensor.__str__": "str() or print() of a tensor",
    "torch.Tensor.__format__": "an f-string of a tensor",
    "torch.Tensor.__reduce_ex__": "pickling a tensor (pickle, torch.save)",
    "torch.Tensor.untyped_storage": "Tensor.untyped_storage()",
    "torch.Tensor.storage": "Tensor.storage()",
    "torch.Tensor.data_ptr": "Tensor.data_ptr() (an address to read memory through)",
    "torch.Tensor.apply_": "Tensor.apply_ (a Python function run on every value)",
    "torch.Tensor.map_": "Tensor.map_ (a Python function run on every pair of values)",
    "torch.Tensor.map2_": "Tensor.map2_ (a Python function run on every triple of values)",
    "torch.utils.dlpack.to_dlpack": "torch.utils.dlpack.to_dlpack",
    "torch.to_dlpack": "torch.to_dlpack",
    "torch.frombuffer": "torch.frombuffer (a tensor built from host bytes)",
    "torch.from_dlpack": "torch.from_dlpack (a tensor built from another library's memory)",
    "torch.utils.dlpack.from_dlpack": "torch.utils.dlpack.from_dlpack",
    "torch.from_numpy": "torch.from_numpy (a tensor over numpy's memory, which Python reads without torch)",
    "torch.as_tensor": "torch.as_tensor of a numpy array or a buffer (a tensor over memory Python reads without torch)",
    "torch.asarray": "torch.asarray of a numpy array or a buffer (a tensor over memory Python reads without torch)",
    "torch.Tensor.share_memory_": "Tensor.share_memory_ (moves its memory to a shared file Python can read)",
    "torch.from_file": "torch.from_file (a tensor over a file Python reads without torch)",
    "torch.save": "torch.save (pickling tensors' and storages' bytes where Python reads them)",
    "torch.serialization.save": "torch.save (pickling tensors' and storages' bytes where Python reads them)",
    # tensor_split with a 1-D tensor of indices reads them in C++, with no operator of its own: the guard and the
    # counter saw only the slices it made, and each piece's storage_offset() handed one value to Python (red
    # team round 18: a host softmax behind a copy kernel took online_softmax's Triton checks, 27/27). Watched
    # only when handed a tensor (`_VALUE_ARGUMENTS`); with ints it is a view like any other.
    "torch.tensor_split": "torch.tensor_split with a tensor of indices (it reads them on the host)",
    "torch.Tensor.tensor_split": "Tensor.tensor_split with a tensor of indices (it reads them on the host)",
    # A storage the student holds (made at import: torch.UntypedStorage(n), then a tensor over it with set_) has
    # byte routes of its own that dispatch no operator: the red team copied a result into one and read it with
    # torch.save or _write_file (flash_attention 76/76 from host numpy), and wrote one with _set_from_file.
    **{f"torch.{kind}.{method}": f"{kind}.{method}" for kind in ("UntypedStorage", "TypedStorage") for method in (
        "tolist", "__getitem__", "__setitem__", "_write_file", "_set_from_file", "data_ptr", "__reduce__",
        "__reduce_ex__", "_share_fd_cpu_", "_share_filename_cpu_", "share_memory_", "from_buffer", "from_file",
        "_new_shared", "_new_shared_fd_cpu", "_new_shared_filename_cpu", "_new_with_weak_ptr", "_get_shared_fd")},
}
# Of those, the routes that build a tensor over memory that Python can read without torch (numpy's, a buffer's):
# a copy into it (`torch.from_numpy(a).copy_(t)`) reads t's values with no read-back route. They count the new
# tensor's storage, and pass through when handed a tensor or plain Python data (a list, a number: a copy).
_CREATING = frozenset({"torch.frombuffer", "torch.from_dlpack", "torch.utils.dlpack.from_dlpack", "torch.from_numpy",
                       "torch.as_tensor", "torch.asarray"})

# Of those, the routes that read the values of one argument only when it is a tensor (its position, its names):
# they count that tensor's elements, and pass through otherwise.
_VALUE_ARGUMENTS: dict[str, tuple[int, tuple[str, ...]]] = {
    "torch.tensor_split": (1, ("indices_or_sections", "tensor_indices_or_sections", "indices", "sections")),
    "torch.Tensor.tensor_split": (1, ("indices_or_sections", "tensor_indices_or_sections", "indices", "sections")),
}


# -- Host reads: watched from before the student's module is imported
#
# A patch made only for the duration of a call misses a reference the student's module took at import
# (``_np = torch.Tensor.numpy``). So the routes in `HOST_READS` are replaced once, before any student
# module is imported (the worker and the session call `install_host_read_watch` first), by wrappers that
# pass through unless a guarded call is running: then they refuse (the kernel rule) or count the elements
# read (`WorkCounter`). A reference taken at import is the wrapper.

_READS: dict[str, Any] = {"installed": False, "refuse": 0, "why": "", "counters": []}
_READS_LOCK = threading.Lock()


# The routes that hand over a tensor's memory, not a copy of its values: what they expose is the whole storage
# (a one-element view's .numpy() reaches every element through numpy's strides), so they count its size.
_EXPOSING = frozenset({
    "torch.Tensor.numpy", "torch.Tensor.__array__", "torch.Tensor.__dlpack__", "torch.Tensor.__cuda_array_interface__",
    "torch.Tensor.__reduce_ex__", "torch.Tensor.untyped_storage", "torch.Tensor.storage", "torch.Tensor.data_ptr",
    "torch.Tensor.apply_", "torch.Tensor.map_", "torch.Tensor.map2_",
    "torch.utils.dlpack.to_dlpack", "torch.to_dlpack", "torch.Tensor.share_memory_", "torch.save",
    "torch.serialization.save",
    *(dotted for dotted in HOST_READS if ".UntypedStorage." in dotted or ".TypedStorage." in dotted),
})


# Taken before any student code, never patched.
_STORAGE_NBYTES = torch._C.StorageBase.nbytes  # type: ignore[attr-defined]  # not in torch's stubs
# Of the exposing routes, those that leave memory shared with numpy or a buffer behind (not a one-off copy out).
_ALIASING = frozenset({
    "torch.Tensor.numpy", "torch.Tensor.__array__", "torch.Tensor.__dlpack__", "torch.Tensor.__cuda_array_interface__",
    "torch.utils.dlpack.to_dlpack", "torch.to_dlpack", "torch.Tensor.share_memory_",
    # not untyped_storage() and storage(): torch.save calls them on every tensor, and a storage's bytes reach Python
    # only through its own routes, which are watched in every call
    *(f"torch.{kind}.{m}" for kind in ("UntypedStorage", "TypedStorage") for m in (
        "_share_fd_cpu_", "_share_filename_cpu_", "share_memory_", "_new_shared", "_new_shared_fd_cpu",
        "_new_shared_filename_cpu", "_get_shared_fd")),
})


def _extent(value: Any, whole_storage: bool, depth: int = 0) -> tuple[int, int]:
    """(elements, bytes) a read of `value` reaches: its own, or (`whole_storage`) every element of its storage;
    a storage's bytes; what a container holds (torch.save of a list, two levels deep). Bytes beside elements:
    values packed several to an element (int8 ids viewed as int64) read few elements but all their bytes."""
    if isinstance(value, torch.UntypedStorage):
        n = int(_STORAGE_NBYTES(value))
        return n, n
    if isinstance(value, torch.TypedStorage):
        n = int(_STORAGE_NBYTES(value._untyped_storage))
        return n, n
    if isinstance(value, (list, tuple, dict)) and depth < 2:
        items = value.values() if isinstance(value, dict) else value
        parts = [_extent(v, whole_storage, depth + 1) for v in list(items)[:10_000]]
        return sum(p[0] for p in parts), sum(p[1] for p in parts)
    if not isinstance(value, torch.Tensor):
        return 0, 0
    try:
        size = max(int(torch._C.TensorBase.element_size(value)), 1)
        if whole_storage:
            nbytes = int(_TENSOR_STORAGE(value).nbytes())
            return -(-nbytes // size), nbytes
        n = int(torch._C.TensorBase.numel(value))
        return n, n * size
    except RuntimeError:
        return 0, 0


def _elements(value: Any, whole_storage: bool, depth: int = 0) -> int:
    """The elements a read of `value` reaches (`_extent`'s first figure)."""
    return _extent(value, whole_storage, depth)[0]


def _count_read(elements: int, nbytes: int) -> None:
    for counter in _READS["counters"]:
        counter.reads += elements
        counter.read_bytes += nbytes


class _ReadState(threading.local):
    reading: tuple = ()  # ids of the tensors whose watched read is running in this thread


# Reads that call the student's code back while they run: a read made from inside the callback is the
# student's own, never the library's nested one, so it counts even when it reads the same object
# (`box.apply_(f)`, whose `f` swapped `box.data = x` and read `box.tolist()`, was counted as one element
# for 100,000: red team round 15).
_CALLING_BACK = frozenset({"torch.Tensor.apply_", "torch.Tensor.map_", "torch.Tensor.map2_"})


_READ_STATE = _ReadState()


def _watched_read(fn: Any, what: str, args: tuple, kwargs: dict, whole_storage: bool = False,
                  aliasing: bool = False, calls_back: bool = False) -> Any:
    # Nested reads of one object are counted once (numpy.asarray(t) calls t.__array__, which calls t.numpy()):
    # library code reading on. A read that runs the student's code marks nothing: what that code reads counts.
    target = id(args[0]) if args and not calls_back else None
    if aliasing and args and not in_launch():  # memory handed over where Python reads it later: remembered
        _note_aliased(args[0])
    if not in_launch():
        if _READS["refuse"]:
            raise host_read_refused(what, _READS["why"])
        if _READS["counters"] and (target is None or target not in _READ_STATE.reading):
            extents = [_extent(a, whole_storage) for a in args]  # Tensor.map_(other, f) reads both
            _count_read(sum(e[0] for e in extents), sum(e[1] for e in extents))
    outer = _READ_STATE.reading
    _READ_STATE.reading = outer + (target,)
    try:
        return fn(*args, **kwargs)
    finally:
        _READ_STATE.reading = outer


def _watched_create(fn: Any, what: str, args: tuple, kwargs: dict) -> Any:
    source = args[0] if args else next(iter(kwargs.values()), None)
    if in_launch() or isinstance(source, (torch.Tensor, list, tuple, int, float, bool, complex)) or source is None:
        return fn(*args, **kwargs)
    if _READS["refuse"]:
        raise host_read_refused(what, _READS["why"])
    out = fn(*args, **kwargs)
    _note_aliased(out)  # a tensor over numpy's or a buffer's memory: remembered, in a call or not (not in a launch)
    if _READS["counters"]:
        _count_read(*_extent(out, whole_storage=True))
    return out


def _watched_values(fn: Any, what: str, args: tuple, kwargs: dict, position: int, names: tuple[str, ...]) -> Any:
    value = args[position] if len(args) > position else next((kwargs[n] for n in names if n in kwargs), None)
    if isinstance(value, torch.Tensor) and not in_launch():
        if _READS["refuse"]:
            raise host_read_refused(what, _READS["why"])
        if _READS["counters"]:
            _count_read(*_extent(value, whole_storage=False))
    return fn(*args, **kwargs)


def _watching(current: Any, original: Any, what: str, dotted: str) -> Any:
    """The wrapper that watches the route `dotted`. Its settings are bound in a closure, never as keyword
    defaults: a call can pass any keyword, and ``t.numpy(_whole=False)`` would have counted one element of
    a view for its whole storage."""
    whole, aliasing, calls_back = dotted in _EXPOSING, dotted in _ALIASING, dotted in _CALLING_BACK
    if isinstance(original, property):
        prop = original

        def getter(self):
            return _watched_read(prop.__get__, what, (self, type(self)), {}, whole)

        return property(getter)
    if dotted in _CREATING:
        def creating(*args, **kwargs):
            return _watched_create(current, what, args, kwargs)

        return functools.wraps(current)(creating)
    if dotted in _VALUE_ARGUMENTS:
        position, names = _VALUE_ARGUMENTS[dotted]

        def splitting(*args, **kwargs):
            return _watched_values(current, what, args, kwargs, position, names)

        return functools.wraps(current)(splitting)

    def reading(*args, **kwargs):
        return _watched_read(current, what, args, kwargs, whole, aliasing, calls_back)

    return functools.wraps(current)(reading)


def install_host_read_watch() -> None:
    """Replace each route in `HOST_READS` by a wrapper that refuses or counts during guarded calls and
    otherwise passes through; once per process, before any student module is imported."""
    with _READS_LOCK:
        if _READS["installed"]:
            return
        for dotted, what in HOST_READS.items():
            try:
                owner, attr = _resolve(dotted)
            except (ValueError, AttributeError):
                continue
            if not hasattr(owner, attr):
                continue
            original = vars(owner).get(attr, _INHERITED) if isinstance(owner, type) else getattr(owner, attr)
            current = getattr(owner, attr) if not isinstance(original, property) else original
            replacement = _watching(current, original, what, dotted)
            # functools.wraps keeps the original as __wrapped__: a submission that reads the wrapper's namespace
            # would find the unwatched method there.
            if not isinstance(replacement, property):
                del replacement.__wrapped__
            _install(owner, attr, replacement)
        _READS["installed"] = True


class ReadCounter:
    """Tensor elements, and their bytes, read back into Python or numpy (`HOST_READS`) while `reads_counted`
    is active."""

    reads = 0
    read_bytes = 0


# Storages whose memory Python can read or write without torch: made from numpy or a buffer (from_numpy, frombuffer,
# as_tensor, asarray, from_dlpack), or handed to numpy or a buffer (.numpy(), __array__, DLPack, a storage's own
# routes, share_memory_, data_ptr). Outside a graded call those routes pass through, so a module could set such a
# tensor up at import and, during the call, copy values into it or out of it (an allowed host copy) and read them in
# numpy: the red team's flash_attention scored 76/76 from host numpy that way. Every operator that touches one of
# these storages during a watched call counts as a read of it (refused under the kernel rule). Each entry keeps its
# memory alive, so that no later tensor of the grader's or the student's can come to share the address.
_ALIASED: dict[int, Any] = {}
_ALIASED_LIMIT = 4096
_ALIASED_BYTES = {"kept": 0, "limit": 1 << 30}  # what the registry keeps alive; past the limit a route is refused
# "armed": in the process that runs the student's code (the worker, or a local grade), before the student's import;
# never in the grader's own process. "off" > 0 while the harness itself encodes a reply (torch.save reads storages).
_NOTING = {"off": 0, "armed": False}


def arm_aliasing() -> None:
    """From now on, remember memory shared with numpy (`_ALIASED`): called where the student's code will run."""
    _NOTING["armed"] = True


@contextlib.contextmanager
def harness_io() -> Iterator[None]:
    """The worker's own reading of tensors (encoding a reply): not memory the student's code handed over."""
    _NOTING["off"] += 1
    try:
        yield
    finally:
        _NOTING["off"] -= 1


def _note_aliased(value: Any) -> None:
    """Remember `value`'s storage (a tensor's, or a storage's own) as memory Python reads without torch."""
    if _NOTING["off"] or not _NOTING["armed"]:
        return
    try:
        if isinstance(value, torch.Tensor):
            storage = _TENSOR_STORAGE(value)
        elif isinstance(value, torch.UntypedStorage):
            storage = value
        elif isinstance(value, torch.TypedStorage):
            storage = value._untyped_storage
        else:
            return
        key, size = int(_STORAGE_DATA_PTR(storage)), int(_STORAGE_NBYTES(storage))
    except RuntimeError:
        return
    keep = value  # the object that keeps the memory alive
    if not key or key in _ALIASED:
        return
    if len(_ALIASED) >= _ALIASED_LIMIT or _ALIASED_BYTES["kept"] + size > _ALIASED_BYTES["limit"]:
        raise ForbiddenCall(f"your code has handed more than {_ALIASED_LIMIT} tensors or 1 GiB of tensor memory to "
                            "numpy or a buffer; the grader keeps each such memory watched for the worker's life. "
                            "Work on tensors with torch operators instead")
    _ALIASED[key] = keep
    _ALIASED_BYTES["kept"] += size


def _aliased_elements(values: Iterable[Any]) -> tuple[int, int]:
    """(elements, bytes) of the tensors among `values` (one level of lists) whose storage is in `_ALIASED`, each
    storage once."""
    seen: dict[int, tuple[int, int]] = {}
    for value in values:
        for t in (value if isinstance(value, (list, tuple)) else (value,)):
            if isinstance(t, torch.Tensor):
                try:
                    key = storage_of(t)
                    if key in _ALIASED:
                        n = max(int(torch._C.TensorBase.numel(t)), 1)
                        size = max(int(torch._C.TensorBase.element_size(t)), 1)
                        old = seen.get(key, (0, 0))
                        seen[key] = (max(old[0], n), max(old[1], n * size))
                except RuntimeError:
                    pass
    return sum(v[0] for v in seen.values()), sum(v[1] for v in seen.values())


class _AliasedWatch(TorchDispatchMode):
    """During a watched call: an operator that reads or writes memory in `_ALIASED` is a host read."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not in_launch():
            _aliased_read(_aliased_elements((*args, *(kwargs or {}).values(), out)),
                          lambda: f"{operator_name(func)} on a tensor that shares its memory with numpy or a buffer "
                                  "(made before the call), which Python reads without torch")
        return out


def _aliased_read(extent: tuple[int, int], what: Any) -> None:
    """(elements, bytes) of memory shared with numpy were touched: refused under the kernel rule, else counted
    as read (`what()` names the route, built only when it is refused)."""
    if not extent[0]:
        return
    if _READS["refuse"]:
        raise host_read_refused(what(), _READS["why"])
    _count_read(*extent)


@contextlib.contextmanager
def _watching_aliased() -> Iterator[None]:
    """Push `_AliasedWatch` for the block, if any aliased memory exists (honest code makes none: no cost)."""
    if not _ALIASED:
        yield
        return
    mode = _AliasedWatch()
    _enter_mode(mode, "the watch on memory shared with numpy")
    try:
        yield
    finally:
        _leave_mode(mode, "the watch on memory shared with numpy")


@contextlib.contextmanager
def reads_counted(counter: Any = None) -> Iterator[Any]:
    """Count, into `counter` (a new ReadCounter by default), every tensor element the block reads back
    through the routes of `HOST_READS` (`.numpy()`, `.tolist()`, `__array__`, storages, printing ...),
    outside kernel launches."""
    counter = ReadCounter() if counter is None else counter
    install_host_read_watch()
    with _READS_LOCK:
        _READS["counters"].append(counter)
    try:
        with _watching_aliased():
            yield counter
    finally:
        with _READS_LOCK:
            if counter in _READS["counters"]:
                _READS["counters"].remove(counter)


@contextlib.contextmanager
def host_reads_refused(why: str = "") -> Iterator[None]:
    """The routes in `HOST_READS` raise `ForbiddenCall` outside kernel launches while the block runs."""
    install_host_read_watch()
    with _READS_LOCK:
        _READS["refuse"] += 1
        previous, _READS["why"] = _READS["why"], why
    try:
        with _watching_aliased():
            yield
    finally:
        with _READS_LOCK:
            _READS["refuse"] -= 1
            _READS["why"] = previous
