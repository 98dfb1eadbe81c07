"""gptq's generated cases catch what the hand-picked ones miss, and their messages name the real cause
(issue "Right verdicts")."""

from __future__ import annotations

import pytest

from tests.conftest import COURSE, ROOT, checks_of, grade_folder
from tests.known_wrong import write_mutant
from tests.known_wrong.gptq import MUTANTS

EXERCISE = next(e for e in COURSE.exercises if e.id == "gptq")
BY_NAME = {m.name: m for m in MUTANTS}


def failing_messages(tmp_path, name: str, check_id: str) -> tuple[dict, str]:
    folder = write_mutant(ROOT, EXERCISE, BY_NAME[name], tmp_path / name)
    check = checks_of(grade_folder(folder, ["gptq"], checks=[check_id]), "gptq")[check_id]
    text = "\n".join(t.get("message", "") for t in check["tests"] if t.get("status") != "passed")
    return check, text


@pytest.mark.parametrize("name,check_id,words,not_words", [
    # Counting calls instead of rows: every hessian message is about n and rows, none about converting x to fp32.
    ("hessian_counts_calls", "hessian", ["the number of ROWS seen", "n counts rows, not calls"],
     ["convert x to fp32"]),
    # Exact midpoints come only from the generated grids: the message names the tie and half to even.
    ("round_half_away_from_zero", "quantizer", ["generated case", "exactly a midpoint", "half to EVEN"], []),
    # Equal diag(H) entries come only from the generated act-order problems.
    ("descending_by_flipping_an_ascending_sort", "act_order", ["generated problem", "diag(H) ties", "stable sort"], []),
    # The textbook loops: the signature's message names what was counted and the computation it is.
    ("textbook_obq", "factor_once", ["linalg_inv_ex x", "textbook OBQ loop", "once"], []),
    ("textbook_obs_downdate", "factor_once", ["elements per entry of H", "OBS update", "textbook OBQ loop"], []),
    # fp16 weights: the message names the fp32 rule, against the code's own fp32 run.
    ("half_precision_block_copy", "obq_oracle", ["W.float()", "in fp32"], []),
])
def test_a_message_names_the_cause(tmp_path, name, check_id, words, not_words):
    check, text = failing_messages(tmp_path, name, check_id)
    assert check["points"] < check["max_points"], f"{name} must lose {check_id}: {check}"
    for word in words:
        assert word in text, f"expected {word!r} in {name}'s {check_id} messages: {text[:1500]}"
    for word in not_words:
        assert word.lower() not in text.lower(), f"{name}'s {check_id} messages should not blame {word!r}: {text[:1500]}"


# lazy_batch judges the whole call's memory traffic: slicing an eager update into many small operations does not
# change the sum (it beat the count of large writes this check used before), and neither does moving the
# traffic from writes to reads (a left-looking update, one column at a time).
@pytest.mark.parametrize("name,words", [
    ("eager_updates_in_column_slices", ["elements per weight of W", "however the update is cut into operations",
                                        "Busiest: copy_", "sub_"]),
    ("left_looking_per_column", ["elements per weight of W", "re-reading every earlier column's error",
                                 "Busiest: mv"]),
])
def test_the_lazy_batch_message_names_the_traffic(tmp_path, name, words):
    check, text = failing_messages(tmp_path, name, "lazy_batch")
    assert check["points"] == 0, f"{name} must lose lazy_batch: {check}"
    for word in words:
        assert word in text, f"expected {word!r} in {name}'s lazy_batch message: {text[:1500]}"


@pytest.mark.slow  # about 3 minutes: every CPU check of the exercise
def test_slicing_the_eager_update_loses_the_lazy_batch_and_nothing_else(tmp_path):
    folder = write_mutant(ROOT, EXERCISE, BY_NAME["eager_updates_in_column_slices"], tmp_path / "slices")
    checks = checks_of(grade_folder(folder, ["gptq"]), "gptq")
    lost = {c for c, check in checks.items() if check["status"] != "not_graded" and check["points"] < check["max_points"]}
    assert lost == {"lazy_batch"}, f"an eager update is correct, only not lazy: it should lose lazy_batch alone, lost {sorted(lost)}"
