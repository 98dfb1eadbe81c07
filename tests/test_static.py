"""Static checks over the whole tree, the code that runs only on CUDA and the hidden tests included: a
missing name or an unused variable fails here, not on the first GPU the course meets."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from tests.conftest import COURSE, ROOT


def test_pyflakes_rules_pass_everywhere():
    if importlib.util.find_spec("ruff") is None:
        pytest.fail("ruff is a dev dependency (pyproject.toml): install the project with its `dev` extra")
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", "."], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (
        "ruff's pyflakes rules ([tool.ruff] in pyproject.toml) found undefined names, unused variables or "
        f"redefinitions:\n{run.stdout}{run.stderr}")


def test_mypy_passes_on_the_grader():
    """mypy at its default strictness over grader/ ([tool.mypy] in pyproject.toml): a wrong annotation, a value
    that may be None where it is used, a call with the wrong arguments."""
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy is a dev dependency (pyproject.toml): install the project with its `dev` extra")
    run = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"mypy ([tool.mypy] in pyproject.toml) found type errors:\n{run.stdout}{run.stderr}"


@pytest.mark.parametrize("exercise_id", [e.id for e in COURSE.exercises])
def test_hidden_tests_import_without_warnings(exercise_id):
    """Each hidden test module imports with every warning an error (a deprecated call, an invalid escape)."""
    module = f"grader.hidden.{exercise_id}.test_hidden"
    run = subprocess.run([sys.executable, "-W", "error", "-c", f"import {module}"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, f"importing {module} with -W error failed:\n{run.stderr[-3000:]}"
