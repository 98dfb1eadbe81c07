"""Naive oracles for zero_sharding, never the solution.

- `pieces(numel, n)`: the (start, stop) of each rank's piece, read off ``torch.tensor_split`` of an arange.
- `adamw_fp64(full, mean_grads, ...)`: AdamW written from torch.optim.AdamW's documented formulas, one step at
  a time on a whole float64 vector (decoupled decay, bias corrections, eps after the square root), with
  clipping by the global norm of the whole mean gradient first.
- `mean_grad(per_rank, dtype)`: the mean over ranks in float64, rounded to the gradient buffer's dtype.
- `expected_memory` / `expected_traffic`: ZeRO's byte counts and the ring's element counts as closed forms.
- `stack_fp64`: the stage-3 model (grader.support.zero_sharding's layers) run whole in float64 with autograd.
"""

import torch


def pieces(numel, n):
    idx = torch.arange(numel)
    out, start = [], 0
    for chunk in torch.tensor_split(idx, n):
        out.append((start, start + len(chunk)))
        start += len(chunk)
    return out


def own(full, sizes, n, r, stage):
    """This rank's elements of a full flat vector: one piece (stages 1-2), a piece of every layer (stage 3)."""
    if stage == 0:
        return full.clone()
    if stage in (1, 2):
        a, b = pieces(sum(sizes), n)[r]
        return full[a:b].clone()
    parts, off = [], 0
    for size in sizes:
        a, b = pieces(size, n)[r]
        parts.append(full[off + a:off + b])
        off += size
    return torch.cat(parts) if parts else full[:0].clone()


def mean_grad(per_rank, dtype):
    total = torch.zeros(per_rank[0].shape, dtype=torch.float64)
    for g in per_rank:
        total += g.double()
    return (total / len(per_rank)).to(dtype).double()


def adamw_fp64(full, mean_grads, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, max_grad_norm=None):
    p = full.double().clone()
    m = torch.zeros_like(p)
    v = torch.zeros_like(p)
    b1, b2 = betas
    for t, g in enumerate(mean_grads, start=1):
        g = g.double()
        if max_grad_norm is not None:
            norm = float(torch.sqrt((g * g).sum()))
            g = g * min(1.0, max_grad_norm / (norm + 1e-6))
        p = p * (1 - lr * weight_decay)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat = m / (1 - b1 ** t)
        v_hat = v / (1 - b2 ** t)
        p = p - lr * m_hat / (torch.sqrt(v_hat) + eps)
    return p


def shard_numel(sizes, n, r, stage):
    if stage == 0:
        return sum(sizes)
    if stage in (1, 2):
        a, b = pieces(sum(sizes), n)[r]
        return b - a
    return sum(b - a for a, b in (pieces(size, n)[r] for size in sizes))


def expected_memory(stage, sizes, n, r, param_bytes):
    """ZeRO's accounting: params and grads in param_dtype, master, exp_avg and exp_avg_sq in fp32."""
    psi, s = sum(sizes), shard_numel(sizes, n, r, stage)
    return {"params": param_bytes * (s if stage == 3 else psi),
            "grads": param_bytes * (s if stage >= 2 else psi),
            "master": 4 * s, "exp_avg": 4 * s, "exp_avg_sq": 4 * s}


def _sent_rs(numel, n, r):      # a ring reduce-scatter sends every piece but the rank's own
    return 0 if n == 1 else numel - (pieces(numel, n)[r][1] - pieces(numel, n)[r][0])


def _sent_ag(numel, n, r):      # a ring all-gather sends every piece but the next rank's
    nxt = pieces(numel, n)[(r + 1) % n]
    return 0 if n == 1 else numel - (nxt[1] - nxt[0])


def expected_traffic(stage, sizes, n, r, clip=False):
    """Elements rank r sends in one step: stages 0-2 one reduce-scatter and one all-gather of the flat buffer
    (stage 0's all-reduce is those two); stage 3 per layer two all-gathers (forward and backward) and a
    reduce-scatter; clipping (stages 1-3) one more all-reduce of one scalar."""
    psi = sum(sizes)
    if stage < 3:
        sent = _sent_rs(psi, n, r) + _sent_ag(psi, n, r)
    else:
        sent = sum(2 * _sent_ag(size, n, r) + _sent_rs(size, n, r) for size in sizes)
    if clip and stage > 0:
        sent += _sent_rs(1, n, r) + _sent_ag(1, n, r)
    return sent


def stack_fp64(spec, flat_w, x, y):
    """The stage-3 model whole in float64: (loss, gradient of the loss in the flat weights)."""
    w = flat_w.double().clone().requires_grad_(True)
    h, off = x.double(), 0
    for kind, a, b in spec:
        h = h @ w[off:off + a * b].view(a, b)
        if kind == "tanh":
            h = torch.tanh(h)
        off += a * b
    loss = ((h - y.double()) ** 2).mean()
    (g,) = torch.autograd.grad(loss, (w,))
    return float(loss.detach()), g
