"""Grade every known-wrong submission of an exercise: which checks each one loses, and the first failing public and
hidden messages a student reads (each must match the mutant's `cause`).

    python -m tests.known_wrong EXERCISE [MUTANT ...]
"""

import re
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from grader.course import find_root, load_course
from grader.options import GradeOptions
from grader.runner import grade
from tests.known_wrong import first_failures, load_mutants, write_mutant


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
    messages = []
    for mutant in mutants:
        with tempfile.TemporaryDirectory() as tmp:
            folder = write_mutant(root, exercise, mutant, Path(tmp) / mutant.name)
            result = grade(course, root, folder, None, GradeOptions(exercises=[exercise.id], seed=20261129, checks=mutant.loses,
                                                                    first_failure=True))
        checks = result["exercises"][0]["checks"]
        lost = sorted(c["id"] for c in checks if c["status"] != "not_graded" and c["points"] < c["max_points"])
        not_graded = {c["id"] for c in checks if c["status"] == "not_graded"}  # CUDA checks on a host without one
        missing = sorted(set(mutant.loses) - set(lost) - not_graded)
        first = first_failures(result, exercise.id, mutant.loses)
        unnamed = [v for v, (_, _, message) in first.items()
                   if mutant.cause and not re.search(mutant.cause, message, re.IGNORECASE)]
        ok &= not missing and not unnamed
        verdict = ("[green]ok[/]" if not missing else f"[red]keeps {', '.join(missing)}[/]") + (
            f" [red]{' and '.join(unnamed)} message misses /{mutant.cause}/[/]" if unnamed else "")
        table.add_row(mutant.name, f"{result['score']:g}/{result['gradable_max_score']:g}", ", ".join(mutant.loses),
                      ", ".join(lost), verdict)
        messages.append((mutant, first))
    console = Console()
    console.print(table)
    for mutant, first in messages:  # what the student reads first: the cause must be named there
        console.print(Text.assemble((mutant.name, "bold"), f" (cause: /{mutant.cause or '-'}/): {mutant.why}"))
        for visibility, (check_id, test, message) in first.items():
            console.print(Text(f"  first failing {visibility}: {check_id}/{test}: {message.splitlines()[0]}"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
