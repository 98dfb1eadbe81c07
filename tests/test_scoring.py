"""The rubric holds: references earn full marks, stubs earn nothing, known-wrong submissions lose
the checks they should. Every exercise in course.yaml is covered automatically."""

from __future__ import annotations

import re

import pytest
import torch

from grader import results
from tests.conftest import COURSE, ROOT, checks_of, grade_folder
from tests.known_wrong import first_failures, load_mutants, write_mutant

EXERCISES = [e.id for e in COURSE.exercises]
MUTANTS = [(e, m) for e in COURSE.exercises for m in load_mutants(e.id)]


_graded: dict[tuple[str, str], dict] = {}


def graded(folder: str, exercise_id: str) -> dict:
    """The reference (solutions/) or the stub (exercises/) of one exercise, graded once per test process."""
    if (folder, exercise_id) not in _graded:
        _graded[folder, exercise_id] = grade_folder(ROOT / folder, [exercise_id])
    return _graded[folder, exercise_id]


# Each exercise's reference and stub are graded in one test process, and the exercises in parallel: one group per
# exercise (eight grades on one worker made this file the suite's longest wait).
BY_EXERCISE = [pytest.param(e, marks=pytest.mark.xdist_group(f"reference-and-stub-{e}")) for e in EXERCISES]


@pytest.mark.parametrize("exercise_id", BY_EXERCISE)
def test_results_match_the_schema(exercise_id):
    results.validate(graded("solutions", exercise_id))
    results.validate(graded("exercises", exercise_id))


@pytest.mark.parametrize("exercise_id", BY_EXERCISE)
def test_reference_earns_full_marks_on_every_gradable_check(exercise_id):
    for check in checks_of(graded("solutions", exercise_id), exercise_id).values():
        if check["status"] == "not_graded":
            assert check["cuda"], f"{exercise_id}/{check['id']} was not graded but is not a CUDA check: {check['message']}"
            continue
        assert check["status"] == "passed" and check["points"] == check["max_points"], (
            f"the reference lost points on {exercise_id}/{check['id']}: {check['points']}/{check['max_points']} "
            f"({check['status']}): {check['message']}"
        )


@pytest.mark.parametrize("exercise_id", BY_EXERCISE)
def test_stub_earns_nothing(exercise_id):
    for check in checks_of(graded("exercises", exercise_id), exercise_id).values():
        assert check["points"] == 0, f"the stub earned {check['points']} on {exercise_id}/{check['id']}"
        assert check["status"] in ("error", "failed", "not_graded"), check


@pytest.mark.parametrize("exercise_id", EXERCISES)
def test_every_exercise_has_known_wrong_submissions(exercise_id):
    assert len(load_mutants(exercise_id)) >= 3, f"tests/known_wrong/{exercise_id}.py needs the bugs students really make"


@pytest.mark.parametrize("exercise,mutant", MUTANTS, ids=[f"{e.id}-{m.name}" for e, m in MUTANTS])
def test_known_wrong_submission_loses_its_checks(tmp_path, exercise, mutant):
    folder = write_mutant(ROOT, exercise, mutant, tmp_path / mutant.name)
    assert mutant.loses, f"mutant {mutant.name} must name the checks it loses"
    assert not set(mutant.loses) & set(mutant.keeps), f"mutant {mutant.name} both loses and keeps a check"
    # Only the checks it must lose or keep, each stopped at its first loss (first_failure): all this test needs.
    result = grade_folder(folder, [exercise.id], checks=[*mutant.loses, *mutant.keeps], first_failure=True)
    checks = checks_of(result, exercise.id)
    cuda_only = {c.id for c in exercise.checks if c.cuda} if not torch.cuda.is_available() else set()
    for check_id in sorted(cuda_only & set(mutant.loses)):
        # A CUDA check here is not graded, for any submission: `grader gpu-check` proves this loss on a GPU.
        assert checks[check_id]["status"] == "not_graded", (
            f"{mutant.name}: {check_id} is a CUDA check, which a host without CUDA must leave not graded, found "
            f"{checks[check_id]['status']}: {checks[check_id]['message']}"
        )
    for check_id in [c for c in mutant.loses if c not in cuda_only]:
        check = checks[check_id]
        assert check["points"] < check["max_points"], (
            f"{mutant.name} ({mutant.why}) should lose points on {check_id} but kept "
            f"{check['points']}/{check['max_points']}"
        )
    for check_id in [c for c in mutant.keeps if c not in cuda_only]:
        check = checks[check_id]
        assert check["points"] == check["max_points"], (
            f"{mutant.name} ({mutant.why}) computes the right numbers, so it should keep {check_id}, but scored "
            f"{check['points']}/{check['max_points']}: {check['message']}"
        )
    if mutant.cause:  # the first failing messages name the real bug, never another
        for visibility, (check_id, test, message) in first_failures(result, exercise.id, mutant.loses).items():
            assert re.search(mutant.cause, message, re.IGNORECASE), (
                f"{mutant.name} ({mutant.why}): the first failing {visibility} test, {check_id}/{test}, must name "
                f"the cause (/{mutant.cause}/), found: {message}")
    assert_no_hidden_source(result, exercise.id)


@pytest.mark.parametrize("exercise_id", EXERCISES)
def test_every_known_wrong_submission_declares_its_cause(exercise_id):
    """Each known-wrong submission names the cause its first failing messages must name (issue "The user's side",
    row 6): a message that blames another bug teaches the wrong fix."""
    silent = [m.name for m in load_mutants(exercise_id) if not m.cause]
    assert not silent, f"tests/known_wrong/{exercise_id}.py: give each mutant the cause its messages must name: {silent}"


def assert_no_hidden_source(result: dict, exercise_id: str) -> None:
    """Feedback must never quote the hidden tests' source."""
    hidden = ROOT / "grader" / "hidden" / exercise_id
    lines = {line.strip() for path in hidden.rglob("*.py") for line in path.read_text().splitlines()}
    lines = {line for line in lines if len(line) > 30 and not line.startswith(("#", '"', "f\"", "'"))}
    for check in checks_of(result, exercise_id).values():
        if check["visibility"] != "hidden":
            continue
        for test in check["tests"]:
            text = test["message"] + test["traceback"]
            leaked = [line for line in lines if line in text]
            assert not leaked, f"feedback for {check['id']}/{test['name']} quotes hidden test source: {leaked[0]!r}"
