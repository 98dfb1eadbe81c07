"""Generated masks catch what the hand-picked ones missed, and the messages lead to the cause (issue
"Right verdicts": online_softmax and flash_attention).

Each span mutant (SPAN_MUTANTS in tests/known_wrong/online_softmax.py and flash_attention.py)
mishandles one placement of -inf against the blocks, or one causal alignment against the tiles, and
kept full marks before the generated tests (grader/blocks.py) existed. Graded on every check, each
must lose points only through generated tests, and the message must name the placement. The message
tests grade a mutant on the checks that show the message.
"""

from __future__ import annotations

import pytest

from tests.conftest import COURSE, ROOT, checks_of, grade_folder
from tests.known_wrong import Mutant, load_mutants, write_mutant
from tests.known_wrong.flash_attention import SPAN_MUTANTS as FA_SPAN_MUTANTS
from tests.known_wrong.online_softmax import SPAN_MUTANTS as OS_SPAN_MUTANTS

EXERCISES = {e.id: e for e in COURSE.exercises}
SPAN_CASES = [("online_softmax", m) for m in OS_SPAN_MUTANTS] + [("flash_attention", m) for m in FA_SPAN_MUTANTS]

# What each span mutant's messages must say: the placement it mishandles, in grader.blocks' words.
SPAN_MESSAGES = {
    "normalizer_stops_at_masked_chunk": ["Every chunk counts, the ones after a chunk of only -inf too"],
    "chunk_masked_by_first_column": ["a chunk that begins with -inf may still hold finite values",
                                     "crossing the boundary at column"],
    "triton_first_tile_unguarded": ["more than a tile for BLOCK <=", "exp(-inf - (-inf))"],
    "causal_key_loop_one_short": ["The loop over key tiles must reach the tile", "a tile's last row for a power-of-two BLOCK_M"],
    "dkdv_query_loop_one_row_late": ["The loop over query tiles of a key tile must start",
                                     "a tile's last row for a power-of-two BLOCK_M"],
}


def mutant_named(exercise_id: str, name: str) -> Mutant:
    return next(m for m in load_mutants(exercise_id) if m.name == name)


def failed_tests(result: dict, exercise_id: str) -> list[tuple[str, dict]]:
    """(check id, test) for every test that ran and did not pass."""
    return [(check["id"], test) for check in checks_of(result, exercise_id).values() for test in check["tests"]
            if test["status"] not in ("passed", "not_graded")]


@pytest.mark.slow
@pytest.mark.parametrize("exercise_id,mutant", SPAN_CASES, ids=[f"{e}-{m.name}" for e, m in SPAN_CASES])
def test_only_the_generated_tests_catch_a_span_mutant(tmp_path, exercise_id, mutant):
    folder = write_mutant(ROOT, EXERCISES[exercise_id], mutant, tmp_path / mutant.name)
    result = grade_folder(folder, [exercise_id])  # every check: no hand-picked test may catch it
    failed = failed_tests(result, exercise_id)
    hand_picked = [f"{check}/{test['name']}: {test['message'][:200]}" for check, test in failed
                   if "generated" not in test["name"]]
    assert not hand_picked, (
        f"{mutant.name} is caught by hand-picked tests too, so it no longer shows what the generated masks add; "
        "replace it with a placement they miss:\n" + "\n".join(hand_picked)
    )
    lost = {check for check, _ in failed}
    assert lost == set(mutant.loses), f"{mutant.name} should lose exactly {sorted(mutant.loses)}, lost {sorted(lost)}"
    for check_id in mutant.loses:
        check = checks_of(result, exercise_id)[check_id]
        assert check["points"] < check["max_points"], f"{mutant.name} kept {check['points']}/{check['max_points']} on {check_id}"
    messages = " | ".join(test["message"] for _, test in failed)
    for phrase in SPAN_MESSAGES[mutant.name]:
        assert phrase in messages, f"{mutant.name}: no message says {phrase!r}; the messages were: {messages[:2000]}"


def test_an_off_by_one_triton_mask_names_the_column_its_tile_and_the_mask(tmp_path):
    mutant = mutant_named("online_softmax", "triton_load_mask_off_by_one")
    folder = write_mutant(ROOT, EXERCISES["online_softmax"], mutant, tmp_path / mutant.name)
    result = grade_folder(folder, ["online_softmax"], checks=["triton_public", "triton"])
    tests = {test["name"]: test for check in checks_of(result, "online_softmax").values() for test in check["tests"]}
    public = tests["test_triton_small_rows"]["message"]
    assert public.startswith("softmax_triton [row, column]: 3 of 15 values are off"), public
    for phrase in ("first at [0, 4]", "only the last column of the row is wrong: column 4 (the last of the row, n = 5)",
                   "an off-by-one in the load or store mask (offs < n_cols - 1 drops the last column"):
        assert phrase in public, f"the public message should say {phrase!r}, found: {public}"
    assert "\n" not in public and "+  where" not in public, f"pytest's introspection dump leaked into: {public}"
    hidden = tests["test_triton_shapes[shape1]"]["message"]  # rows of 17 columns: the last one starts a tile of 16
    assert ("column 16 (the last of the row, n = 17), at a multiple of 16 (a tile's first column for a "
            "power-of-two BLOCK <= 16)") in hidden, hidden
    assert "off-by-one in the load or store mask" in hidden, hidden


def test_a_missing_rescale_names_the_chunk_where_the_max_rises(tmp_path):
    mutant = mutant_named("online_softmax", "no_rescale")
    folder = write_mutant(ROOT, EXERCISES["online_softmax"], mutant, tmp_path / mutant.name)
    result = grade_folder(folder, ["online_softmax"], checks=["normalizer_public"])
    tests = {test["name"]: test for test in checks_of(result, "online_softmax")["normalizer_public"]["tests"]}
    message = tests["test_normalizer_reads_the_chunks_once_and_skips_empty_ones"]["message"]
    assert "Tensor-likes are not close" not in message, message
    assert message.startswith("l [row] for chunks of 0, 4, 0 and 3 columns: "), message
    for phrase in ("times the expected value", "its max rises from", "at chunk 4 [4, 7)",
                   "must be multiplied by exp(", "Did you rescale the running sum when the max grew?"):
        assert phrase in message, f"the message should say {phrase!r}, found: {message}"
