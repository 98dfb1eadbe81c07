"""course.yaml: the shipped file is valid, and mistakes produce errors that name the path."""

import copy
from pathlib import Path

import pytest
import yaml

from grader.course import CourseError, json_schema, load_course, parse_course


@pytest.fixture
def data(root):
    return yaml.safe_load((root / "course.yaml").read_text())


def test_shipped_course_is_valid(course):
    assert course.exercises[0].id == "online_softmax"
    for ex in course.exercises:
        assert ex.points == sum(c.points for c in ex.checks)


@pytest.mark.parametrize("mutate,expected", [
    (lambda d: d["exercises"][0].__setitem__("points", "ten"), "exercises[0].points: expected a positive number, found 'ten'"),
    (lambda d: d["exercises"][0].__setitem__("points", 99), "exercises[0]: points (99) must equal the sum of its checks' points, found 100"),
    (lambda d: d["exercises"][0]["checks"][0].__setitem__("points", -1), "exercises[0].checks[0].points: expected a number > 0, found -1"),
    (lambda d: d["exercises"][0].__setitem__("difficulty", "brutal"), "exercises[0].difficulty: expected one of 'easy', 'medium' or 'hard', found 'brutal'"),
    (lambda d: d["exercises"][0].pop("file"), "exercises[0].file: missing"),
    (lambda d: d["exercises"][0].__setitem__("pointz", 1), "exercises[0].pointz: unknown field"),
    (lambda d: d["exercises"][0]["checks"].append(dict(d["exercises"][0]["checks"][0])), "check ids must be unique"),
    (lambda d: d["exercises"][0]["checks"][-1]["speed"].__setitem__("floor", 9), "floor (9.0) must not exceed bar"),
    (lambda d: d["exercises"][0]["parts"][0].__setitem__("checks", ["normalizer"]),
     "exercises[0]: part 'normalizer': expected checks among this exercise's public CPU checks"),
    (lambda d: d["exercises"][0]["parts"][0].__setitem__("minutes", 0), "exercises[0].parts[0].minutes: expected a number > 0"),
])
def test_errors_name_the_path_and_what_was_expected(data, mutate, expected):
    bad = copy.deepcopy(data)
    mutate(bad)
    with pytest.raises(CourseError) as info:
        parse_course(bad)
    assert expected in str(info.value), str(info.value)
    assert str(info.value).startswith("course.yaml: ")


def test_top_level_must_be_a_mapping():
    with pytest.raises(CourseError, match="expected a mapping at the top level, found list"):
        parse_course([1, 2])


def test_speed_bar_credit_is_linear_between_floor_and_bar(course):
    bar = course.exercise("online_softmax").check("triton_speed").speed
    assert bar.credit(bar.bar) == 1.0 and bar.credit(bar.bar * 2) == 1.0
    assert bar.credit(bar.floor) == 0.0 and bar.credit(0.0) == 0.0
    assert bar.credit((bar.bar + bar.floor) / 2) == pytest.approx(0.5)
    assert bar.credit(float("nan")) == 0.0


def test_json_schema_describes_the_course():
    schema = json_schema()
    assert "exercises" in schema["properties"]


def test_shipped_json_schema_is_current(root):
    import json

    shipped = json.loads((root / "grader" / "schemas" / "course.schema.json").read_text())
    assert shipped == json_schema(), "regenerate grader/schemas/course.schema.json with `grader schema course`"


def test_the_suite_hash_covers_what_decides_a_grade(tmp_path):
    """A batch keeps a result whose suite hash is current: the hash must change with every file of the course
    that decides a grade (the tests, the oracles, the speed cases, the drivers), and not with a stub."""
    import shutil

    from grader.runner import suite_sha256

    root = Path(__file__).resolve().parents[1]
    course = load_course(root)
    exercise = course.exercise("online_softmax")
    copy = tmp_path / "course"
    for rel in ("course.yaml", "exercises/online_softmax", "grader/hidden/online_softmax",
                "grader/cases/online_softmax.py", "grader/support/timing.py"):
        src, dst = root / rel, copy / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dst) if src.is_dir() else shutil.copy(src, dst)
    (copy / "grader/support/online_softmax.py").write_text("# a driver\n")
    base = suite_sha256(copy, [exercise])
    for rel in ("grader/cases/online_softmax.py", "grader/support/online_softmax.py",
                "grader/hidden/online_softmax/oracle.py", "exercises/online_softmax/test_public.py"):
        path = copy / rel
        original = path.read_text()
        path.write_text(original + "\n# changed\n")
        assert suite_sha256(copy, [exercise]) != base, f"the suite hash must change with {rel}"
        path.write_text(original)
    stub = copy / "exercises/online_softmax" / exercise.file
    stub.write_text(stub.read_text() + "\n# the student's own\n")
    assert suite_sha256(copy, [exercise]) == base, "the stub is not part of the suite"
