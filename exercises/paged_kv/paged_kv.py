"""The paged KV cache: the exercise. Read README.md in this folder first.

Fill in BlockManager, slot_mapping, paged_attention and paged_attention_triton; each raises
NotImplementedError until you do. Run the public tests with `make check EX=paged_kv` (or
`.venv/bin/pytest exercises/paged_kv`).

Two halves:
* BlockManager is plain Python bookkeeping (no tensors): which physical blocks each sequence uses,
  who shares what, and which full blocks hold a prompt prefix that a later prompt can reuse. Every
  operation must cost O(1) amortised: never scan all blocks.
* slot_mapping and paged_attention are tensor code that reads the KV cache through block tables.
  They must be vectorised: no Python loop over sequences, blocks or tokens (the graders count the
  lines of your file that run, at two batch sizes).
"""

from __future__ import annotations

import math
from typing import Hashable, Sequence

import torch
import triton
import triton.language as tl


class OutOfBlocks(Exception):
    """A request needs more free blocks than the pool has. The manager's state is unchanged."""


def block_hash(parent: int | None, tokens: Sequence[int]) -> int:
    """The prefix-cache key of a full block: its tokens and, through `parent`, everything before it.

    `parent` is the key of the previous block of the same sequence (None for its first block), so two
    blocks with the same tokens after different prefixes get different keys. Given complete: use it.
    """
    return hash((parent, tuple(tokens)))


class BlockManager:
    """Hands out KV-cache blocks to sequences, shares them by reference count, caches full prefixes.

    The pool holds `num_blocks` physical blocks of `block_size` token slots each. Rules (README.md,
    "The contract", has the details and examples):

    * Free blocks form ONE queue. Never-used blocks come first, in id order (0, 1, 2, ...); a block
      whose ref count drops to 0 joins the back. `free` releases a sequence's blocks last block first.
      Allocation takes the front block and drops any prefix-cache entry that block held.
    * Every operation is atomic: if it raises (OutOfBlocks, KeyError, ValueError), the state (free
      count and order, tables, token counts, ref counts, cached hashes) is exactly as before the call.
    * Unknown sequence id: KeyError. Duplicate id, empty prompt, non-positive num_blocks or
      block_size: ValueError. Messages say what was expected and what was found (name the id).

    Args:
        num_blocks: blocks in the pool (> 0).
        block_size: token slots per block (> 0).
        enable_prefix_caching: reuse full blocks of earlier prompts (off: add_sequence always returns 0).
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False):
        raise NotImplementedError("BlockManager: a ref count per block, a free queue, a table per sequence")

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now: free ones, including cached-but-unreferenced ones. O(1)."""
        raise NotImplementedError("num_free_blocks: the length of the free queue")

    def add_sequence(self, seq_id: Hashable, token_ids: Sequence[int]) -> int:
        """Allocate the blocks of a new sequence's prompt.

        Returns how many prompt tokens were found in the prefix cache (0 when caching is off): whole
        full blocks only, in order from the first block, stopping at the first miss, and never the
        last prompt token, so at most ((len(token_ids) - 1) // block_size) * block_size. A hit block
        is shared (its ref count goes up; if it was free it leaves the free queue). The other blocks
        come from the front of the free queue; those of them that are full enter the prefix cache,
        unless their key is already cached: then the existing entry stays and the new block never
        enters (not even after the existing one is evicted).

        Raises:
            ValueError: seq_id already exists, or token_ids is empty.
            OutOfBlocks: the new blocks plus the free blocks taken by hits exceed num_free_blocks.
        """
        raise NotImplementedError("add_sequence: look up the chained hashes, check the pool, then allocate")

    def append_token(self, seq_id: Hashable, token_id: int) -> list[tuple[int, int]]:
        """Reserve the slot for one generated token of a sequence.

        If the last block is full, allocate a new block and return []. If the last block is partial
        and shared (ref count > 1, after `fork`), copy on write: allocate a private block, put it in
        the table in place of the shared one (whose ref count drops by 1) and return
        [(shared_block, private_block)], the copy the engine must do before writing. Otherwise [].
        With prefix caching, a block that this token makes full enters the cache.

        Raises:
            KeyError: unknown seq_id.
            OutOfBlocks: a block is needed and none is free.
        """
        raise NotImplementedError("append_token: new block if the last is full; copy on write if it is shared")

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """Make `child_id` share every block of `parent_id` (ref counts go up; nothing is copied).

        Raises:
            KeyError: unknown parent_id.
            ValueError: child_id already exists.
        """
        raise NotImplementedError("fork: copy the table, not the blocks")

    def free(self, seq_id: Hashable) -> None:
        """Drop a sequence. Release its blocks last block first; a block whose count reaches 0 joins
        the back of the free queue (with prefix caching, a full block keeps its hash until evicted).

        Raises:
            KeyError: unknown seq_id.
        """
        raise NotImplementedError("free: decrement each block's ref count, last block first")

    def block_table(self, seq_id: Hashable) -> list[int]:
        """The physical block of each logical block of the sequence (a new list). KeyError if unknown."""
        raise NotImplementedError("block_table")

    def num_tokens(self, seq_id: Hashable) -> int:
        """Prompt tokens plus appended tokens of the sequence. KeyError if unknown."""
        raise NotImplementedError("num_tokens")

    def ref_count(self, block: int) -> int:
        """How many block tables hold `block`. ValueError if block is not in range(num_blocks)."""
        raise NotImplementedError("ref_count")


def slot_mapping(block_tables: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """The physical cache slot of each logical token position.

    Args:
        block_tables: int [B, max_blocks], the physical block of each logical block, padded with -1.
        positions: int [B, T], logical token positions; -1 marks padding.
        block_size: token slots per block.

    Returns:
        int64 [B, T]: block_tables[b, p // block_size] * block_size + p % block_size, or -1 where
        positions < 0. Vectorised: no Python loop over sequences or tokens.
    """
    raise NotImplementedError("slot_mapping: gather the block of each position from its table row")


def paged_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, sm_scale: float | None = None,
) -> torch.Tensor:
    """One decode step of attention, reading K/V through the block tables (vectorised PyTorch).

    Args:
        q: [B, Hq, D], one query token per sequence (float32, float16 or bfloat16).
        k_cache, v_cache: [num_blocks, block_size, Hkv, D], q's dtype. Hq is a multiple of Hkv.
        block_tables: int32 [B, max_blocks], padded with -1.
        seq_lens: int [B], tokens in each sequence's cache; may be 0.
        sm_scale: multiplies q.k; default 1 / sqrt(D).

    Returns:
        [B, Hq, D] in q's dtype, computed in float32: softmax(q.K^T * sm_scale) V over the sequence's
        first seq_lens[b] positions; query head h reads KV head h // (Hq // Hkv). A sequence of length
        0 gives zeros. No Python loop over sequences, blocks or tokens.
    """
    raise NotImplementedError("paged_attention: gather K/V of every position, mask past seq_len, softmax")


# A Triton kernel is a function decorated with @triton.jit; write yours here. One program per
# (sequence, KV head) is a fine start: loop over the sequence in tiles of tokens, look each tile's
# blocks up in the table, and keep an online softmax (README.md, "The Triton kernel").


def paged_attention_triton(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, sm_scale: float | None = None,
) -> torch.Tensor:
    """`paged_attention` computed by a Triton kernel you write; same arguments, same result.

    The kernel walks each sequence's block table and streams its K/V blocks once, with an online
    softmax. On a machine without CUDA it runs under Triton's interpreter (TRITON_INTERPRET=1, which
    `make check` sets for you), where the tests use float32 and float16.
    """
    raise NotImplementedError("paged_attention_triton: launch your kernel on a (B, Hkv) grid")
