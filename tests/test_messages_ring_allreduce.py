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
