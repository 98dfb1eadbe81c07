"""paged_kv's failure messages lead to the real cause (issue "Right verdicts"): each known-wrong submission
here is graded for real, and the message a student would read is checked, not only the lost points."""

from __future__ import annotations

import re

import pytest

from tests.conftest import COURSE, ROOT, checks_of, grade_folder
from tests.known_wrong import load_mutants, write_mutant

EXERCISE = COURSE.exercise("paged_kv")
MUTANTS = {m.name: m for m in load_mutants("paged_kv")}


def messages(tmp_path, mutant: str, checks: list[str], mode: str = "sandbox") -> dict[str, list[str]]:
    """Grade one known-wrong submission on `checks`; return each check's failed-test messages."""
    folder = write_mutant(ROOT, EXERCISE, MUTANTS[mutant], tmp_path / mutant)
    result = grade_folder(folder, ["paged_kv"], checks=checks, mode=mode)
    graded = checks_of(result, "paged_kv")
    return {cid: [t["message"] or "" for t in graded[cid]["tests"] if t["status"] != "passed"] for cid in checks}


@pytest.mark.parametrize("mode", ["sandbox", "local"])
def test_a_cache_written_in_place_is_named_by_the_harness_not_blamed_on_the_gather(tmp_path, mode):
    found = messages(tmp_path, "attention_scales_the_cache_in_place", ["attention_public", "attention"], mode)
    for check, texts in found.items():
        assert texts, f"{check}: the submission that scales k_cache in place passed every test"
        for text in texts:
            assert "paged_attention changed its argument k_cache in place" in text, f"{check}: {text[:400]}"
            assert "gather" not in text, f"{check}: the message still blames the gather: {text[:400]}"


def test_a_kept_duplicate_is_explained(tmp_path):
    texts = messages(tmp_path, "cache_keeps_duplicates", ["prefix_cache"])["prefix_cache"]
    hand_picked = [t for t in texts if t.startswith("x+y was cached in block 1")]
    assert hand_picked and "never entered the cache" in hand_picked[0] and "found 8 and [0, 2, 1]" in hand_picked[0], texts


STEP = re.compile(r"^step (\d+) of (\d+) \((\d+) blocks of (\d+), prefix caching (on|off)\): (\w+)\(.*\): (.*)\. "
                  r"Usual cause: (.*)\. The steps before it: ", re.S)


def generated(texts: list[str]) -> list[re.Match]:
    """The first-divergence reports of the generated-traffic tests, parsed (step, sizes, call, what, cause)."""
    found = [STEP.match(t) for t in texts if t.startswith("step ")]
    assert found and all(found), f"expected first-divergence reports from the generated tests, found {texts}"
    return found


def test_a_missing_copy_on_write_is_reported_at_its_first_step(tmp_path):
    for report in generated(messages(tmp_path, "no_copy_on_write", ["cow"])["cow"]):
        call, what, cause = report.group(6), report.group(7), report.group(8)
        assert call == "append_token", report.group(0)
        if what.startswith("the model raises OutOfBlocks"):  # the copy needed a block and none was free
            assert what == "the model raises OutOfBlocks, your manager returned []", what
            assert "a block to copy the shared last block" in cause, cause
        else:
            assert re.match(r"the model returns the copies \[\[\d+, \d+\]\], your manager returned \[\]$", what), what
            assert "is partial and shared (ref count" in cause and "copy on write" in cause, cause


def test_an_evicted_prefix_that_still_hits_is_traced_to_the_eviction(tmp_path):
    for report in generated(messages(tmp_path, "eviction_keeps_the_hash", ["prefix_cache"])["prefix_cache"]):
        assert report.group(6) == "add_sequence", report.group(0)
        assert re.search(r"cached prompt token|raises OutOfBlocks", report.group(7)), report.group(7)
        assert re.search(r"(?i)allocating a block (from the queue )?must delete the cache entry it held", report.group(8)), (
            report.group(8)
        )


def test_an_atomicity_slip_names_the_state_that_changed(tmp_path):
    for report in generated(messages(tmp_path, "copy_on_write_drops_the_reference_first", ["cow"])["cow"]):
        assert report.group(6) == "append_token", report.group(0)
        assert "(the call raised, so nothing may change)" in report.group(7), report.group(7)
        assert "check first" in report.group(8), report.group(8)
