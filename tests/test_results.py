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
    here = bool(result["device"]["gpu"])  # without a GPU, CUDA checks are not graded for anyone
    for ex in result["exercises"]:
        assert ex["status"] == "ungradable"
        assert all(c["message"] == "the archive is not a zip" for c in ex["checks"] if here or not c["cuda"])
        assert all(c["status"] == "not_graded" for c in ex["checks"] if c["cuda"] and not here)
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


def test_the_denominator_is_the_hosts_whatever_became_of_the_students_file():
    """A CUDA check is "not graded" on a host without a GPU for a missing, unreadable or broken file too, as it is
    for a stub whose tests ran: every student of one batch is graded out of the same points."""
    cuda_exercises = [e for e in COURSE.exercises if any(c.cuda for c in e.checks)]
    assert cuda_exercises, "the course has CUDA checks"

    def graded(make):
        result = results.new_result(COURSE, "s", "", "suite", 1, "sandbox", cuda_exercises)
        result["device"]["gpu"] = None  # a host without CUDA, whatever this one is
        make(result)
        results.finish(result)
        return result

    def missing(result):
        for ex in cuda_exercises:
            results.close_exercise(result, ex.id, f"not submitted: expected a file named {ex.file}")

    def unreadable(result):
        results.mark_ungradable(result, "s.zip: not a readable archive (BadZipFile: ...)")

    def broken(result):
        for ex in cuda_exercises:
            results.find_exercise(result, ex.id)["status"] = "ungradable"
            results.close_exercise(result, ex.id, f"{ex.file} does not compile: SyntaxError at line 3")

    tops = {name: graded(make)["gradable_max_score"] for name, make in
            (("missing", missing), ("unreadable", unreadable), ("broken", broken))}
    expected = sum(c.points for e in cuda_exercises for c in e.checks if not c.cuda)
    assert tops == {name: expected for name in tops}, (
        f"every student's denominator must leave out the CUDA checks on a host without CUDA: {tops}, expected {expected}")
    for ex in graded(missing)["exercises"]:
        cuda = {c["id"] for c in ex["checks"] if c["cuda"]}
        assert cuda and all(c["status"] == "not_graded" for c in ex["checks"] if c["id"] in cuda), ex["checks"]
