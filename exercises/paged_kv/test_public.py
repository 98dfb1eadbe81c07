"""Public tests for the paged KV cache: small, fast, and each failure says what to look at.

Run: make check EX=paged_kv   (or: .venv/bin/pytest exercises/paged_kv)
The oracles are the slow obvious versions: a loop over every token, attention in float64.
"""

import math

import pytest
import torch

from grader import testing

from grader.harness.kernel_rule import KERNELS_ONLY
from grader.structure import Scaling, assert_flat_on_the_clock, assert_no_hidden_loop, clock

from grader.testing import assert_close, show


@pytest.fixture(scope="module")
def pk(student):
    return student.load("paged_kv")


@pytest.fixture(scope="module")
def pkk(student):
    """paged_attention_triton under the kernel rule, as in every check of it (README.md, "How it is graded"):
    outside a kernel launch the host code may only allocate, view, copy and cast."""
    return student.load("paged_kv", forbid=[KERNELS_ONLY],
                        forbid_why="paged_attention_triton walks the block tables inside its kernel")


def table_tensor(tables: list[list[int]], width: int) -> torch.Tensor:
    """Block tables as an int32 tensor [B, width], padded with -1."""
    out = torch.full((len(tables), width), -1, dtype=torch.int32)
    for i, t in enumerate(tables):
        out[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
    return out


def attention_by_loop(q, k_cache, v_cache, tables, seq_lens, kv_of=None) -> torch.Tensor:
    """Decode attention the slow way: for each sequence and query head, walk the tokens one by one. `kv_of(h, Hq,
    Hkv)`, if given, replaces h // (Hq // Hkv): a known mistake, to recognise its output."""
    B, Hq, D = q.shape
    block_size, Hkv = k_cache.shape[1], k_cache.shape[2]
    out = torch.zeros(B, Hq, D, dtype=torch.float64)
    for b in range(B):
        for h in range(Hq):
            kv = h // (Hq // Hkv) if kv_of is None else kv_of(h, Hq, Hkv)
            keys, values = [], []
            for pos in range(int(seq_lens[b])):
                block, offset = tables[b][pos // block_size], pos % block_size
                keys.append(k_cache[block, offset, kv].double())
                values.append(v_cache[block, offset, kv].double())
            if keys:
                weights = torch.softmax(torch.stack(keys) @ q[b, h].double() / math.sqrt(D), dim=0)
                out[b, h] = weights @ torch.stack(values)
    return out


# --------------------------------------------------------------------------------------------------
# The block manager


@pytest.mark.check("manager_public")
def test_a_prompt_takes_one_block_per_block_size_tokens(pk):
    bm = pk.BlockManager(8, 4)
    hit = bm.add_sequence("a", list(range(10)))
    assert hit == 0, f"with prefix caching off, add_sequence must return 0 cached tokens, found {hit}"
    assert bm.block_table("a") == [0, 1, 2], (
        f"10 tokens in blocks of 4 need 3 blocks, taken from the front of the free queue (0, 1, 2); "
        f"found table {bm.block_table('a')}"
    )
    assert bm.num_free_blocks == 5, f"8 blocks minus 3 in use leaves 5 free, found {bm.num_free_blocks}"
    assert bm.num_tokens("a") == 10 and [bm.ref_count(b) for b in range(4)] == [1, 1, 1, 0]


@pytest.mark.check("manager_public")
def test_append_allocates_only_when_the_last_block_is_full(pk):
    bm = pk.BlockManager(8, 4)
    bm.add_sequence(0, [5, 6, 7])  # one block, 3 of 4 slots used
    assert bm.append_token(0, 8) == [], "the 4th token fits in the last block: no copy to do"
    assert bm.block_table(0) == [0], f"the 4th token fits in block 0; found table {bm.block_table(0)}"
    bm.append_token(0, 9)
    assert bm.block_table(0) == [0, 1], (
        f"the 5th token needs a new block (the last one was full); found table {bm.block_table(0)}"
    )
    assert bm.num_tokens(0) == 5 and bm.num_free_blocks == 6


@pytest.mark.check("manager_public")
def test_freed_blocks_go_to_the_back_of_the_queue_last_block_first(pk):
    bm = pk.BlockManager(4, 2)
    bm.add_sequence("a", [1, 2, 3, 4, 5])  # blocks 0, 1, 2
    bm.free("a")
    assert bm.num_free_blocks == 4, f"freeing the only sequence must free every block, found {bm.num_free_blocks} free"
    bm.add_sequence("b", [1, 2, 3, 4, 5, 6, 7, 8])  # 4 blocks: the whole queue
    assert bm.block_table("b") == [3, 2, 1, 0], (
        "the free queue is: never-used blocks first (3), then released blocks in release order, a "
        f"sequence's last block first (2, 1, 0); expected table [3, 2, 1, 0], found {bm.block_table('b')}"
    )


@pytest.mark.check("manager_public")
def test_fork_shares_then_copies_on_write(pk):
    bm = pk.BlockManager(8, 4)
    bm.add_sequence("parent", list(range(6)))  # blocks 0 (full) and 1 (2 of 4 used)
    bm.fork("parent", "child")
    assert bm.block_table("child") == [0, 1], f"a fork shares the parent's blocks, found {bm.block_table('child')}"
    assert bm.ref_count(0) == 2 and bm.ref_count(1) == 2, "both blocks are held by two tables: ref count 2"
    assert bm.num_free_blocks == 6, "fork copies nothing: no block is allocated"
    copies = bm.append_token("child", 99)
    assert [tuple(c) for c in copies] == [(1, 2)], (
        "the child writes into block 1, which the parent still reads: copy on write must give the child a "
        f"private block (2) and return [(1, 2)] so the engine copies the KV first; found {copies}"
    )
    assert bm.block_table("child") == [0, 2] and bm.block_table("parent") == [0, 1]
    assert bm.ref_count(1) == 1, f"after the copy only the parent holds block 1, found ref count {bm.ref_count(1)}"


@pytest.mark.check("manager_public")
def test_running_out_of_blocks_changes_nothing(pk):
    bm = pk.BlockManager(4, 4)
    bm.add_sequence("a", list(range(9)))  # 3 blocks
    with pytest.raises(pk.OutOfBlocks):
        bm.add_sequence("b", list(range(8)))  # needs 2, 1 free
    assert bm.num_free_blocks == 1, f"a failed add_sequence must leave the pool as it was (1 free), found {bm.num_free_blocks}"
    with pytest.raises(KeyError):
        bm.block_table("b")


@pytest.mark.check("manager_public")
def test_the_manager_runs_the_same_lines_whatever_the_pool_size(pk, student):
    """The hidden `manager_speed` check, in small: the same serving loop (adds, appends, forks, frees) on a pool
    of 512 blocks and one of 131,072 must run the same lines of your file."""
    scaling = student.drive("grader.support.paged_kv:manager_scaling", pk.slot_mapping, reps=1)
    (small, large), (n_small, n_large) = scaling["lines"], scaling["sizes"]
    assert large <= small * 1.02 + 10, (
        f"the same {scaling['ops']} operations ran {small} lines of your code with {n_small} blocks but {large} with "
        f"{n_large}: something scans the pool (list.pop(0), list.remove, `in` on a list, min() over the free "
        "blocks). Every operation should cost O(1), amortised: a deque or an OrderedDict"
    )


# --------------------------------------------------------------------------------------------------
# Prefix caching


@pytest.mark.check("prefix_public")
def test_a_shared_prompt_prefix_is_found_in_whole_blocks(pk):
    bm = pk.BlockManager(16, 16, enable_prefix_caching=True)
    prompt = list(range(100, 155))  # 55 tokens: 3 full blocks + 7 tokens
    assert bm.add_sequence(0, prompt) == 0, "the first prompt finds nothing in an empty cache"
    hit = bm.add_sequence(1, prompt[:48] + [7, 7, 7])
    assert hit == 48, f"the first 48 tokens (3 full blocks) are cached: expected 48, found {hit}"
    assert bm.block_table(1)[:3] == bm.block_table(0)[:3], "cached blocks are shared, not copied"
    hit = bm.add_sequence(2, prompt[:48])
    assert hit == 32, (
        f"a 48-token prompt may reuse at most 32 tokens: the last prompt token must be computed to get "
        f"its logits, so the hit stops one full block short; found {hit}"
    )


@pytest.mark.check("prefix_public")
def test_caching_off_finds_nothing(pk):
    bm = pk.BlockManager(16, 4)
    bm.add_sequence(0, list(range(20)))
    assert bm.add_sequence(1, list(range(20))) == 0, "with enable_prefix_caching=False, nothing is ever a hit"
    assert bm.num_free_blocks == 6


@pytest.mark.check("prefix_public")
def test_the_same_block_after_a_different_prefix_is_not_a_hit(pk):
    bm = pk.BlockManager(16, 4, enable_prefix_caching=True)
    x = [9, 9, 9, 9]
    bm.add_sequence("a", [1, 2, 3, 4] + x + [0])  # caches [1 2 3 4] and [1 2 3 4 | 9 9 9 9]
    hit = bm.add_sequence("b", x + [0])
    assert hit == 0, (
        f"block x is cached only after the prefix [1, 2, 3, 4]; at the start of b its keys and values differ "
        f"(positions and context change them): expected 0 cached tokens, found {hit}. Chain the hashes: a "
        "block's hash must cover its parent block's hash."
    )


# --------------------------------------------------------------------------------------------------
# Slot mapping


@pytest.mark.check("slots_public")
def test_slot_mapping_small(pk):
    tables = table_tensor([[7, 2], [4, 0, 5]], 3)
    positions = torch.tensor([[0, 3, 4, -1], [2, 5, 8, 9]])
    got = pk.slot_mapping(tables, positions, 4)
    want = torch.tensor([[28, 31, 8, -1], [18, 1, 20, 21]])
    assert got.dtype == torch.int64, f"expected int64 slots, found {got.dtype}"
    assert got.shape == want.shape, f"expected slots of the positions' shape {tuple(want.shape)}, found {tuple(got.shape)}"
    wrong = got != want
    if wrong.any() and (positions[wrong] < 0).all():
        why = "only padding positions are wrong: a position of -1 maps to slot -1, whatever the table holds"
    elif wrong.any() and torch.equal(got[wrong & (positions >= 4)], (want - positions % 4 + positions)[wrong & (positions >= 4)]) \
            and not wrong[positions < 4].any():
        why = ("the wrong slots are block * block_size + the whole position p: a position's offset in its block is "
               "p % block_size")
    else:
        why = ("position p lives in block table[p // block_size] at offset p % block_size, so its slot is "
               "block * block_size + p % block_size; padding (-1) maps to -1")
    assert torch.equal(got, want), f"expected {show(want)}, found {show(got)}: {why}"


# The clock at two sizes (grader/structure.py): the call at 512x the tokens must not take much longer. A
# vectorised slot_mapping costs about 1.5x (its fixed cost dominates); one torch call per token, 50x and more.
SLOTS_CLOCK = Scaling(16, 8192, bar=8.0, large_in_process=2048, unit="tokens")


def identity_tables(n: int):
    """n // 2 sequences of 2 tokens, sequence b in block b (block size 4): slot b * 4 + position. Many short
    rows, so that a loop over the rows costs as much as one over the tokens."""
    B = max(1, n // 2)
    tables = torch.arange(B, dtype=torch.int32)[:, None]
    positions = torch.arange(2).repeat(B, 1)
    positions[::3, 1] = -1  # some padding
    return tables, positions


def check_slots(got, tables, positions, block_size) -> None:
    """The answer, computed here the slow, obvious way: a counted call must be right too, or its counts say
    nothing about the work."""
    want = [[-1 if p < 0 else int(tables[b, p // block_size]) * block_size + p % block_size for p in row]
            for b, row in enumerate(positions.tolist())]
    assert isinstance(got, torch.Tensor) and got.tolist() == want, (
        f"slot_mapping is wrong for {tables.shape[0]} sequences: slot = table[p // block_size] * block_size + "
        "p % block_size, -1 for padding")


def check_identity_slots(got, tables, positions) -> None:
    want = torch.where(positions >= 0, tables.long() * 4 + positions, -1)
    assert torch.equal(got, want), f"slot_mapping is wrong for {tables.shape[0]} sequences of one block each"


@pytest.mark.check("slots_public")
def test_slot_mapping_has_no_loop_over_tokens(pk, student):
    small = (table_tensor([[1], [0]], 2), torch.tensor([[0, 1], [1, -1]]), 4)
    big = (table_tensor([[i, i + 32] for i in range(32)], 2), torch.arange(16).remainder(8).repeat(32, 1), 4)
    _, work_small = student.work_executed(pk.slot_mapping, *small, check=lambda got: check_slots(got, *small))
    _, work_big = student.work_executed(pk.slot_mapping, *big, check=lambda got: check_slots(got, *big))
    lines_small, lines_big = work_small.lines, work_big.lines
    advice = "Compute every slot at once with tensor ops (torch.gather, //, %, torch.where)."
    assert lines_big <= lines_small + 2, (
        f"slot_mapping ran {lines_small} lines of your code for 4 positions and {lines_big} for 512: a Python "
        f"loop over tokens. {advice}"
    )
    # map() over .tolist() values runs no line of yours per token; the values it reads back still grow
    assert_no_hidden_loop("slot_mapping", ("4 positions", "512 positions"), work_small, work_big, advice, max_ops=None)
    timing = clock(student.mode, lambda t, p: pk.slot_mapping(t, p, 4), identity_tables, check_identity_slots,
                   SLOTS_CLOCK)
    assert_flat_on_the_clock(timing, "slot_mapping", advice, lines=(lines_small, lines_big), loop="a loop over tokens")


# --------------------------------------------------------------------------------------------------
# Paged attention


def small_batch(dtype=torch.float32):
    g = testing.generator(0)
    B, Hq, Hkv, D, block_size, num_blocks = 3, 4, 2, 8, 4, 12
    q = torch.randn(B, Hq, D, generator=g).to(dtype)
    k = torch.randn(num_blocks, block_size, Hkv, D, generator=g).to(dtype)
    v = torch.randn(num_blocks, block_size, Hkv, D, generator=g).to(dtype)
    tables = [[5, 2], [], [11, 0, 7]]  # physical blocks out of order; the second sequence is empty
    seq_lens = torch.tensor([6, 0, 9])
    return q, k, v, tables, seq_lens


@pytest.mark.check("attention_public")
def test_paged_attention_small(pk):
    q, k, v, tables, seq_lens = small_batch()
    out = pk.paged_attention(q, k, v, table_tensor(tables, 3), seq_lens)
    want = attention_by_loop(q, k, v, tables, seq_lens)
    assert out.shape == q.shape and out.dtype == q.dtype, f"expected {tuple(q.shape)} {q.dtype}, found {tuple(out.shape)} {out.dtype}"
    assert not torch.isnan(out).any(), "found NaN: a sequence of length 0 must give zeros (softmax over nothing)"
    interleaved = attention_by_loop(q, k, v, tables, seq_lens, kv_of=lambda h, hq, hkv: h % hkv)
    assert not testing.is_close(out, interleaved, atol=1e-5), (
        "your output is exactly what query head h reading KV head h % Hkv gives (Hq=4, Hkv=2): the query heads of a "
        "group are consecutive, so query head h reads KV head h // (Hq // Hkv)"
    )
    assert_close(out, want, atol=1e-5, what="paged_attention [sequence, head, feature]", hint=(
        "Check the gather through the table (block = "
        "table[pos // block_size]), the mask for positions >= seq_len, and that query head h reads KV head "
        "h // (Hq // Hkv)"
    ))


@pytest.mark.check("attention_public")
def test_paged_attention_scale(pk):
    q, k, v, tables, seq_lens = small_batch()
    out = pk.paged_attention(q, k, v, table_tensor(tables, 3), seq_lens, sm_scale=1.0)
    want = attention_by_loop(q * math.sqrt(8), k, v, tables, seq_lens)  # scale 1/sqrt(D) undone
    assert_close(out, want, atol=1e-4, what="paged_attention with sm_scale=1.0",
                 hint="sm_scale multiplies q.k; the default is 1/sqrt(D)")


def ragged_batch(B: int, blocks: int, seed: int):
    """B sequences of 1 to 4 * blocks tokens (one of them the longest) in a 4-token-block cache, each sequence
    in its own blocks, in reverse order."""
    g = testing.generator(seed)
    Hq, Hkv, D, block_size = 4, 2, 8, 4
    lengths = torch.randint(1, 4 * blocks + 1, (B,), generator=g)
    lengths[0] = 4 * blocks
    tables = [[blocks * b + i for i in reversed(range(blocks))] for b in range(B)]
    q = torch.randn(B, Hq, D, generator=g)
    k = torch.randn(blocks * B, block_size, Hkv, D, generator=g)
    v = torch.randn(blocks * B, block_size, Hkv, D, generator=g)
    return q, k, v, tables, lengths


@pytest.mark.check("attention_public")
def test_paged_attention_has_no_loop_over_sequences(pk, student):
    """The hidden `attention_vectorised` check, in small: the lines of your file that paged_attention runs, and
    the torch operators it dispatches, must not grow from 2 sequences of up to 8 tokens to 24 of up to 40."""
    counted = []
    for B, blocks, seed in ((2, 2, 1), (24, 10, 2)):
        q, k, v, tables, lengths = ragged_batch(B, blocks, seed)
        want = attention_by_loop(q, k, v, tables, lengths)

        def check(out, want=want, B=B):
            assert_close(out, want, atol=1e-5, what=f"paged_attention on {B} sequences (a counted call)")

        counted.append(student.work_executed(pk.paged_attention, q, k, v, table_tensor(tables, blocks), lengths,
                                             check=check)[1])
    small, big = counted
    advice = ("Gather K and V for every position of every sequence at once through the table, and mask positions "
              ">= seq_len.")
    sizes = ("2 sequences of up to 8 tokens", "24 of up to 40")
    assert big.lines <= small.lines + 2, (
        f"paged_attention ran {small.lines} lines of your code for {sizes[0]} and {big.lines} for {sizes[1]}: a "
        f"Python loop over sequences, blocks or tokens. {advice}"
    )
    assert_no_hidden_loop("paged_attention", sizes, small, big, advice, max_ops=None)


@pytest.mark.check("triton_public")
def test_paged_attention_triton_small(pkk):
    q, k, v, tables, seq_lens = small_batch()
    out = pkk.paged_attention_triton(q, k, v, table_tensor(tables, 3), seq_lens)
    want = attention_by_loop(q, k, v, tables, seq_lens)
    assert out.shape == q.shape and out.dtype == q.dtype, f"expected {tuple(q.shape)} {q.dtype}, found {tuple(out.shape)} {out.dtype}"
    assert not torch.isnan(out).any(), "found NaN: a sequence of length 0 must give zeros (guard the division by l = 0)"
    for b, n in enumerate(seq_lens.tolist()):
        assert n == 0 or out[b].any() or not want[b].any(), (
            f"sequence {b} came out all zeros although its length is {n}, as if it were empty: is its length read "
            f"right? seq_lens here is {seq_lens.dtype} (int32 and int64 are both allowed): read it in its own dtype"
        )
    assert_close(out, want, atol=1e-4, what="paged_attention_triton [sequence, head, feature]")
