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


@pytest.fixture(params=["warm", "cold"])
def worker_start(request, monkeypatch) -> str:
    """A worker that this test starts directly (a StudentSession, no runner) starts as a grade's would: forked
    from this process's zygote (grader/harness/zygote.py), or cold, as on a GPU host. Use it in a module's
    tests through `pytestmark = pytest.mark.usefixtures("worker_start")`."""
    from grader.harness import zygote
    from grader.runner import worker_zygote

    if request.param == "cold":
        monkeypatch.delenv(zygote.ENV_VAR, raising=False)
        return "cold"
    server = worker_zygote()
    if server is None:
        pytest.skip("no zygote on this machine (GRADER_COLD_START=1, not Linux, or a GPU): the cold start is the one")
    monkeypatch.setenv(zygote.ENV_VAR, server.handle())
    return "warm"


def checks_of(result: dict, exercise_id: str) -> dict[str, dict]:
    ex = next(e for e in result["exercises"] if e["id"] == exercise_id)
    return {c["id"]: c for c in ex["checks"]}


def left_running() -> list[int]:
    """Processes below this one but the fork servers it keeps between grades (grader/forkserver.py)."""
    from grader.proctree import descendants
    from grader.runner import warm_server_pids

    keep = warm_server_pids()
    return [p for p in descendants(os.getpid()) if p not in keep]


# The suite's cost per exercise (issue "Exercise kit": each added exercise must stay cheap in CI): every test's
# setup, call and teardown seconds go to the one exercise its id names (a file such as test_messages_gptq.py, or
# a parameter such as [paged_kv-one_tile_kernel]); a test naming none or several is "shared". Summed over the
# xdist workers, so the total is test-seconds, not the wall time. Printed at the end of every run.
_SECONDS: dict[str, list[float]] = {}


def exercise_of(nodeid: str) -> str:
    named = {e.id for e in COURSE.exercises if e.id in nodeid}
    return named.pop() if len(named) == 1 else "shared"


def pytest_runtest_logreport(report) -> None:
    tally = _SECONDS.setdefault(exercise_of(report.nodeid), [0, 0.0])
    tally[0] += report.when == "call"
    tally[1] += report.duration


def pytest_terminal_summary(terminalreporter, config) -> None:
    if hasattr(config, "workerinput") or not _SECONDS:  # an xdist worker: the controller prints the whole run's
        return
    terminalreporter.write_sep("=", "test seconds per exercise (setup + call + teardown, summed over workers)")
    order = [e.id for e in COURSE.exercises if e.id in _SECONDS] + (["shared"] if "shared" in _SECONDS else [])
    for name in order:
        tests, seconds = _SECONDS[name]
        terminalreporter.write_line(f"{name:<16} {tests:>5} tests {seconds:>8.0f} s")
    total = sum(s for _, s in _SECONDS.values())
    terminalreporter.write_line(f"{'all':<16} {sum(t for t, _ in _SECONDS.values()):>5} tests {total:>8.0f} s")
