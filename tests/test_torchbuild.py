"""The torch a machine grades with is one CI tests, or grading refuses (grader/torchbuild.py).

The grading process reads the installed torch from torch/version.py's text (it never imports torch), so these
tests make it see another version by replacing that reading; the grade's own processes are real.
"""

from __future__ import annotations

import torch

from grader import torchbuild
from tests.conftest import ROOT, grade_folder

SUBMISSION = ROOT / "solutions"
ONE_CHECK = dict(checks=["normalizer_public"], tests="public", seed=3)


def pretend(monkeypatch, version: str, cuda: str | None) -> None:
    """The grading process sees this torch (it reads torch's version file; nothing here imports torch)."""
    monkeypatch.setattr(torchbuild, "installed", lambda: torchbuild.TorchBuild(version, cuda))


def test_the_installed_torch_is_read_as_torch_reports_it():
    build = torchbuild.installed()
    assert build is not None and build.version == torch.__version__, (build, torch.__version__)
    assert build.cuda == torch.version.cuda


def test_the_torch_ci_runs_on_is_a_tested_one():
    """CI's own torch must be in the list, or every grade in the project's tests would be refused; this also
    keeps the list, .ci/run and pyproject.toml's bounds telling one story."""
    build = torchbuild.installed()
    assert build is not None and build.tested, (
        f"the tests run on {build.describe() if build else 'no torch'}, which grader/torchbuild.py's TESTED "
        f"({list(torchbuild.TESTED)}) does not list: add it there only if CI runs it")
    import tomllib

    from packaging.requirements import Requirement
    from packaging.version import Version

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [Requirement(d).specifier for d in deps if Requirement(d).name == "torch"]
    tested = sorted(Version(v) for v in torchbuild.TESTED)
    assert all(v in spec for v in tested), f"pyproject.toml's torch range {spec} must admit every tested {tested}"
    low, high = tested[0], tested[-1]
    assert Version(f"{low.major}.{low.minor - 1}.99") not in spec, f"{spec} admits a torch older than {low}"
    assert Version(f"{high.major}.{high.minor + 1}.0") not in spec, f"{spec} admits a torch newer than {high}'s"
    assert all(str(v) in (ROOT / ".ci" / "run").read_text() for v in tested), ".ci/run must run every TESTED torch"


def test_an_untested_torch_refuses_to_grade_and_the_flag_grades_with_a_warning(monkeypatch):
    pretend(monkeypatch, "2.99.0+cu999", "99.9")
    result = grade_folder(SUBMISSION, ["online_softmax"], **ONE_CHECK)
    (exercise,) = result["exercises"]
    assert result["state"] == "error" and result["gradable"] is False and result["score"] == 0, result["state"]
    assert "torch 2.99.0+cu999 (CUDA 99.9 build)" in exercise["message"], exercise["message"]
    assert "--allow-untested-torch" in exercise["message"] and min(torchbuild.TESTED) in exercise["message"]

    result = grade_folder(SUBMISSION, ["online_softmax"], allow_untested_torch=True, **ONE_CHECK)
    assert result["state"] == "complete" and result["score"] > 0, "the flag grades as usual"
    assert any("2.99.0+cu999" in w and "--allow-untested-torch" in w for w in result["warnings"]), result["warnings"]


def test_a_tested_torch_grades_without_a_warning(monkeypatch):
    pretend(monkeypatch, f"{max(torchbuild.TESTED)}+cu130", "13.0")
    result = grade_folder(SUBMISSION, ["online_softmax"], allow_untested_torch=True, **ONE_CHECK)
    assert result["state"] == "complete" and result["score"] > 0, result["state"]
    assert not any("not run on" in w for w in result["warnings"]), result["warnings"]


def test_the_command_line_carries_the_flag():
    import argparse

    from grader.options import GradeOptions, add_grade_options

    parser = argparse.ArgumentParser()
    parser.add_argument("submission")
    add_grade_options(parser)
    assert GradeOptions.from_args(parser.parse_args(["x", "--allow-untested-torch"])).allow_untested_torch
    assert not GradeOptions.from_args(parser.parse_args(["x"])).allow_untested_torch
