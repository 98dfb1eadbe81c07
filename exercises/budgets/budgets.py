"""The three budgets in numbers: compute and bandwidth (the roofline), memory (what a rank holds), and the 4D mesh.

Every function is pure: integers and strings in, Python ints, floats, tuples, lists and dicts out. No torch.
FLOPs count multiply-adds as 2 and only the matmuls (softmax, scaling, masks and norms are left out); bytes
count each tensor read or written once from memory.
"""

from __future__ import annotations

import itertools  # noqa: F401  (the reference uses them)
import math  # noqa: F401

RECOMPUTE = ("none", "selective", "full")
MESH_ORDER = "tp-cp-ep-dp-pp"


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


# ---------------------------------------------------------------- compute and bandwidth: the roofline


def matmul_cost(m: int, n: int, k: int, in_bytes: int, out_bytes: int | None = None) -> tuple[int, int]:
    """(flops, bytes) of C[m, n] = A[m, k] @ B[k, n]: 2 m n k FLOPs; A and B read once (in_bytes per element),
    C written once (out_bytes per element, in_bytes when None). ValueError on a negative size."""
    raise NotImplementedError("write this function")


def causal_pairs(nq: int, nk: int) -> int:
    """Visible (query, key) pairs under bottom-right causal alignment: query i (0-based) sees keys
    0 .. i + nk - nq, so it sees clamp(i + nk - nq + 1, 0, nk) keys."""
    raise NotImplementedError("write this function")


def attention_cost(b: int, hq: int, hkv: int, nq: int, nk: int, d: int, causal: bool = False,
                   elem_bytes: int = 2, materialize_scores: bool = False) -> tuple[int, int]:
    """(flops, bytes) of attention: S = Q K^T and O = P V are 2 d FLOPs each per visible (query, key) pair and
    query head; Q and O (hq heads) and K and V (hkv heads) are read or written once. With
    materialize_scores, S and P also go through memory: S written and read, P written and read (all nq x nk
    of them, causal or not). ValueError unless hkv > 0 and hq is a multiple of hkv."""
    raise NotImplementedError("write this function")


def roofline(flops: float, bytes: float, peak_flops: float, peak_bw: float) -> dict:
    """The roofline's verdict on one operation: {"intensity": flops / bytes, "ridge": peak_flops / peak_bw,
    "bound": "compute" or "memory", "time": max(flops / peak_flops, bytes / peak_bw)}. Compute-bound when
    flops * peak_bw >= bytes * peak_flops (a tie is compute-bound); bytes == 0 gives intensity inf."""
    raise NotImplementedError("write this function")


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, elem_bytes: int) -> int:
    """Bytes one token adds to the KV cache: a K and a V vector per layer and per KV head. ValueError unless
    every size is > 0."""
    raise NotImplementedError("write this function")


def decode_step_cost(n_params: int, param_bytes: int, kv_bytes_per_token: int,
                     contexts: list[int]) -> tuple[int, int]:
    """(flops, bytes) of one decode step of len(contexts) sequences: each new token costs 2 n_params FLOPs; the
    weights are read once for the whole batch and each sequence's cached K and V once (attention FLOPs and the new
    token's writes are left out). ValueError on an empty or negative contexts list."""
    raise NotImplementedError("write this function")


# ---------------------------------------------------------------- memory: parameters, model states, activations


def param_count(cfg: dict) -> int:
    """Exact parameter count of a Llama-style decoder: embedding [vocab, hidden]; per layer an RMSNorm weight
    before attention and before the MLP, q and o [hidden, hidden], k and v [hidden, kv_heads * head_dim]
    (head_dim = hidden // heads), gate, up and down (hidden x ffn each), no biases; a final RMSNorm weight; an
    lm_head [vocab, hidden] unless `tied` (then it is the embedding, counted once). ValueError unless heads
    divides hidden and kv_heads divides heads."""
    raise NotImplementedError("write this function")


def model_state_bytes(n_params: int, zero_stage: int, dp: int) -> int:
    """Bytes of model states on the rank that holds the most, mixed-precision Adam (ZeRO's accounting): 2 bytes
    of fp16/bf16 weights, 2 of gradients, 12 of optimizer state (fp32 master, momentum, variance) per parameter.
    Stage 1 shards the 12, stage 2 also the gradients, stage 3 also the weights, over dp ranks; the largest
    shard holds ceil(n_params / dp) parameters."""
    raise NotImplementedError("write this function")


def activation_bytes(hidden: int, heads: int, seq: int, batch: int, tp: int = 1, sp: bool = False,
                     recompute: str = "none") -> float:
    """Activation bytes one transformer layer keeps for its backward (Korthikanti et al., Table 2: a GPT layer
    with 16-bit activations, 1-byte dropout masks, ffn = 4 hidden, scores materialised) on one of tp ranks.
    "none": sbh (10 + 24/t + 5as/(ht)), or sbh (34/t + 5as/(ht)) with sequence parallelism; "selective"
    (the attention core recomputed): sbh (10 + 24/t), or 34 sbh / t with sp; "full": the layer's input, 2 sbh,
    or 2 sbh / t with sp. ValueError for another recompute or a tp that does not divide heads."""
    raise NotImplementedError("write this function")


def memory_per_rank(cfg: dict, plan: dict) -> float:
    """Bytes on the busiest rank of a (tp, pp, dp, cp) plan: the model states of ceil(P / (tp pp)) parameters
    (P = param_count(cfg)) sharded by ZeRO over the dp * cp ranks that hold the same weights, plus the first
    pipeline stage's activations: layers / pp layers at seq / cp tokens, for min(pp, num_microbatches)
    microbatches in flight (1F1B). ValueError unless pp divides layers and cp divides seq."""
    raise NotImplementedError("write this function")


# ---------------------------------------------------------------- the 4D mesh


def rank_mesh(world: int, sizes: dict, order: str = MESH_ORDER) -> tuple[dict, dict]:
    """Megatron's rank layout: with order "tp-cp-ep-dp-pp" the leftmost name varies fastest,
    rank = sum(coord[name] * prod(size of the names left of it)). Returns (coords, groups): coords[rank] =
    {name: index} for every name in order; groups[name] = the lists of ranks that differ only in that name's
    index, each list in that index's order, the lists in the order of the other names' indices (leftmost
    fastest), as Megatron's generate_masked_orthogonal_rank_groups lists them. Names missing from sizes have
    size 1. ValueError for a name not in order, a repeated name, a size < 1, or a product that is not world."""
    raise NotImplementedError("write this function")


def plan_4d(cfg: dict, world: int, gpus_per_node: int, gpu_bytes: float, seq: int, global_batch: int,
            zero_stage: int = 1, recompute: str = "selective") -> list[tuple[int, int, int, int]]:
    """Every (tp, pp, dp, cp) with tp * pp * dp * cp == world that can run: tp <= gpus_per_node, tp divides heads
    and kv_heads, pp divides layers, cp divides seq, dp divides global_batch; micro_batch 1, so
    num_microbatches = global_batch // dp; sp on when tp > 1; and memory_per_rank <= gpu_bytes. Sorted by the
    1F1B bubble (pp - 1) / num_microbatches, then tp, then cp, then pp (smallest first)."""
    raise NotImplementedError("write this function")
