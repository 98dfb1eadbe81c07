"""grader.support.pipeline_1f1b's compact travel for the clock: a schedule's digest is the same whatever
form its ops take, and the canonical form (lists of tuples of str and int) is hashed without normalising
each op in Python, which cost three times the generator it was timed beside."""

from __future__ import annotations

import numpy as np
import pytest

from grader.hidden.pipeline_1f1b.oracle import expected_1f1b, expected_interleaved
from grader.support import pipeline_1f1b as support


def normalised_digest(schedule) -> str:
    import hashlib

    rows = [[tuple(x if isinstance(x, str) else int(x) for x in op) for op in row] for row in schedule]
    return hashlib.sha256(repr(rows).encode()).hexdigest()


class Id(int):
    """An int subclass with a repr of its own: hashed as a plain int, never through its repr."""

    def __repr__(self) -> str:
        return "Id(%d)" % int(self)


@pytest.mark.parametrize("schedule", [expected_1f1b(4, 6), expected_interleaved(2, 4, 2)], ids=["1f1b", "interleaved"])
def test_every_form_of_the_same_ops_has_the_same_digest(schedule):
    assert support._canonical(schedule), "the oracle's schedules are canonical: the fast path must take them"
    want = normalised_digest(schedule)
    forms = {
        "canonical": schedule,
        "ops as lists": [[list(op) for op in row] for row in schedule],
        "rows as tuples": [tuple(row) for row in schedule],
        "numpy ids": [[(op[0], *map(np.int64, op[1:])) for op in row] for row in schedule],
        "int subclass ids": [[(op[0], *map(Id, op[1:])) for op in row] for row in schedule],
    }
    for name, form in forms.items():
        assert support.digest(form) == want, f"{name}: digest differs from the normalised one"
    assert not any(support._canonical(f) for n, f in forms.items() if n != "canonical")


def test_a_different_schedule_has_a_different_digest():
    a, b = expected_1f1b(4, 6), expected_1f1b(4, 6)
    b[1][2], b[1][3] = b[1][3], b[1][2]
    assert support.digest(a) != support.digest(b)
