"""`grader doctor`: the GPU, driver, CUDA, torch and triton this machine grades with.

A student's command as well as the instructor's, so it lives here and not with the container backend
(grader/scale/, which a student's copy of the course does not hold). The grading image's own `doctor`
(grader/scale/container.py) reports the same fields.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from grader import results, torchbuild

STUDENT_USER = "student"  # the unprivileged user the sandboxed worker runs as (grader/scale/container.py)


def doctor() -> dict:
    """What this machine grades with: GPU, driver, CUDA, torch, triton, the C compiler Triton's GPU launcher
    needs, and whether the sandbox's user exists."""
    info = results.device_info()
    report = {"python": info["python"], "torch": info["torch"], "triton": info["triton"], "cuda": info["cuda"],
              "gpu": info["gpu"], "driver": None, "in_container": os.environ.get("GRADER_IN_CONTAINER") == "1"}
    if shutil.which("nvidia-smi"):
        proc = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
        report["driver"] = proc.stdout.strip().splitlines()[0] if proc.returncode == 0 and proc.stdout.strip() else None
    build = torchbuild.installed()
    report["torch_tested"] = (f"yes: {torchbuild.TESTED[build.release]}" if build and build.tested else
                              "no: grading refuses it without --allow-untested-torch")
    # Triton compiles a small C launcher the first time a kernel runs on a GPU (triton/runtime/build.py)
    report["c_compiler"] = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
    try:
        import pwd

        pwd.getpwnam(STUDENT_USER)
        report["student_user"] = True
    except KeyError:
        report["student_user"] = False
    return report


def print_doctor(report: dict) -> None:
    width = max(map(len, report))
    for key, value in report.items():
        print(f"{key:<{width}}  {'-' if value is None else value}")
