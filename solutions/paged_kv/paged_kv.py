"""The paged KV cache: the reference solution.

A decode server that reserves one contiguous slab of KV cache per request, sized for the longest
output it might produce, wastes most of its memory on slots that are never written. PagedAttention
(Kwon et al., SOSP 2023) stores the cache in fixed-size blocks instead, like pages of virtual memory:
each sequence owns a *block table* mapping its logical blocks to physical ones, a block is allocated
only when the previous one is full, and blocks are shared between sequences by reference count
(parallel sampling, beam search, a common prompt prefix), copied only when a sharer writes.

Three parts:
* `BlockManager`: the allocator (pure Python bookkeeping, O(1) amortised per operation);
* `slot_mapping`: where each new token's K/V goes in the physical cache (vectorised);
* `paged_attention` / `paged_attention_triton`: one decode step of attention that reads K/V through
  the block tables (a vectorised gather, then a Triton kernel that streams the blocks).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Hashable, Sequence

import torch
import triton
import triton.language as tl


class OutOfBlocks(Exception):
    """A request needs more free blocks than the pool has. The manager's state is unchanged."""


def block_hash(parent: int | None, tokens: Sequence[int]) -> int:
    """The prefix-cache key of a full block: its tokens and, through `parent`, everything before it."""
    return hash((parent, tuple(tokens)))


@dataclass
class _Sequence:
    table: list[int]  # physical block of each logical block
    tokens: list[int]  # every token id so far (prompt + generated)
    last_hash: int | None = None  # chained hash of the last full block (the parent of the next one)


class BlockManager:
    """Hands out KV-cache blocks to sequences; shares them by reference count; caches full prefixes.

    Free blocks wait in one queue (an insertion-ordered dict, so taking a cached block out of the
    middle is O(1) too): never-used blocks first, in id order, then blocks in the order they were
    released. Allocation takes from the front.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False):
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int, found {value!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._refs = [0] * num_blocks  # block -> how many block tables hold it
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # the free queue
        self._cached: dict[int, int] = {}  # prefix hash -> the block holding that prefix
        self._hash_of: list[int | None] = [None] * num_blocks  # block -> the hash it owns in _cached
        self._seqs: dict[Hashable, _Sequence] = {}

    # -- queries --------------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def block_table(self, seq_id: Hashable) -> list[int]:
        return list(self._seq(seq_id).table)

    def num_tokens(self, seq_id: Hashable) -> int:
        return len(self._seq(seq_id).tokens)

    def ref_count(self, block: int) -> int:
        if not 0 <= block < self.num_blocks:
            raise ValueError(f"block must be in range({self.num_blocks}), found {block!r}")
        return self._refs[block]

    # -- operations -----------------------------------------------------------------------------

    def add_sequence(self, seq_id: Hashable, token_ids: Sequence[int]) -> int:
        """Allocate blocks for a prompt; returns how many prompt tokens the prefix cache already held."""
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id!r} already exists; expected a new id")
        tokens = [int(t) for t in token_ids]
        if not tokens:
            raise ValueError(f"sequence {seq_id!r}: expected a prompt of at least 1 token, found 0")
        bs = self.block_size

        # Chained hashes of the full blocks, then the longest run of them already cached. A hit never
        # includes the last prompt token: the engine must still run it to get the next token's logits.
        hashes: list[int] = []
        hits: list[int] = []
        if self.enable_prefix_caching:
            parent = None
            for start in range(0, len(tokens) - bs + 1, bs):
                parent = block_hash(parent, tokens[start : start + bs])
                hashes.append(parent)
            for h in hashes[: (len(tokens) - 1) // bs]:
                if h not in self._cached:
                    break
                hits.append(self._cached[h])

        # Check everything before changing anything: a hit on a free (cached, unreferenced) block
        # takes it out of the free pool too.
        num_new = -(-len(tokens) // bs) - len(hits)
        needed = num_new + sum(1 for b in hits if self._refs[b] == 0)
        if needed > len(self._free):
            raise OutOfBlocks(f"add_sequence({seq_id!r}) needs {needed} free blocks, found {len(self._free)}")

        for b in hits:
            if self._refs[b] == 0:
                del self._free[b]
            self._refs[b] += 1
        table = hits + [self._allocate() for _ in range(num_new)]
        for i in range(len(hits), len(hashes)):  # the prompt's new full blocks enter the cache
            self._register(hashes[i], table[i])
        self._seqs[seq_id] = _Sequence(table, tokens, hashes[-1] if hashes else None)
        return len(hits) * bs

    def append_token(self, seq_id: Hashable, token_id: int) -> list[tuple[int, int]]:
        """Reserve the slot of one generated token. Returns the copies [(src, dst)] to do first."""
        seq = self._seq(seq_id)
        bs = self.block_size
        copies: list[tuple[int, int]] = []
        if len(seq.tokens) % bs == 0:  # the last block is full: start a new one
            if not self._free:
                raise OutOfBlocks(f"append_token({seq_id!r}) needs a new block, found none free")
            seq.table.append(self._allocate())
        else:
            last = seq.table[-1]
            if self._refs[last] > 1:  # shared and partial: copy on write
                if not self._free:
                    raise OutOfBlocks(f"append_token({seq_id!r}) needs a block to copy its shared last block into, found none free")
                private = self._allocate()
                self._refs[last] -= 1
                seq.table[-1] = private
                copies.append((last, private))
        seq.tokens.append(int(token_id))
        if self.enable_prefix_caching and len(seq.tokens) % bs == 0:  # the block just became full
            seq.last_hash = block_hash(seq.last_hash, seq.tokens[-bs:])
            self._register(seq.last_hash, seq.table[-1])
        return copies

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """The child shares every block of the parent: reference counts go up, nothing is copied."""
        parent = self._seq(parent_id)
        if child_id in self._seqs:
            raise ValueError(f"sequence {child_id!r} already exists; expected a new id for the child")
        for b in parent.table:
            self._refs[b] += 1
        self._seqs[child_id] = _Sequence(list(parent.table), list(parent.tokens), parent.last_hash)

    def free(self, seq_id: Hashable) -> None:
        """Drop a sequence. Its blocks are released last block first, so its prefix is evicted last."""
        seq = self._seq(seq_id)
        del self._seqs[seq_id]
        for b in reversed(seq.table):
            self._refs[b] -= 1
            if self._refs[b] == 0:
                self._free[b] = None  # to the back of the queue; a cached hash stays for reuse

    # -- internals ------------------------------------------------------------------------------

    def _seq(self, seq_id: Hashable) -> _Sequence:
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise KeyError(f"no sequence {seq_id!r}: expected an id given to add_sequence or fork and not yet freed") from None

    def _allocate(self) -> int:
        """Take the block at the front of the free queue; it forgets any prefix it held."""
        block, _ = self._free.popitem(last=False)
        h = self._hash_of[block]
        if h is not None:
            del self._cached[h]
            self._hash_of[block] = None
        self._refs[block] = 1
        return block

    def _register(self, h: int, block: int) -> None:
        """Enter a newly full block into the prefix cache, unless another block already holds h."""
        if h not in self._cached:
            self._cached[h] = block
            self._hash_of[block] = h


# --------------------------------------------------------------------------------------------------
# Slot mapping and paged attention


def slot_mapping(block_tables: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Physical cache slot (block * block_size + offset) of each logical position; -1 for padding."""
    pos = positions.long()
    valid = pos >= 0
    pos = pos.clamp(min=0)
    blocks = torch.gather(block_tables.long(), 1, pos // block_size)
    slots = blocks * block_size + pos % block_size
    return torch.where(valid, slots, torch.full_like(slots, -1))


def _check_shapes(q, k_cache, v_cache, block_tables, seq_lens) -> tuple[int, int, int, int, int]:
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            "expected q [B, Hq, D] and k_cache, v_cache [num_blocks, block_size, Hkv, D] of one shape, "
            f"found q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}"
        )
    B, Hq, D = q.shape
    _, block_size, Hkv, Dk = k_cache.shape
    if Dk != D or Hq % Hkv != 0:
        raise ValueError(f"expected head dims to match and Hq a multiple of Hkv, found D={D}, {Dk}; Hq={Hq}, Hkv={Hkv}")
    if block_tables.shape[0] != B or seq_lens.shape != (B,):
        raise ValueError(f"expected block_tables [{B}, max_blocks] and seq_lens [{B}], found "
                         f"{tuple(block_tables.shape)} and {tuple(seq_lens.shape)}")
    return B, Hq, D, block_size, Hkv


def paged_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, sm_scale: float | None = None,
) -> torch.Tensor:
    """One decode step: each sequence's single query attends to its cached keys through its block table."""
    B, Hq, D, block_size, Hkv = _check_shapes(q, k_cache, v_cache, block_tables, seq_lens)
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    group = Hq // Hkv

    # Gather every logical position of every sequence through its table: [B, L] slots.
    L = block_tables.shape[1] * block_size
    pos = torch.arange(L, device=q.device)
    blocks = block_tables.long()[:, pos // block_size]
    valid = pos[None, :] < seq_lens.to(q.device)[:, None]  # [B, L]
    slots = torch.where(valid, blocks * block_size + pos % block_size, torch.zeros_like(blocks))
    k = k_cache.reshape(-1, Hkv, D)[slots].float()  # [B, L, Hkv, D]
    v = v_cache.reshape(-1, Hkv, D)[slots].float()

    # Query head h reads KV head h // group: view the query heads as [Hkv, group].
    qg = q.float().reshape(B, Hkv, group, D)
    scores = torch.einsum("bkgd,blkd->bkgl", qg, k) * scale
    mask = valid[:, None, None, :]
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    probs = torch.where(mask, probs, torch.zeros_like(probs))  # an empty sequence: NaN row -> zeros
    out = torch.einsum("bkgl,blkd->bkgd", probs, v)
    return out.reshape(B, Hq, D).to(q.dtype)


@triton.jit
def _paged_attention_kernel(
    q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, out_ptr, sm_scale,
    stride_qb, stride_qh, stride_qd,
    stride_kn, stride_ks, stride_kh, stride_kd,
    stride_vn, stride_vs, stride_vh, stride_vd,
    stride_tb, stride_ob, stride_oh, stride_od,
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,  # GROUP rounded up to a power of 2 (>= 16 for tl.dot)
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    TILE: tl.constexpr,  # tokens per loop step
    PRECISION: tl.constexpr,  # "ieee" for float32 (exact), the default "tf32" otherwise (unused by fp16/bf16)
):
    # One program per (sequence, KV head): it serves all GROUP query heads that read this KV head, so
    # each K/V byte is read once (grouped-query attention's saving, kept in the kernel).
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq_len = tl.load(lens_ptr + b)

    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, DIM_PAD)
    t = tl.arange(0, TILE)
    g_ok = g < GROUP
    d_ok = d < HEAD_DIM
    heads = kv_head * GROUP + g
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :] * stride_qd,
                mask=g_ok[:, None] & d_ok[None, :], other=0.0)
    q = (q.to(tl.float32) * sm_scale).to(k_ptr.dtype.element_ty)

    # Online softmax state per query head.
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)

    table = tables_ptr + b.to(tl.int64) * stride_tb
    for start in range(0, seq_len, TILE):
        # Walk the block table: logical position -> (physical block, offset in the block).
        pos = start + t
        ok = pos < seq_len
        block = tl.load(table + pos // BLOCK_SIZE, mask=ok, other=0).to(tl.int64)
        offset = pos % BLOCK_SIZE
        kv_ok = ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + block[:, None] * stride_kn + offset[:, None] * stride_ks + kv_head * stride_kh
                    + d[None, :] * stride_kd, mask=kv_ok, other=0.0)
        v = tl.load(v_ptr + block[:, None] * stride_vn + offset[:, None] * stride_vs + kv_head * stride_vh
                    + d[None, :] * stride_vd, mask=kv_ok, other=0.0)

        # Scores for this tile, then the online-softmax update (every tile has >= 1 valid token).
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # [GROUP_PAD, TILE]
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new

    out = acc / tl.where(l > 0, l, 1.0)[:, None]  # an empty sequence has l = 0, acc = 0: zeros
    tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :] * stride_od,
             out.to(out_ptr.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])


def paged_attention_triton(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, sm_scale: float | None = None,
) -> torch.Tensor:
    """`paged_attention` with a Triton kernel that streams each sequence's blocks (online softmax)."""
    B, Hq, D, block_size, Hkv = _check_shapes(q, k_cache, v_cache, block_tables, seq_lens)
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    group = Hq // Hkv
    out = torch.empty_like(q)
    if B == 0:
        return out
    _paged_attention_kernel[(B, Hkv)](
        q, k_cache, v_cache, block_tables, seq_lens.to(q.device), out, float(scale),
        *q.stride(), *k_cache.stride(), *v_cache.stride(), block_tables.stride(0), *out.stride(),
        BLOCK_SIZE=block_size, GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=D, DIM_PAD=max(16, triton.next_power_of_2(D)), TILE=64,
        PRECISION="ieee" if k_cache.dtype == torch.float32 else "tf32", num_warps=4,
    )
    return out
