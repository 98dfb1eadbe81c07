"""The three budgets in numbers: compute and bandwidth (the roofline), memory (what a rank holds), and the 4D mesh.

Every function is pure: integers and strings in, Python ints, floats, tuples, lists and dicts out. No torch.
FLOPs count multiply-adds as 2 and only the matmuls (softmax, scaling, masks and norms are left out); bytes
count each tensor read or written once from memory.
"""

from __future__ import annotations

import itertools
import math

RECOMPUTE = ("none", "selective", "full")
MESH_ORDER = "tp-cp-ep-dp-pp"


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


# ---------------------------------------------------------------- compute and bandwidth: the roofline


def matmul_cost(m: int, n: int, k: int, in_bytes: int, out_bytes: int | None = None) -> tuple[int, int]:
    """(flops, bytes) of C[m, n] = A[m, k] @ B[k, n]: 2 m n k FLOPs; A and B read once (in_bytes per element),
    C written once (out_bytes per element, in_bytes when None). ValueError on a negative size."""
    _need(min(m, n, k) >= 0 and in_bytes > 0, f"matmul_cost({m}, {n}, {k}): sizes must be >= 0")
    out = in_bytes if out_bytes is None else out_bytes
    return 2 * m * n * k, (m * k + k * n) * in_bytes + m * n * out


def causal_pairs(nq: int, nk: int) -> int:
    """Visible (query, key) pairs under bottom-right causal alignment: query i (0-based) sees keys
    0 .. i + nk - nq, so it sees clamp(i + nk - nq + 1, 0, nk) keys."""
    return sum(min(max(i + nk - nq + 1, 0), nk) for i in range(nq))


def attention_cost(b: int, hq: int, hkv: int, nq: int, nk: int, d: int, causal: bool = False,
                   elem_bytes: int = 2, materialize_scores: bool = False) -> tuple[int, int]:
    """(flops, bytes) of attention: S = Q K^T and O = P V are 2 d FLOPs each per visible (query, key) pair and
    query head; Q and O (hq heads) and K and V (hkv heads) are read or written once. With
    materialize_scores, S and P also go through memory: S written and read, P written and read (all nq x nk
    of them, causal or not). ValueError unless hkv > 0 and hq is a multiple of hkv."""
    _need(min(b, hq, hkv, nq, nk, d) >= 0 and elem_bytes > 0, "attention_cost: sizes must be >= 0")
    _need(hkv > 0 and hq % hkv == 0, f"attention_cost: hq = {hq} must be a multiple of hkv = {hkv} > 0")
    pairs = causal_pairs(nq, nk) if causal else nq * nk
    flops = 4 * b * hq * d * pairs
    moved = (2 * b * hq * nq * d + 2 * b * hkv * nk * d) * elem_bytes
    if materialize_scores:
        moved += 4 * b * hq * nq * nk * elem_bytes
    return flops, moved


def roofline(flops: float, bytes: float, peak_flops: float, peak_bw: float) -> dict:
    """The roofline's verdict on one operation: {"intensity": flops / bytes, "ridge": peak_flops / peak_bw,
    "bound": "compute" or "memory", "time": max(flops / peak_flops, bytes / peak_bw)}. Compute-bound when
    flops * peak_bw >= bytes * peak_flops (a tie is compute-bound); bytes == 0 gives intensity inf."""
    _need(flops >= 0 and bytes >= 0 and flops + bytes > 0, "roofline: flops and bytes >= 0, not both 0")
    _need(peak_flops > 0 and peak_bw > 0, "roofline: peaks must be > 0")
    return {
        "intensity": flops / bytes if bytes else math.inf,
        "ridge": peak_flops / peak_bw,
        "bound": "compute" if flops * peak_bw >= bytes * peak_flops else "memory",
        "time": max(flops / peak_flops, bytes / peak_bw),
    }


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, elem_bytes: int) -> int:
    """Bytes one token adds to the KV cache: a K and a V vector per layer and per KV head. ValueError unless
    every size is > 0."""
    _need(min(layers, kv_heads, head_dim, elem_bytes) > 0, "kv_bytes_per_token: every size must be > 0")
    return 2 * layers * kv_heads * head_dim * elem_bytes


def decode_step_cost(n_params: int, param_bytes: int, kv_bytes_per_token: int,
                     contexts: list[int]) -> tuple[int, int]:
    """(flops, bytes) of one decode step of len(contexts) sequences: each new token costs 2 n_params FLOPs; the
    weights are read once for the whole batch and each sequence's cached K and V once (attention FLOPs and the new
    token's writes are left out). ValueError on an empty or negative contexts list."""
    _need(len(contexts) > 0 and min(contexts) >= 0, "decode_step_cost: contexts must be a non-empty list of >= 0")
    _need(n_params > 0 and param_bytes > 0 and kv_bytes_per_token > 0, "decode_step_cost: sizes must be > 0")
    return 2 * n_params * len(contexts), n_params * param_bytes + kv_bytes_per_token * sum(contexts)


# ---------------------------------------------------------------- memory: parameters, model states, activations


def param_count(cfg: dict) -> int:
    """Exact parameter count of a Llama-style decoder: embedding [vocab, hidden]; per layer an RMSNorm weight
    before attention and before the MLP, q and o [hidden, hidden], k and v [hidden, kv_heads * head_dim]
    (head_dim = hidden // heads), gate, up and down (hidden x ffn each), no biases; a final RMSNorm weight; an
    lm_head [vocab, hidden] unless `tied` (then it is the embedding, counted once). ValueError unless heads
    divides hidden and kv_heads divides heads."""
    h, heads, kv = cfg["hidden"], cfg["heads"], cfg["kv_heads"]
    _need(heads > 0 and h % heads == 0, f"param_count: hidden = {h} must be a multiple of heads = {heads}")
    _need(kv > 0 and heads % kv == 0, f"param_count: heads = {heads} must be a multiple of kv_heads = {kv}")
    head_dim = h // heads
    attention = 2 * h * h + 2 * h * kv * head_dim
    mlp = 3 * h * cfg["ffn"]
    per_layer = attention + mlp + 2 * h
    embeddings = cfg["vocab"] * h * (1 if cfg["tied"] else 2)
    return embeddings + cfg["layers"] * per_layer + h


def model_state_bytes(n_params: int, zero_stage: int, dp: int) -> int:
    """Bytes of model states on the rank that holds the most, mixed-precision Adam (ZeRO's accounting): 2 bytes
    of fp16/bf16 weights, 2 of gradients, 12 of optimizer state (fp32 master, momentum, variance) per parameter.
    Stage 1 shards the 12, stage 2 also the gradients, stage 3 also the weights, over dp ranks; the largest
    shard holds ceil(n_params / dp) parameters."""
    _need(zero_stage in (0, 1, 2, 3), f"model_state_bytes: zero_stage {zero_stage} is not 0, 1, 2 or 3")
    _need(dp >= 1 and n_params >= 0, "model_state_bytes: dp >= 1 and n_params >= 0")
    piece = -(-n_params // dp)
    if zero_stage == 0:
        return 16 * n_params
    if zero_stage == 1:
        return 4 * n_params + 12 * piece
    if zero_stage == 2:
        return 2 * n_params + 14 * piece
    return 16 * piece


def activation_bytes(hidden: int, heads: int, seq: int, batch: int, tp: int = 1, sp: bool = False,
                     recompute: str = "none") -> float:
    """Activation bytes one transformer layer keeps for its backward (Korthikanti et al., Table 2: a GPT layer
    with 16-bit activations, 1-byte dropout masks, ffn = 4 hidden, scores materialised) on one of tp ranks.
    "none": sbh (10 + 24/t + 5as/(ht)), or sbh (34/t + 5as/(ht)) with sequence parallelism; "selective"
    (the attention core recomputed): sbh (10 + 24/t), or 34 sbh / t with sp; "full": the layer's input, 2 sbh,
    or 2 sbh / t with sp. ValueError for another recompute or a tp that does not divide heads."""
    _need(recompute in RECOMPUTE, f"activation_bytes: recompute {recompute!r} is not one of {RECOMPUTE}")
    _need(tp >= 1 and heads % tp == 0, f"activation_bytes: tp = {tp} must divide heads = {heads}")
    sbh = seq * batch * hidden
    t = tp
    if recompute == "full":
        return 2 * sbh / t if sp else 2.0 * sbh
    linear = 34 * sbh / t if sp else sbh * (10 + 24 / t)
    if recompute == "selective":
        return linear
    return linear + 5 * heads * seq * seq * batch / t


def memory_per_rank(cfg: dict, plan: dict) -> float:
    """Bytes on the busiest rank of a (tp, pp, dp, cp) plan: the model states of ceil(P / (tp pp)) parameters
    (P = param_count(cfg)) sharded by ZeRO over the dp * cp ranks that hold the same weights, plus the first
    pipeline stage's activations: layers / pp layers at seq / cp tokens, for min(pp, num_microbatches)
    microbatches in flight (1F1B). ValueError unless pp divides layers and cp divides seq."""
    tp, pp, dp, cp = plan["tp"], plan["pp"], plan["dp"], plan["cp"]
    _need(min(tp, pp, dp, cp) >= 1, "memory_per_rank: every degree must be >= 1")
    _need(cfg["layers"] % pp == 0, f"memory_per_rank: pp = {pp} must divide layers = {cfg['layers']}")
    _need(plan["seq"] % cp == 0, f"memory_per_rank: cp = {cp} must divide seq = {plan['seq']}")
    shard = -(-param_count(cfg) // (tp * pp))
    states = model_state_bytes(shard, plan["zero_stage"], dp * cp)
    per_layer = activation_bytes(cfg["hidden"], cfg["heads"], plan["seq"] // cp, plan["micro_batch"], tp,
                                 plan["sp"], plan["recompute"])
    in_flight = min(pp, plan["num_microbatches"])
    return states + per_layer * (cfg["layers"] // pp) * in_flight


# ---------------------------------------------------------------- the 4D mesh


def rank_mesh(world: int, sizes: dict, order: str = MESH_ORDER) -> tuple[dict, dict]:
    """Megatron's rank layout: with order "tp-cp-ep-dp-pp" the leftmost name varies fastest,
    rank = sum(coord[name] * prod(size of the names left of it)). Returns (coords, groups): coords[rank] =
    {name: index} for every name in order; groups[name] = the lists of ranks that differ only in that name's
    index, each list in that index's order, the lists in the order of the other names' indices (leftmost
    fastest), as Megatron's generate_masked_orthogonal_rank_groups lists them. Names missing from sizes have
    size 1. ValueError for a name not in order, a repeated name, a size < 1, or a product that is not world."""
    names = order.split("-")
    _need(len(set(names)) == len(names), f"rank_mesh: order {order!r} repeats a name")
    _need(set(sizes) <= set(names), f"rank_mesh: sizes name {sorted(set(sizes) - set(names))}, not in {order!r}")
    shape = [sizes.get(name, 1) for name in names]
    _need(min(shape) >= 1 and math.prod(shape) == world, f"rank_mesh: sizes {sizes} do not multiply to {world}")
    strides = [math.prod(shape[:i]) for i in range(len(shape))]
    coords = {r: {name: (r // strides[i]) % shape[i] for i, name in enumerate(names)} for r in range(world)}
    groups = {}
    for i, name in enumerate(names):
        rest = [j for j in range(len(names)) if j != i]
        lists = []
        # itertools.product varies its last factor fastest: feed the other names right to left
        for others in itertools.product(*(range(shape[j]) for j in reversed(rest))):
            base = sum(idx * strides[j] for idx, j in zip(others, reversed(rest)))
            lists.append([base + x * strides[i] for x in range(shape[i])])
        groups[name] = lists
    return coords, groups


def plan_4d(cfg: dict, world: int, gpus_per_node: int, gpu_bytes: float, seq: int, global_batch: int,
            zero_stage: int = 1, recompute: str = "selective") -> list[tuple[int, int, int, int]]:
    """Every (tp, pp, dp, cp) with tp * pp * dp * cp == world that can run: tp <= gpus_per_node, tp divides heads
    and kv_heads, pp divides layers, cp divides seq, dp divides global_batch; micro_batch 1, so
    num_microbatches = global_batch // dp; sp on when tp > 1; and memory_per_rank <= gpu_bytes. Sorted by the
    1F1B bubble (pp - 1) / num_microbatches, then tp, then cp, then pp (smallest first)."""
    found = []
    for tp, pp, cp in itertools.product(range(1, world + 1), repeat=3):
        if world % (tp * pp * cp):
            continue
        dp = world // (tp * pp * cp)
        if (tp > gpus_per_node or cfg["heads"] % tp or cfg["kv_heads"] % tp or cfg["layers"] % pp
                or seq % cp or global_batch % dp):
            continue
        m = global_batch // dp
        plan = {"tp": tp, "pp": pp, "dp": dp, "cp": cp, "zero_stage": zero_stage, "sp": tp > 1,
                "recompute": recompute, "micro_batch": 1, "seq": seq, "num_microbatches": m}
        if memory_per_rank(cfg, plan) <= gpu_bytes:
            found.append(((pp - 1) / m, tp, cp, pp, (tp, pp, dp, cp)))
    found.sort()
    return [entry[-1] for entry in found]
