"""paged_kv's speed cases: the fp16 decode batch paged_attention_triton is timed on, and the bytes it must move.

The hidden speed check (triton_speed) scores `DECODE` (`DECODE_TINY` in a CPU rehearsal, grader/rehearsal.py);
the benchmark (python -m grader.bench.paged_kv, on CUDA) runs `DECODE` too. Each draws its own sequence lengths
and block tables with `layout(generator)`; the figure is GB/s: `bytes(lengths)` over the mean time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

DTYPE = torch.float16  # q, the K/V caches and the output


class Layout(NamedTuple):
    """A batch's sequence lengths and block tables: every block used once, in a random order."""

    lengths: torch.Tensor  # [batch], int64
    need: list[int]  # blocks per sequence
    tables: torch.Tensor  # [batch, max(need)] int32, padded with -1

    @property
    def num_blocks(self) -> int:
        return sum(self.need)


@dataclass(frozen=True)
class DecodeCase:
    """One decode step of `batch` sequences: one query token each, its K/V in a paged cache."""

    name: str
    batch: int
    q_heads: int
    kv_heads: int
    head_dim: int
    block_size: int
    min_len: int  # sequence lengths are drawn uniformly in [min_len, max_len]
    max_len: int

    @property
    def q_shape(self) -> tuple[int, int, int]:
        return (self.batch, self.q_heads, self.head_dim)

    def cache_shape(self, num_blocks: int) -> tuple[int, int, int, int]:
        return (num_blocks, self.block_size, self.kv_heads, self.head_dim)

    def layout(self, generator: torch.Generator) -> Layout:
        """Random lengths, then a random permutation of the blocks they need, dealt out to the tables in order."""
        lengths = torch.randint(self.min_len, self.max_len + 1, (self.batch,), generator=generator)
        need = [math.ceil(int(n) / self.block_size) for n in lengths]
        perm = torch.randperm(sum(need), generator=generator)
        tables = torch.full((self.batch, max(need)), -1, dtype=torch.int32)
        at = 0
        for b, k in enumerate(need):
            tables[b, :k] = perm[at : at + k].to(torch.int32)
            at += k
        return Layout(lengths, need, tables)

    def bytes(self, lengths: torch.Tensor) -> int:
        """K and V of every cached token read once, plus q in and the output out (fp16)."""
        kv_bytes = int(lengths.sum()) * self.kv_heads * self.head_dim * 2 * DTYPE.itemsize
        return kv_bytes + 2 * self.batch * self.q_heads * self.head_dim * DTYPE.itemsize


DECODE = DecodeCase("decode", batch=64, q_heads=32, kv_heads=8, head_dim=128, block_size=16, min_len=512, max_len=4096)
DECODE_TINY = DecodeCase(
    "decode_tiny", batch=2, q_heads=4, kv_heads=2, head_dim=128, block_size=16, min_len=16, max_len=64
)
