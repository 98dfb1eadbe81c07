"""Probes that run around one call into student code, in whichever process runs that code: `around_call`,
which the worker and the in-process session wrap each call in. The probes themselves live in modules of
their own (`integrity.PROBE_MODULES`):

  integrity.py          ForbiddenCall and GuardRemoved; dispatch modes entered and left under check; the seal
  opfamilies.py         what each forbidden public name reaches at the dispatcher (FORBIDDEN_OPS, families_by_rule)
  guard.py              the forbidden-call guard, both layers (forbidden, patched_attributes, operator_guard)
  kernel_rule.py        KERNELS_ONLY: what host code may do outside a Triton launch (HOST_OPS, the launch state)
  launches.py           kernel launches checked, recorded (LaunchLog, describe_argument), the rule suspended
  host_reads.py         read-back routes watched (HOST_READS): refused or counted; memory shared with numpy
  interpreter_bound.py  under TRITON_INTERPRET=1 a kernel touches only the tensors handed to its launch
  counters.py           LineCounter and WorkCounter (lines, operators, elements read back)

What they do together:

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
  these modules). That is what the trusted static scan (grader/harness/tamper.py) is for: the session
  scans the student's file in the grader's own process and fails every guarded call of a file that
  reaches for that machinery. grader/CHECKS.md says what each layer can and cannot prove.
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
* `WorkCounter(filename)` (``count_lines=True``): counts the lines of one source file executed during the call. The
  structural check for vectorisation: run at two input sizes, the count must not grow with the
  number of tokens. Deterministic on a noisy machine, unlike timing.

Both are used by the sandboxed worker and by the in-process runner, so the two modes agree. These
modules are imported before any student module (the worker and the session import them first), and
they keep their own references to the dispatch-mode functions they use (integrity.py), so that a
student module that replaces them at import time does not change what the guard does.
"""

from __future__ import annotations

import contextlib
from typing import Iterable

from grader.harness.counters import WorkCounter
from grader.harness.guard import forbidden


@contextlib.contextmanager
def around_call(filename: str, forbid: Iterable[str] = (), forbid_why: str = "", count_lines: bool = False):
    """Apply the requested probes around one call; yields the WorkCounter (or None)."""
    with forbidden(forbid, forbid_why):
        if count_lines:
            with WorkCounter(filename) as counter:
                yield counter
        else:
            yield None
