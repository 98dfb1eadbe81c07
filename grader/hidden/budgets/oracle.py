"""Naive oracles for budgets' hidden checks: loops, exact fractions, brute force, and measurements of real torch
modules. None of this is the solution.

- `visible_pairs`: causal (query, key) pairs by a double loop over every query and key, bottom-right aligned.
- `measured_matmul_flops`, `measured_attention_flops`: what torch.utils.flop_counter.FlopCounterMode counts on
  a real matmul, and on real attention computed one query row at a time against the keys that row may see.
- `real_param_count`: sum(p.numel()) over a Llama-style module built from torch's own layers on the meta device
  (no memory), tied by sharing the embedding's Parameter.
- `measured_model_state_bytes`: the bytes of every tensor a real mixed-precision AdamW step holds (bf16 weights and
  gradients, the fp32 master copy, torch.optim.AdamW's exp_avg and exp_avg_sq) on a tiny model.
- `measured_activation_bytes`: the bytes autograd saves for the backward of a real GPT layer in bf16 (Korthikanti
  et al.'s layer: LayerNorm, QKV, scores, softmax, dropout, PV, projection, dropout, LayerNorm, 4h GeLU MLP,
  dropout), seen by torch.autograd.graph.saved_tensors_hooks, one count per storage, parameters and the
  LayerNorms' per-token statistics left out; "selective" and "full" wrap the attention core or the whole layer in
  a reentrant torch.utils.checkpoint, which saves only its inputs.
- `table2_bytes`: Korthikanti et al.'s Table 2 as exact fractions, one branch per row.
- `mesh_by_enumeration`: coordinates by walking every coordinate tuple, groups by bucketing ranks on their other
  coordinates (checked against the example groups in Megatron's generate_masked_orthogonal_rank_groups).
- `plans_by_enumeration`: every (tp, pp, dp, cp) in range(1, world + 1) ** 4, filtered and sorted.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode


def visible_pairs(nq: int, nk: int, causal: bool) -> int:
    count = 0
    for i in range(nq):
        for j in range(nk):
            if not causal or j <= i + (nk - nq):
                count += 1
    return count


def _counted(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def measured_matmul_flops(m: int, n: int, k: int) -> int:
    a, b = torch.randn(m, k), torch.randn(k, n)
    return _counted(lambda: a @ b)


def measured_attention_flops(b: int, hq: int, hkv: int, nq: int, nk: int, d: int, causal: bool) -> int:
    q = torch.randn(b, hq, nq, d)
    k = torch.randn(b, hkv, nk, d).repeat_interleave(hq // hkv, dim=1)
    v = torch.randn(b, hkv, nk, d).repeat_interleave(hq // hkv, dim=1)

    def run():
        for i in range(nq):
            keys = nk if not causal else max(0, min(nk, i + nk - nq + 1))
            if keys == 0:
                continue
            s = q[:, :, i:i + 1] @ k[:, :, :keys].transpose(-1, -2)
            torch.softmax(s, dim=-1) @ v[:, :, :keys]
    return _counted(run)


def real_param_count(cfg: dict) -> int:
    h, heads, kv, ffn = cfg["hidden"], cfg["heads"], cfg["kv_heads"], cfg["ffn"]
    hd = h // heads
    with torch.device("meta"):
        layers = nn.ModuleList()
        for _ in range(cfg["layers"]):
            layers.append(nn.ModuleDict({
                "attn_norm": nn.RMSNorm(h), "q": nn.Linear(h, heads * hd, bias=False),
                "k": nn.Linear(h, kv * hd, bias=False), "v": nn.Linear(h, kv * hd, bias=False),
                "o": nn.Linear(heads * hd, h, bias=False), "mlp_norm": nn.RMSNorm(h),
                "gate": nn.Linear(h, ffn, bias=False), "up": nn.Linear(h, ffn, bias=False),
                "down": nn.Linear(ffn, h, bias=False)}))
        model = nn.ModuleDict({"embed": nn.Embedding(cfg["vocab"], h), "layers": layers, "norm": nn.RMSNorm(h),
                               "lm_head": nn.Linear(h, cfg["vocab"], bias=False)})
    if cfg["tied"]:
        model["lm_head"].weight = model["embed"].weight
    return sum(p.numel() for p in model.parameters())


def measured_model_state_bytes(sizes: list[tuple[int, int]]) -> tuple[int, int]:
    """(n_params, bytes) of a real mixed-precision AdamW step over bf16 Linear layers of the given shapes."""
    model = nn.Sequential(*(nn.Linear(i, o, bias=False, dtype=torch.bfloat16) for i, o in sizes))
    master = [p.detach().float().clone().requires_grad_(True) for p in model.parameters()]
    opt = torch.optim.AdamW(master, lr=1e-3)
    x = torch.randn(3, sizes[0][0], dtype=torch.bfloat16)
    model(x).float().square().sum().backward()
    for m, p in zip(master, model.parameters()):
        assert p.grad is not None
        m.grad = p.grad.float()
    opt.step()
    for m in master:
        m.grad = None                       # the fp32 gradient copy is transient: freed after the step
    held: list[torch.Tensor] = [p for p in model.parameters()] + master
    held += [p.grad for p in model.parameters() if p.grad is not None]
    held += [t for state in opt.state.values() for key, t in state.items() if key != "step"]
    n = sum(p.numel() for p in model.parameters())
    return n, sum(t.numel() * t.element_size() for t in held)


def _dropout(x: torch.Tensor, p: float, gen: torch.Generator) -> torch.Tensor:
    keep = torch.rand(x.shape, generator=gen) >= p          # a 1-byte mask, as on a GPU
    return x * keep / (1 - p)


def measured_activation_bytes(hidden: int, heads: int, seq: int, batch: int, recompute: str) -> int:
    from torch.utils.checkpoint import checkpoint
    dt = torch.bfloat16
    gen = torch.Generator().manual_seed(seq * 7 + batch)
    ln1, ln2 = nn.LayerNorm(hidden, dtype=dt), nn.LayerNorm(hidden, dtype=dt)
    qkv, proj = nn.Linear(hidden, 3 * hidden, dtype=dt), nn.Linear(hidden, hidden, dtype=dt)
    fc1, fc2 = nn.Linear(hidden, 4 * hidden, dtype=dt), nn.Linear(4 * hidden, hidden, dtype=dt)
    params = {p.untyped_storage().data_ptr() for m in (ln1, ln2, qkv, proj, fc1, fc2) for p in m.parameters()}
    d = hidden // heads

    def core(q, k, v):
        scores = torch.matmul(q, k.transpose(-1, -2)) * d ** -0.5
        probs = _dropout(torch.softmax(scores, dim=-1), 0.1, gen)
        return torch.matmul(probs, v)

    def layer(x):
        z = qkv(ln1(x)).view(seq, batch, 3, heads, d)
        q, k, v = (z[:, :, i].permute(1, 2, 0, 3) for i in range(3))
        ctx = (checkpoint(core, q, k, v, use_reentrant=True) if recompute == "selective" else core(q, k, v))
        r = x + _dropout(proj(ctx.permute(2, 0, 1, 3).reshape(seq, batch, hidden)), 0.1, gen)
        return r + _dropout(fc2(F.gelu(fc1(ln2(r)))), 0.1, gen)

    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params and t.numel() != seq * batch:   # LayerNorm's mean and rstd per token
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    x = torch.randn(seq, batch, hidden, dtype=dt, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = checkpoint(layer, x, use_reentrant=True) if recompute == "full" else layer(x)
    del out
    return sum(saved.values())


def table2_bytes(hidden: int, heads: int, seq: int, batch: int, tp: int, sp: bool, recompute: str) -> Fraction:
    s, b, h, a, t = seq, batch, hidden, heads, Fraction(tp)
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh / t if sp else Fraction(2 * sbh)
    if recompute == "selective":
        return 34 * sbh / t if sp else sbh * (10 + 24 / t)
    if sp:
        return sbh * (34 / t + Fraction(5 * a * s, h) / t)
    return sbh * (10 + 24 / t + Fraction(5 * a * s, h) / t)


def param_count_by_shapes(cfg: dict) -> int:
    h, heads, kv, ffn, vocab = cfg["hidden"], cfg["heads"], cfg["kv_heads"], cfg["ffn"], cfg["vocab"]
    hd = h // heads
    shapes = [(vocab, h), (h,)]
    for _ in range(cfg["layers"]):
        shapes += [(h,), (h,), (h, h), (h, kv * hd), (h, kv * hd), (h, h), (h, ffn), (h, ffn), (ffn, h)]
    if not cfg["tied"]:
        shapes.append((vocab, h))
    return sum(math.prod(s) for s in shapes)


def states_by_rank(n_params: int, stage: int, dp: int) -> int:
    """Bytes on each rank, pieces cut one parameter at a time round the ranks; the largest rank's bytes."""
    pieces = [0] * dp
    for i in range(n_params):
        pieces[i % dp] += 1
    per_param = {0: (2, 2, 12), 1: (2, 2, 0), 2: (2, 0, 0), 3: (0, 0, 0)}[stage]
    sharded = 16 - sum(per_param)
    return max(sum(per_param) * n_params + sharded * p for p in pieces)


def memory_oracle(cfg: dict, plan: dict) -> Fraction:
    tp, pp, dp, cp = plan["tp"], plan["pp"], plan["dp"], plan["cp"]
    total = param_count_by_shapes(cfg)
    shard = math.ceil(Fraction(total, tp * pp))
    group = dp * cp
    piece = math.ceil(Fraction(shard, group))
    kept = {0: 16 * shard, 1: 4 * shard + 12 * piece, 2: 2 * shard + 14 * piece, 3: 16 * piece}[plan["zero_stage"]]
    layer = table2_bytes(cfg["hidden"], cfg["heads"], plan["seq"] // cp, plan["micro_batch"], tp, plan["sp"],
                         plan["recompute"])
    return kept + layer * (cfg["layers"] // pp) * min(pp, plan["num_microbatches"])


def mesh_by_enumeration(world: int, sizes: dict, order: str) -> tuple[dict, dict]:
    names = order.split("-")
    shape = [sizes.get(n, 1) for n in names]
    coords = {}
    for idx in itertools.product(*(range(s) for s in shape)):
        rank, stride = 0, 1
        for i, s in zip(idx, shape):
            rank += i * stride
            stride *= s
        coords[rank] = dict(zip(names, idx))
    groups = {}
    for pos, name in enumerate(names):
        buckets: dict[tuple, list] = {}
        for rank in sorted(coords):
            key = tuple(coords[rank][n] for n in names if n != name)
            buckets.setdefault(key, []).append(rank)
        # Megatron numbers the groups with the other names' indices, leftmost fastest
        groups[name] = [buckets[key] for key in sorted(buckets, key=lambda kk: tuple(reversed(kk)))]
    return coords, groups


def plans_by_enumeration(cfg: dict, world: int, gpus_per_node: int, gpu_bytes: float, seq: int,
                         global_batch: int, zero_stage: int, recompute: str) -> list[tuple]:
    rows = []
    for tp, pp, dp, cp in itertools.product(range(1, world + 1), repeat=4):
        if tp * pp * dp * cp != world or tp > gpus_per_node:
            continue
        if cfg["heads"] % tp or cfg["kv_heads"] % tp or cfg["layers"] % pp or seq % cp or global_batch % dp:
            continue
        m = global_batch // dp
        plan = dict(tp=tp, pp=pp, dp=dp, cp=cp, zero_stage=zero_stage, sp=tp > 1, recompute=recompute,
                    micro_batch=1, seq=seq, num_microbatches=m)
        if memory_oracle(cfg, plan) <= gpu_bytes:
            rows.append((Fraction(pp - 1, m), tp, cp, pp, (tp, pp, dp, cp)))
    return [r[-1] for r in sorted(rows)]
