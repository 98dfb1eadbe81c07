"""Student text is inert everywhere (tests/hostile/terminal_escapes.py): a submission whose every call
raises (and prints) rich markup, ANSI escapes that clear the screen and draw a fake "100/100" row, OSC
title and hyperlink sequences, an 8-bit CSI, a carriage return and bidi overrides. Graded for real, by
`grader grade` and `grader check`, and rendered by every renderer: none may crash, none may pass an
escape sequence or a control character on, and the markup must show literally."""

from __future__ import annotations

import ast
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from grader import report, results
from grader.scale import slurm
from grader.scale import summary as batch_summary
from grader.export.checks import check_output
from grader.export.csv_gradebook import to_csv
from grader.export.feedback import render_feedback
from grader.export.gradescope import to_gradescope
from grader.export.load import Loaded
from grader.export.prairielearn import to_prairielearn
from grader.text import inert, inert_all
from tests.conftest import COURSE, ROOT

HOSTILE = Path(__file__).parent / "hostile" / "terminal_escapes.py"
EXERCISE = "online_softmax"
MARKUP = "[/] [bold red]x[/]"  # rich would crash on the first and restyle with the second
# What must never reach an output: ESC, C0 controls but tab and newline, DEL, C1 controls, bidi controls.
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def controls_in(text: str) -> list[str]:
    return sorted({repr(c) for c in CONTROL.findall(text)})


def assert_inert(text: str, where: str) -> None:
    assert not controls_in(text), f"{where} holds control characters {controls_in(text)}: {text[:300]!r}"


def strings_of(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in strings_of(k) + strings_of(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in strings_of(v)]
    return []


def grader(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "CLICOLOR_FORCE")}
    return subprocess.run([sys.executable, "-m", "grader", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**env, "COLUMNS": "220", "TERM": "xterm-256color"}, timeout=600)


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict:
    """`grader grade` on the hostile submission: its exit status, what it printed, and its result file."""
    folder = tmp_path_factory.mktemp("mallory")
    (folder / f"{EXERCISE}.py").write_text(HOSTILE.read_text())
    out = folder.parent / "mallory.json"
    logs = folder.parent / "mallory-logs"
    run = grader("grade", str(folder), "-e", EXERCISE, "--tests", "public", "--seed", "5", "-o", str(out),
                 "--log-dir", str(logs))
    return {"run": run, "result": json.loads(out.read_text()) if out.exists() else None, "logs": logs}


def test_the_instructors_pytest_log_holds_the_text_inert(graded):
    log = (graded["logs"] / f"{EXERCISE}.log").read_text()
    assert "RuntimeError" in log and "total 100/100" in log, "the log must hold the failures, with the student's text"
    assert_inert(log, "the pytest log that --log-dir keeps (an instructor reads it on a terminal)")


def test_grader_grade_exits_0_and_prints_the_markup_literally(graded):
    run = graded["run"]
    assert run.returncode == 0, f"grader grade failed on student text (exit {run.returncode}): {run.stderr[-2000:]}"
    assert MARKUP in run.stdout, f"expected the markup shown as text, found:\n{run.stdout}"
    assert_inert(run.stdout + run.stderr, "grader grade's output")
    result = graded["result"]
    total = next(line for line in run.stdout.splitlines() if line.strip().startswith("total"))
    assert total.split()[1] == f"{result['score']:g}/{result['max_score']:g}" and "100/100" not in total, (
        f"the total row must show the honest score, found {total!r}")


def test_the_result_holds_the_text_inert(graded):
    result = graded["result"]
    results.validate(result)
    assert result["score"] == 0
    tests = [t for c in result["exercises"][0]["checks"] for t in c["tests"]]
    assert tests and all(MARKUP in t["message"] for t in tests), "the student's message must survive, made inert"
    assert any("RuntimeError" in t["traceback"] for t in tests)
    for text in strings_of(result):
        assert_inert(text, "the result")


def render_all(result: dict) -> dict[str, str]:
    """Every renderer's output for `result` (as text), the terminal ones without colour and with it."""
    out: dict[str, str] = {}
    for colour in (None, "truecolor"):
        console = Console(file=io.StringIO(), width=200, color_system=colour, force_terminal=colour is not None)
        report.print_result(result, console)
        console.print(report.progress_table(result))
        console.print(report.comparison_table([result, result]))
        out[f"terminal ({colour or 'plain'})"] = console.file.getvalue()
    checks = [c for e in result["exercises"] for c in e["checks"]]
    out["check_output"] = "\n".join(check_output(c) for c in checks)
    out["feedback"] = render_feedback(result, COURSE, plots=False)
    out["gradescope"] = json.dumps(to_gradescope(result, course=COURSE), ensure_ascii=False)
    out["prairielearn"] = json.dumps(to_prairielearn(result, images=False), ensure_ascii=False)
    out["csv"] = to_csv([Loaded(result["submission"]["id"], Path("x.json"), result)], COURSE)
    return out


def test_every_renderer_shows_the_real_result_inert(graded):
    rendered = render_all(graded["result"])
    for name, text in rendered.items():
        assert "\x1b[2J" not in text and "\x1b]" not in text and "\x9b" not in text, f"{name} passed an escape on"
        if "truecolor" not in name:  # rich's own colours are escapes; the student's are checked above
            assert_inert(text, name)
    assert MARKUP in rendered["terminal (plain)"] and MARKUP in rendered["check_output"]
    assert MARKUP in rendered["feedback"] and MARKUP in rendered["gradescope"]


def test_grader_check_prints_the_first_failure_inert(tmp_path):
    (tmp_path / EXERCISE).mkdir()
    (tmp_path / EXERCISE / f"{EXERCISE}.py").write_text(HOSTILE.read_text())
    run = grader("check", EXERCISE, "--from", str(tmp_path))
    assert run.returncode == 1, f"a failing public test fails `grader check` (exit 1): {run.stderr[-2000:]}"
    assert "FAILED " + EXERCISE in run.stdout and MARKUP in run.stdout, run.stdout
    assert_inert(run.stdout + run.stderr, "grader check's output")


# ---------------------------------------------------------------------------------------------
# each renderer on its own (defence in depth): a result whose text never went through record_test

def _hostile_string() -> str:
    """The hostile module's EVIL, read from its source (student code is never imported here)."""
    tree = ast.parse(HOSTILE.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "EVIL")
    return ast.literal_eval(node.value)


EVIL = _hostile_string()


def raw_result(student: str = "mallory") -> dict:
    """A result carrying raw hostile text in every free-text field, as a tampered or buggy producer might."""
    ex = COURSE.exercise(EXERCISE)
    r = results.new_result(COURSE, student, "ab" * 32, "cd" * 32, 3, "sandbox", [ex])
    r["gradable"] = True
    for check in r["exercises"][0]["checks"]:
        check["tests"].append({"name": f"test_x[{EVIL}]", "status": "failed", "fraction": 0.0, "message": EVIL,
                               "traceback": f'  File "online_softmax.py", line 1\n{EVIL}', "duration_s": 0.1,
                               "metrics": {}})
        results.rescore_check(check)
    r["warnings"] = [EVIL]
    results.close_exercise(r, EXERCISE, EVIL)
    results.finish(r)
    results.validate(r)
    return r


def test_record_test_makes_messages_and_tracebacks_inert():
    r = results.new_result(COURSE, "s", "", "", 0, "sandbox", [COURSE.exercise(EXERCISE)])
    check = COURSE.exercise(EXERCISE).checks[0].id
    results.record_test(r, {"exercise": EXERCISE, "check": check, "test": "t", "status": "failed",
                            "message": EVIL + "\ud800", "traceback": EVIL * 2000})
    test = r["exercises"][0]["checks"][0]["tests"][0]
    assert_inert(test["message"] + test["traceback"], "record_test")
    assert MARKUP in test["message"] and "\ud800" not in test["message"]
    assert len(test["traceback"]) <= results.MAX_TRACEBACK_CHARS + 100 and test["traceback"].endswith("characters cut)")


def test_each_renderer_strips_raw_text_itself():
    result = raw_result("mallory\x1b[2J\u202e")
    for name, text in render_all(result).items():
        assert "\x1b[2J" not in text and "\x1b]" not in text and "\x9b" not in text, f"{name} passed an escape on"
        if "truecolor" not in name:
            assert_inert(text, name)
        assert MARKUP in text or name == "csv", f"{name} lost the literal markup"


def test_batch_and_slurm_summaries_print_student_text_inert(tmp_path):
    result = raw_result()
    result["exercises"][0]["checks"][0]["message"] = EVIL
    (tmp_path / "mallory.json").write_text(json.dumps(result))
    ungradable = dict(raw_result(), gradable=False, format_errors=[EVIL])
    (tmp_path / "[bold]eve\x1b[2J.json").write_text(json.dumps(ungradable))
    summary = batch_summary.summarize(COURSE, tmp_path, ["mallory", "[bold]eve\x1b[2J"], [EXERCISE])
    console = Console(file=io.StringIO(), width=200, color_system=None)
    batch_summary.print_summary(summary, console)
    rows = [slurm.Row(0, "[/]mallory\x1b[2J", "failed", "12_0 FAILED", EVIL, None)]
    slurm.print_rows(rows, console, "grader slurm: results")
    lines = [batch_summary.one_line("[/]x\x1b]0;t\x07", result, None), batch_summary.one_line("y", None, EVIL),
             batch_summary.one_line("z", ungradable, None)]
    text = console.file.getvalue() + "\n".join(lines)
    assert_inert(text, "the batch and slurm tables")
    assert "[bold]eve" in text and "[/]mallory" in text and MARKUP in text


def test_inert_removes_sequences_whole_and_keeps_the_text():
    assert inert("a\x1b[2Jb\x1b[1;31mc\x1b[0m") == "abc"
    assert inert("t\x1b]0;title\x07u\x1b]8;;http://e\x1b\\link\x1b]8;;\x1b\\v") == "tulinkv"
    assert inert("x\x1b]0;no end\ny") == "x\ny", "an unterminated OSC goes to the end of its line only"
    assert inert("a\x9b2Jb\x85c\x00d\x7fe") == "a" + "bcde"
    assert inert("line\rover\r\nnext\u2028sep") == "line\nover\nnext\nsep", "a CR cannot rewind a line"
    assert inert("\u202egnissap\u202c \u2066x\u2069") == "gnissap x"
    assert inert("tab\tand\nnewline [/] <b>") == "tab\tand\nnewline [/] <b>"
    assert inert("lone \ud800 surrogate") == "lone  surrogate"
    assert inert("x" * 100, 10) == "x" * 10 + "\n... (90 more characters cut)"
    assert inert_all({"k\x1b[2J": ["v\x07", 1, None]}) == {"k": ["v", 1, None]}
