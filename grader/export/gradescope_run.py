"""What the Gradescope bundle's ``run_autograder`` runs: grade the submission, write Gradescope's results.

    python -m grader.export.gradescope_run [--root /autograder]

Reads ``<root>/source`` (the bundle: course.yaml, the grader, the tests, ``autograder.json`` with the
exercises, the tests to run and the student code's user), grades ``<root>/submission`` and writes
``<root>/results/results.json`` (Gradescope's format) beside ``<root>/results/result.json`` (the
canonical result). The root comes from ``--root``, else ``AUTOGRADER_ROOT``, else ``/autograder``.

Gradescope has no GPUs: checks that need CUDA are "not graded here", and course.yaml's
``export.gradescope.count_ungraded_cuda`` decides whether they count. If the grader itself fails (too little
memory for the assignment, found before anything is graded; an internal error; a test process that died),
no ``results.json`` is written and the exit status is 1: Gradescope shows a failed autograder run, posts no
score, and the instructor reruns it. Never a partial score.
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


def memory_needed_mb(course, exercises: list[str] | None, cuda_torch: bool = False) -> int:
    """The memory (MiB) a grade of these exercises needs: the largest measured peak among them (course.yaml
    ``memory_mb``, or ``memory_mb_cuda_torch`` for a CUDA build of torch; the bundle's setup.sh installs a CPU
    build). 0 when no figure is known."""
    return max((e.memory_needed(cuda_torch) or 0 for e in course.exercises if not exercises or e.id in exercises),
               default=0)


GRADESCOPE_DEFAULT_MB = 768  # Gradescope's default autograder memory


def _memory_refusal(course, exercises: list[str] | None) -> str | None:
    """Why this container cannot grade the assignment (too little memory for its measured peak), or None. Said
    before anything is graded: a grade cut short by the OOM killer, or part-graded, would be no verdict."""
    from grader.harness.cgroup import memory_limit_mb
    from grader.runner import torch_is_cuda_build

    if os.environ.get("GRADER_IGNORE_MEMORY") == "1":
        return None
    needs = memory_needed_mb(course, exercises, torch_is_cuda_build())
    limit = memory_limit_mb()
    print(f"grader: this assignment needs about {needs} MiB of memory; the container allows "
          f"{'an unknown amount' if limit is None else f'{limit} MiB'}", file=sys.stderr)
    if not needs or limit is None or limit >= needs:
        return None
    return (f"this autograder container allows {limit} MiB of memory, and this assignment needs about {needs} MiB "
            f"(its largest exercise's measured peak): set the assignment's autograder memory to at least {needs} MiB "
            "(Configure Autograder, container specifications) and rerun the autograder on its submissions. "
            "Nothing was graded, and no score was posted.")


def _failed(root: Path, reason: str) -> int:
    """A failed autograder run: no results.json (Gradescope then shows the run as failed, posts no score, and the
    instructor reruns it), the reason in the output the instructor reads, exit status 1."""
    try:
        (root / "results" / "results.json").unlink()
    except FileNotFoundError:
        pass
    print(f"The autograder failed, not the submission: {reason}")
    return 1


def run(root: Path) -> int:
    """Grade the submission into results.json. A grade that failed on the grader's side (too little memory, an
    internal error, a test process that died) writes no results.json and exits 1: never a partial score."""
    from grader.course import load_course
    from grader.export.checks import GradeFailed
    from grader.export.gradescope import to_gradescope
    from grader.export.settings import load_settings
    from grader.options import GradeOptions, OptionsError
    from grader.runner import grade

    started = time.monotonic()
    source = root / "source"
    out_dir = root / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        course = load_course(source)
        settings = load_settings(source, course)
        config = _config(source)
        refusal = _memory_refusal(course, config["exercises"])  # first: a container too small grades nothing
        if refusal is not None:
            return _failed(root, refusal)
        opts = GradeOptions(exercises=config["exercises"], tests=config["tests"], user=config["user"])
        opts.check_account()
        result = grade(course, source, root / "submission", out_dir / "result.json", opts,
                       submission_id=_submission_id(root))
        payload = to_gradescope(result, settings, course, execution_time_s=time.monotonic() - started)
    except (GradeFailed, OptionsError) as exc:
        return _failed(root, str(exc))
    except Exception as exc:  # noqa: BLE001 -- the grader failed, not the student: no score, a run to redo
        traceback.print_exc()
        return _failed(root, f"{type(exc).__name__}: {exc}")
    results.write_atomic(out_dir / "results.json", payload)
    print(payload["output"])
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.export.gradescope_run", description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.environ.get("AUTOGRADER_ROOT", "/autograder"),
                        help="Gradescope's /autograder tree (default: $AUTOGRADER_ROOT or /autograder)")
    args = parser.parse_args(argv)
    return run(Path(args.root).resolve())


if __name__ == "__main__":
    sys.exit(main())
