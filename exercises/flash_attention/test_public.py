"""Public tests for FlashAttention: small, fast, and each failure says what to look at.

Run: make check EX=flash_attention   (or: .venv/bin/pytest exercises/flash_attention)
The oracle is the textbook formula in float64: softmax(q k^T * scale) v, with the mask built as a full
matrix. Fine for a test on 100 tokens; exactly what your kernel must never do.
"""

import math

import pytest
import torch

from grader import testing

from grader.harness.kernel_rule import KERNELS_ONLY
from grader.testing import assert_close, is_close, mismatches, show

INF = float("inf")
O_AXES = "o [batch, head, query, feature]"
# The rules every check, public and hidden, runs your code under (README.md, "How it is graded"): no library
# softmax or attention by any name, and every function's work inside Triton kernels (outside a launch the
# host code may only allocate, view, copy and cast; it may not read tensor values back).
ATTENTION_FORBID = ["torch.nn.functional.scaled_dot_product_attention", "torch.softmax", "torch.nn.functional.softmax",
                    "torch.Tensor.softmax", "torch.special.softmax", "torch.logsumexp"]


@pytest.fixture(scope="module")
def fa(student):
    return student.load("flash_attention", forbid=[*ATTENTION_FORBID, KERNELS_ONLY],
                        forbid_why="FlashAttention computes the softmax itself, one tile at a time")


def textbook_attention(q, k, v, causal=False, sm_scale=None):
    """(o, lse) in float64. Causal is bottom-right: query i sees key j iff j <= i + Nk - Nq."""
    group = q.shape[1] // k.shape[1]
    q, k, v = q.double(), k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scale = 1 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    s = q @ k.transpose(-1, -2) * scale
    n_q, n_k = s.shape[-2:]
    if causal:
        i, j = torch.arange(n_q)[:, None], torch.arange(n_k)[None, :]
        s = s.masked_fill(j > i + (n_k - n_q), -INF)
    m = s.amax(-1, keepdim=True)
    m = torch.where(m == -INF, torch.zeros_like(m), m)  # a row with no key: avoid -inf - -inf
    e = torch.exp(s - m)
    l = e.sum(-1, keepdim=True)
    o = (e @ v) / torch.where(l > 0, l, torch.ones_like(l))
    lse = torch.where(l > 0, m + torch.log(l), torch.full_like(l, INF))[..., 0]
    return o, lse


# --------------------------------------------------------------------------------------------------
# What a wrong value says about its cause (read from the values, never from a solution)


def shrunk_rows(o, want, atol=1e-5):
    """The first wrong row's factor c when every wrong row of o is c * (the expected row) with c < 1, else None:
    the weights of the row sum to more than 1, so l holds terms the accumulator does not."""
    got, ref = o.detach().cpu().double().flatten(0, -2), want.detach().cpu().double().flatten(0, -2)
    if not torch.isfinite(got).all():
        return None
    wrong = mismatches(got, ref, atol=atol, rtol=1e-5).any(-1) & ref.ne(0).any(-1)
    if not wrong.any():
        return None
    g, r = got[wrong], ref[wrong]
    c = (g * r).sum(-1) / (r * r).sum(-1)
    row_tol = atol + 1e-4 * r.abs().amax(-1, keepdim=True)  # relative to each row's largest value
    if not bool(mismatches(g, c[:, None] * r, atol=row_tol).any()) and bool((c < 1 - 1e-3).all()):
        return float(c[0])
    return None


def o_hint(o, want, lse, want_lse, n_k):
    """The cause the values of a wrong o point to, or "" when they point to none."""
    c = shrunk_rows(o, want)
    if c is not None:
        one_tile = (f" With Nk = {n_k} every key fits in one tile, so the max never grows: nothing is rescaled here."
                    if n_k <= 16 else "")
        return (f"Every wrong row of o is the expected row times a factor below 1 ({c:.3g} in the first): the "
                "weights sum to more than 1, so l holds terms the output does not. Are the keys past Nk in the last "
                "tile masked to -inf? A score of 0 there still adds exp(0 - m) to l." + one_tile)
    if lse is not None and is_close(lse, want_lse, atol=1e-5, rtol=1e-5):
        return ("lse is right, so the running max m and the sum l are: the output accumulator is what goes wrong. "
                "Is it multiplied by exp(m_old - m_new) whenever the max grows, as l is?")
    return ""


def lse_hint(lse, want_lse):
    """Base 2 left unconverted, told from the values (lse2 = lse / ln 2), else the general reminder."""
    got, ref = lse.detach().cpu().double(), want_lse.detach().cpu().double()
    finite = torch.isfinite(ref) & torch.isfinite(got) & mismatches(ref, torch.zeros_like(ref), atol=1e-3)  # |ref| > 1e-3
    if finite.any() and is_close(got[finite] * math.log(2), ref[finite], atol=1e-5, rtol=1e-4):
        return ("Your lse is the expected one times 1/ln(2) = 1.4427: the base-2 logsumexp. Convert it back to the "
                "natural log (multiply by ln 2)")
    return "It is the natural-log logsumexp of the SCALED scores, m + log(l), m the row max of scale * q k^T"


def grad_hint(name, got, want, causal, n_q, n_k, sm_scale, atol):
    """A constant factor (sm_scale missing or doubled), or a causal mask wrong only where dk and dv are computed."""
    g, r = got.detach().cpu().double(), want.detach().cpu().double()
    if torch.isfinite(g).all() and bool((r != 0).any()):
        c = float((g * r).sum() / (r * r).sum())
        if not math.isclose(c, 1, abs_tol=1e-2) and is_close(g, c * r, atol=atol + 1e-3 * float(r.abs().max())):
            why = (" = 1/sm_scale: the factor sm_scale is missing" if math.isclose(c, 1 / sm_scale, rel_tol=1e-2)
                   else " = sm_scale: the factor sm_scale is applied twice" if math.isclose(c, sm_scale, rel_tol=1e-2)
                   else "")
            return f"{name} is the expected {name} times {c:.4g} everywhere{why}"
    if causal and name in ("dk", "dv"):
        shift = n_k - n_q  # key j is hidden from some query iff j > shift (bottom-right: query i sees j <= i + shift)
        wrong = mismatches(g, r, atol=atol).flatten(0, 1).any(0).any(-1)  # per key
        if wrong.any() and shift >= 0 and not wrong[: shift + 1].any():
            return (f"{name} is right for keys 0..{shift}, which every query sees, and wrong from key "
                    f"{int(wrong.nonzero()[0])}: only keys that the causal mask hides from some query are wrong. Is "
                    f"the causal mask applied to P where {name} is computed, as it is where dq is computed?")
    return ""


def qkv(b, hq, hkv, n_q, n_k, d, dtype=torch.float32, seed=0):
    g = testing.generator(seed)
    q = torch.randn(b, hq, n_q, d, generator=g).to(dtype)
    k = torch.randn(b, hkv, n_k, d, generator=g).to(dtype)
    v = torch.randn(b, hkv, n_k, d, generator=g).to(dtype)
    return q, k, v


@pytest.mark.check("forward_public")
def test_forward_one_tile(fa):
    q, k, v = qkv(1, 2, 2, 16, 16, 32)
    o, lse = fa.flash_attention_forward(q, k, v)
    want_o, want_lse = textbook_attention(q, k, v)
    assert o.shape == q.shape and o.dtype == q.dtype, f"o should be {tuple(q.shape)} {q.dtype}, found {tuple(o.shape)} {o.dtype}"
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32, (
        f"lse should be float32 {tuple(q.shape[:3])}, found {lse.dtype} {tuple(lse.shape)}"
    )
    assert_close(o, want_o, atol=1e-5, rtol=1e-5, what=O_AXES, hint=lambda _: o_hint(o, want_o, lse, want_lse, 16))
    assert_close(lse, want_lse, atol=1e-5, rtol=1e-5, what="lse [batch, head, query]",
                 hint=lambda _: lse_hint(lse, want_lse))


@pytest.mark.check("forward_public")
@pytest.mark.parametrize("n_k", [70, 200])
def test_forward_many_key_tiles_with_a_ragged_tail(fa, n_k):
    q, k, v = qkv(1, 2, 2, 33, n_k, 64, seed=n_k)
    o, lse = fa.flash_attention_forward(q, k, v)
    want_o, want_lse = textbook_attention(q, k, v)
    assert_close(o, want_o, atol=1e-5, rtol=1e-5, what=f"{O_AXES} with Nk = {n_k}", hint=lambda _: (
        o_hint(o, want_o, lse, want_lse, n_k) or "Two usual causes: the accumulator is not multiplied by "
        "exp(m_old - m_new) when the running max grows, or keys past Nk in the last tile are not masked to -inf"
    ))
    assert_close(lse, want_lse, atol=1e-5, rtol=1e-5, what=f"lse with Nk = {n_k}",
                 hint="Is the sum l rescaled when the max grows?")


@pytest.mark.check("forward_public")
def test_forward_fp16(fa):
    q, k, v = qkv(1, 2, 1, 40, 90, 16, dtype=torch.float16, seed=3)
    o, _ = fa.flash_attention_forward(q, k, v)
    want, _ = textbook_attention(q, k, v)
    assert o.dtype == torch.float16, f"o should be float16 for float16 inputs, found {o.dtype}"
    assert_close(o, want, atol=2e-3, rtol=1e-5, what=f"fp16 {O_AXES}",
                 hint="Keep m, l and the accumulator in float32 and cast only the final o")


@pytest.mark.check("forward_public")
def test_forward_rejects_an_unsupported_head_dim(fa):
    ok = qkv(1, 1, 1, 4, 4, 16)  # scored beside a working kernel: first a supported head dim
    assert_close(fa.flash_attention_forward(*ok)[0], textbook_attention(*ok)[0], atol=1e-5, rtol=1e-5, what=O_AXES)
    q, k, v = qkv(1, 1, 1, 4, 4, 48)
    with pytest.raises(ValueError):
        fa.flash_attention_forward(q, k, v)


@pytest.mark.check("causal_public")
def test_causal_square(fa):
    q, k, v = qkv(1, 2, 2, 50, 50, 32, seed=5)
    o, lse = fa.flash_attention_forward(q, k, v, causal=True)
    want_o, want_lse = textbook_attention(q, k, v, causal=True)
    assert_close(o, want_o, atol=1e-5, rtol=1e-5, what=f"causal {O_AXES}", hint="Query i may attend keys 0..i only")
    assert_close(lse, want_lse, atol=1e-5, rtol=1e-5, what="causal lse [batch, head, query]")


@pytest.mark.check("causal_public")
def test_causal_is_aligned_bottom_right(fa):
    q, k, v = qkv(1, 1, 1, 2, 5, 16, seed=6)
    o, _ = fa.flash_attention_forward(q, k, v, causal=True)
    want, _ = textbook_attention(q, k, v, causal=True)
    top_left, _ = textbook_attention(q, k[:, :, :2], v[:, :, :2], causal=True)  # what j <= i would give
    assert not is_close(o, top_left, atol=1e-5, rtol=1e-5), (
        "your causal mask is aligned top-left (key j <= query i), as in scaled_dot_product_attention(is_causal=True). "
        "This exercise aligns it bottom-right, as flash-attn does: j <= i + Nk - Nq, so the last query sees every key"
    )
    assert_close(o, want, atol=1e-5, rtol=1e-5, what=f"causal {O_AXES}", hint=(
        "With Nq = 2 and Nk = 5, query 0 sees keys 0..3 and query 1 sees keys 0..4 (the mask is aligned to the "
        "bottom-right corner: j <= i + Nk - Nq)"
    ))


@pytest.mark.check("causal_public")
def test_causal_rows_that_see_no_key(fa):
    q, k, v = qkv(1, 1, 1, 5, 2, 16, seed=7)
    o, lse = fa.flash_attention_forward(q, k, v, causal=True)
    assert not torch.isnan(o).any(), "o has NaN: a row that sees no key must give o = 0 (exp(-inf - -inf) is NaN)"
    assert torch.equal(o[0, 0, :3], torch.zeros_like(o[0, 0, :3])), (
        f"with Nq = 5 and Nk = 2, rows 0..2 see no key and must be 0, found max |o| = {float(o[0, 0, :3].abs().max()):.3g}"
    )
    assert lse.shape == (1, 1, 5), f"lse should have shape (1, 1, 5), found {show(lse.shape)}"
    assert lse[0, 0, :3].tolist() == [INF] * 3, f"rows 0..2 see no key: lse must be +inf, found {show(lse[0, 0, :3])}"
    want_o, want_lse = textbook_attention(q, k, v, causal=True)
    assert_close(o, want_o, atol=1e-5, rtol=1e-5, what=f"causal {O_AXES} with Nq = 5, Nk = 2")


@pytest.mark.check("backward_public")
@pytest.mark.parametrize("causal", [False, True])
def test_gradients(student, fa, causal):
    q, k, v = qkv(1, 2, 2, 37, 45, 32, seed=8)
    do = torch.randn(q.shape, generator=testing.generator(9))
    o, (dq, dk, dv) = student.drive("grader.support.autograd:forward_backward", fa.flash_attention,
                                    [q, k, v, causal], do, wrt=[0, 1, 2])
    ref = [t.double().requires_grad_(True) for t in (q, k, v)]
    textbook_attention(*ref, causal=causal)[0].backward(do.double())
    for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), (r.grad for r in ref)):
        assert got is not None, f"{name} is None: FlashAttention.backward must return (dq, dk, dv, None, None)"
        assert got.dtype == torch.float32, f"{name} should have its input's dtype float32, found {got.dtype}"
        assert_close(got, want, atol=1e-4, what=f"{name} (causal={causal})", hint=lambda _: (
            grad_hint(name, got, want, causal, 37, 45, 1 / math.sqrt(32), 1e-4) or "dV = P^T dO; "
            "dS = P * (dO V^T - delta) with delta = rowsum(dO * O); dQ = scale * dS K; dK = scale * dS^T Q, with "
            "P = exp(scale * q k^T - lse)"
        ))
