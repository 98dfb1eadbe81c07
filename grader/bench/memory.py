"""Measure each exercise's memory figure with the torch that is installed (course.yaml ``memory_mb`` for the CPU
build, ``memory_mb_cuda_torch`` for a CUDA build).

    python -m grader.bench.memory [--exercise ID ...] [--seed 5] [--out peaks.json]

Grades the reference of each exercise, one exercise per grade, in a memory cgroup of its own (root only:
cgroup v2's ``memory.peak`` or v1's ``memory.max_usage_in_bytes``), and prints the peak of the whole grade
(grader, pytest and worker together, as a Gradescope container counts them) next to course.yaml's figure.
The torch build matters: importing a CUDA build of torch costs each process about twice the memory of the
CPU build, so course.yaml holds a figure per build (README.md, "Memory"), and the table compares the peak with
the installed build's. A peak above it exits 1: the figure would let a platform grade with too little memory, and a grade
killed part-way reads as the student's crash.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from grader.course import find_root, load_course
from grader.runner import torch_is_cuda_build

V2 = Path("/sys/fs/cgroup")


def torch_build() -> str:
    """The installed torch, as a grade's figures depend on it: '2.14.1+cu130 (CUDA build)'."""
    import torch

    return f"{torch.__version__} ({'CUDA' if torch.version.cuda else 'CPU'} build)"


def new_group(limit_mb: int | None = None) -> tuple[Path, str]:
    """A fresh memory cgroup (v2, or v1's memory controller), limited to `limit_mb` if given, and the file that
    holds its peak. Raises OSError where none can be made."""
    name = f"grader-memory-{secrets.token_hex(4)}"
    on_v2 = (V2 / "cgroup.controllers").exists() and "memory" in (V2 / "cgroup.controllers").read_text().split()
    group = (V2 if on_v2 else V2 / "memory") / name
    group.mkdir()
    if limit_mb is not None:
        (group / ("memory.max" if on_v2 else "memory.limit_in_bytes")).write_text(str(limit_mb << 20))
    return group, "memory.peak" if on_v2 else "memory.max_usage_in_bytes"


def remove_group(group: Path) -> None:
    """Kill what is left in `group` and remove it."""
    for pid in (group / "cgroup.procs").read_text().split():
        try:
            os.kill(int(pid), 9)
        except (ProcessLookupError, ValueError):
            pass
    try:
        group.rmdir()
    except OSError:
        pass


def measure(root: Path, exercise_id: str, seed: int) -> tuple[int, float, str]:
    """(peak MiB, score, state) of one grade of the reference of `exercise_id`, run in a cgroup of its own."""
    group, peak_file = new_group()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "result.json"
            # The memory check of the grade itself would refuse an exercise above this machine's limit: off here.
            env = {**os.environ, "GRADER_IGNORE_MEMORY": "1"}
            script = (f"echo $$ > {group}/cgroup.procs && exec {sys.executable} -m grader grade "
                      f"{root / 'solutions'} -e {exercise_id} --seed {seed} --out {out}")
            proc = subprocess.run(["sh", "-c", script], cwd=root, env=env, capture_output=True, text=True)
            if not out.is_file():
                raise RuntimeError(f"the grade of {exercise_id} wrote no result (exit {proc.returncode}): "
                                   f"{(proc.stdout + proc.stderr)[-1500:]}")
            result = json.loads(out.read_text())
        peak = int((group / peak_file).read_text()) >> 20
        return peak, result["score"], result["state"]
    finally:
        remove_group(group)


def suggested(peak_mb: int) -> int:
    """The figure to put in course.yaml: the peak with 15% room, rounded up to 50 MiB."""
    return 50 * math.ceil(peak_mb * 1.15 / 50)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exercise", "-e", action="append", help="an exercise id (default: all)")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--out", type=Path, help="also write the figures as JSON")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("grader.bench.memory makes a memory cgroup per grade, which needs root", file=sys.stderr)
        return 2
    root = find_root()
    course = load_course(root)
    ids = args.exercise or [e.id for e in course.exercises]
    build = torch_build()
    cuda_torch = torch_is_cuda_build()
    field = "memory_mb_cuda_torch" if cuda_torch else "memory_mb"  # the figure a grade on this build checks
    table = Table(title=f"a whole grade's peak memory, reference solutions, torch {build}")
    for col in ("exercise", "score", "peak MiB", f"course.yaml {field}", "suggested", "verdict"):
        table.add_column(col)
    rows, ok = [], True
    for exercise_id in ids:
        declared = course.exercise(exercise_id).memory_needed(cuda_torch)
        peak, score, state = measure(root, exercise_id, args.seed)
        fits = declared is not None and peak <= declared
        ok &= fits
        rows.append({"exercise": exercise_id, "peak_mb": peak, field: declared, "score": score, "state": state})
        table.add_row(exercise_id, f"{score:g} ({state})", str(peak), str(declared), str(suggested(peak)),
                      "[green]within[/]" if fits else f"[red]above: raise {field}[/]")
    Console().print(table)
    if args.out:
        args.out.write_text(json.dumps({"torch": build, "seed": args.seed, "exercises": rows}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
