"""Known-wrong FlashAttention submissions: the mistakes students make, each as an edit of the reference."""

from tests.known_wrong import Mutant

_LAUNCH = """    cfg = _blocks(head_dim, q.dtype)
    grid = (triton.cdiv(n_q, cfg["BLOCK_M"]), batch * h_q)
    _fwd_kernel[grid](q, k, v, o, lse, scale * LOG2E.value, n_q, n_k, h_q, h_kv,
                      HEAD_DIM=head_dim, CAUSAL=bool(causal), PRECISION=_precision(q.dtype), **cfg)
    return o, lse
"""

_NAIVE_TORCH = """    group = h_q // h_kv
    kk, vv = k.repeat_interleave(group, 1).float(), v.repeat_interleave(group, 1).float()
    s = q.float() @ kk.transpose(-1, -2) * scale
    if causal:
        rows, cols = torch.arange(n_q)[:, None], torch.arange(n_k)[None, :]
        s = s.masked_fill(cols > rows + n_k - n_q, float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    e = torch.exp(s - m)
    l = e.sum(-1, keepdim=True)
    o.copy_(e @ vv / torch.where(l > 0, l, torch.ones_like(l)))
    lse.copy_(torch.where(l > 0, m + torch.log(l), torch.full_like(l, float("inf")))[..., 0])
    return o, lse
"""

_TILED_TORCH = """    group = h_q // h_kv
    kk, vv = k.repeat_interleave(group, 1).float(), v.repeat_interleave(group, 1).float()
    m = torch.full((batch, h_q, n_q, 1), float("-inf"))
    l = torch.zeros((batch, h_q, n_q, 1))
    acc = torch.zeros((batch, h_q, n_q, head_dim))
    rows = torch.arange(n_q)[:, None]
    for start in range(0, n_k, 64):  # the key tiles, in Python
        s = q.float() @ kk[:, :, start:start + 64].transpose(-1, -2) * scale
        cols = torch.arange(start, min(start + 64, n_k))[None, :]
        if causal:
            s = s.masked_fill(cols > rows + n_k - n_q, float("-inf"))
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        m_safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
        alpha, p = torch.exp(m - m_safe), torch.exp(s - m_safe)
        l = l * alpha + p.sum(-1, keepdim=True)
        acc = acc * alpha + p @ vv[:, :, start:start + 64]
        m = m_new
    o.copy_(acc / torch.where(l > 0, l, torch.ones_like(l)))
    lse.copy_(torch.where(l > 0, m + torch.log(l), torch.full_like(l, float("inf")))[..., 0])
    return o, lse
"""

_ALL_HEADS_TORCH = """    group = h_q // h_kv
    # Every head's scores in ONE matmul, [B*Hq*Nq, B*Hq*Nk], with the other heads' blocks masked off:
    # no tensor has an Nq x Nk pair of dimensions, and the op count does not grow with the lengths.
    qq = q.float().reshape(-1, head_dim)
    kk = k.repeat_interleave(group, 1).float().reshape(-1, head_dim)
    vv = v.repeat_interleave(group, 1).float().reshape(-1, head_dim)
    s = qq @ kk.transpose(0, 1) * scale
    rows, cols = torch.arange(qq.shape[0], device=q.device), torch.arange(kk.shape[0], device=q.device)
    visible = (rows[:, None] // n_q) == (cols[None, :] // n_k)
    if causal:
        visible = visible & ((cols[None, :] % n_k) <= (rows[:, None] % n_q) + n_k - n_q)
    s = s.masked_fill(~visible, float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    e = torch.exp(s - m)
    l = e.sum(-1, keepdim=True)
    o.copy_((e @ vv / torch.where(l > 0, l, torch.ones_like(l))).view(o.shape))
    lse.copy_(torch.where(l > 0, m + torch.log(l), torch.full_like(l, float("inf"))).view(lse.shape))
    return o, lse
"""

MUTANTS = [
    Mutant(
        name="no_output_rescale",
        cause=r"output accumulator is what goes wrong",
        why="rescales the running sum l when the max grows, but not the output accumulator",
        edits=[("        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)",
                "        acc = acc + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)")],
        loses=["forward_public", "forward", "causal", "stability", "gqa", "backward"],
    ),
    Mutant(
        name="max_starts_at_zero",
        cause=r"start at 0 instead of -inf",
        why="starts the running max at 0 instead of -inf: rows whose scores are all far below 0 underflow",
        edits=[("    m_i = tl.full([BLOCK_M], float(\"-inf\"), tl.float32)", "    m_i = tl.zeros([BLOCK_M], tl.float32)")],
        loses=["stability"],
    ),
    Mutant(
        name="tail_padded_with_zero",
        cause=r"keys past Nk in the last tile masked to -inf",
        why="masks the keys past Nk in the last tile with score 0 instead of -inf (causal runs hide it: the causal mask also covers those keys)",
        edits=[("            s = tl.where(cols[None, :] < N_K, s, float(\"-inf\"))",
                "            s = tl.where(cols[None, :] < N_K, s, 0.0)")],
        loses=["forward_public", "forward", "lse", "gqa", "backward"],
    ),
    Mutant(
        name="causal_top_left",
        cause=r"top-left",
        why="aligns the causal mask top-left (key j <= query i), as scaled_dot_product_attention does",
        edits=[("    return N_K - N_Q", "    return 0")],
        loses=["causal_public", "causal", "lse", "backward"],
    ),
    Mutant(
        name="lse_base2",
        cause=r"base-2 logsumexp",
        why="stores the base-2 logsumexp the kernel works in, without converting back to the natural log",
        edits=[("(m_i + tl.math.log2(l_safe)) * LN2", "(m_i + tl.math.log2(l_safe))")],
        loses=["forward_public", "causal_public", "lse", "backward"],
    ),
    Mutant(
        name="lse_unscaled",
        cause=r"SCALED scores",
        why="takes the max over raw scores q.k but the sum over scaled ones: lse = max(q.k) + log(l)",
        edits=[("(m_i + tl.math.log2(l_safe)) * LN2", "(m_i / qk_scale + tl.math.log2(l_safe) * LN2)")],
        loses=["forward_public", "causal_public", "lse", "backward"],
    ),
    Mutant(
        name="gqa_modulo",
        cause=r"h // \(Hq // Hkv\)",
        why="maps query head h to KV head h % Hkv instead of h // (Hq // Hkv)",
        edits=[("    return (bh // H_Q) * H_KV + (bh % H_Q) // (H_Q // H_KV)", "    return (bh // H_Q) * H_KV + (bh % H_Q) % H_KV")],
        loses=["gqa"],
    ),
    Mutant(
        name="dkdv_first_head_only",
        cause=r"SUMS over the \d+ query heads",
        why="dk and dv of a shared KV head take only its first query head instead of summing the group",
        edits=[("    for g in range(group):  # dK and dV of a shared KV head sum over its query heads",
                "    for g in range(1):")],
        loses=["gqa"],
    ),
    Mutant(
        name="fp16_accumulator",
        cause=r"accumulator .*float32",
        why="keeps the output accumulator in the input dtype (fp16) instead of fp32",
        edits=[("    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)", "    acc = tl.zeros([BLOCK_M, HEAD_DIM], Q.dtype.element_ty)"),
               ("        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)",
                "        acc = (acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)).to(v.dtype)")],
        loses=["stability"],
    ),
    Mutant(
        name="empty_row_nan",
        cause=r"sees no key.*exp\(-inf - -inf\)",
        why="subtracts the running max even while it is -inf: rows that see no key become NaN",
        edits=[("        m_safe = tl.where(m_new == float(\"-inf\"), 0.0, m_new)  # a row that has seen no key yet",
                "        m_safe = m_new")],
        loses=["causal_public", "causal", "backward"],
    ),
    Mutant(
        name="zero_scale_means_default",
        cause=r"`is None`",
        why="tests `if not sm_scale` instead of `if sm_scale is None`, so sm_scale=0 becomes 1/sqrt(D)",
        edits=[("    return 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)",
                "    return 1.0 / math.sqrt(head_dim) if not sm_scale else float(sm_scale)")],
        loses=["forward", "backward"],
    ),
    Mutant(
        name="dk_missing_scale",
        cause=r"the factor sm_scale is missing",
        why="forgets the factor sm_scale in dk",
        edits=[("(dk * sm_scale).to(DK.dtype.element_ty)", "dk.to(DK.dtype.element_ty)")],
        loses=["backward_public", "backward", "gqa"],
    ),
    Mutant(
        name="backward_without_causal_mask",
        cause=r"causal mask hides",
        why="masks the causal future in the dq kernel but forgets it in the dk/dv kernel",
        edits=[("            pt = tl.where(offs_n[:, None] <= rows[None, :] + _diagonal(N_Q, N_K), pt, 0.0)",
                "            pt = pt")],
        loses=["backward_public", "backward", "gqa"],
    ),
    Mutant(
        name="naive_torch_forward",
        cause=r"outside any kernel launch",
        why="computes the whole score matrix with a matmul: right numbers, none of the technique",
        edits=[(_LAUNCH, _NAIVE_TORCH)],
        loses=["structure"],
    ),
    Mutant(
        name="tiled_torch_forward",
        cause=r"outside any kernel launch",
        why="tiles the keys, but in a Python loop of torch ops rather than inside a Triton kernel",
        edits=[(_LAUNCH, _TILED_TORCH)],
        loses=["structure"],
    ),
    Mutant(
        name="all_heads_one_matmul",
        cause=r"outside any kernel launch",
        why="computes every head's scores in one flattened [B*H*Nq, B*H*Nk] matmul with a block mask",
        edits=[(_LAUNCH, _ALL_HEADS_TORCH)],
        loses=["structure"],
    ),
]

# The library's softmax through a name bound at import (issue "Trust II", item 4): the numbers are
# right, so only the forbidden-call guard takes the points away. Patching torch.softmax during the
# call missed the alias; the operator guard sees aten::_softmax.
_ALIAS_AT_IMPORT = ("LN2 = tl.constexpr(0.6931471805599453)  # ln(2)\n",
                    "LN2 = tl.constexpr(0.6931471805599453)  # ln(2)\n_SOFTMAX = torch.softmax\n")
_ALIASED_SOFTMAX = """    group = h_q // h_kv
    kk, vv = k.repeat_interleave(group, 1).float(), v.repeat_interleave(group, 1).float()
    s = q.float() @ kk.transpose(-1, -2) * scale
    if causal:
        rows, cols = torch.arange(n_q)[:, None], torch.arange(n_k)[None, :]
        s = s.masked_fill(cols > rows + n_k - n_q, float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    l = torch.exp(s - m).sum(-1, keepdim=True)
    o.copy_(torch.nan_to_num(_SOFTMAX(s, dim=-1), nan=0.0) @ vv)
    lse.copy_(torch.where(l > 0, m + torch.log(l), torch.full_like(l, float("inf")))[..., 0])
    return o, lse
"""

MUTANTS.append(Mutant(
    name="softmax_alias_bound_at_import",
    cause=r"outside any kernel launch",
    why="binds torch.softmax to another name at import and computes P with it",
    edits=[_ALIAS_AT_IMPORT, (_LAUNCH, _ALIASED_SOFTMAX)],
    loses=["forward", "causal", "gqa", "lse", "stability", "backward", "structure"],
))


# --------------------------------------------------------------------------------------------------
# Causal alignments the hand-picked shapes never met (issue "Right verdicts"): each is off by one key
# or one row only where the diagonal offset Nk - Nq is one more than a multiple of the tile width (64
# under the interpreter), a residue none of the hand-picked causal shapes has. Only the generated
# alignments meet them; tests/test_mask_spans.py proves it.

SPAN_MUTANTS = [
    Mutant(
        name="causal_key_loop_one_short",
        cause=r"skips a whole key tile",
        why="ends the causal loop over key tiles at start_m + BLOCK_M + Nk - Nq - 1: when the last row of a query "
            "tile has its diagonal key at the start of a key tile, that tile is never visited",
        edits=[("        hi = tl.minimum(tl.maximum(start_m + BLOCK_M + shift, 0), N_K)",
                "        hi = tl.minimum(tl.maximum(start_m + BLOCK_M + shift - 1, 0), N_K)")],
        loses=["causal", "lse", "backward"],  # lse: the skipped keys are missing from the rows' logsumexp too
    ),
    Mutant(
        name="dkdv_query_loop_one_row_late",
        cause=r"skips a whole query tile",
        why="starts the dk/dv kernel's causal loop over query tiles at the row after the first one that sees the "
            "key tile: when that row is the last of a query tile, the tile is skipped and its row is missing from "
            "dk and dv",
        edits=[("        lo = tl.minimum(tl.maximum(start_n - shift, 0), N_Q) // BLOCK_M * BLOCK_M",
                "        lo = tl.minimum(tl.maximum(start_n - shift + 1, 0), N_Q) // BLOCK_M * BLOCK_M")],
        loses=["backward"],
    ),
]
MUTANTS += SPAN_MUTANTS


# --------------------------------------------------------------------------------------------------
# No Triton at all (issue "Trust III"): the forward pass in numpy, which the dispatcher never sees (it
# earned every gradable point before the kernel rule), and the backward pass in torch on the host. The
# numbers are right; only the kernel rule takes the points away.

_NUMPY_FORWARD = """    import numpy as np

    group = h_q // h_kv
    qq = q.detach().cpu().numpy().astype(np.float64)
    kk = np.repeat(k.detach().cpu().numpy().astype(np.float64), group, axis=1)
    vv = np.repeat(v.detach().cpu().numpy().astype(np.float64), group, axis=1)
    s = qq @ kk.transpose(0, 1, 3, 2) * scale
    if causal:
        rows, cols = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
        s = np.where(cols > rows + n_k - n_q, -np.inf, s)
    m = s.max(-1, keepdims=True)
    m = np.where(m == -np.inf, 0.0, m)
    e = np.exp(s - m)
    l = e.sum(-1, keepdims=True)
    o.copy_(torch.from_numpy(e @ vv / np.where(l > 0, l, 1.0)))
    lse.copy_(torch.from_numpy(np.where(l > 0, m + np.log(l), np.inf)[..., 0]))
    return o, lse
"""

_KERNEL_BACKWARD = """    kv_cfg, q_cfg = _bwd_blocks(head_dim, q.dtype)
    precision = _precision(q.dtype)
    delta = torch.empty_like(lse)
    _bwd_delta_kernel[(triton.cdiv(n_q, DELTA_ROWS), batch * h_q)](o, do, delta, n_q, HEAD_DIM=head_dim,
                                                                  BLOCK_M=DELTA_ROWS)
    _bwd_dkdv_kernel[(triton.cdiv(n_k, kv_cfg["BLOCK_N"]), batch * h_kv)](
        q, k, v, do, lse, delta, dk, dv, scale, scale * LOG2E.value, n_q, n_k, h_q, h_kv,
        HEAD_DIM=head_dim, CAUSAL=bool(causal), PRECISION=precision, **kv_cfg)
    _bwd_dq_kernel[(triton.cdiv(n_q, q_cfg["BLOCK_M"]), batch * h_q)](
        q, k, v, do, lse, delta, dq, scale, scale * LOG2E.value, n_q, n_k, h_q, h_kv,
        HEAD_DIM=head_dim, CAUSAL=bool(causal), PRECISION=precision, **q_cfg)
    return dq, dk, dv
"""

_TORCH_BACKWARD = """    group = h_q // h_kv
    kk, vv = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    s = q.float() @ kk.transpose(-1, -2) * scale
    if causal:
        rows, cols = torch.arange(n_q)[:, None], torch.arange(n_k)[None, :]
        s = s.masked_fill(cols > rows + n_k - n_q, float("-inf"))
    p = torch.exp(s - lse[..., None])
    dof = do.float()
    dp = dof @ vv.transpose(-1, -2)
    ds = p * (dp - (dof * o.float()).sum(-1, keepdim=True))
    dq.copy_(scale * ds @ kk)
    dk.copy_((scale * ds.transpose(-1, -2) @ q.float()).view(batch, h_kv, group, n_k, head_dim).sum(2))
    dv.copy_((p.transpose(-1, -2) @ dof).view(batch, h_kv, group, n_k, head_dim).sum(2))
    return dq, dk, dv
"""

MUTANTS += [
    Mutant(
        name="numpy_forward",
        cause=r"Tensor\.numpy\(\)",
        why="reads q, k, v back with .numpy() and computes the whole Nq x Nk softmax in numpy: no Triton kernel, "
            "and nothing the dispatcher sees but copies",
        edits=[(_LAUNCH, _NUMPY_FORWARD)],
        loses=["forward_public", "causal_public", "forward", "causal", "lse", "stability", "structure"],
    ),
    Mutant(
        name="torch_backward",
        cause=r"outside any kernel launch",
        why="keeps the forward kernel but computes the gradients with torch on the host, recomputing P as a "
            "full matrix from lse",
        edits=[(_KERNEL_BACKWARD, _TORCH_BACKWARD)],
        loses=["backward_public", "backward", "gqa", "structure"],
    ),
]

# Mistakes that only a GPU can see (see tests/known_wrong/online_softmax.py): right answers under the CPU's
# interpreter, losses on CUDA, which `grader gpu-check` proves.
MUTANTS += [
    Mutant(
        "tf32_for_float32",
        "I let tl.dot use TF32 for float32 inputs too: much faster, and the CPU tests pass",
        [('    return "ieee" if dtype == torch.float32 else "tf32"\n', '    return "tf32"\n')],
        cause=r"ieee|TF32",
        loses=["cuda_bf16"],
    ),
    Mutant(
        "forward_tiny_tiles",
        "I use 16 x 16 tiles in the forward kernel, the smallest tl.dot takes, so that nothing spills",
        [("    if head_dim <= 64:\n        return dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3)\n"
          "    return dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)\n",
          "    return dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)\n")],
        cause=r"speed|SDPA|TFLOP",
        loses=["forward_speed"],
    ),
]


# --------------------------------------------------------------------------------------------------
# The signature (issue "Right verdicts II"): right numbers, the technique skipped. Each keeps the correctness
# checks and loses only the check that observes the signature.

_PROBS_KERNEL = '''

@triton.jit
def _probs_kernel(Q, K, LSE, P, qk_scale, N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    # One tile of one head's P = exp(scale q k^T - lse), written to memory for the backward pass.
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=offs_m[:, None] < N_Q, other=0.0)
    kt = tl.load(K + offs_n[None, :] * HEAD_DIM + offs_d[:, None], mask=offs_n[None, :] < N_K, other=0.0)
    lse = tl.load(LSE + offs_m, mask=offs_m < N_Q, other=float("inf")) * LOG2E
    p = tl.math.exp2(tl.dot(q, kt) * qk_scale - lse[:, None])
    tl.store(P + offs_m[:, None] * N_K + offs_n[None, :], p, mask=(offs_m[:, None] < N_Q) & (offs_n[None, :] < N_K))


def _probabilities(q, k, lse, sm_scale):
    """Each head's P as one flat fp32 buffer of Nq * Nk elements per (batch, query head)."""
    q, k = q.contiguous(), k.contiguous()
    batch, h_q, n_q, head_dim = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    probs = []
    for b in range(batch):
        for h in range(h_q):
            p = torch.empty(n_q * n_k, dtype=torch.float32, device=q.device)
            _probs_kernel[(triton.cdiv(n_q, 64), triton.cdiv(n_k, 64))](
                q[b, h], k[b, h // (h_q // h_kv)], lse[b, h], p, _scale(sm_scale, head_dim) * LOG2E.value, n_q, n_k,
                HEAD_DIM=head_dim, BLOCK_M=64, BLOCK_N=64)
            probs.append(p)
    return probs


# --------------------------------------------------------------------------------------------------
# Autograd
'''
_AUTOGRAD_HEADER = "\n\n# --------------------------------------------------------------------------------------------------\n# Autograd\n"
_SAVE = "        ctx.save_for_backward(q, k, v, o, lse)  # O(N) memory: lse replaces the N x N matrix P\n"
_UNPACK = "        q, k, v, o, lse = ctx.saved_tensors\n"

MUTANTS += [
    Mutant(
        name="one_tile_forward",
        cause=r"does not fit",
        why="the textbook kernel: the whole key range is one tile (BLOCK_N = next_power_of_2(Nk)), so its loop runs "
            "once; right numbers under the interpreter, where a tile may be any width, but on a GPU a program cannot "
            "hold 8,192 keys",
        edits=[("    cfg = _blocks(head_dim, q.dtype)\n",
                "    cfg = _blocks(head_dim, q.dtype)\n    cfg[\"BLOCK_N\"] = triton.next_power_of_2(n_k)  # every key in one tile\n")],
        loses=["tiled_kernel"],
        keeps=["forward_public", "causal_public", "forward", "causal", "lse", "stability", "structure"],
    ),
    Mutant(
        name="one_tile_dq",
        cause=r"does not fit",
        why="the dq kernel holds every key in one tile (BLOCK_N = next_power_of_2(Nk)) instead of looping over key "
            "tiles: right gradients under the interpreter, but no GPU program holds 8,192 keys",
        edits=[("    kv_cfg, q_cfg = _bwd_blocks(head_dim, q.dtype)\n",
                "    kv_cfg, q_cfg = _bwd_blocks(head_dim, q.dtype)\n"
                "    q_cfg = dict(q_cfg, BLOCK_N=triton.next_power_of_2(n_k))  # every key in one tile\n")],
        loses=["tiled_kernel"],
        keeps=["backward_public", "backward"],
    ),
    Mutant(
        name="saves_probabilities",
        cause=r"saving P",
        why="FlashAttention.forward also writes each head's P (one flat fp32 buffer per head, which no guard on "
            "Nq x Nk shapes sees) and saves it for the backward pass, as autograd through the textbook formula does",
        edits=[(_AUTOGRAD_HEADER, _PROBS_KERNEL),
               (_SAVE, "        ctx.save_for_backward(q, k, v, o, lse, *_probabilities(q, k, lse, sm_scale))\n"),
               (_UNPACK, "        q, k, v, o, lse = ctx.saved_tensors[:5]\n")],
        loses=["saved_for_backward"],
        keeps=["backward_public", "backward", "gqa", "structure"],
    ),
    Mutant(
        name="keeps_probabilities_on_ctx",
        cause=r"kept on ctx",
        why="FlashAttention.forward writes each head's P and keeps it on ctx (ctx.probs) rather than saving it with "
            "save_for_backward: autograd's saved-tensor hooks never see it",
        edits=[(_AUTOGRAD_HEADER, _PROBS_KERNEL),
               (_SAVE, _SAVE + "        ctx.probs = _probabilities(q, k, lse, sm_scale)\n")],
        loses=["saved_for_backward"],
    ),
]

# Contract clauses the hidden tests newly draw (issue "Right verdicts II"): the ValueErrors of check_inputs beyond
# the head dim, and strided q, k, v, o in the backward pass.
MUTANTS += [
    Mutant(
        name="forward_checks_only_the_head_dim",
        cause=r"Call check_inputs",
        why="validates the head dim itself (the one error the README names) instead of calling check_inputs, so a "
            "forward with Hq not a multiple of Hkv, mismatched shapes or dtypes runs and returns numbers",
        edits=[("    check_inputs(q, k, v)\n    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()\n",
                "    if q.shape[-1] not in SUPPORTED_HEAD_DIMS:\n"
                "        raise ValueError(f\"head dim must be one of {SUPPORTED_HEAD_DIMS}, found {q.shape[-1]}\")\n"
                "    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()\n")],
        loses=["forward"],
    ),
    Mutant(
        name="backward_assumes_contiguous_inputs",
        cause=r"any strides",
        why="makes dO contiguous in the backward pass (the autograd step can hand a strided one) but passes q, k, v "
            "and o to the kernels as they come, which address them as contiguous [B, H, N, D]",
        edits=[("    q, k, v, o, do = (t.contiguous() for t in (q, k, v, o, do))\n", "    do = do.contiguous()\n")],
        loses=["backward"],
    ),
]
