"""pipeline_1f1b's generated cases fail known-wrong submissions with a message that names the first divergence
and its usual cause (issue "Right verdicts"). Each grade below runs only the checks it reads."""

from __future__ import annotations

import pytest

from tests.conftest import COURSE, ROOT, checks_of, grade_folder
from tests.known_wrong import Mutant, write_mutant
from tests.known_wrong.pipeline_1f1b import MUTANTS

EXERCISE = next(e for e in COURSE.exercises if e.id == "pipeline_1f1b")
BY_NAME = {m.name: m for m in MUTANTS}


def combined(*names: str) -> Mutant:
    """Several known-wrong edits in one file (each in a function of its own), to grade them in one run."""
    parts = [BY_NAME[n] for n in names]
    return Mutant("+".join(names), "; ".join(m.why for m in parts), [e for m in parts for e in m.edits],
                  sorted({c for m in parts for c in m.loses}))


def message_of(result: dict, check: str, test: str) -> str:
    tests = checks_of(result, "pipeline_1f1b")[check]["tests"]
    found = [t for t in tests if t["name"].split("[")[0] == test]
    assert found, f"{test} did not run under {check}: {[t['name'] for t in tests]}"
    assert found[0]["status"] == "failed", f"{test} should fail, found {found[0]['status']}: {found[0]['message']}"
    return found[0]["message"]


# (mutants graded together, [(check, test, what its message must say)])
CASES = [
    (("count_based_validation", "1b1f_deadlocks", "interleaved_backwards_same_chunk_order", "gpipe_backwards_lifo"), [
        ("simulate", "test_simulate_against_an_event_by_event_oracle", ["one op for another", "never runs",
                                                                       "exactly once"]),
        ("one_f_one_b", "test_1f1b_generated_sizes_op_by_op", ["forwards before its first backward", "warm-up"]),
        ("interleaved", "test_interleaved_generated_sizes_op_by_op", ["reverse order of its forwards"]),
        ("gpipe", "test_gpipe_generated_sizes_op_by_op", ["oldest first"]),
    ]),
    (("names_one_stuck_op",), [
        ("simulate", "test_simulate_against_an_event_by_event_oracle", ["deadlocks", "does not name"]),
    ]),
    (("p2p_between_chunks",), [
        ("simulate", "test_simulate_against_an_event_by_event_oracle", ["first divergence at time", "p2p_time",
                                                                       "this same stage"]),
    ]),
    (("chunk_cost_not_split",), [
        ("simulate", "test_simulate_against_an_event_by_event_oracle", ["first divergence at time", "1/v"]),
    ]),
]


@pytest.mark.parametrize("names,expected", CASES, ids=["+".join(n) for n, _ in CASES])
def test_generated_cases_name_the_first_divergence_and_its_cause(tmp_path, names, expected):
    mutant = combined(*names)
    folder = write_mutant(ROOT, EXERCISE, mutant, tmp_path / "submission")
    result = grade_folder(folder, ["pipeline_1f1b"], checks=sorted({check for check, _, _ in expected}))
    for check, test, phrases in expected:
        message = message_of(result, check, test)
        for phrase in phrases:
            assert phrase in message, f"{mutant.name}: {test}'s message should say {phrase!r}, found: {message}"
