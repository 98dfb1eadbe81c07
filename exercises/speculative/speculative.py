"""Speculative decoding: the exercise. Read README.md in this folder first.

Fill in the six functions below; each raises NotImplementedError until you do. Run the public tests
with `make check EX=speculative` (or `.venv/bin/pytest exercises/speculative`).

Letters, as in Leviathan et al. (2022): p is the TARGET (the big model whose samples we want), q is
the DRAFT (the small model that guesses). Some codebases swap them; this file does not.

Conventions shared by every function here:
- the vocabulary is the last dim; probabilities are float32 (float64 must work too), rows sum to 1;
- token ids are int64; -1 marks "no token" in the output of the accept functions;
- all randomness comes from the `generator` argument (never torch's global generator), on the same
  device as the probabilities; no Python loop over the batch or the vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Tensor = torch.Tensor
Model = Callable[[Tensor], Tensor]


def acceptance_rate(p: Tensor, q: Tensor) -> Tensor:
    """alpha = sum over the vocabulary of min(p(x), q(x)): the chance that a draft token is accepted.

    Args:
        p, q: [..., V] target and draft distributions (same shape).

    Returns:
        [...]: one rate per distribution, in [0, 1]; 1 exactly when p == q, 0 for disjoint supports.
    """
    raise NotImplementedError("acceptance_rate: the overlap of the two distributions")


def expected_tokens_per_step(alpha: float | Tensor, gamma: int) -> float | Tensor:
    """Equation 1 of the paper: expected tokens emitted per target pass, (1 - alpha^(gamma+1)) / (1 - alpha).

    Args:
        alpha: the acceptance rate, a float or a tensor (then elementwise, same shape out).
        gamma: the number of draft tokens per step (>= 0).

    Returns:
        A float for a float alpha, a tensor for a tensor alpha. At alpha = 1 the value is the limit,
        gamma + 1 (never NaN), and just below 1 it stays accurate.
    """
    raise NotImplementedError("expected_tokens_per_step: a geometric sum; mind alpha = 1")


def expected_speedup(alpha: float | Tensor, gamma: int, draft_cost_ratio: float) -> float | Tensor:
    """The paper's expected wall-time improvement factor over plain decoding (Theorem 3.8).

    Args:
        alpha, gamma: as in `expected_tokens_per_step`.
        draft_cost_ratio: c, the time of one draft pass divided by the time of one target pass.

    Returns:
        Tokens per step divided by the cost of a step measured in target passes (gamma draft passes
        and one target pass). A float for a float alpha, a tensor for a tensor alpha.
    """
    raise NotImplementedError("expected_speedup: tokens per step over the cost of one step")


def speculative_accept(
    draft_tokens: Tensor, draft_probs: Tensor, target_probs: Tensor, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Verify gamma draft tokens per row against the target: the accept/resample rule.

    Args:
        draft_tokens: [B, gamma] int64, x_i drawn from q_i.
        draft_probs: [B, gamma, V], q_i: the draft's distribution at each drafted position.
        target_probs: [B, gamma + 1, V], p_i: the target's distribution at the same positions, and one
            more (p_gamma, for the bonus token).
        generator: a torch.Generator, the only source of randomness.

    Per row, left to right: accept x_i while u_i <= p_i(x_i) / q_i(x_i), with u_i uniform on (0, 1]
    (so a token with p = 0 is never accepted); a token with q_i(x_i) = 0 is rejected. At the first
    rejection i the row ends with one token drawn from norm(max(0, p_i - q_i)); if that residual sums
    to exactly 0, draw it from p_i instead. If all gamma are accepted, the row ends with a bonus token
    drawn from p_gamma. Rows are independent; the whole batch is done at once (no loop over rows).

    Returns:
        tokens: [B, gamma + 1] int64: the accepted draft tokens, the one extra token, then -1.
        num_accepted: [B] int64, the number of accepted draft tokens (the row emits num_accepted + 1).
        Never NaN; the inputs are left unchanged.
    """
    raise NotImplementedError("speculative_accept: compare u * q(x) with p(x) for all rows at once")


def greedy_accept(draft_tokens: Tensor, target_probs: Tensor) -> tuple[Tensor, Tensor]:
    """Temperature 0: keep draft tokens while they equal the target's argmax.

    Args:
        draft_tokens: [B, gamma] int64.
        target_probs: [B, gamma + 1, V].

    Returns:
        (tokens [B, gamma + 1] int64, num_accepted [B] int64), laid out as in `speculative_accept`:
        at the first mismatch emit the target's argmax there and pad with -1; if all gamma match, emit
        the argmax of the last row (the bonus). Ties go to the lowest token id, as torch.argmax.
    """
    raise NotImplementedError("greedy_accept: the same layout, with argmax in place of the coin")


def speculative_generate(
    target: Model, draft: Model, prefix: Tensor, gamma: int, max_new_tokens: int, generator: torch.Generator
) -> tuple[Tensor, int]:
    """The whole draft-and-verify loop for a batch.

    Args:
        target, draft: causal models. Each maps token ids [B, L] (int64) to probabilities [B, L, V],
            where probs[:, t] is the distribution of the token that follows tokens[:, :t+1]. They read
            only positions <= t for probs[:, t], so whatever you put right of a row's end is ignored.
        prefix: [B, P] int64, P >= 1: the tokens to continue.
        gamma: draft tokens per step (>= 0; 0 is plain sampling from the target).
        max_new_tokens: how many new tokens to return per row (>= 0).
        generator: the only source of randomness (for the drafts and for `speculative_accept`).

    Each step drafts gamma tokens per row (gamma draft calls, sampling from q at each row's own end),
    then verifies them with ONE target call and `speculative_accept`. Rows advance by their own
    num_accepted + 1; a row that already has max_new_tokens new tokens may keep stepping (its extra
    tokens are dropped) or be left alone. The batch can hold tens of thousands of rows: loop over
    steps, never over rows.

    Returns:
        tokens: [B, max_new_tokens] int64, the new tokens of each row (without the prefix).
        num_target_calls: int, the number of times `target` was called.
    """
    raise NotImplementedError("speculative_generate: one buffer, a length per row, one target call per step")
