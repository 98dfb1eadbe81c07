"""Speculative decoding: the reference solution.

A small draft model q proposes gamma tokens one by one; the large target model p scores all of them
in ONE forward pass. Each draft token x is kept with probability min(1, p(x) / q(x)); at the first
rejection the token is replaced by a sample from norm(max(0, p - q)); if all gamma survive, the
target's own distribution at the next position gives one bonus token for free. Every emitted token
is then distributed exactly as the target would have sampled it (Leviathan et al. 2022, section 2.3
and appendix A.1), but one target pass yields between 1 and gamma + 1 tokens.

Letters: p is the TARGET, q the DRAFT, as in the paper. Some codebases swap them; this one does not.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Tensor = torch.Tensor
Model = Callable[[Tensor], Tensor]


# --------------------------------------------------------------------------------------------------
# The numbers: how many tokens one target pass buys, and what that is worth in wall time


def acceptance_rate(p: Tensor, q: Tensor) -> Tensor:
    """alpha = sum_x min(p(x), q(x)): the probability that a token drawn from q survives the test."""
    return torch.minimum(p, q).sum(dim=-1)


def expected_tokens_per_step(alpha: float | Tensor, gamma: int) -> float | Tensor:
    """Equation 1: E[tokens per target pass] = (1 - alpha^(gamma+1)) / (1 - alpha) = 1 + alpha + ... + alpha^gamma.

    The geometric sum is written out term by term: it is exact at alpha = 1 (gamma + 1), where the
    closed form divides 0 by 0, and it loses no digits just below 1.
    """
    total = alpha * 0 + 1.0  # the k = 0 term, with alpha's type and shape
    term = total
    for _ in range(gamma):
        term = term * alpha
        total = total + term
    return total


def expected_speedup(alpha: float | Tensor, gamma: int, draft_cost_ratio: float) -> float | Tensor:
    """The paper's wall-time improvement factor (Theorem 3.8): tokens per step over the cost of a step.

    A step costs gamma draft passes and one target pass, that is (gamma * c + 1) target passes when a
    draft pass costs c = draft_cost_ratio of a target pass; plain decoding gets 1 token per target pass.
    """
    return expected_tokens_per_step(alpha, gamma) / (gamma * draft_cost_ratio + 1)


# --------------------------------------------------------------------------------------------------
# One verification step


def _uniform_open_closed(shape: tuple[int, ...], generator: torch.Generator, device: torch.device) -> Tensor:
    """u uniform on (0, 1]: 1 - U[0, 1). With u > 0, a token with p(x) = 0 can never pass u <= p/q."""
    return 1.0 - torch.rand(shape, generator=generator, device=device)


def _assemble(draft_tokens: Tensor, num_accepted: Tensor, extra: Tensor) -> Tensor:
    """[B, gamma + 1] int64: the accepted draft prefix, the extra token at num_accepted, then -1."""
    B, gamma = draft_tokens.shape
    positions = torch.arange(gamma + 1, device=draft_tokens.device)
    padded = torch.cat([draft_tokens.long(), draft_tokens.new_full((B, 1), -1, dtype=torch.long)], dim=1)
    tokens = torch.where(positions < num_accepted[:, None], padded, -1)
    return tokens.scatter(1, num_accepted[:, None], extra.long()[:, None])


def speculative_accept(
    draft_tokens: Tensor, draft_probs: Tensor, target_probs: Tensor, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Verify gamma draft tokens per row against the target; emit between 1 and gamma + 1 tokens per row.

    Args:
        draft_tokens: [B, gamma] int, x_i ~ q_i.
        draft_probs: [B, gamma, V], q_i: the draft's distribution at each drafted position.
        target_probs: [B, gamma + 1, V], p_i: the target's distribution at the same positions, plus one.
        generator: the only source of randomness.

    Returns:
        tokens [B, gamma + 1] int64 (-1 after the last emitted token), num_accepted [B] int64.
    """
    B, gamma = draft_tokens.shape
    device = target_probs.device
    rows = torch.arange(B, device=device)

    # 1. What the draft and the target think of each drafted token.
    index = draft_tokens.long().unsqueeze(-1)                              # [B, gamma, 1]
    q_x = draft_probs.gather(-1, index).squeeze(-1).float()                # [B, gamma]
    p_x = target_probs[:, :gamma].gather(-1, index).squeeze(-1).float()   # [B, gamma]

    # 2. Keep x_i when u_i <= p(x)/q(x). Written as u*q <= p so that q = 0 divides nothing; a token
    #    with q = 0 could not have been drafted, so it is rejected outright.
    u = _uniform_open_closed((B, gamma), generator, device)
    accepted = (q_x > 0) & (u * q_x <= p_x)

    # 3. Stop at the first rejection: the count of leading Trues.
    num_accepted = accepted.long().cumprod(dim=1).sum(dim=1)              # [B], in 0..gamma

    # 4. The one extra token. Rejected at i = num_accepted: from norm(max(0, p_i - q_i)).
    #    All gamma accepted (i = gamma): the bonus, from p_gamma. Either way p comes from row i.
    p_next = target_probs[rows, num_accepted].float()                      # [B, V]
    if gamma > 0:
        q_next = draft_probs[rows, num_accepted.clamp(max=gamma - 1)].float()
        residual = (p_next - q_next).clamp(min=0)
        residual = torch.where((num_accepted == gamma)[:, None], p_next, residual)
    else:
        residual = p_next
    # A residual with no mass at all (p <= q everywhere, so p == q up to rounding): sample from p.
    mass = residual.sum(dim=-1, keepdim=True)
    residual = torch.where(mass > 0, residual, p_next)
    extra = torch.multinomial(residual, 1, generator=generator).squeeze(1)  # normalises internally

    return _assemble(draft_tokens, num_accepted, extra), num_accepted


def greedy_accept(draft_tokens: Tensor, target_probs: Tensor) -> tuple[Tensor, Tensor]:
    """Temperature 0: keep draft tokens while they equal the target's argmax; then emit the argmax."""
    best = target_probs.argmax(dim=-1)                                     # [B, gamma + 1]
    gamma = draft_tokens.shape[1]
    matches = draft_tokens.long() == best[:, :gamma]
    num_accepted = matches.long().cumprod(dim=1).sum(dim=1)
    extra = best.gather(1, num_accepted[:, None]).squeeze(1)
    return _assemble(draft_tokens, num_accepted, extra), num_accepted


# --------------------------------------------------------------------------------------------------
# The whole loop


def speculative_generate(
    target: Model, draft: Model, prefix: Tensor, gamma: int, max_new_tokens: int, generator: torch.Generator
) -> tuple[Tensor, int]:
    """Draft gamma tokens, verify them with one target call, advance each row by what it kept; repeat.

    `target(tokens)` and `draft(tokens)` map [B, L] token ids to [B, L, V] probabilities, causally:
    probs[:, t] is the distribution of the token after tokens[:, :t+1]. Every row lives in one
    buffer and keeps its own length; what lies right of a row's length is padding, which a causal
    model never reads when it predicts positions left of it.
    """
    B, P = prefix.shape
    device = prefix.device
    rows = torch.arange(B, device=device)
    steps = torch.arange(gamma + 1, device=device)
    # Room for a finished row to keep stepping (its extra tokens land past what we return).
    seq = torch.zeros(B, P + max_new_tokens + 2 * (gamma + 1), dtype=torch.long, device=device)
    seq[:, :P] = prefix
    length = torch.full((B,), P, dtype=torch.long, device=device)
    target_calls = 0

    while int((length - P).min()) < max_new_tokens:
        # Draft: gamma calls of the small model, each row read at its own end.
        draft_tokens, draft_dists = [], []
        for i in range(gamma):
            q = draft(seq[:, : int(length.max()) + i])
            q_i = q[rows, length - 1 + i].float()                          # [B, V]
            x = torch.multinomial(q_i, 1, generator=generator).squeeze(1)
            seq[rows, length + i] = x
            draft_tokens.append(x)
            draft_dists.append(q_i)

        # Verify: ONE call of the big model scores all gamma drafts and the position after them.
        p = target(seq[:, : int(length.max()) + gamma])
        target_calls += 1
        target_probs = p[rows[:, None], length[:, None] - 1 + steps]        # [B, gamma + 1, V]
        V = target_probs.shape[-1]
        draft_tokens = torch.stack(draft_tokens, 1) if gamma else seq.new_empty(B, 0)
        draft_probs = torch.stack(draft_dists, 1) if gamma else target_probs.new_empty(B, 0, V)

        tokens, num_accepted = speculative_accept(draft_tokens, draft_probs, target_probs, generator)

        # Write what each row kept (the -1s become padding) and advance; finished rows stay put.
        seq[rows[:, None], length[:, None] + steps] = tokens.clamp(min=0)
        active = (length - P) < max_new_tokens
        length = torch.where(active, length + num_accepted + 1, length)

    return seq[:, P : P + max_new_tokens].clone(), target_calls
