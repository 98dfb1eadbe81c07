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
        assert row in text, (f"README.md's practice plan should have the row {row!r} (from course.yaml): "
                             "run `grader sync` (make sync)")


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


def test_each_readme_shows_the_hints_course_yaml_holds(root, course):
    """One source: `make hint` and the README give the same texts (`grader sync` writes the README's)."""
    from grader.selfstudy import readme_with_hints

    for exercise in course.exercises:
        text = (root / "exercises" / exercise.id / "README.md").read_text()
        assert readme_with_hints(text, exercise) == text, (
            f"exercises/{exercise.id}/README.md's hints differ from course.yaml's: edit them in course.yaml and "
            "run `grader sync` (make sync)")


def test_the_next_hint_is_one_for_a_check_the_last_make_check_failed(tmp_path, course):
    from grader import selfstudy

    hints = course.exercise("moe_router").hints
    dispatch = next(i for i, h in enumerate(hints) if "dispatch_public" in h.checks)
    assert dispatch > 0, "the dispatch hint comes late in the order: the test needs it to be picked out of order"
    selfstudy.record_check(tmp_path, "moe_router", False, failing=["dispatch_public"])
    shown, new = selfstudy.next_hint(tmp_path, "moe_router", hints)
    assert new == dispatch and shown == [dispatch], (shown, new)
    shown, new = selfstudy.next_hint(tmp_path, "moe_router", hints)  # no other hint for that check: in order
    assert new == 0 and shown == [0, dispatch]
    selfstudy.record_check(tmp_path, "moe_router", True, failing=[])
    for _ in range(len(hints)):
        shown, new = selfstudy.next_hint(tmp_path, "moe_router", hints)
    assert shown == list(range(len(hints))) and new is None


def test_an_older_progress_file_keeps_the_hints_it_counted(tmp_path, course):
    import json

    from grader import selfstudy

    (tmp_path / selfstudy.PROGRESS_FILE).write_text(json.dumps({"exercises": {"gptq": {"attempts": 1, "hints": 2}}}))
    shown, new = selfstudy.next_hint(tmp_path, "gptq", course.exercise("gptq").hints)
    assert shown == [0, 1, 2] and new == 2


def test_a_hint_names_only_checks_its_exercise_has():
    from grader.course import Exercise

    with pytest.raises(ValueError, match="hints name checks this exercise does not have"):
        Exercise.model_validate({
            "id": "x", "title": "x", "file": "x.py", "points": 1, "budget": "memory", "difficulty": "easy",
            "minutes": 1, "time_limit_s": 1, "call_timeout_s": 1,
            "checks": [{"id": "a", "title": "a", "points": 1}],
            "hints": ["plain", {"text": "linked", "checks": ["nope"]}]})


def test_the_first_failed_check_gets_its_hint_before_a_later_one():
    """online_softmax's no_rescale fails normalizer_public first and softmax_public after it: the rescale hint
    (normalizer's) is the one to read first, though a softmax hint comes earlier in the list (the journey of
    issue "The user's side" met the general one first)."""
    from types import SimpleNamespace

    from grader.selfstudy import pick_hint

    hints = [SimpleNamespace(checks=["softmax_public"]), SimpleNamespace(checks=["normalizer_public"])]
    assert pick_hint(hints, [], ["normalizer_public", "softmax_public"]) == 1
    assert pick_hint(hints, [1], ["normalizer_public", "softmax_public"]) == 0
    assert pick_hint(hints, [], []) == 0
