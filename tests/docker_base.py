"""A CPU-only base image for testing docker/Dockerfile on a machine that can pull no image.

Debian's minimal root file system (debootstrap, from Debian's package mirror) with its Python 3.11,
plus the Python packages the grader needs at grade time, copied from this virtual environment (the
same Python version and architecture, so the compiled parts load), made an image with
`docker import`. The course image is then built FROM it exactly as FROM the CUDA PyTorch image.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from packaging.requirements import Requirement

TAG = "llm-efficiency-lab-test-base:latest"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PYTHON = "3.11"
DEBIAN_PACKAGES = ["python3-minimal", f"python{PYTHON}-minimal", f"libpython{PYTHON}-stdlib"]
SITE = f"usr/local/lib/python{PYTHON}/dist-packages"  # Debian's Python looks here for local packages
# Parts of the wheels that grading on the CPU never touches (headers, test binaries, and Triton's
# GPU compilers and libraries, which the interpreter does not use): kept out to keep the image small.
SKIP = ("torch/include/", "torch/test/", "triton/backends/nvidia/bin/", "triton/backends/nvidia/lib/",
        "triton/backends/nvidia/include/", "triton/backends/amd/lib/", "triton/backends/amd/include/")


class BaseImageError(RuntimeError):
    pass


def runtime_distributions(root: Path) -> list[importlib.metadata.Distribution]:
    """The installed distributions pyproject.toml's runtime dependencies need, transitively, extras included.

    A CUDA build of torch asks for `cuda-toolkit[cudart,cublas,...]`, whose libraries (libcudart and the rest)
    are requirements of those extras only: a walk that ignored extras left them out, and torch could not be
    imported in the image."""
    import tomllib

    todo = [Requirement(r) for r in tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]]
    seen: dict[str, importlib.metadata.Distribution] = {}
    extras_seen: dict[str, set[str]] = {}
    while todo:
        req = todo.pop()
        key = req.name.lower().replace("_", "-")
        new_extras = set(req.extras) - extras_seen.get(key, set())
        if key in seen and not new_extras:
            continue
        try:
            dist = seen.get(key) or importlib.metadata.distribution(req.name)
        except importlib.metadata.PackageNotFoundError:
            raise BaseImageError(f"expected {req.name} installed in this environment, found none") from None
        # the first visit walks the plain requirements; any visit walks the extras not walked before
        extras = ([""] if key not in seen else []) + sorted(new_extras)
        seen[key] = dist
        extras_seen.setdefault(key, set()).update(req.extras)
        for text in dist.requires or []:
            dep = Requirement(text)
            if dep.marker is None and "" in extras or dep.marker is not None and any(
                    dep.marker.evaluate({"extra": extra}) for extra in extras):
                todo.append(dep)
    return sorted(seen.values(), key=lambda d: d.metadata["Name"].lower())


def fingerprint(dists: list[importlib.metadata.Distribution]) -> str:
    text = "\n".join(f"{d.metadata['Name']}=={d.version}" for d in dists) + f"\n{SUITE} {SKIP}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def existing_fingerprint(tag: str) -> str | None:
    proc = subprocess.run(["docker", "image", "inspect", "--format",
                           '{{ index .Config.Labels "llm-efficiency-lab.base" }}', tag], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


def copy_distribution(dist: importlib.metadata.Distribution, site: Path, target: Path) -> None:
    for file in dist.files or []:
        rel = Path(str(file))
        if rel.parts and rel.parts[0] == ".." or any(str(rel).startswith(s) for s in SKIP):
            continue  # scripts in the venv's bin/, and the parts grading does not use
        src = site / rel
        if not src.is_file():
            continue
        dst = target / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


def build(root: Path, tag: str = TAG) -> str:
    """Build (or reuse, when its packages are unchanged) the test base image; returns its tag."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" != PYTHON:
        raise BaseImageError(f"the test base copies this environment's packages into Debian {SUITE}'s Python "
                             f"{PYTHON}; expected this environment on Python {PYTHON}, found {sys.version.split()[0]}")
    if shutil.which("debootstrap") is None:
        raise BaseImageError("expected debootstrap (apt-get install debootstrap) to make the test base, found none")
    dists = runtime_distributions(root)
    stamp = fingerprint(dists)
    if existing_fingerprint(tag) == stamp:
        return tag
    site = Path(sysconfig.get_paths()["purelib"])
    with tempfile.TemporaryDirectory(prefix="grader-test-base-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        proc = subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(DEBIAN_PACKAGES)}", SUITE,
                               str(rootfs), MIRROR], capture_output=True, text=True)
        if proc.returncode != 0:
            raise BaseImageError(f"debootstrap {SUITE} failed (exit {proc.returncode}): {proc.stderr[-1500:]}")
        for dist in dists:
            copy_distribution(dist, site, rootfs / SITE)
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man"):
            shutil.rmtree(rootfs / junk, ignore_errors=True)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
        proc = subprocess.run(["docker", "import", "--change", f"LABEL llm-efficiency-lab.base={stamp}",
                               "--change", 'CMD ["python3"]', "-", tag], stdin=tar.stdout, capture_output=True,
                              text=True)
        tar.stdout.close()
        tar.wait()
        if proc.returncode != 0 or tar.returncode != 0:
            raise BaseImageError(f"docker import failed: {proc.stderr[-1500:]}")
    return tag


if __name__ == "__main__":
    print(build(Path(__file__).resolve().parent.parent))
