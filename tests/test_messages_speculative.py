"""speculative's generated cases catch what the hand-picked ones miss, and their messages name the case
and the rule (issue "Right verdicts")."""

from __future__ import annotations

import pytest

from tests.conftest import COURSE, ROOT, checks_of, grade_folder
from tests.known_wrong import write_mutant
from tests.known_wrong.speculative import MUTANTS

EXERCISE = next(e for e in COURSE.exercises if e.id == "speculative")
BY_NAME = {m.name: m for m in MUTANTS}


def failing_messages(tmp_path, name: str, check_id: str) -> tuple[dict, str]:
    folder = write_mutant(ROOT, EXERCISE, BY_NAME[name], tmp_path / name)
    check = checks_of(grade_folder(folder, ["speculative"], checks=[check_id]), "speculative")[check_id]
    text = "\n".join(t.get("message", "") for t in check["tests"] if t.get("status") != "passed")
    return check, text


@pytest.mark.parametrize("name,check_id,words", [
    # Only the generated nearly-empty residual (mass 2^-24) shows it: the outcome is impossible under the rule (not
    # for every exact sampler: p > 0 there), and the message says why.
    ("residual_fallback_with_a_tolerance", "coupling",
     ["nearly empty residual", "which has probability 0", "max(0, p - q) = 0", "no tolerance"]),
    # Counted per position and drafted token against min(1, p/q), and per case against the law of accepted drafts.
    ("one_coin_per_row_for_every_position", "coupling",
     ["rows that reached it", "one fresh u per row and position", "min(1, p/q)"]),
    # Ties for the largest target probability come only from the generated lattice rows.
    ("greedy_ties_to_the_highest_id", "greedy", ["have a tie for the largest probability", "LOWEST id"]),
])
def test_a_generated_case_names_its_cause(tmp_path, name, check_id, words):
    check, text = failing_messages(tmp_path, name, check_id)
    assert check["points"] < check["max_points"], f"{name} must lose {check_id}: {check}"
    for word in words:
        assert word in text, f"expected {word!r} in {name}'s {check_id} messages: {text[:1500]}"
