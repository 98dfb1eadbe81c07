"""Tensor parallelism (Megatron-LM): the exercise. Read README.md in this folder first.

Fill in the functions below; each raises NotImplementedError until you do. Run the public tests with
`make check EX=tensor_parallel` (or `.venv/bin/pytest exercises/tensor_parallel`), and your own experiments
with the course's driver (README.md, "Running your code"):

    from grader.support.tensor_parallel import run_tp, run_call

Every function takes `comm`, one rank's communicator (grader/support/collectives.py): ``comm.rank``,
``comm.world_size`` (t), and the counted ring collectives ``comm.all_reduce(x)``,
``comm.all_gather(x, dim)`` and ``comm.reduce_scatter(x, dim)``. They return new tensors and are not
differentiable: the autograd functions you write decide what runs in backward. Never call
torch.distributed yourself.

Activations are sequence-first, [s, b, h]. Without sequence parallelism every rank holds the whole
activation; with it, rank r holds rows r*s/t .. (r+1)*s/t - 1 of the sequence.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


# --------------------------------------------------------------------------------------------------
# The four conjugate operators


def copy_to_tp(x: torch.Tensor, comm) -> torch.Tensor:
    """f: forward x unchanged; backward all-reduces the gradient."""
    raise NotImplementedError


def reduce_from_tp(x: torch.Tensor, comm) -> torch.Tensor:
    """g: forward all-reduces; backward passes the gradient unchanged."""
    raise NotImplementedError


def gather_from_sp(x: torch.Tensor, comm) -> torch.Tensor:
    """The SP paper's g: forward all-gathers along dim 0; backward reduce-scatters along dim 0."""
    raise NotImplementedError


def reduce_scatter_to_sp(x: torch.Tensor, comm) -> torch.Tensor:
    """The SP paper's g-bar: forward reduce-scatters along dim 0; backward all-gathers along dim 0."""
    raise NotImplementedError


# --------------------------------------------------------------------------------------------------
# Sharding the weights


def shard_linear(weight: torch.Tensor, bias: torch.Tensor | None, comm, kind: str, stride: int = 1):
    """This rank's (w, b) of an nn.Linear-layout weight [out, in] (see the README's contract)."""
    raise NotImplementedError


# --------------------------------------------------------------------------------------------------
# The parallel linears


def column_parallel_linear(x, w, b, comm, sequence_parallel: bool = False):
    """Y_r = X @ w_r.T + b_r: this rank's columns of the output. Without SP no communication in forward (f);
    with SP the forward all-gathers the sequence shard x (README, "The contract")."""
    raise NotImplementedError


def row_parallel_linear(x, w, b, comm, sequence_parallel: bool = False):
    """Sum over ranks of x_r @ w_r.T, then the bias once; under SP each rank keeps its sequence shard."""
    raise NotImplementedError


# --------------------------------------------------------------------------------------------------
# The MLP and the block


def shard_mlp(params: dict, comm, act: str = "gelu") -> dict:
    """This rank's shard of an MLP's full parameters: fc1 column-parallel, fc2 row-parallel.

    SwiGLU's fc1 holds gate and up stacked ([2 ffn, h]): stride 2. Other entries (the norm's) are copied."""
    raise NotImplementedError


def tp_mlp(x, params, comm, sequence_parallel: bool = False, act: str = "gelu"):
    """fc2(act(fc1(x))) with fc1 column-parallel and fc2 row-parallel: nothing is sent between them."""
    raise NotImplementedError


def tp_mlp_block(x, params, comm, sequence_parallel: bool = False, act: str = "gelu"):
    """Pre-LN residual MLP block: x + mlp(layer_norm(x)). Under SP the norm and the residual run on the shard."""
    raise NotImplementedError


def finalize_grads(grads: dict, comm, sequence_parallel: bool = False) -> dict:
    """After backward, under SP: the parameters applied to the sequence shard (the norm's ln_w and ln_b, and the
    row layer's bias b2) have gradients that cover only this rank's rows: sum them over the ranks."""
    raise NotImplementedError
