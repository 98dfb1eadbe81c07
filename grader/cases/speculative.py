"""speculative's speed cases: the shape `accept_speed` times speculative_accept on (grader/hidden/speculative/)
and the benchmark (python -m grader.bench.speculative) runs on CUDA, a CPU-sized one for the benchmark's CPU
table, and the bytes the figure counts. The figure is GB/s: `bytes()` over the mean time, as a fraction of
the device's copy bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

FP32_BYTES = 4  # the probabilities are fp32


@dataclass(frozen=True)
class AcceptCase:
    """speculative_accept(draft_tokens [batch, gamma], draft_probs [batch, gamma, vocab],
    target_probs [batch, gamma + 1, vocab], generator), fp32 probabilities."""

    name: str
    batch: int
    gamma: int
    vocab: int
    tiny: tuple[int, int] | None = None  # (batch, vocab) in a CPU rehearsal of the speed check (grader/rehearsal.py)

    def tiny_case(self) -> AcceptCase:
        """This case at its rehearsal shape."""
        if self.tiny is None:
            raise ValueError(f"{self.name} has no rehearsal shape")
        return replace(self, batch=self.tiny[0], vocab=self.tiny[1], tiny=None)

    def bytes(self) -> int:
        """Both probability tensors, read once: batch * (gamma + gamma + 1) * vocab fp32 values."""
        return FP32_BYTES * self.batch * (2 * self.gamma + 1) * self.vocab


ACCEPT = AcceptCase("accept", batch=64, gamma=4, vocab=128_256, tiny=(4, 1000))  # Llama 3's vocabulary
ACCEPT_CPU = AcceptCase("accept_cpu", batch=64, gamma=4, vocab=8192)  # the benchmark's CPU table: V scaled down
