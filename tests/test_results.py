"""A result that earns no score says why in fields, one builder makes it, and tools read the fields,
not the wording of a message."""

from __future__ import annotations

import pytest

from grader import results
from grader.course import find_root, load_course
from grader.scale.summary import classify

COURSE = load_course(find_root())
EXERCISES = COURSE.exercises[:2]


def fresh(**kwargs):
    return results.ungradable(COURSE, EXERCISES, "ann", "the archive is not a zip", suite_sha="s", seed=1, **kwargs)


def test_a_failure_by_the_submission_is_a_complete_zero_that_says_why():
    result = fresh()
    results.validate(result)
    assert result["failure"] == {"by": "submission", "reason": "the archive is not a zip", "retry": None}
    assert result["state"] == "complete" and result["gradable"] is False and result["score"] == 0
    assert result["format_errors"] == ["the archive is not a zip"]
    for ex in result["exercises"]:
        assert ex["status"] == "ungradable" and all(c["message"] == "the archive is not a zip" for c in ex["checks"])
    assert classify(result) == ("not_gradable", "the archive is not a zip")


def test_a_failure_by_the_grader_is_never_a_score_and_says_how_to_retry():
    result = fresh(by="grader", retry="rerun the batch to retry")
    results.validate(result)
    assert result["failure"]["by"] == "grader" and results.failed_by_grader(result)
    assert result["state"] == "running", "a grade the grader lost is graded again by the next run"
    assert result["format_errors"][0] == ("internal error of the grader, not a fault of the submission: the archive "
                                          "is not a zip; rerun the batch to retry")
    assert classify(result)[0] == "internal_error"


def test_a_grader_failure_on_one_exercise_keeps_the_others_and_the_root_cause():
    result = results.new_result(COURSE, "ann", "sha", "s", 1, "sandbox", EXERCISES)
    results.grader_failure(result, EXERCISES[0].id, "pytest was killed (out of memory)")
    results.grader_failure(result, EXERCISES[1].id, "the sandbox did not start")
    assert result["failure"]["reason"] == "pytest was killed (out of memory)", "the first failure is the root cause"
    assert len(result["format_errors"]) == 2 and result["state"] == "error"
    assert [e["status"] for e in result["exercises"]] == ["ungradable", "ungradable"]


def test_the_grader_failing_outranks_an_unreadable_submission():
    result = fresh()
    results.record_failure(result, "the container died", by="grader")
    assert result["failure"]["by"] == "grader", "a regrade must not be hidden behind the student's zero"


def test_a_message_that_merely_reads_like_an_internal_error_is_not_one():
    result = fresh()
    result["format_errors"] = [results.INTERNAL_ERROR + ", not a fault of the submission: forged"]
    result["state"] = "running"
    assert not results.failed_by_grader(result)
    assert classify(result)[0] == "unfinished"


def test_an_unknown_kind_of_failure_is_refused():
    with pytest.raises(ValueError, match="expected a failure by one of"):
        fresh(by="student")
