"""One student's feedback page: a self-contained HTML file rendered from their canonical result.

Per exercise and per check: status, points, the message; per test that did not pass: its message and the
student's traceback; per speed check that measured something: a PNG of the achieved figures against the
measured ceilings (grader/export/roofline.py), embedded as a data URL, and the figures as a table; the seed
that reproduces the run. No script, no external resource: the page opens from a file, offline.

Every string from the result is made inert (grader/text.py: no escape sequence or control character) and
HTML-escaped (a message can hold anything a student's code printed). The harness already trims tracebacks to the student's own frames; as a second guard, frames from the course's
hidden tests are dropped here too.
"""

from __future__ import annotations

import html
import re
from collections import Counter
from typing import Any

from grader.export.checks import NOT_GRADED, pts, speed_metric
from grader.text import inert

STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 70em; padding: 0 1em; color: #1d2430; }
h1 { font-size: 1.5em; margin-bottom: .2em; } h2 { font-size: 1.2em; margin: 1.6em 0 .3em; }
.points, .score { font-variant-numeric: tabular-nums; white-space: nowrap; }
table { border-collapse: collapse; width: 100%; } th, td { text-align: left; vertical-align: top; padding: .3em .5em; border-bottom: 1px solid #e3e6ea; }
th { font-weight: 600; background: #f4f6f8; }
.status { font-weight: 600; } .status-passed { color: #1e7b34; } .status-failed, .status-error, .status-missing, .status-ungradable { color: #b3261e; }
.status-timeout { color: #8e24aa; } .status-not_graded, .status-pending { color: #6b7280; }
.message, .test-message { white-space: pre-wrap; } pre { background: #f6f8fa; padding: .6em; overflow-x: auto; font-size: 13px; }
#run-info { display: grid; grid-template-columns: max-content auto; gap: .1em 1em; } #run-info dt { font-weight: 600; }
.warning, #format-errors { background: #fff4e5; border-left: 4px solid #f0a020; padding: .4em .8em; }
figure.roofline img { max-width: 100%; border: 1px solid #e3e6ea; } details { margin: .4em 0 .8em; }
.scroll { overflow-x: auto; } table.metrics td, table.metrics th { white-space: nowrap; font-size: 13px; }
"""

_FRAME = re.compile(r'^\s*File "([^"]*)"')


def student_traceback(text: str) -> str:
    """Drop any frame (its `File "..."` line and the source under it) from the course's hidden tests."""
    kept, skipping = [], False
    for line in text.splitlines():
        frame = _FRAME.match(line)
        if frame:
            skipping = "/grader/hidden/" in frame.group(1).replace("\\", "/")
        elif skipping and not line.startswith("    "):
            skipping = False
        if not skipping:
            kept.append(line)
    return "\n".join(kept)


def _e(value: Any) -> str:
    return html.escape(inert(value), quote=True)


def _status(status: str) -> str:
    return f'<span class="status status-{_e(status)}">{_e(status.replace("_", " "))}</span>'


def exercise_result(result: dict, exercise_id: str) -> dict:
    """`result` as if it had graded only `exercise_id` (its score and maxima that exercise's): the page of one
    nbgrader assignment."""
    ex = next(e for e in result["exercises"] if e["id"] == exercise_id)
    return {**result, "exercises": [ex], "score": ex["score"], "max_score": ex["max_score"],
            "gradable_max_score": sum(c["max_points"] for c in ex["checks"] if c["status"] != "not_graded")}


def render_feedback(result: dict, course: Any = None, plots: bool = True) -> str:
    """The page as a string; `course` (optional) names the metric each speed check is scored on."""
    sub = result["submission"]["id"]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>Feedback: {_e(sub)} · {_e(result['course'])}</title>",
        f"<style>{STYLE}</style></head><body>",
        f'<h1 id="title">Feedback for <span id="submission">{_e(sub)}</span></h1>',
        _summary(result),
    ]
    above = set(result.get("format_errors") or []) if result.get("gradable") is False else set()
    for ex in result["exercises"]:
        parts.append(_exercise(ex, course, plots, above))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _summary(result: dict) -> str:
    ungraded = result["max_score"] - result["gradable_max_score"]
    out = ['<section id="summary">',
           f'<p id="total" class="score" data-score="{result["score"]:g}" data-max="{result["max_score"]:g}">'
           f'Score: <strong>{pts(result["score"])}</strong> of {pts(result["max_score"])} points'
           + (f" ({pts(ungraded)} of them need a CUDA device and were not graded in this run)" if ungraded else "")
           + "</p>"]
    if result.get("gradable") is False:
        errors = "".join(f"<li>{_e(e)}</li>" for e in result.get("format_errors") or [])
        out.append(f'<div id="format-errors"><p>This submission could not be graded:</p><ul>{errors}</ul></div>')
    if result["state"] != "complete":
        out.append('<p class="warning" id="incomplete">Grading did not finish: checks without a result scored 0.</p>')
    device = result["device"]
    rows = [("seed", str(result["seed"]), "seed"),
            ("course", f"{result['course']} {result['course_version']}", "course"),
            ("grader", result["grader_version"], "grader-version"),
            ("device", device.get("gpu") or device.get("cpu") or "", "device"),
            ("torch / triton", f"{device.get('torch')} / {device.get('triton')}", "versions"),
            ("graded", result.get("finished_at") or result["started_at"], "graded-at"),
            ("submission hash", result["submission"]["sha256"][:16] or "(unreadable)", "submission-sha")]
    out.append('<dl id="run-info">' + "".join(f'<dt>{_e(k)}</dt><dd id="{i}">{_e(v)}</dd>' for k, v, i in rows) + "</dl>")
    out.append(f'<p class="reproduce">To reproduce the hidden inputs of this run: <code>grader grade SUBMISSION --seed '
               f'{_e(result["seed"])}</code>.</p>')
    if result["warnings"]:
        out.append('<ul id="warnings">' + "".join(f'<li class="warning">{_e(w)}</li>' for w in result["warnings"]) + "</ul>")
    out.append("</section>")
    return "\n".join(out)


def _exercise(ex: dict, course: Any, plots: bool, above: set[str] | frozenset[str] = frozenset()) -> str:
    """One exercise's section. `above`: the reasons the page's summary already gives (a refused submission)."""
    ex_id = ex["id"]
    out = [f'<section class="exercise" id="ex-{_e(ex_id)}" data-exercise="{_e(ex_id)}" data-status="{_e(ex["status"])}">',
           (f'<h2>{_e(ex["title"])} <small>({_e(ex_id)})</small> · '
            f'<span class="points exercise-score">{pts(ex["score"])}/{pts(ex["max_score"])}</span></h2>')]
    said = ex["message"]  # a reason said once: above the table, never again in each row
    if said:
        shown = "not graded: the reason is at the top of this page" if said in above else said
        out.append(f'<p class="exercise-message message">{_e(shown)}</p>')
    out.append('<table class="checks"><thead><tr><th>check</th><th>status</th><th>points</th><th>message</th></tr></thead><tbody>')
    for check in ex["checks"]:
        message = check["message"] or (NOT_GRADED if check["status"] == "not_graded" else "")
        if said and message == said:
            message = "(the reason above)"
        out.append(
            f'<tr class="check" id="check-{_e(ex_id)}-{_e(check["id"])}" data-check="{_e(check["id"])}" '
            f'data-status="{_e(check["status"])}" data-visibility="{_e(check["visibility"])}">'
            f'<td><code>{_e(check["id"])}</code><br>{_e(check["title"])}</td><td>{_status(check["status"])}</td>'
            f'<td class="points">{pts(check["points"])}/{pts(check["max_points"])}</td>'
            f'<td class="message">{_e(message)}</td></tr>')
    out.append("</tbody></table>")
    for check in ex["checks"]:
        detail = _check_detail(ex_id, check, course, plots)
        if detail:
            out.append(detail)
    out.append("</section>")
    return "\n".join(out)


def _check_detail(ex_id: str, check: dict, course: Any, plots: bool) -> str:
    bad = [t for t in check["tests"] if t["status"] not in ("passed", "not_graded")]
    measured = [t for t in check["tests"] if t["metrics"]]
    if not bad and not measured:
        return ""
    key = f"{_e(ex_id)}-{_e(check['id'])}"
    tally = ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in sorted(Counter(t["status"] for t in check["tests"]).items()))
    opened = " open" if bad else ""  # failures open; a passed check's measurements fold away (a short page)
    out = [f'<details class="check-detail" id="detail-{key}"{opened}>',
           f"<summary><code>{_e(check['id'])}</code>: {_e(tally)}</summary>"]
    if bad:
        out.append('<ul class="tests">')
        for t in bad:
            out.append(f'<li class="test" data-status="{_e(t["status"])}"><code class="test-name">{_e(t["name"])}</code> '
                       f'{_status(t["status"])}<div class="test-message">{_e(t["message"])}</div>')
            trace = student_traceback(t["traceback"]).strip()
            if trace:
                out.append(f'<pre class="traceback">{_e(trace)}</pre>')
            out.append("</li>")
        out.append("</ul>")
    if measured:
        metric = speed_metric(check, ex_id, course)
        if plots:
            from grader.export.roofline import plotting_available, roofline_png_data_url

            url = roofline_png_data_url(check, ex_id, metric)
            if not plotting_available():
                out.append('<p class="no-plot">(no plot: matplotlib is not installed where this page was made)</p>')
            elif url:
                out.append(f'<figure class="roofline" id="roofline-{key}"><img src="{url}" '
                           f'alt="{_e(check["id"])}: achieved figures against the measured ceilings">'
                           f"<figcaption>Achieved against the ceilings measured on the same device in the same run"
                           f"{_e(f'; scored on {metric}') if metric else ''}.</figcaption></figure>")
        names = list(dict.fromkeys(k for t in measured for k in t["metrics"]))
        out.append(f'<div class="scroll"><table class="metrics" id="metrics-{key}"><thead><tr><th>test</th>'
                   + "".join(f"<th>{_e(n)}</th>" for n in names) + "</tr></thead><tbody>")
        for t in measured:
            cells = "".join(f"<td>{t['metrics'][n]:.4g}</td>" if n in t["metrics"] else "<td></td>" for n in names)
            out.append(f"<tr><td><code>{_e(t['name'])}</code></td>{cells}</tr>")
        out.append("</tbody></table></div>")
    out.append("</details>")
    return "\n".join(out)
