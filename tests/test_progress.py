"""Long work says how far it has got: a line per exercise as it finishes (plain without a terminal, with rich's
progress bar on one), on standard error so that standard output keeps the table or the JSON."""

import io
import re

from rich.console import Console

from grader import results
from grader.progress import GradeProgress
from tests.conftest import COURSE


def snapshots():
    """The result as the runner saves it: one exercise running, then graded; one missing; one ungradable."""
    exercises = [COURSE.exercise(e) for e in ("online_softmax", "paged_kv", "gptq")]
    result = results.new_result(COURSE, "s", "ab" * 32, "cd" * 32, 1, "sandbox", exercises)
    yield result
    results.find_exercise(result, "online_softmax")["status"] = "running"
    yield result
    yield result  # saved again after a test: nothing new to say
    results.find_exercise(result, "online_softmax").update(status="graded", duration_s=12.4)
    results.close_exercise(result, "online_softmax", "")
    yield result
    results.find_exercise(result, "paged_kv")["status"] = "missing"
    results.close_exercise(result, "paged_kv", "not submitted")
    yield result
    results.find_exercise(result, "gptq")["status"] = "ungradable"
    results.close_exercise(result, "gptq", "does not compile")
    yield result


def test_plain_lines_one_per_exercise_without_a_terminal():
    console = Console(file=io.StringIO(), width=120)
    with GradeProgress("reference", ["online_softmax", "paged_kv", "gptq"], console) as progress:
        for result in snapshots():
            progress(result)
    lines = console.file.getvalue().splitlines()
    assert len(lines) == 3, f"one line per exercise, each once: {lines}"
    assert re.fullmatch(r"  reference: online_softmax 0/100 \(graded, 12 s\) \[1/3\]", lines[0]), lines[0]
    assert "paged_kv 0/100 (missing)" in lines[1] and lines[1].endswith("[2/3]"), lines[1]
    assert "gptq 0/100 (ungradable" in lines[2] and lines[2].endswith("[3/3]"), lines[2]


def test_a_terminal_gets_the_bar_and_the_same_lines():
    console = Console(file=io.StringIO(), width=120, force_terminal=True, color_system=None)
    with GradeProgress("reference", ["online_softmax", "paged_kv", "gptq"], console) as progress:
        assert progress.bar is not None, "a terminal gets rich's progress bar"
        for result in snapshots():
            progress(result)
        assert progress.bar.tasks[0].completed == 3
    out = console.file.getvalue()
    for ex_id in ("online_softmax", "paged_kv", "gptq"):
        assert f"reference: {ex_id} 0/100" in out, out
