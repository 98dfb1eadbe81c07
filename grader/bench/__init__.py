"""Benchmarks: `python -m grader.bench.<exercise>` prints figures as ratios against a baseline
measured in the same run (never a bare time). See each module's docstring.

Shared helpers: `load` a submission or reference file as a module, and `min_time` of a few runs
(on a shared CPU the minimum is the least disturbed figure).
"""

from __future__ import annotations

import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from grader.harness.worker import import_file


def load(path: Path, name: str = "submission") -> ModuleType:
    """Import a submission or reference file as a module named `name`."""
    return import_file(path, name)


def min_time(fn: Callable[[], Any], reps: int = 5) -> float:
    """The fastest of `reps` runs of fn(), in seconds."""
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best
