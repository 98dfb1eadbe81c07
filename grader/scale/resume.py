"""Resuming a batch: is a submission's result current, or must it be graded again?

A result is current when it is complete and was graded from the same files (the submission hash), the
same tests (the suite hash), the same exercises, the same seed (when one is given), the same grading
options and the same backend. The last two are not in the result: RESULTS_DIR/.batch-state.json keeps
a key of them per submission.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from grader import results
from grader.options import GradeOptions
from grader.scale.backend import Backend

STATE_FILE = ".batch-state.json"
STATE_SCHEMA = "llm-efficiency-lab/batch-state/v1"


def options_key(opts: GradeOptions) -> dict:
    """The grading options that change a grade but that a result does not record."""
    return {"tests": opts.tests, "checks": sorted(opts.checks or []), "mode": opts.mode, "isolate": opts.isolate,
            "call_timeout_s": opts.call_timeout_s, "time_limit_s": opts.time_limit_s}


def state_key(content: str, opts: GradeOptions, backend: Backend) -> str:
    blob = json.dumps({"content": content, "options": options_key(opts), "backend": backend.fingerprint()},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def staleness(result: dict | None, sub_id: str, expected_sha: str | None, suite: str, exercise_ids: list[str],
              seed: int | None, recorded_key: str | None, key: str | None) -> str | None:
    """Why `result` must be graded again, or None when it is current."""
    if result is None:
        return "no result yet"
    try:
        results.validate(result)
    except Exception as exc:  # noqa: BLE001 -- a file no grade of ours wrote (edited, cut short): grade it again
        return f"its last result is not a valid result ({type(exc).__name__})"
    if result.get("state") != "complete":
        return "the last grade failed on the grader's side" if result.get("state") == "error" else "the last grade did not finish"
    if (result.get("submission") or {}).get("id") != sub_id:
        return "the result belongs to another submission id"
    if expected_sha is None:
        return "the submission could not be read to compare it with the result"
    if result["submission"].get("sha256") != expected_sha:
        return "the submission changed"
    if result.get("suite_sha256") != suite:
        return "the tests changed"
    if [e.get("id") for e in result.get("exercises", [])] != exercise_ids:
        return "other exercises were graded"
    if seed is not None and result.get("seed") != seed:
        return f"graded with seed {result.get('seed')}, not {seed}"
    if key is None or recorded_key != key:
        return "graded with other options or another backend"
    return None


def load_state(out_dir: Path) -> dict[str, str]:
    data = results.read_result(out_dir / STATE_FILE)
    if not data or data.get("schema") != STATE_SCHEMA or not isinstance(data.get("keys"), dict):
        return {}
    return {str(k): str(v) for k, v in data["keys"].items()}


def load_seed(out_dir: Path) -> int | None:
    """The batch's secret seed, kept in the state file since its first run (None: none kept yet)."""
    data = results.read_result(out_dir / STATE_FILE)
    seed = (data or {}).get("seed")
    return seed if isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2**31 else None


def save_state(out_dir: Path, keys: dict[str, str], seed: int | None = None) -> None:
    state: dict = {"schema": STATE_SCHEMA, "keys": dict(sorted(keys.items()))}
    if seed is not None:
        state["seed"] = seed
    results.write_atomic(out_dir / STATE_FILE, state)


def submission_seed(batch_seed: int, sub_id: str) -> int:
    """One submission's seed, drawn from the batch's secret seed and its id: each student's hidden inputs differ,
    and a regrade of the same student draws the same ones (a partially wrong submission keeps its score)."""
    digest = hashlib.sha256(f"{batch_seed}:{sub_id}".encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF

