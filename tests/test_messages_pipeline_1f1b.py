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
    # the clock's probes of the same ops over 2 stages and over many (work per op done by C, which no line shows)
    (("next_stage_by_index", "interleaved_filters_in_c"), [
        # on a loaded machine the growth probe (about 128 against 8192 ops) may fire before the same-ops probe:
        # either names the cause, a cost per op that grows with the number of stages (a tuple: any one phrase)
        ("simulate_linear", "test_simulate_is_linear_in_the_number_of_ops", [
            ("the same 8192 ops over 4096 stages", "more work per op when there are more stages"),
            ("park a stage", "wake a stage only when the op it waits for finishes")]),
        ("simulate_linear", "test_simulate_is_linear_for_interleaved_schedules", [
            ("over 4096 stages", "more work per op when there are more stages")]),
        ("interleaved", "test_interleaved_work_is_linear", [("the same 65536 ops over 128 stages",
                                                             "more work per op when there are more stages"),
                                                            ("work per op that grows with the stages",
                                                             "Build each stage's list from the formulas")]),
    ]),
    (("chunk_cost_not_split",), [
        ("simulate", "test_simulate_against_an_event_by_event_oracle", ["first divergence at time", "1/v"]),
    ]),
    # the signature (issue 36): the census says which hold it saw, and what to change
    (("textbook",), [
        ("run_pipeline_memory", "test_run_pipeline_holds_what_the_schedule_holds", [
            "a forward of the whole batch counts m", "the schedule needs only", "one microbatch per forward"]),
    ]),
    (("keeps_outputs_after_backward",), [
        ("run_pipeline_memory", "test_run_pipeline_holds_what_the_schedule_holds", [
            "released each graph at its backward", "stayed alive", "drop every reference"]),
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
            either = phrase if isinstance(phrase, tuple) else (phrase,)  # a tuple: any one of its phrases
            assert any(p in message for p in either), (
                f"{mutant.name}: {test}'s message should say {' or '.join(map(repr, either))}, found: {message}")


RAISES_ON_EVERYTHING = '''
from typing import NamedTuple


class SimResult(NamedTuple):
    makespan: float
    bubble_fraction: float
    peak_activations: list
    timeline: list


def _refuse(*args, **kwargs):
    raise ValueError(f"refused {args!r}")  # repr of the schedule names any "stuck op" a test looks for


gpipe_schedule = one_f_one_b_schedule = interleaved_schedule = simulate = run_pipeline = _refuse


def stage_of_chunk(chunk, num_stages):
    return chunk % num_stages
'''


def test_a_file_that_raises_on_everything_earns_no_rejection_points(tmp_path):
    """Every "rejects bad sizes" and "names the stuck op" test passed for a file that only raises (a red
    team scored 29 of 100 so): a rejection counts only where the same function accepts a valid input."""
    folder = tmp_path / "refuser"
    folder.mkdir()
    (folder / "pipeline_1f1b.py").write_text(RAISES_ON_EVERYTHING)
    checks = ["schedules_public", "simulate_public", "run_pipeline_public", "gpipe", "one_f_one_b", "interleaved",
              "simulate", "run_pipeline"]
    result = grade_folder(folder, ["pipeline_1f1b"], checks=checks)
    earned = {c: v["points"] for c, v in checks_of(result, "pipeline_1f1b").items() if c in checks and v["points"]}
    assert earned == {}, f"a file that raises on every call earned {earned}"
