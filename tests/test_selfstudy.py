"""Interview practice: the rounds course.yaml offers, and how one is picked."""

import random

import pytest

from grader.selfstudy import pick, rounds


def test_every_exercise_and_every_part_is_a_round(course):
    ids = [r.id for r in rounds(course)]
    for ex in course.exercises:
        assert ex.id in ids
        assert all(f"{ex.id}/{p.id}" in ids for p in ex.parts)
    assert any("/" in i for i in ids), "course.yaml should offer parts: rounds shorter than a whole exercise"


@pytest.mark.parametrize("level,minutes", [("easy", 30), ("medium", 45), ("hard", 120), (None, 25)])
def test_a_picked_round_fits_the_level_and_the_time_box(course, level, minutes):
    for seed in range(20):
        r = pick(course, level, minutes, None, random.Random(seed))
        assert level is None or r.difficulty == level, f"{r.id} is {r.difficulty}, asked for {level}"
        assert r.minutes <= minutes, f"{r.id} needs {r.minutes} minutes, the time box is {minutes}"


def test_a_part_round_counts_only_its_own_public_checks(course):
    r = pick(course, None, None, "gptq/quantizer", random.Random(0))
    assert r.exercise.id == "gptq" and r.part.id == "quantizer"
    assert r.checks == ["quantizer_public"]
    whole = pick(course, None, None, "gptq", random.Random(0))
    assert set(whole.checks) == {c.id for c in whole.exercise.checks if c.visibility == "public" and not c.cuda}


def test_nothing_fits_names_what_is_offered(course):
    with pytest.raises(ValueError, match=r"no practice round fits level=hard within 10 minutes; expected one of: "
                                         r"online_softmax \(easy, 45 min\)"):
        pick(course, "hard", 10, None, random.Random(0))


def test_an_unknown_part_is_named(course):
    with pytest.raises(KeyError, match="exercise 'gptq' has no part 'nope'; known: \\['quantizer', 'column_loop'\\]"):
        pick(course, None, None, "gptq/nope", random.Random(0))


def test_the_readme_practice_plan_matches_course_yaml(root, course):
    """README.md's practice tables list every round with course.yaml's level and minutes."""
    text = (root / "README.md").read_text()
    for r in rounds(course):
        row = (f"| `{r.id}` | {r.part.title} | {r.difficulty} | {r.minutes} |" if r.part
               else f"| `{r.id}` | {r.difficulty} | {r.minutes} |")
        assert row in text, f"README.md's practice plan should have the row {row!r} (from course.yaml)"


def test_an_attempt_is_a_check_of_a_file_the_student_changed(root, course, tmp_path):
    """`make check` over all exercises counts an attempt only where the file differs from the stub as handed out."""
    from grader.release import build_release
    from grader.selfstudy import touched

    lab = tmp_path / "lab"
    build_release(root, lab)
    softmax, flash = course.exercise("online_softmax"), course.exercise("flash_attention")
    assert not touched(lab, softmax) and not touched(lab, flash)
    mine = lab / "exercises" / "online_softmax" / softmax.file
    mine.write_text(mine.read_text() + "\n# started\n")
    assert touched(lab, softmax) and not touched(lab, flash)
