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
