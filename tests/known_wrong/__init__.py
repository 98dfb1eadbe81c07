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
