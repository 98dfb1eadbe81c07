"""The `grader` command line.

  grader grade SUBMISSION [--exercise ID]... [--seed N] [--out FILE] [--format table|json]
  grader demo                 grade the reference solutions and the starter stubs; print the score table
  grader check [EXERCISE]     run the public tests on your exercises/ in-process; print your progress
  grader hint EXERCISE        show the next hint for an exercise (remembers how many you have seen)
  grader validate             check course.yaml and that every exercise has its files and tests
  grader schema [course|result]   print a JSON Schema

Exit status: 0 when grading finished, whatever the score; 2 for bad input (a message says what was
expected and what was found); 1 for an internal error of the grader.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from rich.console import Console

from grader import __version__, report, results
from grader.course import CourseError, find_root, load_course
from grader.runner import GradeOptions, grade, run_exercise

console = Console(stderr=False)
err = Console(stderr=True)


class UsageError(Exception):
    pass


def _course():
    root = find_root()
    return root, load_course(root)


def cmd_grade(args: argparse.Namespace) -> int:
    root, course = _course()
    for ex_id in args.exercise or []:
        course.exercise(ex_id)
    source = Path(args.submission)
    if not source.exists():
        raise UsageError(f"expected a submission folder or archive at {source}, found nothing there")
    opts = GradeOptions(exercises=args.exercise or None, seed=args.seed, tests=args.tests,
                        isolate=not args.no_isolate, user=args.user,
                        log_dir=Path(args.log_dir) if args.log_dir else None)
    if opts.log_dir:
        opts.log_dir.mkdir(parents=True, exist_ok=True)
    out = Path(args.out) if args.out else None
    result = grade(course, root, source, out, opts)
    if args.format == "json":
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        report.print_result(result, console, detail=not args.summary)
        if out:
            console.print(f"result written to {out}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The main job: grade the reference solutions and the starter stubs side by side."""
    root, course = _course()
    graded = []
    out_dir = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="grader-demo-"))
    for name, folder in (("reference", root / "solutions"), ("stub", root / "exercises")):
        console.print(f"grading the {name} ({folder.relative_to(root)}/) ...")
        result = grade(course, root, folder, out_dir / f"{name}.json", GradeOptions(seed=args.seed), submission_id=name)
        if args.detail:
            report.print_result(result, console)
        graded.append(result)
    console.print(report.comparison_table(graded))
    console.print(f"results: {out_dir}/reference.json, {out_dir}/stub.json")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """Self-study: public tests on the student's own exercises/, in-process, with a progress table."""
    root, course = _course()
    exercises = [course.exercise(args.exercise)] if args.exercise else course.exercises
    opts = GradeOptions(mode="local", tests="public")
    result = results.new_result(course, "exercises", "", "", 0, "local", exercises)
    for ex in exercises:
        def on_event(event: dict, _id=ex.id) -> None:
            if event.get("event") == "test" and event.get("exercise") == _id:
                results.record_test(result, event)
                mark = {"passed": "[green].[/]", "not_graded": "[dim]s[/]"}.get(event["status"], "[red]F[/]")
                console.print(mark, end="")
        console.print(f"{ex.id} ", end="")
        files = Path(args.source).resolve() / ex.id if args.source else None
        reason = run_exercise(root, ex, files, 0, opts, on_event)
        console.print()
        results.close_exercise(result, ex.id, reason)
    results.finish(result)
    console.print(report.progress_table(result))
    bad = next((t for ex in result["exercises"] for c in ex["checks"] for t in c["tests"]
                if t["status"] not in ("passed", "not_graded") and "NotImplementedError" not in t["message"]), None)
    if bad is not None:
        console.print(f"[bold]first failure[/]: {bad['name']}\n{bad['message']}")
        if bad["traceback"]:
            console.print(bad["traceback"], markup=False, highlight=False)
    skipped = [c["id"] for ex in result["exercises"] for c in ex["checks"] if c["status"] == "not_graded"]
    if skipped:
        console.print(f"[dim]not run here (need CUDA): {', '.join(skipped)}[/]")
    return 0


HINTS_FILE = ".hints.json"


def cmd_hint(args: argparse.Namespace) -> int:
    root, course = _course()
    ex = course.exercise(args.exercise)
    state_path = root / HINTS_FILE
    try:
        state = json.loads(state_path.read_text())
    except (OSError, json.JSONDecodeError):
        state = {}
    if args.reset:
        state.pop(ex.id, None)
        state_path.write_text(json.dumps(state, indent=2) + "\n")
        console.print(f"hints for {ex.id} reset")
        return 0
    if not ex.hints:
        console.print(f"{ex.id} has no hints; its README's 'Hints' section is the place to look")
        return 0
    shown = min(state.get(ex.id, 0) + 1, len(ex.hints))
    for i in range(shown):
        style = "bold" if i == shown - 1 else "dim"
        console.print(f"[{style}]hint {i + 1}/{len(ex.hints)}:[/] {ex.hints[i]}")
    if shown == len(ex.hints):
        console.print("[dim](that was the last hint)[/]")
    state[ex.id] = shown
    state_path.write_text(json.dumps(state, indent=2) + "\n")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    root, course = _course()
    problems = []
    for ex in course.exercises:
        for path in (root / "exercises" / ex.id / "README.md", root / "exercises" / ex.id / ex.file,
                     root / "exercises" / ex.id / "test_public.py", root / "solutions" / ex.id / ex.file,
                     root / "grader" / "hidden" / ex.id):
            if not path.exists():
                problems.append(f"{ex.id}: expected {path.relative_to(root)}, found nothing")
    for p in problems:
        err.print(f"[red]{p}[/]")
    if not problems:
        console.print(f"course.yaml is valid: {len(course.exercises)} exercises, {course.total_points:g} points")
    return 2 if problems else 0


def cmd_schema(args: argparse.Namespace) -> int:
    from grader.course import json_schema

    data = json_schema() if args.which == "course" else results.schema()
    sys.stdout.write(json.dumps(data, indent=2) + "\n")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="grader", description="Grade the LLM efficiency lab.")
    p.add_argument("--version", action="version", version=f"grader {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("grade", help="grade one submission (folder, flat files, .zip or .tar.gz)")
    g.add_argument("submission")
    g.add_argument("--exercise", "-e", action="append", help="grade only this exercise (repeatable)")
    g.add_argument("--seed", type=int, help="seed for the hidden tests' inputs (default: a fresh secret one)")
    g.add_argument("--out", "-o", help="write the JSON result here (kept up to date as checks finish)")
    g.add_argument("--format", choices=("table", "json"), default="table")
    g.add_argument("--tests", choices=("all", "public"), default="all")
    g.add_argument("--summary", action="store_true", help="one line per exercise")
    g.add_argument("--no-isolate", action="store_true", help="run workers without namespaces (debugging)")
    g.add_argument("--user", default="nobody", help="unprivileged user for the worker when run as root")
    g.add_argument("--log-dir", help="keep each exercise's pytest output in this folder")
    g.set_defaults(fn=cmd_grade)

    d = sub.add_parser("demo", help="grade the reference solutions and the starter stubs")
    d.add_argument("--seed", type=int)
    d.add_argument("--out", help="folder for the two JSON results")
    d.add_argument("--detail", action="store_true", help="also print each check")
    d.set_defaults(fn=cmd_demo)

    c = sub.add_parser("check", help="run the public tests on your exercises/ and show your progress")
    c.add_argument("exercise", nargs="?")
    c.add_argument("--from", dest="source", help="check DIR/<id>/<file> instead of exercises/ (e.g. solutions)")
    c.set_defaults(fn=cmd_check)

    h = sub.add_parser("hint", help="show the next hint for an exercise")
    h.add_argument("exercise")
    h.add_argument("--reset", action="store_true")
    h.set_defaults(fn=cmd_hint)

    v = sub.add_parser("validate", help="check course.yaml and the exercises' files")
    v.set_defaults(fn=cmd_validate)

    s = sub.add_parser("schema", help="print a JSON Schema")
    s.add_argument("which", choices=("course", "result"), nargs="?", default="result")
    s.set_defaults(fn=cmd_schema)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except (UsageError, CourseError, KeyError) as exc:
        err.print(f"[red]error:[/] {str(exc).strip(chr(39)).strip(chr(34))}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
