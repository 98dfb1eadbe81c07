"""Hidden checks for FlashAttention.

Every input derives from the run's seed (the `rng` fixture). The oracle is the textbook formula,
softmax(q k^T * scale) v with the mask built as a full matrix, in float64; gradients are autograd
through it. Tolerances follow flash-attn's own tests: the error against the float64 oracle may be
at most twice the error of the same naive formula computed in the input's dtype (scores and P
rounded to it), plus a small floor relative to the output's size.

Without CUDA the kernels run under TRITON_INTERPRET=1 on small shapes, in fp16 and fp32 (the
interpreter cannot do bf16 tl.dot, triton-lang/triton#11584); bf16, realistic sizes, memory and
speed run on CUDA only. The oracles are in oracle.py; the speed checks' shapes, FLOPs and SDPA baselines
are grader/cases/flash_attention.py's, shared with the benchmark.

The technique's signature, and the checks that observe it on the CPU:

- forward: the tiles a program holds and its loop over key tiles. Under the interpreter a program may hold a tile of
  any width, so `tiled_kernel` compiles every launch for a real GPU (grader.kernelmodel: sm_90, no GPU needed), as
  launched, at key ranges (and, for the backward pass, query ranges) of 8,192: a program that holds the whole range
  as one tile cannot live in a GPU's registers (K and V of 8,192 keys at D = 64 are 2 MiB, against 256 KiB of
  registers a block).
- backward: what the forward pass leaves for it (q, k, v, o, lse: O(N D) bytes, never the Nq x Nk probabilities)
  and the recomputation of P tile by tile. `saved_for_backward` measures the bytes autograd saved, the bytes still
  alive between the passes among those the forward wrote, and the bytes the backward adds, at Nq = Nk = 1,024 with
  D = 16 (one head's P in fp16 is 2 MiB, the allowances 272 KiB and 656 KiB).

Contract clauses (README.md, "The contract") and the tests that draw them:

- q [B, Hq, Nq, D], k, v [B, Hkv, Nk, D]; o q's shape and dtype; lse fp32 [B, Hq, Nq]:
    every check_forward call (test_forward, test_causal, test_gqa_forward, ...), test_generated_causal_alignments
- GQA, query head h reads KV head h // (Hq // Hkv): Hkv = Hq (most tests), Hkv = 1 and ratios 3 and 6:
    test_gqa_forward, test_gqa_backward; Hq = 2 over Hkv = 1 or 2 in the generated alignments, over Hkv = 1 in
    test_backward_function_with_exact_o_and_lse and the structure tests
- any strides: forward: test_forward_strided_inputs (transposed [B, N, H, D] views, every other feature, k and v
    from one packed kv tensor); backward: test_backward_function_with_exact_o_and_lse (strided dO),
    test_backward_function_with_strided_inputs (q, k, v in the forward's three layouts, o and dO transposed)
- D in {16, 32, 64, 128}: FORWARD_CASES, BACKWARD_CASES; any other D raises ValueError:
    test_forward_rejects_unsupported_head_dims (8, 48, 256)
- the other ValueErrors (check_inputs): not 4-D, k and v of different shapes, batch or D that differ, Hq not a
    multiple of Hkv, dtypes outside fp16 / bf16 / fp32 or not shared: test_forward_rejects_inputs_outside_the_contract
- fp16 and fp32: every CPU test; bf16: test_bf16, test_realistic_sizes (CUDA only; the interpreter's bf16 tl.dot is
    wrong, triton-lang/triton#11584)
- Nq, Nk any positive lengths, not multiples of a tile, Nq != Nk (1 to 300, and 8,192): FORWARD_CASES, CAUSAL_CASES,
    BACKWARD_CASES, the generated alignments, test_tiled_forward_fits_a_gpu, test_tiled_backward_fits_a_gpu
- sm_scale None means 1 / sqrt(D) (most tests); 0, negative, large used as given: test_forward_sm_scale,
    test_lse_is_the_logsumexp_of_the_scaled_scores, test_backward_sm_scale
- fp32 state whatever the dtype: test_long_fp16_rows_need_an_fp32_accumulator, test_scores_shifted_by_minus_1e4;
    fp32 at full precision (ieee, not TF32): test_realistic_sizes (CUDA only; the interpreter ignores it)
- causal bottom-right, j <= i + Nk - Nq: test_causal (Nq < Nk, =, >), test_causal_decode_row_sees_every_key,
    test_generated_causal_alignments (+ _lse, _backward)
- lse the natural-log logsumexp of the scaled, masked scores: test_lse_is_the_logsumexp_of_the_scaled_scores,
    test_generated_causal_alignments_lse, check_forward(check_lse=True)
- rows that see no key: o = 0 and lse = +inf: test_causal_rows_before_the_first_key_are_zero,
    test_lse_is_plus_inf_for_rows_that_see_no_key, the generated alignments; dq = 0 there: test_backward,
    test_generated_causal_alignments_backward
- backward: dq, dk, dv with their inputs' dtypes and shapes, the group's sums for dk, dv: test_backward,
    test_gqa_backward, the backward function tests
- FlashAttention.apply(q, k, v, causal, sm_scale) -> o, differentiable: every training_step (test_backward, ...)
- never the Nq x Nk matrix, no library softmax or attention: test_forward_never_builds_the_score_matrix,
    test_backward_never_builds_the_score_matrix (and the forbidden-call guard in every call)
- the work in Triton kernels: every test (the kernel rule); test_kernels_write_every_output (the launches),
    test_forward_tile_loop_runs_inside_the_kernel (the host's operations do not grow with the lengths)
- the tiles a program holds, the loop over key (and query) tiles: test_tiled_forward_fits_a_gpu,
    test_tiled_backward_fits_a_gpu (`tiled_kernel`)
- saved for the backward pass: q, k, v, o and lse, never P; P recomputed: test_saved_for_backward_is_linear
    (`saved_for_backward`)
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from grader import blocks, kernelmodel, rehearsal, speed, testing
from grader.cases import flash_attention as cases
from grader.harness.kernel_rule import KERNELS_ONLY
from grader.hidden.flash_attention.oracle import grads_from_lse, naive_attention, naive_grads, scores
from grader.testing import is_close, mismatches, show

INF = float("inf")
FP16, FP32, BF16 = torch.float16, torch.float32, torch.bfloat16
FLOOR = {FP32: 5e-6, FP16: 5e-4, BF16: 4e-3}  # times max(|reference|, 1)
DRIVERS = "grader.support.flash_attention"


# Each softmax name stands for all of the softmax's math at the dispatcher (grader.harness.opfamilies.NORMALISER).
ATTENTION_FORBID = [
    "torch.nn.functional.scaled_dot_product_attention",
    "torch.softmax",
    "torch.nn.functional.softmax",
    "torch.Tensor.softmax",
    "torch.special.softmax",
    "torch.logsumexp",
]
WHY = "FlashAttention computes the softmax itself, one tile at a time"


@pytest.fixture(scope="module")
def fa(student):
    """Every function of this exercise is a Triton kernel's host code: all calls run under the kernel rule
    (outside a launch, only allocation, views, copies and casts; no values read back to the host)."""
    return student.load("flash_attention", forbid=[*ATTENTION_FORBID, KERNELS_ONLY], forbid_why=WHY)


@pytest.fixture(scope="module")
def fa_timed(student):
    """For the speed checks' timing loop, which makes fresh inputs beside the call: no kernel rule (each speed
    test first calls the function under it)."""
    return student.load("flash_attention", forbid=ATTENTION_FORBID, forbid_why=WHY)


# --------------------------------------------------------------------------------------------------
# Comparisons (the oracles are in oracle.py)


def assert_close(got, ref, low, what: str, hint="") -> None:
    """|got - ref| <= 2 |low - ref| + floor, everywhere; `low` is the naive formula in got's dtype. `hint` may be a
    function of the tolerance, called only on failure (a diagnosis read from the values)."""
    base = float((low.detach().cpu().double() - ref).abs().max())
    tol = 2 * base + FLOOR[got.dtype] * max(float(ref.abs().max()), 1.0)
    testing.assert_close(
        got,
        ref,
        atol=tol,
        what=f"{what} [batch, head, row, col]",
        hint=lambda _: (f"The naive formula computed in {str(got.dtype)[6:]} errs by {base:.3g}. "
                        f"{hint(tol) if callable(hint) else hint}"),
    )


# --------------------------------------------------------------------------------------------------
# Diagnoses: what the values of a wrong answer say about its cause (read from them, never from a solution)


def shrunk_rows(o, ref, atol):
    """The first wrong row's factor c when every wrong row of o is c * (the expected row) with c < 1, else None:
    the row's weights sum to more than 1, so l holds terms the accumulator does not."""
    got, want = o.detach().cpu().double().flatten(0, -2), ref.detach().cpu().double().flatten(0, -2)
    if not torch.isfinite(got).all():
        return None
    wrong = mismatches(got, want, atol=atol).any(-1) & want.ne(0).any(-1)
    if not wrong.any():
        return None
    g, r = got[wrong], want[wrong]
    c = (g * r).sum(-1) / (r * r).sum(-1)
    row_tol = atol + 1e-3 * r.abs().amax(-1, keepdim=True)  # relative to each row's largest value
    if not bool(mismatches(g, c[:, None] * r, atol=row_tol).any()) and bool((c < 1 - 1e-2).all()):
        return float(c[0])
    return None


def forward_diagnosis(o, lse, ref_o, ref_lse, n_k, atol, hint=""):
    """The cause a wrong o points to (the test's `hint` when its values point to none): rows that see no key but hold
    NaN, rows scaled down (l counts keys it must not), or a finite o wrong beside a right lse (the accumulator, said
    before the test's hint)."""
    got = o.detach().cpu().double()
    empty = (ref_lse == INF)[..., None].expand_as(got)
    if bool((empty & ~torch.isfinite(got)).any()):
        row = int((empty & ~torch.isfinite(got)).any(-1).nonzero()[0][-1])
        return (f"Row {row} sees no key, and its o is not finite: a row that sees no key must give o = 0. NaN comes "
                "from exp(-inf - -inf) (guard the running max while it is still -inf: subtract 0) or from 0 / 0 "
                "(divide by l only where l > 0)")
    c = shrunk_rows(o, ref_o, atol)
    if c is not None:
        one_tile = (f" With Nk = {n_k} every key fits in one tile, so the max never grows: nothing is rescaled here."
                    if n_k <= 16 else "")
        return (f"Every wrong row of o is the expected row times a factor below 1 ({c:.3g} in the first): the "
                "weights sum to more than 1, so l holds terms the output does not. Are the keys past Nk in the last "
                "tile masked to -inf? A score of 0 there still adds exp(0 - m) to l." + one_tile)
    lse = lse.detach().cpu().double()
    finite = torch.isfinite(ref_lse)
    if (bool(torch.isfinite(got).all()) and torch.equal(lse == INF, ref_lse == INF)
            and is_close(lse[finite], ref_lse[finite], atol=1e-4)):
        return ("lse is right, so the running max m and the sum l are: the output accumulator is what goes wrong. "
                f"Is it multiplied by exp(m_old - m_new) whenever the max grows, as l is? {hint}")
    return hint


def make_qkv(rng, b, hq, hkv, n_q, n_k, d, dtype, device="cpu", scale=1.0):
    q = torch.randn(b, hq, n_q, d, generator=rng) * scale
    k = torch.randn(b, hkv, n_k, d, generator=rng) * scale
    v = torch.randn(b, hkv, n_k, d, generator=rng)
    return [t.to(device=device, dtype=dtype) for t in (q, k, v)]


def check_forward(fa, q, k, v, causal=False, sm_scale=None, what="o", hint="", check_lse=False):
    kwargs = {} if sm_scale is None else {"sm_scale": sm_scale}
    o, lse = fa.flash_attention_forward(q, k, v, causal=causal, **kwargs)
    assert o.dtype == q.dtype, f"{what}: o must have q's dtype {q.dtype}, found {o.dtype}"
    assert lse.dtype == FP32 and tuple(lse.shape) == tuple(q.shape[:3]), (
        f"lse must be float32 {tuple(q.shape[:3])}, found {lse.dtype} {tuple(lse.shape)}"
    )
    qc, kc, vc = q.cpu(), k.cpu(), v.cpu()
    ref_o, ref_lse = naive_attention(qc, kc, vc, causal, sm_scale)
    low_o, _ = naive_attention(qc, kc, vc, causal, sm_scale, dtype=q.dtype)
    assert_close(o, ref_o, low_o, what, lambda tol: forward_diagnosis(o, lse, ref_o, ref_lse, k.shape[2], tol, hint))
    if check_lse:
        assert_lse(lse, ref_lse, f"lse, beside {what}")
    return o, lse


def assert_lse(lse, ref_lse, what="lse"):
    lse = lse.detach().cpu().double()
    inf_rows = ref_lse == INF
    assert torch.equal(lse == INF, inf_rows), (
        f"{what}: +inf exactly on the {int(inf_rows.sum())} rows that see no key, found +inf on {int((lse == INF).sum())} "
        "rows (a row that sees no key has o = 0 and lse = +inf)"
    )
    finite = ref_lse[~inf_rows]
    tol = 2e-5 + 1e-6 * float(finite.abs().max()) if finite.numel() else 0.0
    testing.assert_close(
        lse,
        ref_lse,
        atol=tol,
        what=f"{what} [batch, head, row]",
        hint=lambda _: lse_hint(lse, ref_lse),
    )


def lse_hint(lse, ref_lse):
    """Base 2 left unconverted, told from the values (the base-2 lse is lse / ln 2), else the general reminder."""
    ok = torch.isfinite(ref_lse) & torch.isfinite(lse) & mismatches(ref_lse, torch.zeros_like(ref_lse), atol=1e-3)
    if ok.any() and is_close(lse[ok] * math.log(2), ref_lse[ok], atol=1e-4, rtol=1e-4):
        return ("Your lse is the expected one times 1/ln(2) = 1.4427: the base-2 logsumexp. Convert it back to the "
                "natural log (multiply by ln 2)")
    return ("lse is the NATURAL-log logsumexp of the scaled, masked scores: m + log(l) with m the row max of "
            "scale * q k^T, the same SCALED scores l sums")


# --------------------------------------------------------------------------------------------------
# forward


FORWARD_CASES = [  # (B, Hq, Hkv, Nq, Nk, D, dtype)
    (1, 2, 2, 1, 1, 64, FP32),
    (2, 2, 2, 17, 17, 32, FP16),
    (1, 1, 1, 127, 127, 128, FP32),
    (1, 2, 2, 129, 129, 16, FP16),
    (1, 2, 2, 1, 5, 64, FP16),
    (2, 1, 1, 5, 2, 32, FP32),
    (1, 2, 2, 1, 129, 128, FP16),
    (1, 2, 2, 17, 300, 16, FP32),
    (1, 1, 1, 17, 129, 64, FP32),
    (1, 2, 2, 300, 17, 32, FP16),
    (1, 1, 1, 1, 300, 64, FP32),
    (1, 2, 2, 128, 64, 32, FP32),
]


def case_id(case) -> str:
    b, hq, hkv, n_q, n_k, d, dtype = case[:7]
    return f"B{b}-H{hq}x{hkv}-{n_q}x{n_k}-D{d}-{str(dtype)[6:]}" + ("".join(f"-{c}" for c in case[7:]))


@pytest.mark.check("forward")
@pytest.mark.parametrize("case", FORWARD_CASES, ids=case_id)
def test_forward(fa, rng, device, case):
    b, hq, hkv, n_q, n_k, d, dtype = case
    q, k, v = make_qkv(rng, b, hq, hkv, n_q, n_k, d, dtype, device)
    check_forward(
        fa,
        q,
        k,
        v,
        what=f"o for {case_id(case)}",
        hint="Are all key tiles visited (Nk may be far past one tile and not a multiple of it), and "
        "is the running output rescaled by exp(m_old - m_new) whenever the max grows?",
    )


@pytest.mark.check("forward")
@pytest.mark.parametrize("sm_scale", [0.0, 0.3, -0.25, 2.0])
def test_forward_sm_scale(fa, rng, device, sm_scale):
    q, k, v = make_qkv(rng, 1, 2, 2, 33, 70, 32, FP32, device)
    check_forward(
        fa,
        q,
        k,
        v,
        sm_scale=sm_scale,
        what=f"o with sm_scale={sm_scale}",
        hint="sm_scale=None means 1/sqrt(D); any other value, 0 included, is used as given "
        "(test `is None`, not truthiness)",
    )


def strided_qkv(rng, device, layout: str, n_q: int = 40, n_k: int = 70, d: int = 32, dtype=FP32):
    """q [1, 2, n_q, d], k, v [1, 2, n_k, d] as views that are not contiguous: "transposed" ([B, N, H, D] tensors
    viewed as [B, H, N, D], as models hold them), "every other feature" (a feature stride of 2), "packed kv" (k and
    v two slices of one [B, N, 2, H, D] tensor)."""
    if layout == "transposed":
        q, k, v = (torch.randn(1, n, 2, d, generator=rng).transpose(1, 2) for n in (n_q, n_k, n_k))
    elif layout == "every other feature":
        q, k, v = (torch.randn(1, 2, n, 2 * d, generator=rng)[..., ::2] for n in (n_q, n_k, n_k))
    else:
        q = torch.randn(1, n_q, 2, d, generator=rng).transpose(1, 2)
        kv = torch.randn(1, n_k, 2, 2, d, generator=rng)
        k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
    return [t.to(device=device, dtype=dtype) for t in (q, k, v)]  # .to keeps the strides


STRIDED_LAYOUTS = ["transposed", "every other feature", "packed kv"]


@pytest.mark.check("forward")
@pytest.mark.parametrize("layout", STRIDED_LAYOUTS)
def test_forward_strided_inputs(fa, rng, device, layout):
    q, k, v = strided_qkv(rng, device, layout)
    check_forward(
        fa,
        q,
        k,
        v,
        what=f"o for {layout} q, k, v (strides {q.stride()}, {k.stride()}, {v.stride()})",
        hint="q, k and v may have any strides: address them with their strides, or make them contiguous first",
    )


BAD_INPUTS = {  # what check_inputs refuses (README.md, "The contract"), as (q, k, v) shapes and dtypes
    "3-D q": (((2, 4, 16), FP32), ((1, 2, 3, 16), FP32), ((1, 2, 3, 16), FP32)),
    "k and v of different lengths": (((1, 2, 4, 16), FP32), ((1, 2, 3, 16), FP32), ((1, 2, 5, 16), FP32)),
    "q and k of different batch sizes": (((2, 2, 4, 16), FP32), ((1, 2, 3, 16), FP32), ((1, 2, 3, 16), FP32)),
    "q and k of different head dims": (((1, 2, 4, 32), FP32), ((1, 2, 3, 16), FP32), ((1, 2, 3, 16), FP32)),
    "Hq = 3 query heads over Hkv = 2": (((1, 3, 4, 16), FP32), ((1, 2, 3, 16), FP32), ((1, 2, 3, 16), FP32)),
    "float64 inputs": (((1, 2, 4, 16), torch.float64), ((1, 2, 3, 16), torch.float64), ((1, 2, 3, 16), torch.float64)),
    "fp16 q with fp32 k and v": (((1, 2, 4, 16), FP16), ((1, 2, 3, 16), FP32), ((1, 2, 3, 16), FP32)),
}


@pytest.mark.check("forward")
@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_forward_rejects_inputs_outside_the_contract(fa, rng, device, case):
    # Scored only beside a working kernel, as the head-dim check below.
    check_forward(fa, *make_qkv(rng, 1, 2, 2, 4, 3, 16, FP32, device), what="o for a 4 x 3 problem, D = 16")
    q, k, v = (torch.zeros(shape, dtype=dtype, device=device) for shape, dtype in BAD_INPUTS[case])
    try:
        fa.flash_attention_forward(q, k, v)
    except ValueError:
        return
    raise AssertionError(
        f"flash_attention_forward returned for {case} (q {str(q.dtype)[6:]} {tuple(q.shape)}, k {str(k.dtype)[6:]} "
        f"{tuple(k.shape)}, v {str(v.dtype)[6:]} {tuple(v.shape)}): inputs outside the contract raise ValueError. "
        "Call check_inputs(q, k, v) (given) before anything else"
    )


@pytest.mark.check("forward")
@pytest.mark.parametrize("head_dim", [8, 48, 256])
def test_forward_rejects_unsupported_head_dims(fa, rng, device, head_dim):
    # The host code's one duty of its own; scored only beside a working kernel (no test of a Triton
    # contract passes without one).
    check_forward(fa, *make_qkv(rng, 1, 1, 1, 4, 3, 16, FP32, device), what="o for a 4 x 3 problem, D = 16")
    q = torch.zeros(1, 1, 4, head_dim, device=device)
    with pytest.raises(ValueError):
        fa.flash_attention_forward(q, q, q)


# --------------------------------------------------------------------------------------------------
# causal


CAUSAL_CASES = [  # (B, Hq, Hkv, Nq, Nk, D, dtype)
    (1, 2, 2, 17, 17, 32, FP32),
    (1, 2, 2, 127, 129, 64, FP16),
    (1, 2, 2, 129, 127, 16, FP32),
    (1, 1, 1, 1, 5, 64, FP32),
    (1, 1, 1, 5, 2, 32, FP16),
    (1, 2, 2, 1, 300, 128, FP16),
    (1, 2, 2, 17, 300, 64, FP32),
    (1, 1, 1, 300, 300, 32, FP16),
    (2, 2, 2, 64, 128, 16, FP32),
    (1, 1, 1, 300, 40, 64, FP32),
]


@pytest.mark.check("causal")
@pytest.mark.parametrize("case", CAUSAL_CASES, ids=case_id)
def test_causal(fa, rng, device, case):
    b, hq, hkv, n_q, n_k, d, dtype = case
    q, k, v = make_qkv(rng, b, hq, hkv, n_q, n_k, d, dtype, device)
    check_forward(
        fa,
        q,
        k,
        v,
        causal=True,
        what=f"causal o for {case_id(case)}",
        hint="The mask is aligned bottom-right: query i sees key j iff j <= i + Nk - Nq (not j <= i, "
        "which is scaled_dot_product_attention's top-left convention). Rows that see no key give 0.",
    )


@pytest.mark.check("causal")
@pytest.mark.parametrize("n_k", [5, 129])
def test_causal_decode_row_sees_every_key(fa, rng, device, n_k):
    q, k, v = make_qkv(rng, 1, 2, 2, 1, n_k, 64, FP32, device)
    o_causal, _ = fa.flash_attention_forward(q, k, v, causal=True)
    ref, _ = naive_attention(q.cpu(), k.cpu(), v.cpu(), causal=False)
    testing.assert_close(
        o_causal,
        ref,
        atol=1e-5,
        what=f"causal o with Nq = 1 and Nk = {n_k}",
        hint=(
            f"With Nq = 1 (decoding one token against a KV cache of {n_k}), the causal output must equal the "
            "non-causal one: the query sits at the last position and sees every key"
        ),
    )


@pytest.mark.check("causal")
def test_causal_rows_before_the_first_key_are_zero(fa, rng, device):
    q, k, v = make_qkv(rng, 1, 2, 2, 129, 17, 32, FP16, device)
    o, _ = fa.flash_attention_forward(q, k, v, causal=True)
    o = o.cpu()
    assert not torch.isnan(o).any(), (
        "o has NaN: with Nq = 129 and Nk = 17 the first 112 rows see no key. Guard the running max: when it is "
        "still -inf, subtract 0 (exp(-inf - -inf) is NaN), and divide by l only where l > 0"
    )
    first = o[:, :, :112]
    assert torch.equal(first, torch.zeros_like(first)), (
        f"rows 0..111 see no key and must be exactly 0, found max |o| = {float(first.abs().max()):.3g}"
    )


# --------------------------------------------------------------------------------------------------
# grouped-query attention


@pytest.mark.check("gqa")
@pytest.mark.parametrize("hkv,causal,dtype", [(2, False, FP32), (1, True, FP16), (2, True, FP16), (1, False, FP32)])
def test_gqa_forward(fa, rng, device, hkv, causal, dtype):
    q, k, v = make_qkv(rng, 2, 6, hkv, 33, 77, 32, dtype, device)
    check_forward(
        fa,
        q,
        k,
        v,
        causal=causal,
        what=f"o with Hq = 6, Hkv = {hkv}",
        hint=f"query head h must read KV head h // (Hq // Hkv) = h // {6 // hkv} (heads 0..2 share KV head "
        "0 when Hkv = 2), in every batch element",
    )


@pytest.mark.check("gqa")
@pytest.mark.parametrize("hkv,causal,dtype", [(2, True, FP32), (1, False, FP16)])
def test_gqa_backward(student, fa, rng, device, hkv, causal, dtype):
    q, k, v = make_qkv(rng, 1, 6, hkv, 40, 70, 16, dtype, device)
    do = torch.randn(q.shape, generator=rng).to(device=device, dtype=dtype)
    check_training_step(
        student,
        fa,
        q,
        k,
        v,
        do,
        causal,
        None,
        f"Hq = 6, Hkv = {hkv}",
        hint=f"dk and dv of a KV head are the SUMS over the {6 // hkv} query heads that read it",
    )


# --------------------------------------------------------------------------------------------------
# lse


LSE_CASES = [  # (Nq, Nk, causal, sm_scale, dtype)
    (45, 150, False, None, FP32),
    (45, 150, True, None, FP16),
    (17, 300, False, 0.5, FP16),
    (129, 17, True, 1.7, FP32),
    (1, 129, True, None, FP32),
]


@pytest.mark.check("lse")
@pytest.mark.parametrize("n_q,n_k,causal,sm_scale,dtype", LSE_CASES)
def test_lse_is_the_logsumexp_of_the_scaled_scores(fa, rng, device, n_q, n_k, causal, sm_scale, dtype):
    q, k, v = make_qkv(rng, 1, 2, 2, n_q, n_k, 64, dtype, device)
    kwargs = {} if sm_scale is None else {"sm_scale": sm_scale}
    _, lse = fa.flash_attention_forward(q, k, v, causal=causal, **kwargs)
    assert lse.dtype == FP32, f"lse must be float32, found {lse.dtype}"
    want = torch.logsumexp(scores(q.cpu(), k.cpu(), causal, sm_scale), dim=-1)
    want = torch.where(want == -INF, INF, want)  # the contract's convention for rows that see no key
    assert_lse(lse, want, f"lse for Nq x Nk = {n_q} x {n_k} (causal={causal}, sm_scale={sm_scale})")


@pytest.mark.check("lse")
def test_lse_is_plus_inf_for_rows_that_see_no_key(fa, rng, device):
    q, k, v = make_qkv(rng, 1, 1, 1, 40, 7, 16, FP32, device)
    _, lse = fa.flash_attention_forward(q, k, v, causal=True)
    lse = lse.cpu()
    assert tuple(lse.shape) == (1, 1, 40), f"lse must have shape (1, 1, 40), found {show(lse.shape)}"
    assert lse[0, 0, :33].tolist() == [INF] * 33, (
        "with Nq = 40 and Nk = 7 (causal), rows 0..32 see no key: their lse must be +inf (not -inf, not NaN), so "
        f"that a backward pass computing exp(s - lse) gets exactly 0. Found {show(lse[0, 0, :33].unique())}"
    )
    assert torch.isfinite(lse[0, 0, 33:]).all(), (
        f"rows 33..39 see keys: their lse must be finite, found {show(lse[0, 0, 33:])}"
    )


# --------------------------------------------------------------------------------------------------
# numerical stability


@pytest.mark.check("stability")
@pytest.mark.parametrize("dtype", [FP32, FP16])
def test_scores_shifted_by_minus_1e4(fa, rng, device, dtype):
    # Softmax is shift-invariant: subtract 1e4 from every score and o must not change. One coordinate
    # carries the shift exactly: q[..., 0] * k[..., 0] * scale = -1e4 (it is 0 in the unshifted twin).
    d, sm_scale = (64, None) if dtype == FP32 else (16, 1.0)
    scale = 1 / math.sqrt(d) if sm_scale is None else sm_scale
    q, k, v = make_qkv(rng, 1, 2, 2, 37, 150, d, FP32, scale=0.5 if dtype == FP16 else 1.0)
    q[..., 0], k[..., 0] = 0.0, 0.0
    twin = [t.to(device=device, dtype=dtype) for t in (q, k, v)]
    q[..., 0], k[..., 0] = -1e4 / scale, 1.0
    q, k, v = (t.to(device=device, dtype=dtype) for t in (q, k, v))
    kwargs = {} if sm_scale is None else {"sm_scale": sm_scale}
    o, _ = fa.flash_attention_forward(q, k, v, **kwargs)
    o = o.cpu()
    assert torch.isfinite(o).all(), (
        "o has inf or NaN when every score is about -1e4: start the running max at -inf, not 0 (exp(-1e4 - 0) "
        "underflows to 0, so l = 0), and subtract the running max before exp"
    )
    o_twin, _ = fa.flash_attention_forward(*twin, **kwargs)
    ref, _ = naive_attention(q.cpu(), k.cpu(), v.cpu(), sm_scale=sm_scale)
    ref_twin, _ = naive_attention(*(t.cpu() for t in twin), sm_scale=sm_scale)
    # Scores of size 1e4 carry fp32 rounding of about 1e-3 even in a correct kernel: the tolerance is
    # the kernel's own error on the unshifted twin plus a floor for that rounding.
    assert bool(torch.isfinite(o_twin).all()), "o has inf or NaN for ordinary scores (this test's unshifted twin)"
    err_twin = float((o_twin.cpu().double() - ref_twin).abs().max())
    tol = err_twin + 5e-3 * float(v.abs().max())
    testing.assert_close(
        o,
        ref,
        atol=tol,
        what="o with every score shifted by -1e4",
        hint=lambda _: f"Without the shift o is off by {err_twin:.3g}. " + (
            "Rows of o are exactly 0 where the expected is not: every exp(s - m) of the row underflowed, so the m "
            "subtracted was far above the row's scores (about -1e4) rather than their max. Does the running max start "
            "at 0 instead of -inf?"
            if bool(((o == 0).all(-1) & (ref != 0).any(-1)).any())
            else "Subtract the running max before exp, start it at -inf, and keep scores in fp32"
        ),
    )


@pytest.mark.check("stability")
@pytest.mark.parametrize("dtype", [FP32, FP16])
def test_late_tile_with_much_larger_logits(fa, rng, device, dtype):
    # Keys 256.. score 20 higher than the rest: the max jumps late, after many tiles have been summed.
    q, k, v = make_qkv(rng, 1, 2, 2, 24, 300, 64, FP32)
    q[..., 0] = 4.0
    k[..., 0] = 0.0
    k[..., 256:, 0] = 40.0  # 4 * 40 / sqrt(64) = +20
    q, k, v = (t.to(device=device, dtype=dtype) for t in (q, k, v))
    check_forward(
        fa,
        q,
        k,
        v,
        what="o when the last key tile has far larger scores",
        hint="when the max grows, multiply BOTH the running sum l and the output accumulator by exp(m_old - m_new)",
    )


@pytest.mark.check("stability")
def test_long_fp16_rows_need_an_fp32_accumulator(fa, rng, device):
    # Equal scores over 300 keys whose values are about 250: o is about 250 (fine in fp16), but the
    # unnormalised sum of exp(s - m) * v reaches 300 * 250 = 75,000, past fp16's largest value 65,504.
    q = torch.zeros(1, 2, 20, 32)
    k = torch.randn(1, 2, 300, 32, generator=rng)
    v = 250 + torch.randn(1, 2, 300, 32, generator=rng)
    q, k, v = (t.to(device=device, dtype=FP16) for t in (q, k, v))
    check_forward(
        fa,
        q,
        k,
        v,
        what="fp16 o averaging 300 values near 250",
        hint="keep the output accumulator (and m, l) in float32: the unnormalised sum overflows fp16",
    )


# --------------------------------------------------------------------------------------------------
# backward


def check_training_step(student, fa, q, k, v, do, causal, sm_scale, what, hint=""):
    """Forward and backward through the student's FlashAttention.apply; grads against autograd."""
    o, dq, dk, dv = student.drive(f"{DRIVERS}:training_step", fa.flash_attention, q, k, v, do, causal, sm_scale)
    qc, kc, vc, doc = q.cpu(), k.cpu(), v.cpu(), do.cpu()
    ref = naive_grads(qc, kc, vc, doc, causal, sm_scale)
    low = naive_grads(qc, kc, vc, doc, causal, sm_scale, dtype=q.dtype)
    for name, got, inp, r, lo in zip(("dq", "dk", "dv"), (dq, dk, dv), (q, k, v), ref, low):
        assert got is not None, f"{what}: {name} is None: FlashAttention.backward returns (dq, dk, dv, None, None)"
        assert got.dtype == inp.dtype and got.shape == inp.shape, (
            f"{what}: {name} must have its input's dtype and shape {inp.dtype} {tuple(inp.shape)}, "
            f"found {got.dtype} {tuple(got.shape)}"
        )
        scale = 1 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
        assert_close(got, r, lo, f"{name} for {what}", lambda tol, name=name, got=got, r=r: (
            grad_diagnosis(name, got, r, causal, q.shape[2], k.shape[2], scale, tol) or hint or BACKWARD_HINT))
    return dq, dk, dv


def grad_diagnosis(name, got, ref, causal, n_q, n_k, scale, atol):
    """A constant factor (sm_scale missing or applied twice), or a causal mask wrong only where dk and dv are
    computed; "" when the values point to neither."""
    g, r = got.detach().cpu().double(), ref.detach().cpu().double()
    if bool(torch.isfinite(g).all()) and bool((r != 0).any()):
        c = float((g * r).sum() / (r * r).sum())
        if not math.isclose(c, 1, abs_tol=1e-2) and is_close(g, c * r, atol=atol + 1e-3 * float(r.abs().max())):
            why = (" = 1/sm_scale: the factor sm_scale is missing" if scale and math.isclose(c, 1 / scale, rel_tol=1e-2)
                   else " = sm_scale: the factor sm_scale is applied twice" if math.isclose(c, scale, rel_tol=1e-2)
                   else "")
            return f"{name} is the expected {name} times {c:.4g} everywhere{why}"
    if causal and name in ("dk", "dv"):
        shift = n_k - n_q  # key j is hidden from some query iff j > shift (query i sees key j iff j <= i + shift)
        wrong = mismatches(g, r, atol=atol).flatten(0, 1).any(0).any(-1)  # per key
        if wrong.any() and shift >= 0 and not wrong[: shift + 1].any():
            return (f"{name} is right for keys 0..{shift}, which every query sees, and wrong from key "
                    f"{int(wrong.nonzero()[0])}: only keys that the causal mask hides from some query are wrong. Is "
                    f"the causal mask applied to P where {name} is computed, as it is where dq is computed?")
    return ""


BACKWARD_HINT = (
    "With P = exp(scale * q k^T - lse) (0 where masked): dv = P^T dO; dP = dO v^T; dS = P * (dP - delta) with "
    "delta = rowsum(dO * O); dq = scale * dS k; dk = scale * dS^T q."
)

BACKWARD_CASES = [  # (B, Hq, Hkv, Nq, Nk, D, dtype, causal)
    (1, 2, 2, 17, 17, 32, FP32, False),
    (1, 2, 2, 127, 129, 64, FP16, True),
    (1, 1, 1, 129, 127, 16, FP32, True),
    (1, 2, 2, 1, 300, 128, FP32, True),
    (1, 2, 2, 17, 300, 64, FP16, False),
    (1, 1, 1, 5, 2, 32, FP32, True),
    (2, 1, 1, 300, 300, 16, FP16, True),
    (1, 2, 2, 1, 5, 64, FP16, False),
    (1, 1, 1, 300, 17, 32, FP32, False),
]


@pytest.mark.check("backward")
@pytest.mark.parametrize("case", BACKWARD_CASES, ids=case_id)
def test_backward(student, fa, rng, device, case):
    b, hq, hkv, n_q, n_k, d, dtype, causal = case
    q, k, v = make_qkv(rng, b, hq, hkv, n_q, n_k, d, dtype, device)
    do = torch.randn(q.shape, generator=rng).to(device=device, dtype=dtype)
    dq, _, _ = check_training_step(student, fa, q, k, v, do, causal, None, case_id(case))
    if causal and n_q > n_k:
        empty = dq[:, :, : n_q - n_k].cpu()
        assert torch.equal(empty, torch.zeros_like(empty)), "rows that see no key must get dq = 0 exactly"


@pytest.mark.check("backward")
@pytest.mark.parametrize("sm_scale", [0.3, 0.0])
def test_backward_sm_scale(student, fa, rng, device, sm_scale):
    q, k, v = make_qkv(rng, 1, 2, 2, 33, 70, 32, FP32, device)
    do = torch.randn(q.shape, generator=rng).to(device)
    check_training_step(
        student,
        fa,
        q,
        k,
        v,
        do,
        True,
        sm_scale,
        f"sm_scale={sm_scale}",
        hint="use the given sm_scale (0 included) in the backward pass too: dq and dk carry a "
        "factor sm_scale, and P = exp(sm_scale * q k^T - lse)",
    )


@pytest.mark.check("backward")
@pytest.mark.parametrize("causal,dtype", [(False, FP32), (True, FP16)])
def test_backward_function_with_exact_o_and_lse(fa, rng, device, causal, dtype):
    # flash_attention_backward on its own, fed the oracle's o and lse, and a strided dO.
    q, k, v = make_qkv(rng, 1, 2, 1, 50, 90, 64, dtype, device)
    qc, kc, vc = q.cpu(), k.cpu(), v.cpu()
    o, lse = naive_attention(qc, kc, vc, causal)
    do = torch.randn(1, 50, 2, 64, generator=rng).to(dtype).transpose(1, 2)
    dq, dk, dv = fa.flash_attention_backward(
        q, k, v, o.to(device=device, dtype=dtype), lse.float().to(device), do.to(device), causal=causal
    )
    ref = naive_grads(qc, kc, vc, do, causal)
    low = naive_grads(qc, kc, vc, do, causal, dtype=dtype)
    for name, got, r, lo in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, low):
        assert_close(got, r, lo, f"{name} from flash_attention_backward (causal={causal})", BACKWARD_HINT)


@pytest.mark.check("backward")
@pytest.mark.parametrize("layout,dtype", [("transposed", FP32), ("every other feature", FP16), ("packed kv", FP32)])
def test_backward_function_with_strided_inputs(fa, rng, device, layout, dtype):
    # flash_attention_backward with q, k, v, o and dO that are not contiguous (the contract's "any strides"), fed
    # the oracle's o and lse.
    q, k, v = strided_qkv(rng, device, layout, 50, 90, 32, dtype)
    qc, kc, vc = q.cpu(), k.cpu(), v.cpu()
    o, lse = naive_attention(qc, kc, vc, True)
    o = o.to(dtype).transpose(1, 2).contiguous().transpose(1, 2).to(device)  # [B, N, H, D] memory
    do = torch.randn(1, 50, 2, 32, generator=rng).to(dtype).transpose(1, 2).to(device)
    what = f"{layout} q, k, v (strides {q.stride()}, {k.stride()}, {v.stride()}), o {o.stride()}, dO {do.stride()}"
    dq, dk, dv = fa.flash_attention_backward(q, k, v, o, lse.float().to(device), do, causal=True)
    ref = naive_grads(qc, kc, vc, do.cpu(), True)
    low = naive_grads(qc, kc, vc, do.cpu(), True, dtype=dtype)
    for name, got, inp, r, lo in zip(("dq", "dk", "dv"), (dq, dk, dv), (q, k, v), ref, low):
        assert got.dtype == inp.dtype and tuple(got.shape) == tuple(inp.shape), (
            f"{name} for {what}: must have its input's dtype and shape {inp.dtype} {tuple(inp.shape)}, found "
            f"{got.dtype} {tuple(got.shape)}"
        )
        assert_close(
            got,
            r,
            lo,
            f"{name} from flash_attention_backward, {what}",
            "q, k, v, o and dO may have any strides: address them with their strides, or make them contiguous first",
        )


# --------------------------------------------------------------------------------------------------
# structure: no Nq x Nk matrix, no library attention, the tile loop inside the kernel
# (Nq, Nk, B, H and D are all distinct here, so no honest tensor has an Nq x Nk pair of dims.)


@pytest.mark.check("structure")
@pytest.mark.parametrize("causal", [False, True])
def test_forward_never_builds_the_score_matrix(student, fa, rng, device, causal):
    q, k, v = make_qkv(rng, 1, 2, 2, 96, 160, 32, FP32, device)
    result = student.drive(f"{DRIVERS}:guarded", fa.flash_attention_forward, q, k, v, causal, n_q=96, n_k=160)
    # The guard runs beside the student's code; no trusted cross-check exists on the CPU (CHECKS.md, "What
    # each structural check can and cannot prove"), so a file that tampers with it fails.
    student.assert_untampered(fa.flash_attention_forward, "the memory guard's verdict")
    o, _ = result["out"]
    ref, _ = naive_attention(q.cpu(), k.cpu(), v.cpu(), causal)
    testing.assert_close(o, ref, atol=1e-5, rtol=1e-5, what="o under the memory guard")


@pytest.mark.check("structure")
@pytest.mark.parametrize("causal", [False, True])
def test_backward_never_builds_the_score_matrix(student, fa, rng, device, causal):
    q, k, v = make_qkv(rng, 1, 2, 1, 96, 160, 32, FP32, device)
    do = torch.randn(q.shape, generator=rng).to(device)
    _, dq, dk, dv = student.drive(f"{DRIVERS}:training_step", fa.flash_attention, q, k, v, do, causal, None, guard=True)
    student.assert_untampered(fa.flash_attention, "the memory guard's verdict")
    ref = naive_grads(q.cpu(), k.cpu(), v.cpu(), do.cpu(), causal)
    for name, got, r in zip(("dq", "dk", "dv"), (dq, dk, dv), ref):
        testing.assert_close(got, r, atol=1e-4, rtol=1e-5, what=f"{name} under the memory guard")


@pytest.mark.check("structure")
def test_forward_tile_loop_runs_inside_the_kernel(student, fa, rng, device):
    counts = {}
    for n_q, n_k in [(80, 96), (208, 336)]:
        q, k, v = make_qkv(rng, 1, 2, 2, n_q, n_k, 32, FP16, device)
        fa.flash_attention_forward(q, k, v, True)  # warm-up: compiling or autotuning may allocate once
        counts[(n_q, n_k)] = student.drive(
            f"{DRIVERS}:guarded", fa.flash_attention_forward, q, k, v, True, n_q=n_q, n_k=n_k
        )["ops"]
    (small, few), (large, many) = counts.items()
    student.assert_untampered(fa.flash_attention_forward, "the count of torch operations the guard saw")
    assert many <= few + 2, (
        f"your forward ran {few} torch operations at Nq x Nk = {small[0]} x {small[1]} and {many} at "
        f"{large[0]} x {large[1]}: it loops over tiles in Python. The loop over key tiles belongs inside your "
        "Triton kernel, where the scores stay on chip; the host code should allocate o and lse and launch it"
    )


@pytest.mark.check("structure")
def test_kernels_write_every_output(student, fa, rng, device):
    # Under the kernel rule the host code only allocates, views, copies and casts, and what it leaves
    # uninitialised reads NaN: the results can only come from the kernels. Here the launches themselves are
    # recorded: at least one per pass, and o, lse, dq, dk and dv each handed to one.
    q, k, v = make_qkv(rng, 1, 2, 1, 70, 90, 32, FP32, device)
    forward = student.drive("grader.support.kernels:launches", fa.flash_attention_forward, q, k, v, True)
    o, lse = forward["out"]
    do = torch.randn(q.shape, generator=rng).to(device)
    backward = student.drive("grader.support.kernels:launches", fa.flash_attention_backward, q, k, v, o, lse, do, True)
    student.assert_untampered(fa.flash_attention_forward, "the record of your Triton launches")
    for what, got, names in (
        ("flash_attention_forward", forward, ("o", "lse")),
        ("flash_attention_backward", backward, ("dq", "dk", "dv")),
    ):
        assert got["launches"], (
            f"{what} returned without launching a Triton kernel: the host code allocates the outputs and "
            "launches kernel[grid](...), the kernels compute"
        )
        missing = [name for name, handed in zip(names, got["handed"]) if not handed]
        assert len(got["handed"]) == len(names) and not missing, (
            f"{what}: no kernel launch was handed {', '.join(missing) or 'its outputs'} (launches: "
            f"{show(got['launches'])}): allocate each output, pass it to the kernel that writes it, and return "
            "that same tensor"
        )
    ref_o, ref_lse = naive_attention(q.cpu(), k.cpu(), v.cpu(), True)
    testing.assert_close(o, ref_o, atol=1e-5, rtol=1e-5, what="o with its launches recorded")
    assert_lse(lse, ref_lse, "lse with its launches recorded")
    ref = naive_grads(q.cpu(), k.cpu(), v.cpu(), do.cpu(), True)
    for name, got, r in zip(("dq", "dk", "dv"), backward["out"], ref):
        testing.assert_close(got, r, atol=1e-4, rtol=1e-5, what=f"{name} with its launches recorded")


# --------------------------------------------------------------------------------------------------
# tiled_kernel: the signature of the forward kernel is the tile of keys a program holds and its loop over the key
# tiles; of the backward kernels, the same over keys (dq) and over queries (dk, dv). Under the interpreter a
# program may hold a tile of any width, and a kernel whose one tile is the whole key range (BLOCK_N =
# next_power_of_2(Nk), no loop) gives the same numbers. So every launch is also compiled for a real GPU
# (grader.kernelmodel: Triton's compiler and the ptxas in its wheel, for sm_90, no GPU needed), exactly as it was
# launched (constexprs, num_warps, num_stages), at ranges a program cannot hold: 8,192 keys of D = 64 in fp16 are
# 1 MiB of K and 1 MiB of V, against the 256 KiB of registers a block has, so any one-tile program spills far past
# the 512 bytes a thread the model allows, whatever its warps. The reference's 64 x 64 tiles (4 warps, under the
# interpreter) take 122 to 170 registers and spill nothing (README.md, "Performance notes").
#
# Each pass is tried at 512 keys first: a one-tile kernel of 64 query rows already spills there (1,168 bytes a
# thread at 4 warps), and its compile takes seconds, where the 64 x 8,192 tile runs ptxas past the model's timeout
# (two minutes, not cached); an honest kernel's launches at every size are one compile (the lengths are multiples
# of 16, so Triton specialises them alike), paid once. Time of the reference in-process on the 2-core machine under
# load from other jobs: forward 1-6 s, backward 5-22 s with its compiles cached (the interpreter), 5 s and 13 s
# with them cold (four compiles of 1-3 s each at load 7; up to 10 s each at load 10).

TILED_FORWARD = ((16, 512, False), (16, 8192, True))  # (Nq, Nk, causal)
# Long keys: the dq kernel's loop (512 first, as for the forward pass); long queries: the dk/dv kernel's loop.
TILED_BACKWARD = ((16, 512, False), (16, 8192, False), (8192, 16, True))
TILED_D = 64
TILE_HINT = (
    "Keep each program's tiles fixed (BLOCK_M query rows, BLOCK_N keys: 16 to 128 each, whatever the lengths) and "
    "loop over the other range inside the kernel: the forward and dq kernels over key tiles, the dk/dv kernel over "
    "query tiles. The tiles you launch under TRITON_INTERPRET=1 are the ones judged: pick sizes a GPU can hold "
    "there too."
)


@pytest.mark.check("tiled_kernel")
def test_tiled_forward_fits_a_gpu(student, fa, rng, device):
    for n_q, n_k, causal in TILED_FORWARD:  # one call at a time: a kernel that does not fit pays for one compile
        q, k, v = make_qkv(rng, 1, 1, 1, n_q, n_k, TILED_D, FP16, device)
        what = f"flash_attention_forward, fp16, Nq x Nk = {n_q:,} x {n_k:,}, D = {TILED_D}, causal={causal}"
        run = student.kernel_resources(fa.flash_attention_forward, q, k, v, causal)
        assert isinstance(run.out, (tuple, list)) and len(run.out) == 2, f"{what}: expected (o, lse), found {show(run.out)}"
        o, lse = run.out
        assert isinstance(o, torch.Tensor) and o.dtype == q.dtype and tuple(o.shape) == tuple(q.shape), (
            f"{what}: o must have q's dtype and shape {q.dtype} {tuple(q.shape)}, found {show(o)}"
        )
        qc, kc, vc = q.cpu(), k.cpu(), v.cpu()
        ref_o, ref_lse = naive_attention(qc, kc, vc, causal)
        low_o, _ = naive_attention(qc, kc, vc, causal, dtype=q.dtype)
        assert_close(o, ref_o, low_o, f"o for {what}", "Are all key tiles visited, the last one ragged?")
        assert_lse(lse, ref_lse, f"lse for {what}")
        kernelmodel.assert_fit(run.resources, what, hint=TILE_HINT)


@pytest.mark.check("tiled_kernel")
def test_tiled_backward_fits_a_gpu(student, fa, rng, device):
    for n_q, n_k, causal in TILED_BACKWARD:
        q, k, v = make_qkv(rng, 1, 1, 1, n_q, n_k, TILED_D, FP16, device)
        qc, kc, vc = q.cpu(), k.cpu(), v.cpu()
        o, lse = naive_attention(qc, kc, vc, causal)  # the oracle's: this test judges the backward pass alone
        do = torch.randn(q.shape, generator=rng).to(device=device, dtype=FP16)
        what = f"flash_attention_backward, fp16, Nq x Nk = {n_q:,} x {n_k:,}, D = {TILED_D}, causal={causal}"
        run = student.kernel_resources(
            fa.flash_attention_backward, q, k, v, o.to(device=device, dtype=FP16), lse.float().to(device), do, causal
        )
        assert isinstance(run.out, (tuple, list)) and len(run.out) == 3, (
            f"{what}: expected (dq, dk, dv), found {show(run.out)}"
        )
        ref = naive_grads(qc, kc, vc, do.cpu(), causal)
        low = naive_grads(qc, kc, vc, do.cpu(), causal, dtype=FP16)
        for name, got, inp, r, lo in zip(("dq", "dk", "dv"), run.out, (q, k, v), ref, low):
            assert isinstance(got, torch.Tensor) and got.dtype == inp.dtype and tuple(got.shape) == tuple(inp.shape), (
                f"{what}: {name} must have its input's dtype and shape {inp.dtype} {tuple(inp.shape)}, found {show(got)}"
            )
            assert_close(got, r, lo, f"{name} for {what}", BACKWARD_HINT)
        kernelmodel.assert_fit(run.resources, what, hint=TILE_HINT)


# --------------------------------------------------------------------------------------------------
# saved_for_backward: the backward pass's signature is what the forward pass leaves it, q, k, v, o and lse (O(N D)
# bytes), never the Nq x Nk probabilities, and P recomputed tile by tile. The driver (grader.support.flash_attention:
# saved_for_backward) runs FlashAttention.apply and o.backward(dO) and measures, in bytes: what autograd packed for
# the backward pass (saved-tensor hooks; a saved view counts its whole storage), what is still alive once the
# forward pass has returned among the storages its operations wrote (a tensor kept on ctx or in a global counts
# too), and the most the backward pass adds at once. At Nq = Nk = 1,024, D = 16, fp16, one head's P is 2 MiB; the
# reference saves 132 KiB (q, k, v, o, lse), keeps 36 KiB alive (o, lse) and adds 100 KiB in the backward (dq,
# dk, dv, delta). Interpreter time of the reference: 5-12 s (causal, the loaded 2-core machine).

SAVED_SHAPE = (1, 1, 1, 1024, 1024, 16)  # B, Hq, Hkv, Nq, Nk, D


@pytest.mark.check("saved_for_backward")
def test_saved_for_backward_is_linear(student, fa, rng, device):
    b, hq, hkv, n_q, n_k, d = SAVED_SHAPE
    q, k, v = make_qkv(rng, b, hq, hkv, n_q, n_k, d, FP16, device)
    do = torch.randn(q.shape, generator=rng).to(device=device, dtype=FP16)
    got = student.drive(f"{DRIVERS}:saved_for_backward", fa.flash_attention, q, k, v, do, True, None)
    student.assert_untampered(fa.flash_attention, "the census of what your forward pass saves")
    o, dq, dk, dv = got["out"]
    what = f"FlashAttention.apply, fp16, Nq x Nk = {n_q:,} x {n_k:,}, D = {d}, causal"
    qc, kc, vc, doc = q.cpu(), k.cpu(), v.cpu(), do.cpu()
    ref_o, _ = naive_attention(qc, kc, vc, True)
    low_o, _ = naive_attention(qc, kc, vc, True, dtype=FP16)
    assert_close(o, ref_o, low_o, f"o for {what}")
    ref, low = naive_grads(qc, kc, vc, doc, True), naive_grads(qc, kc, vc, doc, True, dtype=FP16)
    for name, grad, inp, r, lo in zip(("dq", "dk", "dv"), (dq, dk, dv), (q, k, v), ref, low):
        assert grad is not None and grad.dtype == inp.dtype and tuple(grad.shape) == tuple(inp.shape), (
            f"{what}: {name} must have its input's dtype and shape {inp.dtype} {tuple(inp.shape)}, found {show(grad)}"
        )
        assert_close(grad, r, lo, f"{name} for {what}", BACKWARD_HINT)

    rows = b * hq * n_q
    linear = sum(t.numel() * t.element_size() for t in (q, k, v, q))  # q, k, v and o as given
    between = 2 * linear + 16 * rows  # twice over (a contiguous or fp32 copy), and four fp32 numbers a query row
    p_head = n_q * n_k * 2  # one head's probabilities in fp16
    kib = lambda n: f"{n / 1024:,.0f} KiB"  # noqa: E731
    saved = ", ".join(f"{str(dtype)[:16]} {show(shape)}" for shape, dtype, _ in got["saved"][:8])
    lesson = (
        "FlashAttention keeps q, k, v, o and lse (one fp32 number a query row) for the backward pass, O(N D) bytes, "
        "and recomputes P = exp(scale q k^T - lse) one tile at a time inside the backward kernels; saving P (or S) "
        f"costs Nq x Nk per head, here {kib(p_head)} in fp16"
    )
    assert got["saved_bytes"] <= between, (
        f"{what}: FlashAttention.forward saved {kib(got['saved_bytes'])} for the backward pass ({saved}), against at "
        f"most {kib(between)} (twice the bytes of q, k, v and o, plus 16 bytes a query row). {lesson}"
    )
    assert got["alive_bytes"] <= between, (
        f"{what}: once the forward pass returned, {kib(got['alive_bytes'])} of the memory it wrote was still alive "
        f"(o included, and anything kept on ctx or elsewhere), against at most {kib(between)} (twice the bytes of "
        f"q, k, v and o, plus 16 bytes a query row). {lesson}"
    )
    linear_bwd = linear + do.numel() * do.element_size()
    during = 4 * linear_bwd + 16 * rows
    assert got["backward_bytes"] <= during, (
        f"{what}: the backward pass allocated {kib(got['backward_bytes'])} at its peak, against at most {kib(during)} "
        f"(four times the bytes of q, k, v, o and dO, plus 16 bytes a query row: dq, dk, dv, delta and copies). "
        f"{lesson}; the backward kernels recompute each tile of P and dS on chip and never write them to memory"
    )


# --------------------------------------------------------------------------------------------------
# Generated causal alignments. A causal kernel's tile bounds (the last key tile a query tile visits,
# the first query tile a key tile meets, the query tiles that see no key) depend on the diagonal
# offset Nk - Nq against the tile widths, which the kernel picks. Here Nk - Nq is one below, on, or
# one above a multiple of 128 (so of every power-of-two tile up to 128), or anything, with more keys
# than queries or more queries than keys (rows, and whole query tiles, that see no key); Nq sits on a
# tile boundary or beside it. Messages place the first wrong row or key against the diagonal and the
# tiles.

ALIGN_MAX_N = 300


def causal_alignment(
    rng: torch.Generator, residue: int | None, more_queries: bool, max_n: int = ALIGN_MAX_N
) -> tuple[int, int]:
    """(Nq, Nk), both in [1, max_n]: Nk - Nq = 128 j + residue (any offset when residue is None),
    j < 0 when `more_queries`; Nq on a multiple of a tile width or beside it where the range allows."""
    pick = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=rng))  # noqa: E731
    if residue is None:
        shift = -pick(1, max_n - 1) if more_queries else pick(0, max_n - 1)
    else:
        js = [j for j in ((-1, -2) if more_queries else (0, 1)) if abs(128 * j + residue) <= max_n - 1]
        shift = 128 * js[pick(0, len(js) - 1)] + residue
    lo, hi = max(1, 1 - shift), min(max_n, max_n - shift)
    near = [t * i + e for t in (16, 32, 64, 128) for i in (1, 2) for e in (-1, 0, 1) if lo <= t * i + e <= hi]
    n_q = near[pick(0, len(near) - 1)] if near and pick(0, 3) else pick(lo, hi)
    return n_q, n_q + shift


def causal_place(n_q: int, n_k: int, name: str):
    """A hint for the first wrong entry of `name` (o, lse, dq: a query row; dk, dv: a key): which keys
    that row sees, or which rows see that key, placed against the tiles."""
    shift = n_k - n_q

    def hint(index) -> str:
        i = index[2]
        if name in ("dk", "dv"):
            first = max(i - shift, 0)
            return (
                f"Key {i} is seen by queries {first}-{n_q - 1} (Nk - Nq = {shift}; query r sees key j iff "
                f"j <= r + Nk - Nq). Key {i} is {blocks.against_tiles(i, 'key', 'BLOCK_N')}; query {first}, the "
                f"first that sees it, is {blocks.against_tiles(first, 'row', 'BLOCK_M')}. The loop over query "
                "tiles of a key tile must start at the query tile that holds its first row, (first key of the "
                "tile) - (Nk - Nq): an off-by-one there skips a whole query tile. (If o or lse of those queries "
                "is wrong too, fix the forward pass first: dk and dv are built on its lse)"
            )
        last = i + shift
        if last < 0:
            return (
                f"Query {i} sees no key (Nk - Nq = {shift}: the first {-shift} queries come before key 0): "
                "its o and dq are exactly 0 and its lse is +inf, whether or not its whole query tile sees nothing"
            )
        return (
            f"Query {i} sees keys 0-{min(last, n_k - 1)} (Nk - Nq = {shift}). Query {i} is "
            f"{blocks.against_tiles(i, 'row', 'BLOCK_M')}; its last key, {last}, is "
            f"{blocks.against_tiles(last, 'key', 'BLOCK_N')}. The loop over key tiles must reach the tile "
            "that holds the last key the query tile's last row sees, (last row) + Nk - Nq: an off-by-one there "
            "skips a whole key tile"
        )

    return hint


def assert_close_placed(got, ref, low, what: str, hint, floors: int = 1) -> None:
    """As assert_close (twice the naive formula's error in got's dtype, plus a floor), with a hint
    built from the first bad index. Gradients take two floors (flash-attn 3's tests: twice the dtype's
    rounding at the answer's size): a kernel rounds P and dS to the dtype for its matmuls and reads
    the stored, rounded o for delta, roundings the naive formula's autograd never makes. With a few
    keys per row (Nq x Nk = 129 x 2) the naive error is no guide: one floor failed the reference's dk
    by 7% on 1 seed of 50; two leave it at 0.70 of the tolerance or less over 60 seeds."""
    base = float((low.detach().cpu().double() - ref).abs().max())
    tol = 2 * base + floors * FLOOR[got.dtype] * max(float(ref.abs().max()), 1.0)
    testing.assert_close(got, ref, atol=tol, what=f"{what} [batch, head, row, col]", hint=hint)


def alignment_inputs(rng, device, residue, more_queries, max_n=ALIGN_MAX_N):
    n_q, n_k = causal_alignment(rng, residue, more_queries, max_n)
    d = (16, 32, 64)[int(torch.randint(0, 3, (1,), generator=rng))]
    hkv = int(torch.randint(1, 3, (1,), generator=rng))
    dtype = (FP32, FP16)[int(torch.randint(0, 2, (1,), generator=rng))]
    return n_q, n_k, make_qkv(rng, 1, 2, hkv, n_q, n_k, d, dtype, device)


ALIGNMENTS = [(residue, more) for more in (False, True) for residue in (-1, 0, 1, None)]


def alignment_id(alignment) -> str:
    residue, more = alignment
    side = "-either" if more is None else "-more-queries" if more else "-more-keys"
    return ("any" if residue is None else f"128j{residue:+d}") + side


@pytest.mark.check("causal")
@pytest.mark.parametrize("alignment", ALIGNMENTS, ids=alignment_id)
def test_generated_causal_alignments(fa, rng, device, alignment):
    n_q, n_k, (q, k, v) = alignment_inputs(rng, device, *alignment)
    what = f"causal, Nq x Nk = {n_q} x {n_k}, Hq = 2, Hkv = {k.shape[1]}, D = {q.shape[-1]}, {str(q.dtype)[6:]}"
    o, lse = fa.flash_attention_forward(q, k, v, causal=True)
    assert o.dtype == q.dtype and lse.dtype == FP32, (
        f"{what}: o must have q's dtype and lse fp32, found {o.dtype}, {lse.dtype}"
    )
    qc, kc, vc = q.cpu(), k.cpu(), v.cpu()
    ref_o, ref_lse = naive_attention(qc, kc, vc, True)
    low_o, _ = naive_attention(qc, kc, vc, True, dtype=q.dtype)
    assert_close_placed(o, ref_o, low_o, f"o for {what}", causal_place(n_q, n_k, "o"))
    empty = max(0, n_q - n_k)  # rows that see no key; exactly 0, and lse exactly +inf
    testing.assert_equal(
        o[:, :, :empty].cpu(),
        torch.zeros_like(ref_o[:, :, :empty]),
        what=f"o of the rows that see no key, {what}",
        hint=causal_place(n_q, n_k, "o"),
    )
    finite = torch.isfinite(ref_lse)
    tol = (2e-5 + 1e-6 * float(ref_lse[finite].abs().max())) if bool(finite.any()) else 0.0
    lse_hint = causal_place(n_q, n_k, "lse")
    testing.assert_close(
        lse,
        ref_lse,
        atol=tol,
        what=f"lse for {what} [batch, head, row]",
        hint=lambda index: lse_hint((*index, 0)) + ". lse is +inf exactly where a row sees no key",
    )


LSE_ALIGNMENTS = [(1, False), (1, True), (-1, False), (0, True)]


@pytest.mark.check("lse")
@pytest.mark.parametrize("alignment", LSE_ALIGNMENTS, ids=alignment_id)
def test_generated_causal_alignments_lse(fa, rng, device, alignment):
    # lse on its own, where a kernel's causal tile bounds are easiest to get wrong: a key tile the loop
    # skips leaves its keys out of the row's logsumexp (o and lse of the same alignments are in `causal`).
    n_q, n_k, (q, k, v) = alignment_inputs(rng, device, *alignment)
    what = f"causal, Nq x Nk = {n_q} x {n_k}, Hq = 2, Hkv = {k.shape[1]}, D = {q.shape[-1]}, {str(q.dtype)[6:]}"
    _, lse = fa.flash_attention_forward(q, k, v, causal=True)
    assert lse.dtype == FP32 and tuple(lse.shape) == tuple(q.shape[:3]), (
        f"{what}: lse must be float32 {tuple(q.shape[:3])}, found {lse.dtype} {show(lse.shape)}"
    )
    want = torch.logsumexp(scores(q.cpu(), k.cpu(), True), dim=-1)
    want = torch.where(want == -INF, INF, want)  # the contract's convention for rows that see no key
    finite = torch.isfinite(want)
    tol = (2e-5 + 1e-6 * float(want[finite].abs().max())) if bool(finite.any()) else 0.0
    lse_hint = causal_place(n_q, n_k, "lse")
    testing.assert_close(
        lse,
        want,
        atol=tol,
        what=f"lse for {what} [batch, head, row]",
        hint=lambda index: lse_hint((*index, 0)) + ". lse is +inf exactly where a row sees no key",
    )


BACKWARD_ALIGNMENTS = [(-1, False), (-1, True), (1, False), (1, True), (None, None)]  # side None: either


@pytest.mark.check("backward")
@pytest.mark.parametrize("alignment", BACKWARD_ALIGNMENTS, ids=alignment_id)
def test_generated_causal_alignments_backward(student, fa, rng, device, alignment):
    residue, more_queries = alignment
    if more_queries is None:
        more_queries = bool(torch.randint(0, 2, (1,), generator=rng))
    # Smaller than the forward's (the backward runs three kernels and two oracles): up to 200 tokens.
    n_q, n_k, (q, k, v) = alignment_inputs(rng, device, residue, more_queries, 200)
    what = f"causal, Nq x Nk = {n_q} x {n_k}, Hq = 2, Hkv = {k.shape[1]}, D = {q.shape[-1]}, {str(q.dtype)[6:]}"
    do = torch.randn(q.shape, generator=rng).to(device=device, dtype=q.dtype)
    _, dq, dk, dv = student.drive(f"{DRIVERS}:training_step", fa.flash_attention, q, k, v, do, True, None)
    qc, kc, vc, doc = q.cpu(), k.cpu(), v.cpu(), do.cpu()
    ref = naive_grads(qc, kc, vc, doc, True)
    low = naive_grads(qc, kc, vc, doc, True, dtype=q.dtype)
    for name, got, inp, r, lo in zip(("dq", "dk", "dv"), (dq, dk, dv), (q, k, v), ref, low):
        assert got is not None and got.shape == inp.shape and got.dtype == inp.dtype, (
            f"{what}: {name} must have its input's dtype and shape {inp.dtype} {tuple(inp.shape)}, found "
            f"{None if got is None else (got.dtype, tuple(got.shape))}"
        )
        assert_close_placed(got, r, lo, f"{name} for {what}", causal_place(n_q, n_k, name), floors=2)
    empty = max(0, n_q - n_k)
    testing.assert_equal(
        dq[:, :, :empty].cpu(),
        torch.zeros_like(ref[0][:, :, :empty]),
        what=f"dq of the rows that see no key, {what}",
        hint=causal_place(n_q, n_k, "dq"),
    )


# --------------------------------------------------------------------------------------------------
# CUDA: bf16, realistic sizes, memory


@pytest.mark.cuda
@pytest.mark.check("cuda_bf16")
@pytest.mark.parametrize(
    "hq,hkv,n_q,n_k,causal", [(2, 2, 127, 129, False), (6, 2, 129, 300, True), (4, 1, 300, 17, True)]
)
def test_bf16(student, fa, rng, device, hq, hkv, n_q, n_k, causal):
    bf16 = rehearsal.dtype(BF16)  # fp16 in a CPU rehearsal: the interpreter's bf16 tl.dot is not bf16
    q, k, v = make_qkv(rng, 1, hq, hkv, n_q, n_k, 64, bf16, device)
    check_forward(fa, q, k, v, causal=causal, what=f"bf16 o ({hq}x{hkv} heads, {n_q}x{n_k})", check_lse=True)
    do = torch.randn(q.shape, generator=rng).to(device=device, dtype=bf16)
    check_training_step(student, fa, q, k, v, do, causal, None, f"bf16, {hq}x{hkv} heads, {n_q}x{n_k}")


def assert_close_on_device(got, ref, low, what):
    base = float((low.float() - ref.float()).abs().max())
    tol = 2 * base + FLOOR[got.dtype] * max(float(ref.abs().max()), 1.0)
    testing.assert_close(got, ref, atol=tol, what=what, hint=f"A naive {got.dtype} formula errs by {base:.3g}")


@pytest.mark.cuda
@pytest.mark.check("cuda_bf16")
@pytest.mark.parametrize("dtype", [FP16, BF16, FP32])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_realistic_sizes(student, fa, rng, dtype, head_dim):
    # 2 x 8 query heads over 2 KV heads, 1000 queries against 1536 keys, causal: the reference is the
    # naive formula in fp32 on the GPU (fp64 for fp32 inputs).
    dtype = rehearsal.dtype(dtype)
    n_q, n_k = rehearsal.size((1000, 1536), (40, 72))
    q, k, v = make_qkv(rng, 2, 8, 2, n_q, n_k, head_dim, dtype, rehearsal.device())
    do = torch.randn(q.shape, generator=rng).to(device=rehearsal.device(), dtype=dtype)
    ref_dtype = torch.float64 if dtype == FP32 else FP32
    o, lse = fa.flash_attention_forward(q, k, v, causal=True)
    ref_o, ref_lse = naive_attention(q, k, v, True, None, ref_dtype)
    low_o, _ = naive_attention(q, k, v, True, None, dtype)
    assert_close_on_device(o, ref_o, low_o, f"{dtype} o, D = {head_dim}")
    assert_lse(lse, ref_lse.cpu().double(), f"{dtype} lse, D = {head_dim}")
    _, dq, dk, dv = student.drive(f"{DRIVERS}:training_step", fa.flash_attention, q, k, v, do, True, None)
    ref = naive_grads(q, k, v, do, True, None, ref_dtype)
    low = naive_grads(q, k, v, do, True, None, dtype)
    for name, got, r, lo in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, low):
        assert_close_on_device(
            got,
            r,
            lo,
            f"{dtype} {name}, D = {head_dim}"
            + (
                " (fp32 inputs need input_precision='ieee' in every tl.dot: TF32 keeps only 10 mantissa bits)"
                if dtype == FP32
                else ""
            ),
        )


MEMORY_N = rehearsal.size(8192, 64)


@pytest.mark.cuda
@pytest.mark.check("memory")
def test_forward_peak_memory(student, fa, rng):
    q, k, v = make_qkv(rng, 1, 4, 4, MEMORY_N, MEMORY_N, 64, FP16, rehearsal.device())
    (o, lse), extra = student.drive(f"{DRIVERS}:peak_memory", fa.flash_attention_forward, q, k, v, True)
    score_matrix = MEMORY_N * MEMORY_N * 2  # ONE head's scores in fp16: 128 MiB
    outputs = o.numel() * o.element_size() + lse.numel() * 4
    assert extra <= outputs + score_matrix // 16, (
        f"the forward pass allocated {extra / 2**20:.1f} MiB at its peak beyond its inputs, against "
        f"{outputs / 2**20:.1f} MiB for o and lse and {score_matrix / 2**20:.0f} MiB for one head's score matrix: "
        "the scores must stay on chip, one tile at a time"
    )


@pytest.mark.cuda
@pytest.mark.check("memory")
def test_training_step_peak_memory(student, fa, rng):
    q, k, v = make_qkv(rng, 1, 4, 4, MEMORY_N, MEMORY_N, 64, FP16, rehearsal.device())
    do = torch.randn(q.shape, generator=rng).to(device=rehearsal.device(), dtype=FP16)
    _, extra = student.drive(f"{DRIVERS}:training_step_peak_memory", fa.flash_attention, q, k, v, do, True)
    linear = 12 * q.numel() * q.element_size()  # copies of q, k, v; o, dq, dk, dv; lse, delta and slack
    score_matrix = MEMORY_N * MEMORY_N * 2
    assert extra <= linear + score_matrix // 16, (
        f"forward + backward allocated {extra / 2**20:.1f} MiB at the peak, against {linear / 2**20:.0f} MiB for "
        f"the linear-size tensors and {score_matrix / 2**20:.0f} MiB for one head's score matrix: recompute P "
        "tile by tile from lse instead of storing it"
    )


# --------------------------------------------------------------------------------------------------
# speed (CUDA only): TFLOP/s as a fraction of scaled_dot_product_attention's on the same inputs


def assert_timed_output(out, q, k, v, causal):
    """The checked rep's o, on every head (four at a time), against the naive formula in fp32 on the
    GPU: a kernel that got only some heads right would save the work of the others."""
    assert isinstance(out, (tuple, list)) and len(out) == 2, "flash_attention_forward should return (o, lse)"
    o = out[0]
    assert tuple(o.shape) == tuple(q.shape), f"o should have q's shape {tuple(q.shape)}, found {tuple(o.shape)}"
    for b in range(q.shape[0]):
        for h in range(0, q.shape[1], 4):
            sl = (slice(b, b + 1), slice(h, h + 4))
            ref, _ = naive_attention(q[sl], k[sl], v[sl], causal, None, FP32)
            low, _ = naive_attention(q[sl], k[sl], v[sl], causal, None, q.dtype)
            assert_close_on_device(o[sl], ref, low, f"o of batch {b}, heads {h}..{h + 3}")


def check_under_the_kernel_rule(student, fa, rng, head_dim, causal):
    """The timing loop makes fresh inputs beside the call, so it runs without the kernel rule: the functions it
    times must first pass under the rule, forward and backward, on a small input of the same kind."""
    n, bf16 = rehearsal.size(300, 40), rehearsal.dtype(BF16)
    q, k, v = make_qkv(rng, 1, 2, 2, n, n, head_dim, bf16, rehearsal.device())
    check_forward(fa, q, k, v, causal=causal, what="bf16 o, once before the timing")
    do = torch.randn(q.shape, generator=rng).to(device=rehearsal.device(), dtype=bf16)
    check_training_step(student, fa, q, k, v, do, causal, None, "bf16, once before the timing")


@pytest.mark.cuda
@pytest.mark.check("forward_speed")
@pytest.mark.parametrize("case", cases.FORWARD, ids=lambda case: case.id)
def test_forward_speed(student, fa, fa_timed, rng, score, case):
    case = rehearsal.size(case, case.tiny())  # a CPU rehearsal: tiny
    causal = case.causal
    check_under_the_kernel_rule(student, fa, rng, case.head_dim, causal)
    specs = case.inputs(rehearsal.dtype(cases.DTYPE))
    ceil = speed.ceilings()
    # At full marks a rep takes 0.1-0.5 ms: 400 reps are 50-200 ms, well above the wall-clock bound's
    # slack (5 ms + 3%, grader/speed.py).
    t = speed.time_student(
        student,
        fa_timed.flash_attention_forward,
        specs,
        {"causal": causal},
        reps=400,
        check=lambda args, out: assert_timed_output(out, *args, causal),
    )
    sdpa = speed.time_here(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), specs, reps=400)
    flops = case.flops()
    score.metrics(
        tflops=flops / t.mean_s / 1e12,
        sdpa_tflops=flops / sdpa.mean_s / 1e12,
        fraction_of_matmul=ceil.matmul_fraction(flops, t.mean_s),
        **ceil.figures(),  # the matmul and copy ceilings, and the clocks they were measured at
    )
    score.speed(sdpa.mean_s / t.mean_s)


@pytest.mark.cuda
@pytest.mark.check("backward_speed")
@pytest.mark.parametrize("case", cases.BACKWARD, ids=lambda case: case.id)
def test_backward_speed(student, fa, fa_timed, rng, score, case):
    case = rehearsal.size(case, case.tiny())  # a CPU rehearsal: tiny
    causal = case.causal
    check_under_the_kernel_rule(student, fa, rng, case.head_dim, causal)
    # Fresh q, k, v, o, dO per rep; lse about 4 above the scores keeps P = exp(s - lse) in (0, 1].
    bf16 = rehearsal.dtype(cases.DTYPE)
    specs = case.inputs(bf16)
    ceil = speed.ceilings()
    # At full marks a rep takes 1.5-3 ms: 100 reps are 0.15-0.3 s against the bound's slack.
    t = speed.time_student(
        student,
        fa_timed.flash_attention_backward,
        specs,
        {"causal": causal},
        reps=100,
        check=lambda args, out: assert_timed_gradients(out, *args, causal),
    )
    sdpa_backward_s = cases.sdpa_backward_s(case, bf16, reps=100)  # its forward + backward - its forward
    flops = case.flops()  # 2.5x the forward's: five matmuls to two
    score.metrics(
        tflops=flops / t.mean_s / 1e12,
        sdpa_tflops=flops / sdpa_backward_s / 1e12,
        fraction_of_matmul=ceil.matmul_fraction(flops, t.mean_s),
        **ceil.figures(),
    )
    score.speed(sdpa_backward_s / t.mean_s)


def assert_timed_gradients(grads, q, k, v, o, lse, do, causal):
    """The textbook backward formula from the same (q, k, v, o, lse, dO), in fp32, on every head (a
    kernel that got only some heads right would save the work of the others)."""
    assert isinstance(grads, (tuple, list)) and len(grads) == 3, "flash_attention_backward should return (dq, dk, dv)"
    for name, got in zip(("dq", "dk", "dv"), grads):
        assert tuple(got.shape) == tuple(q.shape), (
            f"{name} should have shape {tuple(q.shape)}, found {tuple(got.shape)}"
        )
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            sl = (slice(b, b + 1), slice(h, h + 1))
            qh, kh, vh, oh, lseh, doh = (t[sl].float() for t in (q, k, v, o, lse, do))
            want = grads_from_lse(qh, kh, vh, oh, lseh, doh, causal, FP32)
            for name, got, w in zip(("dq", "dk", "dv"), grads, want):
                assert bool(torch.isfinite(w).all()), f"{name}: the checked rep's o or lse holds NaN or inf"
                testing.assert_close(
                    got[sl], w, atol=2e-2 * float(w.abs().max()) + 1e-3, what=f"{name} of batch {b}, head {h}"
                )
