"""The timed loop, run where the student's code runs (the worker). Its figures are untrusted: the
grader bounds them with its own wall clock (grader/speed.py).

Inputs are described by recipes (`Randn`), materialised fresh for every rep, so an output cached
from an earlier call cannot pass; the L2 cache is flushed between reps by writing a buffer larger
than it; each rep is timed with CUDA events around the call alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch


@dataclass(frozen=True)
class Randn:
    """A recipe for a fresh random tensor: ``scale * randn(shape) + shift`` in `dtype` on the device."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    scale: float = 1.0
    shift: float = 0.0
    transpose: bool = False  # materialise as the transpose of a contiguous tensor (a strided view)

    def make(self, device: str, generator: torch.Generator) -> torch.Tensor:
        shape = tuple(reversed(self.shape)) if self.transpose else self.shape
        t = torch.randn(shape, generator=generator, device=device, dtype=torch.float32)
        t = (t * self.scale + self.shift).to(self.dtype)
        return t.t() if self.transpose else t


def materialise(specs: Sequence[Any], device: str, generator: torch.Generator) -> list[Any]:
    return [s.make(device, generator) if isinstance(s, Randn) else s for s in specs]


def _flush_buffer(device: str, nbytes: int) -> torch.Tensor | None:
    return torch.empty(nbytes // 4, dtype=torch.int32, device=device) if device == "cuda" else None


def bench(fn: Callable, specs: Sequence[Any], kwargs: dict | None = None, reps: int = 30, warmup: int = 3,
          seed: int = 0, flush_bytes: int = 256 << 20, return_last: bool = True) -> dict:
    """Time ``fn(*materialise(specs))`` over `reps` fresh inputs. Returns per-rep seconds and, with
    `return_last`, the last inputs and output for the grader to re-check."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device=device).manual_seed(seed)
    kwargs = kwargs or {}
    flush = _flush_buffer(device, flush_bytes)
    for _ in range(warmup):
        fn(*materialise(specs, device, generator), **kwargs)
    times, args, out = [], None, None
    for _ in range(reps):
        args = materialise(specs, device, generator)
        if flush is not None:
            flush.zero_()
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn(*args, **kwargs)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            import time

            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            times.append(time.perf_counter() - t0)
    result = {"times_s": times, "device": device}
    if return_last:
        result["args"], result["out"] = args, out
    return result


def identity(*args, **kwargs):  # noqa: D401
    """The do-nothing function the grader times to learn the loop's own overhead."""
    return args[0] if args else None


def bench_overhead(fn: Callable, specs: Sequence[Any], kwargs: dict | None = None, **options) -> dict:
    """The same loop around a function that does nothing: what the loop costs without the student."""
    options["return_last"] = False
    return bench(identity, specs, kwargs, **options)
