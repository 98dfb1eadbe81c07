"""Fixtures for the project's own tests: the course, and grading a folder through the real runner."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from grader.course import find_root, load_course
from grader.options import GradeOptions
from grader.runner import grade

ROOT = find_root(Path(__file__).parent)
COURSE = load_course(ROOT)


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def course():
    return COURSE


def grade_folder(folder: Path, exercises: list[str] | None = None, out: Path | None = None, **options) -> dict:
    """Grade a submission folder or archive with a fixed seed, exactly as `grader grade` would."""
    opts = GradeOptions(exercises=exercises, seed=options.pop("seed", 20261129), **options)
    return grade(COURSE, ROOT, folder, out, opts)


def checks_of(result: dict, exercise_id: str) -> dict[str, dict]:
    ex = next(e for e in result["exercises"] if e["id"] == exercise_id)
    return {c["id"]: c for c in ex["checks"]}


def left_running() -> list[int]:
    """Processes below this one but the fork servers it keeps between grades (grader/forkserver.py)."""
    from grader.proctree import descendants
    from grader.runner import warm_server_pids

    keep = warm_server_pids()
    return [p for p in descendants(os.getpid()) if p not in keep]
