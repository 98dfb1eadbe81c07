"""The timed loop of a speed check. It runs where the student's code runs (the worker), and the
grader runs the very same loop in its own process around a function that does nothing, to learn
what the loop itself costs. Nothing the worker reports is trusted: grader/speed.py bounds its times
with the grader's own wall clock and checks one rep's output, chosen after the timing, against
inputs the grader makes itself.

One rep of `timed_loop`:

* Inputs are made fresh from recipes (`Randn`), with a generator seeded from the request's nonce and
  the rep's index (`rep_generator`): the grader can rebuild the inputs of any rep, and an output
  cached from an earlier call is wrong for this one. A recipe with ``fresh = False`` (a calibration
  Hessian) is made once per loop. Each recipe is one kernel (``normal_`` straight into the tensor's
  dtype), because the loop's own work is what the grader subtracts: a wasteful loop would leave a
  student room to do the same work faster and hide the difference.
* The call alone is timed: CUDA events around it, recorded for every rep and read after one
  synchronize at the end, so the GPU never waits for the host between reps; `perf_counter` on the CPU.
* Its output is fingerprinted on the device (`fingerprint`: one norm per tensor). The fingerprints
  travel back with the times: the worker commits to every rep's output before the grader says which
  one it will check, so computing the real output only when asked does not pass.
* L2: the next rep's inputs are made before this rep's call. Between the writing of a rep's inputs
  and its call, the previous call, its fingerprint and the next rep's inputs pass through memory, so
  inputs of tens of megabytes or more (most speed checks) have left the L2 cache, and there is no
  flush buffer that a worker could skip writing: every byte the loop writes is input some rep uses.
  Smaller inputs stay warm, for the student's function and the library baseline (`time_here`) alike.

The outputs stay in the worker, in a `TimedRuns` (up to `keep_bytes`; past that, a rep's output is
made again from its inputs when asked). The grader takes one of them with ``runs.take(rep)``.
"""

from __future__ import annotations

import gc
import hashlib
import time
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Sequence

import numpy as np
import torch

SHARED = -1  # the "rep" whose generator makes the recipes with fresh = False, once per loop
KEEP_BYTES = {"cuda": 512 << 20, "cpu": 256 << 20}  # outputs kept per loop, by device (the rest are made again)


@dataclass(frozen=True)
class Randn:
    """A recipe for a fresh random tensor: ``scale * randn(shape) + shift`` in `dtype` on the device."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    scale: float = 1.0
    shift: float = 0.0
    transpose: bool = False  # materialise as the transpose of a contiguous tensor (a strided view)
    fresh: ClassVar[bool] = True  # made anew for every rep (False: once per loop, shared by the reps)

    def make(self, device: str, generator: torch.Generator) -> torch.Tensor:
        shape = tuple(reversed(self.shape)) if self.transpose else self.shape
        t = torch.empty(shape, dtype=self.dtype, device=device).normal_(self.shift, self.scale, generator=generator)
        return t.t() if self.transpose else t


def rep_seed(nonce: int, rep: int) -> int:
    """The seed of rep `rep`'s inputs in a loop whose request carried `nonce`."""
    digest = hashlib.blake2b(f"{nonce}:{rep}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def rep_generator(device: str, nonce: int, rep: int, generator: torch.Generator | None = None) -> torch.Generator:
    """A generator on `device` in the state that makes rep `rep`'s inputs (reseeds `generator` if given)."""
    generator = generator if generator is not None else torch.Generator(device=device)
    return generator.manual_seed(rep_seed(nonce, rep))


def make_shared(specs: Sequence[Any], device: str, nonce: int) -> dict[int, Any]:
    """The recipes with ``fresh = False``, made once for a loop: {position in specs: value}."""
    generator = rep_generator(device, nonce, SHARED)
    return {i: s.make(device, generator) for i, s in enumerate(specs) if isinstance(s, Randn) and not s.fresh}


def materialise(specs: Sequence[Any], device: str, generator: torch.Generator,
                shared: dict[int, Any] | None = None) -> list[Any]:
    """The arguments of one rep: each recipe made with `generator` (in order), others as given."""
    shared = shared or {}
    return [shared[i] if i in shared else s.make(device, generator) if isinstance(s, Randn) else s
            for i, s in enumerate(specs)]


def rep_inputs(specs: Sequence[Any], device: str, nonce: int, rep: int, shared: dict[int, Any] | None = None,
               generator: torch.Generator | None = None) -> list[Any]:
    """The inputs of rep `rep` (the grader calls this to rebuild the inputs of the rep it checks)."""
    if shared is None:
        shared = make_shared(specs, device, nonce)
    return materialise(specs, device, rep_generator(device, nonce, rep, generator), shared)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


# --------------------------------------------------------------------------------------------------
# Fingerprints: the worker's commitment to each rep's output


_PLAIN_ATOMS = (bool, int, float, str, bytes, type(None))


def _leaves(value: Any):
    """The data in an output, in order: tensors (numpy arrays as tensors), numbers, strings."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, np.ndarray):
        yield torch.from_numpy(np.ascontiguousarray(value))
    elif isinstance(value, np.generic):
        yield value.item()
    elif isinstance(value, (bool, int, float, str, bytes)):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _leaves(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    # None and anything else carry nothing (the grader refuses anything else: `foreign_part`)


def foreign_part(value: Any, where: str = "the output") -> str | None:
    """Where `value` holds something other than plain data (tensors, numpy arrays, numbers, strings,
    None, and lists, tuples and dicts of them): a fingerprint cannot cover such a thing, and an object
    that computes its value only when it is read would pass any check made after the timing."""
    if isinstance(value, torch.Tensor):
        if type(value) is not torch.Tensor and not isinstance(value, torch.nn.Parameter):
            return f"{where} (a {type(value).__name__}, a subclass of torch.Tensor)"
        return None
    if isinstance(value, (np.ndarray, np.generic)):
        return None if value.dtype.kind in "biuf" else f"{where} (a numpy {value.dtype} value)"
    if isinstance(value, _PLAIN_ATOMS):
        return None
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found = foreign_part(v, f"{where}[{i}]")
            if found:
                return found
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            found = foreign_part(v, f"{where}[{k!r}]")
            if found:
                return found
        return None
    return f"{where} (a {type(value).__name__})"


def _norm(t: torch.Tensor, stride: int) -> torch.Tensor:
    t = t.detach()
    if stride > 1 and t.dim() >= 1:
        t = t[..., ::stride]
    if t.is_complex():
        t = t.abs()
    if not t.is_floating_point():
        t = t.to(torch.float32)
    if t.dtype == torch.float64:
        return torch.linalg.vector_norm(t).to(torch.float32)
    return torch.linalg.vector_norm(t, dtype=torch.float32)  # one pass, whatever the tensor's dtype


def fingerprint(value: Any, stride: int = 1) -> tuple[torch.Tensor | None, list[float]]:
    """(the 2-norms of the tensors in `value`, stacked on their device; its plain numbers).

    `stride` > 1 reads every `stride`-th element of each row (the last dim) instead of all of them:
    for an output whose every element needs its whole row of input (a softmax), it still covers every
    row, and it costs far less than the output did to write.
    """
    norms, numbers = [], []
    for leaf in _leaves(value):
        if isinstance(leaf, torch.Tensor):
            norms.append(_norm(leaf, stride))
        elif isinstance(leaf, (str, bytes)):
            data = leaf.encode() if isinstance(leaf, str) else leaf
            numbers.append(float(int.from_bytes(hashlib.blake2b(data, digest_size=6).digest(), "big")))
        else:
            numbers.append(float(leaf))
    devices = {n.device for n in norms}
    if len(devices) > 1:
        norms = [n.cpu() for n in norms]
    return (torch.stack(norms) if norms else None), numbers


def fingerprint_values(fp: tuple[torch.Tensor | None, list[float]]) -> list[float]:
    norms, numbers = fp
    return ([float(v) for v in norms.tolist()] if norms is not None else []) + list(numbers)


def _all_fingerprint_values(fps: list[tuple[torch.Tensor | None, list[float]]]) -> list[list[float]]:
    norms = [n for n, _ in fps]
    present = [n for n in norms if n is not None]
    if norms and len(present) == len(norms) and len({(n.shape, n.device) for n in present}) == 1:
        table = torch.stack(present).tolist()  # one copy to the host for the whole loop
        return [[float(v) for v in row] + list(nums) for row, (_, nums) in zip(table, fps)]
    return [fingerprint_values(fp) for fp in fps]


def _nbytes(value: Any) -> int:
    return sum(leaf.numel() * leaf.element_size() for leaf in _leaves(value) if isinstance(leaf, torch.Tensor))


# --------------------------------------------------------------------------------------------------
# The loop


class TimedRuns:
    """The outputs of one timed loop, kept where they were made, for the grader to take one of."""

    def __init__(self, fn: Callable, specs: Sequence[Any], kwargs: dict, device: str, nonce: int,
                 shared: dict[int, Any], keep_bytes: int):
        self.fn, self.specs, self.kwargs, self.device, self.nonce = fn, list(specs), kwargs, device, nonce
        self.shared, self.keep_bytes = shared, keep_bytes
        self.kept: dict[int, Any] = {}
        self.kept_bytes = 0

    def keep(self, rep: int, out: Any) -> None:
        size = _nbytes(out)
        if self.kept_bytes + size <= self.keep_bytes:
            self.kept[rep] = out
            self.kept_bytes += size

    def take(self, rep: int) -> Any:
        """The output of rep `rep` (made again from the rep's inputs if it was not kept); forgets the rest."""
        rep = int(rep)
        kept, self.kept, self.kept_bytes = self.kept, {}, 0
        shared, self.shared = self.shared, {}
        if rep in kept:
            return kept[rep]
        return self.fn(*rep_inputs(self.specs, self.device, self.nonce, rep, shared), **self.kwargs)


def warm_up(fn: Callable, specs: Sequence[Any], kwargs: dict | None = None, calls: int = 3, nonce: int = 0,
            reserve_bytes: int = 0) -> None:
    """`calls` reps of the timed loop on inputs of their own (compile kernels, fill caches, load every
    operation the loop uses); nothing is kept. On CUDA, `reserve_bytes` of device memory are then taken
    and given back to torch's caching allocator, so that keeping outputs during the timed loop never
    waits for cudaMalloc inside a timed call."""
    if calls > 0:
        timed_loop(fn, specs, kwargs, calls, nonce, keep_bytes=0)
    if reserve_bytes > 0 and default_device() == "cuda":
        reserve = torch.empty(reserve_bytes, dtype=torch.uint8, device="cuda")
        del reserve
        torch.cuda.synchronize()


def timed_loop(fn: Callable, specs: Sequence[Any], kwargs: dict | None = None, reps: int = 30, nonce: int = 0,
               keep_bytes: int | None = None, stride: int = 1) -> dict:
    """Time ``fn(*inputs of rep i)`` for i in range(reps). Returns {"times_s": per-rep seconds [reps],
    "fingerprints": per-rep floats [reps, n] (float64 tensors), "device": ..., "runs": the TimedRuns}."""
    device = default_device()
    kwargs = kwargs or {}
    keep_bytes = KEEP_BYTES[device] if keep_bytes is None else keep_bytes
    shared = make_shared(specs, device, nonce)
    runs = TimedRuns(fn, specs, kwargs, device, nonce, shared, keep_bytes)
    generator = torch.Generator(device=device)
    cuda = device == "cuda"
    times, fps = [], []
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)] if cuda else []
    upcoming = rep_inputs(specs, device, nonce, 0, shared, generator) if reps > 0 else None
    collecting = gc.isenabled()
    gc.disable()  # no collection pauses among the reps, here or in the grader's copy of the loop
    try:
        for rep in range(reps):
            args = upcoming
            assert args is not None  # made for every rep < reps
            upcoming = rep_inputs(specs, device, nonce, rep + 1, shared, generator) if rep + 1 < reps else None
            if cuda:
                start, end = events[rep]
                start.record()
                out = fn(*args, **kwargs)
                end.record()
            else:
                t0 = time.perf_counter()
                out = fn(*args, **kwargs)
                times.append(time.perf_counter() - t0)
            fps.append(fingerprint(out, stride))
            runs.keep(rep, out)
            del args, out
    finally:
        if collecting:
            gc.enable()
    if cuda:
        torch.cuda.synchronize()
        times = [start.elapsed_time(end) / 1e3 for start, end in events]
    return _reply(times, _all_fingerprint_values(fps), device, runs)


def _reply(times: list[float], fingerprints: list[list[float]], device: str, runs: TimedRuns | None) -> dict:
    """The loop's figures as float64 tensors (thousands of reps cross the wire in a millisecond, where
    lists of floats would take a large part of a second to decode safely)."""
    widths = {len(f) for f in fingerprints}
    table: Any = (torch.tensor(fingerprints, dtype=torch.float64).reshape(len(fingerprints), widths.pop() if widths else 0)
                  if len(widths) <= 1 else fingerprints)
    return {"times_s": torch.tensor(times, dtype=torch.float64), "fingerprints": table, "device": device, "runs": runs}


def bench(fn: Callable, specs: Sequence[Any], kwargs: dict | None = None, reps: int = 30, warmup: int = 0,
          nonce: int = 0, keep_bytes: int | None = None, stride: int = 1) -> dict:
    """The driver the grader runs in the worker: `warm_up`, then `timed_loop` (reps=0: warm-up only,
    and nothing comes back)."""
    if warmup:
        device = default_device()
        warm_up(fn, specs, kwargs, warmup, nonce, KEEP_BYTES[device] if keep_bytes is None else keep_bytes)
    if reps <= 0:  # the same structure as a timed reply, so that sending one is warmed up too
        return _reply([], [], default_device(), None)
    return timed_loop(fn, specs, kwargs, reps, nonce, keep_bytes, stride)
