"""Drivers for online_softmax's `streaming` check: what a call holds in memory while it streams.

The technique's signature is the state held while streaming. `online_normalizer` keeps a running
(m, l) of two row vectors, never the stream; `online_softmax` reads x in column blocks, so what it
holds besides x and its output is a block's worth. The textbook computation of the same numbers
(collect every chunk, then one max and one sum; exp(x - m) over whole rows) holds the whole row.
On the CPU's small shapes both give the same numbers, so these drivers measure the holding itself:

* `stream_census(online_normalizer, x, cuts)` hands the student's function a one-pass stream of
  chunks, each a fresh copy of `x[:, a:b]` with its own storage, made on demand. A weak-reference
  finaliser on each chunk's storage tells when it is freed, so when chunk k is requested the driver
  knows how many earlier chunks are still alive (a list of them, a view kept, a numpy array over
  one: any reference keeps the storage). A `TorchDispatchMode` (`_Held`) notes the storage of every
  tensor an operation writes during the call (fresh outputs, in-place and out= targets) with a
  finaliser too, so the bytes alive at once are known after every operation: a `chunk.clone()` kept,
  a `torch.cat` that grows, a list of per-chunk states. The driver also counts the tensor elements
  read back into Python or numpy (`grader.harness.host_reads.reads_counted`: `.tolist()`, `.numpy()`,
  ...) and the scalars operations hand to Python (`.item()`, `bool(t)`), since a stream kept as
  Python floats holds no tensor at all.
* `block_census(online_softmax, x, block_size)` runs the same bookkeeping around online_softmax
  (x's own storage is the input and never counts; the returned output's storage is subtracted from
  the moment it was made), records the largest number of x's elements one operation read (a block
  read is rows x block_size; `x - m` over whole rows is all of x), and records the calls online_softmax
  made to the module's `online_normalizer` and the widths of the blocks it handed over. It also records the
  widest operation: the most elements of any one tensor one operation reads, x's, the returned output's or
  one the call made (an in-place operation reads its target; a store or fill into it, `_OVERWRITES`, and an
  out= target do not; an indexing operation reads as many elements as it picks). A softmax of whole rows done
  in place on the output holds no memory beyond the output and reads no more of x than a blockwise copy, so
  only this figure sees it. With `scale_l`, each call of online_normalizer returns (m, scale_l * l) (the
  driver's multiplication is neither held nor read): an output written from that state is divided by
  scale_l, and one that discards the normaliser's result is not.

What none of this sees: memory that no torch operation writes and no read-back route reads (a Triton
kernel of the student's own that copies the stream into a buffer allocated before the call; on the
CPU the interpreter's copies pass through torch, on CUDA they do not), work that no torch operation does
(the same kernel taking a softmax of whole rows), the columns an operation spans (the widest operation
counts elements: a few rows of many blocks each, within the bound, pass), and anything the student's
process does to the driver itself (popping the dispatch mode, patching this module): the dispatch
mode is checked to be where it was put at the end of the call, and the test calls
`student.assert_untampered`, whose trusted scan flags the dispatch-mode machinery, frames,
finalisers and patching in place.
"""

from __future__ import annotations

import math
import weakref
from typing import Any, Callable, Iterator, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from grader.harness import host_reads, integrity, opfamilies

_TENSOR_STORAGE = torch._C.TensorBase.untyped_storage  # never patched (Tensor.untyped_storage counts as a read-back)
_SCALAR_READS = frozenset({"aten::_local_scalar_dense", "aten::equal", "aten::is_nonzero", "aten::is_same_size"})
# Operations that make views or metadata, or allocate without touching values: they read no element of x.
_NO_DATA = frozenset({
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::detach", "aten::alias", "aten::lift_fresh",
    "aten::_unsafe_view", "aten::view", "aten::_reshape_alias", "aten::set_", "aten::resize_", "aten::is_nonzero",
    "aten::is_same_size", "aten::sym_size", "aten::sym_stride", "aten::sym_numel", "aten::sym_storage_offset",
    # made like a tensor: its shape and dtype are read, never its values
    "aten::zeros_like", "aten::ones_like", "aten::full_like", "aten::rand_like", "aten::randn_like",
    "aten::new_empty", "aten::new_empty_strided", "aten::new_zeros", "aten::new_ones", "aten::new_full",
})
# In-place operations that overwrite their target without reading its values (a store, a fill): the target is
# written, not read. Every other in-place operation (sub_, exp_, div_, ...) reads its target as well.
_OVERWRITES = frozenset({
    "aten::copy_", "aten::fill_", "aten::zero_", "aten::index_put_", "aten::_index_put_impl_", "aten::masked_fill_",
    "aten::index_fill_", "aten::index_copy_", "aten::scatter_", "aten::masked_scatter_",
})
# Operations that read only the elements they pick from their first argument (as many as they return).
_PICKS = frozenset({"aten::index", "aten::_unsafe_index", "aten::index_select", "aten::gather", "aten::take"})


def _storage(t: torch.Tensor) -> Any:
    """The tensor's storage object (one Python object per storage while it lives), or None (sparse, meta)."""
    if t.device.type == "meta":
        return None
    try:
        return _TENSOR_STORAGE(t)
    except (RuntimeError, NotImplementedError):
        return None


def _elements(t: torch.Tensor) -> int:
    """The elements of memory a tensor covers: its numel without the dimensions of stride 0."""
    if t.numel() == 0:
        return 0
    try:
        return math.prod(size for size, stride in zip(t.shape, t.stride()) if stride != 0)
    except (RuntimeError, NotImplementedError):
        return t.numel()


_WRITES: dict[Any, tuple[int, ...]] = {}
_ONLY_WRITTEN: dict[Any, frozenset[str]] = {}


def _written_arguments(func) -> tuple[int, ...]:
    """Positions of the arguments an operation writes (in-place and out= targets)."""
    if func not in _WRITES:
        _WRITES[func] = tuple(i for i, a in enumerate(func._schema.arguments)
                              if a.alias_info is not None and a.alias_info.is_write)
    return _WRITES[func]


def _only_written(func, name: str) -> frozenset[str]:
    """Names of the arguments an operation writes without reading their values: out= targets, and the target
    of an in-place store or fill (`_OVERWRITES`)."""
    if func not in _ONLY_WRITTEN:
        _ONLY_WRITTEN[func] = frozenset(
            a.name for i, a in enumerate(func._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write and (a.is_out or (i == 0 and name in _OVERWRITES))
        )
    return _ONLY_WRITTEN[func]


def _read_arguments(func, name: str, args: tuple, kwargs: dict, out: Any) -> Iterator[tuple[torch.Tensor, int]]:
    """(tensor, elements of it read) for every tensor an operation reads: its tensor arguments, less those it only
    writes; an operation that picks elements (`_PICKS`) reads as many of its first argument as it returns."""
    skip = _only_written(func, name)
    returned = sum(_elements(t) for t in tree_leaves(out) if isinstance(t, torch.Tensor))
    for i, a in enumerate(func._schema.arguments):
        if a.name in skip:
            continue
        value = args[i] if i < len(args) else kwargs.get(a.name)
        for t in tree_leaves(value):
            if isinstance(t, torch.Tensor):
                yield t, (min(_elements(t), returned) if i == 0 and name in _PICKS else _elements(t))


class _Held(TorchDispatchMode):
    """The bytes of memory alive at once among the storages the call wrote, and the chunks it was handed.

    `series` holds the total after every operation and before every chunk is handed out; `born` the
    position in `series` at which each storage was first noted. Storages in `excluded` (the input x,
    the driver's own) never count.
    """

    def __init__(self, excluded: Sequence[Any] = (), watched: Any = None):
        super().__init__()
        self.excluded = {id(s) for s in excluded if s is not None}
        self._keep = list(excluded)  # their ids must not be reused while the census runs
        self.watched = id(watched) if watched is not None else None  # x's storage: how much one op reads of it
        self.sizes: dict[int, int] = {}  # id(storage) -> bytes, while alive
        self.born: dict[int, int] = {}
        self.total = 0
        self.series: list[int] = []
        self.scalar_reads = 0
        self.widest_read = 0  # the most elements of the watched storage one operation read
        self.read_total = 0  # elements of the watched storage read, summed over operations
        self.widest_any = 0  # the most elements of any one tensor one operation read (when `widest` is set)
        self.widest_op: tuple[str, tuple[int, ...], Any] | None = None  # (operator, shape, weakref to its storage)
        self.widest = False
        self.paused = 0

    def note(self, storage: Any) -> None:
        if storage is None:
            return
        key = id(storage)
        if key in self.excluded:
            return
        size = int(storage.nbytes())
        if key not in self.sizes:
            self.sizes[key] = size
            self.born[key] = len(self.series)
            self.total += size
            weakref.finalize(storage, self._freed, key)
        elif size != self.sizes[key]:  # resized in place
            self.total += size - self.sizes[key]
            self.sizes[key] = size

    def _freed(self, key: int) -> None:
        self.total -= self.sizes.pop(key, 0)
        self.born.pop(key, None)

    def mark(self) -> None:
        self.series.append(self.total)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = opfamilies.operator_name(func)
        if name in _SCALAR_READS:
            self.scalar_reads += 1
        if self.watched is not None and name not in _NO_DATA and not getattr(func, "is_view", False):
            for t in tree_leaves((args, kwargs)):
                if isinstance(t, torch.Tensor) and id(_storage(t)) == self.watched:
                    self.widest_read = max(self.widest_read, _elements(t))
                    self.read_total += _elements(t)
        out = func(*args, **kwargs)
        if self.widest and not self.paused and name not in _NO_DATA and not getattr(func, "is_view", False):
            for t, elements in _read_arguments(func, name, args, kwargs, out):
                if elements > self.widest_any:
                    self.widest_any = elements
                    storage = _storage(t)
                    self.widest_op = (name, tuple(t.shape), weakref.ref(storage) if storage is not None else None)
        if not self.paused:
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.note(_storage(t))
            for i in _written_arguments(func):
                for t in tree_leaves(args[i] if i < len(args) else None):
                    if isinstance(t, torch.Tensor):
                        self.note(_storage(t))
            self.mark()
        return out

    def peak(self, returned: Sequence[torch.Tensor] = ()) -> int:
        """The most bytes alive at once, the storages of `returned` left out from the moment each was noted."""
        minus = [0] * (len(self.series) + 1)
        for t in returned:
            storage = _storage(t)
            key = id(storage) if storage is not None else None
            if key in self.born:
                start = self.born[key]
                for i in range(start, len(self.series)):
                    minus[i] += self.sizes[key]
        return max((v - minus[i] for i, v in enumerate(self.series)), default=0)


class _Stream:
    """A one-pass stream of fresh chunks of x, made on demand; iterating it a second time is an error."""

    def __init__(self, x: torch.Tensor, cuts: Sequence[int], held: _Held):
        self._x, self._cuts, self._held = x, list(cuts), held
        self._next = 0
        self._iterated = False
        self.alive = 0  # chunks handed out whose storage still lives
        self.alive_at_request: list[int] = []  # earlier chunks alive when each chunk was requested
        self.handed = 0

    def __iter__(self) -> "_Stream":
        if self._iterated:
            raise RuntimeError("the chunks stream can be iterated only once (online_normalizer makes one pass)")
        self._iterated = True
        return self

    def __next__(self) -> torch.Tensor:
        if self._next + 1 >= len(self._cuts):
            raise StopIteration
        self.alive_at_request.append(self.alive)
        self._held.mark()  # what the call holds when it asks for more
        a, b = self._cuts[self._next], self._cuts[self._next + 1]
        self._next += 1
        self._held.paused += 1
        try:
            chunk = self._x[:, a:b].clone()
        finally:
            self._held.paused -= 1
        storage = _storage(chunk)
        self._held.note(storage)
        self.alive += 1
        weakref.finalize(storage, self._freed)
        self.handed += 1
        return chunk

    def _freed(self) -> None:
        self.alive -= 1


def _census(held: _Held, call: Callable[[], Any]) -> tuple[Any, int]:
    """``call()`` under `held` and the read-back counter: (its result, elements read back into Python)."""
    with host_reads.reads_counted() as host:
        integrity._enter_mode(held, "the streaming census")
        try:
            out = call()
        finally:
            integrity._leave_mode(held, "the streaming census")
    return out, int(host.reads)


def stream_census(online_normalizer: Callable, x: torch.Tensor, cuts: Sequence[int]) -> dict:
    """``online_normalizer`` over a one-pass stream of fresh copies of ``x[:, a:b]`` for the cuts.

    Returns {"out": its result, "chunks": how many the stream holds, "handed": how many it handed out,
    "alive_at_request": [earlier chunks alive when each was requested], "peak_bytes": the most bytes
    alive at once (chunks handed out and storages the call wrote), "reads": tensor elements read back
    into Python or numpy, "scalar_reads": scalars operations handed to Python}.
    """
    held = _Held(excluded=[_storage(x)])
    stream = _Stream(x, cuts, held)
    out, reads = _census(held, lambda: online_normalizer(stream))
    return {
        "out": tuple(out) if isinstance(out, (tuple, list)) else out,
        "chunks": len(cuts) - 1,
        "handed": stream.handed,
        "alive_at_request": list(stream.alive_at_request),
        "peak_bytes": held.peak(),
        "reads": reads,
        "scalar_reads": held.scalar_reads,
    }


class _Recorded:
    """The iterable online_softmax handed online_normalizer, passed through with each chunk's shape noted."""

    def __init__(self, chunks: Any, log: list):
        self._it, self._log = iter(chunks), log

    def __iter__(self) -> Iterator[torch.Tensor]:
        return self

    def __next__(self) -> Any:
        chunk = next(self._it)
        self._log.append(list(chunk.shape) if isinstance(chunk, torch.Tensor) else None)
        return chunk


def block_census(online_softmax: Callable, x: torch.Tensor, block_size: int, scale_l: float = 1.0) -> dict:
    """``online_softmax(x, block_size=block_size)`` with what it holds and reads recorded.

    With ``scale_l`` other than 1, each call of the module's online_normalizer returns ``(m, scale_l * l)`` in place
    of its ``(m, l)``: a submission whose output is built from that state comes out divided by ``scale_l``, and
    one that computes (m, l) some other way and discards the normaliser's result does not.

    Returns {"out": its result, "peak_bytes": the most bytes alive at once among the storages it wrote,
    the returned output's left out, "widest_read": the most elements of x one operation read,
    "read_total": elements of x read summed over operations, "widest_any": the most elements of any one tensor
    (x, the output, its own) one operation read, "widest_op": {"op", "shape", "whose"} of that operation or None,
    "normalizer_calls": [[shape of each chunk] for each call of the module's online_normalizer],
    "scaled": how many of those calls returned a state that was scaled, "reads", "scalar_reads"}.
    """
    found = getattr(online_softmax, "__globals__", None)  # where the name online_normalizer is looked up
    namespace: dict | None = found if isinstance(found, dict) and callable(found.get("online_normalizer")) else None
    calls: list[list] = []
    scaled = [0]
    held = _Held(excluded=[_storage(x)], watched=_storage(x))
    held.widest = True
    if namespace is not None:
        original = namespace["online_normalizer"]

        def recorded(chunks: Any, *args: Any, **kwargs: Any) -> Any:
            log: list = []
            calls.append(log)
            state = original(_Recorded(chunks, log), *args, **kwargs)
            if scale_l == 1.0 or not (isinstance(state, (tuple, list)) and len(state) == 2
                                      and all(isinstance(t, torch.Tensor) for t in state)):
                return state
            held.paused += 1  # the driver's own operation: neither held nor read by the submission
            try:
                m, l = state
                state = [m, l * scale_l] if isinstance(state, list) else (m, l * scale_l)
            finally:
                held.paused -= 1
            scaled[0] += 1
            return state

        namespace["online_normalizer"] = recorded
    try:
        out, reads = _census(held, lambda: online_softmax(x, block_size=block_size))
    finally:
        if namespace is not None:
            namespace["online_normalizer"] = original
    returned = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    widest_op = None
    if held.widest_op is not None:
        op, shape, ref = held.widest_op
        storage = ref() if ref is not None else None
        whose = "a tensor of online_softmax's own"
        if storage is not None and storage is _storage(x):
            whose = "x"
        elif storage is not None and any(storage is _storage(t) for t in returned):
            whose = "the output online_softmax returned"
        widest_op = {"op": op, "shape": list(shape), "whose": whose}
    return {
        "out": out,
        "peak_bytes": held.peak(returned),
        "widest_read": held.widest_read,
        "read_total": held.read_total,
        "widest_any": held.widest_any,
        "widest_op": widest_op,
        "normalizer_calls": calls if namespace is not None else None,
        "scaled": scaled[0],
        "reads": reads,
        "scalar_reads": held.scalar_reads,
    }
