"""What every probe stands on: the error they raise, dispatch modes entered and left under check, and the
probes' own integrity, sealed by identity.

* `ForbiddenCall`, and `GuardRemoved` when a guard was not where it was put when the call ended.
* `_enter_mode` / `_leave_mode`: push and pop a `TorchDispatchMode` through references to torch's functions
  taken when this module is imported (before any student code), checking the mode stack each time.
* `_install` / `seal` / `assert_sealed`: the attributes the probes install on torch's and Triton's, and every
  name of the probe modules (`PROBE_MODULES`), recorded by identity before the student's module is imported;
  a guarded call that rebinds one fails.
* `_resolve`: a dotted name to (owner, attribute), for the patches.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any, Mapping

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


class GuardRemoved(ForbiddenCall):
    """The operator guard was not where it was put when the call ended: the call changed the mode stack."""


# -- The probes' own integrity, checked by identity when each guarded call ends
#
# The scan keeps a submission away from these modules; this is the backstop for a way past it. The probes are
# the functions and classes of `PROBE_MODULES` and the attributes they install on torch's and Triton's (the
# host-read watch, the interpreter's bound, the launch wrappers). `seal()` records each by identity before the
# student's module is imported; `assert_sealed()` (at the end of every guarded call) fails the call if any was
# rebound, so a submission that swapped `in_launch` or `OperatorGuard.__torch_dispatch__` loses the call it did it in.

PROBE_MODULES = (
    "grader.harness.integrity", "grader.harness.opfamilies", "grader.harness.kernel_rule", "grader.harness.launches",
    "grader.harness.host_reads", "grader.harness.interpreter_bound", "grader.harness.guard", "grader.harness.counters",
    "grader.harness.probes",
)
_MISSING = object()
_INSTALLED: list[tuple[Any, str, Any]] = []  # (owner, attribute, what the probes put there), for good
_SEAL: dict[str, Any] = {}


def _install(owner: Any, attr: str, value: Any) -> None:
    """setattr, remembered: the attribute must still be `value` whenever a guarded call ends."""
    setattr(owner, attr, value)
    _INSTALLED.append((owner, attr, value))


def _own_classes(module: Any) -> list[type]:
    return [v for v in dict.values(vars(module)) if isinstance(v, type) and v.__module__ == module.__name__]


def _digest() -> list[tuple[Mapping[str, Any], int, list[tuple[str, Any]]]]:
    """(namespace, how many names it holds, every (name, object) in it) for each probe module and its classes."""
    spaces: list[Mapping[str, Any]] = []
    for name in PROBE_MODULES:
        module = importlib.import_module(name)
        spaces += [vars(module), *(vars(c) for c in _own_classes(module))]
    return [(space, len(space), list(space.items())) for space in spaces]


def _probe_installation_flags() -> tuple[bool, bool]:
    from grader.harness.host_reads import _READS
    from grader.harness.kernel_rule import _BOUND

    return _BOUND["installed"], _READS["installed"]


def seal() -> None:
    """Record the probes by identity (the worker calls this after installing them, before the student's import)."""
    _SEAL["digest"] = _digest()
    _SEAL["flags"] = _probe_installation_flags()


def _unsealed() -> str | None:
    for owner, attr, value in _INSTALLED:
        if vars(owner).get(attr) is not value:
            return f"{getattr(owner, '__name__', type_name(type(owner)))}.{attr}"
    for space, size, items in _SEAL["digest"]:
        where = space.get("__qualname__") or space.get("__name__")
        if len(space) != size:
            return f"a name added to or removed from {where}"
        for name, value in items:
            if space.get(name, _MISSING) is not value:
                return f"{where}.{name}"
    if _probe_installation_flags() != _SEAL["flags"]:
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
