"""ring_allreduce's generated cases fail known-wrong submissions with a message that names the first divergence
(rank, position, chunk; and the step of the first message that left the ring) and its usual cause (issue
"Right verdicts"). Each grade below runs only the check it reads."""

from __future__ import annotations

import pytest

from tests.conftest import COURSE, ROOT, checks_of, grade_folder
from tests.known_wrong import write_mutant
from tests.known_wrong.ring_allreduce import MUTANTS

EXERCISE = next(e for e in COURSE.exercises if e.id == "ring_allreduce")
BY_NAME = {m.name: m for m in MUTANTS}

# (mutant, check, generated test, what its message must say)
CASES = [
    ("step_sign", "allreduce", "test_generated_allreduce_exact",
     ["rank ", "position ", "(chunk ", "Decoded: ", "The first message that left the ring: reduce-scatter step",
      "copy of chunk", "sends chunk (r - s) % N"]),
    ("all_gather_adds", "all_gather", "test_generated_all_gather", ["position ", "overwrites"]),
    ("float32_accumulator", "float_order", "test_generated_ring_order",
     ["reduce-scatter step 0", "own dtype"]),
    ("no_copy_back", "reduce_scatter", "test_generated_reduce_scatter_ownership",
     ["owned chunk", "own input, unchanged", "copy back"]),
]


@pytest.mark.parametrize("name,check,test,phrases", CASES, ids=[c[0] for c in CASES])
def test_generated_cases_name_the_first_divergence_and_its_cause(tmp_path, name, check, test, phrases):
    folder = write_mutant(ROOT, EXERCISE, BY_NAME[name], tmp_path / name)
    result = grade_folder(folder, ["ring_allreduce"], checks=[check])
    tests = [t for t in checks_of(result, "ring_allreduce")[check]["tests"] if t["name"] == test]
    assert tests, f"{test} did not run under {check}"
    assert tests[0]["status"] == "failed", f"{name}: {test} should fail, found {tests[0]['status']}: {tests[0]['message']}"
    for phrase in phrases:
        assert phrase in tests[0]["message"], f"{name}: {test}'s message should say {phrase!r}, found: {tests[0]['message']}"


# --------------------------------------------------------------------------------------------------
# A side channel: the sums travel outside comm.send_recv (a file in /tmp, shared by the simulated ranks'
# threads and by the real ranks' processes alike) while the ring carries zeros of the right sizes. The counts,
# the sizes and every result are right; before the messages were checked it earned 100 of 100.

from tests.known_wrong.ring_allreduce import _SIDE_CHANNEL_LOSES  # noqa: E402


@pytest.mark.slow  # about 2 minutes: every check of the exercise, real processes included
def test_a_side_channel_loses_every_check_whose_messages_it_fakes_and_nothing_else(tmp_path):
    folder = write_mutant(ROOT, EXERCISE, BY_NAME["side_channel_files"], tmp_path / "side_channel_files")
    checks = checks_of(grade_folder(folder, ["ring_allreduce"]), "ring_allreduce")
    lost = {c for c, check in checks.items() if check["points"] < check["max_points"]}
    assert lost == set(_SIDE_CHANNEL_LOSES), (
        f"the side channel should lose exactly {sorted(_SIDE_CHANNEL_LOSES)} (its ring_allreduce fakes the messages; "
        f"its reduce-scatter and all-gather are honest), found {sorted(lost)}"
    )
    for check_id in _SIDE_CHANNEL_LOSES:
        failed = [t for t in checks[check_id]["tests"] if t["status"] == "failed"]
        assert failed, f"{check_id}: no failed test"
        text = failed[0]["message"]
        assert "messages are not the ring's" in text or "the ring sends" in text, f"{check_id}: {text}"
    volume = [t["message"] for t in checks["volume"]["tests"] if t["status"] == "failed"]
    assert any("all zeros" in m and "placeholder" in m for m in volume), volume[:2]
    real = [t["message"] for t in checks["distributed"]["tests"] if t["status"] == "failed"]
    assert real and all("gloo processes" in m and "zeros" in m for m in real), real[:2]


def test_a_module_global_side_channel_fails_the_volume_check_by_its_messages(tmp_path):
    """The simulated ranks are threads of one process: a module-level dict carries the data as well as a file."""
    folder = write_mutant(ROOT, EXERCISE, BY_NAME["side_channel_module_global"], tmp_path / "global")
    check = checks_of(grade_folder(folder, ["ring_allreduce"], checks=["volume"]), "ring_allreduce")["volume"]
    outcomes = {t["name"]: t for t in check["tests"]}
    for name, t in outcomes.items():
        if name.startswith("test_allreduce_volume"):  # ring_allreduce cheats: every one of its runs fails
            assert t["status"] == "failed", f"{name}: {t['status']}"
            assert "messages are not the ring's" in t["message"] and "placeholder" in t["message"], t["message"]
        else:  # its reduce-scatter and all-gather are the reference's
            assert t["status"] == "passed", f"{name}: {t['status']}: {t.get('message')}"
    assert any(n.startswith("test_allreduce_volume") for n in outcomes) and len(outcomes) > 5, sorted(outcomes)
