"""Self-study state, kept locally in .progress.json (ignored by git): per exercise the number of
`make check` attempts, the date its public tests first all passed, and the hints shown; and the
interview-practice rounds (the one running, and the ones done)."""

from __future__ import annotations

import datetime as dt
import json
import random
import shutil
import time
from pathlib import Path
from typing import Any

PROGRESS_FILE = ".progress.json"


def load(root: Path) -> dict[str, Any]:
    try:
        data = json.loads((root / PROGRESS_FILE).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, json.JSONDecodeError):
        return {}


def save(root: Path, data: dict[str, Any]) -> None:
    path = root / PROGRESS_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def exercise_state(data: dict, exercise_id: str) -> dict:
    return data.setdefault("exercises", {}).setdefault(exercise_id, {"attempts": 0, "first_pass": None, "hints": 0})


def today() -> str:
    return dt.date.today().isoformat()


def record_check(root: Path, exercise_id: str, all_passed: bool) -> None:
    data = load(root)
    state = exercise_state(data, exercise_id)
    state["attempts"] += 1
    if all_passed and not state["first_pass"]:
        state["first_pass"] = today()
    save(root, data)


def next_hint(root: Path, exercise_id: str, available: int) -> int:
    """How many hints to show now (one more than before, at most `available`); remembers it."""
    data = load(root)
    state = exercise_state(data, exercise_id)
    state["hints"] = min(state["hints"] + 1, available)
    save(root, data)
    return state["hints"]


def reset_hints(root: Path, exercise_id: str) -> None:
    data = load(root)
    exercise_state(data, exercise_id)["hints"] = 0
    save(root, data)


# --------------------------------------------------------------------------------------------------
# Interview practice


def pick(course, level: str | None, minutes: int | None, exercise_id: str | None, rng: random.Random):
    if exercise_id:
        return course.exercise(exercise_id)
    pool = [e for e in course.exercises if (level is None or e.difficulty == level)
            and (minutes is None or e.minutes <= minutes)]
    if not pool:
        raise ValueError(
            f"no exercise fits level={level or 'any'} within {minutes} minutes; "
            f"expected one of {sorted({(e.difficulty, e.minutes) for e in course.exercises})}"
        )
    return rng.choice(pool)


def start_interview(root: Path, course, level: str | None = None, minutes: int | None = None,
                    exercise_id: str | None = None, seed: int | None = None) -> dict:
    exercise = pick(course, level, minutes, exercise_id, random.Random(seed))
    practice = root / "practice" / exercise.id
    if practice.exists():
        shutil.rmtree(practice)
    practice.mkdir(parents=True)
    source = root / "exercises" / exercise.id
    for name in ("README.md", exercise.file, "test_public.py"):
        if (source / name).exists():
            shutil.copy2(source / name, practice / name)
    round_ = {"exercise": exercise.id, "minutes": minutes or exercise.minutes, "started": time.time(),
              "folder": str(practice.relative_to(root))}
    data = load(root)
    data["interview"] = round_
    save(root, data)
    return round_


def current_interview(root: Path) -> dict:
    round_ = load(root).get("interview")
    if not round_:
        raise ValueError("no interview round is running; start one with `make interview`")
    return round_


def finish_interview(root: Path, passed: int, total: int) -> dict:
    data = load(root)
    round_ = data.pop("interview", None)
    if not round_:
        raise ValueError("no interview round is running; start one with `make interview`")
    used = (time.time() - round_["started"]) / 60
    record = {"exercise": round_["exercise"], "date": today(), "minutes_used": round(used, 1),
              "time_box": round_["minutes"], "public_tests_passed": f"{passed}/{total}"}
    data.setdefault("interviews", []).append(record)
    save(root, data)
    return record
