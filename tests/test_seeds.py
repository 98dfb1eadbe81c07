"""A short seed sweep: the reference earns full marks whatever the run's seed draws (issue "Right
verdicts"). Every exercise in course.yaml is swept on one seed other than the one tests/test_scoring.py grades
the reference with, over its every hidden check that this host grades, in-process (the draws are the
same as in the sandbox). The full sweep, N >= 50 seeds, is `python -m grader.bench.seeds`; its figures are in
each exercise's README."""

from __future__ import annotations

import pytest
import torch

from grader.bench.seeds import sweep
from tests.conftest import COURSE, ROOT

SEED = 101  # tests/test_scoring.py grades the reference on 20261129 (tests/conftest.py grade_folder)


def swept_checks(exercise) -> list[str]:
    """The hidden checks this host grades: the ones whose inputs come from the grade's seed."""
    return [c.id for c in exercise.checks if c.visibility != "public" and (torch.cuda.is_available() or not c.cuda)]


@pytest.mark.slow
@pytest.mark.parametrize("exercise", [pytest.param(e, id=e.id, marks=pytest.mark.xdist_group(f"seeds-{e.id}"))
                                      for e in COURSE.exercises])
def test_the_reference_loses_no_point_on_a_fresh_seed(exercise):
    checks = swept_checks(exercise)
    result = sweep(COURSE, ROOT, [exercise.id], [SEED], jobs=1, checks=checks, mode="local")
    lost = [f"{c} on seed {l.seed}: {l.points:g}/{l.max_points:g}: {l.message[:200]}"
            for (_, c), losses in result.losses.items() for l in losses]
    assert not lost, f"the reference of {exercise.id} lost points to the draw of its inputs:\n" + "\n".join(lost)
    assert {c for c, _ in result.checks[exercise.id]} == set(checks), "every swept check was graded"
