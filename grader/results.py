"""The canonical result: one JSON document per graded submission. Everything else renders from it.

Schema: grader/schemas/result.schema.json (validated in the project's tests). Scoring fails closed:
a check earns points only from tests that explicitly passed; a check with no recorded outcome scores
zero with a reason.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Any, TypeGuard

from grader import __version__
from grader.course import Course, Exercise
from grader.text import inert

SCHEMA_ID = "llm-efficiency-lab/result/v1"
INTERNAL_ERROR = "internal error of the grader"  # format_errors that start so: regrade, not the student's fault
STATUSES = ("passed", "failed", "error", "timeout", "not_graded", "pending")
# When tests of one check disagree, the check shows the most serious status.
_SEVERITY = {"timeout": 5, "error": 4, "failed": 3, "not_graded": 1, "passed": 0, "pending": 6}
MAX_MESSAGE_CHARS = 8000  # per test (the plugin cuts its own messages shorter)
MAX_TRACEBACK_CHARS = 20000


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def device_info() -> dict[str, Any]:
    """The machine a grade runs on. Where this process has not imported torch (the `grader` command: it only
    starts the processes that need torch, and keeps its own memory small for Gradescope's 768 MiB), the facts
    come from one short-lived interpreter, once per process, so the grade's peak memory does not pay for a
    third copy of torch."""
    import sys

    if "torch" not in sys.modules:
        return dict(_device_info_elsewhere())
    return _device_info_here()


@functools.lru_cache(maxsize=1)
def _device_info_elsewhere() -> tuple:
    import json
    import subprocess
    import sys

    code = "import json\nfrom grader.results import _device_info_here\nprint(json.dumps(_device_info_here()))"
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        return tuple(json.loads(proc.stdout.strip().splitlines()[-1]).items())
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return tuple(_device_info_here().items())  # the fallback imports torch here


def _device_info_here() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": None,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:  # pragma: no cover
        info["triton"] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = props.name
        info["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        from grader.speed import gpu_clocks

        clocks, driver = gpu_clocks()  # speed checks are only comparable at known clocks
        if clocks:
            info["gpu_clocks_mhz"] = clocks
        if driver:
            info["driver"] = driver
    return info


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def new_result(course: Course, submission_id: str, submission_sha: str, suite_sha: str, seed: int,
               mode: str, exercises: list[Exercise]) -> dict[str, Any]:
    return {
        "schema": SCHEMA_ID,
        "course": course.course,
        "course_version": course.version,
        "grader_version": __version__,
        "submission": {"id": submission_id, "sha256": submission_sha},
        "suite_sha256": suite_sha,
        "seed": seed,
        "mode": mode,
        "device": device_info(),
        "started_at": now(),
        "finished_at": None,
        "state": "running",
        "warnings": [],
        "score": 0.0,
        "max_score": sum(e.points for e in exercises),
        "gradable_max_score": sum(e.points for e in exercises),
        "exercises": [_new_exercise(e) for e in exercises],
    }


def _new_exercise(exercise: Exercise) -> dict[str, Any]:
    return {
        "id": exercise.id,
        "title": exercise.title,
        "status": "pending",
        "message": "",
        "score": 0.0,
        "max_score": exercise.points,
        "duration_s": 0.0,
        "checks": [
            {
                "id": c.id,
                "title": c.title,
                "visibility": c.visibility,
                "cuda": c.cuda,
                "points": 0.0,
                "max_points": c.points,
                "status": "pending",
                "message": "",
                "duration_s": 0.0,
                "tests": [],
            }
            for c in exercise.checks
        ],
    }


def find_exercise(result: dict, exercise_id: str) -> dict:
    return next(e for e in result["exercises"] if e["id"] == exercise_id)


def record_test(result: dict, event: dict) -> None:
    """Add one test's outcome (an event from the plugin) and rescore its check."""
    ex = find_exercise(result, event["exercise"])
    check = next((c for c in ex["checks"] if c["id"] == event.get("check")), None)
    if check is None:
        ex["message"] = f"test {event.get('test')} names unknown check {event.get('check')!r}"
        return
    status = event["status"] if event.get("status") in STATUSES else "error"
    fraction = event.get("fraction", 0.0)
    if status != "passed" or not isinstance(fraction, (int, float)) or fraction != fraction:
        fraction = 0.0
    check["tests"].append({
        "name": str(event.get("test", "")),
        "status": status,
        "fraction": min(1.0, max(0.0, float(fraction))),
        "message": inert(event.get("message", ""), MAX_MESSAGE_CHARS),  # student text: no escapes, no controls
        "traceback": inert(event.get("traceback", ""), MAX_TRACEBACK_CHARS),
        "duration_s": float(event.get("duration", 0.0)),
        "metrics": {k: v for k, v in (event.get("metrics") or {}).items() if isinstance(v, (int, float))},
        **({"grader_error": True} if event.get("grader_error") is True else {}),
    })
    rescore_check(check)


def fill_unrun(result: dict, exercise_id: str, collected: dict | None, reason: str | None,
               status: str | None = None) -> None:
    """Fail closed: every collected test (`collected`: the plugin's "collected" event) that never
    reported scores zero, with the reason, so a check's points are split over all of its tests. A
    CUDA test on a machine without CUDA stays "not graded", as its own skip would have reported it."""
    if not collected:
        return
    ex = find_exercise(result, exercise_id)
    checks = {c["id"]: c for c in ex["checks"]}
    cuda = bool(collected.get("cuda_available"))
    why = f"not run: {reason}" if reason else "not run: the test never reported an outcome"
    touched = []
    for test in collected.get("tests") or []:
        check = checks.get(test.get("check")) if isinstance(test, dict) else None
        if check is None or any(t["name"] == test.get("test") for t in check["tests"]):
            continue
        not_here = bool(test.get("cuda")) and not cuda
        check["tests"].append({
            "name": str(test.get("test", "")),
            "status": "not_graded" if not_here else (status or "error"),
            "fraction": 0.0,
            "message": "not graded: no CUDA device" if not_here else why,
            "traceback": "",
            "duration_s": 0.0,
            "metrics": {},
        })
        touched.append(check)
    for check in touched:
        rescore_check(check)


def rescore_check(check: dict) -> None:
    tests = check["tests"]
    if not tests:
        return
    graded = [t for t in tests if t["status"] != "not_graded"]  # a CUDA-only test does not count off the CPU
    check["points"] = round(check["max_points"] * sum(t["fraction"] for t in graded) / len(graded), 4) if graded else 0.0
    check["duration_s"] = round(sum(t["duration_s"] for t in tests), 4)
    statuses = [t["status"] for t in tests]
    if all(s == "not_graded" for s in statuses):
        check["status"] = "not_graded"
    elif all(s in ("passed", "not_graded") for s in statuses):
        check["status"] = "passed"
    else:
        check["status"] = max((s for s in statuses if s != "passed"), key=_SEVERITY.__getitem__)
    first_bad = next((t for t in tests if t["status"] not in ("passed",)), None)
    if check["status"] == "passed":
        speed = next((t for t in tests if t["metrics"]), None)
        check["message"] = speed["message"] if speed and speed["fraction"] < 1 else ""
    elif first_bad is not None:
        check["message"] = f"{first_bad['name']}: {first_bad['message']}"


def close_exercise(result: dict, exercise_id: str, reason: str | None = None, status: str | None = None,
                   collected: dict | None = None) -> None:
    """Fail closed: every collected test that never reported, and every check that never recorded a
    test, scores zero with the reason; a CUDA check on a host without a GPU is "not graded" instead, whatever
    became of the student's file (the denominator is the host's, the same for every student)."""
    fill_unrun(result, exercise_id, collected, reason, status)
    ex = find_exercise(result, exercise_id)
    no_gpu = not (result.get("device") or {}).get("gpu")
    for check in ex["checks"]:
        if not check["tests"] and check["status"] == "pending" and check.get("cuda") and no_gpu:
            # What is graded here depends on the host, never on the student's file: a CUDA check is "not graded"
            # on a host without CUDA for a missing, broken or unreadable file too, as it is for a stub.
            check.update(status="not_graded", points=0.0, message="not graded: no CUDA device")
        elif not check["tests"] and check["status"] == "pending":
            check["status"] = status or "error"
            check["points"] = 0.0
            check["message"] = reason or "no test result was recorded for this check"
    ex["score"] = round(sum(c["points"] for c in ex["checks"]), 4)
    ex["duration_s"] = round(ex["duration_s"], 3)
    if ex["status"] == "pending":
        ex["status"] = "graded"
    if reason and not ex["message"]:
        ex["message"] = reason
    update_totals(result)


def did_not_load(result: dict, exercise_id: str, reason: str) -> None:
    """The student's file raised while it was imported, in some test: no call of it ever ran, so every check of
    the exercise scores zero with the reason, whatever a test made of the error (one that expected an exception
    would otherwise have passed on the import's). The exercise is "ungradable", as a file that does not compile."""
    ex = find_exercise(result, exercise_id)
    for check in ex["checks"]:
        for test in check["tests"]:
            if test["status"] == "not_graded":
                continue
            test.update(status="error", fraction=0.0, message=inert(reason, MAX_MESSAGE_CHARS), metrics={})
        if check["tests"]:
            rescore_check(check)
    ex["status"] = "ungradable"
    ex["message"] = inert(reason, MAX_MESSAGE_CHARS)
    update_totals(result)


def update_totals(result: dict) -> None:
    result["score"] = round(sum(c["points"] for e in result["exercises"] for c in e["checks"]), 4)
    result["gradable_max_score"] = sum(
        c["max_points"] for e in result["exercises"] for c in e["checks"] if c["status"] != "not_graded"
    )
    for ex in result["exercises"]:
        ex["score"] = round(sum(c["points"] for c in ex["checks"]), 4)


def finish(result: dict) -> None:
    """The grade is over: "complete", or "error" when the grading machine failed on it (a regrade)."""
    update_totals(result)
    result["finished_at"] = now()
    if result.get("state") != "error":
        result["state"] = "complete"


FAILURE_BY = ("submission", "grader")


def mark_ungradable(result: dict, reason: str, *, by: str = "submission", retry: str | None = None,
                    exercise_id: str | None = None, exercise_message: str | None = None,
                    state: str | None = None, replace: bool = False) -> None:
    """The one way a result says it earns no score.

    `by="submission"`: the submission cannot be graded (it cannot be read, two entries claim its id, it is
    a link): a complete grade of zero, the reason for the student. `by="grader"`: the grading machine
    failed on it (its test process died, the sandbox could not start, the batch lost it): never a score,
    the grade is to be done again and `retry` says how. Both go in ``result["failure"]`` as fields
    (``{"by", "reason", "retry"}``: what tools read); ``format_errors`` holds the message for people.

    With `exercise_id`, only that exercise becomes ungradable, with `exercise_message` or the message;
    otherwise every exercise not yet graded does and is closed with the reason. `state`, when given, is
    the result's new state ("error": failed and finished; "running": to be graded again). With `replace`,
    this failure is the result's only one: the latest word on the whole grade (a Slurm task's own account of
    its end replaces what the batch code under it wrote when the signal reached it).
    """
    if replace:
        result.pop("failure", None)
        result["format_errors"] = []
    message = record_failure(result, reason, by=by, retry=retry)
    if exercise_id is not None:
        ex = find_exercise(result, exercise_id)
        ex["status"] = "ungradable"
        ex["message"] = exercise_message or message
    else:
        for ex in result["exercises"]:
            if ex["status"] in ("pending", "running"):
                ex["status"] = "ungradable"
            close_exercise(result, ex["id"], exercise_message or message)
    if state is not None:
        result["state"] = state


def record_failure(result: dict, reason: str, *, by: str = "submission", retry: str | None = None) -> str:
    """Mark `result` not gradable for `reason` and return the message for people, leaving its exercises
    as they are (`mark_ungradable` closes them too). A failure by the grader replaces one by the
    submission; otherwise the first failure recorded stays (the root cause)."""
    if by not in FAILURE_BY:
        raise ValueError(f"expected a failure by one of {list(FAILURE_BY)}, found {by!r}")
    reason = reason.strip()
    if by == "grader":
        message = f"{INTERNAL_ERROR}, not a fault of the submission: {reason}; {retry or 'regrade it'}"
    else:
        message = reason
    result["gradable"] = False
    failure = result.get("failure")
    if failure is None or (by == "grader" and failure.get("by") != "grader"):
        result["failure"] = {"by": by, "reason": reason, "retry": retry}
    errors = result.setdefault("format_errors", [])
    if message not in errors:
        errors.append(message)
    return message


def ungradable(course: Course, exercises: list[Exercise], submission_id: str, reason: str, *, suite_sha: str,
               seed: int, mode: str = "sandbox", submission_sha: str = "", by: str = "submission",
               retry: str | None = None, exercise_message: str | None = None) -> dict[str, Any]:
    """A fresh result that earns no score, for `reason` (see `mark_ungradable`). One by the submission
    is complete; one by the grader stays "running", so that the next batch run grades it again."""
    result = new_result(course, submission_id, submission_sha, suite_sha, seed, mode, exercises)
    mark_ungradable(result, reason, by=by, retry=retry, exercise_message=exercise_message)
    if by == "submission":
        finish(result)
    return result


def failed_by_grader(result: dict | None) -> TypeGuard[dict]:
    """Whether `result` records a failure of the grading machine (a regrade, never the student's score)."""
    if not result:
        return False
    return (result.get("failure") or {}).get("by") == "grader"


def grader_failure(result: dict, exercise_id: str, reason: str) -> None:
    """The grader itself failed on an exercise (its test process died, the sandbox could not start):
    an error of the grade, never a low score. The result is not gradable and asks for a regrade."""
    mark_ungradable(result, reason, by="grader", exercise_id=exercise_id, state="error")


def read_result(path: Path) -> dict | None:
    """The JSON object at `path`, or None where there is none to read (missing, half-written, not an
    object): a result the batch, a container or a Slurm task left, which may not exist yet."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_atomic(path: Path, data: dict) -> None:
    """Write JSON so that a reader sees the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def schema() -> dict:
    return json.loads((Path(__file__).parent / "schemas" / "result.schema.json").read_text())


def validate(result: dict) -> None:
    """Raise jsonschema.ValidationError if the result does not match the documented schema (the most relevant
    error, as jsonschema.validate picks it). The batch, its summary and resume check every result: the schema
    is read, and its validator built, once."""
    import jsonschema

    error = jsonschema.exceptions.best_match(_validator().iter_errors(result))
    if error is not None:
        raise error


@functools.lru_cache(maxsize=1)
def _validator():
    import jsonschema

    checked = schema()
    cls = jsonschema.validators.validator_for(checked)
    cls.check_schema(checked)
    return cls(checked)
