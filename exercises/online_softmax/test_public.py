"""Public tests for online softmax: small, fast, and each failure says what to look at.

Run: make check EX=online_softmax   (or: .venv/bin/pytest exercises/online_softmax)
The oracle everywhere is the textbook formula in float64, never a clever implementation.
"""

import pytest
import torch

from grader import blocks, testing
from grader.harness.kernel_rule import KERNELS_ONLY
from grader.testing import OnceIterable, assert_close, mismatches, show

INF = float("inf")
# The hidden checks call your functions under these rules (README.md, "How it is graded"): no library
# softmax under any name (each name stands for all of the softmax's math: log_softmax, logsumexp,
# logcumsumexp, logaddexp, softplus, sigmoid, fused attention), and softmax_triton's work inside Triton
# kernels (outside a launch, the host may only allocate, view, copy and cast).
SOFTMAX_FORBID = ["torch.softmax", "torch.nn.functional.softmax", "torch.Tensor.softmax", "torch.logsumexp",
                  "torch.log_softmax", "torch.nn.functional.log_softmax", "torch.nn.functional.softmin",
                  "torch.special.softmax", "torch.special.logsumexp", "torch.logcumsumexp", "torch.logaddexp"]
WHY = "the exercise is to compute the normaliser yourself"


@pytest.fixture(scope="module")
def sm(student):
    return student.load("online_softmax")


@pytest.fixture(scope="module")
def sm_ruled(student):
    return student.load("online_softmax", forbid=SOFTMAX_FORBID, forbid_why=WHY)


@pytest.fixture(scope="module")
def smk(student):
    return student.load("online_softmax", forbid=[*SOFTMAX_FORBID, KERNELS_ONLY],
                        forbid_why=f"{WHY}, in a Triton kernel for softmax_triton")


def textbook_softmax(x: torch.Tensor) -> torch.Tensor:
    """exp(x - max) / sum, in float64; rows of only -inf give zeros."""
    x = x.double()
    m = x.amax(-1, keepdim=True)
    m = torch.where(m == -INF, torch.zeros_like(m), m)
    e = torch.exp(x - m)
    s = e.sum(-1, keepdim=True)
    return torch.where(s > 0, e / s, torch.zeros_like(e))


@pytest.mark.check("normalizer_public")
def test_normalizer_one_chunk_is_max_and_sum(sm):
    x = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    m, l = sm.online_normalizer(OnceIterable([x], "the chunks"))
    assert m.dtype == torch.float32 and l.dtype == torch.float32, f"expected fp32 (m, l), found {m.dtype}, {l.dtype}"
    torch.testing.assert_close(m, torch.tensor([3.0, 0.0]), msg=lambda e: f"m should be the row max. {e}")
    want_l = torch.tensor([1 + torch.e**-1 + torch.e**-2, 3.0])
    torch.testing.assert_close(l, want_l, msg=lambda e: (
        f"l should be sum(exp(x - m)), the row max m subtracted before exp (exp(x) alone overflows to inf past "
        f"x = 88 in fp32). {e}"))


@pytest.mark.check("normalizer_public")
def test_normalizer_rescales_when_the_max_grows(sm):
    x = torch.tensor([[0.0, 1.0, 5.0, 2.0, 9.0]])
    m, l = sm.online_normalizer(OnceIterable([x[:, :2], x[:, 2:4], x[:, 4:]], "the chunks"))
    want = torch.exp(x.double() - 9.0).sum()
    assert float(m) == 9.0, f"m should be 9 (the row max), found {float(m)}"
    assert_close(float(l), float(want), atol=1e-5, what="l", hint=(
        "When a later chunk raises the max, "
        "the sum so far must be multiplied by exp(old_max - new_max)."
    ))


@pytest.mark.check("normalizer_public")
def test_normalizer_reads_the_chunks_once_and_skips_empty_ones(sm):
    x = torch.randn(3, 7, generator=testing.generator(0))
    cuts = [0, 0, 4, 4, 7]  # chunks of 0, 4, 0 and 3 columns
    chunks = OnceIterable([x[:, a:b] for a, b in zip(cuts, cuts[1:])], "the chunks")
    m, l = sm.online_normalizer(chunks)
    want_m = x.double().amax(1)
    want_l = torch.exp(x.double() - want_m[:, None]).sum(1)
    assert_close(m, want_m, atol=1e-6, what="m [row] for chunks of 0, 4, 0 and 3 columns",
                 hint="m is the row max over every chunk; an empty chunk holds no column and changes nothing")
    assert_close(l, want_l, atol=1e-6, rtol=1e-5, what="l [row] for chunks of 0, 4, 0 and 3 columns",
                 hint=lambda index: f"Row {index[0]}: " + blocks.explain_state(
                     x[index[0]], float(l[index[0]]), float(want_l[index[0]]), cuts))


@pytest.mark.check("normalizer_public")
def test_normalizer_needs_a_chunk(sm):
    with pytest.raises(ValueError):
        sm.online_normalizer(OnceIterable([], "the chunks"))


@pytest.mark.check("merge_public")
def test_merge_two_states(sm):
    x = torch.tensor([[1.0, -2.0, 4.0, 3.0]])  # the second half holds the max: the first sum must be rescaled
    a, b = x[:, :2], x[:, 2:]
    state = lambda t: (t.amax(1), torch.exp(t - t.amax(1, keepdim=True)).sum(1))  # noqa: E731
    m, l = sm.merge_states(*state(a), *state(b))
    want_m, want_l = state(x)
    assert_close(m, want_m, atol=0, what="merged m", hint="m is the larger of the two maxima")
    assert_close(l, want_l, atol=1e-6, rtol=1e-6, what="merged l", hint=(
        "Rescale both sums to the common max m before adding: l_a * exp(m_a - m) + l_b * exp(m_b - m)"
    ))


@pytest.mark.check("merge_public")
def test_merge_with_the_empty_state_changes_nothing(sm):
    m_a, l_a = torch.tensor([2.0, -INF]), torch.tensor([1.5, 0.0])
    empty_m, empty_l = torch.full((2,), -INF), torch.zeros(2)
    m, l = sm.merge_states(m_a, l_a, empty_m, empty_l)
    assert not torch.isnan(l).any(), (
        f"merging with the empty state (-inf, 0) gave NaN in l = {show(l)}: exp(-inf - (-inf)) is NaN; "
        "subtract 0 when the max is -inf"
    )
    assert torch.equal(m, m_a) and torch.equal(l, l_a), f"expected ({show(m_a)}, {show(l_a)}), found ({show(m)}, {show(l)})"


@pytest.mark.check("softmax_public")
@pytest.mark.parametrize("block_size", [1, 3, 4, 1024])
def test_softmax_matches_the_textbook(sm, block_size):
    x = torch.randn(2, 3, 10, generator=testing.generator(1)) * 4
    out = sm.online_softmax(x, block_size=block_size)
    assert out.shape == x.shape and out.dtype == x.dtype, f"expected {tuple(x.shape)} {x.dtype}, found {tuple(out.shape)} {out.dtype}"
    want = textbook_softmax(x)
    assert_close(out, want, atol=1e-6, rtol=1e-5, what=f"online_softmax with block_size={block_size}",
                 hint="Is the last, partial block included?")


@pytest.mark.check("softmax_public")
def test_softmax_of_a_masked_row_is_zero(sm):
    x = torch.tensor([[-INF, -INF, -INF], [0.0, -INF, 0.0]])
    out = sm.online_softmax(x, block_size=2)
    want = torch.tensor([[0.0, 0.0, 0.0], [0.5, 0.0, 0.5]])
    assert not torch.isnan(out).any(), f"found NaN in {show(out)}: a row of only -inf must give zeros"
    bad = mismatches(out, want, atol=1e-6)
    assert_close(out, want, atol=1e-6, what="online_softmax with block_size=2 [row, column]",
                 hint=lambda index: f"Row {index[0]}: " + blocks.explain_row(
                     x[index[0]], out[index[0]], want[index[0]], bad[index[0]], blocks.block_cuts(3, 2)))


@pytest.mark.check("softmax_public")
def test_softmax_keeps_the_dtype(sm):
    x = torch.randn(4, 9, generator=testing.generator(2)).half()
    out = sm.online_softmax(x, block_size=4)
    assert out.dtype == torch.float16, f"expected float16 output for float16 input, found {out.dtype}"
    assert_close(out, textbook_softmax(x), atol=2e-3, what="online_softmax of float16 [row, column]",
                 hint="Compute in float32, then cast the output back to the input's dtype")


@pytest.mark.check("triton_public")
def test_triton_small_rows(smk, device):
    x = (torch.randn(3, 5, generator=testing.generator(3)) * 3).to(device)  # CUDA: Triton needs GPU tensors
    out = smk.softmax_triton(x)
    assert out.shape == x.shape and out.dtype == x.dtype, (
        f"expected {tuple(x.shape)} {x.dtype}, found {tuple(out.shape)} {out.dtype}"
    )
    assert_triton_rows(out, x, "softmax_triton [row, column]")


@pytest.mark.check("triton_public")
def test_triton_transposed_input(smk, device):
    x = torch.randn(6, 4, generator=testing.generator(4)).to(device).t()  # shape [4, 6], strides (1, 4)
    out = smk.softmax_triton(x)
    assert out.is_contiguous(), "the output must be a new contiguous tensor"
    assert_triton_rows(out, x, "softmax_triton of a transposed x [row, column]",
                       " Use x.stride(0) and x.stride(1), not the shape, to address x.")


def assert_triton_rows(out, x, what, hint=""):
    """softmax_triton's output against the textbook; a failure names the first wrong column and where
    it sits against your kernel's tiles."""
    want = textbook_softmax(x)

    def explain(index):  # called only on a failure
        row = index[0]
        bad = mismatches(out[row], want[row], atol=1e-6, rtol=1e-5)
        why = blocks.explain_row(x[row], out[row], want[row], bad, None, "tile")
        unwritten = (" Under the kernel rule the memory your host code allocates with torch.empty reads NaN, so "
                     "a NaN may also be an element no kernel wrote: does your grid cover every row?"
                     if bool(torch.isnan(out[index]).all()) and "never written" not in why else "")
        return f"Row {row}: " + why + hint + unwritten

    assert_close(out, want, atol=1e-6, rtol=1e-5, what=what, hint=explain)


# The rules, as the hidden checks apply them: a few points here, and every hidden check's points there.

RULE_CALLS = {
    "online_normalizer": lambda sm, x: sm.online_normalizer(OnceIterable([x[:, :3], x[:, 3:]], "the chunks")),
    "merge_states": lambda sm, x: sm.merge_states(x.amax(1), torch.ones(3), x.amin(1), torch.full((3,), 2.0)),
    "online_softmax": lambda sm, x: sm.online_softmax(x, block_size=4),
    "softmax_triton": lambda sm, x: sm.softmax_triton(x),
}
RULE_HINTS = {
    "online_normalizer": "build (m, l) from torch.amax, torch.exp and sum; no library softmax or logsumexp",
    "merge_states": "rescale with torch.exp and add; torch.logaddexp is the merge done for you",
    "online_softmax": "use your online_normalizer, then exp(x - m) / l block by block",
    "softmax_triton": "keep the host code to allocating the output and launching your kernel",
}


def rule_broken(exc: BaseException) -> bool:
    """The guard's refusal, in-process (integrity.ForbiddenCall) or from the sandbox (a stand-in of that name)."""
    return any(c.__name__ in ("ForbiddenCall", "GuardRemoved") for c in type(exc).__mro__)


@pytest.mark.check("rules_public")
@pytest.mark.parametrize("function", list(RULE_CALLS))
def test_the_grading_rules_hold(sm_ruled, smk, device, function):
    x = (torch.randn(3, 7, generator=testing.generator(10)) * 3).to(device)
    module = smk if function == "softmax_triton" else sm_ruled
    try:
        result = RULE_CALLS[function](module, x)
    except Exception as exc:  # noqa: BLE001 - a rule broken is reported as such; anything else as itself
        if not rule_broken(exc):
            raise
        raise AssertionError(
            f"{function} breaks a rule every hidden check of it is graded under, so it would score zero there: "
            f"{str(exc).rstrip('.')}. Hint: {RULE_HINTS[function]}."
        ) from None
    if function == "online_normalizer":
        want_m = x.double().amax(1)
        want = (want_m, torch.exp(x.double() - want_m[:, None]).sum(1))
    elif function == "merge_states":
        m = torch.maximum(x.amax(1), x.amin(1)).double()
        want = (m, torch.exp(x.amax(1).double() - m) + 2 * torch.exp(x.amin(1).double() - m))
    else:
        assert_close(result, textbook_softmax(x), atol=1e-5, rtol=1e-5, what=f"{function} under the rules")
        return
    assert isinstance(result, tuple) and len(result) == 2, f"{function} returns (m, l), found {show(result)}"
    for name, got, expected in zip("ml", result, want):
        assert_close(got, expected, atol=1e-5, rtol=1e-5, what=f"{name} from {function} under the rules")
