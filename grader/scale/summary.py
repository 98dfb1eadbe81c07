"""The batch's summary: per-exercise statistics over the graded submissions, the most-failed checks,
the submissions without a full grade, a histogram (RESULTS_DIR/scores.png) and the console tables.
"""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from grader import results
from grader.course import Course
from grader.results import INTERNAL_ERROR, read_result
from grader.text import inert

SUMMARY_FILE = "summary.json"
HISTOGRAM_FILE = "scores.png"


def one_line(job_id: str, result: dict | None, error: str | None) -> str:
    """One line per graded submission, inert (ids and reasons can hold anything): print it without markup."""
    job_id = inert(job_id)[:200].replace("\n", " ")
    if error is not None:
        last = error.strip().splitlines()[-1] if error.strip() else error
        return f"{job_id}: {INTERNAL_ERROR}: {inert(last, 2000)}"  # a cause is never cut (wrapped by the terminal)
    kind, reason = classify(result)
    if kind != "graded":
        return f"{job_id}: {kind.replace('_', ' ')}: " + inert(reason, 2000).replace("\n", " ")
    assert result is not None  # classify: graded
    return f"{job_id}: {result['score']:g}/{result['gradable_max_score']:g}"


def _failed(check: dict) -> bool:
    """Lost points on a check that was graded (a check not run or not gradable here is not a failure)."""
    if check["status"] == "not_graded":
        return False
    return check["status"] != "passed" or check["points"] < check["max_points"] - 1e-9


def _gradable_max(exercise: dict) -> float:
    return sum(c["max_points"] for c in exercise["checks"] if c["status"] != "not_graded")


def classify(result: dict | None) -> tuple[str, str]:
    """(kind, reason): graded, not_gradable, internal_error, unfinished or no_result."""
    if result is None:
        return "no_result", "no result yet"
    try:  # a result file no grade of ours wrote (edited, truncated by a full disk) is no result
        results.validate(result)
    except Exception as exc:  # noqa: BLE001 -- jsonschema's errors, or a value it cannot even walk
        return "no_result", f"its result file is not a valid result ({type(exc).__name__}: {str(exc)[:160]}): grade it again"
    errors = "; ".join(result.get("format_errors") or [])
    if result.get("state") != "complete":
        if results.failed_by_grader(result):
            return "internal_error", errors
        return "unfinished", "the grade did not finish (killed half-way?)"
    if result.get("gradable") is False:
        return "not_gradable", errors or "the submission could not be read"
    exercises = result.get("exercises") or []
    if exercises and all(e["status"] == "missing" for e in exercises):
        return "not_gradable", "nothing to grade: " + "; ".join(e["message"] for e in exercises)
    return "graded", ""


def _stats(values: list[float]) -> dict:
    if not values:
        return {"mean": None, "median": None, "min": None, "max": None}
    return {"mean": round(statistics.fmean(values), 3), "median": round(statistics.median(values), 3),
            "min": round(min(values), 3), "max": round(max(values), 3)}


def histogram(values: list[float], bins: int = 10, top: float = 100.0) -> dict:
    """Counts of `values` (percentages) in `bins` equal bins from 0 to `top`; the last bin holds `top`."""
    edges = [round(top * i / bins, 6) for i in range(bins + 1)]
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, max(0, int(v / top * bins)))] += 1
    return {"edges": edges, "counts": counts}


def summarize(course: Course, out_dir: Path, ids: list[str], exercise_ids: list[str]) -> dict:
    """Per-exercise statistics over the graded submissions; the submissions that could not be graded."""
    by_kind: dict[str, list[dict]] = {k: [] for k in ("not_gradable", "internal_error", "unfinished", "no_result")}
    graded: list[dict] = []
    for sub_id in ids:
        result = read_result(out_dir / f"{sub_id}.json")
        kind, reason = classify(result)
        if kind == "graded":
            assert result is not None  # classify: graded
            graded.append(result)
        else:
            by_kind[kind].append({"id": sub_id, "reason": reason})
    per_exercise = []
    for ex_id in exercise_ids:
        course_ex = course.exercise(ex_id)
        scores, percents, tops, full, not_submitted = [], [], [], 0, 0
        failures: dict[str, list[str]] = {}
        titles: dict[str, str] = {}
        for result in graded:
            ex = next((e for e in result["exercises"] if e["id"] == ex_id), None)
            if ex is None:
                continue
            top = _gradable_max(ex)
            scores.append(ex["score"])
            percents.append(100 * ex["score"] / top if top > 0 else 0.0)
            tops.append(top)
            if ex["status"] == "missing":
                not_submitted += 1
                continue
            full += top > 0 and ex["score"] >= top - 1e-9
            for check in ex["checks"]:
                titles[check["id"]] = check["title"]
                if _failed(check):
                    failures.setdefault(check["id"], []).append(check["message"])
        most_failed = []
        for check_id, messages in sorted(failures.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:5]:
            message, count = Counter(m for m in messages if m).most_common(1)[0] if any(messages) else ("", 0)
            most_failed.append({"check": check_id, "title": titles[check_id], "failed": len(messages),
                                "message": inert(message, 2000), "with_this_message": count})
        per_exercise.append({"id": ex_id, "max_score": course_ex.points,
                             "gradable_max_score": max(tops) if tops else course_ex.points,
                             "graded": len(scores), **_stats(scores), "full_marks": int(full),
                             "not_submitted": not_submitted, "most_failed": most_failed,
                             "histogram": histogram(percents)})
    percents = [100 * r["score"] / r["gradable_max_score"] for r in graded if r["gradable_max_score"] > 0]
    return {
        "course": course.course,
        "generated_at": results.now(),
        "submissions": len(ids),
        "graded": len(graded),
        "total": {**_stats([r["score"] for r in graded]), "percent_of_gradable": _stats(percents),
                  "histogram": histogram(percents)},
        "exercises": per_exercise,
        **by_kind,
        "histogram_png": None,
    }


def draw_histogram(summary: dict, path: Path) -> None:
    """Histograms of the total (percent of gradable points) and of each exercise (percent of its points)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("total (% of gradable points)", summary["total"]["histogram"])]
    if len(summary["exercises"]) > 1:
        panels += [(f"{e['id']} (% of gradable points)", e["histogram"]) for e in summary["exercises"]]
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 2.4 * len(panels)), squeeze=False)
    for ax, (title, hist) in zip(axes[:, 0], panels):
        edges, counts = hist["edges"], hist["counts"]
        ax.bar(edges[:-1], counts, width=[b - a for a, b in zip(edges, edges[1:])], align="edge", edgecolor="black")
        ax.set_title(title, fontsize=10)
        ax.set_xlim(edges[0], edges[-1])
        ax.set_ylabel("submissions")
        ax.yaxis.get_major_locator().set_params(integer=True)
    axes[-1, 0].set_xlabel("score (%)")
    fig.suptitle(f"{summary['course']}: {summary['graded']} graded of {summary['submissions']} submissions")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_summary(out_dir: Path, summary: dict) -> None:
    try:
        draw_histogram(summary, out_dir / HISTOGRAM_FILE)
        summary["histogram_png"] = HISTOGRAM_FILE
    except ImportError:
        summary["histogram_png"] = None
        summary["histogram_note"] = "not drawn: matplotlib is not installed (pip install matplotlib)"
    results.write_atomic(out_dir / SUMMARY_FILE, summary)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def print_summary(summary: dict, console: Console) -> None:
    table = Table(title=f"batch summary: {summary['graded']} graded of {summary['submissions']} submissions",
                  box=box.SIMPLE_HEAVY, title_justify="left")
    # Fits 80 columns: the figures short, the exercise whole (a name longer than 19 characters folds onto a second
    # line, never cut); what "of" leaves out is said once below the table.
    table.add_column("exercise", overflow="fold", max_width=19)
    for col in ("graded", "mean", "median", "min-max", "of", "full", "missing"):
        table.add_column(col, justify="right", no_wrap=True)
    for e in summary["exercises"]:
        table.add_row(e["id"], str(e["graded"]), _num(e["mean"]), _num(e["median"]),
                      f"{_num(e['min'])}-{_num(e['max'])}", f"{e['gradable_max_score']:g}", str(e["full_marks"]),
                      str(e["not_submitted"]))
    console.print(table)
    partly = [f"{e['id']} {e['gradable_max_score']:g} of {e['max_score']:g}" for e in summary["exercises"]
              if e["gradable_max_score"] != e["max_score"]]
    cuda = f"; the CUDA checks' are not graded here ({'; '.join(partly)})" if partly else ""
    console.print(Text(f"of: the points graded{cuda}. full: submissions with full marks. missing: not submitted.",
                       style="dim"))
    for e in summary["exercises"]:
        if not e["most_failed"]:
            continue
        fails = Table(title=f"{e['id']}: most-failed checks", box=box.SIMPLE, title_justify="left")
        for col in ("check", "failed", "most common message"):
            fails.add_column(col, overflow="fold")
        for f in e["most_failed"]:
            fails.add_row(Text(inert(f["check"])), f"{f['failed']}/{e['graded'] - e['not_submitted']}",
                          Text(inert(f["message"], 2000)))
        console.print(fails)
    labels = {"not_gradable": "not gradable", "internal_error": INTERNAL_ERROR + " (retried on the next run)",
              "unfinished": "unfinished (retried on the next run)", "no_result": "no result yet"}
    rows = [(s["id"], labels[kind], s["reason"]) for kind in labels for s in summary[kind]]
    if rows:
        problems = Table(title="submissions without a full grade", box=box.SIMPLE, title_justify="left")
        for col in ("submission", "kind", "reason"):
            problems.add_column(col, overflow="fold")
        for row in rows:
            problems.add_row(Text(inert(row[0])), row[1], Text(inert(row[2], 2000)))
        console.print(problems)
    png = f" and {summary['histogram_png']}" if summary.get("histogram_png") else f" ({summary.get('histogram_note')})"
    console.print(f"summary written to {SUMMARY_FILE}{png}", markup=False, highlight=False)

