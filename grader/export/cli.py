"""The export subcommands; grader/cli.py registers them with `add_commands(subparsers)`.

  grader export RESULTS_DIR --format csv|gradescope|prairielearn|nbgrader [--out PATH]
  grader feedback RESULT.json|RESULTS_DIR [--out feedback.html|FOLDER | --nbgrader COURSE_DIR]
  grader gradescope-bundle [--out autograder.zip] [--exercise ID]... [--tests all|public]

`export` and `feedback` handle each student on their own (grader/export/isolate.py): whatever goes wrong with
one student's material (a malformed result file, a submission time nobody can read, an error while rendering
their row or page) costs that student alone, with a warning naming the student and the file. Each ends with
"N student(s) exported, K with problems: a, b, c" and returns (grader/exitcodes.py) 0 when every student was
exported whole, 1 when it finished but the grader itself failed on some student, 3 when it finished but some
students' material could not be used, 2 for bad input to the whole export (a message says what was expected
and what was found). `python -m grader.export` runs them too.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import sys
from pathlib import Path
from typing import Any

from grader import results
from grader.results import INTERNAL_ERROR
from grader.course import CourseError
from grader.export.isolate import BAD_INPUT, Problems, per_student
from grader.export.load import ExportError, Loaded, Skipped, load_results, read_result
from grader.text import inert

FORMATS = ("csv", "gradescope", "prairielearn", "nbgrader")


def _say(message: str) -> None:
    print(inert(message), file=sys.stderr)  # file names and messages can hold anything


def _course() -> tuple[Path | None, Any]:
    """The course this command runs in, if any: exports work without one (column order from the results)."""
    from grader.course import find_root, load_course

    try:
        root = find_root()
        return root, load_course(root)
    except CourseError:
        return None, None


def _matching(course: Any, loaded: list[Loaded]) -> Any:
    """Use course.yaml's order and rubric only for results of that course."""
    if course is None:
        return None
    others = sorted({item.result["course"] for item in loaded} - {course.course})
    if others:
        _say(f"note: results of course {others} are not of this course.yaml's {course.course!r}; "
             "ordering columns by the results instead")
        return None
    return course


def _skipped_are_problems(skipped: list[Skipped], problems: Problems) -> None:
    for bad in skipped:
        problems.add(bad.path.stem, str(bad))


def _finish(problems: Problems, exported: int) -> int:
    """Every student's problem, then the count line; the exit status (grader/exitcodes.py)."""
    for message in problems.messages():
        _say(f"warning: {message}")
    _say(problems.count_line(exported))
    return problems.status()


def _times(path: str | None, problems: Problems) -> Any:
    if not path:
        return None
    from grader.export.times import read_submission_times

    times = read_submission_times(Path(path))
    for (student, _exercise), message in times.unknown.items():
        problems.add(student, message, by_grader=message.startswith(INTERNAL_ERROR))
    return times


def _due(text: str | None, settings: Any) -> dt.datetime | None:
    if text is None:
        return settings.due
    try:
        return dt.datetime.fromisoformat(text)
    except ValueError:
        raise ExportError(f"--due: expected an ISO 8601 time such as 2026-12-15T23:59:00+00:00, found {text!r}") from None


def cmd_export(args: argparse.Namespace) -> int:
    from grader.export.settings import load_settings

    root, course = _course()
    settings = load_settings(root, course)
    problems = Problems()
    loaded, skipped = load_results(Path(args.results_dir))
    _skipped_are_problems(skipped, problems)
    if not loaded:
        for bad in skipped:
            _say(str(bad))
        raise ExportError(f"expected at least one valid result in {args.results_dir}, found {len(skipped)} malformed file(s)")
    course = _matching(course, loaded)
    due = _due(args.due, settings)  # a bad --due stops the export before anything is written
    submitted = _times(args.submitted_times, problems)
    results_dir = Path(args.results_dir)
    exported = 0
    if args.format == "csv":
        from grader.export.csv_gradebook import to_csv

        warnings: list[str] = []
        text = to_csv(loaded, course, due, submitted, checks=args.checks, warnings=warnings, problems=problems)
        for warning in warnings:
            _say(f"warning: {warning}")
        exported = max(0, len(list(csv.reader(io.StringIO(text)))) - 1)  # rows past the header
        if args.out in (None, "-"):
            sys.stdout.write(text)
        else:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(text, encoding="utf-8")
            _say(f"CSV gradebook of {exported} student(s) written to {args.out}")
    elif args.format in ("gradescope", "prairielearn"):
        if args.format == "gradescope":
            from grader.export.gradescope import to_gradescope

            render = lambda r: to_gradescope(r, settings, course)
        else:
            from grader.export.prairielearn import to_prairielearn

            render = lambda r: to_prairielearn(r, settings)
        out = Path(args.out) if args.out else results_dir / args.format
        for item in loaded:
            with per_student(problems, item.student, item.path, f"its {args.format} results.json") as outcome:
                results.write_atomic(out / item.student / "results.json", render(item.result))
            exported += not outcome.failed
        _say(f"{args.format} results.json for {exported} student(s) written to {out}/<student>/results.json")
    else:
        from grader.export.nbgrader_gradebook import to_nbgrader

        target = args.out or str(results_dir / "gradebook.db")
        url = target if "://" in target else f"sqlite:///{Path(target).resolve()}"
        notes: list[str] = []
        summary = to_nbgrader(loaded, url, course, args.course_id, submitted, due, notes, problems)
        exported = summary.students
        for note in notes:
            _say(f"warning: {note}")
        _say(f"nbgrader gradebook {url}: {summary.students} student(s), {summary.assignments} assignment(s), "
             f"{summary.grades} score(s) written")
        if summary.kept or summary.not_graded:
            _say(f"  checks these results did not grade (need CUDA, or not selected): {summary.kept} kept the score "
                 f"an earlier export wrote, {summary.not_graded} have none yet (nbgrader counts them as 0 until the "
                 "results of a grade that ran them are exported)")
        if summary.skipped:
            _say(f"  {summary.skipped} exercise(s) not written (the grading machine failed on them, or their grade did "
                 "not finish): regrade them")
    return _finish(problems, exported)


def cmd_feedback(args: argparse.Namespace) -> int:
    from grader.export.feedback import render_feedback

    _, course = _course()
    source = Path(args.result)
    if args.nbgrader:
        return _nbgrader_feedback(args, source, course)
    problems = Problems()
    if source.is_dir():
        loaded, skipped = load_results(source)
        _skipped_are_problems(skipped, problems)
        if not loaded:
            for bad in skipped:
                _say(str(bad))
            raise ExportError(f"expected at least one valid result in {source}, found {len(skipped)} malformed file(s)")
        out = Path(args.out) if args.out else source / "feedback"
        out.mkdir(parents=True, exist_ok=True)
        written = 0
        for item in loaded:
            with per_student(problems, item.student, item.path, "its feedback page") as outcome:
                page = render_feedback(item.result, _matching(course, [item]), plots=not args.no_plot)
                (out / f"{item.student}.html").write_text(page, encoding="utf-8")
            written += not outcome.failed
        _say(f"{written} feedback page(s) written to {out}/")
        return _finish(problems, written)
    if not source.is_file():
        raise ExportError(f"expected a result file (or a folder of them) at {source}, found nothing there")
    try:
        result = read_result(source)
    except ExportError as exc:
        raise ExportError(f"{source}: {exc}") from None
    out = Path(args.out) if args.out else source.with_suffix(".html")
    out.parent.mkdir(parents=True, exist_ok=True)
    with per_student(problems, source.stem, source, "its feedback page") as outcome:
        page = render_feedback(result, _matching(course, [Loaded(source.stem, source, result)]), plots=not args.no_plot)
        out.write_text(page, encoding="utf-8")
    if not outcome.failed:
        _say(f"feedback page written to {out}")
    return _finish(problems, 0 if outcome.failed else 1)


def _nbgrader_feedback(args: argparse.Namespace, source: Path, course: Any) -> int:
    from grader.export.nbgrader_feedback import write_nbgrader_feedback

    if args.out:
        raise ExportError("--nbgrader writes COURSE_DIR/feedback/<student>/<exercise>/<exercise>.html: expected no --out")
    problems = Problems()
    if source.is_dir():
        loaded, skipped = load_results(source)
        _skipped_are_problems(skipped, problems)
    else:
        try:
            loaded = [Loaded(source.stem, source, read_result(source))]
        except ExportError as exc:
            raise ExportError(f"{source}: {exc}") from None
    if not loaded:
        raise ExportError(f"expected at least one valid result in {source}, found none")
    report = write_nbgrader_feedback(loaded, Path(args.nbgrader), _matching(course, loaded), plots=not args.no_plot,
                                     problems=problems)
    for warning in report.warnings:
        _say(f"warning: {warning}")
    _say(f"{len(report.written)} nbgrader feedback page(s) written under {Path(args.nbgrader) / 'feedback'}/; "
         f"deliver them with `nbgrader release_feedback ASSIGNMENT`")
    students = {page.parent.parent.name for page in report.written}
    return _finish(problems, len(students))


def cmd_bundle(args: argparse.Namespace) -> int:
    from grader.export.bundle import build_bundle

    root, course = _course()
    if root is None or course is None:  # both or neither
        raise ExportError("expected to run inside the course (a folder with course.yaml), found none")
    names = build_bundle(root, Path(args.out), course, args.exercise, args.tests, args.user)
    what = ", ".join(args.exercise) if args.exercise else "every exercise"
    from grader.export.gradescope_run import GRADESCOPE_DEFAULT_MB, memory_needed_mb

    needs = memory_needed_mb(course, args.exercise)  # the CPU build of torch, which setup.sh installs
    memory = (f"it fits Gradescope's default memory ({GRADESCOPE_DEFAULT_MB} MiB; its largest peak is about {needs} MiB)"
              if needs <= GRADESCOPE_DEFAULT_MB else
              f"set the assignment's autograder memory to at least {needs} MiB (Gradescope's default, "
              f"{GRADESCOPE_DEFAULT_MB} MiB, is too little: run_autograder would refuse to grade)")
    _say(f"Gradescope autograder written to {args.out} ({len(names)} files; grades {what}, {args.tests} tests); "
         f"{memory}. Upload it as the assignment's autograder; see grader/export/README.md.")
    return 0


def _guard(fn):
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except (ExportError, CourseError) as exc:
            _say(f"error: {exc}")
            return BAD_INPUT
    return run


def add_commands(subparsers: Any) -> None:
    """Register `export`, `feedback` and `gradescope-bundle` on grader's subparsers."""
    e = subparsers.add_parser("export", help="export a folder of results: csv, gradescope, prairielearn, nbgrader")
    e.add_argument("results_dir", metavar="RESULTS_DIR", help="one <student>.json result per student")
    e.add_argument("--format", "-f", choices=FORMATS, required=True)
    e.add_argument("--out", "-o", help="csv: a file (default: stdout); gradescope/prairielearn: a folder "
                   "(default: RESULTS_DIR/<format>/), one <student>/results.json each; nbgrader: a database "
                   "file or SQLAlchemy URL (default: RESULTS_DIR/gradebook.db)")
    e.add_argument("--due", help="csv/nbgrader: due date and time (ISO 8601) for the late flag; default: course.yaml export.due")
    e.add_argument("--submitted-times", help="csv/nbgrader: a CSV with columns student,submitted_at, or nbgrader's "
                   "submitted/ folder (each <student>/<assignment>/timestamp.txt)")
    e.add_argument("--checks", action="store_true", help="csv: also one column per check (<exercise>/<check>)")
    e.add_argument("--course-id", default="default_course", help="nbgrader: the gradebook's course id")
    e.set_defaults(fn=_guard(cmd_export))

    f = subparsers.add_parser("feedback", help="render a student's result as a self-contained HTML page")
    f.add_argument("result", metavar="RESULT", help="a result .json (or a folder of them: one page each)")
    f.add_argument("--out", "-o", help="the page (default: RESULT with .html) or, for a folder, the output folder")
    f.add_argument("--nbgrader", metavar="COURSE_DIR", help="write each exercise's page where nbgrader's "
                   "release_feedback takes it: COURSE_DIR/feedback/<student>/<exercise>/<exercise>.html, beside the "
                   "timestamp.txt and submission_secret.txt of COURSE_DIR/submitted/<student>/<exercise>/")
    f.add_argument("--no-plot", action="store_true", help="leave out the speed checks' plots (no matplotlib needed)")
    f.set_defaults(fn=_guard(cmd_feedback))

    b = subparsers.add_parser("gradescope-bundle", help="build the Gradescope autograder zip")
    b.add_argument("--out", "-o", default="autograder.zip")
    b.add_argument("--exercise", "-e", action="append", help="grade only this exercise (repeatable; default: all)")
    b.add_argument("--tests", choices=("all", "public"), default="all")
    b.add_argument("--user", default="student", help="the unprivileged user that runs student code on Gradescope")
    b.set_defaults(fn=_guard(cmd_bundle))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.export", description="Export grading results.")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
