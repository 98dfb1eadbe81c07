"""Progress of a long grade, per exercise: what `grader demo` and `grader grade` show while they work.

The runner saves the result after every test (grader.runner.grade's `on_update`); `GradeProgress` reads
each exercise's status from it. With a terminal attached it draws rich's progress bar, one step per
exercise, and prints a line as each exercise finishes; without one (CI, a log file) it prints the
plain lines only. Both go to standard error, so standard output keeps the table or the JSON.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from grader.text import inert

DONE = ("graded", "ungradable", "missing")  # an exercise in any of these is finished (the result schema's)


class GradeProgress:
    """Call with the result each time it is saved; use as a context manager around the grade."""

    def __init__(self, label: str, exercises: list[str], console: Console):
        self.label, self.exercises, self.console = label, exercises, console
        self.started: dict[str, float] = {}
        self.finished: set[str] = set()
        self.bar: Progress | None = None
        self.task: Any = None

    def __enter__(self) -> "GradeProgress":
        if self.console.is_terminal:
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=self.console, transient=True)
            self.bar.start()
            self.task = self.bar.add_task(f"grading {inert(self.label)}", total=len(self.exercises))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def __call__(self, result: dict) -> None:
        for ex in result.get("exercises", []):
            ex_id, status = ex["id"], ex.get("status")
            if ex_id in self.finished:
                continue
            if status == "running" and ex_id not in self.started:
                self.started[ex_id] = time.monotonic()
                if self.bar is not None:
                    self.bar.update(self.task, description=f"grading {inert(self.label)}: {inert(ex_id)}")
            elif status in DONE and (ex_id in self.started or status in ("missing", "ungradable")):
                self.finished.add(ex_id)
                took = ex.get("duration_s") or (time.monotonic() - self.started[ex_id] if ex_id in self.started else 0)
                line = (f"  {self.label}: {ex_id} {ex['score']:g}/{ex['max_score']:g} ({status}"
                        f"{f', {took:.0f} s' if took else ''}) [{len(self.finished)}/{len(self.exercises)}]")
                self.console.print(inert(line), markup=False, highlight=False)
                if self.bar is not None:
                    self.bar.update(self.task, completed=len(self.finished))
