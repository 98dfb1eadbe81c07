"""ZeRO stages 0-3: a sharded mixed-precision AdamW on N simulated data-parallel ranks.

Every rank runs this code with its own `comm` (the course's counted ring collectives):
``comm.rank``, ``comm.world_size``, ``comm.all_reduce(x)``, ``comm.reduce_scatter_flat(x)`` (this rank's
``torch.tensor_split`` piece of the sum) and ``comm.all_gather_flat(piece, numel)``.
"""

from __future__ import annotations

import math
from typing import Callable

import torch


def shard_range(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """The [start, stop) of rank `rank`'s piece of a flat buffer of `numel` elements cut as
    ``torch.tensor_split(buf, world_size)``: the first ``numel % world_size`` pieces hold one extra element;
    pieces may be empty (numel < world_size). ValueError unless numel >= 0, world_size >= 1 and
    0 <= rank < world_size."""
    if world_size < 1 or not 0 <= rank < world_size or numel < 0:
        raise ValueError(f"shard_range({numel}, {world_size}, {rank}): need numel >= 0 and 0 <= rank < world_size")
    base, extra = divmod(numel, world_size)
    start = rank * base + min(rank, extra)
    stop = start + base + (1 if rank < extra else 0)
    return start, stop


class ZeroAdamW:
    """AdamW (exactly torch.optim.AdamW's update, in fp32) with ZeRO's partitioning over ``comm.world_size`` ranks.

    `sizes`: the numel of each layer's flat weights; Psi = sum(sizes). Stages 0-2 treat them as one flat buffer
    cut by `shard_range(Psi, N, rank)`; stage 3 cuts each layer separately (rank r owns piece r of every layer,
    its shard being those pieces concatenated in layer order).

    stage 0: every rank keeps everything; the step all-reduces the gradient.
    stage 1: the fp32 master copy and Adam's exp_avg, exp_avg_sq are this rank's piece only.
    stage 2: ... and the param_dtype gradient buffer.
    stage 3: ... and the param_dtype parameters.

    ValueError for a stage outside 0..3.
    """

    def __init__(self, sizes: list[int], comm, stage: int, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, param_dtype: torch.dtype = torch.bfloat16,
                 max_grad_norm: float | None = None):
        if stage not in (0, 1, 2, 3):
            raise ValueError(f"stage must be 0, 1, 2 or 3, got {stage}")
        self.sizes = [int(n) for n in sizes]
        self.numel = sum(self.sizes)
        self.comm, self.stage = comm, stage
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.param_dtype, self.max_grad_norm = param_dtype, max_grad_norm
        n, r = comm.world_size, comm.rank
        if stage == 0:
            self.ranges = [(0, self.numel)]                  # every rank updates everything
        elif stage in (1, 2):
            self.ranges = [shard_range(self.numel, n, r)]     # one piece of the flat buffer
        else:                                                 # a piece of every layer, in the flat buffer's terms
            self.ranges, offset = [], 0
            for size in self.sizes:
                a, b = shard_range(size, n, r)
                self.ranges.append((offset + a, offset + b))
                offset += size
        self.shard_numel = sum(b - a for a, b in self.ranges)
        self.t = 0

    # ------------------------------------------------------------------ state

    def own_piece(self, full: torch.Tensor) -> torch.Tensor:
        return torch.cat([full[a:b] for a, b in self.ranges])

    def init(self, full_fp32: torch.Tensor) -> None:
        """`full_fp32`: the whole [Psi] float32 parameter vector (the same on every rank). Keep the fp32 master
        copy of your piece, zeroed exp_avg and exp_avg_sq of the same size, the param_dtype parameters (all of
        them in stages 0-2, your shard in stage 3) and the zeroed param_dtype gradient buffer (Psi elements in
        stages 0-1, your piece in stages 2-3)."""
        full = full_fp32.detach().reshape(-1).to(torch.float32)
        self.master = self.own_piece(full).clone()
        self.exp_avg = torch.zeros_like(self.master)
        self.exp_avg_sq = torch.zeros_like(self.master)
        if self.stage == 3:
            self.param = self.master.to(self.param_dtype, copy=True)
            self.grad = torch.zeros(self.shard_numel, dtype=self.param_dtype)
        else:
            self.param = full.to(self.param_dtype, copy=True)
            grad_numel = self.shard_numel if self.stage == 2 else self.numel
            self.grad = torch.zeros(grad_numel, dtype=self.param_dtype)

    def params(self) -> torch.Tensor:
        """The param_dtype parameters this rank keeps: all Psi (stages 0-2) or its shard (stage 3)."""
        return self.param

    def held_tensors(self) -> list[torch.Tensor]:
        """Every tensor this optimizer keeps between steps (params, grad buffer, master, exp_avg, exp_avg_sq)."""
        return [self.param, self.grad, self.master, self.exp_avg, self.exp_avg_sq]

    def memory_bytes(self) -> dict[str, int]:
        """``{"params", "grads", "master", "exp_avg", "exp_avg_sq"}``: the bytes of each, which must add up to
        what `held_tensors` holds (stage 1, bf16: 2 Psi, 2 Psi, 4 s, 4 s, 4 s for a piece of s elements)."""
        return {"params": self.param.numel() * self.param.element_size(),
                "grads": self.grad.numel() * self.grad.element_size(),
                "master": 4 * self.shard_numel, "exp_avg": 4 * self.shard_numel, "exp_avg_sq": 4 * self.shard_numel}

    # ------------------------------------------------------------------ the step

    def step(self, grad: torch.Tensor) -> None:
        """One AdamW step on the mean gradient over ranks.

        stages 0-2: `grad` is this rank's full local gradient [Psi] in param_dtype. Cast it to float32, sum it
        over ranks (stage 0: all_reduce; stages 1-2: reduce_scatter_flat), divide by world_size, and round the
        mean into the param_dtype gradient buffer (stage 1 first copies the local gradient into its full-size
        buffer and reduce-scatters from there; that buffer keeps the local gradient, and the rounded mean of the
        piece is a temporary). stage 3: `grad` is this rank's shard of the gradient already
        SUMMED over ranks, in float32 (zero3_train_step builds it): divide by world_size into the buffer.
        The update reads the buffer as float32. With max_grad_norm, scale it by
        min(1, max_grad_norm / (norm + 1e-6)) in float32 (a temporary: not rounded again, not written back to the
        buffer), norm the L2 norm of the whole mean gradient (stages 1-3: all-reduce
        the one-element sum of squares of your piece). Then AdamW on the fp32 master (decoupled decay, bias
        corrections, eps after the square root), cast to param_dtype, and (stages 1-2) all_gather_flat the
        parameters."""
        n = self.comm.world_size
        if self.stage == 0:
            self.grad.copy_(self.comm.all_reduce(grad.float()) / n)
            mean = self.grad.float()
        elif self.stage == 1:
            self.grad.copy_(grad)                             # where the backward's gradient lands: full size
            mean = (self.comm.reduce_scatter_flat(self.grad.float()) / n).to(self.param_dtype).float()
        elif self.stage == 2:
            self.grad.copy_(self.comm.reduce_scatter_flat(grad.float()) / n)
            mean = self.grad.float()
        else:
            self.grad.copy_(grad.float() / n)
            mean = self.grad.float()
        if self.max_grad_norm is not None:
            sq = (mean * mean).sum()
            if self.stage > 0:                                # each rank holds only its piece: sum the squares
                sq = self.comm.all_reduce(sq.reshape(1))[0]
            coef = min(1.0, self.max_grad_norm / (math.sqrt(sq.item()) + 1e-6))
            mean = mean * coef
        self.adamw_update(mean)
        if self.stage in (0, 3):                              # this rank holds all the parameters it keeps
            self.param.copy_(self.master)
        else:
            self.param.copy_(self.comm.all_gather_flat(self.master.to(self.param_dtype), self.numel))

    def adamw_update(self, g: torch.Tensor) -> None:
        """torch.optim.AdamW's update, on this rank's fp32 shard."""
        self.t += 1
        beta1, beta2 = self.betas
        self.master.mul_(1 - self.lr * self.weight_decay)
        self.exp_avg.mul_(beta1).add_(g, alpha=1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        bias1 = 1 - beta1 ** self.t
        bias2 = 1 - beta2 ** self.t
        denom = (self.exp_avg_sq.sqrt() / math.sqrt(bias2)).add_(self.eps)
        self.master.addcdiv_(self.exp_avg, denom, value=-self.lr / bias1)


def zero3_train_step(layers: list[tuple[Callable, int]], x: torch.Tensor, y: torch.Tensor,
                     loss_fn: Callable, opt: ZeroAdamW) -> float:
    """One stage-3 training step of ``h = fn_(L-1)(... fn_0(x, w_0) ..., w_(L-1))``, ``loss = loss_fn(h, y)``.

    `layers`: ``(fn, numel)`` per layer, ``fn(h, flat_w)`` computing the layer from its flat weights; `opt` a
    stage-3 ZeroAdamW built with sizes = the layers' numels (ValueError otherwise). Forward: gather each layer's
    weights (all_gather_flat of your piece) just before it runs and drop them after, under torch.no_grad,
    keeping only the layers' inputs. Backward, last layer first: gather again, recompute the layer with autograd,
    take the gradients of its input and weights with torch.autograd.grad, and reduce_scatter_flat the weight
    gradient (float32) into your piece. Then ``opt.step`` on the pieces concatenated in layer order. At most two
    layers' gathered weights may be alive at once. Returns this rank's loss as a float."""
    comm = opt.comm
    if opt.stage != 3 or [size for _, size in layers] != opt.sizes:
        raise ValueError("zero3_train_step needs a stage-3 ZeroAdamW built with sizes = the layers' numels")
    starts = [0]
    for a, b in opt.ranges:
        starts.append(starts[-1] + b - a)                 # layer i's piece is params()[starts[i]:starts[i + 1]]

    def gather(i: int) -> torch.Tensor:
        return comm.all_gather_flat(opt.params()[starts[i]:starts[i + 1]], layers[i][1])

    inputs = []
    h = x
    with torch.no_grad():
        for i, (fn, _) in enumerate(layers):
            inputs.append(h)
            w = gather(i)
            h = fn(h, w)
            del w
    h = h.detach().requires_grad_(True)
    loss = loss_fn(h, y)
    (g,) = torch.autograd.grad(loss, (h,))
    pieces: list[torch.Tensor] = [torch.empty(0)] * len(layers)
    for i in reversed(range(len(layers))):
        fn, _ = layers[i]
        w = gather(i).requires_grad_(True)
        h_in = inputs[i].detach().requires_grad_(i > 0)
        out = fn(h_in, w)
        wanted = (h_in, w) if i > 0 else (w,)
        grads = torch.autograd.grad(out, wanted, g)
        pieces[i] = comm.reduce_scatter_flat(grads[-1].float())
        g = grads[0] if i > 0 else g
        del w, out, grads
        inputs[i] = None
    opt.step(torch.cat(pieces))
    return float(loss.detach())

