"""Course-provided drivers for the flash_attention exercise: they run where the student's code runs.

* `guarded`: call a function while watching every tensor operation it performs (a
  `TorchDispatchMode`). Any operation that produces a tensor with an Nq x Nk (or Nk x Nq) pair of
  adjacent dimensions, or a floating-point tensor of at least two score matrices' worth of elements
  (every head's scores flattened into one [B*H*Nq, B*H*Nk] matmul), or calls any softmax /
  scaled-dot-product-attention kernel, raises `ScoreMatrixMaterialised`. It also counts the operations, so a test can check that the count
  does not grow with the sequence length (the loop over tiles runs inside a kernel, not in Python).
  A Triton kernel's own tiles live in registers (or, under TRITON_INTERPRET=1, in numpy): only the
  buffers the host code allocates go through torch, so a real FlashAttention passes untouched.
* `training_step`: forward and backward through the student's `FlashAttention.apply` (or any
  differentiable function), optionally under the same guard.
* `peak_memory` / `training_step_peak_memory`: the CUDA memory a call allocates beyond what was
  allocated before it.
* `saved_for_backward`: forward and backward through the student's `FlashAttention.apply`, with the memory
  held between the two passes measured two ways, and the memory the backward pass adds (see its docstring).

Use the guard with Nq and Nk distinct from each other's neighbours in the shapes (B, H, D), so that no
legitimate tensor has an Nq x Nk pair of dimensions by coincidence, and with B * H * max(Nq, Nk) * D
well under 2 * Nq * Nk, so that q, k, v and their copies (padded to a tile multiple, or expanded
over a GQA group) stay under the size limit.
"""

from __future__ import annotations

import gc
import inspect
import weakref
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from grader.harness import integrity

# Kernels that compute attention or a softmax for you (matched as substrings of aten op names).
_BANNED_OPS = ("softmax", "scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention")


class ScoreMatrixMaterialised(RuntimeError):
    """The call built an Nq x Nk matrix, or called a library attention or softmax kernel."""


class _ScoreGuard(TorchDispatchMode):
    def __init__(self, n_q: int, n_k: int):
        super().__init__()
        self.pairs = {(n_q, n_k), (n_k, n_q)}
        self.n_q, self.n_k = n_q, n_k
        self.max_numel = 2 * n_q * n_k - 1  # a reshaped score matrix of two or more heads is too big
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if any(b in name for b in _BANNED_OPS):
            raise ScoreMatrixMaterialised(
                f"your code called the library kernel aten.{name}: FlashAttention computes the softmax "
                "itself, tile by tile, inside your own kernel"
            )
        self.ops += 1
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and self._is_score_shaped(t.shape):
                raise ScoreMatrixMaterialised(
                    f"your code built a tensor of shape {tuple(t.shape)} (with aten.{name}): that holds an "
                    f"Nq x Nk = {self.n_q} x {self.n_k} score matrix. FlashAttention never writes the scores "
                    "to memory: keep one tile of scores at a time inside the kernel"
                )
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > self.max_numel:
                raise ScoreMatrixMaterialised(
                    f"your code built a tensor of shape {tuple(t.shape)} (with aten.{name}): "
                    f"{t.numel()} elements, as many as {t.numel() / (self.n_q * self.n_k):.1f} Nq x Nk = "
                    f"{self.n_q} x {self.n_k} score matrices (several heads' scores in one matmul?). FlashAttention "
                    "never writes the scores to memory: keep one tile of scores at a time inside the kernel"
                )
        return out

    def _is_score_shaped(self, shape) -> bool:
        return any((shape[i], shape[i + 1]) in self.pairs for i in range(len(shape) - 1))


def guarded(fn: Callable, *args, n_q: int, n_k: int, **kwargs) -> dict:
    """Run ``fn(*args, **kwargs)`` under the score-matrix guard: ``{"out": result, "ops": count}``."""
    with _ScoreGuard(n_q, n_k) as guard:
        out = fn(*args, **kwargs)
    return {"out": out, "ops": guard.ops}


def _autograd_function(fn: Callable) -> Callable:
    """The student's ``FlashAttention.apply``, found in the module that defines `fn`."""
    module = inspect.getmodule(fn)
    cls = getattr(module, "FlashAttention", None)
    if cls is None or not isinstance(cls, type) or not issubclass(cls, torch.autograd.Function):
        raise TypeError("expected a class FlashAttention(torch.autograd.Function) in your module")
    return cls.apply


def training_step(fn: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
                  causal: bool = False, sm_scale: float | None = None, via_function: bool = True,
                  guard: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None,
                                                torch.Tensor | None]:
    """o = attention(q, k, v), then o.backward(do): returns (o, dq, dk, dv).

    With `via_function`, attention is the student's ``FlashAttention.apply(q, k, v, causal, sm_scale)``
    (from the module that defines `fn`); otherwise `fn` itself, called as ``fn(q, k, v, causal, sm_scale)``.
    With `guard`, forward and backward run under the score-matrix guard.
    """
    attention = _autograd_function(fn) if via_function else fn
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))

    def step():
        o = attention(q, k, v, causal, sm_scale)
        if not isinstance(o, torch.Tensor) or not o.requires_grad:
            raise RuntimeError("the attention output does not require grad: return o from FlashAttention.forward")
        o.backward(do.to(o.dtype))
        return o.detach()

    o = guarded(step, n_q=q.shape[2], n_k=k.shape[2])["out"] if guard else step()
    return o, q.grad, k.grad, v.grad


def peak_memory(fn: Callable, *args, **kwargs) -> tuple[Any, int]:
    """``(fn(*args, **kwargs), bytes)``: CUDA memory allocated at the call's peak beyond what was
    allocated when it started. On CPU tensors (the CPU rehearsal, grader/rehearsal.py) torch keeps no
    allocator statistics: the call runs and the figure is 0, which the rehearsal never scores."""
    if not any(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
        return fn(*args, **kwargs), 0
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn(*args, **kwargs)
    torch.cuda.synchronize()
    return out, int(torch.cuda.max_memory_allocated() - before)


def training_step_peak_memory(fn: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
                              causal: bool = False, sm_scale: float | None = None) -> tuple[tuple, int]:
    """`training_step` through ``FlashAttention.apply``, with its peak extra CUDA memory."""
    return peak_memory(training_step, fn, q, k, v, do, causal, sm_scale)


# --------------------------------------------------------------------------------------------------
# What the forward pass leaves for the backward pass


_TENSOR_STORAGE = torch._C.TensorBase.untyped_storage  # the base class's method: never patched


def _storage(t: torch.Tensor) -> Any:
    try:
        return _TENSOR_STORAGE(t)
    except (RuntimeError, NotImplementedError):
        return None


class _Alive(TorchDispatchMode):
    """The bytes alive at once among the storages operations write while it is entered.

    Every storage an operation returns, or writes in place (an out= or in-place target), is noted once with a
    weak-reference finaliser that takes its bytes off when it is freed, however the call holds it (a saved
    tensor, an attribute of autograd's context, a module global, a view kept). `total` is the bytes alive now,
    `peak` the most since `reset_peak`. Storages in `excluded` (the driver's inputs) never count."""

    def __init__(self, excluded=()):
        super().__init__()
        self._keep = [s for s in excluded if s is not None]  # their ids must not be reused while it runs
        self.excluded = {id(s) for s in self._keep}
        self.sizes: dict[int, int] = {}
        self.total = 0
        self.peak = 0

    def note(self, storage: Any) -> None:
        if storage is None or id(storage) in self.excluded:
            return
        key, size = id(storage), int(storage.nbytes())
        if key not in self.sizes:
            self.sizes[key] = size
            self.total += size
            weakref.finalize(storage, self._freed, key)
        elif size != self.sizes[key]:  # resized in place
            self.total += size - self.sizes[key]
            self.sizes[key] = size
        self.peak = max(self.peak, self.total)

    def _freed(self, key: int) -> None:
        self.total -= self.sizes.pop(key, 0)

    def reset_peak(self) -> None:
        self.peak = self.total

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.note(_storage(t))
        schema = getattr(func, "_schema", None)
        for i, a in enumerate(schema.arguments if schema is not None else ()):
            if a.alias_info is not None and a.alias_info.is_write:
                value = args[i] if i < len(args) else kwargs.get(a.name)
                for t in tree_leaves(value):
                    if isinstance(t, torch.Tensor):
                        self.note(_storage(t))
        return out


def saved_for_backward(fn: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
                       causal: bool = False, sm_scale: float | None = None) -> dict:
    """Forward and backward through the student's ``FlashAttention.apply`` (from the module that defines `fn`),
    with what the forward pass leaves for the backward pass measured.

    Returns {"out": (o, dq, dk, dv), "saved_bytes": the bytes of the distinct storages autograd packed for the
    backward pass (saved-tensor hooks: what ``ctx.save_for_backward`` saved, a view counting its whole storage),
    "saved": [[shape, dtype name, bytes of its storage] of each tensor packed], "alive_bytes": the bytes alive,
    once the forward pass has returned (and garbage was collected), among the storages its operations wrote (the
    returned o included, and whatever the call keeps: a saved tensor, a tensor kept on ``ctx`` or in a global),
    "backward_bytes": the most bytes alive at once during the backward pass among the storages its operations
    wrote, beyond those alive when it started}.

    The inputs (the driver's own clones of q, k, v, and dO) never count. What neither figure sees: memory no
    torch operation writes (a buffer allocated before the call, or at import, that a kernel fills)."""
    attention = _autograd_function(fn)
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    do = do.detach().clone()
    alive = _Alive(excluded=[_storage(t) for t in (q, k, v, do)])
    packed: dict[int, tuple[Any, list]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = _storage(t)
        if storage is not None:
            packed.setdefault(id(storage), (storage, [list(t.shape), str(t.dtype)[6:], int(storage.nbytes())]))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        integrity._enter_mode(alive, "the saved-for-backward census")
        try:
            o = attention(q, k, v, causal, sm_scale)
        finally:
            integrity._leave_mode(alive, "the saved-for-backward census")
    if not isinstance(o, torch.Tensor) or not o.requires_grad:
        raise RuntimeError("the attention output does not require grad: return o from FlashAttention.forward")
    gc.collect()
    alive_bytes = alive.total
    saved = [entry for _, entry in packed.values()]
    packed.clear()  # the census keeps no storage alive through the backward pass
    start = alive.total
    alive.reset_peak()
    integrity._enter_mode(alive, "the saved-for-backward census")
    try:
        o.backward(do.to(o.dtype))
    finally:
        integrity._leave_mode(alive, "the saved-for-backward census")
    return {
        "out": (o.detach(), q.grad, k.grad, v.grad),
        "saved_bytes": sum(entry[2] for entry in saved),
        "saved": saved,
        "alive_bytes": alive_bytes,
        "backward_bytes": alive.peak - start,
    }
