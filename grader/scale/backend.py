"""The interface between the scheduler and where grades run.

A `Backend` opens one `Slot` per lane of the batch; a slot grades one `Job` (one submission into one
result file) at a time and says how it went in a `JobRun`. The result file says the rest. Backends:
grader/scale/local.py (this machine) and grader/scale/container.py (docker, apptainer).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from grader.options import GradeOptions

BACKENDS = ("local", "docker", "apptainer")


class BackendError(ValueError):
    """A backend that cannot be made or used as asked (the message says what was expected and what was
    found): an unknown name, flags that do not go with it, a missing container runtime or image."""


@dataclass
class Job:
    id: str
    source: Path
    out: Path
    options: GradeOptions
    timeout_s: float


@dataclass
class JobRun:
    """How grading one submission went, from the backend's side (the result file says the rest)."""
    error: str | None = None  # None: the backend saw nothing wrong
    duration_s: float = 0.0


class Slot(Protocol):
    """One lane of the batch: grades one submission at a time, bound to at most one GPU."""

    def grade(self, job: Job) -> JobRun: ...

    def close(self) -> None: ...


class Backend(Protocol):
    name: str

    def fingerprint(self) -> str:
        """What besides the tests decides a grade (a container image digest); part of the resume key."""

    def open_slot(self, gpu: str | None) -> Slot: ...

    def stop(self) -> None:
        """Stop everything now (Ctrl-C): running grades die; their results stay "running"."""

