"""`grader sync`: course.yaml is the one registration, and every block derived from it (README.md's practice plan,
each exercise README's points table and hints) is written by this one command (grader/derived.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grader import derived


def grader(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grader", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"}, timeout=300)


@pytest.fixture
def course_copy(root, tmp_path) -> Path:
    """The files `grader sync` reads and writes, copied: course.yaml, README.md, every exercise README."""
    copy = tmp_path / "course"
    for rel in ["course.yaml", "README.md", *(str(p.relative_to(root)) for p in root.glob("exercises/*/README.md"))]:
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / rel, copy / rel)
    return copy


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) >= 1, f"the test expected {old!r} in {path}"
    path.write_text(text.replace(old, new, 1))


def test_every_derived_block_is_current(root):
    run = grader(root, "sync", "--check")
    assert run.returncode == 0, f"a block course.yaml derives is stale: run `grader sync` (make sync)\n{run.stderr}"
    assert "current" in run.stdout


def test_every_block_course_yaml_derives_is_known(root, course):
    names = {(b.path, b.name) for b in derived.blocks(root, course)}
    assert {("README.md", "practice plan"), ("README.md", "practice parts"), ("README.md", "demo table")} <= names
    for exercise in course.exercises:
        assert {(f"exercises/{exercise.id}/README.md", n) for n in ("points", "hints")} <= names


def test_check_names_each_stale_block_and_sync_fixes_them(course_copy):
    """Points moved between two checks and a part's minutes changed: --check names exactly the two blocks that
    copy them, writes nothing, and `grader sync` rewrites them (the prose columns kept)."""
    course_yaml = course_copy / "course.yaml"
    edit(course_yaml, 'title: "online_normalizer on small matrices", points: 5',
         'title: "online_normalizer on small matrices", points: 6')
    edit(course_yaml, "fp16 to fp64, one pass\", points: 11}", "fp16 to fp64, one pass\", points: 10}")
    edit(course_yaml, "{id: normalizer, difficulty: easy, minutes: 20,", "{id: normalizer, difficulty: easy, minutes: 25,")
    readme = course_copy / "exercises/online_softmax/README.md"
    before = {p: p.read_text() for p in course_copy.rglob("README.md")}

    run = grader(course_copy, "sync", "--check")
    assert run.returncode == 1, f"stale blocks must fail --check (exit 1): {run.stdout}{run.stderr}"
    stale = sorted(line.removeprefix("stale: ") for line in run.stderr.splitlines() if line.startswith("stale: "))
    assert stale == ["README.md: practice parts", "exercises/online_softmax/README.md: points"], run.stderr
    assert "run `grader sync` (make sync)" in run.stderr
    assert {p: p.read_text() for p in before} == before, "--check must write nothing"

    run = grader(course_copy, "sync")
    assert run.returncode == 0, run.stderr
    assert "rewrote exercises/online_softmax/README.md: points" in run.stdout
    text = readme.read_text()
    assert "| `normalizer_public` | 6 | public: small matrices, the rescale, one pass, no chunks |" in text
    assert "| `normalizer` | 10 | random chunkings" in text, "the check's prose is kept, its points are course.yaml's"
    assert "| `online_softmax/normalizer` | " in (course_copy / "README.md").read_text()
    assert "| easy | 25 |" in (course_copy / "README.md").read_text()
    assert grader(course_copy, "sync", "--check").returncode == 0, "after `grader sync`, --check must pass"


def test_a_new_check_gets_a_row_from_its_title(course_copy):
    course_yaml = course_copy / "course.yaml"
    edit(course_yaml, "    points: 100\n", "    points: 101\n")  # online_softmax comes first
    edit(course_yaml, "      - {id: merge_public,",
         '      - {id: extra_public, title: "extra | check", points: 1, visibility: public}\n      - {id: merge_public,')
    assert [str(b) for b in derived.sync(course_copy)] == ["README.md: demo table",
                                                           "exercises/online_softmax/README.md: points"]
    text = (course_copy / "exercises/online_softmax/README.md").read_text()
    assert "| `normalizer_public` | 5 | public: small matrices, the rescale, one pass, no chunks |\n" \
           "| `extra_public` | 1 | extra \\| check (public) |\n| `merge_public` | 5 |" in text


def test_a_table_without_markers_is_adopted(course_copy, root):
    """A README written by hand (its tables but no markers) gets the markers, and nothing else changes."""
    for rel in ("README.md", "exercises/gptq/README.md"):
        path = course_copy / rel
        text = re.sub(r"<!-- generated by grader sync: [^\n]*-->\n\n", "", path.read_text())
        path.write_text(re.sub(r"\n<!-- end generated: [^\n]*-->\n", "", text))
    assert {str(b) for b in derived.sync(course_copy)} == {
        "README.md: practice plan", "README.md: practice parts", "README.md: demo table",
        "exercises/gptq/README.md: points"}
    for rel in ("README.md", "exercises/gptq/README.md"):
        assert (course_copy / rel).read_text() == (root / rel).read_text(), f"{rel}: adopted, then as it was"


def test_a_readme_with_no_place_for_a_block_is_named(course_copy):
    path = course_copy / "exercises/gptq/README.md"
    text = path.read_text()
    start = text.index("<!-- generated by grader sync: points")
    end = text.index("<!-- end generated: points -->") + len("<!-- end generated: points -->\n")
    path.write_text((text[:start] + text[end:]).replace("## How it is graded", "## Grading"))
    with pytest.raises(ValueError, match=r"exercises/gptq/README.md: expected a '## How it is graded' section"):
        derived.sync(course_copy, check=True)
    run = grader(course_copy, "sync", "--check")
    assert run.returncode == 2 and "How it is graded" in run.stderr, run.stderr


def test_the_student_readme_has_no_sync_markers(root):
    from grader.release import student_readme

    text = student_readme((root / "exercises/online_softmax/README.md").read_text())
    assert "grader sync" not in text and "end generated" not in text and "<!-- /hints -->" not in text
    assert "\n1. Write softmax the slow way first" in text, "the hints stay, without their markers"
    assert "| `normalizer_public` | 5 |" in text


def test_the_demo_table_counts_each_exercises_cuda_points_as_not_graded(course):
    """The README's demo table is what `make demo` prints on a CPU host: a new CUDA check moves its points from the
    reference column to 'not graded' (a helper once added two CUDA checks and left the table at full marks)."""
    from grader.derived import demo_table

    table = demo_table(course)
    for exercise in course.exercises:
        cuda = sum(c.points for c in exercise.checks if c.cuda)
        row = next(line.split() for line in table.splitlines() if line.split()[:1] == [exercise.id])
        assert row[1] == f"{exercise.points - cuda:g}/{exercise.points:g}" and row[3:] == ([f"{cuda:g}"] if cuda else [])
    total = next(line.split() for line in table.splitlines() if line.split()[:1] == ["total"])
    cuda_total = sum(c.points for e in course.exercises for c in e.checks if c.cuda)
    assert total[3] == f"{cuda_total:g}" and f"the remaining {cuda_total:g} are" in table
