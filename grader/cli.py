"""The `grader` command line.

  grader grade SUBMISSION [--exercise ID]... [--seed N] [--out FILE] [--format table|json]
               [--backend local|docker|apptainer] [--image IMAGE]   one container per submission
  grader batch SUBMISSIONS_DIR --out RESULTS_DIR --jobs N   many submissions in parallel, resumable
  grader export RESULTS_DIR --format csv|gradescope|prairielearn|nbgrader
  grader demo                 grade the reference solutions and the starter stubs; print the score table
  grader check [EXERCISE] [-v]   run the public tests on your exercises/ in-process; print your progress
                              (exit status 1 when a public test fails or a file does not compile or import)
  grader hint EXERCISE        show the next hint for an exercise (remembers how many you have seen)
  grader progress             attempts, first passes and hints, from .progress.json
  grader interview start|check|done   timed practice on a fresh stub in practice/<id>/ (check: exit status 1
                              until the round passes; done: 1, and nothing recorded, when its file does not run)
  grader notebook EXERCISE [--force]   write exercises/<id>/<id>.ipynb, a starter notebook (needs nbformat)
  grader release OUT_DIR      write the student repository; refuses if anything would leak
  grader doctor               the GPU, driver, CUDA, torch and triton this machine grades with
  grader validate             check course.yaml and that every exercise has its files and tests
  grader new ID [--title T] [--file NAME.py]   scaffold every file of a new exercise (TODO markers where the
                              author writes), append its course.yaml block, then `grader sync`
  grader sync [--check]       write every block derived from course.yaml (README practice plan, points tables,
                              hints); --check writes nothing and exits 1 naming each stale block
  grader schema [course|result]   print a JSON Schema

Exit status: 0 when grading finished, whatever the score (`check`: 1 when a public test fails or a file does not
compile or import); 2 for bad input (a message says what was
expected and what was found); 1 for an internal error of the grader.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from grader import __version__, exitcodes, report, results, selfstudy
from grader.options import GradeOptions, OptionsError, add_grade_options
from grader.progress import GradeProgress
from grader.course import CourseError, find_root, load_course
from grader.runner import grade, grade_exercise
from grader.text import inert

# The instructor's commands (grade, batch, slurm, export, gpu-check, release, ...) import their modules
# (grader/scale/, grader/export/, ...) when they run: a student's copy of the course (grader release) holds
# only what the student's commands import, so nothing at the top of this module may need the others.

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
    from grader.scale.backends import backend_from_args

    opts = GradeOptions.from_args(args)
    if opts.log_dir:
        opts.log_dir.mkdir(parents=True, exist_ok=True)
    out = Path(args.out) if args.out else None
    backend = backend_from_args(args, root, opts)  # rejects flags that do not go with the backend
    if args.backend == "local":
        opts.check_account()
        chosen = [e.id for e in course.exercises if not opts.exercises or e.id in opts.exercises]
        with GradeProgress(source.name, chosen, err) as progress:
            result = grade(course, root, source, out, opts, on_update=progress)
    else:
        result = grade_in_container(course, root, source, out, opts, backend)
    if args.format == "json":
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        report.print_result(result, console, detail=not args.summary)
        if out:
            console.print(f"result written to {out}", markup=False, highlight=False)
    if result.get("state") == "error":  # the grading machine failed on it: not a score
        err.print(Text("error: " + inert("; ".join(result.get("format_errors") or ["the grade failed"]))))
        return exitcodes.GRADER_FAILED
    if result.get("gradable") is False:  # graded to the end: the submission itself could not be (its reason is above)
        return exitcodes.NEEDS_ATTENTION
    return exitcodes.DONE


def grade_in_container(course, root: Path, source: Path, out: Path | None, opts: GradeOptions, backend) -> dict:
    """`grader grade --backend docker|apptainer`: the one-submission case of a batch."""
    from grader.scale.batch import grade_submission
    from grader.scale.discover import Entry, submission_id

    with tempfile.TemporaryDirectory(prefix="grader-grade-") as tmp:
        if source.is_symlink():  # a container would mount what it points at
            raise UsageError(f"expected a folder or an archive at {source}, found a symbolic link (to "
                             f"{os.readlink(source)!r}); pass the real path")
        entry = Entry(submission_id(source.absolute()), source.absolute())
        result, error = grade_submission(course, root, entry, Path(tmp), opts, backend)
        if result is None:
            raise RuntimeError(f"the container wrote no result: {error}")
        if out is not None:
            results.write_atomic(out, result)
    if error is not None:
        err.print(Text.assemble(("the grade did not finish:", "red"), " ", inert(error)))
    return result


def cmd_doctor(args: argparse.Namespace) -> int:
    from grader.doctor import doctor, print_doctor

    report = doctor()
    if args.json:
        sys.stdout.write(json.dumps(report) + "\n")
    else:
        print_doctor(report)
    return 0


def cmd_gpu_check(args: argparse.Namespace) -> int:
    from grader import gpucheck

    root, course = _course()
    out = Path(args.out) if args.out else None
    try:
        report = gpucheck.run(course, root, out, budget_s=args.budget_s, dry_run=args.dry_run, only=args.step)
    except RuntimeError as exc:
        console.print(f"[red]{inert(exc)}[/]")
        return 2
    gpucheck.print_report(report, console)
    return 0 if not report.problems else 1


def cmd_demo(args: argparse.Namespace) -> int:
    """The main job: grade the reference solutions and the starter stubs side by side."""
    root, course = _course()
    graded = []
    out_dir = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="grader-demo-"))
    for name, folder in (("reference", root / "solutions"), ("stub", root / "exercises")):
        console.print(f"grading the {name} ({folder.relative_to(root)}/) ...")
        with GradeProgress(name, [e.id for e in course.exercises], err) as progress:
            result = grade(course, root, folder, out_dir / f"{name}.json", GradeOptions(seed=args.seed),
                           submission_id=name, on_update=progress)
        if args.detail:
            report.print_result(result, console)
        graded.append(result)
    console.print(report.comparison_table(graded))
    console.print(f"results: {out_dir}/reference.json, {out_dir}/stub.json")
    return 0


def _print_not_run(problem: report.NotRun, path: str) -> None:
    """One exercise whose file was not run: the reason once (its line and message), not a FAILED line per test."""
    console.print(Text.assemble(("NOT RUN ", "red"), inert(problem.exercise), ": expected ", inert(path),
                                " to compile and import, found: ", inert(problem.message)))
    if problem.traceback:
        console.print(inert(problem.traceback), markup=False, highlight=False)


class _Live:
    """What self-study shows while an exercise's tests run: a mark per test (`marks`, one exercise checked), and,
    when a test has run for a while without a word (the runner's "quiet" events), which one and when it is
    stopped."""

    def __init__(self, exercise: Any, marks: bool, limit: float):
        self.exercise, self.marks, self.limit = exercise, marks, limit
        self.running: str | None = None  # the test that started last
        self.said: str | None = None  # the test named as still running (once: not every QUIET_S seconds)

    def __call__(self, event: dict) -> None:
        if event.get("exercise") != self.exercise.id:
            return
        kind = event.get("event")
        if kind == "started":
            self.running = str(event.get("test"))
        elif kind == "test" and self.marks:
            mark = {"passed": "[green].[/]", "not_graded": "[dim]s[/]"}.get(event["status"], "[red]F[/]")
            console.print(mark, end="")
        elif kind == "quiet" and self.running and self.said != self.running:
            self.said = self.running
            console.print()
            console.print(Text.assemble(
                ("  still running ", "dim"), inert(self.running),
                (f" after {event.get('seconds', 0)} s: it is stopped at {self.limit:g} s (the exercise's limit for "
                 "one call); Ctrl-C stops the run here", "dim")))


def _list_failures(failures: list[report.Failure]) -> list[report.Failure]:
    """A FAILED line per test that ran the student's code and failed; the tests that met a stub's
    NotImplementedError grouped per exercise by the functions not written yet. Returns the former."""
    started = [f for f in failures if not f.not_started]
    for failure in started:
        console.print(Text.assemble(("FAILED ", "red"), inert(failure.where), " ", inert(failure.first_line)))
    for ex_id, (names, count) in report.not_written(failures).items():  # every failing test is accounted for
        console.print(Text.assemble(("NOT WRITTEN YET ", "yellow"), f"{ex_id}: ", inert(", ".join(names)),
                                    f" ({count} test{'s' if count != 1 else ''} wait on "
                                    f"{'them' if len(names) != 1 else 'it'})"))
    return started


def cmd_check(args: argparse.Namespace) -> int:
    """Self-study: public tests on the student's own exercises/, in-process, with a progress table.
    Exit status 1 when a public test fails (as pytest's) or a file does not compile or import (no test of it
    ran), 0 when all pass; 130 on Ctrl-C, after the table of what ran."""
    root, course = _course()
    exercises = [course.exercise(args.exercise.partition("/")[0])] if args.exercise else course.exercises
    opts = GradeOptions(mode="local", tests="public", call_timeout_s=args.call_timeout)
    result = results.new_result(course, "exercises", "", "", 0, "local", exercises)
    marks = len(exercises) == 1  # one exercise: a mark per test; all of them: one line each, then the table
    done: list[Any] = []
    try:
        for ex in exercises:
            live = _Live(ex, marks, opts.call_timeout_s or ex.call_timeout_s)
            console.print(f"{ex.id} ", end="")
            files = Path(args.source).resolve() / ex.id if args.source else None
            grade_exercise(root, ex, files, 0, opts, result, live)
            done.append(ex)
            tests = [t for c in results.find_exercise(result, ex.id)["checks"] for t in c["tests"]]
            if not marks:
                passed = sum(t["status"] == "passed" for t in tests)
                console.print(f"[dim]{passed}/{len(tests)} public tests pass[/]", end="")
            console.print()
            if not args.source and selfstudy.touched(root, ex):  # an attempt is a check of a file the student changed
                failing = [c["id"] for c in results.find_exercise(result, ex.id)["checks"]
                           if c["tests"] and c["status"] not in ("passed", "not_graded")]
                selfstudy.record_check(root, ex.id, bool(tests) and all(t["status"] in ("passed", "not_graded")
                                                                         for t in tests), failing)
    except KeyboardInterrupt:  # one line and the table of what finished; nothing recorded for the exercise cut short
        stopped = next(e for e in exercises if e not in done)
        where = f" in {live.running}" if live.running else ""
        result["exercises"] = [e for e in result["exercises"] if e["id"] in {d.id for d in done}]
        console.print()
        console.print(Text.assemble(("interrupted", "yellow"), f" (Ctrl-C) while checking {stopped.id}{where}",
                                    "; nothing was recorded for it" + ("; what finished:" if done else "")))
        if done:
            results.finish(result)
            console.print(report.progress_table(result))
        return exitcodes.INTERRUPTED
    results.finish(result)
    console.print(report.progress_table(result))
    not_run = report.not_run(result)
    for problem in not_run.values():
        ex = course.exercise(problem.exercise)
        _print_not_run(problem, str(Path(args.source) / ex.id / ex.file) if args.source
                       else f"exercises/{ex.id}/{ex.file}")
    _warn_scan_findings(root, exercises, args.source, set(not_run), result)
    failures = [f for f in report.failures(result) if f.exercise not in not_run]  # the reason above says it once
    started = _list_failures(failures)
    if started:
        first = started[0] if not args.verbose else None
        for failure in ([first] if first else started):
            console.print(Text.assemble(("\n" + failure.where, "bold")))
            console.print(inert(failure.message), markup=False, highlight=False)
            if failure.traceback:
                console.print(inert(failure.traceback), markup=False, highlight=False)
        ex_id = started[0].exercise
        console.print(f"read: exercises/{ex_id}/README.md, section 'The contract' (and 'Hints'); "
                      f"`make hint EX={ex_id}` for the next hint"
                      + ("" if args.verbose else "; `make check V=1` shows every failure in full"))
    skipped = [f"{ex['id']}/{c['id']}" for ex in result["exercises"] for c in ex["checks"] if c["status"] == "not_graded"]
    cuda_checks = [f"{ex.id}/{c.id}" for ex in exercises for c in ex.checks if c.cuda] if not _has_cuda() else []
    if cuda_checks:  # one line names each check once (the skipped ones are these CUDA checks, on a CPU host)
        console.print(f"[dim]no CUDA device here: these checks run only when graded on a GPU: {', '.join(cuda_checks)}[/]")
    skipped = [s for s in skipped if s not in cuda_checks]
    if skipped:
        console.print(f"[dim]skipped here (need CUDA): {', '.join(skipped)}[/]")
    return 1 if failures or not_run else 0


def _warn_scan_findings(root: Path, exercises: list, source: str | None, skip: set[str], result: dict) -> list[str]:
    """The graded run scans each file (grader.harness.tamper) where its checks guard library calls or time the
    student's code, and fails those checks on a finding; the public tests here do not scan, so say it now, not
    after the deadline (an outsider's file passed every public test and scored 10 of 100 for `self._grad`).
    Returns the exercises flagged (not those whose public tests already failed on the same findings)."""
    from grader.harness import tamper

    flagged = []
    for ex in exercises:
        if ex.id in skip:
            continue
        path = (Path(source).resolve() / ex.id if source else root / "exercises" / ex.id) / ex.file
        findings = tamper.scan_file(path) if path.is_file() else []
        said = [t["message"] for c in results.find_exercise(result, ex.id)["checks"] for t in c["tests"]
                if str(findings[0]) in str(t.get("message") or "")] if findings else []
        if findings and not said:
            flagged.append(ex.id)
            console.print(Text.assemble(("SCAN ", "yellow"), f"{ex.id}: when graded, the checks that guard library "
                                        "calls or time your code fail on what the scan finds in your file: ",
                                        inert(tamper.describe(findings))))
    return flagged


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def cmd_hint(args: argparse.Namespace) -> int:
    root, course = _course()
    ex = course.exercise(args.exercise.partition("/")[0])  # a practice round's id (gptq/quantizer) names its exercise
    if args.reset:
        selfstudy.reset_hints(root, ex.id)
        console.print(f"hints for {ex.id} reset")
        return 0
    if not ex.hints:
        console.print(f"{ex.id} has no hints; its README's 'Hints' section is the place to look")
        return 0
    shown, new = selfstudy.next_hint(root, ex.id, ex.hints)
    for i in shown:
        hint = ex.hints[i]
        style = "bold" if i == new else "dim"
        linked = f" [dim](for {', '.join(hint.checks)})[/]" if hint.checks and i == new else ""
        console.print(f"[{style}]hint {i + 1}/{len(ex.hints)}:[/] {inert(hint.text)}{linked}")
    if len(shown) == len(ex.hints):
        console.print("[dim](that was the last hint)[/]")
    return 0


def _progress_of(course, exercise_id: str, data: dict) -> None:
    """Every check an exercise is graded on, with its points: the public ones with the last `make check`'s
    outcome, the hidden ones with the public checks that practise the same thing (those that share a hint)."""
    from rich.table import Table

    ex = course.exercise(exercise_id.partition("/")[0])
    state = data.get("exercises", {}).get(ex.id, {})
    failing = set(state.get("failing") or [])
    checked = bool(state.get("attempts"))
    table = Table(title=f"{ex.id}: what it is graded on ({ex.points:g} points)")
    for col in ("check", "points", "graded by", "your last make check / practise it with"):
        table.add_column(col, overflow="fold")
    for check in ex.checks:
        if check.visibility == "public" and not check.cuda:
            last = ("not yet run" if not checked else "[red]failing[/]" if check.id in failing else "[green]passing[/]")
            table.add_row(f"{check.id}: {inert(check.title)}", f"{check.points:g}", "public tests (make check)", last)
            continue
        related = sorted({c for h in ex.hints if check.id in h.checks for c in h.checks
                          if c != check.id and c in ex.public_cpu_checks})
        where = "hidden tests, on a GPU" if check.cuda else "hidden tests"
        table.add_row(f"{check.id}: {inert(check.title)}", f"{check.points:g}", where,
                      ", ".join(related) + " (and its hints)" if related else "its README's contract and hints")
    console.print(table)


def cmd_progress(args: argparse.Namespace) -> int:
    from rich.table import Table

    root, course = _course()
    data = selfstudy.load(root)
    if getattr(args, "exercise", None):
        try:
            _progress_of(course, args.exercise, data)
        except KeyError as exc:
            console.print(f"[red]{inert(exc)}[/]")
            return 2
        return 0
    table = Table(title="your progress (.progress.json)")
    for col in ("exercise", "difficulty", "attempts", "public tests first passed", "hints seen"):
        table.add_column(col)
    for ex in course.exercises:
        state = data.get("exercises", {}).get(ex.id, {})
        table.add_row(ex.id, ex.difficulty, str(state.get("attempts", 0)), state.get("first_pass") or "-",
                      f"{len(selfstudy.shown_hints(state, len(ex.hints)))}/{len(ex.hints)}")
    console.print(table)
    for record in data.get("interviews", []):
        console.print(Text.assemble("interview ", inert(selfstudy.describe_round(record))))
    return 0


def cmd_interview(args: argparse.Namespace) -> int:
    root, course = _course()
    try:
        if args.action == "start":
            round_, state, kept, replaced = selfstudy.start_interview(root, course, args.level, args.minutes,
                                                                     args.exercise, args.seed)
            folder = state["folder"]
            if replaced:
                console.print(f"[yellow]the round {inert(replaced.get('round') or replaced.get('exercise'))} was "
                              f"still running: it is dropped, not recorded[/]")
            if kept:
                console.print(f"[yellow]your earlier {folder}/{round_.exercise.file} is kept as "
                              f"{inert(kept.relative_to(root))}[/]")
            console.print(f"[bold]interview: {round_.title}[/] ({round_.id}, {round_.difficulty}), "
                          f"time box {state['minutes']} minutes")
            contract = report.readme_section(root / folder / "README.md", "The contract")
            if contract:  # rendered (headings, lists, code), wrapped once to the terminal's width
                from rich.markdown import Markdown

                console.print(Markdown(inert(contract)))
            console.print(f"the whole task: {folder}/README.md; write your code in {folder}/{round_.exercise.file} "
                          f"(a fresh stub; `.venv/bin/pytest {folder}` runs its public tests on it)")
            if round_.part:
                console.print(f"this round is one part of {round_.exercise.id}: only the public checks "
                              f"{', '.join(round_.checks)} count")
            console.print("check with `make interview-check`; finish with `make interview-done`. The clock is running.")
            return 0
        round_, state = selfstudy.current_interview(root, course)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    ex, wanted = round_.exercise, set(round_.checks)
    result = results.new_result(course, "practice", "", "", 0, "local", [ex])
    live = _Live(ex, False, ex.call_timeout_s)
    try:
        grade_exercise(root, ex, root / state["folder"], 0, GradeOptions(mode="local", tests="public"), result, live)
    except KeyboardInterrupt:
        where = f" in {live.running}" if live.running else ""
        console.print(Text.assemble(("interrupted", "yellow"), f" (Ctrl-C) while checking {round_.id}{where}: "
                                    "nothing recorded; the round keeps running"))
        return exitcodes.INTERRUPTED
    tests = [t for c in result["exercises"][0]["checks"] if c["id"] in wanted for t in c["tests"]]
    passed = sum(t["status"] == "passed" for t in tests)
    used = (time.time() - state["started"]) / 60
    problem = report.not_run(result).get(ex.id)
    if problem is not None:  # no test of the round ran: the reason, never a 0/0
        console.print(f"{round_.id}: [red]not run[/]; {used:.0f} of {state['minutes']} minutes used")
        _print_not_run(problem, f"{state['folder']}/{ex.file}")
        if args.action == "done":
            console.print("not recorded: the round keeps running; fix the file and run `make interview-done` again "
                          "(or `make interview` to start over)")
        return 1
    passes = bool(tests) and passed == len(tests)
    verdict = "[green]pass[/]" if passes else "[red]not yet[/]"
    console.print(f"{round_.id}: {passed}/{len(tests)} public tests pass: {verdict}; "
                  f"{used:.0f} of {state['minutes']} minutes used")
    _list_failures(report.failures(result, checks=wanted))  # as `make check`: unwritten functions grouped
    if args.action == "done":
        if not tests:
            console.print(f"[red]not recorded[/]: expected the public tests of {round_.id} ({', '.join(round_.checks)}) "
                          "to run, found none; the round keeps running")
            return 1
        record = selfstudy.finish_interview(root, passed, len(tests))
        console.print(Text.assemble("recorded in .progress.json: ", inert(selfstudy.describe_round(record)),
                                    "; `make progress` lists your rounds"))
        return 0
    return 0 if passes else 1


def cmd_notebook(args: argparse.Namespace) -> int:
    """A starter notebook from the exercise's file as it is now and the README's contract; a notebook is handed in
    like the file."""
    from grader.notebook import NotebookError, write_starter

    root, course = _course()
    ex = course.exercise(args.exercise)
    try:
        path = write_starter(root, ex.id, ex.title, ex.file, force=args.force)
    except (NotebookError, FileExistsError) as exc:
        raise UsageError(str(exc)) from None
    console.print(f"wrote {path.relative_to(root)}: the contract, then exercises/{ex.id}/{ex.file} as it is now (the "
                  f"stub, or your work so far) as code cells. Hand in "
                  f"{path.name} instead of {ex.file}, without {ex.file} beside it (where both are handed in, the .py is "
                  f"graded); cells tagged 'scratch' or "
                  f"starting '# scratch' are not graded, and no cell may hold a shell or magic line",
                  markup=False, highlight=False)
    return 0


def cmd_release(args: argparse.Namespace) -> int:
    from grader.release import LeakError, build_release

    root, _ = _course()
    try:
        build_release(root, Path(args.out), with_solutions=args.with_solutions)
    except (LeakError, FileExistsError) as exc:
        raise UsageError(str(exc)) from None
    kind = "teaching-assistant copy (with solutions)" if args.with_solutions else "student release"
    console.print(f"{kind} written to {args.out}; the leak check passed")
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


def cmd_new(args: argparse.Namespace) -> int:
    from grader.scaffold import ScaffoldError, new_exercise

    root, _ = _course()
    try:
        written = new_exercise(root, args.exercise, title=args.title, file=args.file)
    except ScaffoldError as exc:
        raise UsageError(str(exc)) from None
    for rel in written:
        console.print(f"wrote {rel}", markup=False, highlight=False)
    console.print(f"exercise {args.exercise} scaffolded: a working placeholder (compute(x), each row's sum) with TODO "
                  f"markers where you write; the project's tests (tests/test_exercise_files.py) name each file that "
                  f"still has one. `python -m tests.known_wrong {args.exercise}` grades the known-wrong submissions "
                  "(grader/AUTHORING.md, \"Starting an exercise\")", markup=False, highlight=False)
    return 0


def cmd_sync(args: argparse.Namespace) -> int:
    from grader.derived import SYNC_HINT, sync

    root, _ = _course()
    try:
        stale = sync(root, check=args.check)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.check:
        for block in stale:
            err.print(f"stale: {block}", markup=False, highlight=False)
        if stale:
            err.print(f"{len(stale)} block(s) differ from course.yaml: {SYNC_HINT}", markup=False, highlight=False)
            return 1
        console.print("every block derived from course.yaml is current", markup=False, highlight=False)
        return 0
    for block in stale:
        console.print(f"rewrote {block}", markup=False, highlight=False)
    if not stale:
        console.print("every block derived from course.yaml was already current", markup=False, highlight=False)
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from grader.course import json_schema

    data = json_schema() if args.which == "course" else results.schema()
    sys.stdout.write(json.dumps(data, indent=2) + "\n")
    return 0


# What a student's copy of the course (grader release) offers: the instructor's commands (grade, batch, export,
# release, ...) need the hidden tests or the solutions, which it does not hold.
STUDENT_COMMANDS = frozenset({"check", "hint", "progress", "interview", "doctor", "notebook"})
RELEASE_MARKER = Path(__file__).with_name("RELEASE")  # written by grader release


class _Commands:
    """The subparsers, offering only the student's commands in a release (every other is left unregistered)."""

    def __init__(self, sub: Any, student_only: bool):
        self.sub, self.student_only = sub, student_only

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        if self.student_only and name not in STUDENT_COMMANDS:
            return argparse.ArgumentParser(add_help=False)  # built and dropped: not a command of this copy
        return self.sub.add_parser(name, **kwargs)


def parser(student_only: bool | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="grader", description="Grade the LLM efficiency lab.")
    p.add_argument("--version", action="version", version=f"grader {__version__}")
    sub = _Commands(p.add_subparsers(dest="command", required=True),
                    RELEASE_MARKER.is_file() if student_only is None else student_only)

    g = sub.add_parser("grade", help="grade one submission (folder, flat files, .zip or .tar.gz)")
    g.add_argument("submission")
    g.add_argument("--out", "-o", help="write the JSON result here (kept up to date as checks finish)")
    g.add_argument("--format", choices=("table", "json"), default="table")
    g.add_argument("--summary", action="store_true", help="one line per exercise")
    add_grade_options(g)
    if not sub.student_only:  # the backends (grader/scale/) are not in a student's copy
        from grader.scale.backends import add_backend_options

        add_backend_options(g)
    g.set_defaults(fn=cmd_grade)

    dr = sub.add_parser("doctor", help="print the GPU, driver, CUDA, torch and triton this machine grades with")
    dr.add_argument("--json", action="store_true")
    dr.set_defaults(fn=cmd_doctor)

    gc = sub.add_parser("gpu-check", help="prove and calibrate every CUDA check on this GPU, in a bounded run")
    gc.add_argument("--dry-run", action="store_true", help="the CPU rehearsal: the same steps, the CUDA tests on the CPU")
    gc.add_argument("--budget-s", type=float, default=480.0, help="wall-time budget; steps that no longer fit are skipped")
    gc.add_argument("--out", default="gpu-check.json", help="the JSON report (default: gpu-check.json)")
    gc.add_argument("--step", action="append", choices=("doctor", "reference", "stubs", "known_wrong", "benches", "docker"),
                    help="run only this step (repeatable)")
    gc.set_defaults(fn=cmd_gpu_check)

    d = sub.add_parser("demo", help="grade the reference solutions and the starter stubs")
    d.add_argument("--seed", type=int)
    d.add_argument("--out", help="folder for the two JSON results")
    d.add_argument("--detail", action="store_true", help="also print each check")
    d.set_defaults(fn=cmd_demo)

    c = sub.add_parser("check", help="run the public tests on your exercises/ and show your progress")
    c.add_argument("exercise", nargs="?")
    c.add_argument("--from", dest="source", help="check DIR/<id>/<file> instead of exercises/ (e.g. solutions)")
    c.add_argument("-v", "--verbose", action="store_true", help="every failure in full, not only the first")
    c.add_argument("--call-timeout", type=float, default=None, metavar="S",
                   help="stop a test after S seconds (default: the exercise's limit for one call, course.yaml)")
    c.set_defaults(fn=cmd_check)

    h = sub.add_parser("hint", help="show the next hint for an exercise")
    h.add_argument("exercise")
    h.add_argument("--reset", action="store_true")
    h.set_defaults(fn=cmd_hint)

    pr = sub.add_parser("progress", help="what you have passed, tried and been hinted")
    pr.add_argument("exercise", nargs="?", help="one exercise: every check it is graded on, hidden ones included")
    pr.set_defaults(fn=cmd_progress)

    iv = sub.add_parser("interview", help="timed practice: start, check, done")
    iv.add_argument("action", choices=("start", "check", "done"))
    iv.add_argument("--level", choices=("easy", "medium", "hard"))
    iv.add_argument("--minutes", type=int)
    iv.add_argument("--exercise", help="this round instead of a random pick: <exercise> or <exercise>/<part>")
    iv.add_argument("--seed", type=int, help="fix the random pick")
    iv.set_defaults(fn=cmd_interview)

    nb = sub.add_parser("notebook", help="write exercises/<id>/<id>.ipynb, a starter notebook to hand in instead of the file")
    nb.add_argument("exercise")
    nb.add_argument("--force", action="store_true", help="overwrite the notebook if it exists")
    nb.set_defaults(fn=cmd_notebook)

    r = sub.add_parser("release", help="write the student repository (no solutions, no hidden tests)")
    r.add_argument("out")
    r.add_argument("--with-solutions", action="store_true", help="a teaching-assistant copy, clearly marked")
    r.set_defaults(fn=cmd_release)

    if not sub.student_only:  # grader/scale/ and grader/export/ are not in a student's copy
        from grader.scale.batch import add_commands as add_batch_commands
        from grader.export.cli import add_commands as add_export_commands
        from grader.scale.slurm import add_commands as add_slurm_commands

        add_batch_commands(sub)
        add_slurm_commands(sub)
        add_export_commands(sub)

    v = sub.add_parser("validate", help="check course.yaml and the exercises' files")
    v.set_defaults(fn=cmd_validate)

    nw = sub.add_parser("new", help="scaffold every file of a new exercise, with TODO markers where the author writes")
    nw.add_argument("exercise", help="the new exercise's id: a lower-case Python identifier")
    nw.add_argument("--title", help="its title in course.yaml (default: from the id)")
    nw.add_argument("--file", help="the student's file, NAME.py (default: <id>.py)")
    nw.set_defaults(fn=cmd_new)

    sy = sub.add_parser("sync", help="write every block derived from course.yaml (practice plan, points tables, hints)")
    sy.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each stale block")
    sy.set_defaults(fn=cmd_sync)

    s = sub.add_parser("schema", help="print a JSON Schema")
    s.add_argument("which", choices=("course", "result"), nargs="?", default="result")
    s.set_defaults(fn=cmd_schema)
    return p


def _input_errors() -> tuple[type[BaseException], ...]:
    """The errors that mean bad input (exit status 2). A BackendError only where a command loaded the backends
    (grader/scale/backend.py): no other command raises one, and a student's copy does not hold them."""
    backend = sys.modules.get("grader.scale.backend")
    return (UsageError, CourseError, KeyError, OptionsError) + ((backend.BackendError,) if backend else ())


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except _input_errors() as exc:
        err.print(Text.assemble(("error:", "red"), " ", inert(str(exc).strip(chr(39)).strip(chr(34)))))
        return 2


if __name__ == "__main__":
    sys.exit(main())
