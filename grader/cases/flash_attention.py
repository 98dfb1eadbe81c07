"""flash_attention's speed cases: the bf16 shapes the forward and backward passes are timed on, their FLOPs,
and how SDPA's backward is timed.

The hidden speed checks (forward_speed, backward_speed) score `FORWARD` and `BACKWARD`, each at its
`tiny()` shape in a CPU rehearsal (grader/rehearsal.py); the benchmark (python -m grader.bench.flash_attention)
runs the same cases. The graded figure is the submission's time against scaled_dot_product_attention's on the
same inputs; TFLOP/s are `flops()` over the mean time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from grader import speed

DTYPE = torch.bfloat16  # q, k, v, o, dO (lse is float32)
BATCH, HEADS, SEQ_LEN = 4, 16, 4096
TINY = (1, 4, 64)  # batch, heads, sequence length in a CPU rehearsal


@dataclass(frozen=True)
class AttentionCase:
    """Self-attention of `heads` heads (no grouping) over `seq_len` queries and keys, head dim `head_dim`."""

    name: str
    batch: int
    heads: int
    seq_len: int
    head_dim: int
    causal: bool
    backward: bool = False  # timed: flash_attention_backward (else flash_attention_forward)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.heads, self.seq_len, self.head_dim)

    @property
    def id(self) -> str:
        """The speed test's parameter id: '64-full', '128-causal' (forward); 'full', 'causal' (backward)."""
        mask = "causal" if self.causal else "full"
        return mask if self.backward else f"{self.head_dim}-{mask}"

    def tiny(self) -> AttentionCase:
        """This case at the rehearsal's shape."""
        batch, heads, seq_len = TINY
        return replace(self, batch=batch, heads=heads, seq_len=seq_len)

    def forward_flops(self) -> float:
        """4 * B * H * Nq * Nk * D for the two matmuls of the forward pass, halved when causal."""
        return 4 * self.batch * self.heads * self.seq_len * self.seq_len * self.head_dim * (0.5 if self.causal else 1.0)

    def flops(self) -> float:
        """The timed pass's FLOPs: the forward's, or 2.5 times that for the backward (five matmuls to two)."""
        return 2.5 * self.forward_flops() if self.backward else self.forward_flops()

    def inputs(self, dtype: torch.dtype = DTYPE) -> list:
        """The timed call's input recipes (grader.speed.Randn): q, k, v for the forward; q, k, v, o, lse, dO for
        the backward, with lse about 4 above the scores so that P = exp(s - lse) stays in (0, 1]."""
        if not self.backward:
            return [speed.Randn(self.shape, dtype)] * 3
        return [speed.Randn(self.shape, dtype)] * 4 + [
            speed.Randn(self.shape[:3], torch.float32, shift=4.0),
            speed.Randn(self.shape, dtype),
        ]


FORWARD = tuple(
    AttentionCase(f"forward_d{d}_{'causal' if c else 'full'}", BATCH, HEADS, SEQ_LEN, d, c)
    for d in (64, 128)
    for c in (False, True)
)
BACKWARD = tuple(
    AttentionCase(f"backward_d128_{'causal' if c else 'full'}", BATCH, HEADS, SEQ_LEN, 128, c, backward=True)
    for c in (False, True)
)


def sdpa_backward_s(case: AttentionCase, dtype: torch.dtype = DTYPE, reps: int = 100) -> float:
    """SDPA's backward alone, in seconds: the mean of its forward + backward minus the mean of its forward, each
    timed with grader.speed.time_here on fresh q, k, v, dO of the case's shape."""

    def sdpa_step(q, k, v, do):
        q, k, v = (x.requires_grad_(True) for x in (q, k, v))
        F.scaled_dot_product_attention(q, k, v, is_causal=case.causal).backward(do)

    def sdpa_forward(q, k, v, do):
        F.scaled_dot_product_attention(q, k, v, is_causal=case.causal)

    qkvdo = [speed.Randn(case.shape, dtype)] * 4
    return speed.time_here(sdpa_step, qkvdo, reps=reps).mean_s - speed.time_here(sdpa_forward, qkvdo, reps=reps).mean_s
