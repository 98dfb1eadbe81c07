"""Terminal rendering of results with rich: the score table, per-check detail, the progress table.

Student text (messages, ids, warnings) is never rich markup here: every such cell is a `rich.text.Text`
of the text made inert (grader/text.py), so ``[/]`` shows as ``[/]`` and an escape sequence is gone.
"""

from __future__ import annotations

import re

from pathlib import Path
from typing import NamedTuple

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from grader.text import inert

STYLE = {"passed": "green", "failed": "red", "error": "red", "timeout": "magenta", "not_graded": "dim",
         "pending": "yellow", "missing": "red", "ungradable": "red"}


def _points(earned: float, possible: float) -> str:
    return f"{round(earned, 2):g}/{round(possible, 2):g}"


class Failure(NamedTuple):
    """One public test that did not pass, as `make check` and `make interview-check` list it."""

    exercise: str
    where: str  # "online_softmax, check softmax: test_name"
    first_line: str
    message: str
    traceback: str
    not_started: bool  # the stub's NotImplementedError: nothing written yet


def failures(result: dict, checks: set[str] | None = None) -> list[Failure]:
    """Every test that failed, errored or timed out, in order (only `checks`, when given)."""
    found = []
    for ex in result["exercises"]:
        for check in ex["checks"]:
            if checks is not None and check["id"] not in checks:
                continue
            for test in check["tests"]:
                if test["status"] in ("passed", "not_graded"):
                    continue
                found.append(Failure(ex["id"], f"{ex['id']}, check {check['id']}: {test['name']}",
                                     _first_line(test["message"]), test["message"], test.get("traceback") or "",
                                     "NotImplementedError" in test["message"]))
    return found


def not_written(found: list[Failure]) -> dict[str, tuple[list[str], int]]:
    """Per exercise, the functions its failing tests found still raising the stub's NotImplementedError (in the
    order the tests met them; the stub's message starts with the function's name) and how many tests wait on
    them."""
    by_exercise: dict[str, tuple[list[str], int]] = {}
    for failure in found:
        if not failure.not_started:
            continue
        names, count = by_exercise.get(failure.exercise, ([], 0))
        match = re.search(r"NotImplementedError:? ([A-Za-z_][\w.]*)", failure.message)
        name = match.group(1) if match else _raising_function(failure.traceback) or "a function of the stub"
        by_exercise[failure.exercise] = (names if name in names else [*names, name], count + 1)
    return by_exercise


def _raising_function(traceback: str) -> str:
    """The function a bare `raise NotImplementedError` came from (a stub whose message does not start with the
    function's name): the last frame pytest's traceback shows, `path.py:31: in copy_to_tp`."""
    frames = re.findall(r"^\S+\.py:\d+: in ([A-Za-z_]\w*)\s*$", traceback, re.MULTILINE)
    return frames[-1] if frames and frames[-1] != "<module>" else ""


class NotRun(NamedTuple):
    """An exercise whose file was not run: it does not compile, or it raised while it was imported (the grade's
    "ungradable", grader/runner.py grade_exercise); no test of it says anything about the code."""

    exercise: str
    message: str  # "<file> does not compile: SyntaxError at line 3, column 7: ...", or why the import failed
    traceback: str  # the import's traceback (its line in the student's file), "" for a file that does not compile


def not_run(result: dict) -> dict[str, NotRun]:
    """Every exercise of `result` whose file did not compile or import, by id."""
    found = {}
    for ex in result["exercises"]:
        if ex.get("status") != "ungradable":
            continue
        tests = [t for c in ex["checks"] for t in c["tests"] if t.get("traceback")]
        found[ex["id"]] = NotRun(ex["id"], inert(ex.get("message") or "the file could not be run", 1000),
                                 tests[0]["traceback"] if tests else "")
    return found


def readme_section(path: Path, title: str) -> str:
    """The text of a README's `## <title>` section (up to the next `## `), or "" when there is none."""
    try:
        return markdown_section(path.read_text(), title)
    except OSError:
        return ""


def markdown_section(text: str, title: str) -> str:
    """The text of a markdown `## <title>` section (up to the next `## `), or "" when there is none."""
    out: list[str] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("## "):
            if inside:
                break
            inside = line[3:].strip().lower() == title.lower()
        if inside:
            out.append(line)
    return "\n".join(out).strip()


MAX_CAUSE = 2000  # characters of a message's first line kept: a cause is wrapped, never cut; a flood is


def _first_line(text: str) -> str:
    """A message's first line, whole (the terminal wraps it: a cause is never cut at a width)."""
    text = inert(text, MAX_CAUSE).strip()
    return text.splitlines()[0] if text else ""


def plain(text: object, style: str = "") -> Text:
    """Student text as a rich cell: inert, never markup."""
    return Text(inert(text), style=style)


def score_table(result: dict, detail: bool = True) -> Table:
    title = plain(f"{result['course']} · submission {result['submission']['id']} · seed {result['seed']}")
    table = Table(title=title, box=box.SIMPLE_HEAVY, show_lines=False, title_justify="left")
    table.add_column("exercise / check", overflow="fold")
    table.add_column("points", justify="right", no_wrap=True)
    table.add_column("status", overflow="fold")
    table.add_column("message", overflow="fold")
    for ex in result["exercises"]:
        ungraded = sum(c["max_points"] for c in ex["checks"] if c["status"] == "not_graded")
        note = f" ({ungraded:g} not graded here)" if ungraded else ""
        table.add_row(plain(ex["id"], style="bold"), Text(_points(ex["score"], ex["max_score"]), style="bold"),
                      plain(ex["status"], style=STYLE.get(ex["status"], "")), Text(_first_line(ex["message"]) + note))
        if detail:
            for c in ex["checks"]:
                table.add_row(plain(f"  {c['id']}"), _points(c["points"], c["max_points"]),
                              plain(c["status"], style=STYLE.get(c["status"], "")), Text(_first_line(c["message"])))
    total = Text(f"{result['score']:g}/{result['max_score']:g}", style="bold")
    table.add_row(Text("total", style="bold"), total, "",
                  f"{result['gradable_max_score']:g} of {result['max_score']:g} points gradable on this machine")
    return table


def comparison_table(results: list[dict]) -> Table:
    """One row per exercise, one column per submission: the main job's summary."""
    table = Table(title="score table", box=box.SIMPLE_HEAVY, title_justify="left")
    table.add_column("exercise")
    for r in results:
        table.add_column(plain(r["submission"]["id"]), justify="right")
    table.add_column("not graded here (no CUDA)", justify="right")
    for i, ex in enumerate(results[0]["exercises"]):
        ungraded = sum(c["max_points"] for c in ex["checks"] if c["status"] == "not_graded")
        cells = [_points(r["exercises"][i]["score"], r["exercises"][i]["max_score"]) for r in results]
        table.add_row(plain(ex["id"]), *cells, f"{ungraded:g}" if ungraded else "")
    table.add_row(Text("total", style="bold"), *[Text(_points(r["score"], r["max_score"]), style="bold") for r in results],
                  f"{results[0]['max_score'] - results[0]['gradable_max_score']:g}")
    return table


def progress_table(result: dict) -> Table:
    """`make check`: per exercise, public tests passed and points, and what to look at next."""
    table = Table(title="your progress (public tests)", box=box.SIMPLE_HEAVY, title_justify="left")
    table.add_column("exercise", no_wrap=True)
    table.add_column("tests", justify="right", no_wrap=True)
    table.add_column("points", justify="right", no_wrap=True)
    table.add_column("next", overflow="fold")  # a long path or word folds; nothing is cut
    pointed = False  # "start here" goes on the first exercise not started, the others just say so
    for ex in result["exercises"]:
        tests = [t for c in ex["checks"] for t in c["tests"]]
        passed = sum(t["status"] == "passed" for t in tests)
        public = [c for c in ex["checks"] if c["visibility"] == "public"]
        earned = sum(c["points"] for c in public)
        possible = sum(c["max_points"] for c in public)
        bad = next((t for t in tests if t["status"] not in ("passed", "not_graded")), None)
        if not tests:
            nxt = Text(_first_line(ex["message"]) or "no tests ran", style="red")
        elif bad is None:
            nxt = Text("all public tests pass: the hidden tests check more (README, 'How it is graded')", style="green")
        elif all(t["status"] != "passed" for t in tests) and "NotImplementedError" in bad["message"]:
            nxt = (Text("not started", style="dim") if pointed else
                   Text(f"start here: read exercises/{ex['id']}/README.md, then fill in {ex['id']}.py", style="yellow"))
            pointed = True
        else:
            nxt = Text(f"{_first_line(bad['name'])}: {_first_line(bad['message'])}", style="red")
        # a file that did not compile or import ran no test: "not run", not an empty 0/0 (the reason is in "next")
        table.add_row(plain(ex["id"]), f"{passed}/{len(tests)}" if tests else "not run", _points(earned, possible), nxt)
    return table


def print_result(result: dict, console: Console | None = None, detail: bool = True) -> None:
    console = console or Console()
    console.print(score_table(result, detail))
    for warning in result.get("warnings", []):
        console.print(Text.assemble(("warning:", "yellow"), " ", inert(warning)))
