"""Drivers for the gptq exercise, run where the student's code runs (the worker, or in-process).

`count_big_writes` proves the lazy batch structurally, where timing cannot: it runs the student's
`gptq_quantize` under a `TorchDispatchMode` that sees every aten operation, and counts those that
write more than a fraction of W's elements. GPTQ without the lazy batch rewrites most of W after
each of the first half of the columns (hundreds of such writes); with it, only the few block
updates that reach far enough do (a handful), whatever the number of columns per block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from grader.support.timing import Randn

# Operations that create, reinterpret or inspect memory without writing values into it.
_NO_WRITE = {
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::detach", "aten::alias",
    "aten::lift_fresh", "aten::_unsafe_view", "aten::view", "aten::_reshape_alias",
    "aten::set_", "aten::resize_", "aten::is_nonzero", "aten::_local_scalar_dense",
}


class BigWriteCounter(TorchDispatchMode):
    """Counts aten operations that write more than `limit` elements (outputs, or tensors mutated in place)."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit
        self.count = 0
        self.ops: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        writes = _writes_of(func)
        if writes is None:
            return out
        written = [v for v in (args[i] if i < len(args) else kwargs.get(name) for i, name in writes)
                   if isinstance(v, torch.Tensor)]
        if not written:  # a functional operation writes its fresh outputs
            written = [out] if isinstance(out, torch.Tensor) else [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if any(t.numel() > self.limit for t in written):
            self.count += 1
            name = func.overloadpacket.__name__
            self.ops[name] = self.ops.get(name, 0) + 1
        return out


_WRITES: dict[Any, tuple | None] = {}


def _writes_of(func) -> tuple | None:
    """None for an operation that writes nothing; else the (index, name) of the arguments it writes
    into in place or through out= (empty for a functional operation)."""
    if func not in _WRITES:
        schema = func._schema
        if getattr(func, "is_view", False) or schema.name in _NO_WRITE:
            _WRITES[func] = None
        else:
            _WRITES[func] = tuple(
                (i, a.name) for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write
            )
    return _WRITES[func]


def count_big_writes(fn: Callable, W: torch.Tensor, H: torch.Tensor, fraction: float = 0.5, **kwargs: Any) -> dict:
    """Run ``fn(W, H, **kwargs)`` and count the operations that write more than `fraction` of W's elements.

    Returns {"result": fn's return value, "count": the number of such writes, "ops": count per aten op}.
    """
    counter = BigWriteCounter(int(fraction * W.numel()))
    with counter:
        result = fn(W, H, **kwargs)
    return {"result": tuple(result) if isinstance(result, tuple) else result, "count": counter.count, "ops": dict(counter.ops)}


# --------------------------------------------------------------------------------------------------
# Timing on CUDA: the Hessian is a recipe (grader.support.timing), built where it is used from its
# seed, so the worker and the grader hold the same H without hundreds of megabytes crossing over.


def calibration_hessian(cols: int, device: str = "cuda", seed: int = 0) -> torch.Tensor:
    """H = 2 X^T X / n for 2 * cols calibration rows whose features are mixed (correlated)."""
    g = torch.Generator(device=device).manual_seed(seed)
    mix = torch.randn(cols, cols, device=device, generator=g) / cols**0.5 + torch.eye(cols, device=device)
    X = torch.randn(2 * cols, cols, device=device, generator=g) @ mix
    return 2 * X.T @ X / X.shape[0]


@dataclass(frozen=True)
class Hessian(Randn):
    """The recipe of `calibration_hessian(cols, device, seed)` for a timed loop, with shape (cols, cols):
    made once per loop (not per rep) and shared by the reps, in the worker and again in the grader."""

    seed: int = 0
    fresh: ClassVar[bool] = False

    def make(self, device: str, generator: torch.Generator) -> torch.Tensor:
        cols = self.shape[0]
        if tuple(self.shape) != (cols, cols):
            raise ValueError(f"a Hessian is square, found shape {tuple(self.shape)}")
        return calibration_hessian(cols, device, self.seed)
