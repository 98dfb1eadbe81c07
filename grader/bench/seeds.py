"""Seed sweep: does the reference solution earn full marks on every seed?

    python -m grader.bench.seeds [--exercise ID ...] [--seeds 50] [--first 1] [--jobs 2]
                                 [--check ID ...] [--mode sandbox|local] [--out sweep.json]

Grades solutions/ once per seed (seeds first, first + 1, ...), every check that runs on this machine
(CUDA-only checks are not graded without CUDA), and prints, per exercise and check, the seeds on which
the reference lost points, with the first message. A correct submission must never lose a point to
the draw of its inputs: every row should read "0 of N". Exits 1 if any seed lost a point, so a short
sweep can gate the project's tests.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from grader.course import Course, find_root, load_course
from grader.options import GradeOptions
from grader.runner import grade


@dataclass
class Loss:
    seed: int
    points: float
    max_points: float
    message: str


@dataclass
class Sweep:
    seeds: list[int]
    losses: dict[tuple[str, str], list[Loss]] = field(default_factory=dict)  # (exercise, check) -> losses
    checks: dict[str, list[tuple[str, float]]] = field(default_factory=dict)  # exercise -> [(check, max)]
    wall_s: float = 0.0

    @property
    def clean(self) -> bool:
        return not any(self.losses.values())

    def to_json(self) -> dict:
        return {"seeds": self.seeds, "wall_s": round(self.wall_s, 1), "clean": self.clean,
                "losses": [{"exercise": e, "check": c, "seed": l.seed, "points": l.points, "max_points": l.max_points,
                            "message": l.message} for (e, c), ls in sorted(self.losses.items()) for l in ls]}


def sweep(course: Course, root: Path, exercises: list[str], seeds: list[int], jobs: int = 1,
          checks: list[str] | None = None, mode: str = "sandbox", progress: bool = False) -> Sweep:
    """Grade the reference once per seed; collect every check that came out below full marks. `progress`: a line
    on standard error per seed graded (its points lost, the time so far)."""
    result = Sweep(seeds)
    started = time.perf_counter()

    def one(seed: int) -> dict:
        opts = GradeOptions(exercises=exercises, seed=seed, mode=mode, checks=checks)
        return grade(course, root, root / "solutions", None, opts, submission_id=f"reference-seed-{seed}")

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for seed, graded in zip(seeds, pool.map(one, seeds)):
            for ex in graded["exercises"]:
                result.checks.setdefault(ex["id"], [(c["id"], c["max_points"]) for c in ex["checks"]
                                                    if c["status"] != "not_graded" and (not checks or c["id"] in checks)])
                for c in ex["checks"]:
                    if c["status"] == "not_graded" or (checks and c["id"] not in checks):
                        continue
                    lost = result.losses.setdefault((ex["id"], c["id"]), [])
                    if c["points"] < c["max_points"] - 1e-9:
                        lost.append(Loss(seed, c["points"], c["max_points"], c["message"]))
            if progress:
                lost_here = sum(1 for losses in result.losses.values() for loss in losses if loss.seed == seed)
                print(f"seed {seed} graded ({seeds.index(seed) + 1} of {len(seeds)}, "
                      f"{time.perf_counter() - started:.0f} s): {lost_here or 'no'} check(s) below full marks",
                      file=sys.stderr, flush=True)
    result.wall_s = time.perf_counter() - started
    return result


def table(result: Sweep) -> Table:
    n = len(result.seeds)
    t = Table(title=f"reference on {n} seeds ({result.seeds[0]}..{result.seeds[-1]}), {result.wall_s:.0f} s",
              title_justify="left")
    for col in ("exercise", "check", "seeds that lost points", "first message"):
        t.add_column(col, overflow="fold")
    for exercise, checks in result.checks.items():
        for check, _max in checks:
            lost = result.losses.get((exercise, check), [])
            seeds = ", ".join(str(l.seed) for l in lost[:12]) + (" ..." if len(lost) > 12 else "")
            t.add_row(exercise, check, Text(f"{len(lost)} of {n}" + (f": {seeds}" if lost else ""),
                                            style="red" if lost else "green"),
                      Text(lost[0].message.splitlines()[0][:160] if lost else ""))
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exercise", "-e", action="append", help="sweep only this exercise (repeatable)")
    parser.add_argument("--seeds", type=int, default=50, help="how many seeds (default 50)")
    parser.add_argument("--first", type=int, default=1, help="the first seed (default 1)")
    parser.add_argument("--jobs", "-j", type=int, default=1, help="grades at once")
    parser.add_argument("--check", action="append", help="only this check (repeatable)")
    parser.add_argument("--mode", choices=("sandbox", "local"), default="sandbox")
    parser.add_argument("--out", type=Path, help="write the sweep as JSON here")
    args = parser.parse_args(argv)
    root = find_root()
    course = load_course(root)
    exercises = args.exercise or [e.id for e in course.exercises]
    unknown = sorted(set(exercises) - {e.id for e in course.exercises})
    if unknown:
        parser.error(f"unknown exercise {unknown[0]!r}; expected one of {[e.id for e in course.exercises]}")
    if args.seeds < 1:
        parser.error(f"expected --seeds of at least 1, found {args.seeds}")
    result = sweep(course, root, exercises, list(range(args.first, args.first + args.seeds)), args.jobs,
                   args.check, args.mode, progress=True)
    Console().print(table(result))
    if args.out:
        args.out.write_text(json.dumps(result.to_json(), indent=2) + "\n")
    return 0 if result.clean else 1


if __name__ == "__main__":
    sys.exit(main())
