"""ZeRO stages 0-3: a sharded mixed-precision AdamW on N simulated data-parallel ranks.

Every rank runs this code with its own `comm` (the course's counted ring collectives):
``comm.rank``, ``comm.world_size``, ``comm.all_reduce(x)``, ``comm.reduce_scatter_flat(x)`` (this rank's
``torch.tensor_split`` piece of the sum) and ``comm.all_gather_flat(piece, numel)``.
"""

from __future__ import annotations

from typing import Callable

import torch


def shard_range(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """The [start, stop) of rank `rank`'s piece of a flat buffer of `numel` elements cut as
    ``torch.tensor_split(buf, world_size)``: the first ``numel % world_size`` pieces hold one extra element;
    pieces may be empty (numel < world_size). ValueError unless numel >= 0, world_size >= 1 and
    0 <= rank < world_size."""
    raise NotImplementedError


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
        raise NotImplementedError

    def init(self, full_fp32: torch.Tensor) -> None:
        """`full_fp32`: the whole [Psi] float32 parameter vector (the same on every rank). Keep the fp32 master
        copy of your piece, zeroed exp_avg and exp_avg_sq of the same size, the param_dtype parameters (all of
        them in stages 0-2, your shard in stage 3) and the zeroed param_dtype gradient buffer (Psi elements in
        stages 0-1, your piece in stages 2-3)."""
        raise NotImplementedError

    def params(self) -> torch.Tensor:
        """The param_dtype parameters this rank keeps: all Psi (stages 0-2) or its shard (stage 3)."""
        raise NotImplementedError

    def held_tensors(self) -> list[torch.Tensor]:
        """Every tensor this optimizer keeps between steps (params, grad buffer, master, exp_avg, exp_avg_sq)."""
        raise NotImplementedError

    def memory_bytes(self) -> dict[str, int]:
        """``{"params", "grads", "master", "exp_avg", "exp_avg_sq"}``: the bytes of each, which must add up to
        what `held_tensors` holds (stage 1, bf16: 2 Psi, 2 Psi, 4 s, 4 s, 4 s for a piece of s elements)."""
        raise NotImplementedError

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
        raise NotImplementedError


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
    raise NotImplementedError
