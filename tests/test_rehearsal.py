"""The CPU rehearsal of the CUDA-only checks (grader/rehearsal.py): every CUDA test body runs here, tiny, before a
GPU ever runs it, and a rehearsal never earns a point."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import COURSE, ROOT, grade_folder

pytestmark = pytest.mark.xdist_group("rehearsal")

CUDA_EXERCISES = sorted({e.id for e in COURSE.exercises if any(c.cuda for c in e.checks)})


def cuda_tests(result: dict) -> list[tuple[str, str, dict]]:
    return [(ex["id"], check["id"], test) for ex in result["exercises"] for check in ex["checks"]
            for test in check["tests"] if test["message"].startswith("rehearsed on the CPU")]


@pytest.fixture(scope="module")
def rehearsed(tmp_path_factory):
    """One rehearsal grade of the reference solutions and one of the stubs, CUDA tests only."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the CUDA checks run for real, there is nothing to rehearse")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GRADER_REHEARSAL", "only")
        results = {}
        for kind, source in (("reference", "solutions"), ("stub", "exercises")):
            folder = tmp_path_factory.mktemp(kind)
            for exercise in CUDA_EXERCISES:
                shutil.copytree(ROOT / source / exercise, folder / exercise,
                                ignore=shutil.ignore_patterns("test_*", "README.md", "__pycache__"))
            results[kind] = grade_folder(folder, CUDA_EXERCISES)
    return results


def test_every_cuda_test_of_the_reference_runs_through_on_the_cpu(rehearsed):
    tests = cuda_tests(rehearsed["reference"])
    expected = sum(1 for ex in rehearsed["reference"]["exercises"] for check in ex["checks"]
                   for test in check["tests"] if check["cuda"] or test["status"] == "not_graded")
    assert tests and len(tests) == expected, (
        f"every CUDA test should be rehearsed; {len(tests)} of {expected} were")
    broken = [f"{ex}/{check}/{test['name']}: {test['message']}" for ex, check, test in tests
              if test["message"] != "rehearsed on the CPU: passed"]
    assert not broken, ("a CUDA test of the reference did not run through on the CPU: a name, a shape or a "
                        "driver that would fail on the GPU first:\n" + "\n".join(broken))
    speed_checks = [test for _, check, test in tests if "speed" in check]
    assert speed_checks and all("rehearsal_fraction" in t["metrics"] for t in speed_checks), (
        "each speed check's scoring path (ceilings, the timing loop, the wall-clock bound, the fraction) ran")
    assert {ex for ex, _, _ in tests} == set(CUDA_EXERCISES)


def test_a_rehearsal_never_earns_a_point(rehearsed):
    for kind, result in rehearsed.items():
        for _, _, test in cuda_tests(result):
            assert test["status"] == "not_graded" and test["fraction"] == 0.0, (kind, test)
        for ex in result["exercises"]:
            for check in ex["checks"]:
                if check["cuda"]:
                    assert check["points"] == 0.0 and check["status"] == "not_graded", (kind, ex["id"], check)
        assert result["score"] == 0.0, f"the {kind}'s rehearsal ran only the CUDA tests: it scores nothing"


def test_the_stubs_rehearsal_reports_what_failed(rehearsed):
    tests = cuda_tests(rehearsed["stub"])
    assert tests and all(t["message"] != "rehearsed on the CPU: passed" for _, _, t in tests), (
        "a stub does nothing, so no CUDA test of it can pass its rehearsal")
    assert all("NotImplementedError" in t["message"] or "failed" in t["message"] for _, _, t in tests), [
        t["message"][:120] for _, _, t in tests]
