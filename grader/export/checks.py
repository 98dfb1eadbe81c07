"""What every export says about a check: its text, its speed figure, and the submission's summary."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from grader.results import failed_by_grader
from grader.text import inert

MAX_CHECK_OUTPUT = 8000  # characters of detail per check: a flood of output must not bury the rest
NOT_GRADED = "not graded here: this check needs a CUDA device"


class GradeFailed(Exception):
    """The result records a failure of the grading machine (a regrade, `grader.results.failed_by_grader`): it has
    no score, and no gradebook may post the points it holds as one."""


def refuse_grader_failure(result: dict) -> None:
    """Raise `GradeFailed` for a result whose grade failed on the grader's side: every export that posts a score
    (Gradescope, the CSV gradebook; PrairieLearn answers `gradable: false`, nbgrader writes nothing) calls it."""
    if failed_by_grader(result):
        reason = str((result.get("failure") or {}).get("reason") or "no reason recorded")
        raise GradeFailed(f"the grade failed on the grader's side ({inert(reason, 300)}): it has no score to post; "
                          "regrade it")


def pts(value: float) -> str:
    return f"{round(float(value), 2):g}"


def truncate(text: str, limit: int = MAX_CHECK_OUTPUT) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... ({len(text) - limit} more characters cut)"


def iter_checks(result: dict) -> Iterator[tuple[int, dict, int, dict]]:
    """(exercise number, exercise, check number, check), numbered from 1 in the result's order."""
    for i, ex in enumerate(result["exercises"], 1):
        for j, check in enumerate(ex["checks"], 1):
            yield i, ex, j, check


def is_speed(check: dict) -> bool:
    return any(t["metrics"] for t in check["tests"]) or check["id"].endswith("_speed")


def speed_metric(check: dict, exercise_id: str, course: Any = None) -> str | None:
    """The metric a speed check is scored on: course.yaml's `speed.metric`, else the figure recorded
    just before `bar` (the plugin's `score.speed` records the metric, then `bar` and `floor`)."""
    if course is not None:
        try:
            bar = course.exercise(exercise_id).check(check["id"]).speed
        except KeyError:
            bar = None
        if bar is not None:
            return bar.metric
    for test in check["tests"]:
        keys = list(test["metrics"])
        if "bar" in keys and keys.index("bar") > 0:
            return keys[keys.index("bar") - 1]
    return None


def speed_value(check: dict, metric: str | None) -> float | None:
    """The mean of `metric` over the check's tests that measured it; None if none did."""
    values = [t["metrics"][metric] for t in check["tests"] if metric and metric in t["metrics"]]
    return sum(values) / len(values) if values else None


# A speed test's achieved fraction of a ceiling measured in the same run: recorded as such, or worked
# out from an achieved rate and its ceiling (grader/speed.py's copy bandwidth and bf16 matmul).
CEILING_FRACTIONS = ("fraction_of_copy_bandwidth", "fraction_of_matmul")
RATE_AND_CEILING = (("fraction_of_copy_bandwidth", ("gbps",), "copy_gbps"),
                    ("fraction_of_matmul", ("tflops", "student_tflops"), "matmul_tflops"))


def _test_ceiling_fraction(metrics: dict) -> tuple[str, float] | None:
    for name in CEILING_FRACTIONS:
        if name in metrics:
            return name, metrics[name]
    for name, rates, ceiling in RATE_AND_CEILING:
        rate = next((metrics[k] for k in rates if k in metrics), None)
        if rate is not None and metrics.get(ceiling):
            return name, rate / metrics[ceiling]
    return None


def ceiling_fraction(check: dict, metric: str | None = None) -> tuple[str, float] | None:
    """(name, value) of a speed check's leaderboard figure: the mean achieved fraction of the measured
    ceiling over the tests that measured one (the scored metric first, when it is such a fraction).
    A check that measured no ceiling (it is timed against a library call only) falls back to its
    scored metric, named as such; None when it measured nothing (no CUDA)."""
    found = [f for f in (_test_ceiling_fraction(t["metrics"]) for t in check["tests"]) if f is not None]
    if metric in CEILING_FRACTIONS:
        found = [f for f in found if f[0] == metric] or found
    if found:
        name = found[0][0]
        values = [v for n, v in found if n == name]
        return name, sum(values) / len(values)
    value = speed_value(check, metric)
    return (f"{metric} (no ceiling measured)", value) if value is not None else None


def counts_toward(check: dict, count_ungraded_cuda: bool) -> float:
    """The points a check is out of in an export: a check not graded here counts only if the course says so."""
    return check["max_points"] if check["status"] != "not_graded" or count_ungraded_cuda else 0.0


def check_output(check: dict) -> str:
    """Plain-text detail of one check: outcome, message, each test that did not pass, speed figures
    (inert: no escape sequence or control character but newline and tab)."""
    lines = [f"{check['status']}: {pts(check['points'])}/{pts(check['max_points'])} points"]
    if check["status"] == "not_graded" and not check["message"]:
        lines.append(NOT_GRADED)
    if check["message"]:
        lines.append(check["message"])
    tests = check["tests"]
    if not tests and not check["message"] and check["status"] != "not_graded":
        lines.append("no test of this check ran")
    if tests:
        tally = Counter(t["status"] for t in tests)
        lines.append("tests: " + ", ".join(f"{n} {status}" for status, n in sorted(tally.items())))
    for test in tests:
        if test["status"] not in ("passed", "not_graded"):
            lines.append(f"- {test['name']} [{test['status']}]: {test['message']}".rstrip())
            if test["traceback"]:
                lines.extend("    " + line for line in test["traceback"].rstrip().splitlines())
        if test["metrics"]:
            figures = ", ".join(f"{k} = {v:.4g}" for k, v in test["metrics"].items())
            lines.append(f"- {test['name']}: {figures}")
    return truncate(inert("\n".join(lines)))


def summary(result: dict, count_ungraded_cuda: bool, where: str, score: bool = True,
            warnings: bool = True) -> list[str]:
    """The submission's headline: score (unless `score` is False: a platform that withholds hidden tests),
    what was not graded here and whether it counts, seed, warnings (unless `warnings` is False); each line
    inert."""
    lines = [(f"{result['course']} {result['course_version']} · submission {result['submission']['id']} · "
              f"grader {result['grader_version']}")]
    if result.get("gradable") is False:
        lines.append("This submission could not be graded:")
        lines.extend(f"  {e}" for e in result.get("format_errors") or ["(no reason recorded)"])
        return [inert(line) for line in lines]
    ungraded = result["max_score"] - result["gradable_max_score"]
    out_of = result["max_score"] if count_ungraded_cuda else result["gradable_max_score"]
    if score:
        lines.append(f"Score: {pts(result['score'])}/{pts(out_of)}")
    if ungraded > 0:
        counted = ("they count as 0 until graded on a CUDA machine" if count_ungraded_cuda
                   else "they do not count here")
        lines.append(f"{pts(ungraded)} points need a CUDA device and were not graded {where}; {counted}.")
    if result["state"] != "complete":
        lines.append("Grading did not finish: checks without a result scored 0 (see each check's message).")
    lines.append(f"Seed: {result['seed']} (an instructor reproduces this run with `grader grade --seed {result['seed']}`).")
    if warnings:
        lines.extend(f"warning: {w}" for w in result["warnings"])
    return [inert(line) for line in lines]
