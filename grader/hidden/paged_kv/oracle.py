"""Naive oracles for the paged KV cache's hidden checks, written for the tests and never taken from the solution.

- `Model`: the BlockManager contract the slow obvious way. The free queue is a plain list (new blocks
  come from its front, released blocks go to its back), reference counts a list, and the prefix cache
  a dict keyed by the whole token prefix up to a block's end (what a chained block hash stands for),
  searched with linear scans. `Model.apply` runs one operation and returns its result or the name of
  the exception it raised; `Model.state` is everything observable about the live sequences.
- `naive_slot` / `naive_slots`: slot_mapping as a per-token loop over lists, table[p // block_size] *
  block_size + p % block_size, and -1 for a padding position (p < 0).
- `attention_oracle`: paged decode attention in float64, one sequence and one query head at a time,
  walking the block table token by token; query head h reads KV head h // (Hq // Hkv), and an empty
  sequence gives zeros.
"""

from __future__ import annotations

import math

import torch


class ModelOutOfBlocks(Exception):
    pass


class Model:
    """The contract, naively: a list for the free queue, scans everywhere, exact prefixes as keys."""

    def __init__(self, num_blocks: int, block_size: int, caching: bool):
        self.num_blocks, self.bs, self.caching = num_blocks, block_size, caching
        self.queue = list(range(num_blocks))
        self.refs = [0] * num_blocks
        self.cache: dict[tuple, int] = {}  # the whole token prefix up to a block's end -> that block
        self.tables: dict = {}
        self.tokens: dict = {}

    def _take_front(self) -> int:
        block = self.queue.pop(0)
        for key in [k for k, b in self.cache.items() if b == block]:
            del self.cache[key]
        self.refs[block] = 1
        return block

    def _enter(self, prefix: tuple, block: int) -> None:
        if self.caching and prefix not in self.cache:
            self.cache[prefix] = block

    def add(self, seq, tokens: list[int]) -> int:
        if seq in self.tables or not tokens:
            raise ValueError
        bs = self.bs
        hits = []
        if self.caching:
            for i in range((len(tokens) - 1) // bs):
                key = tuple(tokens[: (i + 1) * bs])
                if key not in self.cache:
                    break
                hits.append(self.cache[key])
        blocks = math.ceil(len(tokens) / bs)
        if blocks - len(hits) + sum(self.refs[b] == 0 for b in hits) > len(self.queue):
            raise ModelOutOfBlocks
        for b in hits:
            if self.refs[b] == 0:
                self.queue.remove(b)
            self.refs[b] += 1
        table = hits + [self._take_front() for _ in range(blocks - len(hits))]
        for i in range(len(hits), len(tokens) // bs):
            self._enter(tuple(tokens[: (i + 1) * bs]), table[i])
        self.tables[seq], self.tokens[seq] = table, list(tokens)
        return len(hits) * bs

    def append(self, seq, token: int) -> list:
        table, tokens = self.tables[seq], self.tokens[seq]
        copies = []
        if len(tokens) % self.bs == 0:
            if not self.queue:
                raise ModelOutOfBlocks
            table.append(self._take_front())
        elif self.refs[table[-1]] > 1:
            if not self.queue:
                raise ModelOutOfBlocks
            new = self._take_front()
            self.refs[table[-1]] -= 1
            copies = [[table[-1], new]]
            table[-1] = new
        tokens.append(token)
        if len(tokens) % self.bs == 0:
            self._enter(tuple(tokens), table[-1])
        return copies

    def fork(self, parent, child) -> None:
        table = self.tables[parent]
        if child in self.tables:
            raise ValueError
        for b in table:
            self.refs[b] += 1
        self.tables[child], self.tokens[child] = list(table), list(self.tokens[parent])

    def free(self, seq) -> None:
        table = self.tables.pop(seq)
        del self.tokens[seq]
        for b in reversed(table):
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.queue.append(b)

    def apply(self, op: str, args: tuple) -> dict:
        try:
            return {"result": getattr(self, op)(*args)}
        except ModelOutOfBlocks:
            return {"raised": "OutOfBlocks"}
        except KeyError:
            return {"raised": "KeyError"}
        except ValueError:
            return {"raised": "ValueError"}

    def state(self, live: list) -> dict:
        return {
            "free": len(self.queue),
            "tables": [list(self.tables[s]) for s in live],
            "tokens": [len(self.tokens[s]) for s in live],
            "refs": list(self.refs),
        }


def naive_slot(table: list[int], p: int, block_size: int) -> int:
    """The cache slot of position p of a sequence with block table `table`; -1 for padding (p < 0)."""
    return -1 if p < 0 else table[p // block_size] * block_size + p % block_size


def naive_slots(tables: list[list[int]], positions: list[list[int]], block_size: int) -> list[list[int]]:
    """slot_mapping as a loop over every sequence and position (lists in, lists out)."""
    return [[naive_slot(tables[b], p, block_size) for p in row] for b, row in enumerate(positions)]


def attention_oracle(
    q, k_cache, v_cache, tables: list, lengths: list, sm_scale: float | None, kv_of=None
) -> torch.Tensor:
    """float64, one sequence and one head at a time, walking the table token by token. `kv_of(h, Hq, Hkv)`, if
    given, replaces the contract's KV head of query head h (h // (Hq // Hkv)): the tests use it to recognise a
    known mistake's output, never as the expected answer."""
    B, Hq, D = q.shape
    block_size, Hkv = k_cache.shape[1], k_cache.shape[2]
    scale = 1 / math.sqrt(D) if sm_scale is None else sm_scale
    out = torch.zeros(B, Hq, D, dtype=torch.float64)
    for b in range(B):
        slots = [(tables[b][p // block_size], p % block_size) for p in range(lengths[b])]
        if not slots:
            continue
        blocks = torch.tensor([s[0] for s in slots])
        offsets = torch.tensor([s[1] for s in slots])
        for h in range(Hq):
            kv = h // (Hq // Hkv) if kv_of is None else kv_of(h, Hq, Hkv)
            keys = k_cache[blocks, offsets, kv].double()  # [len, D]
            values = v_cache[blocks, offsets, kv].double()
            weights = torch.softmax(keys @ q[b, h].double() * scale, dim=0)
            out[b, h] = weights @ values
    return out
