"""Self-study state, kept locally in .progress.json (ignored by git): per exercise the number of
`make check` attempts, the date its public tests first all passed, and the hints shown; and the
interview-practice rounds (the one running, and the ones done)."""

from __future__ import annotations

import datetime as dt
import json
import random
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, NamedTuple

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


class Round(NamedTuple):
    """What a practice round hands out: a whole exercise, or one part of it (`parts:` in course.yaml)."""

    exercise: Any  # grader.course.Exercise
    part: Any = None  # grader.course.Part, or None for the whole exercise

    @property
    def id(self) -> str:
        return f"{self.exercise.id}/{self.part.id}" if self.part else self.exercise.id

    @property
    def title(self) -> str:
        return self.part.title if self.part else self.exercise.title

    @property
    def difficulty(self) -> str:
        return (self.part or self.exercise).difficulty

    @property
    def minutes(self) -> int:
        return (self.part or self.exercise).minutes

    @property
    def checks(self) -> list[str]:
        """The public checks whose tests decide the round."""
        return list(self.part.checks) if self.part else self.exercise.public_cpu_checks


def rounds(course) -> list[Round]:
    """Every practice round the course offers: each exercise whole, and each of its parts."""
    return [r for e in course.exercises for r in (Round(e), *(Round(e, p) for p in e.parts))]


def pick(course, level: str | None, minutes: int | None, target: str | None, rng: random.Random) -> Round:
    """A round that fits the level and the time box; `target` names one: `<exercise>` or `<exercise>/<part>`."""
    if target:
        exercise_id, _, part_id = target.partition("/")
        exercise = course.exercise(exercise_id)
        return Round(exercise, exercise.part(part_id) if part_id else None)
    pool = [r for r in rounds(course) if (level is None or r.difficulty == level)
            and (minutes is None or r.minutes <= minutes)]
    if not pool:
        offered = ", ".join(f"{r.id} ({r.difficulty}, {r.minutes} min)" for r in rounds(course))
        raise ValueError(f"no practice round fits level={level or 'any'} within {minutes} minutes; expected one of: {offered}")
    return rng.choice(pool)


# Where the release keeps the stubs as they were handed out: an interview round starts from these, never from
# the student's exercises/ (which may already be solved).
PRISTINE = ".pristine"

# practice/<id>/conftest.py: `pytest practice/<id>` tests the practice copy, not exercises/<id>.
PRACTICE_CONFTEST = '''\
# Written by `make interview`: pytest in this folder tests the files here, not exercises/.
from pathlib import Path


def pytest_configure(config):
    config.option.grader_submission = str(Path(__file__).parent)
'''


def pristine_stub(root: Path, exercise) -> str:
    """The exercise's stub as the course handed it out: the release's `.pristine/` copy, else (in the course's
    own repository) the stub as git's HEAD has it. Refuses rather than copy a file the student may have solved."""
    kept = root / PRISTINE / exercise.id / exercise.file
    if kept.is_file():
        return kept.read_text()
    rel = f"exercises/{exercise.id}/{exercise.file}"
    try:
        shown = subprocess.run(["git", "-C", str(root), "show", f"HEAD:{rel}"], capture_output=True, text=True,
                               timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        shown = None
    if shown is not None and shown.returncode == 0 and (root / "solutions").is_dir():
        return shown.stdout  # the course's repository: exercises/ at HEAD is the stub as shipped
    raise ValueError(f"expected the pristine stub at {kept} (written by `grader release`), found nothing: an "
                     f"interview round must start from the stub, not from your {rel}")


def touched(root: Path, exercise) -> bool:
    """Whether the student's exercises/<id> file differs from the stub as handed out (True when no pristine
    copy is known: then every check counts)."""
    mine = root / "exercises" / exercise.id / exercise.file
    try:
        return mine.read_text() != pristine_stub(root, exercise)
    except (OSError, ValueError):
        return True


def start_interview(root: Path, course, level: str | None = None, minutes: int | None = None,
                    target: str | None = None, seed: int | None = None) -> tuple[Round, dict]:
    """Copy a fresh stub for a picked round into practice/ and start its clock: (the round, its state)."""
    round_ = pick(course, level, minutes, target, random.Random(seed))
    exercise = round_.exercise
    stub = pristine_stub(root, exercise)
    practice = root / "practice" / exercise.id
    if practice.exists():
        shutil.rmtree(practice)
    practice.mkdir(parents=True)
    source = root / "exercises" / exercise.id
    for name in ("README.md", "test_public.py"):
        if (source / name).exists():
            shutil.copy2(source / name, practice / name)
    (practice / exercise.file).write_text(stub)
    (practice / "conftest.py").write_text(PRACTICE_CONFTEST)
    state = {"round": round_.id, "minutes": minutes or round_.minutes, "started": time.time(),
             "folder": str(practice.relative_to(root))}
    data = load(root)
    data["interview"] = state
    save(root, data)
    return round_, state


def current_interview(root: Path, course) -> tuple[Round, dict]:
    """The running round (rebuilt from course.yaml by its id) and its state."""
    state = load(root).get("interview")
    if not state:
        raise ValueError("no interview round is running; start one with `make interview`")
    return pick(course, None, None, state.get("round") or state["exercise"], random.Random()), state


def finish_interview(root: Path, passed: int, total: int) -> dict:
    data = load(root)
    round_ = data.pop("interview", None)
    if not round_:
        raise ValueError("no interview round is running; start one with `make interview`")
    used = (time.time() - round_["started"]) / 60
    record = {"exercise": round_.get("round") or round_["exercise"], "date": today(), "minutes_used": round(used, 1),
              "time_box": round_["minutes"], "public_tests_passed": f"{passed}/{total}"}
    data.setdefault("interviews", []).append(record)
    save(root, data)
    return record
