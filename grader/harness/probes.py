"""Probes that run around one call into student code, in whichever process runs that code.

* `forbidden(names, why)`: for the duration of the call, the named library functions may not run.
  Two layers, both in the process that runs the student's code:

  1. Each named attribute is replaced by a function that raises `ForbiddenCall` ("this exercise
     must not call torch.softmax: ..."). The clearest message, and the only layer that sees Python
     functions that never reach torch's dispatcher (a torch.distributed helper that fails before
     its collective runs).
  2. An operator guard, a `TorchDispatchMode` entered around the call, fails every operator in the
     families that `FORBIDDEN_OPS` maps the names to, however the student's code reached it: a name
     bound at import (``sm = torch.softmax``), ``from torch import softmax``, the method
     ``x.softmax(-1)``, ``torch.ops.aten._softmax.default``, ``F.softmin``, a TorchScript function,
     autograd's backward pass, ``torch.no_grad`` or ``torch.inference_mode``, CPU or CUDA tensors.
     It also fails operators outside torch's own namespaces (a custom operator whose Python kernel
     would run below the guard), and it follows the threads that the call starts with
     ``threading.Thread`` (the simulated ring's ranks).

  Neither layer can stop code in the same process from dismantling it (popping the mode, patching
  this module). That is what the trusted static scan (grader/harness/tamper.py) is for: the session
  scans the student's file in the grader's own process and fails every guarded call of a file that
  reaches for that machinery. grader/AUTHORING.md says what each layer can and cannot prove.
* `count_lines(filename)`: counts the lines of one source file executed during the call. The
  structural check for vectorisation: run at two input sizes, the count must not grow with the
  number of tokens. Deterministic on a noisy machine, unlike timing.

Both are used by the sandboxed worker and by the in-process runner, so the two modes agree. This
module is imported before any student module (the worker and the session import it first), and it
keeps its own references to the dispatch-mode functions it uses, so that a student module that
replaces them at import time does not change what the guard does.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_INHERITED = object()

# Taken when this module is imported, before any student code has run.
_MODE_ENTER = TorchDispatchMode.__enter__
_MODE_EXIT = TorchDispatchMode.__exit__
_STACK_LEN = torch._C._len_torch_dispatch_stack
_STACK_AT = torch._C._get_dispatch_stack_at
_STACK_POP = torch._C._pop_torch_dispatch_stack
_THREAD_START = threading.Thread.start


class ForbiddenCall(RuntimeError):
    """Student code called a library function the exercise asks it to write itself."""


# --------------------------------------------------------------------------------------------------
# What each forbidden public name reaches at the dispatcher
#
# The guard watches the dispatcher rather than Python calls (a TorchFunctionMode) because a function
# mode sees only the outermost call: F.cross_entropy hides its log_softmax from it, nn.MultiheadAttention
# its softmax. Found by experiment on torch 2.13 (tests/test_probes.py re-runs every form): the public
# forms of softmax (torch.softmax, F.softmax, Tensor.softmax, torch.special.softmax, nn.Softmax, F.softmin,
# F.gumbel_softmax, a TorchScript function) all reach aten::_softmax; aten::softmax.int is
# decomposed into it above the dispatcher's Python key and is seen only under torch.inference_mode.
# scaled_dot_product_attention reaches a fused kernel (_scaled_dot_product_flash_attention_for_cpu on
# the CPU; on CUDA one of the flash / efficient / cuDNN kernels, in the table from torch's operator
# registry, not run here) or, on its math path, aten::_safe_softmax;
# nn.TransformerEncoderLayer's fast path hides a softmax in aten::_transformer_encoder_layer_fwd. A
# torch.distributed collective reaches its c10d operator (dist.all_reduce -> c10d::allreduce_), a
# functional collective its _c10d_functional operator. Operators are named "namespace::name" and
# stand for every overload.


@dataclass(frozen=True)
class OpFamily:
    """Operators that compute one thing, whatever public name reached them."""

    what: str  # for the message: "your code ran the operator aten::_softmax, {what}"
    ops: frozenset[str]


def _family(what: str, *ops: str) -> OpFamily:
    return OpFamily(what, frozenset(ops))


_FUSED_ATTENTION = (
    "aten::scaled_dot_product_attention", "aten::_scaled_dot_product_attention_math",
    "aten::_scaled_dot_product_attention_math_for_mps",
    "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_flash_attention_backward",
    "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
    "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_efficient_attention_backward",
    "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_cudnn_attention_backward",
    "aten::_scaled_dot_product_fused_attention_overrideable",
    "aten::_scaled_dot_product_fused_attention_overrideable_backward",
    "aten::_flash_attention_forward", "aten::_flash_attention_backward",
    "aten::_flash_attention_forward_no_dropout_inplace",
    "aten::_efficient_attention_forward", "aten::_efficient_attention_backward",
    "aten::_cudnn_attention_forward", "aten::_cudnn_attention_backward",
    "aten::_native_multi_head_attention", "aten::_transformer_encoder_layer_fwd",
    "aten::_triton_multi_head_attention", "aten::_triton_scaled_dot_attention",
)

SOFTMAX = _family(
    "a softmax or log-softmax",
    "aten::softmax", "aten::_softmax", "aten::special_softmax", "aten::_safe_softmax", "aten::_masked_softmax",
    "aten::_sparse_softmax", "aten::_nested_tensor_softmax_with_shape", "quantized::softmax",
    "aten::_softmax_backward_data", "aten::_masked_softmax_backward", "aten::_sparse_softmax_backward_data",
    "aten::log_softmax", "aten::_log_softmax", "aten::special_log_softmax", "aten::_sparse_log_softmax",
    "aten::_log_softmax_backward_data", "aten::_sparse_log_softmax_backward_data",
    *_FUSED_ATTENTION,  # each holds a softmax
)
LOGSUMEXP = _family("a logsumexp", "aten::logsumexp", "aten::special_logsumexp")
ATTENTION = _family("scaled dot-product attention", *_FUSED_ATTENTION, "aten::_safe_softmax")  # + the math path
ALL_REDUCE = _family(
    "an all-reduce",
    "c10d::allreduce_", "c10d::allreduce_coalesced_", "_c10d_functional::all_reduce", "_c10d_functional::all_reduce_",
    "_c10d_functional::all_reduce_coalesced", "_c10d_functional::all_reduce_coalesced_",
    "c10d_functional::all_reduce", "c10d_functional::all_reduce_coalesced",
)
REDUCE_SCATTER = _family(
    "a reduce-scatter",
    "c10d::reduce_scatter_", "c10d::_reduce_scatter_base_", "c10d::reduce_scatter_tensor_coalesced_",
    "_c10d_functional::reduce_scatter_tensor", "_c10d_functional::reduce_scatter_tensor_out",
    "_c10d_functional::reduce_scatter_tensor_coalesced", "_c10d_functional_autograd::reduce_scatter_tensor",
    "c10d_functional::reduce_scatter_tensor", "c10d_functional::reduce_scatter_tensor_coalesced",
)
ALL_GATHER = _family(
    "an all-gather",
    "c10d::allgather_", "c10d::_allgather_base_", "c10d::allgather_coalesced_",
    "c10d::allgather_into_tensor_coalesced_",
    "_c10d_functional::all_gather_into_tensor", "_c10d_functional::all_gather_into_tensor_out",
    "_c10d_functional::all_gather_into_tensor_coalesced", "_c10d_functional_autograd::all_gather_into_tensor",
    "c10d_functional::all_gather_into_tensor", "c10d_functional::all_gather_into_tensor_coalesced",
)
ALL_TO_ALL = _family(
    "an all-to-all",
    "c10d::alltoall_", "c10d::alltoall_base_", "_c10d_functional::all_to_all_single",
    "_c10d_functional_autograd::all_to_all_single", "c10d_functional::all_to_all_single",
)
BROADCAST = _family("a broadcast", "c10d::broadcast_", "_c10d_functional::broadcast", "_c10d_functional::broadcast_",
                    "c10d_functional::broadcast")
REDUCE = _family("a reduce", "c10d::reduce_")
GATHER = _family("a gather", "c10d::gather_")
SCATTER = _family("a scatter", "c10d::scatter_")


def _names(prefixes: Iterable[str], attrs: Iterable[str],
           families: tuple[OpFamily, ...]) -> dict[str, tuple[OpFamily, ...]]:
    return {f"{p}.{a}": families for p in prefixes for a in attrs}


_DIST = ("torch.distributed", "torch.distributed.distributed_c10d")
_FUNCTIONAL = ("torch.distributed._functional_collectives",)
_GROUP = ("torch.distributed.ProcessGroup",)

# Public name -> the operator families it reaches. A name that is not here is still patched (layer 1)
# but has no operator guard; tests/test_probes.py checks that every name the course forbids is here.
FORBIDDEN_OPS: dict[str, tuple[OpFamily, ...]] = {
    **_names(("torch", "torch.nn.functional", "torch.Tensor", "torch.special", "torch.sparse"),
             ("softmax", "log_softmax", "_softmax", "_log_softmax", "softmin"), (SOFTMAX,)),
    **_names(("torch.nn",), ("Softmax", "LogSoftmax", "Softmin", "Softmax2d"), (SOFTMAX,)),
    "torch.nn.functional.gumbel_softmax": (SOFTMAX,),
    **_names(("torch", "torch.Tensor", "torch.special"), ("logsumexp",), (LOGSUMEXP,)),
    "torch.nn.functional.scaled_dot_product_attention": (ATTENTION,),
    "torch.nn.functional.multi_head_attention_forward": (ATTENTION, SOFTMAX),
    "torch.nn.MultiheadAttention": (ATTENTION, SOFTMAX),
    **_names(_DIST, ("all_reduce", "all_reduce_coalesced"), (ALL_REDUCE,)),
    **_names(_DIST, ("reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "reduce_scatter_single"),
             (REDUCE_SCATTER,)),
    **_names(_DIST, ("all_gather", "all_gather_into_tensor", "_all_gather_base", "all_gather_coalesced",
                     "all_gather_object", "all_gather_single"), (ALL_GATHER,)),
    **_names(_DIST, ("all_to_all", "all_to_all_single"), (ALL_TO_ALL,)),
    **_names(_DIST, ("broadcast", "broadcast_object_list"), (BROADCAST,)),
    **_names(_DIST, ("reduce",), (REDUCE,)),
    **_names(_DIST, ("gather", "gather_object"), (GATHER,)),
    **_names(_DIST, ("scatter", "scatter_object_list"), (SCATTER,)),
    **_names(_FUNCTIONAL, ("all_reduce", "all_reduce_inplace", "all_reduce_coalesced"), (ALL_REDUCE,)),
    **_names(_FUNCTIONAL, ("reduce_scatter_tensor", "reduce_scatter_tensor_coalesced"), (REDUCE_SCATTER,)),
    **_names(_FUNCTIONAL, ("all_gather_tensor", "all_gather_tensor_inplace", "all_gather_into_tensor_coalesced"),
             (ALL_GATHER,)),
    **_names(_FUNCTIONAL, ("all_to_all_single",), (ALL_TO_ALL,)),
    **_names(_FUNCTIONAL, ("broadcast",), (BROADCAST,)),
    **_names(_GROUP, ("allreduce", "allreduce_coalesced"), (ALL_REDUCE,)),
    **_names(_GROUP, ("reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor_coalesced",
                      "_reduce_scatter_base"), (REDUCE_SCATTER,)),
    **_names(_GROUP, ("allgather", "allgather_coalesced", "allgather_into_tensor_coalesced", "all_gather_single",
                      "_allgather_base"), (ALL_GATHER,)),
    **_names(_GROUP, ("alltoall", "alltoall_base", "all_to_all_single"), (ALL_TO_ALL,)),
    **_names(_GROUP, ("broadcast",), (BROADCAST,)),
    **_names(_GROUP, ("reduce",), (REDUCE,)),
    **_names(_GROUP, ("gather",), (GATHER,)),
    **_names(_GROUP, ("scatter",), (SCATTER,)),
}

# Operator namespaces whose kernels are torch's own: those of a CPU build of torch 2.13, and whatever
# this build had registered when this module was imported (before any student code). An operator from
# any other namespace (torch.library.custom_op("mylib::f")) has a kernel the student wrote, which runs
# below the guard where the guard cannot see what it calls, so a guarded call may not use one.
TORCH_NAMESPACES = frozenset({
    "aten", "prims", "prim", "quantized", "_quantized", "quantization", "c10d", "_c10d_functional",
    "_c10d_functional_autograd", "c10d_functional", "symm_mem", "mkldnn", "mkldnn_prepacked", "mkl", "onednn",
    "sparse", "profiler", "rngprims", "debugprims", "inductor_prims", "inductor", "_native", "static_runtime",
    "_dtensor", "export",
} | {name.partition("::")[0] for name in torch._C._dispatch_get_all_op_names()})


def banned_operators(names: Iterable[str]) -> dict[str, tuple[str, OpFamily]]:
    """Operator name -> (the forbidden public name it stands for, its family), for the names in the table.

    The first name that reaches an operator is the one the message names."""
    return dict(_banned(tuple(names)))


@functools.lru_cache(maxsize=64)
def _banned(names: tuple[str, ...]) -> dict[str, tuple[str, OpFamily]]:
    banned: dict[str, tuple[str, OpFamily]] = {}
    for name in names:
        for family in FORBIDDEN_OPS.get(name, ()):
            for op in family.ops:
                banned.setdefault(op, (name, family))
    return banned


_OP_NAMES: dict[Any, str] = {}  # OpOverload -> "namespace::name" (the same object comes back every call)


def operator_name(func: Any) -> str:
    """'aten::_softmax' for torch.ops.aten._softmax.default (any overload); cached per operator."""
    name = _OP_NAMES.get(func)
    if name is None:
        try:
            name = func._schema.name  # without the overload: "aten::_softmax" for _softmax.out too
        except AttributeError:  # not an OpOverload: a higher-order operator, say
            name = ""
        if "::" not in name:
            name = f"{getattr(func, 'namespace', '?')}::{getattr(func, '__name__', func)}"
        _OP_NAMES[func] = name
    return name


class OperatorGuard(TorchDispatchMode):
    """Fails every banned operator, and every operator outside torch's own namespaces, run under it."""

    def __init__(self, banned: dict[str, tuple[str, OpFamily]], why: str = ""):
        super().__init__()
        self.banned, self.why = banned, why

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's handler in torch._dynamo.disable unless told not to: a quarter of the
        # guard's cost per operator. Nothing is compiled here (torch.compile runs eagerly under a mode).
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = operator_name(func)
        hit = self.banned.get(name)
        if hit is not None:
            public, family = hit
            raise ForbiddenCall(
                f"this exercise must not call {public}{': ' + self.why if self.why else ''}. Your code ran the "
                f"operator {name}, {family.what}: the guard watches the operators themselves, so another name "
                "for the same function (an alias, a method, torch.ops) is the same call. "
                "Write the computation yourself; that is the point of the exercise."
            )
        if name.partition("::")[0] not in TORCH_NAMESPACES:
            raise ForbiddenCall(
                f"your code called the operator {name}, which is not one of torch's own: its kernel runs below "
                "the forbidden-call guard, which cannot see what it computes. Call your code directly instead "
                "of registering it as an operator."
            )
        return func(*args, **(kwargs or {}))


class GuardRemoved(ForbiddenCall):
    """The operator guard was not where it was put when the call ended: the call changed the mode stack."""


def _enter(guard: OperatorGuard) -> None:
    _MODE_ENTER(guard)
    depth = _STACK_LEN()
    if depth == 0 or _STACK_AT(depth - 1) is not guard:
        raise GuardRemoved("the forbidden-call guard could not be installed: torch's dispatch modes were tampered with")


def _leave(guard: OperatorGuard) -> None:
    depth = _STACK_LEN()
    if depth and _STACK_AT(depth - 1) is guard:
        _MODE_EXIT(guard, None, None, None)
        return
    # Something was pushed and left on top, or the guard was popped: put the stack back as it was.
    stack = [_STACK_AT(i) for i in range(depth)]
    if any(mode is guard for mode in stack):
        while _STACK_LEN() and _STACK_POP() is not guard:
            pass
    raise GuardRemoved(
        "the forbidden-call guard was removed or covered during the call (torch's dispatch mode stack changed): "
        "the call cannot be trusted"
    )


@contextlib.contextmanager
def operator_guard(names: Iterable[str], why: str = "") -> Iterator[OperatorGuard | None]:
    """Layer 2: the operator guard around a call, in this thread and in the threads the call starts.

    Yields None (and guards nothing) when no name is in `FORBIDDEN_OPS`."""
    banned = _banned(tuple(names))  # shared, read-only
    if not banned:
        yield None
        return

    def start(thread: threading.Thread, *args, **kwargs):
        run = thread.run

        def guarded_run():
            inner = OperatorGuard(banned, why)
            _enter(inner)
            try:
                run()
            finally:
                _leave(inner)

        thread.run = guarded_run  # type: ignore[method-assign]
        return _THREAD_START(thread, *args, **kwargs)

    guard = OperatorGuard(banned, why)
    previous_start = threading.Thread.start
    _enter(guard)
    threading.Thread.start = start  # type: ignore[method-assign]
    try:
        yield guard
    finally:
        threading.Thread.start = previous_start  # type: ignore[method-assign]
        _leave(guard)


# --------------------------------------------------------------------------------------------------
# Layer 1: the named attributes, patched for the call


def _resolve(dotted: str):
    """'torch.nn.functional.softmax' -> (owner object, attribute name)."""
    parts = dotted.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attr in parts[split:-1]:
            owner = getattr(owner, attr)
        return owner, parts[-1]
    raise ValueError(f"cannot resolve {dotted!r} to a module attribute")


@contextlib.contextmanager
def patched_attributes(names: Iterable[str], why: str = "") -> Iterator[None]:
    """Layer 1: each named library function raises `ForbiddenCall` while the block runs."""
    patched = []
    try:
        for name in names:
            owner, attr = _resolve(name)
            # For a class, restore exactly what its own __dict__ held (an inherited method: nothing).
            original = vars(owner).get(attr, _INHERITED) if isinstance(owner, type) else getattr(owner, attr)

            def guard(*args, __name=name, **kwargs):
                raise ForbiddenCall(
                    f"this exercise must not call {__name}{': ' + why if why else ''}. "
                    "Write the computation yourself; that is the point of the exercise."
                )

            setattr(owner, attr, guard)
            patched.append((owner, attr, original))
        yield
    finally:
        for owner, attr, original in reversed(patched):
            if original is _INHERITED:
                delattr(owner, attr)
            else:
                setattr(owner, attr, original)


@contextlib.contextmanager
def forbidden(names: Iterable[str], why: str = "") -> Iterator[None]:
    """Both layers around one call: the named functions and every operator they reach raise `ForbiddenCall`."""
    names = tuple(names)
    with patched_attributes(names, why), operator_guard(names, why):
        yield


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
        threading.settrace(None)  # type: ignore[arg-type]
        if not intact:
            self.count = self.TAMPERED


@contextlib.contextmanager
def around_call(filename: str, forbid: Iterable[str] = (), forbid_why: str = "", count_lines: bool = False):
    """Apply the requested probes around one call; yields the LineCounter (or None)."""
    with forbidden(forbid, forbid_why):
        if count_lines:
            with LineCounter(filename) as counter:
                yield counter
        else:
            yield None
