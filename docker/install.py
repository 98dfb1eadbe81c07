"""Finish the grading image (run once, as root, by docker/Dockerfile's RUN step).

1. Installs the Python packages pyproject.toml asks for that the base image lacks or has outside the
   range pyproject.toml gives; torch is the exception: a base without a torch CI tests (grader/torchbuild.py
   `TESTED`) gets exactly the image's (`torchbuild.IMAGE`), never whatever newest release pip finds in the
   range. pip runs only when something is missing, so a complete base needs no network. Then a C compiler
   (Triton builds its GPU launcher with one): Debian's gcc where the base has none, unless the build says
   C_COMPILER=none (an image that runs Triton's interpreter only: the project's CPU-only test image).
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


def tested_torch() -> tuple[set[str], str]:
    """(the torch releases CI tests, the image's), read from grader/torchbuild.py's text: nothing is imported."""
    import ast

    tree = ast.parse((COURSE / "grader" / "torchbuild.py").read_text())
    values = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
              if isinstance(t, ast.Name) and t.id in ("TESTED", "IMAGE")}
    tested = ast.literal_eval(values["TESTED"])
    return set(tested), ast.literal_eval(values["IMAGE"])


def torch_to_install(have: str | None, tested: set[str], image: str) -> str | None:
    """The torch requirement to install: None when the base's torch (`have`, "2.14.1+cu130") is a tested
    release, else exactly the image's."""
    if have is not None and have.split("+")[0] in tested:
        return None
    return f"torch=={image}"


def install_missing() -> None:
    missing = []
    tested, image = tested_torch()
    for spec, name, lower, upper in requirements():
        try:
            have: str | None = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            have = None
        if name == "torch":  # a base image's torch that CI does not test: the image's tested one replaces it
            pinned = torch_to_install(have, tested, image)
            missing += [pinned] if pinned else []
        elif have is None or version_tuple(have) < lower or upper is not None and version_tuple(have) >= upper:
            missing.append(spec)
    if not missing:
        print("install.py: every Python requirement is in the base image")
        return
    print(f"install.py: installing {missing}")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-cache-dir", *missing], check=True)


def c_compiler() -> str | None:
    """The C compiler Triton would use (triton/runtime/build.py: $CC, then gcc, then clang)."""
    import shutil

    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")


def ensure_c_compiler() -> None:
    if os.environ.get("C_COMPILER", "gcc") == "none":
        print("install.py: C_COMPILER=none: no C compiler installed; Triton's kernels run here under its "
              "interpreter only (TRITON_INTERPRET=1), a GPU grade needs one")
        return
    found = c_compiler()
    if found:
        print(f"install.py: Triton's C compiler: {found}")
        return
    import shutil

    if not shutil.which("apt-get"):
        raise SystemExit("install.py: expected a C compiler (gcc or clang: Triton builds its GPU launcher with one) "
                         "or apt-get to install gcc, found neither; build FROM a base with one, or pass "
                         "--build-arg C_COMPILER=none for an image that never runs a kernel on a GPU")
    print("install.py: installing gcc (Triton builds its GPU launcher with it)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "gcc", "libc6-dev"], check=True,
                   env=env)
    subprocess.run(["rm", "-rf", "/var/lib/apt/lists"], check=True)


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
    ensure_c_compiler()
    add_to_path()
    add_users()
    set_modes()
    check()
