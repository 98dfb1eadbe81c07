"""Naive oracles for GPTQ's hidden checks, written plainly (float64 where the contract does not fix fp32).

None of this is the solution; the solution's tricks (Cholesky factor, lazy batch) are checked against
these, not reused by them.

- `fit_rule` / `q_rule` / `rtn_rule`: the quantiser rules of the contract, row by row, in fp32 as the
  contract says: scale = (max(x, 0) - min(x, 0)) / maxq (or symmetric, or [-1, 1] for an all-zero row),
  zero = round(-min / scale), q = scale * (clamp(round(x / scale) + zero, 0, maxq) - zero); `rtn_rule`
  applies them to each group of columns (round-to-nearest).
- `obq64`: the textbook per-column algorithm in its Optimal Brain Quantizer form, in float64. For each
  column in order it INVERTS the Hessian of the columns still to be quantised, rounds the column, and
  moves the remaining columns by the OBS update (w - q) / [H_F^-1]_ii * [H_F^-1]_i,: (Frantar et al.,
  2022, equations 2-3 with a fixed order). No Cholesky factor and no lazy batch. It also records where
  its own computation sat on a rounding tie (see the comment above `NOISE_K`), and can follow the side
  a float32 implementation took at each of them.
- `output_error`: the layer's output error trace((W - Q) H (W - Q)^T), in float64.
- `naive_grid` / `naive_quantize`: the same grid and rounding rules one number at a time in numpy
  float32 (IEEE fp32 arithmetic; np.round rounds half to even).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from grader.testing import mismatches, near_midpoint

F32 = np.float32


def fit_rule(w: torch.Tensor, bits: int, sym: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The contract's grid for each row of w, row by row. The arithmetic is fp32, as the contract says:
    symmetric grids and all-zero rows put values exactly on rounding ties, which must round alike."""
    maxq = 2**bits - 1
    scales, zeros = [], []
    for row in w.float():
        lo, hi = torch.clamp(row.min(), max=0), torch.clamp(row.max(), min=0)
        if sym:
            hi = torch.maximum(-lo, hi)
            lo = -hi
        if lo == 0 and hi == 0:
            lo, hi = torch.tensor(-1.0), torch.tensor(1.0)
        scale = (hi - lo) / maxq
        scales.append(scale)
        zeros.append(torch.tensor((maxq + 1) / 2) if sym else torch.round(-lo / scale))
    return torch.stack(scales).double(), torch.stack(zeros).double()


def q_rule(x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, maxq: int) -> torch.Tensor:
    """The contract's round-to-nearest: scale * (clamp(round(x / scale) + zero, 0, maxq) - zero)."""
    return scale * (torch.clamp(torch.round(x / scale) + zero, 0, maxq) - zero)


def rtn_rule(W: torch.Tensor, bits: int, group_size: int = -1, sym: bool = False):
    """Round-to-nearest by the contract, in fp32 like the contract; returned in float64."""
    W = W.float()
    cols = W.shape[1]
    gs = group_size if group_size > 0 else cols
    fits = [fit_rule(W[:, s : s + gs], bits, sym) for s in range(0, cols, gs)]
    scale = torch.stack([f[0] for f in fits], 1)
    zero = torch.stack([f[1] for f in fits], 1)
    g_idx = torch.arange(cols) // gs
    Q = q_rule(W, scale[:, g_idx].float(), zero[:, g_idx].float(), 2**bits - 1)
    return Q.double(), scale, zero, g_idx


# Rounding ties. `obq64` runs in float64, the code under test in float32, which strays from it; where a
# value sits closer to a grid midpoint than that, either rounding is right. So the loop carries a running
# bound of what float32 arithmetic may have added to each weight (first-order forward error analysis):
# eps |w| for the weight as given; for each column rounded, the error it feeds forward, (its own bound +
# eps (|w| + |q|)) times |[H_F^-1]_i,: / [H_F^-1]_ii|; for each update, eps (1 + cond(H)) of its size, for
# the float32 factor U that carries it. A value within NOISE_K times its bound (in grid units) of a
# midpoint is a tie; so is a zero point fit from a tie. A grid fit from updated weights may stray by the
# bound of its extremes. Measured: over 600 generated problems (1 to 32 columns, 2 to 8 bits, singular
# and damped Hessians, groups of 1 and up, act-order) and this file's layers at block sizes 1 to 128,
# the reference strayed from this loop by at most 0.98 of the bound (median 0.17), so NOISE_K = 8 leaves
# a margin of 8. The bound is loose (cond(H) is a worst case): on this file's layers 1% to 10% of the
# values count as ties, and there either rounding is accepted, no more: the loop then follows the
# code's side, and everything else must match.
NOISE_K = 8
EPS32 = torch.finfo(torch.float32).eps


class Oracle(NamedTuple):
    """What `obq64` returns: its Q, grids and loss, and the bounds of float32's stray from them."""

    Q: torch.Tensor  # float64 [rows, cols], original column order
    scale: torch.Tensor  # float64 [rows, n_groups]
    zero: torch.Tensor
    loss: float
    order: list[int]  # the columns in processing order
    ties: torch.Tensor  # bool [rows, cols]: where this loop's own computation sat on a rounding tie
    scale_slack: torch.Tensor  # [rows, n_groups]: how far float32 may move each scale
    loss_tol: float  # how far a float32 loss may stray from this one


def obq64(
    W,
    H,
    bits=4,
    group_size=-1,
    percdamp=0.01,
    sym=False,
    act_order=False,
    static_groups=False,
    follow=None,
    reinvert=True,
    sort="descending",
    stale_block=0,
    plain_inverse=False,
) -> Oracle:
    """The textbook loop: re-invert the remaining columns' Hessian after every column (or, with
    reinvert=False, for large layers, remove the column from the inverse by the OBS update
    H_F^-1 - H_F^-1[:, i] H_F^-1[i, :] / [H_F^-1]_ii, equation 3 of Frantar et al., 2022).

    It records its rounding ties (above): values whose two sides clamp to different codes, and zero
    points of groups fit from updated weights. With `follow` (a QuantResult of the code under test) the
    loop takes that code's side at each of its own ties, wherever the code took one of the two sides:
    the path that code followed, so that its rows after a tie, its grids and its loss can be compared
    with it. Nowhere else does `follow` count.

    Three options run a known mistake instead, so that a message can name it from a Q that equals its loop:
    `sort="ascending"` (act-order by ascending diag(H)) or `"flipped"` (an ascending stable sort reversed:
    equal diagonals in reverse index order); `stale_block=B` (dynamic groups fit from the weights as they
    stood at the start of their block of B columns, missing the updates made earlier in the same block);
    `plain_inverse` (row t of the full, damped H^-1 as column t's feedback, never updated for the columns
    already done)."""
    W, H = W.double().clone(), H.double().clone()
    rows, cols = W.shape
    maxq = 2**bits - 1
    for i in range(cols):  # dead columns
        if H[i, i] == 0:
            H[i, i] = 1.0
            W[:, i] = 0.0
    gs = group_size if group_size > 0 else cols
    order = list(range(cols))
    if act_order:
        order = sorted(range(cols), key=lambda i: -float(H[i, i]))  # Python's sort is stable
        if sort != "descending":  # a known mistake (above)
            order = sorted(range(cols), key=lambda i: float(H[i, i]))
            order = order[::-1] if sort == "flipped" else order
    H = H + percdamp * float(torch.diagonal(H).mean()) * torch.eye(cols, dtype=torch.float64)
    kappa = float(torch.linalg.cond(H))
    grids, slack = {}, {}
    if group_size <= 0:
        grids[0] = fit_rule(W, bits, sym)
    elif static_groups:
        for g in range(math.ceil(cols / gs)):
            grids[g] = fit_rule(W[:, g * gs : (g + 1) * gs], bits, sym)
    assert not (act_order and group_size > 0 and not static_groups), "the contract has no dynamic groups with act_order"
    W, H = W[:, order], H[order][:, order]  # from here on, column t is the t-th processed: order[t] of the original
    Q = torch.zeros_like(W)
    ties = torch.zeros(rows, cols, dtype=torch.bool)
    noise = EPS32 * W.abs()  # the running bound of float32's error in each weight
    loss, loss_of_zero = 0.0, 0.0
    Hinv = torch.linalg.inv(H)
    full_inverse, start = Hinv, W
    for t, j in enumerate(order):
        g = j // gs
        if stale_block and t % stale_block == 0:
            start = W.clone()  # the weights as the block starts
        if group_size > 0 and not static_groups and j % gs == 0:  # (dynamic groups: natural order, t == j)
            group = (start if stale_block else W)[:, t : t + gs]
            scale, zero = fit_rule(group, bits, sym)  # from the weights as updated so far
            spread = NOISE_K * noise[:, t : t + gs].amax(1)  # how far float32 may have moved its extremes
            slack[g] = 2 * spread / maxq
            if not sym:
                lo, hi = torch.clamp(group.float().amin(1), max=0), torch.clamp(group.float().amax(1), min=0)
                target = (-lo / scale.float()).double()  # round(target) is the zero point, in fit_rule's fp32
                tied = near_midpoint(target, tol=3 * spread / scale + 4 * EPS32 * (maxq + 1)) & ((lo != 0) | (hi != 0))
                ties[:, t] |= tied
                if follow is not None:
                    theirs = follow.zero[:, g].double()
                    zero = torch.where(tied & ((theirs - zero).abs() == 1), theirs, zero)
            grids[g] = (scale, zero)
        scale, zero = grids[g]
        grid_slack = slack.get(g, torch.zeros(rows, dtype=torch.float64))
        w = W[:, t]
        v = w / scale
        below = scale * (torch.clamp(torch.floor(v) + zero, 0, maxq) - zero)
        above = scale * (torch.clamp(torch.floor(v) + 1 + zero, 0, maxq) - zero)
        tol = (NOISE_K * noise[:, t] + v.abs() * grid_slack) / scale + 4 * EPS32 * (v.abs() + 1)
        tied = near_midpoint(v, tol=tol) & (below != above)
        ties[:, t] |= tied
        q = q_rule(w, scale, zero, maxq)
        if follow is not None:  # the code's level on this grid (its own scale may differ by float32's slack)
            theirs = scale * torch.round(follow.Q[:, j].double() / follow.scale[:, g].double())
            for side in (below, above):
                q = torch.where(tied & ~mismatches(theirs, side, atol=0.25 * (above - below).abs()), side, q)
        if plain_inverse:
            Hinv = full_inverse[t:, t:]
        elif reinvert and t:
            Hinv = torch.linalg.inv(H[t:, t:])  # the Hessian of the columns still to be quantised
        Q[:, t] = q
        d2 = Hinv[0, 0]
        err_noise = noise[:, t] + EPS32 * (w.abs() + q.abs())
        loss += float(((w - q) ** 2).sum() / d2 / 2)
        loss_of_zero += float((w**2).sum() / d2 / 2)  # the loss had this weight been rounded to 0
        update = ((w - q) / d2)[:, None] * Hinv[0][None, :]
        W[:, t:] -= update
        noise[:, t:] += err_noise[:, None] * (Hinv[0].abs() / d2)[None, :] + EPS32 * (1 + kappa) * update.abs()
        if not reinvert and not plain_inverse:
            Hinv = torch.addr(Hinv[1:, 1:], Hinv[1:, 0], Hinv[0, 1:], alpha=-1 / float(Hinv[0, 0]))
    back = torch.argsort(torch.tensor(order))  # to the original column order
    Q, ties = Q[:, back], ties[:, back]
    n_groups = len(grids)
    scale = torch.stack([grids[g][0] for g in sorted(grids)], 1)
    zero = torch.stack([grids[g][1] for g in sorted(grids)], 1)
    scale_slack = torch.stack([slack.get(g, torch.zeros(rows, dtype=torch.float64)) for g in range(n_groups)], 1)
    # The reference's loss strays from this loop's by at most 5e-5 of it (measured over 600 generated
    # problems); 1e-9 of the loss that Q = 0 would have covers a loss of float32 noise alone (weights that
    # sit on their grid, as in groups of one column).
    loss_tol = 1e-3 * loss + 1e-9 * loss_of_zero
    return Oracle(Q, scale, zero, loss, order, ties, scale_slack, loss_tol)


def output_error(W: torch.Tensor, Q: torch.Tensor, H: torch.Tensor) -> float:
    """||(W - Q) X||^2 up to the factor n / 2: trace((W - Q) H (W - Q)^T), in float64."""
    E = W.double() - Q.double()
    return float((E @ H.double() * E).sum())


def naive_grid(values, bits: int, sym: bool) -> tuple[np.float32, np.float32]:
    """The contract's (scale, zero) for one row (or group) of values, in float32."""
    maxq = F32(2**bits - 1)
    lo, hi = min(min(values), F32(0)), max(max(values), F32(0))
    if sym:
        hi = max(-lo, hi)
        lo = -hi
    if lo == 0 and hi == 0:
        lo, hi = F32(-1), F32(1)
    scale = (hi - lo) / maxq
    zero = F32(2**bits / 2) if sym else np.round(-lo / scale)
    return F32(scale), F32(zero)


def naive_quantize(x, scale, zero, bits: int) -> np.float32:
    """One value rounded to its grid by the contract's rule, in float32 (np.round: half to even)."""
    code = min(max(np.round(x / scale) + zero, F32(0)), F32(2**bits - 1))
    return F32(scale * (code - zero))
