"""Finish the grading image (run once, as root, by docker/Dockerfile's RUN step).

1. Installs the Python packages pyproject.toml asks for that the base image lacks or has outside the
   range pyproject.toml gives (the tested range: a base whose torch CI does not test gets the tested one);
   pip runs only when something is missing, so a complete base needs no network.
2. Puts /opt/course on every Python's path (a .pth file), so `python -I -m grader...` finds it.
3. Creates the users `grader` (owns the hidden checks and the solutions) and `student` (the
   sandboxed worker runs as it).
4. Sets the modes: the course readable by all; grader/hidden and solutions owned by `grader`,
   mode 0700, so `student` cannot read them.
5. Checks the result: the grader imports, and `student` is refused the hidden checks.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

COURSE = Path("/opt/course")
PRIVATE = [COURSE / "grader" / "hidden", COURSE / "solutions"]
USERS = {"grader": 10001, "student": 10002}


def requirements() -> list[tuple[str, str, tuple[int, ...], tuple[int, ...] | None]]:
    """(requirement as written, distribution name, lower bound, upper bound or None) for each runtime dependency."""
    import tomllib

    deps = tomllib.loads((COURSE / "pyproject.toml").read_text())["project"]["dependencies"]
    found = []
    for dep in deps:
        m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*(?:>=\s*([0-9.]+))?\s*(?:,\s*<\s*([0-9.]+))?\s*", dep)
        if not m:
            raise SystemExit(f"install.py: expected dependencies written as NAME, NAME>=X.Y or NAME>=X.Y,<Z.W, "
                             f"found {dep!r}")
        upper = tuple(int(x) for x in m.group(3).split(".")) if m.group(3) else None
        found.append((dep.strip(), m.group(1), tuple(int(x) for x in (m.group(2) or "0").split(".")), upper))
    return found


def version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("."):
        digits = re.match(r"\d+", piece)
        if not digits:
            break
        parts.append(int(digits.group()))
    return tuple(parts)


def install_missing() -> None:
    missing = []
    for spec, name, lower, upper in requirements():
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(spec)
            continue
        # outside the tested range (a base image's torch older or newer than CI tests): the tested one replaces it
        if version_tuple(have) < lower or upper is not None and version_tuple(have) >= upper:
            missing.append(spec)
    if not missing:
        print("install.py: every Python requirement is in the base image")
        return
    print(f"install.py: installing {missing}")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-cache-dir", *missing], check=True)


def add_to_path() -> None:
    site = Path(sysconfig.get_paths()["purelib"])
    site.mkdir(parents=True, exist_ok=True)
    (site / "llm_efficiency_lab.pth").write_text(f"{COURSE}\n")


def add_users() -> None:
    passwd, group = Path("/etc/passwd"), Path("/etc/group")
    names = {line.split(":")[0] for line in passwd.read_text().splitlines() if line}
    groups = {line.split(":")[0] for line in group.read_text().splitlines() if line}
    for name, uid in USERS.items():
        if name not in groups:
            with group.open("a") as f:
                f.write(f"{name}:x:{uid}:\n")
        if name not in names:
            with passwd.open("a") as f:
                f.write(f"{name}:x:{uid}:{uid}:{name}:/nonexistent:/usr/sbin/nologin\n")


def set_modes() -> None:
    for path in [COURSE, *COURSE.rglob("*")]:
        if path.name == "__pycache__" and path.is_dir():
            continue
        os.chown(path, 0, 0, follow_symlinks=False)
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)
    uid = USERS["grader"]
    for folder in PRIVATE:
        for path in [folder, *folder.rglob("*")]:
            os.chown(path, uid, uid, follow_symlinks=False)
            if not path.is_symlink():
                path.chmod(0o700 if path.is_dir() else 0o600)


def check() -> None:
    subprocess.run([sys.executable, "-I", "-c", "import grader.scale.container, torch, triton"], check=True)
    student = USERS["student"]
    probe = ("import sys\n"
             "for path in sys.argv[1:]:\n"
             "    try:\n"
             "        open(path).read()\n"
             "    except PermissionError:\n"
             "        continue\n"
             "    sys.exit(f'the student user can read {path}')\n")
    targets = [str(next(p for p in folder.rglob("*.py"))) for folder in PRIVATE]
    subprocess.run([sys.executable, "-I", "-c", probe, *targets], check=True,
                   preexec_fn=lambda: (os.setgroups([]), os.setgid(student), os.setuid(student)))
    print(f"install.py: the student user is refused {targets}")


if __name__ == "__main__":
    install_missing()
    add_to_path()
    add_users()
    set_modes()
    check()
