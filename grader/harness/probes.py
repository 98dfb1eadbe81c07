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
* `KERNELS_ONLY`, a rule named in the same `forbid` list: the call is a Triton-contract function
  (softmax_triton, FlashAttention, paged_attention_triton), so its work must run inside @triton.jit
  kernels. Outside a kernel launch only the operators in `HOST_OPS` may run (allocation, views,
  copies and casts: an allow-list, not a deny-list), the host may not read tensor values back
  (``.numpy()``, ``.tolist()``, ``__array__``, ``__dlpack__``, storages, ``data_ptr``, repr: the
  routes around the dispatcher are patched for the call; ``.item()`` and ``int(t)`` reach
  ``aten::_local_scalar_dense``, which is not allowed), and every floating-point tensor the host
  allocates uninitialised is filled with NaN, so that an output element no kernel writes reads as
  NaN. All of it is suspended while a kernel launch runs (`JITFunction.run` on a GPU,
  `InterpretedFunction.run` under TRITON_INTERPRET=1, whose interpreter itself copies through torch
  and numpy); under the interpreter only Triton's own steps are (setting up arguments, copying results
  back), never the kernel body, which is the student's Python (`bound_interpreter_memory`); the banned
  families above stay in force inside a launch. `LaunchLog` records each
  launch (kernel, grid, the storages it was handed) for the tests that check coverage.
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
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from grader.harness.wire import type_name

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
# The softmax's normaliser, log(sum(exp(x))), and its two-term cases: whichever a submission reaches,
# the library did the exercise's work (a running logsumexp is the online normaliser; logaddexp is the
# merge of two states in log space; softplus(x) = logaddexp(x, 0); sigmoid(x) = softmax([x, 0])[0]).
LOGSUMEXP = _family(
    "a log-sum-exp (the softmax's normaliser)",
    "aten::logsumexp", "aten::special_logsumexp", "aten::logcumsumexp", "aten::_logcumsumexp",
    "aten::logaddexp", "aten::logaddexp2", "aten::softplus", "aten::softplus_backward",
    "aten::log_sigmoid", "aten::log_sigmoid_forward", "aten::log_sigmoid_backward",
    # losses and activations that are one of those inside (the red team's softplus was binary cross-entropy with
    # logits against zeros: exactly log(1 + exp(z)), one operator): softplus(-y x), x tanh(softplus(x)), CTC's
    # log-sum-exp over paths
    "aten::binary_cross_entropy_with_logits",
    "aten::soft_margin_loss", "aten::soft_margin_loss_backward", "aten::mish", "aten::mish_", "aten::mish_backward",
    "aten::_ctc_loss", "aten::_ctc_loss_backward", "aten::ctc_loss", "aten::_use_cudnn_ctc_loss",
    "aten::_cudnn_ctc_loss",
)
TWO_TERM_SOFTMAX = _family(
    "a sigmoid (the softmax of two terms)",
    "aten::sigmoid", "aten::sigmoid_", "aten::sigmoid_backward", "aten::special_expit", "aten::_foreach_sigmoid",
    "aten::_foreach_sigmoid_", "quantized::sigmoid",
    # x sigmoid(x), a sigmoid(b): a sigmoid inside one operator
    "aten::silu", "aten::silu_", "aten::silu_backward", "aten::glu", "aten::glu_backward", "aten::glu_jvp",
    "aten::glu_backward_jvp",
)
# Forbidding any softmax or logsumexp name forbids the whole of that math: softmax(x) = exp(x - logsumexp(x)).
NORMALISER = (SOFTMAX, LOGSUMEXP, TWO_TERM_SOFTMAX)
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
             ("softmax", "log_softmax", "_softmax", "_log_softmax", "softmin"), NORMALISER),
    **_names(("torch.nn",), ("Softmax", "LogSoftmax", "Softmin", "Softmax2d"), NORMALISER),
    "torch.nn.functional.gumbel_softmax": NORMALISER,
    **_names(("torch", "torch.Tensor", "torch.special"), ("logsumexp",), NORMALISER),
    **_names(("torch", "torch.Tensor"), ("logcumsumexp", "logaddexp", "logaddexp2", "sigmoid"), NORMALISER),
    **_names(("torch.special",), ("expit",), NORMALISER),
    **_names(("torch.nn.functional",), ("softplus", "logsigmoid", "sigmoid"), NORMALISER),
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


# The families by rule. The lists above were found by experiment on the torch versions the course tested; a newer
# torch adds operators (c10d::gather_into_tensor_ arrived in 2.14). So an operator no list names still belongs to
# a family when its namespace and name say so, the same rule tests/test_probes.py applies to the whole registry,
# decided on the grading machine the first time the guard meets the operator: a new softmax or collective is
# forbidden the moment it exists, never only once a test has listed it.
COLLECTIVE_NAMESPACES = frozenset({"c10d", "_c10d_functional", "_c10d_functional_autograd", "c10d_functional"})
# Operators of those namespaces that move no reduction or copy of a tensor between ranks: point to point and
# bookkeeping (the ring is built on send and recv).
NOT_COLLECTIVES = frozenset({"barrier", "monitored_barrier_", "send", "recv_", "recv_any_source_", "isend", "irecv",
                             "wait_tensor", "batch_p2p_ops", "check_for_nan", "_wrap_tensor_autograd"})
COLLECTIVE = _family("a collective (one this torch adds, which no family lists yet)")
_COLLECTIVE_WORDS = (("reducescatter", REDUCE_SCATTER), ("allreduce", ALL_REDUCE), ("allgather", ALL_GATHER),
                     ("alltoall", ALL_TO_ALL), ("broadcast", BROADCAST), ("gather", GATHER), ("scatter", SCATTER),
                     ("reduce", REDUCE))
_NORMALISER_WORDS = ("logsumexp", "logcumsumexp", "logaddexp", "softplus", "log_sigmoid")
# A family is "reached" by a forbidden name when the name reaches any of these (the unknown collective: any
# collective at all, since a ring that may not call one may call none).
_COLLECTIVE_FAMILIES = frozenset({ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, ALL_TO_ALL, BROADCAST, REDUCE, GATHER,
                                  SCATTER})


def families_by_rule(op: str) -> tuple[OpFamily, ...]:
    """The families an operator ("namespace::name") belongs to by its namespace and name alone: a collective of
    torch's distributed namespaces by the words of its name (an unknown one: COLLECTIVE); a softmax, an
    attention kernel (which holds a softmax), a log-sum-exp or a sigmoid by the words of its name."""
    namespace, _, name = op.partition("::")
    if namespace in COLLECTIVE_NAMESPACES:
        if name in NOT_COLLECTIVES:
            return ()
        flat = name.replace("_", "")
        return next(((family,) for word, family in _COLLECTIVE_WORDS if word in flat), (COLLECTIVE,))
    if "attention" in name or "transformer_encoder" in name:
        return (ATTENTION, SOFTMAX)
    if "softmax" in name:
        return (SOFTMAX,)
    if any(word in name for word in _NORMALISER_WORDS):
        return (LOGSUMEXP,)
    if ("sigmoid" in name and "hardsigmoid" not in name) or "expit" in name:
        return (TWO_TERM_SOFTMAX,)
    return ()


class BannedOperators(Mapping[str, tuple[str, OpFamily]]):
    """Operator name -> (the forbidden public name it stands for, its family): the listed operators of the names'
    families, and by `families_by_rule` any other operator of a family they reach, looked up the first time it
    runs (cached). Iterating yields the listed ones only; `get` and `in` answer for any operator."""

    def __init__(self, listed: dict[str, tuple[str, OpFamily]], reached: dict[OpFamily, str]):
        self._listed, self._reached = listed, reached
        self._by_rule: dict[str, tuple[str, OpFamily] | None] = {}

    def __getitem__(self, op: str) -> tuple[str, OpFamily]:
        hit = self._listed.get(op)
        if hit is None:
            if op not in self._by_rule:  # a race only computes the same answer twice
                self._by_rule[op] = self._rule(op)
            hit = self._by_rule[op]
        if hit is None:
            raise KeyError(op)
        return hit

    def get(self, op: str, default: Any = None) -> Any:  # the guard's lookup, once per operator run: kept short
        hit = self._listed.get(op)
        if hit is None:
            try:
                hit = self._by_rule[op]
            except KeyError:
                hit = self._by_rule[op] = self._rule(op)
        return default if hit is None else hit

    def _rule(self, op: str) -> tuple[str, OpFamily] | None:
        for family in families_by_rule(op):
            if family in self._reached:
                return self._reached[family], family
            if family is COLLECTIVE and self._reached.keys() & _COLLECTIVE_FAMILIES:
                name = next(self._reached[f] for f in self._reached if f in _COLLECTIVE_FAMILIES)
                return name, family
        return None

    def __iter__(self) -> Iterator[str]:
        return iter(self._listed)

    def __len__(self) -> int:
        return len(self._listed)

    def __bool__(self) -> bool:
        return bool(self._listed)


def banned_operators(names: Iterable[str]) -> dict[str, tuple[str, OpFamily]]:
    """Operator name -> (the forbidden public name it stands for, its family), for the listed operators of the
    names' families (the guard also bans, by `families_by_rule`, any operator of those families no list names).

    The first name that reaches an operator is the one the message names."""
    return dict(_banned(tuple(names)))


@functools.lru_cache(maxsize=64)
def _banned(names: tuple[str, ...]) -> BannedOperators:
    banned: dict[str, tuple[str, OpFamily]] = {}
    reached: dict[OpFamily, str] = {}
    for name in names:
        for family in FORBIDDEN_OPS.get(name, ()):
            reached.setdefault(family, name)
            for op in family.ops:
                banned.setdefault(op, (name, family))
    return BannedOperators(banned, reached)  # shared by every guard of these names


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


# --------------------------------------------------------------------------------------------------
# The kernel rule: what the host code of a Triton-contract function may do
#
# A function whose contract is "a Triton kernel" (softmax_triton, FlashAttention, paged_attention_triton)
# must compute inside @triton.jit kernels. Between the launches its host code prepares them: it
# allocates outputs, takes views, makes inputs contiguous, casts, copies results into place. That is an
# allow-list of operators, not a deny-list of the ones a red team thought of: anything else (an exp, a
# matmul, a gather through a block table) is the work itself, done on the host. The same goes for
# reading values back to Python or numpy, which never reaches the dispatcher: those routes are patched
# for the call. Inside a launch all of this is suspended: Triton's interpreter (TRITON_INTERPRET=1)
# copies the arguments through torch and computes with numpy, and on a GPU the launcher reads data_ptr.

KERNELS_ONLY = "<Triton kernels only>"  # named in forbid=[...]: the call's work runs inside kernel launches
RULES = frozenset({KERNELS_ONLY})  # names in a forbid list that are rules, not library functions

# Allocation that leaves memory uninitialised: filled with NaN (floating point) during a guarded call, so an
# output element that no kernel writes reads as NaN and fails the comparison (it is garbage without the rule).
UNINITIALISED = frozenset({
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty", "aten::new_empty_strided",
})
HOST_OPS = UNINITIALISED | frozenset({
    # allocation filled with a constant, or with positions (nothing read from an input)
    "aten::zeros", "aten::zeros_like", "aten::new_zeros", "aten::ones", "aten::ones_like", "aten::new_ones",
    "aten::full", "aten::full_like", "aten::new_full", "aten::scalar_tensor", "aten::arange", "aten::fill_",
    "aten::zero_",
    # views: the same memory under another shape, offset or strides
    "aten::view", "aten::_unsafe_view", "aten::_reshape_alias", "aten::reshape", "aten::as_strided", "aten::alias",
    "aten::detach", "aten::t", "aten::transpose", "aten::permute", "aten::expand", "aten::squeeze",
    "aten::unsqueeze", "aten::select", "aten::slice", "aten::narrow", "aten::split", "aten::split_with_sizes",
    "aten::chunk", "aten::unbind", "aten::unflatten", "aten::flatten", "aten::movedim", "aten::view_as",
    # copies and casts: a new layout, dtype or device, or a result copied into place
    "aten::clone", "aten::contiguous", "aten::copy_", "aten::_to_copy", "aten::to", "aten::_copy_from",
    "aten::_copy_from_and_resize",
})

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

_TENSOR_STORAGE = torch._C.TensorBase.untyped_storage  # taken before any student code, never patched
_TENSOR_OFFSET = torch._C.TensorBase.storage_offset  # likewise: a launch record's alignment (describe_argument)
_TENSOR_ELEMENT_SIZE = torch._C.TensorBase.element_size
_STORAGE_DATA_PTR = torch._C.StorageBase.data_ptr  # type: ignore[attr-defined]  # likewise (not in torch's stubs)
_NAN = float("nan")


class _LaunchState(threading.local):
    depth = 0  # > 0 while a Triton kernel launch runs in this thread


_LAUNCH_STATE = _LaunchState()


def in_launch() -> bool:
    """True while a Triton kernel launch runs in this thread (the kernel rule is suspended)."""
    return _LAUNCH_STATE.depth > 0


@dataclass
class Launch:
    """One Triton kernel launch seen during a call."""

    kernel: str
    grid: tuple[int, int, int] | None = None  # None until the launcher resolved it (a callable grid)
    storages: frozenset[int] = frozenset()  # the address of each tensor argument's storage
    # What a compile of this launch needs (grader.kernelmodel), as plain data: each argument the launch named, by
    # parameter name, as `describe_argument` writes it, and the launch's options (num_warps, num_stages, ...).
    # None when the launch could not be described (the kernel model then says so).
    arguments: dict[str, dict] | None = None
    options: dict[str, Any] | None = None

    @property
    def programs(self) -> int:
        return 0 if self.grid is None else self.grid[0] * self.grid[1] * self.grid[2]


class LaunchLog(list):
    """The launches made while it is active, in order; `derived` holds the storages the host code filled by
    copying (clone, a cast, copy_) from memory a launch was handed, so that a kernel's result copied or cast
    into the returned tensor still counts as the kernel's."""

    def __init__(self) -> None:
        super().__init__()
        self.derived: set[int] = set()

    def kernel_storages(self) -> set[int]:
        return set().union(*(launch.storages for launch in self)) | self.derived


# Allowed host operators whose result holds the values of an input (a copy or a cast, not a view), as
# operator -> (index of the source argument, index of the target argument or None for the result).
_COPIES = {
    "aten::clone": (0, None), "aten::_to_copy": (0, None), "aten::contiguous": (0, None), "aten::to": (0, None),
    "aten::copy_": (1, 0), "aten::_copy_from": (0, 1), "aten::_copy_from_and_resize": (0, 1),
}


def _note_copies(name: str, args: tuple, out: Any) -> None:
    """Follow a kernel's result through a host copy, for every active LaunchLog."""
    where = _COPIES.get(name)
    if where is None or not _ACTIVE_LOGS or len(args) <= max(i for i in where if i is not None):
        return
    source, target = where
    written = _tensor_storages([args[source]])
    for log in list(_ACTIVE_LOGS):
        if written & log.kernel_storages():
            log.derived |= _tensor_storages([out if target is None else args[target]])


def storage_of(tensor: torch.Tensor) -> int:
    """The address of a tensor's storage (the same for every view of it), through an unpatched method."""
    return _STORAGE_DATA_PTR(_TENSOR_STORAGE(tensor))


def _rule_message(why: str) -> str:
    return f"this function must do its work in Triton kernels{': ' + why if why else ''}"


_HOST_OP_NOTES = {
    "aten::_local_scalar_dense": (
        ", which reads a tensor's value on the host (.item(), int(t), float(t), bool(t), or an `if` or `range` on "
        "a tensor): pass the tensor to your kernel and tl.load the value there"
    ),
    "aten::lift_fresh": ", which builds a tensor from Python data on the host (torch.tensor, torch.as_tensor, "
                        "torch.from_numpy)",
}


def _where_host() -> str:
    """Where host code ran: a kernel body under Triton's interpreter is host Python too (the rule holds there)."""
    if _BOUND["installed"] and _LAUNCH_MEMORY.stack:
        return " (in a kernel body, which Triton's interpreter runs as host Python: only tl operations belong there)"
    return ""


def host_op_refused(name: str, why: str = "") -> "ForbiddenCall":
    return ForbiddenCall(
        f"{_rule_message(why)}: outside a kernel launch its host code may only allocate tensors, take views of "
        "them, copy and cast them (torch.empty, zeros, full, view, reshape, transpose, contiguous, .to, copy_). "
        f"Your code ran the operator {name} outside any kernel launch{_where_host()}{_HOST_OP_NOTES.get(name, '')}. Do that "
        "work inside your @triton.jit kernel (\"How it is graded\" in the exercise's README lists what the host "
        "may do)."
    )


def host_read_refused(what: str, why: str = "") -> "ForbiddenCall":
    printing = " Printing a tensor reads it too: print its shape, strides or dtype instead." if "print" in what \
        or "f-string" in what else ""
    return ForbiddenCall(
        f"{_rule_message(why)}: outside a kernel launch its host code may not read tensor values, and your code "
        f"used {what}{_where_host()}, which hands them to Python or numpy where no kernel computes with them.{printing} Pass the "
        "tensor to your kernel and tl.load what it needs; shapes, strides, dtypes and devices are free to read."
    )


_MEMORY_LOCK = threading.RLock()  # an interpreted kernel's bounds check and its access; a resize (see below)
_MOVES_STORAGE = frozenset({"aten::resize_", "aten::set_", "aten::resize_as_", "aten::_resize_output_",
                            "aten::resize_as_sparse_", "aten::_resize_output"})


class OperatorGuard(TorchDispatchMode):
    """Fails every banned operator, and every operator outside torch's own namespaces, run under it. With
    `host_only` (the kernel rule), also every operator outside `HOST_OPS` that runs outside a kernel launch,
    and it fills the floating-point tensors the host allocates uninitialised with NaN."""

    def __init__(self, banned: Mapping[str, tuple[str, OpFamily]], why: str = "", host_only: bool = False):
        super().__init__()
        self.banned, self.why, self.host_only = banned, why, host_only

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
        if name in _MOVES_STORAGE:  # never between an interpreted kernel's bounds check and its access
            with _MEMORY_LOCK:
                return self._run(name, func, args, kwargs)
        return self._run(name, func, args, kwargs)

    def _run(self, name: str, func: Any, args: tuple, kwargs: dict | None) -> Any:
        if not self.host_only or in_launch():
            return func(*args, **(kwargs or {}))
        if name not in HOST_OPS:
            raise host_op_refused(name, self.why)
        out = func(*args, **(kwargs or {}))
        if name in UNINITIALISED and isinstance(out, torch.Tensor) and out.is_floating_point():
            out.fill_(_NAN)  # below this mode: the handler runs with the mode popped
        _note_copies(name, args, out)
        return out


class GuardRemoved(ForbiddenCall):
    """The operator guard was not where it was put when the call ended: the call changed the mode stack."""


# -- The probes' own integrity, checked by identity when each guarded call ends
#
# The scan keeps a submission away from this module; this is the backstop for a way past it. The probes are
# this module's functions and classes and the attributes they install on torch's and Triton's (the host-read
# watch, the interpreter's bound, the launch wrappers). `seal()` records each by identity before the student's
# module is imported; `assert_sealed()` (at the end of every guarded call) fails the call if any was rebound,
# so a submission that swapped `in_launch` or `OperatorGuard.__torch_dispatch__` loses the call it did it in.

_MISSING = object()
_INSTALLED: list[tuple[Any, str, Any]] = []  # (owner, attribute, what the probes put there), for good
_SEAL: dict[str, Any] = {}


def _install(owner: Any, attr: str, value: Any) -> None:
    """setattr, remembered: the attribute must still be `value` whenever a guarded call ends."""
    setattr(owner, attr, value)
    _INSTALLED.append((owner, attr, value))


def _own_classes() -> list[type]:
    return [v for v in dict.values(globals()) if isinstance(v, type) and v.__module__ == __name__]


def _digest() -> list[tuple[Mapping[str, Any], int, list[tuple[str, Any]]]]:
    """(namespace, how many names it holds, every (name, object) in it) for this module and its classes."""
    spaces = [globals(), *(vars(c) for c in _own_classes())]
    return [(space, len(space), list(space.items())) for space in spaces]


def seal() -> None:
    """Record the probes by identity (the worker calls this after installing them, before the student's import)."""
    _SEAL["digest"] = _digest()
    _SEAL["flags"] = (_BOUND["installed"], _READS["installed"])


def _unsealed() -> str | None:
    for owner, attr, value in _INSTALLED:
        if vars(owner).get(attr) is not value:
            return f"{getattr(owner, '__name__', type_name(type(owner)))}.{attr}"
    for space, size, items in _SEAL["digest"]:
        if len(space) != size:
            return f"a name added to or removed from {space.get('__qualname__') or __name__}"
        for name, value in items:
            if space.get(name, _MISSING) is not value:
                return f"{space.get('__qualname__') or __name__}.{name}"
    if (_BOUND["installed"], _READS["installed"]) != _SEAL["flags"]:
        return "the probes' installation flags"
    return None


def assert_sealed() -> None:
    """Fail the call if any probe was rebound since `seal()` (a no-op before it)."""
    if "digest" not in _SEAL:
        return
    moved = _unsealed()
    if moved:
        raise GuardRemoved(
            f"the grader's probes were changed during the call ({moved} is not what the grader put there): the "
            "call cannot be trusted. Nothing in an exercise needs to reach the grader's own code."
        )


def _enter_mode(mode: TorchDispatchMode, what: str) -> None:
    _MODE_ENTER(mode)
    depth = _STACK_LEN()
    if depth == 0 or _STACK_AT(depth - 1) is not mode:
        raise GuardRemoved(f"{what} could not be installed: torch's dispatch modes were tampered with")


def _leave_mode(mode: TorchDispatchMode, what: str) -> None:
    depth = _STACK_LEN()
    if depth and _STACK_AT(depth - 1) is mode:
        _MODE_EXIT(mode, None, None, None)
        return
    # Something was pushed and left on top, or the mode was popped: put the stack back as it was.
    stack = [_STACK_AT(i) for i in range(depth)]
    if any(m is mode for m in stack):
        while _STACK_LEN() and _STACK_POP() is not mode:
            pass
    raise GuardRemoved(
        f"{what} was removed or covered during the call (torch's dispatch mode stack changed): "
        "the call cannot be trusted"
    )


def _enter(guard: OperatorGuard) -> None:
    _enter_mode(guard, "the forbidden-call guard")


def _leave(guard: OperatorGuard) -> None:
    _leave_mode(guard, "the forbidden-call guard")
    assert_sealed()


@contextlib.contextmanager
def operator_guard(names: Iterable[str], why: str = "") -> Iterator[OperatorGuard | None]:
    """Layer 2: the operator guard around a call, in this thread and in the threads the call starts.

    With `KERNELS_ONLY` among the names, the kernel rule too (its launch watch and read-back patches
    included). Yields None (and guards nothing) when no name is in `FORBIDDEN_OPS` and the rule is absent."""
    names = tuple(names)
    banned = _banned(tuple(n for n in names if n not in RULES))  # shared, read-only
    host_only = KERNELS_ONLY in names
    if not banned and not host_only:
        yield None
        return

    def start(thread: threading.Thread, *args, **kwargs):
        run = thread.run

        def guarded_run():
            inner = OperatorGuard(banned, why, host_only)
            _enter(inner)
            try:
                run()
            finally:
                _leave(inner)

        thread.run = guarded_run  # type: ignore[method-assign]
        return _THREAD_START(thread, *args, **kwargs)

    with contextlib.ExitStack() as stack:
        if host_only:
            stack.enter_context(watching_launches())
            stack.enter_context(host_reads_refused(why))
        guard = OperatorGuard(banned, why, host_only)
        previous_start = threading.Thread.start
        _enter(guard)
        threading.Thread.start = start  # type: ignore[method-assign, assignment]  # patched while the guard is on
        try:
            yield guard
        finally:
            threading.Thread.start = previous_start  # type: ignore[method-assign]
            _leave(guard)


# -- Kernel launches: recorded, checked, and the rule suspended while they run


_ACTIVE_LOGS: list[LaunchLog] = []
_WATCH_LOCK = threading.Lock()
_WATCH: dict[str, Any] = {"depth": 0, "restore": []}
# Triton's own functions a launch runs through: each must still be Triton's when a guarded call starts,
# or a replacement would run while the rule is suspended.
_LAUNCH_MACHINERY = (
    ("triton.runtime.jit", "KernelInterface", "__getitem__"),
    ("triton.runtime.jit", "JITFunction", "run"),
    ("triton.runtime.jit", "JITFunction", "_do_compile"),
    ("triton.runtime.interpreter", "InterpretedFunction", "run"),
    ("triton.runtime.interpreter", "InterpretedFunction", "rewrite"),
    ("triton.runtime.interpreter", "GridExecutor", "__call__"),
    ("triton.runtime.interpreter", "GridExecutor", "_init_args_hst"),
    ("triton.runtime.interpreter", "GridExecutor", "_restore_args_dev"),
)
_LAUNCHERS = (("triton.runtime.jit", "JITFunction"), ("triton.runtime.interpreter", "InterpretedFunction"))


def _triton_class(module: str, name: str) -> type | None:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):  # no Triton, or a Triton without the interpreter
        return None


@functools.lru_cache(maxsize=1)
def _triton_dir() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return str(Path(triton.__file__).resolve().parent)


@functools.lru_cache(maxsize=64)
def _resolved(filename: str) -> str:
    return str(Path(filename).resolve())


def _is_tritons_own(fn: Any, root: str) -> bool:
    code = getattr(fn, "__code__", None)
    filename = getattr(code, "co_filename", "")
    return isinstance(filename, str) and bool(filename) and _resolved(filename).startswith(root + "/")


def _assert_launch_machinery_intact() -> None:
    root = _triton_dir()
    if root is None:
        return
    for module, cls_name, attr in _LAUNCH_MACHINERY:
        cls = _triton_class(module, cls_name)
        if cls is None or attr not in vars(cls):
            continue
        if not _is_tritons_own(vars(cls)[attr], root) and vars(cls)[attr] not in _OWN_LAUNCH_WRAPPERS:
            raise ForbiddenCall(
                f"Triton's launch machinery was changed: {cls_name}.{attr} is not Triton's own. Code that runs "
                "inside a launch is trusted as kernel code, so the call cannot be graded; launch your kernels "
                "with kernel[grid](...) and leave Triton's runtime as it is."
            )


def _check_launch(kernel: Any) -> None:
    """Refuse a launch that would run host code of the student's inside it (hooks, patched methods)."""
    name = getattr(kernel, "__name__", "kernel")
    if getattr(kernel, "pre_run_hooks", None):
        raise ForbiddenCall(
            f"the kernel {name} has pre-run hooks: code that runs inside a launch is trusted as kernel code, so a "
            "hook would be host code that escapes the rule. Do that work in the kernel or before the launch."
        )
    hook = _runtime_hook_set()
    if hook:
        raise ForbiddenCall(f"a Triton runtime hook is set (triton.knobs.runtime.{hook}): it would run host code "
                            "inside a launch, where code is trusted as kernel code. Remove it.")
    methods = {n for c in type(kernel).__mro__ for n, v in vars(c).items() if callable(v) or isinstance(v, property)}
    shadowed = sorted(set(vars(kernel)) & methods)
    if shadowed:
        raise ForbiddenCall(
            f"the kernel {name} has its method {shadowed[0]} replaced on the instance: code that runs inside a "
            "launch is trusted as kernel code. Launch your kernels with kernel[grid](...) as Triton made them."
        )


_RUNTIME_HOOKS = ("launch_enter_hook", "launch_exit_hook", "kernel_load_start_hook", "kernel_load_end_hook",
                  "jit_cache_hook", "jit_post_compile_hook", "add_stages_inspection_hook")


def _runtime_hook_set() -> str | None:
    """The name of a Triton runtime hook that holds a function (a HookChain with calls, or any other value)."""
    try:
        from triton import knobs
    except ImportError:
        return None
    for name in _RUNTIME_HOOKS:
        hook = getattr(knobs.runtime, name, None)
        calls = getattr(hook, "calls", None)
        if hook is not None and (calls is None or calls):
            return name
    return None


def _grid_dims(grid: Any) -> tuple[int, int, int] | None:
    try:
        dims = [int(d) for d in grid]
    except (TypeError, ValueError):
        return None
    if not 1 <= len(dims) <= 3:
        return None
    return tuple(dims + [1] * (3 - len(dims)))  # type: ignore[return-value]


def _tensors_of(value: Any) -> Iterator[torch.Tensor]:
    """The tensor a launch argument is, or wraps (triton.reinterpret's TensorWrapper, a tensor descriptor's base)."""
    if isinstance(value, torch.Tensor):
        yield value
        return
    base = getattr(value, "base", None)
    if isinstance(base, torch.Tensor):
        yield base


def _tensor_storages(values: Iterable[Any]) -> frozenset[int]:
    found = set()
    for value in values:
        for t in _tensors_of(value):
            try:
                found.add(storage_of(t))
            except RuntimeError:  # a tensor without storage (meta, a subclass)
                pass
    return frozenset(found)


_LAUNCH_SCALARS = (bool, int, float, str, type(None), torch.dtype)
_LAUNCH_OPTIONS = ("grid", "warmup")  # the launcher's own keywords, checked where they are used


@functools.lru_cache(maxsize=1)
def _triton_arg_types() -> tuple[frozenset[type], frozenset[type], frozenset[type]]:
    """(Triton's tensor wrappers, its dtype and constexpr classes, numpy's scalar types): exact classes whose
    methods are the libraries' own."""
    import numpy as np

    wrappers, values = set(), set()
    try:
        from triton.runtime.jit import TensorWrapper
        wrappers.add(TensorWrapper)
    except ImportError:
        pass
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
        wrappers.add(TensorDescriptor)
    except ImportError:
        pass
    try:
        import triton.language as tl
        values |= {tl.constexpr, tl.dtype, tl.pointer_type}
    except (ImportError, AttributeError):
        pass
    numbers = frozenset(t for t in set(np.sctypeDict.values()) if t.__module__ == "numpy")
    return frozenset(wrappers), frozenset(values), numbers


def _launch_argument_refused(value: Any, depth: int = 0) -> str | None:
    """Why `value` may not be handed to a kernel launch (None when it may). Inside a launch the kernel rule
    is suspended, and the launcher calls methods of its arguments (data_ptr, untyped_storage, stride): an
    object of the student's own, or a subclass of Tensor, would run host code there unwatched. So a launch
    takes exact tensors, Triton's own wrappers of them, numbers, strings, dtypes, and tuples of those."""
    kind = type(value)
    if kind in _LAUNCH_SCALARS:
        return None
    if kind is torch.Tensor or kind is torch.nn.Parameter:
        # A tensor's own attributes (t.data_ptr = f) would shadow its methods for the launcher's duck typing.
        return f"a tensor with attributes of its own ({', '.join(sorted(map(str, _own(value))))[:80]})" if _own(value) \
            else None
    wrappers, values, numbers = _triton_arg_types()
    if kind in numbers:
        return None
    if kind in wrappers:  # every field: the base tensor, its shape, strides, device, dtype, padding
        fields = object.__getattribute__(value, "__dict__")
        if type(fields.get("base")) not in (torch.Tensor, torch.nn.Parameter):
            return f"a {type_name(kind)} over {type_name(type(fields.get('base')))}"
        for field_value in dict.values(fields):
            why = None if type(field_value) in (torch.device, torch.Size) else _launch_argument_refused(field_value, depth + 1)
            if why:
                return f"a {type_name(kind)} holding {why}"
        return None
    if kind in values:  # a constexpr, dtype or pointer type: only the fields Triton gives one, of plain values
        fields = _own(value)
        extra = set(map(str, fields)) - _TRITON_FIELDS.get(type_name(kind), frozenset())
        if extra:
            return f"a {type_name(kind)} with attributes Triton never sets ({', '.join(sorted(extra))[:80]})"
        for field_value in dict.values(fields):
            why = None if type(field_value) in _triton_field_types() else (
                "a value nested too deep" if depth > 4 else _launch_argument_refused(field_value, depth + 1))
            if why:
                return f"a {type_name(kind)} holding {why}"
        return None
    if kind in (tuple, list) and depth <= 4:
        for item in (tuple.__iter__(value) if kind is tuple else list.__iter__(value)):
            why = _launch_argument_refused(item, depth + 1)
            if why:
                return why
        return None
    return f"an object of type {type_name(kind)}"


def _own(value: Any) -> dict:
    """An object's own attributes, read without calling anything of its class."""
    try:
        fields = object.__getattribute__(value, "__dict__")
    except AttributeError:
        return {}
    return fields if type(fields) is dict else {"__dict__": fields}


# The attributes Triton itself gives its values (triton 3.x): anything else was set by the student's code.
_TRITON_FIELDS = {
    "constexpr": frozenset({"value", "type"}),
    "dtype": frozenset({"name", "primitive_bitwidth", "itemsize", "fp_mantissa_width", "exponent_bias", "int_signedness",
                        "int_bitwidth", "fp_exponent_width"}),
    "pointer_type": frozenset({"element_ty", "address_space", "const", "name"}),
}


@functools.lru_cache(maxsize=1)
def _triton_field_types() -> frozenset[type]:
    """Classes of Triton's own that its values hold as fields (a constexpr's type, a dtype's signedness)."""
    try:
        import triton.language as tl
        return frozenset({tl.core.constexpr_type, tl.dtype.SIGNEDNESS, tl.dtype, tl.pointer_type})
    except (ImportError, AttributeError):
        return frozenset()


def _check_arguments(name: str, args: tuple, kwargs: dict) -> None:
    for key, value in [*enumerate(args), *((k, v) for k, v in kwargs.items() if k not in _LAUNCH_OPTIONS)]:
        why = _launch_argument_refused(value)
        if why:
            where = f"argument {key}" if isinstance(key, int) else f"argument {key!r}"
            raise ForbiddenCall(
                f"the kernel {name} was launched with {why} as its {where}: a launch takes tensors (exactly "
                "torch.Tensor, or triton.reinterpret of one), numbers, strings and dtypes. Code that runs inside a "
                "launch is trusted as kernel code, and the launcher calls methods of its arguments, so an object "
                "of your own (or a subclass of Tensor) would run host code there. Pass the tensors themselves."
            )


# The launch options a compile takes (Triton's CUDA options), recorded beside a launch's arguments.
COMPILE_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion")


def describe_argument(value: Any, depth: int = 0) -> dict:
    """A launch argument as the plain data a compile needs (grader.kernelmodel builds Triton's signature from it):
    {"kind": "tensor", "dtype": "float16", "aligned": bool (its first element on a 16-byte boundary)}, {"kind":
    "int" | "float" | "bool" | "str", "value": ...}, {"kind": "none"}, {"kind": "dtype", "value": "fp16" or
    "float16"} (a Triton or torch dtype), {"kind": "tuple", "items": [...]}, or {"kind": "other", "type": name}.
    Arguments reach here already checked (`_check_arguments`): exact tensors, numbers, strings and dtypes, so
    nothing of the student's own class runs."""
    wrappers, values, numbers = _triton_arg_types()
    kind = type(value)
    wrapped = kind in wrappers and kind.__name__ == "TensorWrapper" and type(getattr(value, "base", None)) is torch.Tensor
    if kind is torch.Tensor or wrapped:
        tensor = value.base if wrapped else value
        dtype = value.dtype  # triton.reinterpret's TensorWrapper holds a Triton dtype
        address = _STORAGE_DATA_PTR(_TENSOR_STORAGE(tensor)) + _TENSOR_OFFSET(tensor) * _TENSOR_ELEMENT_SIZE(tensor)
        return {"kind": "tensor", "dtype": str(dtype).rsplit(".", 1)[-1], "aligned": address % 16 == 0}
    if kind is bool:
        return {"kind": "bool", "value": value}
    if kind is int:
        return {"kind": "int", "value": value}
    if kind is float:
        return {"kind": "float", "value": value}
    if kind is str:
        return {"kind": "str", "value": value[:200]}
    if value is None:
        return {"kind": "none"}
    if kind is torch.dtype:
        return {"kind": "dtype", "value": str(value).rsplit(".", 1)[-1]}
    if kind in numbers:
        plain = value.item()
        return describe_argument(plain, depth) if type(plain) in (bool, int, float) else {"kind": "other", "type": kind.__name__}
    if kind in values:
        if kind.__name__ == "constexpr":
            return describe_argument(value.value, depth + 1) if depth < 4 else {"kind": "other", "type": "constexpr"}
        return {"kind": "dtype", "value": str(value)}  # a tl.dtype (tl.float16 reads 'fp16'); a pointer type: 'pointer<fp16>'
    if kind in (tuple, list) and depth < 4:
        return {"kind": "tuple", "items": [describe_argument(item, depth + 1) for item in value][:64]}
    return {"kind": "other", "type": kind.__name__}


def _describe_launch(fn: Any, args: tuple, kwargs: dict) -> tuple[dict[str, dict] | None, dict[str, Any] | None]:
    """(arguments by parameter name, options) of a launch, or (None, None) where it cannot be described."""
    try:
        names = list(getattr(fn, "arg_names", None) or [])
        if len(args) > len(names):
            return None, None
        arguments = {name: describe_argument(value) for name, value in zip(names, args)}
        options = {}
        for key, value in kwargs.items():
            if key in _LAUNCH_OPTIONS:
                continue
            if key in names:
                arguments[key] = describe_argument(value)
            elif key in COMPILE_OPTIONS and type(value) in (int, bool, type(None)):
                options[key] = value
        return arguments, options
    except Exception:  # a description never breaks a launch: the kernel model reports the gap
        return None, None


def _wrap_run(cls: type, original: Any) -> Any:
    def run(self, *args, **kwargs):
        if type(self) is not cls:
            return original(self, *args, **kwargs)  # a subclass's run is not Triton's: no launch, no suspension
        _check_launch(self)
        _check_arguments(getattr(self, "__name__", "kernel"), args, kwargs)
        if not kwargs.get("warmup"):  # a warm-up only compiles: not recorded
            launch = Launch(getattr(self, "__name__", "kernel"), storages=_tensor_storages((*args, *kwargs.values())))
            if _ACTIVE_LOGS:  # described only for a record (a timed loop's launches pay nothing)
                launch.arguments, launch.options = _describe_launch(self, args, kwargs)
            grid = kwargs.get("grid")
            if callable(grid):
                def resolve(meta, _grid=grid):
                    # The grid callable is the student's host code, run by the launcher: the rule holds there.
                    depth, _LAUNCH_STATE.depth = _LAUNCH_STATE.depth, 0
                    _LAUNCH_MEMORY.host += 1  # and it may not load or store through the interpreter (_check_lanes)
                    try:
                        dims = _grid(meta)
                    finally:
                        _LAUNCH_STATE.depth = depth
                        _LAUNCH_MEMORY.host -= 1
                    launch.grid = _grid_dims(dims)
                    return dims
                kwargs["grid"] = resolve
            else:
                launch.grid = _grid_dims(grid)
            for log in list(_ACTIVE_LOGS):
                log.append(launch)
        # Under a bounded interpreter only Triton's own steps of the launch are suspended (bound_interpreter_memory)
        whole = not (_BOUND["installed"] and cls.__name__ == "InterpretedFunction")
        _LAUNCH_STATE.depth += whole
        try:
            return original(self, *args, **kwargs)
        finally:
            _LAUNCH_STATE.depth -= whole

    run.__wrapped__ = original  # type: ignore[attr-defined]
    return run


@contextlib.contextmanager
def watching_launches() -> Iterator[None]:
    """Wrap Triton's launchers (`JITFunction.run`, `InterpretedFunction.run`) for the block: each launch is
    checked, recorded in every active `recording_launches` log, and suspends the kernel rule while it runs.
    Nested blocks share one installation."""
    with _WATCH_LOCK:
        if _WATCH["depth"] == 0:
            _assert_launch_machinery_intact()
            restore = []
            for module, cls_name in _LAUNCHERS:
                cls = _triton_class(module, cls_name)
                if cls is not None and "run" in vars(cls):
                    original = vars(cls)["run"]
                    cls.run = _wrap_run(cls, original)  # type: ignore[attr-defined]  # Triton's launcher, found by name
                    restore.append((cls, original))
            _WATCH["restore"] = restore
        _WATCH["depth"] += 1
    try:
        yield
    finally:
        with _WATCH_LOCK:
            _WATCH["depth"] -= 1
            if _WATCH["depth"] == 0:
                for cls, original in _WATCH["restore"]:
                    cls.run = original
                _WATCH["restore"] = []


@contextlib.contextmanager
def recording_launches() -> Iterator[LaunchLog]:
    """The Triton launches made in the block, in order (a driver returns them for a coverage check); under
    the kernel rule it also follows their results through the host's copies (`LaunchLog.derived`)."""
    log = LaunchLog()
    with watching_launches():
        _ACTIVE_LOGS.append(log)
        try:
            yield log
        finally:
            _ACTIVE_LOGS.remove(log)


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


# --------------------------------------------------------------------------------------------------
# Layer 1: the named attributes, patched for the call


def _restore(patched: list[tuple[Any, str, Any]]) -> None:
    """Undo patches, last first; an attribute a class only inherited is deleted, not set."""
    for owner, attr, original in reversed(patched):
        if original is _INHERITED:
            delattr(owner, attr)
        else:
            setattr(owner, attr, original)


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
            if name in RULES:
                continue
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
        _restore(patched)


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


@contextlib.contextmanager
def around_call(filename: str, forbid: Iterable[str] = (), forbid_why: str = "", count_lines: bool = False):
    """Apply the requested probes around one call; yields the WorkCounter (or None)."""
    with forbidden(forbid, forbid_why):
        if count_lines:
            with WorkCounter(filename) as counter:
                yield counter
        else:
            yield None


# -- Kernel memory under Triton's interpreter: a kernel touches only the tensors handed to its launch
#
# On the CPU, TRITON_INTERPRET=1 runs a kernel's loads and stores on raw host addresses. A kernel that casts an
# integer to a pointer (`addr.to(tl.pointer_type(tl.float32))`) reads and writes any memory of the worker: the red
# team copied x into a Python array's buffer from a kernel, computed the softmax there with numpy, and copied it
# back (online_softmax 90 of 100, "is a Triton kernel" passed), and the same write reaches the probes' own memory.
# Every memory access of the interpreter goes through four functions of its native module; `bound_interpreter_memory`
# replaces that module, for the worker's life and before the student's code is imported, by one that checks each
# active lane's address against the storages of the tensors the launch was handed (recorded when the interpreter
# sets up the launch's host arguments, their addresses read again at every access). On CUDA a kernel's addresses
# are the device's, and this does not apply.

class _LaunchMemory(threading.local):
    def __init__(self) -> None:
        # per running launch (innermost last): the storages of the tensors it was handed, kept alive. Their
        # addresses are read at every access, never cached: a kernel body's host code (Python under the
        # interpreter) can resize a storage mid-launch, and the old chunk, freed, must not stay in bounds
        # (the red team's round 8 wrote through such stale bounds into a list that took the chunk).
        self.stack: list[list[Any]] = []
        # > 0 while the student's grid callable runs inside a launch: the interpreter has switched tl.load and
        # tl.store to host code by then, and a grid function that loaded a row, ran numpy on its raw array and
        # stored it scored full marks with a kernel that did nothing (red team round 10). Only a body loads.
        self.host = 0


_LAUNCH_MEMORY = _LaunchMemory()
_BOUND: dict[str, Any] = {"installed": False}
_OWN_LAUNCH_WRAPPERS: set[Any] = set()  # our wrappers of Triton's launch machinery (_assert_launch_machinery_intact)


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
