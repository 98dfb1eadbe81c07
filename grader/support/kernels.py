"""A driver for the Triton-contract checks: which kernels a call launched, and what they were handed.

It runs where the student's code runs (the worker), inside the same probes as any call of the module
it came from: with the kernel rule (grader.harness.kernel_rule.KERNELS_ONLY) the host code is held to the
allow-list while the launches are recorded here. What it returns is plain data for the trusted test
to judge: a launch's kernel name, its grid and its number of programs, its arguments' Triton types and its
constexprs and options (what grader.kernelmodel compiles it with, on the trusted side), and for each tensor the call
returned, whether a launch was handed that tensor's memory, or the host copied or cast it from memory
a launch was handed (an output neither way was not written by a kernel).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._pytree import tree_leaves

from grader.harness import kernel_rule


def launches(fn: Callable, *args: Any, **kwargs: Any) -> dict:
    """``fn(*args, **kwargs)`` with its Triton launches recorded.

    Returns {"out": the result, "launches": [{"kernel", "grid", "programs", "arguments", "options"}] in launch
    order (arguments and options: what a compile of the launch needs, grader.harness.launches.describe_argument),
    "handed": [bool] for each tensor in the result (flattened in order): a launch received its storage, or
    the host copied it from one that did (followed under the kernel rule)}.
    """
    from grader.harness.launches import recording_launches  # imported here: `launches` is this function's name

    with recording_launches() as log:
        out = fn(*args, **kwargs)
    handed = log.kernel_storages()
    outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    return {
        "out": out,
        "launches": [{"kernel": launch.kernel, "grid": list(launch.grid) if launch.grid else None,
                      "programs": launch.programs, "arguments": launch.arguments, "options": launch.options}
                     for launch in log],
        "handed": [kernel_rule.storage_of(t) in handed for t in outputs],
    }
