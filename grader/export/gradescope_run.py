"""What the Gradescope bundle's ``run_autograder`` runs: grade the submission, write Gradescope's results.

    python -m grader.export.gradescope_run [--root /autograder]

Reads ``<root>/source`` (the bundle: course.yaml, the grader, the tests, ``autograder.json`` with the
exercises, the tests to run and the student code's user), grades ``<root>/submission`` and writes
``<root>/results/results.json`` (Gradescope's format) beside ``<root>/results/result.json`` (the
canonical result). The root comes from ``--root``, else ``AUTOGRADER_ROOT``, else ``/autograder``.

Gradescope has no GPUs: checks that need CUDA are "not graded here", and course.yaml's
``export.gradescope.count_ungraded_cuda`` decides whether they count. If the grader itself fails, the
results still say so (score 0, the error in ``output``) and the exit status is 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

from grader import results


def _config(source: Path) -> dict:
    path = source / "autograder.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    return {"exercises": config.get("exercises"), "tests": config.get("tests", "all"),
            "user": os.environ.get("GRADER_USER") or config.get("user", "student")}


def _submission_id(root: Path) -> str:
    """Gradescope's submission id from submission_metadata.json, when it is there."""
    try:
        meta = json.loads((root / "submission_metadata.json").read_text())
        return f"gradescope-{meta['id']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "submission"


def _print_memory(course, exercises: list[str] | None) -> None:
    """For the instructor's log: the memory this assignment's grade needs, against what the container allows."""
    from grader.harness.cgroup import memory_limit_mb

    from grader.runner import torch_is_cuda_build

    cuda_torch = torch_is_cuda_build()
    needs = max((e.memory_needed(cuda_torch) or 0 for e in course.exercises if not exercises or e.id in exercises),
                default=0)
    limit = memory_limit_mb()
    if needs:
        verdict = "" if limit is None or limit >= needs else " - too little: raise the autograder's memory setting"
        print(f"grader: this assignment needs about {needs} MiB of memory; the container allows "
              f"{'an unknown amount' if limit is None else f'{limit} MiB'}{verdict}", file=sys.stderr)


def run(root: Path) -> int:
    from grader.course import load_course
    from grader.export.gradescope import to_gradescope
    from grader.export.settings import load_settings
    from grader.options import GradeOptions
    from grader.runner import grade

    started = time.monotonic()
    source = root / "source"
    out_dir = root / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        course = load_course(source)
        settings = load_settings(source, course)
        config = _config(source)
        opts = GradeOptions(exercises=config["exercises"], tests=config["tests"], user=config["user"])
        _print_memory(course, opts.exercises)
        result = grade(course, source, root / "submission", out_dir / "result.json", opts,
                       submission_id=_submission_id(root))
        payload = to_gradescope(result, settings, course, execution_time_s=time.monotonic() - started)
        status = 0
    except Exception as exc:  # noqa: BLE001 -- the grader failed, not the student: say so where the student looks
        traceback.print_exc()
        payload = {"score": 0.0, "execution_time": round(time.monotonic() - started, 3), "tests": [],
                   "output": f"The autograder itself failed ({type(exc).__name__}: {exc}). This is not a verdict on "
                             "your code; your instructor can see the details and will regrade.",
                   "stdout_visibility": "hidden"}
        status = 1
    results.write_atomic(out_dir / "results.json", payload)
    print(payload["output"])
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.export.gradescope_run", description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.environ.get("AUTOGRADER_ROOT", "/autograder"),
                        help="Gradescope's /autograder tree (default: $AUTOGRADER_ROOT or /autograder)")
    args = parser.parse_args(argv)
    return run(Path(args.root).resolve())


if __name__ == "__main__":
    sys.exit(main())
