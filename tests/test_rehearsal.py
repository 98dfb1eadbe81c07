"""The CPU rehearsal of the CUDA-only checks (grader/rehearsal.py): every CUDA test body runs here, tiny, before a
GPU ever runs it, and a rehearsal never earns a point."""

from __future__ import annotations

import json

import pytest

from tests.conftest import COURSE, ROOT

pytestmark = pytest.mark.xdist_group("rehearsal")

CUDA_EXERCISES = sorted({e.id for e in COURSE.exercises if any(c.cuda for c in e.checks)})


def cuda_tests(result: dict) -> list[tuple[str, str, dict]]:
    return [(ex["id"], check["id"], test) for ex in result["exercises"] for check in ex["checks"]
            for test in check["tests"] if test["message"].startswith("rehearsed on the CPU")]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """`grader gpu-check --dry-run`'s grading steps: the reference solutions and the stubs, CUDA tests only."""
    import torch

    from grader import gpucheck

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the CUDA checks run for real, there is nothing to rehearse")
    out = tmp_path_factory.mktemp("gpu-check") / "gpu-check.json"
    report = gpucheck.run(COURSE, ROOT, out, budget_s=900, dry_run=True, only=["doctor", "reference", "stubs"])
    return report, json.loads(out.read_text())


@pytest.fixture(scope="module")
def rehearsed(dry_run):
    return dry_run[0].results


def test_the_dry_run_reports_every_cuda_test_and_no_problem(dry_run):
    report, written = dry_run
    assert written["ok"] and not written["problems"], written["problems"]
    assert written["dry_run"] and set(written["steps"]) == {"doctor", "reference", "stubs"}
    speed = written["steps"]["reference"]["speed"]
    assert {row["exercise"] for row in speed} == set(CUDA_EXERCISES), "every exercise with a speed check"
    assert all(row["outcome"] == "ran" and isinstance(row["achieved"], float) for row in speed), speed
    assert written["steps"]["stubs"]["cuda_points"] == 0


def test_the_dry_run_reports_each_exercise_s_peak_memory(dry_run):
    """Sampled while each exercise grades (the rehearsal samples the host's memory in place of the GPU's)."""
    memory = dry_run[1]["steps"]["reference"]["peak_memory_mib"]
    assert "stand-in" in memory["what"] and set(memory["per_exercise"]) == set(CUDA_EXERCISES), memory
    assert all(isinstance(mib, float) and mib >= 0 for mib in memory["per_exercise"].values()), memory


def test_peak_memory_is_kept_per_running_exercise():
    from grader.gpucheck import PeakMemory

    import itertools
    import time

    readings = itertools.chain([100.0], itertools.cycle([150.0, 400.0, 120.0]))
    memory = PeakMemory(lambda: next(readings), interval_s=0.001)
    with memory:
        memory.on_update({"exercises": [{"id": "a", "status": "running"}, {"id": "b", "status": "pending"}]})
        deadline = time.monotonic() + 30
        while memory.peaks.get("a") != 400.0 and time.monotonic() < deadline:
            time.sleep(0.01)
        memory.on_update({"exercises": [{"id": "a", "status": "complete"}, {"id": "b", "status": "complete"}]})
    assert memory.baseline == 100.0 and memory.above_baseline_mib() == {"a": 300.0}, memory.peaks


def test_the_known_wrong_step_grades_the_cuda_mutants(tmp_path):
    """Each known-wrong submission that loses a CUDA check is graded on those checks (rehearsed here, so a kept
    check is no problem: only a GPU can tell)."""
    from grader import gpucheck

    report = gpucheck.Report(dry_run=True, budget_s=600)
    gpucheck.step_known_wrong(report, COURSE, ROOT, tmp_path, exercises=["online_softmax"])
    rows = {row["mutant"]: row for row in report.steps["known_wrong"]}
    assert rows["softmax_triton_tiny_tiles"]["expected_losses"] == ["triton_speed"], rows
    assert not report.problems, report.problems


def test_the_dry_run_names_a_broken_cuda_test(monkeypatch, tmp_path):
    """A reference whose CUDA test does not run through is a problem the command exits 1 on."""
    from grader import gpucheck

    fake = {"exercises": [{"id": "online_softmax", "checks": [{"id": "triton_speed", "tests": [
        {"name": "test_triton_bandwidth[4096-8192]", "status": "not_graded", "fraction": 0.0,
         "message": "rehearsed on the CPU: error: NameError: name 'SPEED_N' is not defined", "metrics": {}}]}]}]}
    monkeypatch.setattr(gpucheck, "_grade", lambda *a, **k: fake)
    report = gpucheck.run(COURSE, ROOT, None, dry_run=True, only=["reference"])
    assert report.problems and "SPEED_N" in report.problems[0], report.problems


def test_the_bench_step_runs_a_bench_bounded(tmp_path):
    from grader import gpucheck

    report = gpucheck.Report(dry_run=True, budget_s=120)
    gpucheck.step_benches(report, COURSE, ROOT, timeout_s=60, exercises=["online_softmax"])
    (row,) = report.steps["benches"]
    assert row["outcome"] == "ok" and "softmax" in row["tail"], row
    report = gpucheck.Report(dry_run=True, budget_s=120)
    gpucheck.step_benches(report, COURSE, ROOT, timeout_s=0.5 + 10, exercises=["ring_allreduce"])
    assert report.steps["benches"][0]["outcome"] in ("bounded", "ok"), report.steps["benches"]


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
    tests = cuda_tests(rehearsed["stubs"])
    assert tests and all(t["message"] != "rehearsed on the CPU: passed" for _, _, t in tests), (
        "a stub does nothing, so no CUDA test of it can pass its rehearsal")
    assert all("NotImplementedError" in t["message"] or "failed" in t["message"] for _, _, t in tests), [
        t["message"][:120] for _, _, t in tests]


def test_the_docker_step_says_why_it_did_not_run(monkeypatch):
    """Without docker, without the image, or in a dry run, the docker step is skipped and named, never failed."""
    from grader import gpucheck

    monkeypatch.setattr(gpucheck.shutil, "which", lambda name: None)
    report = gpucheck.Report(dry_run=True, budget_s=60)
    gpucheck.step_docker(report, COURSE, ROOT, ROOT)
    assert report.skipped and "docker" in report.skipped[0] and not report.problems


def test_the_kernel_step_compiles_each_reference_launch_for_both_architectures(monkeypatch, tmp_path):
    from grader import gpucheck
    from grader.bench import kernel_resources

    one = kernel_resources.launches()[:1]  # the whole set is tests/test_reference_kernels_compile.py's
    monkeypatch.setattr(kernel_resources, "launches", lambda: one)
    report = gpucheck.run(COURSE, ROOT, tmp_path / "gpu-check.json", budget_s=600, dry_run=True, only=["kernels"])
    rows = report.steps["kernels"]
    assert [(r["kernel"], r["arch"]) for r in rows] == [(one[0].kernel, "sm_90"), (one[0].kernel, "sm_80")], rows
    assert all(r["registers"] and r["stack"] <= gpucheck.STACK_BOUND for r in rows), rows
    assert report.problems == [], report.problems


def test_the_kernel_step_names_a_kernel_that_spills(monkeypatch, tmp_path):
    from grader import gpucheck, kernelmodel
    from grader.bench import kernel_resources

    one = kernel_resources.launches()[:1]
    monkeypatch.setattr(kernel_resources, "launches", lambda: one)
    spills = kernelmodel.LaunchResources(one[0].kernel, {}, 4, 2, registers=255, stack=512, shared=0)
    monkeypatch.setattr(kernel_resources, "measure", lambda found: {(one[0].id(), a): spills for a in (90, 80)})
    report = gpucheck.run(COURSE, ROOT, tmp_path / "gpu-check.json", budget_s=600, dry_run=True, only=["kernels"])
    assert any("spills 512 bytes a thread on sm_80" in p for p in report.problems), report.problems
