"""moe_router's verdicts name the real cause, once (issue "Right verdicts").

A wrong keep/drop decision is reported as a drop decision (which token, which choice, why the oracle
keeps or drops it) by the check that owns it, and no later check charges the same cause again: the
weights are compared only once the decisions agree, topk judges the chosen experts and their weights,
the layer check builds its reference on the student's own routing decisions, and dispatch/combine run
on the oracle's routing."""

from __future__ import annotations

import pytest

from tests.conftest import COURSE, ROOT, checks_of, grade_folder
from tests.known_wrong import write_mutant
from tests.known_wrong.moe_router import MUTANTS

EXERCISE = next(e for e in COURSE.exercises if e.id == "moe_router")
BY_NAME = {m.name: m for m in MUTANTS}


def grade_mutant(tmp_path, name: str, checks: list[str]) -> dict[str, dict]:
    folder = write_mutant(ROOT, EXERCISE, BY_NAME[name], tmp_path / name)
    return checks_of(grade_folder(folder, ["moe_router"], checks=checks), "moe_router")


def messages(check: dict) -> str:
    return "\n".join(t.get("message", "") for t in check["tests"] if t.get("status") != "passed")


@pytest.mark.parametrize("name,cause", [
    ("capacity_edge_one_short", "an off-by-one at the capacity edge"),
    ("token_major_priority", "token-by-token order"),
])
def test_a_wrong_drop_decision_is_charged_once_as_a_drop(tmp_path, name, cause):
    checks = grade_mutant(tmp_path, name, ["drops", "topk", "dispatch_combine", "layer"])
    drops = checks["drops"]
    assert drops["points"] < drops["max_points"], f"{name} must lose drops: {drops}"
    text = messages(drops)
    assert "the oracle keeps it in slot" in text and "yours drops it" in text, text[:1500]
    assert cause in text, f"the drop message should say what usually causes it ({cause!r}): {text[:1500]}"
    assert "combine_weight" not in text, f"a wrong drop must not be reported as a weight error: {text[:1500]}"
    for other in ("topk", "dispatch_combine", "layer"):
        check = checks[other]
        assert check["points"] == check["max_points"], (
            f"{name}'s only bug is a drop decision, charged by drops; {other} charged it again: "
            f"{check['points']}/{check['max_points']}: {messages(check)[:800]}"
        )


def test_a_tie_in_priority_names_the_tie(tmp_path):
    checks = grade_mutant(tmp_path, "probs_ties_to_later_tokens", ["priority"])
    text = messages(checks["priority"])
    assert checks["priority"]["points"] < checks["priority"]["max_points"], checks["priority"]
    assert "the same probability" in text and "the earlier token wins" in text, text[:1500]


def test_an_error_on_a_generated_case_names_the_case(tmp_path):
    checks = grade_mutant(tmp_path, "combine_fails_at_capacity_zero", ["dispatch_combine"])
    text = messages(checks["dispatch_combine"])
    assert "IndexError" in text and "generated routing" in text and "capacity 0" in text, text[:1500]
