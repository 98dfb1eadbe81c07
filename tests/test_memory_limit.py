"""A grade under a platform's memory limit (Gradescope's default is 768 MiB): it fits, or it is refused before it
starts as an error of the grade, never a score the OOM killer decided."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grader.bench.memory import remove_group
from tests.conftest import COURSE, ROOT, grade_folder

pytestmark = pytest.mark.xdist_group("memory_limit")

GRADESCOPE_MB = 768


def reference(tmp_path: Path, exercise_id: str) -> Path:
    folder = tmp_path / exercise_id
    shutil.copytree(ROOT / "solutions" / exercise_id, folder / exercise_id)
    return folder


def test_every_exercise_states_the_memory_its_grade_needs():
    missing = [e.id for e in COURSE.exercises if e.memory_mb is None]
    assert not missing, f"course.yaml should give memory_mb (a grade's measured peak) for {missing}"


def test_the_build_of_torch_is_read_without_importing_it():
    """The grader picks the memory figure for the installed build (a CUDA build's processes need about twice the
    host memory) from torch/version.py's text: the trusted side never imports torch."""
    import torch

    from grader.runner import torch_is_cuda_build

    assert torch_is_cuda_build() == (torch.version.cuda is not None), torch.__version__
    code = "import sys; from grader.runner import torch_is_cuda_build; torch_is_cuda_build(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False", "reading the build must not import torch"


def test_every_figure_is_for_its_build():
    """A CUDA build's figure is never below the CPU build's: each process importing it costs more."""
    low = [e.id for e in COURSE.exercises if e.memory_mb_cuda_torch and e.memory_mb
           and e.memory_mb_cuda_torch < e.memory_mb]
    assert not low, f"memory_mb_cuda_torch below memory_mb for {low}: measure both with python -m grader.bench.memory"


def test_an_exercise_that_does_not_fit_is_an_error_of_the_grade_not_a_score(tmp_path, monkeypatch):
    from grader.harness import cgroup

    from grader.runner import torch_is_cuda_build

    needs = COURSE.exercise("ring_allreduce").memory_needed(torch_is_cuda_build())
    monkeypatch.setattr(cgroup, "memory_limit_mb", lambda: needs - 1)
    result = grade_folder(reference(tmp_path, "ring_allreduce"), ["ring_allreduce"])
    (ex,) = result["exercises"]
    assert result["gradable"] is False and result["state"] == "error", result["state"]
    assert ex["status"] == "ungradable" and f"needs about {needs:,} MiB" in ex["message"], ex["message"]
    assert "raise the memory limit" in ex["message"] and "not a fault of the submission" in ex["message"]
    assert all(not c["tests"] or all(t["status"] != "passed" for t in c["tests"]) for c in ex["checks"])
    assert any("memory" in e for e in result["format_errors"]), result["format_errors"]


def _memory_cgroup(limit_mb: int) -> Path | None:
    """A fresh memory cgroup of `limit_mb`, or None where none can be made."""
    from grader.bench.memory import new_group

    try:
        return new_group(limit_mb)[0]
    except OSError:
        return None


@pytest.mark.skipif(os.geteuid() != 0, reason="making a memory cgroup needs root")
def test_a_gradescope_sized_grade_gets_full_marks_or_is_refused(tmp_path):
    """Under 768 MiB for the whole grade (grader, tests and worker together, as a Gradescope container counts
    them): the reference of an exercise that fits gets the marks it gets anywhere, and one that does not is
    refused before it starts, with the memory to set."""
    group = _memory_cgroup(GRADESCOPE_MB)
    if group is None:
        pytest.skip("no memory cgroup can be made on this machine")
    try:
        from grader.runner import torch_is_cuda_build

        cuda_torch = torch_is_cuda_build()
        needs = {e.id: e.memory_needed(cuda_torch) for e in COURSE.exercises}
        fits = [e for e, mb in needs.items() if mb and mb <= GRADESCOPE_MB]
        too_big = [e for e, mb in needs.items() if mb and mb > GRADESCOPE_MB]
        # With the CPU build (Gradescope's bundle installs it) online_softmax fits; with a CUDA build nothing does.
        assert too_big and (cuda_torch or "online_softmax" in fits), (fits, too_big)
        out = {}
        for exercise_id in [*fits[:1], too_big[0]]:
            path = tmp_path / f"{exercise_id}.json"
            script = (f"echo $$ > {group}/cgroup.procs && exec {sys.executable} -m grader grade "
                      f"{reference(tmp_path, exercise_id)} -e {exercise_id} --seed 5 --out {path}")
            proc = subprocess.run(["sh", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=900)
            assert path.is_file(), proc.stdout[-2000:] + proc.stderr[-2000:]
            out[exercise_id] = json.loads(path.read_text())
        for exercise_id in fits[:1]:
            fit = out[exercise_id]
            assert fit["state"] == "complete" and fit["score"] == fit["gradable_max_score"], (
                f"the reference {exercise_id} under {GRADESCOPE_MB} MiB scored {fit['score']} of "
                f"{fit['gradable_max_score']}: its memory figure for this build of torch is too low")
        refused = out[too_big[0]]
        assert refused["gradable"] is False and "raise the memory limit" in refused["exercises"][0]["message"]
    finally:
        remove_group(group)
