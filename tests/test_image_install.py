"""docker/install.py's decisions, without Docker: which torch the grading image gets, and its C compiler.

The image's torch must be one CI tests (issue "Tested where it runs"): a base without one gets exactly
grader/torchbuild.py's IMAGE, never the newest release pip finds in pyproject's range. Triton builds its GPU
launcher with a C compiler, which a slim base lacks."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess

import pytest

from grader import torchbuild
from tests.conftest import ROOT


@pytest.fixture
def install(monkeypatch):
    spec = importlib.util.spec_from_file_location("docker_install", ROOT / "docker" / "install.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "COURSE", ROOT)
    return module


def test_the_image_torch_is_a_tested_one_read_without_importing(install):
    tested, image = install.tested_torch()
    assert tested == set(torchbuild.TESTED) and image == torchbuild.IMAGE
    assert image in tested, f"the image's torch {image} must be one CI tests: {sorted(tested)}"


@pytest.mark.parametrize("have,expected", [
    (None, f"torch=={torchbuild.IMAGE}"),          # a base without torch (python:3.11-slim)
    ("2.9.1+cu128", f"torch=={torchbuild.IMAGE}"),  # an official PyTorch image's untested torch
    ("2.14.2", f"torch=={torchbuild.IMAGE}"),      # in pyproject's range, but not a release CI ran
    (f"{torchbuild.IMAGE}+cu130", None),           # the image's own: kept
    ("2.13.0+cpu", None),                          # the full suite's: kept (the project's CPU test image)
])
def test_a_base_torch_ci_does_not_test_is_replaced_by_exactly_the_images(install, have, expected):
    assert install.torch_to_install(have, set(torchbuild.TESTED), torchbuild.IMAGE) == expected


def test_no_c_compiler_is_installed_when_the_build_says_none(install, monkeypatch, capsys):
    monkeypatch.setenv("C_COMPILER", "none")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail(f"ran {a}"))
    install.ensure_c_compiler()
    assert "interpreter only" in capsys.readouterr().out


def test_a_compiler_the_base_has_is_kept(install, monkeypatch, capsys):
    monkeypatch.delenv("C_COMPILER", raising=False)
    monkeypatch.setenv("CC", "/usr/bin/cc")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail(f"ran {a}"))
    install.ensure_c_compiler()
    assert "/usr/bin/cc" in capsys.readouterr().out


def test_gcc_is_installed_with_apt_where_the_base_has_no_compiler(install, monkeypatch):
    monkeypatch.delenv("C_COMPILER", raising=False)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/apt-get" if name == "apt-get" else None)
    ran = []
    monkeypatch.setattr(subprocess, "run", lambda args, **k: ran.append(args))
    install.ensure_c_compiler()
    assert any(args[:2] == ["apt-get", "install"] and "gcc" in args for args in ran), ran


def test_no_compiler_and_no_apt_is_a_clear_error(install, monkeypatch):
    monkeypatch.delenv("C_COMPILER", raising=False)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(SystemExit, match="expected a C compiler .* found neither.*C_COMPILER=none"):
        install.ensure_c_compiler()
