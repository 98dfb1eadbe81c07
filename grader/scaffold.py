"""`grader new <id>`: every file of a new exercise, with `TODO` markers where the author writes.

The scaffold is a working placeholder exercise (`compute(x)`: the sum of each row of a [rows, cols] tensor) so
that the stub, the reference, the public and hidden tests, the oracle and the known-wrong submissions run and
grade from the first minute (`python -m tests.known_wrong <id>`); the author replaces it with the technique, file
by file. It writes:

  exercises/<id>/README.md         the standard sections (Why, The contract, How it is graded with the technique's
                                   signature and what its check cannot see, Hints, Sources)
  exercises/<id>/<file>            the stub: the signature and contract docstring, a body raising NotImplementedError
  exercises/<id>/test_public.py    one hand-worked public test
  solutions/<id>/<file>            the reference
  grader/hidden/<id>/              test_hidden.py (opening with the contract-clause table), oracle.py, __init__.py
  tests/known_wrong/<id>.py        MUTANTS: a textbook one (right numbers, technique skipped) and two plain bugs
  course.yaml                      the exercise's block, appended (the file's text and comments kept as they are)

then runs `grader sync` (grader/derived.py) so that the points table, the hints and the practice plan's row exist.
`TODO` marks every place left to write; `left_to_write` finds them, and tests/test_exercise_files.py fails on each
file that still has one, naming the lines.
"""

from __future__ import annotations

import json
import keyword
import re
from dataclasses import dataclass
from pathlib import Path

from grader.course import COURSE_FILE, IDENT, load_course

TODO = re.compile(r"\bTODO\b")
FILE_NAME = re.compile(r"^[A-Za-z0-9_]+\.py$")  # course.yaml's pattern for `file`


class ScaffoldError(ValueError):
    """The id or file name cannot be scaffolded: the message says what was expected and what was found."""


# --------------------------------------------------------------------------------------------------
# Where an exercise's files live, and what is still to write in them


def exercise_paths(exercise_id: str, file: str) -> list[str]:
    """The files `grader new` writes for an exercise (relative to the course root), course.yaml aside."""
    return [
        f"exercises/{exercise_id}/README.md",
        f"exercises/{exercise_id}/{file}",
        f"exercises/{exercise_id}/test_public.py",
        f"solutions/{exercise_id}/{file}",
        f"grader/hidden/{exercise_id}/__init__.py",
        f"grader/hidden/{exercise_id}/oracle.py",
        f"grader/hidden/{exercise_id}/test_hidden.py",
        f"tests/known_wrong/{exercise_id}.py",
    ]


COURSE_BLOCK = "course.yaml: the {id} block"
PLAN_ROW = "README.md: the {id} practice plan row"


def places(root: Path, exercise) -> list[str]:
    """Every place an exercise's author writes: its files that exist, its course.yaml block, its practice plan
    row in README.md. The names `todo_markers` takes."""
    found = [p for p in exercise_paths(exercise.id, exercise.file) if (root / p).is_file()]
    return found + [COURSE_BLOCK.format(id=exercise.id), PLAN_ROW.format(id=exercise.id)]


def _course_block_lines(text: str, exercise_id: str) -> range:
    """The line numbers (0-based) of an exercise's block in course.yaml: from its `- id:` line (with the
    `# --- id ---` comment above it) to the next exercise's, or the end of the file."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if re.match(rf"^\s*- id: {re.escape(exercise_id)}\s*$", line)),
                 None)
    if start is None:
        return range(0)
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines):
        line = lines[end]
        stripped = line.strip()
        if stripped and (len(line) - len(line.lstrip())) <= indent and (stripped.startswith("- id:")
                                                                       or not stripped.startswith("#")):
            break
        if stripped.startswith("# --- ") and (len(line) - len(line.lstrip())) <= indent:
            break
        end += 1
    return range(start, end)


def todo_markers(root: Path, exercise_id: str, place: str) -> list[tuple[int, str]]:
    """(line number, line) of every TODO marker in one of `places`."""
    if place == COURSE_BLOCK.format(id=exercise_id):
        lines = (root / COURSE_FILE).read_text().splitlines()
        numbered = [(i + 1, lines[i]) for i in _course_block_lines("\n".join(lines), exercise_id)]
    elif place == PLAN_ROW.format(id=exercise_id):
        lines = (root / "README.md").read_text().splitlines()
        numbered = [(i + 1, line) for i, line in enumerate(lines) if line.startswith(f"| `{exercise_id}` |")]
    else:
        numbered = list(enumerate((root / place).read_text().splitlines(), start=1))
    return [(n, line.strip()) for n, line in numbered if TODO.search(line)]


def describe(place: str, markers: list[tuple[int, str]], shown: int = 5) -> str:
    """'exercises/x/README.md still has 3 TODO markers: line 3: ...; line 9: ...' (the first `shown` of them)."""
    listed = "; ".join(f"line {n}: {text[:100]}" for n, text in markers[:shown])
    more = f"; and {len(markers) - shown} more" if len(markers) > shown else ""
    plural = "s" if len(markers) != 1 else ""
    return f"{place} still has {len(markers)} TODO marker{plural}: {listed}{more}"


def left_to_write(root: Path, course=None) -> dict[str, list[str]]:
    """Per exercise, a `describe` line for each place that still has TODO markers (exercises with none left out)."""
    course = course or load_course(root)
    found: dict[str, list[str]] = {}
    for exercise in course.exercises:
        for place in places(root, exercise):
            markers = todo_markers(root, exercise.id, place)
            if markers:
                found.setdefault(exercise.id, []).append(describe(place, markers))
    return found


# --------------------------------------------------------------------------------------------------
# Refusals


def check_id(root: Path, exercise_id: str, file: str) -> None:
    """Raise ScaffoldError unless `exercise_id` is a new, valid exercise id and `file` a valid module file name."""
    if not exercise_id.isidentifier() or keyword.iskeyword(exercise_id) or not re.match(IDENT, exercise_id):
        raise ScaffoldError(
            f"exercise id {exercise_id!r} refused: expected a Python identifier in lower case (letters, digits, "
            f"underscores, starting with a letter; not a keyword), as course.yaml requires ({IDENT})")
    course = load_course(root)
    if any(e.id == exercise_id for e in course.exercises):
        raise ScaffoldError(f"exercise {exercise_id!r} already exists in {COURSE_FILE}; expected a new id, not one of "
                            f"{[e.id for e in course.exercises]}")
    if not FILE_NAME.match(file) or not file[:-3].isidentifier() or keyword.iskeyword(file[:-3]) \
            or file.startswith("test_"):
        raise ScaffoldError(f"--file {file!r} refused: expected a Python module's file name (NAME.py, NAME an "
                            "identifier that does not start with test_, which pytest would collect)")
    there = [p for p in exercise_paths(exercise_id, file) if (root / p).exists()]
    folders = [d for d in (f"exercises/{exercise_id}", f"solutions/{exercise_id}", f"grader/hidden/{exercise_id}")
               if (root / d).exists()]
    if there or folders:
        raise ScaffoldError(f"exercise {exercise_id!r} is not in {COURSE_FILE} but its files exist already: "
                            f"{sorted(set(folders + there))}; expected none (remove them, or register the exercise "
                            f"in {COURSE_FILE} by hand)")
    text = (root / COURSE_FILE).read_text()
    top = [line for line in text.splitlines() if re.match(r"^[A-Za-z_]", line)]
    if not top or not top[-1].startswith("exercises:"):
        raise ScaffoldError(f"expected `exercises:` to be the last top-level key of {COURSE_FILE} (the new block is "
                            f"appended at its end), found {top[-1].split(':')[0] if top else 'no key'!r} after it")


# --------------------------------------------------------------------------------------------------
# The files


@dataclass(frozen=True)
class Names:
    id: str
    title: str
    file: str

    @property
    def module(self) -> str:
        return self.file[:-3]


def _readme(n: Names) -> str:
    from grader.selfstudy import HINTS_END, HINTS_START

    return f"""# {n.title}

**Budget bought back: TODO (memory, compute or bandwidth).** TODO: why the technique matters, with a number a
reader can check (bytes moved, FLOPs, seconds), and what the exercise builds.

## Why

TODO: the technique built up step by step, from the textbook computation to the one the exercise asks for, with
the arithmetic that makes it worth doing.

## The contract

TODO: every function's exact contract: arguments, shapes, dtypes, devices, what it returns, edge cases (empty
inputs, extreme values), the errors it raises. The scaffold's placeholder, to replace: `compute(x)` takes a
[rows, cols] floating-point tensor and returns the sum of each row, [rows], in x's dtype, with no Python loop over
rows.

## How it is graded

**The signature: TODO.** TODO: what the technique does that the textbook computation (the same numbers, the
technique skipped) does not, and the check that observes it (`signature`; the placeholder's counts the lines,
operators and read-backs of a call at two sizes). What it cannot see: TODO (what a submission could do that the
check does not observe).

## Hints

{HINTS_START}
{HINTS_END}

## Sources

- TODO: the papers, with sections and equations, and the code this exercise follows.
"""


def _stub(n: Names) -> str:
    return f'''"""{n.title}: the exercise. Read README.md in this folder first.

TODO: what the student writes here and the conventions every function shares (dtypes, devices, what no function
may do). Run the public tests with `make check EX={n.id}` (or `.venv/bin/pytest exercises/{n.id}`).
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def compute(x: Tensor) -> Tensor:
    """TODO: the contract, as README.md states it (the scaffold's placeholder: the sum of each row).

    Args:
        x: [rows, cols] floating-point tensor.

    Returns:
        [rows], x's dtype: the sum of each row, with no Python loop over rows.
    """
    raise NotImplementedError("compute: the sum of each row of x")
'''


def _solution(n: Names) -> str:
    return f'''"""{n.title}: the reference solution. Clear first, fast enough for every bar.

TODO: the reference of the technique (the scaffold's placeholder sums each row).
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def compute(x: Tensor) -> Tensor:
    """TODO: the contract, as in the stub (the scaffold's placeholder: the sum of each row)."""
    return x.sum(dim=-1)
'''


def _public_test(n: Names) -> str:
    return f'''"""Public tests for {n.title}: small, fast, and each failure says what to look at.

Run: make check EX={n.id}   (or: .venv/bin/pytest exercises/{n.id})
TODO: a few hand-worked cases, each with a message that teaches (the scaffold's placeholder checks one).
"""

import pytest
import torch

from grader.testing import assert_close


@pytest.fixture(scope="module")
def sm(student):
    return student.load("{n.id}")


@pytest.mark.check("compute_public")
def test_compute_on_a_hand_worked_input(sm):
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert_close(sm.compute(x), torch.tensor([6.0, 15.0]), atol=0, rtol=0, what="compute(x) [row]",
                 hint="TODO: the mistake this case catches and what to look at (placeholder: each row's sum)")
'''


def _oracle(n: Names) -> str:
    return f'''"""Naive oracles for {n.title}'s hidden checks: the textbook, in float64, with plain loops.

None of this is the solution.

- `oracle_compute`: TODO: what it computes and how (the scaffold's placeholder: each row's sum, a Python loop
  over lists in float64).
"""

from __future__ import annotations

import torch


def oracle_compute(x: torch.Tensor) -> torch.Tensor:
    """Each row's sum, row by row over Python lists, in float64."""
    return torch.tensor([sum(row) for row in x.double().tolist()], dtype=torch.float64)
'''


def _hidden_test(n: Names) -> str:
    return f'''"""Hidden checks for {n.title}.

The oracles (oracle.py) are TODO: the textbook each test compares against.

The signature: TODO: what the technique does that the textbook computation does not, how `signature` observes
it, and what it cannot see (the scaffold's placeholder counts the lines, operators and read-backs of one call
at 16 and at 512 rows).

Contract clauses (README "The contract") and the tests that draw them:

| clause | tests |
| --- | --- |
| TODO: every clause of the README's contract | TODO: the tests that draw it |
| compute(x): [rows, cols] -> [rows], each row's sum, x's dtype | test_compute_against_the_oracle |
| no Python loop over rows | test_compute_is_vectorised |
"""

import pytest
import torch

from grader.hidden.{n.id}.oracle import oracle_compute
from grader.structure import assert_no_loop_over
from grader.testing import assert_close


@pytest.fixture(scope="module")
def sm(student):
    return student.load("{n.id}")


@pytest.mark.check("compute")
@pytest.mark.parametrize("rows,cols", [(0, 3), (1, 1), (7, 129)])
def test_compute_against_the_oracle(sm, rng, rows, cols):
    x = torch.randn(rows, cols, generator=rng, dtype=torch.float64)
    got = sm.compute(x)
    assert isinstance(got, torch.Tensor) and got.dtype == x.dtype, (
        f"compute on {{rows}} x {{cols}} float64: expected a float64 tensor, found {{type(got).__name__}} "
        f"{{getattr(got, 'dtype', '')}}")
    assert_close(got, oracle_compute(x), atol=1e-9, rtol=1e-9, what=f"compute(x) on {{rows}} x {{cols}} [row]",
                 hint="TODO: what to look at (placeholder: each row's sum)")


@pytest.mark.check("signature")
def test_compute_is_vectorised(sm, student):
    # The declared structural check (grader/AUTHORING.md, "Declared structural checks"): one call, real sizes.
    assert_no_loop_over(student, sm.compute, lambda rows: (torch.ones(rows, 4),),
                        lambda out, x: assert_close(out, torch.full((len(x),), 4.0), atol=0, rtol=0,
                                                    what=f"compute(ones({{len(x)}}, 4)) [row]"),
                        over="rows", sizes=(16, 512),
                        advice="TODO: the advice (placeholder: sum every row in one tensor operation)")
'''


def _known_wrong(n: Names) -> str:
    return f'''"""Known-wrong submissions for {n.title}: the bugs students really make, as edits of the reference.

TODO: the signature check and the mistakes students make (the scaffold's placeholders: a textbook loop over
rows that keeps `compute` and loses `signature`, and two plain bugs).
"""

from tests.known_wrong import Mutant

MUTANTS = [
    Mutant(
        name="textbook",
        why="TODO: the textbook computation, the same numbers without the technique (placeholder: I summed the rows "
            "one by one in a Python loop)",
        edits=[("    return x.sum(dim=-1)\\n",
                "    return torch.stack([row.sum() for row in x]) if len(x) else x.sum(dim=-1)\\n")],
        loses=["signature"],
        keeps=["compute"],
    ),
    Mutant(
        name="wrong_dim",
        why="TODO: a mistake students make (placeholder: I summed over the rows instead of along them)",
        edits=[("return x.sum(dim=-1)", "return x.sum(dim=0)")],
        loses=["compute_public", "compute"],
    ),
    Mutant(
        name="first_column_dropped",
        why="TODO: a mistake students make (placeholder: I started each row's sum at its second element)",
        edits=[("return x.sum(dim=-1)", "return x[:, 1:].sum(dim=-1)")],
        loses=["compute_public", "compute"],
    ),
]
'''


def _course_block(n: Names) -> str:
    q = json.dumps  # a JSON string is a YAML double-quoted scalar
    return f"""
  # --- {n.id} ---
  - id: {n.id}
    title: {q(n.title)}
    file: {n.file}
    budget: "TODO: memory, compute or bandwidth"
    difficulty: medium   # TODO: easy, medium or hard, once someone has solved it
    minutes: 60          # TODO: the minutes a solver needs
    points: 20
    time_limit_s: 600
    call_timeout_s: 120
    memory_mb: 1000  # TODO: a whole grade's peak with a CPU build of torch (python -m grader.bench.memory)
    memory_mb_cuda_torch: 1400  # TODO: the same with a CUDA build of torch
    checks:
      - {{id: compute_public, title: "TODO: what the public tests check", points: 5, visibility: public}}
      - {{id: compute, title: "TODO: what the hidden correctness tests check", points: 10}}
      - {{id: signature, title: "TODO: the signature: what the technique does that the textbook computation does not", points: 5}}
    hints:
      - {{text: "TODO: a gentle first hint (then more, each more explicit than the last)", checks: [compute_public, compute]}}
"""


def new_exercise(root: Path, exercise_id: str, title: str | None = None, file: str | None = None) -> list[str]:
    """Write every file of exercise `exercise_id`, append its course.yaml block, run `grader sync`; returns the
    paths written (relative to `root`). Raises ScaffoldError, writing nothing, for an id or file it refuses."""
    from grader.derived import sync

    file = file or f"{exercise_id}.py"
    check_id(root, exercise_id, file)
    n = Names(exercise_id, title or exercise_id.replace("_", " ").capitalize(), file)
    contents = dict(zip(exercise_paths(n.id, n.file), (
        _readme(n), _stub(n), _public_test(n), _solution(n), "", _oracle(n), _hidden_test(n), _known_wrong(n))))
    course_yaml = root / COURSE_FILE
    original = course_yaml.read_text()
    course_yaml.write_text(original.rstrip("\n") + "\n" + _course_block(n))
    try:
        load_course(root)  # the appended block must parse as part of the course
    except Exception:
        course_yaml.write_text(original)
        raise
    for rel, text in contents.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    sync(root)
    readme = root / "README.md"  # the practice plan's new row starts with an empty follow-up questions cell
    plan = readme.read_text()
    row = re.compile(rf"^(\| `{re.escape(n.id)}` \| [a-z]+ \| [0-9]+ \|) *\|$", re.M)
    readme.write_text(row.sub(r"\1 TODO: the follow-up questions an interviewer would ask |", plan, count=1))
    return [*contents, COURSE_FILE, "README.md"]
