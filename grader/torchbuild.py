"""The torch this machine grades with, read from torch's version file without importing torch, and whether
the project's CI tests that version.

The guards, the dispatch modes, the operator families and the memory figures all depend on torch's version,
so a grade is only as good as the tests that ran on that torch. `TESTED` lists the versions CI runs
(`.ci/run`: the full suite on the first, a short suite on the others; README.md, "Tested torch"). A grade on
another version is an error of the grade, not a score, unless the instructor passes `--allow-untested-torch`;
then the result carries a warning that says so.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path

# version -> how CI runs it. Change this only together with .ci/run and pyproject.toml's bounds.
# The grading image's torch (docker/install.py installs exactly this one where the base image has no tested torch):
# the wheel CI's short suite runs on, a CUDA 13.0 build whose CUDA libraries come from PyPI with it.
IMAGE = "2.14.1"

TESTED = {
    "2.13.0": "the full suite, CPU build",
    "2.14.1": "a short suite (guards, probes, hostile files, every reference and stub, one exercise's "
              "known-wrongs), CUDA 13.0 build with no GPU; the grading image's torch",
}


@dataclass(frozen=True)
class TorchBuild:
    version: str  # as torch reports it: '2.14.1+cu130'
    cuda: str | None  # the CUDA version of a CUDA build, None for a CPU build

    @property
    def release(self) -> str:
        """The version without its local label: '2.14.1'."""
        return self.version.split("+")[0]

    @property
    def tested(self) -> bool:
        return self.release in TESTED

    def describe(self) -> str:
        return f"torch {self.version} ({f'CUDA {self.cuda}' if self.cuda else 'CPU'} build)"


def installed() -> TorchBuild | None:
    """The installed torch, from torch/version.py's text; None where torch is not installed or unreadable."""
    spec = importlib.util.find_spec("torch")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            tree = ast.parse((Path(folder) / "version.py").read_text())
        except (OSError, SyntaxError, ValueError):
            continue
        values: dict[str, object] = {}
        for node in tree.body:
            target: ast.expr
            value: ast.expr | None
            if isinstance(node, ast.AnnAssign):
                target, value = node.target, node.value
            elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            else:
                continue
            if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
                values[target.id] = value.value
        if isinstance(values.get("__version__"), str):
            cuda = values.get("cuda")
            return TorchBuild(str(values["__version__"]), cuda if isinstance(cuda, str) else None)
    return None


def untested_reason(allow_untested: bool) -> str | None:
    """Why this machine must not grade: its torch is not one CI tests (None where it is, or where allowed)."""
    build = installed()
    if build is None or build.tested or allow_untested:
        return None
    return (f"this machine has {build.describe()}, which the course's tests have not run on (tested: "
            f"{', '.join(TESTED)}); the guards and the memory figures depend on torch's version, so it did not "
            "grade. Install a tested torch (make setup), or pass --allow-untested-torch to grade anyway, with a "
            "warning in every result")


def untested_warning() -> str | None:
    """The warning a result carries when it was graded on an untested torch (--allow-untested-torch)."""
    build = installed()
    if build is None or build.tested:
        return None
    return (f"graded on {build.describe()}, which the course's tests have not run on (tested: "
            f"{', '.join(TESTED)}): --allow-untested-torch")
