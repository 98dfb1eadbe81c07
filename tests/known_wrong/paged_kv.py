"""Known-wrong submissions for paged_kv: the bugs students really make, as edits of the reference."""

from tests.known_wrong import Mutant

SLOT_LOOP = '''    out = torch.full(positions.shape, -1, dtype=torch.int64)
    for b in range(positions.shape[0]):
        for t in range(positions.shape[1]):
            p = int(positions[b, t])
            if p >= 0:
                out[b, t] = int(block_tables[b, p // block_size]) * block_size + p % block_size
    return out
'''

ATTENTION_LOOP = '''    out = torch.zeros(B, Hq, D, dtype=torch.float32)
    for b in range(B):
        n = int(seq_lens[b])
        if n == 0:
            continue
        pos = torch.arange(n)
        slots = block_tables[b].long()[pos // block_size] * block_size + pos % block_size
        k = k_cache.reshape(-1, Hkv, D)[slots].float().repeat_interleave(group, dim=1)  # [n, Hq, D]
        v = v_cache.reshape(-1, Hkv, D)[slots].float().repeat_interleave(group, dim=1)
        probs = torch.softmax(torch.einsum("hd,nhd->hn", q[b].float(), k) * scale, dim=-1)
        out[b] = torch.einsum("hn,nhd->hd", probs, v)
    return out.to(q.dtype)
'''

MUTANTS = [
    Mutant(
        "slot_offset_is_the_position",
        "I added the whole logical position to the block's base instead of the offset inside the block",
        [("slots = blocks * block_size + pos % block_size", "slots = blocks * block_size + pos")],
        cause=r"whole position",
        loses=["slots", "slots_public"],
    ),
    Mutant(
        "slot_padding_not_masked",
        "I forgot that padding positions (-1) must map to slot -1",
        [("return torch.where(valid, slots, torch.full_like(slots, -1))", "return slots")],
        cause=r"padding positions",
        loses=["slots", "slots_public"],
    ),
    Mutant(
        "slot_mapping_loops_over_tokens",
        "my slot_mapping walks every (sequence, token) pair in Python",
        [('''    pos = positions.long()
    valid = pos >= 0
    pos = pos.clamp(min=0)
    blocks = torch.gather(block_tables.long(), 1, pos // block_size)
    slots = blocks * block_size + pos % block_size
    return torch.where(valid, slots, torch.full_like(slots, -1))
''', SLOT_LOOP)],
        cause=r"loop over (sequences or )?tokens",
        loses=["slots_vectorised", "slots_public"],
    ),
    Mutant(
        "slot_mapping_maps_over_sequences",
        "my slot_mapping gathers each sequence's slots on its own, with map() over the rows, so no line runs per row",
        [("    blocks = torch.gather(block_tables.long(), 1, pos // block_size)\n",
          "    blocks = torch.stack(list(map(torch.take, block_tables.long().unbind(0), (pos // block_size).unbind(0))))\n")],
        cause=r"once per element",
        loses=["slots_vectorised", "slots_public"],
    ),
    Mutant(
        "hashes_not_chained",
        "my block hash covers only the block's own tokens, not the prefix before it",
        [
            ("parent = block_hash(parent, tokens[start : start + bs])", "parent = block_hash(None, tokens[start : start + bs])"),
            ("seq.last_hash = block_hash(seq.last_hash, seq.tokens[-bs:])", "seq.last_hash = block_hash(None, seq.tokens[-bs:])"),
        ],
        cause=r"parent block's hash",
        loses=["prefix_cache", "prefix_public"],
    ),
    Mutant(
        "hit_covers_the_last_prompt_token",
        "I reuse every cached full block of the prompt, even the one holding its last token",
        [("for h in hashes[: (len(tokens) - 1) // bs]:", "for h in hashes:")],
        cause=r"last prompt token",
        loses=["prefix_cache", "prefix_public"],
    ),
    Mutant(
        "free_does_not_decrement",
        "free puts a block back when only this sequence held it, but never lowers any ref count",
        [('''            self._refs[b] -= 1
            if self._refs[b] == 0:
                self._free[b] = None''', '''            if self._refs[b] == 1:
                self._free[b] = None''')],
        cause=r"decrement",
        loses=["invariants", "prefix_cache", "oom_atomic"],
    ),
    Mutant(
        "free_releases_the_first_block_first",
        "free releases a sequence's blocks in table order, so its prefix is evicted first",
        [("for b in reversed(seq.table):", "for b in seq.table:")],
        cause=r"last block first",
        loses=["invariants", "manager_public", "prefix_cache"],
    ),
    Mutant(
        "no_copy_on_write",
        "a forked child writes straight into the block it shares with its parent",
        [("if self._refs[last] > 1:  # shared and partial: copy on write", "if False:")],
        cause=r"needs copy on write|copy on write must",
        loses=["cow", "invariants", "manager_public", "oom_atomic"],
    ),
    Mutant(
        "copy_on_write_when_not_shared",
        "I copy the last block on every write into a partial block, shared or not",
        [("if self._refs[last] > 1:  # shared and partial: copy on write", "if self._refs[last] >= 1:")],
        cause=r"no copy (to do|was due)",
        loses=["cow", "invariants", "manager_public", "oom_atomic"],
    ),
    Mutant(
        "allocates_until_it_runs_out",
        "add_sequence allocates block by block and raises when the pool runs dry, leaving the first blocks taken",
        [
            ('''        if needed > len(self._free):
            raise OutOfBlocks(f"add_sequence({seq_id!r}) needs {needed} free blocks, found {len(self._free)}")
''', ""),
            ("        block, _ = self._free.popitem(last=False)\n",
             "        if not self._free:\n            raise OutOfBlocks(\"no free block\")\n        block, _ = self._free.popitem(last=False)\n"),
        ],
        cause=r"as (it was|they were)",
        loses=["oom_atomic", "invariants", "manager_public"],
    ),
    Mutant(
        "hits_on_free_blocks_not_counted",
        "my capacity check counts only the new blocks, not the cached free blocks a hit takes from the pool",
        [("needed = num_new + sum(1 for b in hits if self._refs[b] == 0)", "needed = num_new")],
        cause=r"hits on free blocks",
        loses=["oom_atomic"],
    ),
    Mutant(
        "eviction_keeps_the_hash",
        "a cached block that is reallocated keeps its entry in the prefix cache",
        [("        if h is not None:\n            del self._cached[h]", "        if False:\n            del self._cached[h]")],
        cause=r"drop its cached hash",
        loses=["prefix_cache"],
    ),
    Mutant(
        "cache_overwrites_the_entry",
        "when a newly full block's hash is already cached, I point the cache at the new block",
        [("        if h not in self._cached:\n            self._cached[h] = block",
          "        if True:\n            self._cached[h] = block")],
        cause=r"keeps the existing entry",
        loses=["prefix_cache"],
    ),
    Mutant(
        "cache_keeps_duplicates",
        "like vLLM, I keep every block of a hash in the cache and a lookup returns the first one; when that one "
        "is evicted the duplicate still answers",
        [
            ("self._cached: dict[int, int] = {}  # prefix hash -> the block holding that prefix",
             "self._cached: dict[int, dict[int, None]] = {}  # prefix hash -> every block holding it, oldest first"),
            ("                hits.append(self._cached[h])", "                hits.append(next(iter(self._cached[h])))"),
            ("        if h is not None:\n            del self._cached[h]\n",
             "        if h is not None:\n            del self._cached[h][block]\n"
             "            if not self._cached[h]:\n                del self._cached[h]\n"),
            ("        if h not in self._cached:\n            self._cached[h] = block\n            self._hash_of[block] = h",
             "        self._cached.setdefault(h, {})[block] = None\n        self._hash_of[block] = h"),
        ],
        cause=r"do not record the new block",
        loses=["prefix_cache"],
    ),
    Mutant(
        "fork_restarts_the_hash_chain",
        "a forked child starts its own hash chain: the first block it fills is keyed as if nothing came before it",
        [("self._seqs[child_id] = _Sequence(list(parent.table), list(parent.tokens), parent.last_hash)",
          "self._seqs[child_id] = _Sequence(list(parent.table), list(parent.tokens))")],
        cause=r"inherits its parent's last key",
        loses=["prefix_cache"],
    ),
    Mutant(
        "fork_shares_the_token_list",
        "the child gets its own table but the parent's list of tokens, so one's appends count for the other too",
        [("self._seqs[child_id] = _Sequence(list(parent.table), list(parent.tokens), parent.last_hash)",
          "self._seqs[child_id] = _Sequence(list(parent.table), parent.tokens, parent.last_hash)")],
        cause=r"share one list of tokens",
        loses=["cow"],
    ),
    Mutant(
        "free_queue_is_a_list",
        "my free queue is a Python list: pop(0) and remove() move every element behind it",
        [
            ("self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))", "self._free = list(range(num_blocks))"),
            ("                del self._free[b]", "                self._free.remove(b)"),
            ("                self._free[b] = None  # to the back", "                self._free.append(b)  # to the back"),
            ("        block, _ = self._free.popitem(last=False)", "        block = self._free.pop(0)"),
        ],
        cause=r"list\.pop\(0\)",
        loses=["manager_speed"],
    ),
    Mutant(
        "num_free_blocks_scans_the_pool",
        "num_free_blocks counts the blocks with ref count 0, one by one",
        [("        return len(self._free)\n", "        return sum(1 for r in self._refs if r == 0)\n")],
        cause=r"scans the pool",
        loses=["manager_speed", "manager_public"],
    ),
    Mutant(
        "gqa_heads_interleaved",
        "I mapped query head h to KV head h % Hkv instead of h // (Hq // Hkv)",
        [("qg = q.float().reshape(B, Hkv, group, D)", "qg = q.float().reshape(B, group, Hkv, D).transpose(1, 2)"),
         ("return out.reshape(B, Hq, D).to(q.dtype)", "return out.transpose(1, 2).reshape(B, Hq, D).to(q.dtype)")],
        cause=r"h % Hkv",
        loses=["attention", "attention_public"],
    ),
    Mutant(
        "empty_sequence_gives_nan",
        "softmax over a fully masked row is NaN, and I let it through",
        [("    probs = torch.where(mask, probs, torch.zeros_like(probs))  # an empty sequence: NaN row -> zeros\n", "")],
        cause=r"length 0|an empty sequence",
        loses=["attention", "attention_public"],
    ),
    Mutant(
        "attention_scales_the_cache_in_place",
        "to save a multiply per score I fold sm_scale into the keys once, with k_cache.mul_(scale); the answer "
        "is right, but the caller's cache is not the one it passed in any more",
        [("    k = k_cache.reshape(-1, Hkv, D)[slots].float()  # [B, L, Hkv, D]\n",
          "    k_cache.mul_(scale)  # fold the scale into the keys once\n"
          "    k = k_cache.reshape(-1, Hkv, D)[slots].float()  # [B, L, Hkv, D]\n"),
         ('scores = torch.einsum("bkgd,blkd->bkgl", qg, k) * scale', 'scores = torch.einsum("bkgd,blkd->bkgl", qg, k)')],
        cause=r"in place",
        loses=["attention", "attention_public"],
    ),
    Mutant(
        "attention_loops_over_sequences",
        "my paged_attention handles one sequence at a time in a Python loop",
        [('''    # Gather every logical position of every sequence through its table: [B, L] slots.
''', ATTENTION_LOOP + '''    # Gather every logical position of every sequence through its table: [B, L] slots.
''')],
        cause=r"loop over sequences",
        loses=["attention_vectorised", "attention_public"],
    ),
    Mutant(
        "attention_loops_over_tokens",
        "my paged_attention gathers K and V one position at a time (all sequences at once, but a loop over tokens)",
        [('''    k = k_cache.reshape(-1, Hkv, D)[slots].float()  # [B, L, Hkv, D]
    v = v_cache.reshape(-1, Hkv, D)[slots].float()
''', '''    k = torch.empty(B, L, Hkv, D)
    v = torch.empty(B, L, Hkv, D)
    for p in range(L):
        k[:, p] = k_cache.reshape(-1, Hkv, D)[slots[:, p]].float()
        v[:, p] = v_cache.reshape(-1, Hkv, D)[slots[:, p]].float()
''')],
        cause=r"blocks or tokens",
        loses=["attention_vectorised", "attention_public"],
    ),
    Mutant(
        "copy_on_write_drops_the_reference_first",
        "on copy-on-write I drop the reference to the shared block before checking that a free block exists",
        [
            ("                if not self._free:\n                    raise OutOfBlocks(f\"append_token({seq_id!r}) needs a block to copy",
             "                self._refs[last] -= 1\n                if not self._free:\n                    raise OutOfBlocks(f\"append_token({seq_id!r}) needs a block to copy"),
            ("                private = self._allocate()\n                self._refs[last] -= 1\n",
             "                private = self._allocate()\n"),
        ],
        cause=r"before dropping the reference",
        loses=["oom_atomic"],
    ),
    Mutant(
        "triton_delegates_to_pytorch",
        "paged_attention_triton just calls my PyTorch paged_attention; I never wrote the kernel",
        [("    out = torch.empty_like(q)\n    if B == 0:\n        return out\n",
          "    return paged_attention(q, k_cache, v_cache, block_tables, seq_lens, sm_scale)\n")],
        cause=r"in Triton kernels",
        loses=["triton", "triton_public"],
    ),
    Mutant(
        "triton_ignores_sm_scale",
        "my kernel always scales by 1/sqrt(D), whatever sm_scale says",
        [("    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale\n    group = Hq // Hkv\n    out = torch.empty_like(q)",
          "    scale = 1.0 / math.sqrt(D)\n    group = Hq // Hkv\n    out = torch.empty_like(q)")],
        cause=r"sm_scale=\S+ was not used",
        loses=["triton"],
    ),
    Mutant(
        "triton_no_rescale",
        "my kernel adds each tile's p @ V without rescaling the running accumulator when the max grows",
        [("acc = acc * alpha[:, None] + tl.dot(", "acc = acc + tl.dot(")],
        cause=r"rescaled by exp\(m_old - m_new\)",
        loses=["triton"],
    ),
    Mutant(
        "triton_divides_by_zero",
        "my kernel divides by l even for an empty sequence",
        [("out = acc / tl.where(l > 0, l, 1.0)[:, None]", "out = acc / l[:, None]")],
        cause=r"length 0|an empty sequence",
        loses=["triton", "triton_public"],
    ),
    # No kernel doing the work (issue "Trust III"): both passed the `triton` check's "real launch" test.
    Mutant(
        "triton_noop_launch_torch_gather",
        "I launch my kernel with every length 0, so it only writes zeros, then fill the output with my PyTorch "
        "paged_attention: a real launch, but the gather through the tables happens in torch",
        [("        q, k_cache, v_cache, block_tables, seq_lens.to(q.device), out, float(scale),",
          "        q, k_cache, v_cache, block_tables, torch.zeros_like(seq_lens).to(q.device), out, float(scale),"),
         ("        PRECISION=\"ieee\" if k_cache.dtype == torch.float32 else \"tf32\", num_warps=4,\n    )\n    return out",
          "        PRECISION=\"ieee\" if k_cache.dtype == torch.float32 else \"tf32\", num_warps=4,\n    )\n"
          "    out.copy_(paged_attention(q, k_cache, v_cache, block_tables, seq_lens, sm_scale))\n    return out")],
        cause=r"in Triton kernels",
        loses=["triton", "triton_public"],
    ),
    Mutant(
        "triton_in_numpy",
        "paged_attention_triton reads the cache and the tables back with .numpy() and walks them in numpy",
        [("    out = torch.empty_like(q)\n    if B == 0:\n        return out\n", """    import numpy as np

    qq = q.detach().cpu().numpy().astype(np.float64)
    kc = k_cache.detach().cpu().numpy().astype(np.float64)
    vc = v_cache.detach().cpu().numpy().astype(np.float64)
    tables_np, lens = block_tables.cpu().numpy(), seq_lens.cpu().numpy()
    res = np.zeros(qq.shape)
    for b in range(B):
        n = int(lens[b])
        if n == 0:
            continue
        pos = np.arange(n)
        blocks = tables_np[b, pos // block_size]
        keys, values = kc[blocks, pos % block_size], vc[blocks, pos % block_size]  # [n, Hkv, D]
        for h in range(Hq):
            s = keys[:, h // group] @ qq[b, h] * scale
            w = np.exp(s - s.max())
            res[b, h] = (w / w.sum()) @ values[:, h // group]
    return torch.from_numpy(res).to(q.dtype)
""")],
        cause=r"numpy\(\)",
        loses=["triton", "triton_public"],
    ),
]

# The textbook computations (issue 36): the same numbers, the technique skipped. The manager's technique is the
# sharing its tables show (forks and prefix hits hold the same blocks, a copy only for a shared partial block), so
# its textbook versions lose the checks that compare the exact tables with the model's; the kernel's is the tile it
# holds and the loop over the table, which only the kernel resource model sees on the CPU.
MUTANTS += [
    Mutant(
        "textbook_fork_copies_every_block",
        "the textbook manager never shares: fork gives the child a private copy of every block of the parent "
        "(the same numbers once the engine copies the KV), so memory is spent on each sample of a prompt",
        [("""        for b in parent.table:
            self._refs[b] += 1
        self._seqs[child_id] = _Sequence(list(parent.table), list(parent.tokens), parent.last_hash)
""", """        if len(parent.table) > len(self._free):
            raise OutOfBlocks(f"fork({parent_id!r}, {child_id!r}) needs {len(parent.table)} free blocks")
        table = [self._allocate() for _ in parent.table]  # a private copy of every block: nothing shared
        self._seqs[child_id] = _Sequence(table, list(parent.tokens), parent.last_hash)
""")],
        cause=r"shares (the parent's|every) block",
        loses=["cow", "invariants", "manager_public"],
        keeps=["errors", "slots", "attention", "triton", "prefix_public"],
    ),
    Mutant(
        "textbook_prefix_hits_copy_the_blocks",
        "the textbook prefix cache reports the hit but gives the new prompt fresh blocks (the cached KV copied "
        "into them) instead of sharing the cached blocks",
        [("        needed = num_new + sum(1 for b in hits if self._refs[b] == 0)\n",
          "        needed = num_new + len(hits)\n"),
         ("""        for b in hits:
            if self._refs[b] == 0:
                del self._free[b]
            self._refs[b] += 1
        table = hits + [self._allocate() for _ in range(num_new)]
""", """        table = [self._allocate() for _ in range(num_new + len(hits))]  # hits copied, not shared
""")],
        cause=r"cached blocks",
        loses=["prefix_cache", "prefix_public"],
        keeps=["errors", "slots", "attention", "triton", "manager_public"],
    ),
    Mutant(
        "one_tile_kernel",
        "the textbook kernel: TILE = next_power_of_2(max_blocks * block_size), so a program holds its sequence's "
        "whole key range in one tile and the loop over the table runs once; right under the interpreter, where a "
        "tile may be any width, but on a GPU a tile of 8,192 keys cannot live in a program's registers",
        [("TILE=64,", "TILE=max(16, triton.next_power_of_2(block_tables.shape[1] * block_size)),")],
        cause=r"registers",
        loses=["tiled_kernel"],
        keeps=["triton", "triton_public"],
    ),
]

# Contract clauses that issue 36 brought into the tests: one mutant each.
MUTANTS += [
    Mutant(
        "sizes_not_type_checked",
        "my constructor only checks that the sizes are positive, so BlockManager(8.0, 4) is accepted and "
        "BlockManager(8, '4') raises TypeError",
        [("            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:\n",
          "            if value <= 0:\n")],
        cause=r"not a positive int",
        loses=["errors"],
        keeps=["invariants", "manager_public"],
    ),
    Mutant(
        "messages_do_not_name_the_id",
        "my ValueErrors for a fork onto a live id and for an empty prompt say what is wrong but not which id",
        [('raise ValueError(f"sequence {child_id!r} already exists; expected a new id for the child")',
          'raise ValueError("the child already exists; expected a new id for the child")'),
         ('raise ValueError(f"sequence {seq_id!r}: expected a prompt of at least 1 token, found 0")',
          'raise ValueError("expected a prompt of at least 1 token, found 0")')],
        cause=r"does not name the id",
        loses=["errors"],
        keeps=["invariants", "manager_public"],
    ),
    Mutant(
        "block_table_returns_the_internal_list",
        "block_table hands out the manager's own list, so a caller that changes it changes the manager",
        [("        return list(self._seq(seq_id).table)\n", "        return self._seq(seq_id).table\n")],
        cause=r"return a new list",
        loses=["invariants"],
        keeps=["manager_public", "cow", "prefix_cache", "errors"],
    ),
    Mutant(
        "triton_reads_lengths_as_int32",
        "to give my kernel 4-byte lengths without a copy, I view seq_lens as int32: right for int32 lengths, "
        "garbage for int64 ones, which the contract allows",
        [("        q, k_cache, v_cache, block_tables, seq_lens.to(q.device), out, float(scale),",
          "        q, k_cache, v_cache, block_tables, seq_lens.to(q.device).view(torch.int32), out, float(scale),")],
        cause=r"own dtype",
        loses=["triton", "triton_public"],
        keeps=["tiled_kernel"],
    ),
    Mutant(
        "slot_mapping_reads_tables_as_int32",
        "slot_mapping views the block tables as int32 (what the engine usually passes): int64 tables, which the "
        "contract allows, come out as the halves of each entry",
        [("    blocks = torch.gather(block_tables.long(), 1, pos // block_size)\n",
          "    blocks = torch.gather(block_tables.view(torch.int32).long(), 1, pos // block_size)\n")],
        cause=r"own dtype",
        loses=["slots"],
        keeps=["slots_public", "slots_vectorised"],
    ),
]

# A mistake that only a GPU can see (see tests/known_wrong/online_softmax.py): `grader gpu-check` proves it.
MUTANTS += [
    Mutant(
        "triton_tiles_of_16_tokens_one_warp",
        "my kernel walks a sequence 16 tokens at a time with one warp, to keep its registers small",
        [("TILE=64,", "TILE=16,"), ('PRECISION="ieee" if k_cache.dtype == torch.float32 else "tf32", num_warps=4,',
                                    'PRECISION="ieee" if k_cache.dtype == torch.float32 else "tf32", num_warps=1,')],
        cause=r"copy bandwidth",
        loses=["triton_speed"],
    ),
    Mutant(
        name="sm_scale_zero_is_the_default",
        why="`sm_scale or 1 / sqrt(D)`: a scale of 0 (uniform weights) silently becomes the default",
        edits=[('"""One decode step: each sequence\'s single query attends to its cached keys through its block table."""\n'
                "    B, Hq, D, block_size, Hkv = _check_shapes(q, k_cache, v_cache, block_tables, seq_lens)\n"
                "    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale",
                '"""One decode step: each sequence\'s single query attends to its cached keys through its block table."""\n'
                "    B, Hq, D, block_size, Hkv = _check_shapes(q, k_cache, v_cache, block_tables, seq_lens)\n"
                "    scale = sm_scale or 1.0 / math.sqrt(D)")],
        cause=r"0 is a scale",
        loses=["attention"],
    ),
]
