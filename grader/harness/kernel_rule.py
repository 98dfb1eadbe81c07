"""The kernel rule: what the host code of a Triton-contract function may do outside a kernel launch.

`KERNELS_ONLY` (named in a forbid list) makes a call's work run inside @triton.jit kernels: outside a launch
only the operators in `HOST_OPS` may run, and an uninitialised floating-point allocation (`UNINITIALISED`) is
filled with NaN (grader/harness/guard.py applies both); the host may not read values back
(grader/harness/host_reads.py). This module holds the rule's lists, its messages (`host_op_refused`,
`host_read_refused`), and the state of launches in this thread (`in_launch`, the interpreter's per-launch memory,
`_MEMORY_LOCK`) that the guard, the launch watch and the interpreter's bound share.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from grader.harness.integrity import ForbiddenCall

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


# Held by an interpreted kernel's bounds check and its access (interpreter_bound._BoundedInterpreter), and by a
# resize_ or set_ under the guard (guard.OperatorGuard): another thread cannot move a storage between the two.
_MEMORY_LOCK = threading.RLock()


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
