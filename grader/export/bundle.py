"""The Gradescope autograder bundle: a zip with ``setup.sh``, ``run_autograder`` and the course.

Gradescope unpacks the zip into ``/autograder/source``, runs ``setup.sh`` once (as root) to build the
image, copies ``run_autograder`` to ``/autograder/run_autograder`` and runs it for every submission.
``setup.sh`` installs the grader with a CPU build of torch into ``/opt/grader-venv`` and creates the
unprivileged user that runs student code; ``run_autograder`` grades ``/autograder/submission`` with
grader/export/gradescope_run.py into ``/autograder/results/results.json``.

The bundle holds course.yaml, pyproject.toml, README.md, grader/ (hidden tests included: Gradescope needs
them, and they stay unreadable to the student's user) and exercises/. It never holds solutions/ or tests/;
as a second guard, a file whose bytes equal a reference solution's refuses the build.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path
from typing import Any

from grader.export.load import ExportError

INCLUDE = ("course.yaml", "pyproject.toml", "README.md", "grader", "exercises")
SKIP_PARTS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ipynb_checkpoints"}
CONFIG = "autograder.json"
FIXED_TIME = (2020, 1, 1, 0, 0, 0)  # stable zip entries: the same course gives the same bundle

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, while it builds the autograder image; /autograder/source holds the
# bundle. Installs the grader and a CPU build of torch into {venv}, and the user that runs student code.
# Use an Ubuntu 22.04 or newer base image (Python 3.10+).
set -euxo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends python3 python3-venv python3-pip
python3 -m venv {venv}
{venv}/bin/python -m pip install --upgrade pip
# Gradescope has no GPUs: the CPU wheel of torch is a fraction of the CUDA one's size.
# constraints.txt pins every dependency to the version the bundle was built and tested with.
{venv}/bin/python -m pip install -c /autograder/source/constraints.txt --index-url https://download.pytorch.org/whl/cpu torch
{venv}/bin/python -m pip install -c /autograder/source/constraints.txt -e /autograder/source
# The worker that imports the student's file runs as this user: the grader, as root, drops to it.
id -u {user} >/dev/null 2>&1 || useradd --no-create-home --shell /usr/sbin/nologin {user}
# That user may read the grader's code and run its Python, but not the hidden tests.
chmod a+x /autograder
chmod -R a+rX /autograder/source {venv}
chmod -R go-rwx /autograder/source/grader/hidden
chmod +x /autograder/source/run_autograder
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every submission, as root, from /autograder: it grades /autograder/submission
# and writes /autograder/results/results.json (the canonical result goes beside it, as result.json).
# AUTOGRADER_ROOT moves the whole tree (the project's tests point it at a temporary folder);
# GRADER_PYTHON is the Python with the grader installed; GRADER_USER overrides the student code's user.
set -uo pipefail
root="${{AUTOGRADER_ROOT:-/autograder}}"
python="${{GRADER_PYTHON:-{venv}/bin/python}}"
cd "$root/source" || exit 1
exec "$python" -m grader.export.gradescope_run --root "$root"
"""


def bundle_files(root: Path) -> list[Path]:
    """The course files that go into the bundle, sorted, relative to `root`."""
    files = []
    for name in INCLUDE:
        path = root / name
        if path.is_file():
            files.append(Path(name))
        elif path.is_dir():
            for item in sorted(path.rglob("*")):
                rel = item.relative_to(root)
                if item.is_file() and not item.is_symlink() and not SKIP_PARTS & set(rel.parts) and item.suffix != ".pyc":
                    files.append(rel)
    return files


def constraints(root: Path) -> str:
    """pip constraints for the project's dependencies (pyproject.toml), each at the version installed where the
    bundle is built: the platform installs what the instructor graded with, not the index's newest (a fresh
    setup.sh once got pytest 9.2, which the project had not been run with). A local version label (torch's
    "+cpu") is dropped: the CPU index serves the same version under its own label."""
    import re
    from importlib import metadata

    text = (root / "pyproject.toml").read_text()
    try:
        import tomllib

        requirements = tomllib.loads(text)["project"]["dependencies"]
    except ImportError:  # Python 3.10: the [project] table's one dependencies list, read plainly
        block = re.search(r"^dependencies\s*=\s*\[(.*?)\]", text, re.S | re.M)
        requirements = re.findall(r'"([^"]+)"', block.group(1)) if block else []
    names = [re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0] for req in requirements]
    lines = ["# Written by `grader gradescope-bundle`: the versions the bundle was built with."]
    for name in names:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            raise ExportError(f"expected {name} (a dependency in pyproject.toml) installed where the bundle is "
                              "built, to pin its version, found it missing") from None
        lines.append(f"{name}=={version.split('+')[0]}")
    return "\n".join(lines) + "\n"


def _solution_hashes(root: Path) -> dict[str, str]:
    folder = root / "solutions"
    return {hashlib.sha256(p.read_bytes()).hexdigest(): str(p.relative_to(root))
            for p in sorted(folder.rglob("*.py")) if p.is_file()} if folder.is_dir() else {}


def build_bundle(root: Path, out: Path, course: Any, exercises: list[str] | None = None, tests: str = "all",
                 user: str = "student", venv: str = "/opt/grader-venv") -> list[str]:
    """Write the zip to `out`; returns the names it holds."""
    root, out = Path(root).resolve(), Path(out)
    known = [e.id for e in course.exercises]
    unknown = [e for e in exercises or [] if e not in known]
    if unknown:
        raise ExportError(f"unknown exercise {unknown[0]!r}; expected one of {known}")
    if tests not in ("all", "public"):
        raise ExportError(f"expected --tests all or public, found {tests!r}")
    solutions = _solution_hashes(root)
    files = bundle_files(root)
    for rel in files:
        digest = hashlib.sha256((root / rel).read_bytes()).hexdigest()
        if digest in solutions:
            raise ExportError(f"refusing to build the bundle: {rel} has the same bytes as {solutions[digest]}, "
                              "a reference solution (expected a stub there)")
    config = {"exercises": exercises or None, "tests": tests, "user": user}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.partial")
    names = []
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, text in (("setup.sh", SETUP_SH.format(venv=venv, user=user)),
                           ("run_autograder", RUN_AUTOGRADER.format(venv=venv)),
                           (CONFIG, json.dumps(config, indent=2) + "\n"),
                           ("constraints.txt", constraints(root))):
            _add(zf, name, text.encode(), 0o755 if name in ("setup.sh", "run_autograder") else 0o644)
            names.append(name)
        for rel in files:
            _add(zf, rel.as_posix(), (root / rel).read_bytes(), 0o644)
            names.append(rel.as_posix())
    tmp.replace(out)
    return names


def _add(zf: zipfile.ZipFile, name: str, data: bytes, mode: int) -> None:
    info = zipfile.ZipInfo(name, date_time=FIXED_TIME)
    info.external_attr = (0o100000 | mode) << 16  # a regular file with these permissions
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data)
