"""PrairieLearn's external-grader ``results.json`` from a canonical result.

Mapping (schema: grader/schemas/prairielearn_results.schema.json):

* ``gradable``: false when the submission could not be read at all (the runner's ``gradable`` and
  ``format_errors``), or when no exercise could be graded (each file missing or not compiling: the
  exercises' messages are the ``format_errors``); PrairieLearn then records no score and charges the
  student no attempt. An
  ungradable result carries ``format_errors`` (a list of strings) and a ``message``, and no ``score``.
* ``score``: points / points possible, in 0..1. Points possible leave out the checks not graded here (no
  CUDA) unless course.yaml's ``export.prairielearn.count_ungraded_cuda`` is true.
* ``message``: the summary (score, what was not graded, the seed, warnings); ``output``: a score per exercise.
* ``tests``: one per check: ``name`` "<exercise>: <check id>", ``description`` the check's title,
  ``points``/``max_points``, ``message`` the check's message (or its status), ``output`` each failing
  test's message and traceback; a speed check with measured figures gets its roofline plot in ``images``.
* The file stays under PrairieLearn's 1 MB: plots go first, then each test's message and output are shortened.
* Every string is made inert (grader/text.py: no escape sequence or control character but newline and tab);
  PrairieLearn shows these fields as text.
"""

from __future__ import annotations

import json
from typing import Any

from grader.export.checks import (
    check_output,
    counts_toward,
    iter_checks,
    pts,
    summary,
    truncate,
)
from grader.export.settings import ExportSettings
from grader.text import inert_all

MAX_BYTES = 1_000_000  # PrairieLearn's limit on results.json


def to_prairielearn(result: dict, settings: ExportSettings | None = None, images: bool = True) -> dict:
    pl = (settings or ExportSettings()).prairielearn
    lines = summary(result, pl.count_ungraded_cuda, "by this grader")
    unusable = [ex for ex in result["exercises"] if ex["status"] in ("missing", "ungradable")]
    if result.get("gradable") is False or (result["exercises"] and len(unusable) == len(result["exercises"])):
        # Nothing could be graded (no file, a file that does not compile): PrairieLearn's convention is
        # gradable false with the reason, which charges the student no attempt.
        errors = [str(e) for e in result.get("format_errors") or []] or [
            str(ex["message"]) for ex in unusable if ex["message"]] or ["the submission could not be read"]
        return inert_all({"gradable": False, "format_errors": errors, "message": "\n".join(lines)})
    possible = result["max_score"] if pl.count_ungraded_cuda else result["gradable_max_score"]
    score = result["score"] / possible if possible > 0 else 0.0
    tests = []
    for _, ex, _, check in iter_checks(result):
        test: dict[str, Any] = {
            "name": f"{ex['id']}: {check['id']}",
            "description": check["title"],
            "points": round(check["points"], 4),
            "max_points": counts_toward(check, pl.count_ungraded_cuda),
            "message": check["message"] or check["status"],
            "output": check_output(check),
        }
        if images and any(t["metrics"] for t in check["tests"]):
            from grader.export.roofline import roofline_png_data_url

            url = roofline_png_data_url(check, ex["id"])
            if url:
                test["images"] = [{"label": f"{check['id']}: achieved against the measured ceilings", "url": url}]
        tests.append(test)
    table = "\n".join(f"{ex['id']:<20} {pts(ex['score']):>6}/{pts(ex['max_score']):<6} {ex['status']}"
                      + (f": {ex['message']}" if ex["message"] else "") for ex in result["exercises"])
    payload = {"gradable": True, "score": round(min(1.0, max(0.0, score)), 6), "message": "\n".join(lines),
               "output": table, "tests": tests}
    return fit(inert_all(payload))


def fit(payload: dict, limit: int = MAX_BYTES) -> dict:
    """Keep results.json under PrairieLearn's 1 MB: drop the plots first, then shorten each test's text."""
    if len(json.dumps(payload)) <= limit:
        return payload
    for test in payload["tests"]:
        test.pop("images", None)
    keep = 4000
    while len(json.dumps(payload)) > limit and keep >= 100:
        for test in payload["tests"]:
            test["message"] = truncate(test["message"], keep)
            test["output"] = truncate(test["output"], keep)
        payload["output"] = truncate(payload["output"], keep)
        keep //= 2
    return payload
