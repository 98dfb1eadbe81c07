"""A short seed sweep: the reference earns full marks whatever the run's seed draws (issue "Right
verdicts"). The full sweep, N >= 50 seeds of every exercise, is `python -m grader.bench.seeds`; its
figures are in each exercise's README."""

from __future__ import annotations

import pytest

from grader.bench.seeds import sweep
from tests.conftest import COURSE, ROOT

FAST = {"online_softmax": ["normalizer", "merge", "softmax", "stability"],
        "moe_router": ["capacity", "topk", "drops", "priority"],
        "speculative": ["formulas", "accept_rules", "greedy"]}


@pytest.mark.slow
@pytest.mark.parametrize("exercise", sorted(FAST))
def test_the_reference_loses_no_point_on_a_few_fresh_seeds(exercise):
    seeds = [101, 202]
    result = sweep(COURSE, ROOT, [exercise], seeds, jobs=1, checks=FAST[exercise], mode="local")
    lost = [f"{c} on seed {l.seed}: {l.points:g}/{l.max_points:g}: {l.message[:200]}"
            for (_, c), losses in result.losses.items() for l in losses]
    assert not lost, "the reference lost points to the draw of its inputs:\n" + "\n".join(lost)
    assert {c for c, _ in result.checks[exercise]} == set(FAST[exercise]), "every swept check was graded"
