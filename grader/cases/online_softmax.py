"""online_softmax's speed cases: the fp16 shapes softmax_triton is timed on, and the bytes a softmax must move.

The hidden speed check (triton_speed) scores `GRADED`; the benchmark (python -m grader.bench.online_softmax)
runs `BENCHED`, the graded shapes and one more. The figure is GB/s: `bytes()` over the mean time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

DTYPE = torch.float16  # the timed input's dtype


@dataclass(frozen=True)
class SoftmaxCase:
    """A softmax over the last dimension of a `rows` x `cols` fp16 input."""

    name: str
    rows: int
    cols: int
    tiny: tuple[int, int] | None = None  # (rows, cols) in a CPU rehearsal of the speed check (grader/rehearsal.py)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    def tiny_case(self) -> SoftmaxCase:
        """This case at its rehearsal shape."""
        if self.tiny is None:
            raise ValueError(f"{self.name} has no rehearsal shape")
        return replace(self, rows=self.tiny[0], cols=self.tiny[1], tiny=None)

    def bytes(self) -> int:
        """Read x once, write y once: the least any softmax moves."""
        return 2 * self.rows * self.cols * DTYPE.itemsize


MANY_ROWS = SoftmaxCase("many_rows", 4096, 8192, tiny=(16, 256))
LONG_ROWS = SoftmaxCase("long_rows", 64, 1 << 18, tiny=(4, 4096))
SHORT_ROWS = SoftmaxCase("short_rows", 16384, 1024)

GRADED = (MANY_ROWS, LONG_ROWS)
BENCHED = (*GRADED, SHORT_ROWS)
