"""Gradescope's ``results.json`` from a canonical result (the Gradescope autograder specification).

Mapping (schema: grader/schemas/gradescope_results.schema.json):

* top level: ``score`` = the result's score; ``execution_time`` = seconds from start to finish;
  ``output`` = the summary (score, points not graded here, seed, warnings, or why it was ungradable);
  ``stdout_visibility`` from course.yaml; ``extra_data`` = seed, hashes and versions, for reproducing a run.
* ``tests``: one per check, in course.yaml's order. ``name`` "<exercise>: <check title>", ``number``
  "<exercise #>.<check #>", ``score``/``max_score`` the check's points, ``status`` "passed" when the check
  passed, else "failed", ``output`` the check's message and each failing test's message and traceback,
  ``tags`` [exercise id, check id, public|hidden, speed?, cuda?], ``visibility`` from course.yaml
  (public checks "visible", hidden ones "after_published" by default).
* A check that needs CUDA is never graded on Gradescope. With ``count_ungraded_cuda: false`` (the default)
  it is left out of ``tests`` (Gradescope shows a test without a status as passed) and the top-level output
  names it ("not graded here: ..."); with ``true`` it counts as 0 of its points and "failed".
* Visibility: while any test is hidden from the student (its visibility is not "visible"), the top-level
  ``output`` holds no score (Gradescope hides the total until the hidden tests show) and no warnings; the
  warnings, meant for the instructor, go to ``extra_data.warnings`` either way.
* ``leaderboard`` (when course.yaml enables it): per speed check that was measured, its achieved
  fraction of the ceiling measured in the same run (copy bandwidth or bf16 matmul), the mean over its
  tests, higher is better; a check that measures no ceiling (timed against a library call only) shows
  its scored ratio instead, named "<metric> (no ceiling measured)".

Student text: ``output_format`` and ``test_output_format`` are "text", which Gradescope shows as plain
preformatted text (no Markdown, no HTML, so nothing to escape for it), and every string of the payload is
made inert (grader/text.py: no escape sequence or control character but newline and tab).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from grader.export.checks import (
    ceiling_fraction,
    check_output,
    counts_toward,
    is_speed,
    iter_checks,
    refuse_grader_failure,
    speed_metric,
    summary,
)
from grader.export.settings import ExportSettings
from grader.text import inert_all


def execution_time(result: dict) -> float:
    try:
        start = dt.datetime.fromisoformat(result["started_at"])
        end = dt.datetime.fromisoformat(result["finished_at"])
        return max(0.0, (end - start).total_seconds())
    except (TypeError, ValueError):
        return round(sum(e["duration_s"] for e in result["exercises"]), 3)


def to_gradescope(result: dict, settings: ExportSettings | None = None, course: Any = None,
                  execution_time_s: float | None = None) -> dict:
    refuse_grader_failure(result)  # a grade the grader failed on is a failed autograder run, never a partial score
    gs = (settings or ExportSettings()).gradescope
    withheld = any(getattr(gs.visibility, check["visibility"]) != "visible" for _, _, _, check in iter_checks(result))
    headline = summary(result, gs.count_ungraded_cuda, "on Gradescope", score=not withheld, warnings=False)
    ungraded = [f"{ex['id']}: {check['title']}" for _, ex, _, check in iter_checks(result)
                if check["status"] == "not_graded" and not gs.count_ungraded_cuda]
    if ungraded:
        headline.append("Not graded here (needs a CUDA device): " + "; ".join(ungraded) + ".")
    out: dict[str, Any] = {
        "score": round(result["score"], 4),
        "execution_time": round(execution_time(result) if execution_time_s is None else execution_time_s, 3),
        "output": "\n".join(headline),
        "output_format": "text",
        "test_output_format": "text",
        "stdout_visibility": gs.stdout_visibility,
        "extra_data": {
            "seed": result["seed"],
            "submission_sha256": result["submission"]["sha256"],
            "suite_sha256": result["suite_sha256"],
            "grader_version": result["grader_version"],
            "course_version": result["course_version"],
            "gradable": result.get("gradable", True),
            "warnings": list(result["warnings"]),
        },
        "tests": [],
    }
    leaderboard = []
    for i, ex, j, check in iter_checks(result):
        not_graded = check["status"] == "not_graded"
        if not_graded and not gs.count_ungraded_cuda:
            continue  # named in the top-level output instead: a test without a status reads as passed
        test: dict[str, Any] = {
            "name": f"{ex['id']}: {check['title']}",
            "number": f"{i}.{j}",
            "score": round(check["points"], 4),
            "max_score": counts_toward(check, gs.count_ungraded_cuda),
            "output": check_output(check),
            "tags": [ex["id"], check["id"], check["visibility"]] + (["speed"] if is_speed(check) else [])
                    + (["cuda"] if check["cuda"] else []),
            "visibility": getattr(gs.visibility, check["visibility"]),
        }
        test["status"] = "passed" if check["status"] == "passed" else "failed"
        out["tests"].append(test)
        if gs.leaderboard and is_speed(check):
            figure = ceiling_fraction(check, speed_metric(check, ex["id"], course))
            if figure is not None:
                leaderboard.append({"name": f"{ex['id']}/{check['id']}: {figure[0]}", "value": round(figure[1], 4),
                                    "order": "desc"})
    if gs.leaderboard:
        out["leaderboard"] = leaderboard
    return inert_all(out)
