"""Grade every known-wrong submission of an exercise and show which checks each one loses.

    python -m tests.known_wrong EXERCISE [MUTANT ...]
"""

import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from grader.course import find_root, load_course
from grader.options import GradeOptions
from grader.runner import grade
from tests.known_wrong import load_mutants, write_mutant


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    root = find_root()
    course = load_course(root)
    exercise = course.exercise(argv[0])
    mutants = [m for m in load_mutants(exercise.id) if len(argv) == 1 or m.name in argv[1:]]
    table = Table(title=f"known-wrong submissions of {exercise.id}")
    for col in ("mutant", "score", "must lose", "lost", "verdict"):
        table.add_column(col)
    ok = True
    for mutant in mutants:
        with tempfile.TemporaryDirectory() as tmp:
            folder = write_mutant(root, exercise, mutant, Path(tmp) / mutant.name)
            result = grade(course, root, folder, None, GradeOptions(exercises=[exercise.id], seed=12345, checks=mutant.loses))
        checks = result["exercises"][0]["checks"]
        lost = sorted(c["id"] for c in checks if c["status"] != "not_graded" and c["points"] < c["max_points"])
        missing = sorted(set(mutant.loses) - set(lost))
        ok &= not missing
        table.add_row(mutant.name, f"{result['score']:g}/{result['gradable_max_score']:g}", ", ".join(mutant.loses),
                      ", ".join(lost), "[green]ok[/]" if not missing else f"[red]keeps {', '.join(missing)}[/]")
    Console().print(table)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
