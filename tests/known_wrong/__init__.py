"""Known-wrong submissions: the bugs students really make, as edits of each reference solution.

Each exercise's module here defines MUTANTS. tests/test_scoring.py grades every mutant and proves it
loses the points it should, keeps the ones it should, and that the first failing public and hidden
messages name its cause. `python -m tests.known_wrong <exercise>` shows those messages while you write.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Mutant:
    name: str  # short id, used in test ids
    why: str  # the mistake, in a student's words
    edits: list[tuple[str, str]]  # (old, new) replacements on the reference; each old occurs once
    loses: list[str] = field(default_factory=list)  # checks that must come out below full marks
    # Checks that must keep full marks: a "textbook" submission (right numbers, technique skipped) keeps
    # the correctness checks and loses only the signature's, which proves the signature check is what sees it.
    keeps: list[str] = field(default_factory=list)
    # What the student must read: a regular expression (case-insensitive) that the first failing public test's
    # message and the first failing hidden test's message, among the checks it loses, must each match. It names
    # the real bug ("rescale"), so a message that blames another cause ("is the last block included?") fails.
    cause: str = ""

    def apply(self, source: str) -> str:
        for old, new in self.edits:
            count = source.count(old)
            if count != 1:
                raise ValueError(
                    f"mutant {self.name!r}: expected the text to replace exactly once in the reference, "
                    f"found it {count} times:\n{old}"
                )
            source = source.replace(old, new)
        return source


def first_failures(result: dict, exercise_id: str, checks: list[str]) -> dict[str, tuple[str, str, str]]:
    """{"public"|"hidden": (check id, test name, message)}: the first test below full marks among `checks`, in
    course.yaml's order of the exercise's checks, per visibility; CUDA checks not graded here never count."""
    ex = next(e for e in result["exercises"] if e["id"] == exercise_id)
    found: dict[str, tuple[str, str, str]] = {}
    for check in ex["checks"]:
        if check["id"] not in checks or check["visibility"] in found:
            continue
        for test in check["tests"]:
            if test["status"] == "not_graded":
                continue
            if test["status"] != "passed" or test.get("fraction", 1.0) < 1.0:
                found[check["visibility"]] = (check["id"], test["name"], test["message"])
                break
    return found


def load_mutants(exercise_id: str) -> list[Mutant]:
    """The MUTANTS of tests/known_wrong/<exercise_id>.py ([] when the exercise has none yet)."""
    import importlib

    try:
        module = importlib.import_module(f"tests.known_wrong.{exercise_id}")
    except ModuleNotFoundError as exc:
        if exc.name == f"tests.known_wrong.{exercise_id}":
            return []
        raise
    return list(module.MUTANTS)


def write_mutant(root, exercise, mutant: Mutant, dest):
    """Write the mutated reference as a flat submission folder `dest`; returns it."""
    from pathlib import Path

    source = (Path(root) / "solutions" / exercise.id / exercise.file).read_text()
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / exercise.file).write_text(mutant.apply(source))
    return dest
