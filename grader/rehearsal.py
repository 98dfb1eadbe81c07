"""The CPU rehearsal of the CUDA-only checks: every line of them runs before a GPU ever does.

A GPU may be lent for a few minutes at a time, and none of that should go to finding a typo in a test that
only runs there. With ``GRADER_REHEARSAL=1`` (or ``only``, for the CUDA tests alone) on a machine without CUDA, the tests marked ``cuda`` are not
skipped: they run on the CPU, with tiny shapes, a few reps, fp16 in place of bf16 (the interpreter's bf16
``tl.dot`` multiplies raw bits), ceilings measured the same way on the CPU, and stand-ins for the calls that
exist only on CUDA (peak memory, nvidia-smi's clocks). So a missing name, a wrong shape, a driver that is not
there or a scoring path that raises fails in CI, not on the GPU.

A rehearsal is never scored. Each rehearsed test is reported "not graded" with what the rehearsal found
("rehearsed on the CPU: passed", or the failure), so its check stays outside the gradable total exactly as
an ordinary CPU grade leaves it: setting the variable can never earn a point. ``grader gpu-check --dry-run``
and tests/test_rehearsal.py run it; on a machine with CUDA the variable does nothing.

In a test: ``rehearsal.device()`` where the test would say ``"cuda"``, ``rehearsal.size(real, tiny)`` for a
shape or a count that is large on the GPU, ``rehearsal.dtype(torch.bfloat16)`` for bf16. The speed helpers
(grader/speed.py) cap reps and measure CPU ceilings by themselves.
"""

from __future__ import annotations

import os
from typing import TypeVar

ENV = "GRADER_REHEARSAL"
REPS = 2  # timed reps per loop in a rehearsal: enough to run the scoring path, too few to mean anything
PASSED = "rehearsed on the CPU: passed"

T = TypeVar("T")


def requested() -> bool:
    return os.environ.get(ENV) in ("1", "only")


def only() -> bool:
    """``GRADER_REHEARSAL=only``: run the CUDA tests alone (the others are deselected, so they score "not run")."""
    return os.environ.get(ENV) == "only"


def active() -> bool:
    """A rehearsal is running: asked for, and no CUDA device here (with one, the real checks run)."""
    if not requested():
        return False
    import torch

    return not torch.cuda.is_available()


def device() -> str:
    """Where a CUDA-only test puts its tensors: "cuda", or "cpu" in a rehearsal."""
    return "cpu" if active() else "cuda"


def size(real: T, tiny: T) -> T:
    """`real` on the GPU, `tiny` in a rehearsal (a shape, a length, a count)."""
    return tiny if active() else real


def reps(n: int) -> int:
    return min(n, REPS) if active() else n


def dtype(wanted):
    """bf16 becomes fp16 in a rehearsal: Triton's interpreter multiplies raw bits in a bf16 tl.dot."""
    import torch

    return torch.float16 if active() and wanted == torch.bfloat16 else wanted
