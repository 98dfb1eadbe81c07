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


def record_check(root: Path, exercise_id: str, all_passed: bool, failing: list[str] | None = None) -> None:
    """One `make check` of an exercise: an attempt, the first full pass, and the public checks that failed
    (`make hint` starts from the hints for those)."""
    data = load(root)
    state = exercise_state(data, exercise_id)
    state["attempts"] += 1
    if all_passed and not state["first_pass"]:
        state["first_pass"] = today()
    state["failing"] = list(failing or [])
    save(root, data)


def shown_hints(state: dict, available: int) -> list[int]:
    """The indices of the hints shown so far (an older .progress.json kept only how many: the first ones)."""
    shown = state.get("shown")
    if isinstance(shown, list):
        return sorted({i for i in shown if isinstance(i, int) and 0 <= i < available})
    return list(range(min(int(state.get("hints", 0) or 0), available)))


def pick_hint(hints: list, shown: list[int], failing: list[str]) -> int | None:
    """The next hint to show: the first unseen one for the first check the last `make check` failed (in the
    course's order of checks: the first failure is the one to fix first), then for the next failed check, else
    the first unseen one; None when all were shown."""
    unseen = [i for i in range(len(hints)) if i not in shown]
    for check in failing:
        for i in unseen:
            if check in hints[i].checks:
                return i
    return unseen[0] if unseen else None


def next_hint(root: Path, exercise_id: str, hints: list) -> tuple[list[int], int | None]:
    """Reveal one more hint of an exercise; returns (every hint shown, in order; the one just revealed)."""
    data = load(root)
    state = exercise_state(data, exercise_id)
    shown = shown_hints(state, len(hints))
    new = pick_hint(hints, shown, state.get("failing") or [])
    if new is not None:
        shown = sorted({*shown, new})
    state["shown"], state["hints"] = shown, len(shown)
    save(root, data)
    return shown, new


def reset_hints(root: Path, exercise_id: str) -> None:
    data = load(root)
    state = exercise_state(data, exercise_id)
    state["hints"], state["shown"] = 0, []
    save(root, data)


HINTS_START = "<!-- hints: rendered from course.yaml by `grader sync` (make sync); edit them there -->"
HINTS_END = "<!-- /hints -->"
HINTS_START_ANY = r"^<!-- hints:[^\n]*-->$"  # this start marker, or an older wording of it


def render_hints(exercise: Any) -> str:
    """The README's numbered hints, from course.yaml: one source for both (`make hint` shows the same texts)."""
    import textwrap

    lines = [HINTS_START]
    for i, hint in enumerate(exercise.hints, 1):
        lines += textwrap.wrap(f"{i}. {hint.text}", width=100, subsequent_indent="   ", break_on_hyphens=False,
                               break_long_words=False)
    lines.append(HINTS_END)
    return "\n".join(lines)


def readme_with_hints(text: str, exercise: Any) -> str:
    """`text` (an exercise README) with its hints block rendered afresh. A README without the block gets it in
    place of its Hints section's numbered list (or after the section's text, when it has none)."""
    import re

    block = render_hints(exercise)
    marker = re.search(HINTS_START_ANY, text, re.M)
    if marker and HINTS_END in text[marker.end():]:
        return text[:marker.start()] + block + text[marker.end():].split(HINTS_END, 1)[1]
    heading = re.search(r"^## Hints[^\n]*\n", text, re.M)
    if heading is None:
        raise ValueError(f"exercises/{exercise.id}/README.md: expected a '## Hints' section, found none")
    start = heading.end()
    end = text.find("\n## ", start)
    end = len(text) if end < 0 else end + 1
    section = text[start:end]
    listed = re.search(r"^1\. .*?(?=\n\n(?! {3})|\Z)", section, re.S | re.M)
    if listed:
        section = section[:listed.start()] + block + section[listed.end():]
    else:
        section = section.rstrip("\n") + "\n\n" + block + "\n\n"
    return text[:start] + section + text[end:]


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


# A table of practice rounds, as the student release's README and the course README's parts table print it.
ROUNDS_HEADER = ("| round | what you write | level | minutes |", "| --- | --- | --- | --- |")


def round_row(r: Round) -> str:
    return f"| `{r.id}` | {r.title} | {r.difficulty} | {r.minutes} |"


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


class Started(NamedTuple):
    """What `start_interview` did: the round, its state, where an earlier practice file of the exercise was
    moved (None when there was none, or it was the untouched stub), and the round it replaced, if one was
    running (its state; it is not recorded)."""

    round: Round
    state: dict
    kept: Path | None
    replaced: dict | None


def keep_aside(path: Path) -> Path:
    """Move `path` beside itself, to `<name>.<date>-<time>.bak` (a number added if that is taken): nothing of the
    student's is deleted. Returns where it went."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside, n = path.with_name(f"{path.name}.{stamp}.bak"), 2
    while aside.exists() or aside.is_symlink():
        aside, n = path.with_name(f"{path.name}.{stamp}-{n}.bak"), n + 1
    path.rename(aside)
    return aside


def start_interview(root: Path, course, level: str | None = None, minutes: int | None = None,
                    target: str | None = None, seed: int | None = None) -> Started:
    """Copy a fresh stub for a picked round into practice/ and start its clock. A practice file already there
    that differs from the stub (an earlier round's work, solved or not) is moved aside, never overwritten; the
    README, public tests and conftest.py are the course's and are written afresh; anything else is left alone."""
    round_ = pick(course, level, minutes, target, random.Random(seed))
    exercise = round_.exercise
    stub = pristine_stub(root, exercise)
    practice = root / "practice" / exercise.id
    if practice.exists() and not practice.is_dir():
        raise ValueError(f"expected practice/{exercise.id} to be a folder for the round, found a file there: "
                         f"move it away and start again")
    practice.mkdir(parents=True, exist_ok=True)
    mine = practice / exercise.file
    kept = None
    if mine.is_symlink() or mine.exists():
        try:
            same = mine.is_file() and not mine.is_symlink() and mine.read_bytes() == stub.encode()
        except OSError:
            same = False
        if not same:
            kept = keep_aside(mine)
    source = root / "exercises" / exercise.id
    for name in ("README.md", "test_public.py"):
        if (source / name).exists():
            (practice / name).unlink(missing_ok=True)
            shutil.copy2(source / name, practice / name)
    mine.write_text(stub)
    (practice / "conftest.py").write_text(PRACTICE_CONFTEST)
    state = {"round": round_.id, "minutes": minutes or round_.minutes, "started": time.time(),
             "folder": str(practice.relative_to(root))}
    data = load(root)
    replaced = data.get("interview") or None
    data["interview"] = state
    save(root, data)
    return Started(round_, state, kept, replaced)


def current_interview(root: Path, course) -> tuple[Round, dict]:
    """The running round (rebuilt from course.yaml by its id) and its state."""
    state = load(root).get("interview")
    if not state:
        raise ValueError("no interview round is running; start one with `make interview`")
    return pick(course, None, None, state.get("round") or state["exercise"], random.Random()), state


def finish_interview(root: Path, passed: int, total: int) -> dict:
    """Record the running round as done with `passed` of `total` public tests. A round whose tests never ran
    (total 0: the file did not compile or import, or no test was collected) is not recorded: it keeps running."""
    if total <= 0:
        raise ValueError(f"expected the round's public tests to run, found {passed}/{total}: the round is not "
                         "recorded and keeps running")
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


def describe_round(record: dict) -> str:
    """One done round, for people: `make interview-done` and `make progress` print it."""
    return (f"{record.get('exercise', '?')} on {record.get('date', '?')}: {record.get('public_tests_passed', '?')} "
            f"public tests passed in {record.get('minutes_used', '?')} of {record.get('time_box', '?')} minutes")
