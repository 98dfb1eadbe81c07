"""Benchmarks: `python -m grader.bench.<exercise>` prints figures as ratios against a baseline
measured in the same run (never a bare time). See each module's docstring.

Shared helpers: `load` a submission or reference file as a module, and `min_time` of a few runs
(on a shared CPU the minimum is the least disturbed figure).
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable


def load(path: Path, name: str = "submission") -> ModuleType:
    """Import a Python file as a module named `name` (registered in sys.modules, so dataclasses
    and pickling inside it work)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"expected a Python file at {path}, found none")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def min_time(fn: Callable[[], Any], reps: int = 5) -> float:
    """The fastest of `reps` runs of fn(), in seconds."""
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best
