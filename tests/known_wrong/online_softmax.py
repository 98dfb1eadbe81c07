"""Known-wrong online softmax submissions: the mistakes students make, each as an edit of the reference."""

from tests.known_wrong import Mutant

MUTANTS = [
    Mutant(
        name="no_max_subtraction",
        why="exp(x) without subtracting the running max: overflows to inf for inputs near 1e4",
        edits=[("    return torch.where(m == NEG_INF, torch.zeros_like(m), m)", "    return torch.zeros_like(m)")],
        loses=["stability", "normalizer", "normalizer_public"],
        cause=r"subtracted before exp",
    ),
    Mutant(
        name="no_rescale",
        why="forgets to rescale the running sum by exp(old_max - new_max) when the max grows",
        edits=[("    l = l_a * torch.exp(m_a - shift) + l_b * torch.exp(m_b - shift)",
                "    l = l_a + l_b * torch.exp(m_b - shift)")],
        loses=["normalizer", "merge", "softmax", "normalizer_public", "merge_public"],
        cause=r"exp\(old_max - new_max\)",
    ),
    Mutant(
        name="reads_chunks_twice",
        why="two passes over the chunks (one for the max, one for the sum): a stream can be read only once",
        edits=[(
            """    m = l = None
    for chunk in chunks:
        chunk = chunk.float()
        if m is None:
            m = torch.full(chunk.shape[:1], NEG_INF, dtype=torch.float32, device=chunk.device)
            l = torch.zeros_like(m)
        if chunk.shape[1] == 0:
            continue
        m_chunk = chunk.amax(dim=1)
        l_chunk = torch.exp(chunk - _safe_max(m_chunk)[:, None]).sum(dim=1)
        m, l = merge_states(m, l, m_chunk, l_chunk)
    if m is None:""",
            """    m = l = None
    for chunk in chunks:  # pass 1: the max
        chunk = chunk.float()
        if m is None:
            m = torch.full(chunk.shape[:1], NEG_INF, dtype=torch.float32, device=chunk.device)
            l = torch.zeros_like(m)
        if chunk.shape[1]:
            m = torch.maximum(m, chunk.amax(dim=1))
    for chunk in chunks:  # pass 2: the sum
        l = l + torch.exp(chunk.float() - _safe_max(m)[:, None]).sum(dim=1)
    if m is None:""",
        )],
        loses=["normalizer", "normalizer_public", "softmax"],
        cause=r"read only once",
    ),
    Mutant(
        name="merge_nan_on_empty_state",
        why="subtracts the max even when it is -inf: exp(-inf - (-inf)) = NaN for rows with nothing yet",
        edits=[("    m = torch.maximum(m_a, m_b)\n    shift = _safe_max(m)", "    m = torch.maximum(m_a, m_b)\n    shift = m")],
        loses=["merge", "merge_public", "normalizer"],
        cause=r"NaN.*-inf|-inf.*NaN",
    ),
    Mutant(
        name="fp16_accumulation",
        why="keeps the running (m, l) in the input dtype: fp16 sums of long rows lose digits",
        edits=[("        chunk = chunk.float()\n        if m is None:", "        if m is None:"),
               ("dtype=torch.float32, device=chunk.device)", "dtype=chunk.dtype, device=chunk.device)")],
        loses=["stability", "normalizer"],
        cause=r"must be fp32",
    ),
    Mutant(
        name="drops_last_partial_block",
        why="iterates over whole blocks only: the last, partial block is never read or written",
        edits=[("    starts = range(0, n, block_size)", "    starts = range(0, n // block_size * block_size, block_size)")],
        loses=["softmax", "softmax_public"],
        cause=r"last, partial block",
    ),
    Mutant(
        name="output_always_fp32",
        why="returns the fp32 working copy instead of casting back to the input dtype",
        edits=[("    out = torch.empty_like(rows)", "    out = torch.empty_like(rows, dtype=torch.float32)"),
               ("(torch.exp(block - shift) * inv_l).to(x.dtype)", "torch.exp(block - shift) * inv_l")],
        loses=["softmax", "softmax_public"],
        cause=r"expected (float16 output|dtype torch\.float16)",
    ),
    Mutant(
        name="triton_one_tile_per_row",
        why="the kernel reads one BLOCK-wide tile per row: rows longer than a block come out wrong",
        edits=[("    block = min(4096, triton.next_power_of_2(n_cols))", "    block = min(1024, triton.next_power_of_2(n_cols))"),
               ("    for start in range(0, n_cols, BLOCK):\n        offs = start + cols\n        x = tl.load(",
                "    for start in range(0, BLOCK, BLOCK):\n        offs = start + cols\n        x = tl.load(")],
        loses=["triton"],
        cause=r"loop over the whole row",
    ),
    Mutant(
        name="triton_load_mask_off_by_one",
        why="pass 2 loads with the mask offs < n_cols - 1: the last column of every row is read as -inf and written as 0",
        edits=[("        x = tl.load(x_row + offs * stride_xc, mask=mask, other=float(\"-inf\")).to(tl.float32)",
                "        x = tl.load(x_row + offs * stride_xc, mask=offs < n_cols - 1, other=float(\"-inf\")).to(tl.float32)")],
        loses=["triton", "triton_public"],
        cause=r"off-by-one in the load or store mask",
    ),
    Mutant(
        name="triton_ignores_strides",
        why="addresses x as if it were contiguous: transposes and slices read the wrong elements",
        edits=[("out, n_cols, x.stride(0), x.stride(1), out.stride(0)", "out, n_cols, n_cols, 1, out.stride(0)")],
        loses=["triton", "triton_public"],
        cause=r"stride",
    ),
]


# --------------------------------------------------------------------------------------------------
# Masks the hand-picked tests never placed (issue "Right verdicts"): each mishandles one placement of a
# -inf span against the blocks, and only the generated masks (grader.blocks) meet it.
# tests/test_mask_spans.py proves that every check they lose is lost through a generated test.

SPAN_MUTANTS = [
    Mutant(
        name="normalizer_stops_at_masked_chunk",
        why="takes the first chunk of only -inf after a row's values for the start of its padding and ignores the "
            "rest of the row: a masked block between finite ones drops every block after it",
        edits=[("            l = torch.zeros_like(m)\n",
                "            l = torch.zeros_like(m)\n            padded = torch.zeros_like(m, dtype=torch.bool)\n"),
               ("        m, l = merge_states(m, l, m_chunk, l_chunk)\n",
                "        padded = padded | ((m > NEG_INF) & (m_chunk == NEG_INF))  # values, then -inf: padding from here\n"
                "        m_new, l_new = merge_states(m, l, m_chunk, l_chunk)\n"
                "        m, l = torch.where(padded, m, m_new), torch.where(padded, l, l_new)\n")],
        loses=["normalizer", "softmax"],
        cause=r"was not counted|after a chunk of only -inf",
    ),
    Mutant(
        name="chunk_masked_by_first_column",
        why="decides that a row has nothing in a chunk from the chunk's first column: a chunk that begins with -inf "
            "but holds finite values has its sum taken against 0 instead of its max",
        edits=[("        l_chunk = torch.exp(chunk - _safe_max(m_chunk)[:, None]).sum(dim=1)",
                "        l_chunk = torch.exp(chunk - torch.where(chunk[:, 0] == NEG_INF, 0.0, m_chunk)[:, None]).sum(dim=1)")],
        loses=["normalizer", "softmax"],
        cause=r"begins with -inf",
    ),
    Mutant(
        name="triton_first_tile_unguarded",
        why="starts each lane's state from the first tile and drops the -inf guard after it: a lane masked in the "
            "first tile and again in a later one (a span longer than a tile, a masked row, the padding of the last "
            "tile) computes exp(-inf - (-inf)) = NaN",
        edits=[("""    m = tl.full([BLOCK], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        x = tl.load(x_row + offs * stride_xc, mask=offs < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        l = l * tl.exp(m - shift) + tl.exp(x - shift)
        m = m_new""", """    m = tl.load(x_row + cols * stride_xc, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
    l = tl.where(m == float("-inf"), 0.0, 1.0)
    for start in range(BLOCK, n_cols, BLOCK):  # the first tile set the lanes; their max is finite from here on
        offs = start + cols
        x = tl.load(x_row + offs * stride_xc, mask=offs < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        l = l * tl.exp(m - m_new) + tl.exp(x - m_new)
        m = m_new""")],
        loses=["triton"],
        cause=r"while the max is -inf, in every tile",
    ),
]
MUTANTS += SPAN_MUTANTS


# --------------------------------------------------------------------------------------------------
# The technique skipped, and the contract clauses issue 36 ("Right verdicts II") brought into the tests.
# A textbook submission computes the same numbers without streaming: only the `streaming` check (what a call
# holds, grader/support/online_softmax.py) sees it, and every correctness check keeps full marks.

_NORMALIZER_LOOP = """    m = l = None
    for chunk in chunks:
        chunk = chunk.float()
        if m is None:
            m = torch.full(chunk.shape[:1], NEG_INF, dtype=torch.float32, device=chunk.device)
            l = torch.zeros_like(m)
        if chunk.shape[1] == 0:
            continue
        m_chunk = chunk.amax(dim=1)
        l_chunk = torch.exp(chunk - _safe_max(m_chunk)[:, None]).sum(dim=1)
        m, l = merge_states(m, l, m_chunk, l_chunk)
    if m is None:
        raise ValueError("online_normalizer needs at least one chunk, found none")
    return m, l"""
_STATE_AND_WRITE = """    m, l = online_normalizer(rows[:, s : s + block_size] for s in starts)
    shift = _safe_max(m)[:, None]
    inv_l = torch.where(l > 0, 1.0 / l, torch.zeros_like(l))[:, None]  # fully masked rows -> zeros

    out = torch.empty_like(rows)
    for s in starts:
        block = rows[:, s : s + block_size].float()
        out[:, s : s + block_size] = (torch.exp(block - shift) * inv_l).to(x.dtype)"""
_CORRECT = ["normalizer", "merge", "softmax", "stability", "normalizer_public", "merge_public", "softmax_public"]

MUTANTS += [
    Mutant(
        name="textbook_normalizer",
        why="collects every chunk (a list, then torch.cat) and takes the max and the sum of the whole matrix at "
            "the end: one pass over the stream, the right numbers, and the whole stream held in memory",
        edits=[(_NORMALIZER_LOOP, """    whole = [chunk.float() for chunk in chunks]
    if not whole:
        raise ValueError("online_normalizer needs at least one chunk, found none")
    x = torch.cat(whole, dim=1)
    m = x.amax(dim=1) if x.shape[1] else torch.full(x.shape[:1], NEG_INF, device=x.device)
    return m, torch.exp(x - _safe_max(m)[:, None]).sum(dim=1)""")],
        loses=["streaming"],
        keeps=_CORRECT,
        cause=r"earlier chunks were still alive",
    ),
    Mutant(
        name="textbook_softmax",
        why="ignores block_size: hands online_normalizer the whole rows as one chunk and writes exp(x - m) / l over "
            "whole rows at once",
        edits=[("    m, l = online_normalizer(rows[:, s : s + block_size] for s in starts)",
                "    m, l = online_normalizer([rows.float()])"),
               ("""    for s in starts:
        block = rows[:, s : s + block_size].float()
        out[:, s : s + block_size] = (torch.exp(block - shift) * inv_l).to(x.dtype)""",
                "    out = (torch.exp(rows.float() - shift) * inv_l).to(x.dtype)")],
        loses=["streaming"],
        keeps=_CORRECT,
        cause=r"expected \d+ blocks of \d+ columns",
    ),
    Mutant(
        name="softmax_without_online_normalizer",
        why="online_softmax finds (m, l) with a loop of its own over the blocks instead of calling online_normalizer, "
            "which the contract's first pass names",
        edits=[("    m, l = online_normalizer(rows[:, s : s + block_size] for s in starts)",
                """    m = torch.full(rows.shape[:1], NEG_INF, dtype=torch.float32, device=x.device)
    l = torch.zeros_like(m)
    for s in starts:
        block = rows[:, s : s + block_size].float()
        m_block = block.amax(dim=1)
        m, l = merge_states(m, l, m_block, torch.exp(block - _safe_max(m_block)[:, None]).sum(dim=1))""")],
        loses=["streaming"],
        keeps=["softmax"],
        cause=r"called online_normalizer 0 times",
    ),
    Mutant(
        name="inplace_whole_rows_on_output",
        why="calls online_normalizer on the blocks (the call the census looks for) but discards its (m, l), copies x "
            "into the output block by block, then takes the softmax of whole rows in place on the output (fp32: "
            "every row at once; fp16 and bf16: one row at a time through an fp32 copy of that row): the output and "
            "x never count as held memory, so only the widest operation shows it",
        edits=[(_STATE_AND_WRITE, """    online_normalizer(rows[:, s : s + block_size] for s in starts)  # its (m, l) discarded

    out = torch.empty_like(rows)
    for s in starts:
        out[:, s : s + block_size] = rows[:, s : s + block_size]

    def softmax_in_place(t):  # whole rows, in place
        m = t.amax(-1, keepdim=True)
        t.sub_(torch.where(m == NEG_INF, torch.zeros_like(m), m)).exp_()
        l = t.sum(-1, keepdim=True)
        t.div_(torch.where(l > 0, l, torch.ones_like(l)))

    if out.dtype == torch.float32:
        softmax_in_place(out)
    else:
        for r in range(out.shape[0]):
            row = out[r].float()
            softmax_in_place(row)
            out[r] = row.to(out.dtype)""")],
        loses=["streaming"],
        keeps=_CORRECT,
        cause=r"with the state online_normalizer returned",
    ),
    Mutant(
        name="state_used_whole_rows_in_place",
        why="takes (m, l) from online_normalizer as it should, copies x into the output block by block, then "
            "writes exp(x - m) / l in place on whole rows of the output (fp32: every row at once; fp16 and bf16: "
            "one row at a time through an fp32 copy of that row): the state is the normaliser's, but the second "
            "pass is the textbook's, and only the widest operation shows it",
        edits=[(_STATE_AND_WRITE, """    m, l = online_normalizer(rows[:, s : s + block_size] for s in starts)
    shift = _safe_max(m)[:, None]
    inv_l = torch.where(l > 0, 1.0 / l, torch.zeros_like(l))[:, None]  # fully masked rows -> zeros

    out = torch.empty_like(rows)
    for s in starts:
        out[:, s : s + block_size] = rows[:, s : s + block_size]
    if out.dtype == torch.float32:
        out.sub_(shift).exp_().mul_(inv_l)  # whole rows, in place
    else:
        for r in range(out.shape[0]):
            out[r] = (out[r].float().sub_(shift[r]).exp_().mul_(inv_l[r])).to(out.dtype)""")],
        loses=["streaming"],
        keeps=_CORRECT,
        cause=r"read \d+ elements at once",
    ),
    Mutant(
        name="normalizer_result_discarded",
        why="calls online_normalizer on the blocks but throws its (m, l) away and finds (m, l) again with a blockwise "
            "loop of its own: streaming and holding a few blocks, yet the state it writes with never came from "
            "online_normalizer",
        edits=[("    m, l = online_normalizer(rows[:, s : s + block_size] for s in starts)",
                """    online_normalizer(rows[:, s : s + block_size] for s in starts)  # its (m, l) discarded
    m = torch.full(rows.shape[:1], NEG_INF, dtype=torch.float32, device=x.device)
    l = torch.zeros_like(m)
    for s in starts:
        block = rows[:, s : s + block_size].float()
        m_block = block.amax(dim=1)
        m, l = merge_states(m, l, m_block, torch.exp(block - _safe_max(m_block)[:, None]).sum(dim=1))""")],
        loses=["streaming"],
        keeps=_CORRECT,
        cause=r"with the state online_normalizer returned",
    ),
    Mutant(
        name="max_clamped_at_minus_1e30",
        why="keeps -inf out of the subtraction by clamping the max at -1e30: rows whose values all lie below -1e30 "
            "(finite, and in the contract) sum to 0",
        edits=[("    return torch.where(m == NEG_INF, torch.zeros_like(m), m)", "    return m.clamp(min=-1e30)")],
        loses=["normalizer", "merge", "softmax"],
        cause=r"finite stand-in for -inf",
    ),
    Mutant(
        name="block_size_sign_only",
        why="checks only that block_size is positive: 2.0 and None then fail with a TypeError deep inside range()",
        edits=[("    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size <= 0:",
                "    if block_size <= 0:")],
        loses=["softmax"],
        cause=r"ValueError whenever block_size is not a positive int",
    ),
    Mutant(
        name="block_size_accepts_bool",
        why="checks isinstance(block_size, int), which True passes (bool is an int in Python): True reads as 1",
        edits=[("    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size <= 0:",
                "    if not isinstance(block_size, int) or block_size <= 0:")],
        loses=["softmax"],
        cause=r"bools, not sizes",
    ),
    Mutant(
        name="softmax_of_empty_input_raises",
        why="no case for an x without elements: a last dim of 0 makes no blocks, and online_normalizer raises for "
            "no chunks",
        edits=[("    if n == 0 or x.numel() == 0:\n        return torch.empty_like(x)\n", "")],
        loses=["softmax"],
        cause=r"no elements",
    ),
    Mutant(
        name="normalizer_state_from_first_nonempty_chunk",
        why="starts the state at the first chunk with columns: a stream whose chunks are all of width 0 looks "
            "like no chunks at all and raises",
        edits=[("        chunk = chunk.float()\n        if m is None:",
                "        chunk = chunk.float()\n        if chunk.shape[1] == 0:\n            continue\n        if m is None:")],
        loses=["normalizer"],
        cause=r"chunks of width 0",
    ),
    Mutant(
        name="normalizer_keeps_fp64",
        why="leaves fp64 chunks in fp64 (more precise, it reasons) and returns an fp64 (m, l) where the contract "
            "says fp32",
        edits=[("        chunk = chunk.float()\n        if m is None:",
                "        chunk = chunk if chunk.dtype == torch.float64 else chunk.float()\n        if m is None:"),
               ("dtype=torch.float32, device=chunk.device)", "dtype=chunk.dtype, device=chunk.device)")],
        loses=["normalizer"],
        cause=r"must be fp32",
    ),
]


# --------------------------------------------------------------------------------------------------
# The library's softmax reached some other way than its public name (issue "Trust II", item 4).
# Each replaces online_softmax and softmax_triton with one library call; the result is right, so
# only the forbidden-call guard can take the points away. `library_softmax` makes the helper.

_ONLINE_SOFTMAX_BODY = """    m, l = online_normalizer(rows[:, s : s + block_size] for s in starts)
    shift = _safe_max(m)[:, None]
    inv_l = torch.where(l > 0, 1.0 / l, torch.zeros_like(l))[:, None]  # fully masked rows -> zeros

    out = torch.empty_like(rows)
    for s in starts:
        block = rows[:, s : s + block_size].float()
        out[:, s : s + block_size] = (torch.exp(block - shift) * inv_l).to(x.dtype)
    return out.reshape(x.shape)"""
_TRITON_LAUNCH = (
    "    _softmax_kernel[(rows,)](x, out, n_cols, x.stride(0), x.stride(1), out.stride(0), "
    "BLOCK=block, num_warps=num_warps)\n    return out"
)


def library_softmax(name: str, why: str, prelude: str, call: str, loses: list[str], cause: str) -> Mutant:
    """A mutant whose online_softmax and softmax_triton return `call` (an expression in `x`, fp32).
    `prelude` goes after NEG_INF at import time (where aliases are bound)."""
    helper = (
        f'NEG_INF = float("-inf")\n{prelude}\n\n'
        "def _library_softmax(x):\n"
        "    x = x.float()\n"
        f"    out = {call}\n"
        "    return torch.nan_to_num(out, nan=0.0)  # rows of only -inf: NaN from the library, 0 wanted\n"
    )
    return Mutant(
        name=name,
        why=why,
        edits=[
            ('NEG_INF = float("-inf")\n', helper),
            (_ONLINE_SOFTMAX_BODY, "    return _library_softmax(x).to(x.dtype)"),
            (_TRITON_LAUNCH, "    return _library_softmax(x).to(x.dtype)"),
        ],
        loses=loses,
        cause=cause,
    )


_GUARDED = ["softmax", "stability", "triton"]  # the hidden checks whose sm fixture forbids torch.softmax

MUTANTS += [
    library_softmax(
        "softmax_by_name",
        "calls torch.softmax by its public name (the honest shortcut the guard was written for)",
        "", "torch.softmax(x, dim=-1)", _GUARDED, r"must not call torch\.softmax",
    ),
    library_softmax(
        "softmax_alias_bound_at_import",
        "binds torch.softmax to another name at import, so patching torch.softmax during a call misses it",
        "_SOFTMAX = torch.softmax", "_SOFTMAX(x, dim=-1)", _GUARDED, r"must not call torch\.softmax",
    ),
    library_softmax(
        "softmax_from_import",
        "imports softmax from torch.nn.functional under another name at import",
        "from torch.nn.functional import softmax as _row_normalise", "_row_normalise(x, dim=-1)", _GUARDED, r"must not call torch\.(Tensor\.)?softmax",
    ),
    library_softmax(
        "softmax_via_torch_ops_aten",
        "calls the dispatcher's operator torch.ops.aten._softmax.default directly",
        "", "torch.ops.aten._softmax.default(x, -1, False)", _GUARDED, r"must not call torch\.softmax",
    ),
    library_softmax(
        "softmax_method_form",
        "calls the method form x.softmax(-1)",
        "", "x.softmax(-1)", _GUARDED, r"must not call torch\.Tensor\.softmax",
    ),
    library_softmax(
        "log_softmax_exp",
        "computes softmax as exp(log_softmax(x)), a softmax under another name",
        "", "x.log_softmax(-1).exp()", _GUARDED, r"log-softmax",
    ),
    library_softmax(
        "softmax_with_dispatch_modes_popped",
        "switches off every dispatch mode in its own process, then calls an alias of torch.softmax",
        "from torch.utils._python_dispatch import _disable_current_modes\n_SOFTMAX = torch.softmax\n\n\n"
        "def _unwatched(x):\n    with _disable_current_modes():  # pops the grader's guard, then puts it back\n"
        "        return _SOFTMAX(x, dim=-1)",
        "_unwatched(x)", _GUARDED, r"_disable_current_modes",
    ),
]


# --------------------------------------------------------------------------------------------------
# Points the contracts forbid (issue "Trust III"): the softmax's math under other names, and a
# softmax_triton that is no Triton kernel. Each result is right, so only the guards take the points.

_TORCH_HOST_SOFTMAX = """    rows_f = x.float()
    m = rows_f.amax(-1, keepdim=True)
    m = torch.where(m == NEG_INF, torch.zeros_like(m), m)
    e = torch.exp(rows_f - m)
    s = e.sum(-1, keepdim=True)
    out.copy_(torch.where(s > 0, e / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(e)))
    return out"""

MUTANTS += [
    Mutant(
        name="normalizer_by_logcumsumexp",
        why="takes each chunk's normaliser from torch.logcumsumexp (its last column is the chunk's logsumexp), a "
            "library normaliser under a name the forbid list did not spell out",
        edits=[("        l_chunk = torch.exp(chunk - _safe_max(m_chunk)[:, None]).sum(dim=1)",
                "        l_chunk = torch.exp(torch.logcumsumexp(chunk, dim=1)[:, -1] - _safe_max(m_chunk))")],
        loses=["normalizer", "softmax", "stability", "rules_public"],
        cause=r"must not call torch\.logcumsumexp",
    ),
    Mutant(
        name="merge_by_logaddexp",
        why="merges two states in log space with torch.logaddexp: the library does the rescaled sum",
        edits=[("    l = l_a * torch.exp(m_a - shift) + l_b * torch.exp(m_b - shift)",
                "    l = torch.exp(torch.logaddexp(torch.log(l_a) + m_a - shift, torch.log(l_b) + m_b - shift))")],
        loses=["merge", "normalizer", "rules_public"],  # merge_public runs unguarded: rules_public is the public guard
        cause=r"must not call torch\.logaddexp",
    ),
    Mutant(
        name="triton_in_torch",
        why="softmax_triton computes the softmax with torch operations on the host (max, exp, sum): right "
            "numbers, no Triton kernel",
        edits=[(_TRITON_LAUNCH, _TORCH_HOST_SOFTMAX)],
        loses=["triton", "triton_public", "rules_public"],
        cause=r"outside any kernel launch",
    ),
    Mutant(
        name="triton_in_numpy",
        why="softmax_triton reads x back with .numpy(), computes the softmax in numpy and copies it into the "
            "output: no Triton kernel, and nothing the dispatcher sees but a copy",
        edits=[(_TRITON_LAUNCH, """    import numpy as np

    a = x.detach().cpu().numpy().astype(np.float64)
    m = a.max(-1, keepdims=True)
    m = np.where(m == -np.inf, 0.0, m)
    e = np.exp(a - m)
    s = e.sum(-1, keepdims=True)
    out.copy_(torch.from_numpy(np.where(s > 0, e / np.where(s > 0, s, 1.0), 0.0)).to(out.dtype))
    return out""")],
        loses=["triton", "triton_public", "rules_public"],
        cause=r"Tensor\.numpy\(\)",
    ),
    Mutant(
        name="triton_noop_launch_then_torch",
        why="launches the kernel on no columns at all (it writes nothing), then fills the output with torch "
            "operations: a launch happened, but the work is on the host",
        edits=[(_TRITON_LAUNCH, "    _softmax_kernel[(rows,)](x, out, 0, x.stride(0), x.stride(1), out.stride(0), BLOCK=16)\n"
                                + _TORCH_HOST_SOFTMAX)],
        loses=["triton", "triton_public"],
        cause=r"outside any kernel launch",
    ),
    Mutant(
        name="triton_kernel_skips_the_last_row",
        why="launches one program too few (rows - 1): the last row is never written, and reads as whatever "
            "torch.empty held",
        edits=[("    _softmax_kernel[(rows,)](x, out, n_cols,", "    _softmax_kernel[(max(rows - 1, 1),)](x, out, n_cols,")],
        loses=["triton", "triton_public"],
        cause=r"never written",
    ),
]

# The tiled kernel's signature (issue "Right verdicts II"): the tile a program holds and the loop over it. Both
# give right answers under the interpreter; the kernel resource model (grader.kernelmodel) compiles them for
# sm_90 as launched, and only tiled_kernel sees them.

_REFERENCE_KERNEL_BODY = """    # One program per row; the row streams through in BLOCK-wide tiles.
    row = tl.program_id(0)
    x_row = x_ptr + row.to(tl.int64) * stride_xr
    out_row = out_ptr + row.to(tl.int64) * stride_or
    cols = tl.arange(0, BLOCK)
"""

MUTANTS += [
    Mutant(
        name="one_tile_kernel",
        why="the textbook kernel: BLOCK = next_power_of_2(n_cols), the whole row loaded as one tile, its max, exp "
            "and sum taken at once, no loop; right on the CPU, where a tile may be any width, but on a GPU a tile "
            "of 2^17 columns cannot live in a program's registers",
        edits=[
            (_REFERENCE_KERNEL_BODY, _REFERENCE_KERNEL_BODY + """    mask = cols < n_cols
    x = tl.load(x_row + cols * stride_xc, mask=mask, other=float("-inf")).to(tl.float32)
    row_max = tl.max(x, axis=0)
    e = tl.exp(x - tl.where(row_max == float("-inf"), 0.0, row_max))
    row_sum = tl.sum(e, axis=0)
    y = e * tl.where(row_sum > 0, 1.0 / tl.where(row_sum > 0, row_sum, 1.0), 0.0)
    tl.store(out_row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)
    return
"""),
            ("    block = min(4096, triton.next_power_of_2(n_cols))\n",
             "    block = triton.next_power_of_2(n_cols)  # the whole row is one tile\n"),
        ],
        loses=["tiled_kernel"],
        keeps=["triton", "triton_public"],
        cause=r"does not fit",
    ),
    Mutant(
        name="interpreter_only_kernel",
        why="the kernel takes its tile width from a module constant that is a plain int (TILE = 4096), not a "
            "tl.constexpr: the interpreter runs the body as Python and reads it, but Triton's GPU compiler refuses "
            "any global that is not a constexpr",
        edits=[
            ('NEG_INF = float("-inf")\n', 'NEG_INF = float("-inf")\nTILE = 4096  # the tile width, kernel and host\n'),
            ("    cols = tl.arange(0, BLOCK)\n", "    cols = tl.arange(0, TILE)\n"),
            ("    block = min(4096, triton.next_power_of_2(n_cols))\n    num_warps = 4 if block <= 1024 else 8\n",
             "    block = TILE\n    num_warps = 8\n"),
        ],
        loses=["tiled_kernel"],
        keeps=["triton", "triton_public"],
        cause=r"does not compile",
    ),
]

# Mistakes that only a GPU can see: the answer is right, the speed is not. The project's tests prove only
# that these checks are not graded on a host without CUDA; `grader gpu-check` grades them on one and fails
# when a mutant keeps full marks (grader/gpucheck.py, step_known_wrong).
MUTANTS += [
    Mutant(
        "softmax_triton_tiny_tiles",
        "I stream every row in 32-wide tiles whatever its length, so that a tile is one warp's worth",
        [("    block = min(4096, triton.next_power_of_2(n_cols))\n", "    block = 32\n")],
        loses=["triton_speed"],
        cause=r"bandwidth|GB/s",  # a CUDA check: proved on a GPU (grader gpu-check), never on this host
    ),
]
