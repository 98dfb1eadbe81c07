"""The forbidden-call guard, both layers around one call (`forbidden`):

1. `patched_attributes`: each named attribute raises `ForbiddenCall` for the call;
2. `operator_guard`: an `OperatorGuard` dispatch mode that fails every operator in the families the names reach
   (grader/harness/opfamilies.py) and every operator outside torch's own namespaces, in this thread and in the
   threads the call starts; with `KERNELS_ONLY` in the names, the kernel rule too (grader/harness/kernel_rule.py,
   with the launch watch and the host-read refusal).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterable, Iterator, Mapping

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from grader.harness.host_reads import host_reads_refused
from grader.harness.integrity import (
    _INHERITED, _THREAD_START, ForbiddenCall, _enter_mode, _leave_mode, _resolve, assert_sealed,
)
from grader.harness.kernel_rule import (
    _MEMORY_LOCK, _NAN, HOST_OPS, KERNELS_ONLY, RULES, UNINITIALISED, host_op_refused, in_launch,
)
from grader.harness.launches import _note_copies, watching_launches
from grader.harness.opfamilies import TORCH_NAMESPACES, OpFamily, _banned, operator_name

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


# --------------------------------------------------------------------------------------------------
# Layer 1: the named attributes, patched for the call


def _restore(patched: list[tuple[Any, str, Any]]) -> None:
    """Undo patches, last first; an attribute a class only inherited is deleted, not set."""
    for owner, attr, original in reversed(patched):
        if original is _INHERITED:
            delattr(owner, attr)
        else:
            setattr(owner, attr, original)



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
