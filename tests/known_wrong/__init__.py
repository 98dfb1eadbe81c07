"""Known-wrong submissions: the bugs students really make, as edits of each reference solution.

Each exercise's module here defines MUTANTS. tests/test_known_wrong.py grades every mutant and
proves it loses the points it should.
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
