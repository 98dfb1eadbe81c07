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
    """After backward, under SP: the parameters applied to the sequence shard (the norms' ln_w, ln_b, ln1_w, ln1_b,
    ln2_w, ln2_b and the row layers' biases b2, b_o, those of them in grads) have gradients that cover only this
    rank's rows: sum them over the ranks."""
    raise NotImplementedError


# --------------------------------------------------------------------------------------------------
# Attention: heads as the column split


def shard_attention(params: dict, comm, n_heads: int, n_kv_heads: int) -> dict:
    """This rank's shard of an attention layer (README, "The contract").

    params: w_qkv [(n_heads + 2 n_kv_heads) d, h] (Q's heads, then K's, then V's, d rows per head), b_qkv,
    w_o [h, n_heads d], b_o [h]; other entries copied. Returns w_qkv, b_qkv with rank r's heads of each of
    Q, K and V (block r of each: under GQA the three have unequal widths), w_o's columns of rank r's query
    heads, b_o whole. ValueError when n_kv_heads % t, n_heads % n_kv_heads, or w_qkv's rows do not divide."""
    raise NotImplementedError


def tp_attention(x, params, comm, n_heads: int, n_kv_heads: int, causal: bool, sequence_parallel: bool = False):
    """Self-attention with Q, K, V column-parallel by heads and the output projection row-parallel.

    x [s, b, h] (under SP: [s/t, b, h], this rank's rows). params: shard_attention's dict, maybe with
    k_cache, v_cache [s_past, b, n_kv_heads / t, d], this rank's heads' keys and values of earlier positions,
    placed before the new ones. n_heads, n_kv_heads: the whole layer's. Scale 1 / sqrt(d); causal masks are
    aligned bottom-right (query i is position s_past + i). Returns row_parallel_linear's output: one
    all-reduce forward, one backward (SP: all-gather, reduce-scatter forward). No Python loop over heads.
    ValueError (before any collective) when n_kv_heads % t or n_heads % n_kv_heads."""
    raise NotImplementedError


def tp_block(x, params, comm, n_heads: int, n_kv_heads: int, causal: bool = True, sequence_parallel: bool = False,
             act: str = "gelu"):
    """A pre-LN transformer layer: h = x + tp_attention(layer_norm(x; ln1_w, ln1_b)), then
    h + tp_mlp(layer_norm(h; ln2_w, ln2_b)). params holds both layers' shards (shard_mlp(shard_attention(full)))
    and the two norms'. Under SP x is the sequence shard and the norms and residuals run on it."""
    raise NotImplementedError
