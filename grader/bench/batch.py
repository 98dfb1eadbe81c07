"""Batch throughput: grade N copies of the reference submission with --jobs 1 and --jobs 2.

    python -m grader.bench.batch [--copies 20] [--exercise online_softmax] [--jobs 1 2] [--tests all|public]
                                 [--backend local|docker] [--image IMAGE]

Prints, per jobs setting: submissions per minute, and where each submission's time goes. A lane's
time per submission (wall time x lanes / submissions) splits into
  * time in checks: the tests' own durations (calls into the worker included);
  * pytest: the rest of the runner's time on the exercise (pytest's start, imports, collection,
    starting the sandboxed worker);
  * batch: the rest (handing the job to the lane's grading process, reading the submission, writing
    results; the lane's one-off start, importing torch, is spread over its submissions). With
    --backend docker it holds each submission's container: starting it, and the grader's start
    and imports inside it.
Overhead is everything but the time in checks.
"""

from __future__ import annotations

import argparse
import io
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from grader.results import read_result
from grader.scale.backend import BACKENDS
from grader.scale.backends import make_backend
from grader.scale.batch import BatchOptions, run_batch
from grader.course import find_root, load_course
from grader.options import GradeOptions


def make_copies(root: Path, folder: Path, copies: int) -> Path:
    subs = folder / "submissions"
    for i in range(copies):
        shutil.copytree(root / "solutions", subs / f"student{i:03d}")
    return subs


def measure(root: Path, subs: Path, out: Path, jobs: int, opts: GradeOptions, backend_name: str = "local",
            image: str | None = None) -> dict:
    course = load_course(root)
    backend = make_backend(backend_name, root, image=image)
    t0 = time.perf_counter()
    report = run_batch(course, root, BatchOptions(subs, out, jobs=jobs, grade=opts), backend=backend,
                       console=Console(file=io.StringIO()))
    wall = time.perf_counter() - t0
    results = [read_result(out / f"{i}.json") for i in report.graded]
    if report.internal_errors or any(r is None or r.get("state") != "complete" for r in results):
        raise RuntimeError(f"jobs={jobs}: expected every copy graded completely, found problems: {report.internal_errors}")
    graded = [r for r in results if r is not None]  # all of them, after the check above
    checks = [sum(t["duration_s"] for e in r["exercises"] for c in e["checks"] for t in c["tests"]) for r in graded]
    in_runner = [sum(e["duration_s"] for e in r["exercises"]) for r in graded]
    slot = wall * report.summary["run"]["lanes"] / len(graded)
    scores = sorted({(r["score"], r["gradable_max_score"]) for r in graded})
    return {"jobs": jobs, "lanes": report.summary["run"]["lanes"], "n": len(graded), "wall": wall,
            "per_minute": 60 * len(graded) / wall, "slot": slot, "checks": statistics.fmean(checks),
            "pytest": statistics.fmean(in_runner) - statistics.fmean(checks),
            "batch": slot - statistics.fmean(in_runner), "overhead": slot - statistics.fmean(checks), "scores": scores}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grader.bench.batch", description=__doc__.split("\n\n")[0])
    p.add_argument("--copies", type=int, default=20)
    p.add_argument("--exercise", "-e", action="append", help="default: online_softmax")
    p.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    p.add_argument("--tests", choices=("all", "public"), default="all")
    p.add_argument("--backend", choices=BACKENDS, default="local")
    p.add_argument("--image", help="the course image for --backend docker (default: course.yaml's)")
    args = p.parse_args(argv)
    root = find_root()
    exercises: list[str] = args.exercise or ["online_softmax"]
    opts = GradeOptions(exercises=exercises, seed=1, tests=args.tests)
    console = Console()
    rows = []
    with tempfile.TemporaryDirectory(prefix="grader-bench-batch-") as tmp:
        subs = make_copies(root, Path(tmp), args.copies)
        for jobs in args.jobs:
            console.print(f"grading {args.copies} copies of solutions/ ({', '.join(exercises)}) with --jobs {jobs} ...")
            rows.append(measure(root, subs, Path(tmp) / f"results-jobs{jobs}", jobs, opts, args.backend, args.image))
    table = Table(title=f"batch throughput, {args.copies} copies of the reference ({', '.join(exercises)}, "
                        f"tests: {args.tests}, backend: {args.backend})", title_justify="left")
    for col in ("jobs", "wall s", "submissions/min", "lane s per submission", "in checks", "pytest", "batch",
                "overhead", "overhead share"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["jobs"]), f"{r['wall']:.1f}", f"{r['per_minute']:.1f}", f"{r['slot']:.2f}", f"{r['checks']:.2f}",
                      f"{r['pytest']:.2f}", f"{r['batch']:.2f}", f"{r['overhead']:.2f}", f"{r['overhead'] / r['slot']:.0%}")
    console.print(table)
    console.print("scores: " + "; ".join(f"jobs {r['jobs']}: " + ", ".join(f"{s:g}/{m:g}" for s, m in r["scores"]) for r in rows))
    if len(rows) > 1:
        console.print(f"speed-up of --jobs {rows[-1]['jobs']} over --jobs {rows[0]['jobs']}: "
                      f"{rows[-1]['per_minute'] / rows[0]['per_minute']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
