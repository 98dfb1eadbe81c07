"""PrairieLearn's external-grader entry point: grade ``/grade/student``, write ``/grade/results/results.json``.

    python -m grader.export.prairielearn_run [--grade-root /grade] [--exercise ID]... [--tests all|public]

The course image has the grader and the course installed; the question's ``externalGradingOptions``
name this module as the entrypoint (grader/export/README.md has a complete ``info.json``). Settings come
from arguments or, for questions that prefer ``externalGradingOptions.environment``, from
``GRADE_ROOT`` (default ``/grade``), ``GRADER_EXERCISES`` (comma-separated ids), ``GRADER_TESTS``,
``GRADER_USER`` (the student code's user, default ``nobody``) and ``GRADER_COURSE_ROOT`` (the folder
holding course.yaml; default: found from the working directory, else the installed package's).

A submission that cannot be read at all gets ``"gradable": false`` with ``format_errors``: PrairieLearn
charges no attempt. So does a failure of the grader itself, since it is not the student's doing. Once
results.json is written the exit status is 0, whatever it says: PrairieLearn discards the results file of a
job that exits non-zero and shows a generic failure instead. Only a results.json that could not be written
exits 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

from grader import results


def run(grade_root: Path, exercises: list[str] | None, tests: str, user: str, course_root: Path | None) -> int:
    from grader.course import find_root, load_course
    from grader.export.prairielearn import to_prairielearn
    from grader.export.settings import load_settings
    from grader.options import GradeOptions
    from grader.runner import grade

    out_dir = grade_root / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        root = course_root or find_root()
        course = load_course(root)
        settings = load_settings(root, course)
        opts = GradeOptions(exercises=exercises or None, tests=tests, user=user)
        result = grade(course, root, grade_root / "student", out_dir / "result.json", opts, submission_id="student")
        payload = to_prairielearn(result, settings)
    except Exception as exc:  # noqa: BLE001 -- the grader failed: no verdict, and no attempt charged
        traceback.print_exc()
        payload = {"gradable": False,
                   "format_errors": [(f"the autograder itself failed ({type(exc).__name__}: {exc}); "
                                      "this is not a verdict on your code and costs you no attempt")],
                   "message": "The autograder failed; your instructor can see the details."}
    results.write_atomic(out_dir / "results.json", payload)  # raises (exit 1) only if it cannot be written
    print(payload["message"])
    return 0


def main(argv: list[str] | None = None) -> int:
    env = os.environ
    parser = argparse.ArgumentParser(prog="python -m grader.export.prairielearn_run", description=__doc__.split("\n")[0])
    parser.add_argument("--grade-root", default=env.get("GRADE_ROOT", "/grade"))
    parser.add_argument("--exercise", "-e", action="append", help="grade only this exercise (repeatable)")
    parser.add_argument("--tests", choices=("all", "public"), default=env.get("GRADER_TESTS", "all"))
    parser.add_argument("--user", default=env.get("GRADER_USER", "nobody"))
    parser.add_argument("--course-root", default=env.get("GRADER_COURSE_ROOT"))
    args = parser.parse_args(argv)
    exercises = args.exercise or [e.strip() for e in env.get("GRADER_EXERCISES", "").split(",") if e.strip()]
    return run(Path(args.grade_root).resolve(), exercises, args.tests, args.user,
               Path(args.course_root).resolve() if args.course_root else None)


if __name__ == "__main__":
    sys.exit(main())
