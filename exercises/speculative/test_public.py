"""Public tests for speculative decoding: small, fast, and each failure says what to look at.

Run: make check EX=speculative   (or: .venv/bin/pytest exercises/speculative)
Oracles are the textbook formulas and hand-made cases. The one statistical test uses a bound that a
correct solution breaks with probability below 1e-6 (see `bernstein_halfwidth`), with a fixed seed.
"""

import math

import pytest
import torch

from grader import testing

from grader.testing import assert_close, show

DRIVER = "grader.support.speculative:generate"


@pytest.fixture(scope="module")
def sm(student):
    return student.load("speculative")


def gen(seed: int) -> torch.Generator:
    return testing.generator(seed)


def bernstein_halfwidth(n: int, prob: float, delta: float) -> float:
    """t such that a Binomial(n, prob) count lies within n * prob +- t with probability >= 1 - delta."""
    log_term = math.log(2 / delta)
    return log_term / 3 + math.sqrt((log_term / 3) ** 2 + 2 * log_term * n * prob * (1 - prob))


# --------------------------------------------------------------------------------------------------
# The formulas


@pytest.mark.check("formulas_public")
def test_acceptance_rate_is_the_overlap(sm):
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.2, 0.2, 0.2, 0.4], [0.25, 0.25, 0.25, 0.25]])
    got = sm.acceptance_rate(p, q)
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == (2,), (
        f"one rate per distribution: expected a tensor of shape [2], found {type(got).__name__} {show(getattr(got, 'shape', got))}")
    torch.testing.assert_close(got, torch.tensor([0.6, 1.0]), msg=lambda e: f"alpha = sum_x min(p(x), q(x)). {e}")


@pytest.mark.check("formulas_public")
def test_expected_tokens_per_step(sm):
    got = float(sm.expected_tokens_per_step(0.6, 3))
    assert_close(got, 2.176, atol=1e-9, what="expected_tokens_per_step(0.6, 3)", hint=(
        "alpha = 0.6, gamma = 3: (1 - 0.6^4) / (1 - 0.6) = 2.176 tokens per target pass. "
        "Remember the bonus token: the sum runs from alpha^0 to alpha^gamma"
    ))
    assert float(sm.expected_tokens_per_step(0.0, 5)) == 1.0, "alpha = 0: every draft rejected, still 1 token per pass"
    at_one = float(sm.expected_tokens_per_step(1.0, 4))
    assert at_one == 5.0, f"alpha = 1: all gamma drafts plus the bonus, 5 tokens; found {at_one} (0/0 in the closed form?)"
    alpha = torch.tensor([0.0, 0.5, 1.0])
    got = sm.expected_tokens_per_step(alpha, 2)
    torch.testing.assert_close(got, torch.tensor([1.0, 1.75, 3.0]), msg=lambda e: f"a tensor alpha works elementwise. {e}")


@pytest.mark.check("formulas_public")
def test_expected_speedup(sm):
    got = float(sm.expected_speedup(0.8, 4, 0.05))
    want = (1 - 0.8**5) / (1 - 0.8) / (4 * 0.05 + 1)
    assert_close(got, want, atol=1e-9, what="expected_speedup(0.8, 4, 0.05)", hint=(
        "A step costs 4 draft passes "
        "(0.05 each) and one target pass: divide the tokens per step by gamma * c + 1"
    ))


# --------------------------------------------------------------------------------------------------
# speculative_accept


def check_layout(tokens, num_accepted, draft, vocab):
    B, gamma = draft.shape
    assert isinstance(tokens, torch.Tensor) and isinstance(num_accepted, torch.Tensor), (
        f"tokens and num_accepted must be tensors, found {type(tokens).__name__} and {type(num_accepted).__name__}"
    )
    assert tokens.dtype == torch.int64 and num_accepted.dtype == torch.int64, (
        f"tokens and num_accepted must be int64, found {tokens.dtype} and {num_accepted.dtype}"
    )
    assert tuple(tokens.shape) == (B, gamma + 1), f"tokens must be [B, gamma + 1] = [{B}, {gamma + 1}], found {list(tokens.shape)}"
    assert tuple(num_accepted.shape) == (B,), f"num_accepted must be [B] = [{B}], found {list(num_accepted.shape)}"
    for b in range(B):
        n = int(num_accepted[b])
        row = tokens[b].tolist()  # gamma + 1 tokens: the shape is checked above
        assert 0 <= n <= gamma, f"row {b}: num_accepted = {n} is outside 0..{gamma}"
        assert row[:n] == draft[b, :n].tolist(), (
            f"row {b}: the first {n} tokens must be the accepted draft tokens, found {show(tokens[b])}")
        assert 0 <= row[n] < vocab, f"row {b}: position {n} (num_accepted) must hold the extra token, found {row[n]}" + (
            f" (all {gamma} drafts were accepted: the extra token is the bonus, drawn from target_probs[:, {gamma}])"
            if n == gamma else "")
        assert row[n + 1 :] == [-1] * (gamma - n), (
            f"row {b}: tokens = {show(tokens[b])} with num_accepted = {n}; everything after the extra token is -1"
        )


@pytest.mark.check("accept_public")
def test_p_equal_q_accepts_everything_and_adds_the_bonus(sm):
    p = torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.25, 0.25], [0.0, 0.0, 1.0]]).expand(4, 3, 3).contiguous()
    q = p[:, :2].clone()
    draft = torch.tensor([[1, 0], [2, 0], [0, 1], [1, 2]])
    tokens, num_accepted = sm.speculative_accept(draft, q, p, gen(0))
    check_layout(tokens, num_accepted, draft, 3)
    hint = ""
    if num_accepted.tolist() != [2, 2, 2, 2]:  # two more calls: is draft token i scored with target row i?
        one = torch.tensor([[[1.0, 0.0, 0.0]]])
        try:
            _, n = sm.speculative_accept(torch.tensor([[0]]), one, torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]]), gen(5))
            _, both = sm.speculative_accept(torch.tensor([[0]]), one, torch.tensor([[[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]]), gen(6))
        except Exception:  # noqa: BLE001  (the count above is the verdict; these calls only explain it)
            n = both = None
        if isinstance(n, torch.Tensor) and n.tolist() == [0] and isinstance(both, torch.Tensor) and both.tolist() == [1]:
            hint = (". Two more calls, gamma = 1, where target row 0 and the draft are both sure of token 0: yours "
                    "rejected it where target row 1 gives it 0 and kept it where row 1 is sure of it too: score draft "
                    "token i with target row i (target_probs[:, i]); the last row, gamma, is only for the bonus")
    assert num_accepted.tolist() == [2, 2, 2, 2], (
        f"with p == q every draft token passes u <= p(x)/q(x) = 1 (u in (0, 1]); num_accepted = {show(num_accepted)}"
        + hint
    )
    assert tokens[:, 2].tolist() == [2, 2, 2, 2], (
        "all gamma = 2 accepted, so the bonus comes from target_probs[:, 2], which puts all its mass on token 2; "
        f"found {show(tokens[:, 2])}"
    )


@pytest.mark.check("accept_public")
def test_a_token_the_target_forbids_is_rejected_and_not_resampled(sm):
    # The draft is sure of token 0; the target gives token 0 probability 0.
    p = torch.tensor([[0.0, 0.5, 0.5], [0.2, 0.3, 0.5]]).expand(50, 2, 3).contiguous()
    q = torch.tensor([[1.0, 0.0, 0.0]]).expand(50, 1, 3).contiguous()
    draft = torch.zeros(50, 1, dtype=torch.long)
    tokens, num_accepted = sm.speculative_accept(draft, q, p, gen(1))
    check_layout(tokens, num_accepted, draft, 3)
    assert (num_accepted == 0).all(), (
        "p(0) = 0, so the test u <= p(0)/q(0) = 0 must fail for every u in (0, 1]: draw u as 1 - torch.rand(...)"
    )
    assert (tokens[:, 0] != 0).all(), "after the rejection the token comes from max(0, p - q) = [0, 0.5, 0.5]: never token 0"
    assert (tokens[:, 1] == -1).all(), "one rejection ends the row: position 1 must be -1"


@pytest.mark.check("accept_public")
def test_one_position_histogram_matches_the_target(sm):
    n, delta = 40_000, 1e-6
    p = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.4, 0.3, 0.2, 0.1]])
    g = gen(2)
    draft = torch.multinomial(q[0], n, replacement=True, generator=g)[:, None]
    tokens, num_accepted = sm.speculative_accept(draft, q.expand(n, 1, 4).contiguous(), p.expand(n, 2, 4).contiguous(), gen(3))
    assert isinstance(tokens, torch.Tensor) and tuple(tokens.shape) == (n, 2), (
        f"tokens must be a tensor [B, gamma + 1] = [{n}, 2], found {type(tokens).__name__} {show(getattr(tokens, 'shape', tokens))}")
    first = tokens[:, 0]
    outside = (first < 0) | (first >= 4)
    assert not outside.any(), f"position 0 always holds a token in [0, 4): row {int(outside.nonzero()[0])} has {int(first[outside][0])}"
    counts = torch.bincount(first, minlength=4)
    for k in range(4):
        half = bernstein_halfwidth(n, float(p[0, k]), delta / 4)
        got = int(counts[k])
        assert_close(got, n * float(p[0, k]), atol=half, what=f"position 0: how often token {k} came out in {n} draws", hint=(
            f"That is {got / n:.4f} of the time; the target says {float(p[0, k]):.2f} "
            f"(+-{half / n:.4f}). Accept x with probability min(1, p(x)/q(x)); after a rejection sample "
            "norm(max(0, p - q)) = [0, 0, 1/3, 2/3] here, not p or q"
        ))
    alpha = 0.1 + 0.2 + 0.2 + 0.1
    accepted = int((num_accepted == 1).sum())
    half = bernstein_halfwidth(n, alpha, delta)
    assert abs(accepted - n * alpha) <= half, (
        f"{accepted / n:.4f} of the drafts were accepted; sum(min(p, q)) = {alpha:.2f} predicts that fraction"
    )


# --------------------------------------------------------------------------------------------------
# greedy_accept (tables from vLLM's tests of its rejection sampler)


def probs_with_argmax(best: list[list[int]], vocab: int = 10) -> torch.Tensor:
    logits = torch.full((len(best), len(best[0]), vocab), -5.0)
    for b, row in enumerate(best):
        for i, t in enumerate(row):
            logits[b, i, t] = 5.0
    return torch.softmax(logits, -1)


@pytest.mark.check("greedy_public")
@pytest.mark.parametrize(
    "draft, best, expected",
    [
        ([[1, 2, 3]], [[1, 2, 3, 4]], [[1, 2, 3, 4]]),
        ([[1, 2, 3]], [[1, 5, 3, 4]], [[1, 5, -1, -1]]),
        ([[1, 2], [3, 4]], [[1, 5, 6], [3, 4, 7]], [[1, 5, -1], [3, 4, 7]]),
    ],
    ids=["all-accepted-plus-bonus", "mismatch-in-the-middle", "mixed-rows"],
)
def test_greedy_tables(sm, draft, best, expected):
    tokens, num_accepted = sm.greedy_accept(torch.tensor(draft), probs_with_argmax(best))
    B, gamma = len(draft), len(draft[0])
    assert isinstance(tokens, torch.Tensor) and tuple(tokens.shape) == (B, gamma + 1), (
        f"tokens must be a tensor [B, gamma + 1] = [{B}, {gamma + 1}], found {type(tokens).__name__} "
        f"{show(getattr(tokens, 'shape', tokens))}")
    assert isinstance(num_accepted, torch.Tensor) and tuple(num_accepted.shape) == (B,), (
        f"num_accepted must be a tensor [B] = [{B}], found {type(num_accepted).__name__} "
        f"{show(getattr(num_accepted, 'shape', num_accepted))}")
    hint = ""
    for d, b, f in zip(draft, best, tokens.tolist()):
        miss = next((i for i in range(gamma) if d[i] != b[i]), None)
        if miss is None and f[:gamma] == d and f[gamma] == -1:
            hint = f". Every draft token of {d} matches, and the bonus is missing: emit the last row's argmax, {b[gamma]}"
        elif miss is not None and f[miss] == d[miss]:
            hint = (f". Draft {d} first differs from the argmax at position {miss}, where you kept its token: the "
                    "first mismatch ends the row, even if later draft tokens match again")
        if hint:
            break
    assert tokens.tolist() == expected, (
        f"draft {draft}, target argmax {best}: expected {expected}, found {show(tokens)}. Keep draft tokens "
        "while they equal the argmax; at the first mismatch emit the argmax and pad with -1; if all match, "
        f"append the argmax of the last row (the bonus){hint}"
    )
    assert num_accepted.tolist() == [sum(t != -1 for t in row) - 1 for row in expected], (
        f"num_accepted counts the kept draft tokens; found {show(num_accepted)}"
    )


# --------------------------------------------------------------------------------------------------
# speculative_generate (the models are n-gram tables, built next to your code by a course driver)


@pytest.mark.check("generate_public")
def test_generate_shapes_and_calls_when_draft_equals_target(student, sm):
    table = torch.softmax(torch.randn(5, 5, generator=gen(4)), -1)  # a bigram model over 5 tokens
    prefix = torch.tensor([[0, 1, 2], [4, 4, 4]])
    result = student.drive(DRIVER, sm.speculative_generate, table, table, prefix, 3, 10, 5)
    tokens, calls = result["tokens"][0], result["reported_calls"][0]
    assert isinstance(tokens, torch.Tensor) and tokens.dtype == torch.int64 and tuple(tokens.shape) == (2, 10), (
        f"expected the 10 new tokens per row, int64 [2, 10] (without the prefix), found {type(tokens).__name__} "
        f"{show(getattr(tokens, 'dtype', ''))} {show(getattr(tokens, 'shape', tokens))}"
    )
    assert ((tokens >= 0) & (tokens < 5)).all(), f"every returned token is a real token id, found {show(tokens)}"
    assert int(calls) == result["target_calls"][0], (
        f"you reported {calls} target calls but the target model was called {result['target_calls'][0]} times"
    )
    late = ""
    if result["target_calls"][0] != 3:  # one row of one-hot models: every next token certain (0 -> 1 -> 2 -> ...)
        cycle = torch.eye(5)[(torch.arange(5) + 1) % 5]
        try:
            probe = student.drive(DRIVER, sm.speculative_generate, cycle, cycle, torch.tensor([[0]]), 3, 4, 5)["tokens"][0]
        except Exception:  # noqa: BLE001  (the call count is the verdict; this run only explains it)
            probe = None
        if isinstance(probe, torch.Tensor) and probe.dim() == 2 and probe.shape[1] >= 1 and int(probe[0, 0]) == 2:
            late = (". A second run, one row, where both models put all their mass on t + 1 after t, prefix [0]: your "
                    "first new token is 2, not 1: the target's rows were read one position late. The gamma + 1 rows "
                    "that score the drafts (and the bonus) start at length - 1, the prefix's last position")
    assert result["target_calls"][0] == 3, (
        f"draft == target, so every step keeps all 3 drafts plus the bonus: 4 tokens per call, 3 calls for 10 "
        f"tokens; found {result['target_calls'][0]}. Advance each row by num_accepted + 1{late}"
    )


# --------------------------------------------------------------------------------------------------
# No Python loop over rows (the hidden `vectorised` check does this at more sizes, with the clock)


def certain_case(B: int, gamma: int, vocab: int, rng: torch.Generator):
    """Rows whose outcome is certain: p = q one-hot at the draft tokens (every draft token is accepted)
    and a one-hot last target row (the bonus token), so the answer is known without sampling."""
    draft = torch.randint(0, vocab, (B, gamma), generator=rng)
    bonus = torch.randint(0, vocab, (B,), generator=rng)
    q = torch.nn.functional.one_hot(draft, vocab).float()
    p = torch.cat([q, torch.nn.functional.one_hot(bonus, vocab).float()[:, None]], 1)
    return draft, q, p, torch.cat([draft, bonus[:, None]], 1)


def assert_rows_counted_flat(student, fn, name: str, inputs, what: str, advice: str) -> None:
    """Call fn at 16 and at 160 rows on certain cases (`inputs(draft, q, p)` makes its arguments): the right
    tokens both times, and the same lines, operators and read-backs."""
    from grader.structure import assert_no_hidden_loop

    rng, work = gen(len(name)), {}
    for B in (16, 160):
        draft, q, p, want = certain_case(B, 3, 8, rng)

        def check(out, want=want, B=B):
            tokens = out[0] if isinstance(out, (tuple, list)) and len(out) == 2 else None
            assert isinstance(tokens, torch.Tensor) and tokens.shape == want.shape and torch.equal(tokens, want), (
                f"{name} {what} ({B} rows): expected {show(want)}, found {show(tokens)}")

        _, work[B] = student.work_executed(fn, *inputs(draft, q, p, B), check=check)
    assert work[160].lines <= work[16].lines + 8, (
        f"{name} ran {work[16].lines} lines of your file for 16 rows and {work[160].lines} for 160: a Python loop "
        f"over rows. {advice}")
    assert_no_hidden_loop(name, ("16 rows", "160 rows"), work[16], work[160], advice, max_ops=None)


@pytest.mark.check("vectorised_public")
def test_accept_runs_the_same_lines_for_16_and_160_rows(sm, student):
    assert_rows_counted_flat(
        student, sm.speculative_accept, "speculative_accept", lambda draft, q, p, B: (draft, q, p, gen(B)),
        "with p = q one-hot at the draft tokens: every draft token is accepted and the bonus token is the last "
        "target row's only token", "Decide every row at once: gather the probabilities, compare, cumprod, torch.where.")


@pytest.mark.check("vectorised_public")
def test_greedy_runs_the_same_lines_for_16_and_160_rows(sm, student):
    assert_rows_counted_flat(
        student, sm.greedy_accept, "greedy_accept", lambda draft, q, p, B: (draft, p),
        "where every draft token is the target's argmax", "Compare every row with its argmax in one tensor operation.")
