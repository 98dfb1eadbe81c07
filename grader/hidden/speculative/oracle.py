"""Naive oracles for speculative decoding's hidden checks: the textbook formulas and plain loops.

None of this is the solution.

- `oracle_acceptance`: the acceptance rate alpha = sum_x min(p(x), q(x)), in fp64.
- `oracle_tokens_per_step`: the expected tokens per target call, sum_{k=0..gamma} alpha^k, term by term
  (Leviathan et al., 2023, equation 1).
- `greedy_oracle`: greedy verification one row and one position at a time: keep the draft token while it
  is the target's argmax (ties: the lowest id), then emit the argmax.
- `sequence_probabilities`: the target's chain-rule probability of every sequence of a short length,
  by exact enumeration over an n-gram table (`ngram_next`: one context's next-token distribution).
- `calls_distribution` / `sum_distribution`: the exact pmf of the number of target calls one run needs
  (a recursion over the tokens still to emit), and of a sum of independent runs (repeated squaring of
  the convolution).
- `outcome_table`: P(n draft tokens accepted, then token x) for one case, by loops over positions and
  tokens in float64: accept with min(1, p(x) / q(x)), else draw from norm(max(0, p - q)) (p itself when
  that is empty), and the bonus token from p after gamma acceptances.
- `one_hot_row_calls` / `one_hot_lockstep_calls`: with one-hot bigram models nothing is random, so a per-row
  loop of the rule gives each row's own number of target calls exactly; and the calls of a batch whose rows
  all advance by the smallest count (only for the message).
"""

from __future__ import annotations

import itertools

import numpy as np
import torch


# --------------------------------------------------------------------------------------------------
# Oracles


def oracle_acceptance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The acceptance rate alpha = sum over tokens of min(p, q), in fp64, over the last dim."""
    return torch.minimum(p.double(), q.double()).sum(-1)


def oracle_tokens_per_step(alpha: float, gamma: int) -> float:
    """Expected tokens per target call, the geometric sum 1 + alpha + ... + alpha^gamma written out."""
    return sum(alpha**k for k in range(gamma + 1))


def lowest_argmax(values: list[float]) -> int:
    """The first index of the largest value (ties: the lowest id)."""
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


def greedy_oracle(draft_tokens: torch.Tensor, target_probs: torch.Tensor) -> tuple[list[list[int]], list[int]]:
    """One row at a time, one position at a time."""
    out, counts = [], []
    probs = target_probs.tolist()
    for b in range(draft_tokens.shape[0]):
        row = []
        for i in range(draft_tokens.shape[1]):
            best = lowest_argmax(probs[b][i])
            if int(draft_tokens[b, i]) != best:
                row.append(best)
                break
            row.append(best)
        else:
            row.append(lowest_argmax(probs[b][-1]))
        counts.append(len(row) - 1)
        out.append(row + [-1] * (draft_tokens.shape[1] + 1 - len(row)))
    return out, counts


def ngram_next(table: torch.Tensor, context: list[int]) -> torch.Tensor:
    """The table's distribution after `context` (contexts left of the start read token 0)."""
    k = table.dim() - 1
    ctx = ([0] * k + list(context))[-k:] if k else []
    return table[tuple(ctx)].double()


def sequence_probabilities(table: torch.Tensor, prefix: list[int], length: int) -> dict[tuple[int, ...], float]:
    """P(x_1..x_length | prefix) under the table, by the chain rule, for every sequence."""
    vocab = table.shape[-1]
    probs = {}
    for seq in itertools.product(range(vocab), repeat=length):
        prob, context = 1.0, list(prefix)
        for token in seq:
            prob *= float(ngram_next(table, context)[token])
            context.append(token)
        probs[seq] = prob
    return probs


def calls_distribution(alpha: float, gamma: int, new_tokens: int) -> np.ndarray:
    """Exact pmf of the number of target calls one B = 1 run needs for `new_tokens` tokens.

    One step emits k tokens with probability alpha^(k-1) (1 - alpha) for k <= gamma, and gamma + 1
    tokens (all accepted, plus the bonus) with probability alpha^gamma. calls(n) = 1 + calls(n - k).
    """
    step = [alpha ** (k - 1) * (1 - alpha) for k in range(1, gamma + 1)] + [alpha**gamma]
    pmf = [np.zeros(new_tokens + 1) for _ in range(new_tokens + 1)]
    pmf[0][0] = 1.0
    for n in range(1, new_tokens + 1):
        for k, w in enumerate(step, start=1):
            pmf[n][1:] += w * pmf[max(n - k, 0)][:-1]
    return pmf[new_tokens]


def sum_distribution(pmf: np.ndarray, runs: int) -> np.ndarray:
    """pmf of the sum of `runs` independent draws, by repeated squaring of the convolution."""
    result, power = np.array([1.0]), pmf
    while runs:
        if runs & 1:
            result = np.convolve(result, power)
        runs >>= 1
        if runs:
            power = np.convolve(power, power)
    return result


def outcome_table(draft: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    """P(n accepted, then token x) for one case, [gamma + 1, V] float64, and the acceptance a_i per position.
    Loops over positions and tokens, in float64 on the float32 values."""
    gamma, V = q.shape[0], p.shape[-1]
    table = torch.zeros(gamma + 1, V, dtype=torch.float64)
    accept, reach = [], 1.0
    for i in range(gamma):
        x = int(draft[i])
        px, qx = float(p[i, x]), float(q[i, x])
        a = 0.0 if qx == 0 else min(1.0, px / qx)
        residual = [max(0.0, float(p[i, y]) - float(q[i, y])) for y in range(V)]
        if sum(residual) == 0:
            residual = [float(p[i, y]) for y in range(V)]
        for y in range(V):
            table[i, y] = reach * (1 - a) * residual[y] / sum(residual)
        accept.append(a)
        reach *= a
    bonus = [float(p[gamma, y]) for y in range(V)]
    for y in range(V):
        table[gamma, y] = reach * bonus[y] / sum(bonus)
    return table, accept


def one_hot_row_calls(target_next: list[int], draft_next: list[int], last: int, gamma: int, new_tokens: int) -> int:
    """Target calls ONE row needs when both models are one-hot bigrams (`*_next[t]`: the token after t).

    A per-row loop of the rule: from the row's last token, drafts are kept while the draft's next token is the
    target's (p(x) = q(x) = 1); the first draft whose token the target gives 0 is rejected (p(x) = 0) and the
    residual is the target's own token; after gamma kept drafts the bonus is the target's next token. Either
    way the row emits kept + 1 tokens of the target's chain, and its last token is the chain's next one.
    """
    made = calls = 0
    while made < new_tokens:
        calls += 1
        context, kept = last, 0
        while kept < gamma and draft_next[context] == target_next[context]:
            context, kept = target_next[context], kept + 1
        last, made = target_next[context], made + kept + 1
    return calls


def one_hot_lockstep_calls(
    target_next: list[int], draft_next: list[int], lasts: list[int], gamma: int, new_tokens: int
) -> int:
    """Target calls of a batch (one-hot bigrams as above) whose unfinished rows all advance by the smallest
    kept + 1 among them: the loop that does NOT advance each row by its own count (for the message)."""
    made, lasts, calls = [0] * len(lasts), list(lasts), 0
    while min(made) < new_tokens:
        calls += 1
        kept = []
        for last in lasts:
            context, k = last, 0
            while k < gamma and draft_next[context] == target_next[context]:
                context, k = target_next[context], k + 1
            kept.append(k)
        step = min(k for k, m in zip(kept, made) if m < new_tokens) + 1
        for b, m in enumerate(made):
            if m < new_tokens:
                for _ in range(step):
                    lasts[b] = target_next[lasts[b]]
                made[b] = m + step
    return calls
