"""Tensor parallelism (Megatron-LM): the conjugate operators, column- and row-parallel linears, a TP MLP
and a pre-LN MLP block with sequence parallelism, on the course's simulated ranks.

Every function takes `comm`, one rank's communicator (grader/support/collectives.py): ``comm.rank``,
``comm.world_size`` (t), and the counted ring collectives ``comm.all_reduce(x)``,
``comm.all_gather(x, dim)`` and ``comm.reduce_scatter(x, dim)``. They return new tensors and are not
differentiable: the autograd functions below decide what runs in backward.

Activations are sequence-first, [s, b, h]. Without sequence parallelism every rank holds the whole
activation; with it, rank r holds rows r*s/t .. (r+1)*s/t - 1 of the sequence.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


# --------------------------------------------------------------------------------------------------
# The four conjugate operators


class _CopyToTP(torch.autograd.Function):
    """f: identity forward, all-reduce backward."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.comm.all_reduce(grad), None


class _ReduceFromTP(torch.autograd.Function):
    """g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, comm):
        return comm.all_reduce(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromSP(torch.autograd.Function):
    """Korthikanti et al.'s g (not Shoeybi et al.'s): all-gather along the sequence forward, reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return comm.all_gather(x, 0)

    @staticmethod
    def backward(ctx, grad):
        return ctx.comm.reduce_scatter(grad, 0), None


class _ReduceScatterToSP(torch.autograd.Function):
    """Korthikanti et al.'s g-bar: reduce-scatter along the sequence forward, all-gather backward."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return comm.reduce_scatter(x, 0)

    @staticmethod
    def backward(ctx, grad):
        return ctx.comm.all_gather(grad, 0), None


def copy_to_tp(x: torch.Tensor, comm) -> torch.Tensor:
    """f: forward x unchanged; backward all-reduces the gradient."""
    return _CopyToTP.apply(x, comm)


def reduce_from_tp(x: torch.Tensor, comm) -> torch.Tensor:
    """g: forward all-reduces; backward passes the gradient unchanged."""
    return _ReduceFromTP.apply(x, comm)


def gather_from_sp(x: torch.Tensor, comm) -> torch.Tensor:
    """The SP paper's g: forward all-gathers along dim 0; backward reduce-scatters along dim 0."""
    return _GatherFromSP.apply(x, comm)


def reduce_scatter_to_sp(x: torch.Tensor, comm) -> torch.Tensor:
    """The SP paper's g-bar: forward reduce-scatters along dim 0; backward all-gathers along dim 0."""
    return _ReduceScatterToSP.apply(x, comm)


# --------------------------------------------------------------------------------------------------
# Sharding the weights


def shard_linear(weight: torch.Tensor, bias: torch.Tensor | None, comm, kind: str, stride: int = 1):
    """This rank's (w, b) of an nn.Linear-layout weight [out, in] (see the README's contract)."""
    t, r = comm.world_size, comm.rank
    out_features, in_features = weight.shape
    if kind == "column":
        if stride < 1 or out_features % (t * stride):
            raise ValueError(f"out_features={out_features} is not a multiple of world_size * stride = {t} * {stride}")
        # k fused matrices stacked along the output: rank r takes block r of each one
        w = torch.cat([m.chunk(t, dim=0)[r] for m in weight.chunk(stride, dim=0)])
        b = None if bias is None else torch.cat([m.chunk(t)[r] for m in bias.chunk(stride)])
        return w.clone(), None if b is None else b.clone()
    if kind == "row":
        if stride != 1:
            raise ValueError("a row-parallel weight splits its input dimension: stride must be 1")
        if in_features % t:
            raise ValueError(f"in_features={in_features} is not a multiple of world_size={t}")
        w = weight.chunk(t, dim=1)[r]
        return w.clone(), None if bias is None else bias.clone()  # the bias is added once, after the reduction
    raise ValueError(f"kind must be 'column' or 'row', found {kind!r}")


# --------------------------------------------------------------------------------------------------
# The parallel linears


class _SPColumnLinear(torch.autograd.Function):
    """Under SP: gather the sequence, multiply, and keep only this rank's shard of the input for backward.

    Backward gathers the input again for the weight's gradient, and reduce-scatters the input's gradient
    (Korthikanti et al., section 4.2.2; Megatron's LinearWithGradAccumulationAndAsyncCommunication)."""

    @staticmethod
    def forward(ctx, x_shard, w, b, comm):
        ctx.comm = comm
        ctx.has_bias = b is not None
        ctx.save_for_backward(x_shard, w)
        x = comm.all_gather(x_shard, 0)
        y = x @ w.T
        return y if b is None else y + b

    @staticmethod
    def backward(ctx, grad):
        x_shard, w = ctx.saved_tensors
        comm = ctx.comm
        x = comm.all_gather(x_shard, 0)
        grad_x = comm.reduce_scatter(grad @ w, 0)
        grad_w = grad.reshape(-1, grad.shape[-1]).T @ x.reshape(-1, x.shape[-1])
        grad_b = grad.reshape(-1, grad.shape[-1]).sum(0) if ctx.has_bias else None
        return grad_x, grad_w, grad_b, None


def column_parallel_linear(x, w, b, comm, sequence_parallel: bool = False):
    """Y_r = X @ w_r.T + b_r: this rank's columns of the output. Without SP no communication in forward (f);
    with SP the forward all-gathers the sequence shard x (README, "The contract")."""
    if sequence_parallel:
        return _SPColumnLinear.apply(x, w, b, comm)
    y = copy_to_tp(x, comm) @ w.T
    return y if b is None else y + b


def row_parallel_linear(x, w, b, comm, sequence_parallel: bool = False):
    """Sum over ranks of x_r @ w_r.T, then the bias once; under SP each rank keeps its sequence shard."""
    partial = x @ w.T
    y = reduce_scatter_to_sp(partial, comm) if sequence_parallel else reduce_from_tp(partial, comm)
    return y if b is None else y + b


# --------------------------------------------------------------------------------------------------
# The MLP and the block


def shard_mlp(params: dict, comm, act: str = "gelu") -> dict:
    """This rank's shard of an MLP's full parameters: fc1 column-parallel, fc2 row-parallel.

    SwiGLU's fc1 holds gate and up stacked ([2 ffn, h]): stride 2. Other entries (the norm's) are copied."""
    stride = {"gelu": 1, "swiglu": 2}[act]
    out = {k: v.clone() for k, v in params.items() if k not in ("w1", "b1", "w2", "b2")}
    out["w1"], out["b1"] = shard_linear(params["w1"], params.get("b1"), comm, "column", stride)
    out["w2"], out["b2"] = shard_linear(params["w2"], params.get("b2"), comm, "row")
    return out


def tp_mlp(x, params, comm, sequence_parallel: bool = False, act: str = "gelu"):
    """fc2(act(fc1(x))) with fc1 column-parallel and fc2 row-parallel: nothing is sent between them."""
    h = column_parallel_linear(x, params["w1"], params["b1"], comm, sequence_parallel)
    if act == "gelu":
        h = F.gelu(h)
    elif act == "swiglu":
        gate, up = h.chunk(2, dim=-1)  # this rank's gate block, then its up block
        h = F.silu(gate) * up
    else:
        raise ValueError(f"act must be 'gelu' or 'swiglu', found {act!r}")
    return row_parallel_linear(h, params["w2"], params["b2"], comm, sequence_parallel)


def tp_mlp_block(x, params, comm, sequence_parallel: bool = False, act: str = "gelu"):
    """Pre-LN residual MLP block: x + mlp(layer_norm(x)). Under SP the norm and the residual run on the shard."""
    y = F.layer_norm(x, x.shape[-1:], params["ln_w"], params["ln_b"], eps=1e-5)
    return x + tp_mlp(y, params, comm, sequence_parallel, act)


def finalize_grads(grads: dict, comm, sequence_parallel: bool = False) -> dict:
    """After backward, under SP: the parameters applied to the sequence shard (the norms' ln_w, ln_b, ln1_w, ln1_b,
    ln2_w, ln2_b and the row layers' biases b2, b_o, those of them in grads) have gradients that cover only this
    rank's rows: sum them over the ranks."""
    out = dict(grads)
    if sequence_parallel:
        for name in _ON_THE_SHARD:
            if name in grads:
                out[name] = comm.all_reduce(grads[name])
    return out


# the parameters applied to the sequence shard under SP: the norms' and the row-parallel layers' biases
_ON_THE_SHARD = ("ln_w", "ln_b", "b2", "ln1_w", "ln1_b", "ln2_w", "ln2_b", "b_o")


# --------------------------------------------------------------------------------------------------
# Attention: heads as the column split


def _attention_shape(n_heads: int, n_kv_heads: int, t: int) -> None:
    if n_heads < 1 or n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ValueError(f"n_heads={n_heads} must be a positive multiple of n_kv_heads={n_kv_heads}")
    if n_kv_heads % t:
        raise ValueError(f"n_kv_heads={n_kv_heads} is not a multiple of world_size={t}: each rank needs whole "
                         "key/value heads (replicating them is not part of this contract)")


def shard_attention(params: dict, comm, n_heads: int, n_kv_heads: int) -> dict:
    """This rank's shard of an attention layer: w_qkv/b_qkv column-parallel by heads, w_o row-parallel.

    w_qkv [(n_heads + 2 n_kv_heads) d, h] stacks Q's rows, then K's, then V's: three matrices of unequal
    widths under GQA, so rank r takes block r of each (the stride-3 split, with each matrix's own width)."""
    t, r = comm.world_size, comm.rank
    _attention_shape(n_heads, n_kv_heads, t)
    rows = params["w_qkv"].shape[0]
    if rows % (n_heads + 2 * n_kv_heads):
        raise ValueError(f"w_qkv has {rows} rows, not a multiple of n_heads + 2 n_kv_heads = {n_heads + 2 * n_kv_heads}")
    d = rows // (n_heads + 2 * n_kv_heads)
    widths = [n_heads * d, n_kv_heads * d, n_kv_heads * d]
    out = {k: v.clone() for k, v in params.items() if k not in ("w_qkv", "b_qkv", "w_o", "b_o")}
    out["w_qkv"] = torch.cat([m.chunk(t, dim=0)[r] for m in params["w_qkv"].split(widths, dim=0)]).clone()
    if params.get("b_qkv") is not None:
        out["b_qkv"] = torch.cat([m.chunk(t)[r] for m in params["b_qkv"].split(widths)]).clone()
    else:
        out["b_qkv"] = None
    out["w_o"], out["b_o"] = shard_linear(params["w_o"], params.get("b_o"), comm, "row")
    return out


def _local_attention(q, k, v, causal: bool):
    """softmax(q k^T / sqrt(d)) v for this rank's heads, all at once. q [s, b, hq, d]; k, v [sk, b, hkv, d]."""
    group = q.shape[2] // k.shape[2]
    q, k, v = q.permute(1, 2, 0, 3), k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3)  # [b, heads, seq, d]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # query head j reads kv head j // group
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:  # bottom-right: query i is position i + (nk - nq) of the key sequence
        nq, nk = q.shape[2], k.shape[2]
        allowed = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(nk - nq)
        scores = scores.masked_fill(~allowed, float("-inf"))
    o = torch.softmax(scores, dim=-1) @ v  # [b, hq, s, d]
    return o.permute(2, 0, 1, 3).reshape(o.shape[2], o.shape[0], -1)  # [s, b, hq d]


def tp_attention(x, params, comm, n_heads: int, n_kv_heads: int, causal: bool, sequence_parallel: bool = False):
    """Self-attention with Q, K, V column-parallel by heads and the output projection row-parallel.

    One all-reduce forward (after w_o) and one backward (f, before w_qkv); under SP an all-gather and a
    reduce-scatter instead. params["k_cache"], params["v_cache"] (optional, [s_past, b, n_kv_heads/t, d]):
    this rank's heads' keys and values of earlier positions, placed before the new ones."""
    t = comm.world_size
    _attention_shape(n_heads, n_kv_heads, t)
    hq, hkv = n_heads // t, n_kv_heads // t
    d = params["w_qkv"].shape[0] // (hq + 2 * hkv)
    qkv = column_parallel_linear(x, params["w_qkv"], params.get("b_qkv"), comm, sequence_parallel)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    s, b = q.shape[0], q.shape[1]
    q, k, v = q.reshape(s, b, hq, d), k.reshape(s, b, hkv, d), v.reshape(s, b, hkv, d)
    if params.get("k_cache") is not None:
        k = torch.cat([params["k_cache"], k])
        v = torch.cat([params["v_cache"], v])
    o = _local_attention(q, k, v, causal)
    return row_parallel_linear(o, params["w_o"], params.get("b_o"), comm, sequence_parallel)


def tp_block(x, params, comm, n_heads: int, n_kv_heads: int, causal: bool = True, sequence_parallel: bool = False,
             act: str = "gelu"):
    """A pre-LN transformer layer: x + attn(ln1(x)), then that + mlp(ln2(that)). Under SP the norms and both
    residuals run on the sequence shard; two TP regions, so twice the collectives of one."""
    y = F.layer_norm(x, x.shape[-1:], params["ln1_w"], params["ln1_b"], eps=1e-5)
    x = x + tp_attention(y, params, comm, n_heads, n_kv_heads, causal, sequence_parallel)
    y = F.layer_norm(x, x.shape[-1:], params["ln2_w"], params["ln2_b"], eps=1e-5)
    return x + tp_mlp(y, params, comm, sequence_parallel, act)
