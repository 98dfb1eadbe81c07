"""Public tests for GPTQ: small, fast, and each failure says what to look at.

Run: make check EX=gptq   (or: .venv/bin/pytest exercises/gptq)
Every expected value here is worked out by hand (see the comments) or by the textbook formula in
float64, never by a clever implementation.
"""

import math

import pytest
import torch

from grader import testing

from grader.testing import assert_close, show


@pytest.fixture(scope="module")
def gq(student):
    return student.load("gptq")


# --------------------------------------------------------------------------------------------------
# The quantiser


@pytest.mark.check("quantizer_public")
def test_fit_quantizer_asymmetric_by_hand(gq):
    w = torch.tensor([[-1.0, 0.5, 2.0], [0.5, 1.0, 3.0], [0.0, 0.0, 0.0]])
    scale, zero = gq.fit_quantizer(w, bits=2)  # maxq = 3
    # row 0: xmin = -1, xmax = 2 -> scale 3/3 = 1, zero = round(1 / 1) = 1
    # row 1: all positive, xmin = min(0.5, 0) = 0 -> scale 1, zero 0
    # row 2: all zero -> xmin = -1, xmax = 1 -> scale 2/3, zero = round(1.5) = 2 (half to even)
    assert scale.shape == (3,) and zero.shape == (3,), f"expected scale and zero of shape [3], found {tuple(scale.shape)}, {tuple(zero.shape)}"
    assert scale.dtype == torch.float32 and zero.dtype == torch.float32, f"expected fp32, found {scale.dtype}, {zero.dtype}"
    assert_close(scale[:2], [1.0, 1.0], atol=1e-5, rtol=1e-5, what="scale of rows 0 and 1", hint=(
        "Expected [1, 1, 0.667]: scale = (xmax - xmin) / maxq with xmin = min(row.min(), 0) "
        "and xmax = max(row.max(), 0), so the grid always contains 0"
    ))
    assert_close(scale[2], 2 / 3, atol=1e-5, rtol=1e-5, what="scale of the all-zero row 2",
                 hint="An all-zero row should use xmin = -1, xmax = 1 (scale 2/3)")
    assert zero.tolist() == [1.0, 0.0, 2.0], f"zero {show(zero)}, expected [1, 0, 2]: zero = round(-xmin / scale), a whole number"


@pytest.mark.check("quantizer_public")
def test_fit_quantizer_symmetric_uses_the_full_range(gq):
    w = torch.tensor([[0.5, 1.0, 2.0], [-4.0, 1.0, 3.0]])
    scale, zero = gq.fit_quantizer(w, bits=3, sym=True)  # maxq = 7
    # row 0 has no negative value, yet symmetric means xmin = -xmax = -2: scale 4/7, zero (7 + 1) / 2 = 4
    # row 1: xmax = max(|-4|, 3) = 4 -> scale 8/7, zero 4
    assert_close(scale, [4 / 7, 8 / 7], atol=1e-5, rtol=1e-5, what="symmetric scale", hint=(
        "Symmetric grids span [-xmax, xmax] with "
        "xmax = max(|xmin|, xmax), for every row, also rows with no negative value"
    ))
    assert zero.shape == (2,), f"expected zero of shape [2], found {tuple(zero.shape)}"
    assert zero.tolist() == [4.0, 4.0], f"zero {show(zero)}, expected [4, 4] = (maxq + 1) / 2"


@pytest.mark.check("quantizer_public")
def test_rtn_with_a_partial_last_group(gq):
    W = torch.tensor([[0.0, 3.0, -2.0, 1.0, 0.4], [0.9, 2.0, 0.0, 0.0, -0.8]])
    res = gq.quantize_rtn(W, bits=2, group_size=2)  # groups: columns {0, 1}, {2, 3}, {4}
    assert res.g_idx.shape == (5,), f"g_idx should have one entry per column, [5], found {tuple(res.g_idx.shape)}"
    assert res.g_idx.dtype == torch.int64 and res.g_idx.tolist() == [0, 0, 1, 1, 2], (
        f"g_idx should be int64 [0, 0, 1, 1, 2] (the group of each column), found {res.g_idx.dtype} {show(res.g_idx)}"
    )
    assert tuple(res.scale.shape) == (2, 3), f"scale should be [rows, n_groups] = [2, 3], found {tuple(res.scale.shape)}"
    assert res.loss is None, "round-to-nearest has no GPTQ loss: return loss=None"
    # row 0: group {0, 3}: scale 1, zero 0 -> [0, 3]; group {-2, 1}: scale 1, zero 2 -> [-2, 1];
    #        group {0.4}: scale 0.4/3, zero 0 -> [0.4]
    # row 1: group {0.9, 2}: scale 2/3, zero 0 -> 0.9 / (2/3) = 1.35 rounds to 1 -> [2/3, 2]; group {0, 0}:
    #        flat -> [0, 0]; group {-0.8}: scale 0.8/3, zero 3 -> [-0.8]
    want = torch.tensor([[0.0, 3.0, -2.0, 1.0, 0.4], [2 / 3, 2.0, 0.0, 0.0, -0.8]])
    assert_close(res.Q, want, atol=1e-5, rtol=1e-5, what="Q [row, column]",
                 hint=f"Expected\n{want}\n(each group of columns has its own grid per row)")


# --------------------------------------------------------------------------------------------------
# The Hessian


@pytest.mark.check("hessian_public")
def test_hessian_of_one_batch(gq):
    x = torch.tensor([[1.0, 0.0, 2.0], [0.0, 1.0, -1.0], [3.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    H, n = gq.accumulate_hessian(torch.zeros(3, 3), 0, x)
    want = 2 / 4 * x.double().T @ x.double()
    assert n == 4, f"n should count the rows seen (4), found {n}"
    assert_close(H, want, atol=1e-5, rtol=1e-5, what="H", hint=f"Expected 2/n * X^T X =\n{want}")


@pytest.mark.check("hessian_public")
def test_hessian_streams_batches_of_rows(gq):
    x = torch.randn(7, 5, generator=testing.generator(0))
    H, n = gq.accumulate_hessian(torch.zeros(5, 5), 0, x[:2])
    H, n = gq.accumulate_hessian(H, n, x[2:].reshape(1, 5, 5))  # leading dims are flattened: 5 rows
    want = 2 / 7 * x.double().T @ x.double()
    assert n == 7, f"after 2 rows then 5 rows n should be 7 (rows, not calls), found {n}"
    assert_close(H, want, atol=1e-5, rtol=1e-5, what="H after batches of 2 then 5 rows, against one batch of 7", hint=(
        "Before adding a batch of m rows, rescale the mean so far by n / (n + m)"
    ))


# --------------------------------------------------------------------------------------------------
# GPTQ


@pytest.mark.check("gptq_public")
def test_gptq_with_a_diagonal_hessian_is_rtn(gq):
    g = testing.generator(1)
    W = torch.randn(4, 6, generator=g)
    h = torch.rand(6, generator=g) + 0.5
    res = gq.gptq_quantize(W, torch.diag(h), bits=3, percdamp=0.0)
    rtn = gq.quantize_rtn(W, bits=3)
    assert res.Q.shape == W.shape and res.Q.dtype == W.dtype, f"expected Q {tuple(W.shape)} {W.dtype}, found {tuple(res.Q.shape)} {res.Q.dtype}"
    assert torch.equal(res.Q, rtn.Q), (
        "with a diagonal H the input features are uncorrelated: no column can make up for another's error, "
        "so GPTQ must give exactly round-to-nearest. Check that U[i, j] = 0 for j != i reaches your update."
    )
    # d = U[i, i] = 1 / sqrt(h_i), so each weight's loss is (w - q)^2 * h_i / 2
    want = float(((W.double() - rtn.Q.double()) ** 2 * h.double()).sum() / 2)
    assert isinstance(res.loss, float), f"loss should be a Python float, found {type(res.loss).__name__}"
    hint = "It is sum((w - q)^2 / d^2 / 2)"
    plain_inverse = float(((W.double() - rtn.Q.double()) ** 2 * h.double() ** 2).sum()) / 2  # d = (H^-1)[i, i]
    if math.isclose(res.loss, 2 * want, rel_tol=1e-4):
        hint += ": yours is twice that, the factor 1/2 is missing"
    elif math.isclose(res.loss, plain_inverse, rel_tol=1e-4):
        hint += (", with d = U[i, i] = 1 / sqrt(h_i) here: yours is what d = (H^-1)[i, i] = 1 / h_i gives. The feedback "
                 "rows come from U, the upper Cholesky factor of H^-1, not from H^-1 itself")
    assert_close(res.loss, want, atol=0.0, rtol=1e-4, what="loss", hint=hint)


@pytest.mark.check("gptq_public")
def test_gptq_on_two_columns_by_hand(gq):
    # Two correlated input features. After rounding column 0, the Optimal Brain Surgeon update moves
    # column 1 by (w0 - q0) * H[0, 1] / H[1, 1]: the second feature makes up for the first one's error.
    W = torch.tensor([[0.30, 0.70], [-0.45, 0.10], [0.80, -0.20]])
    a, b, c = 2.0, 1.2, 1.0
    H = torch.tensor([[a, b], [b, c]])
    res = gq.gptq_quantize(W, H, bits=2, percdamp=0.0)

    Wd = W.double()
    xmin, xmax = Wd.min(1).values.clamp(max=0), Wd.max(1).values.clamp(min=0)
    scale = (xmax - xmin) / 3
    zero = torch.round(-xmin / scale)

    def qz(x):
        return scale * (torch.clamp(torch.round(x / scale) + zero, 0, 3) - zero)

    q0 = qz(Wd[:, 0])
    w1 = Wd[:, 1] + (Wd[:, 0] - q0) * b / c
    q1 = qz(w1)
    assert_close(res.Q[:, 0], q0, atol=1e-5, rtol=1e-5, what="column 0 of Q", hint="Column 0 is plain rounding")
    assert_close(res.Q[:, 1], q1, atol=1e-5, rtol=1e-5, what="column 1 of Q", hint=(
        f"Before rounding it, column 1 should have moved "
        f"by (w0 - q0) * H01 / H11 to {show(w1)}. Is the feedback err * U[0, 1] with err = (w0 - q0) / U[0, 0] and "
        "U the UPPER Cholesky factor of H^-1?"
    ))
    # loss: column 0 has d^2 = (H^-1)[0, 0] = c / (ac - b^2); column 1 then has d^2 = 1 / c
    want_loss = float(((Wd[:, 0] - q0) ** 2 * (a * c - b * b) / c).sum() / 2 + ((w1 - q1) ** 2 * c).sum() / 2)
    assert_close(res.loss, want_loss, atol=0.0, rtol=1e-4, what="loss")
    assert torch.equal(W, torch.tensor([[0.30, 0.70], [-0.45, 0.10], [0.80, -0.20]])), "gptq_quantize must not modify W"


@pytest.mark.check("gptq_public")
def test_gptq_keeps_the_dtype_and_shapes(gq):
    g = testing.generator(2)
    W = torch.randn(5, 12, generator=g).half()
    X = torch.randn(40, 12, generator=g)
    H = 2 * X.T @ X / 40
    res = gq.gptq_quantize(W, H, bits=4, group_size=4, block_size=8)
    assert res.Q.dtype == torch.float16 and res.Q.shape == W.shape, f"expected Q [5, 12] float16, found {tuple(res.Q.shape)} {res.Q.dtype}"
    assert tuple(res.scale.shape) == (5, 3) and tuple(res.zero.shape) == (5, 3), (
        f"with group_size 4 on 12 columns scale and zero are [rows, 3], found {tuple(res.scale.shape)}, {tuple(res.zero.shape)}"
    )
    assert res.scale.dtype == torch.float32 and res.zero.dtype == torch.float32, "scale and zero are fp32"
    assert res.g_idx.shape == (12,), f"g_idx should have one entry per column, [12], found {tuple(res.g_idx.shape)}"
    assert res.g_idx.tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2], f"g_idx should be j // 4, found {show(res.g_idx)}"
    assert res.loss > 0, "the loss should be positive: 4-bit rounding of random weights is not exact"
