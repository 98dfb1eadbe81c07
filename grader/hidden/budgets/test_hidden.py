"""Hidden checks for budgets: the roofline, memory per rank and the 4D mesh, as pure functions.

The oracles (oracle.py) are double loops, exact fractions, brute-force enumeration, and measurements of real
torch code: FlopCounterMode on real matmuls and on attention run one query row at a time against the keys it may
see; sum(p.numel()) of a Llama-style module built on the meta device; the bytes a real mixed-precision AdamW step
holds; the bytes autograd saves for a real bf16 GPT layer (saved_tensors_hooks), with and without checkpointing.

The signature: formulas that agree with measurement. A calculator with a textbook simplification computes the
textbook's numbers and loses the check that measures: causal attention as half the full count (`measured_flops`:
the counted FLOPs of the visible pairs, off by the diagonal and wrong when nq != nk), tied embeddings counted twice
(`params`: the real module shares the Parameter), Adam without its fp32 master copy (`model_states`: the real step
holds it), activations without the attention scores (`activations`: the real layer saves softmax output, dropout
mask and dropped probabilities, 5as^2b bytes). The roofline's fidelity to real hardware is the CUDA
check `calibration` (test_roofline_predicts_measured_time, at the end: not graded without CUDA, rehearsed on the
CPU by `grader gpu-check --dry-run`). What these cannot see: TP and SP activation rows
(no simulated tensor parallel layer: those rows are graded against Table 2 alone), and a planner whose memory
model agrees with the oracle's on the drawn cases only.

Contract clauses (README "The contract") and the tests that draw them:

| clause | tests |
| --- | --- |
| matmul_cost: 2mnk, operands read once, out_bytes default, errors | test_matmul_cost, test_matmul_flops_are_measured |
| causal_pairs: bottom-right aligned visible pairs | test_causal_pairs |
| attention_cost: 4 b hq d pairs; bottom-right causal pairs; bytes over hq and hkv; materialised scores; errors | test_attention_bytes_and_full_flops, test_causal_flops_are_measured, test_attention_rejects |
| roofline: intensity, ridge, bound (ties compute), time; bytes 0 | test_roofline, test_roofline_ties_and_edges |
| kv_bytes_per_token: MHA, GQA, MQA, errors | test_kv_bytes |
| decode_step_cost: weights once per step, each context's KV once, 2 n_params per token; errors | test_decode_step |
| param_count: tied and untied, GQA, against a real module | test_param_count_is_measured, test_param_count_rejects |
| model_state_bytes: every stage, ceil shard, errors; 16 bytes per parameter measured | test_model_states, test_model_states_are_measured |
| activation_bytes: every Table 2 row; tp = 1 rows measured on a real layer at s and 2s; errors | test_table2_rows, test_activations_are_measured |
| memory_per_rank: shards, ZeRO over dp cp, first stage in flight, s / cp, errors | test_memory_per_rank |
| rank_mesh: coords and groups for random orders and sizes; Megatron's example; errors | test_mesh_random, test_mesh_megatron_example, test_mesh_rejects |
| plan_4d: every feasible plan, the order, against enumeration | test_planner |
| roofline time, matmul_cost and attention_cost against six ops timed on CUDA (the `calibration` check) | test_roofline_predicts_measured_time |
"""

import contextlib
import math
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F

from grader import rehearsal, speed
from grader.hidden.budgets import oracle as o
from grader.testing import is_close, show

TOL = 1e-9


@pytest.fixture(scope="module")
def sm(student):
    return student.load("budgets")


def draw(rng, lo, hi):
    """An int in [lo, hi] from the grade's seed."""
    return int(torch.randint(lo, hi + 1, (1,), generator=rng).item())


def pick(rng, values):
    return values[draw(rng, 0, len(values) - 1)]


def close(got, want) -> bool:
    """`got` is a number within TOL (absolute and relative) of `want`; a NaN, or something not a number, is not."""
    try:
        value = float(got)
    except (TypeError, ValueError):
        return False
    return is_close(torch.tensor(value, dtype=torch.float64), torch.tensor(float(want), dtype=torch.float64),
                    atol=TOL, rtol=TOL)


# ------------------------------------------------------------------ roofline


@pytest.mark.check("roofline")
def test_matmul_cost(sm, rng):
    for _ in range(20):
        m, n, k = draw(rng, 1, 5000), draw(rng, 1, 5000), draw(rng, 1, 5000)
        ib, ob = pick(rng, [1, 2, 4]), pick(rng, [1, 2, 4])
        want = (2 * m * n * k, (m * k + k * n) * ib + m * n * ob)
        got = tuple(sm.matmul_cost(m, n, k, ib, ob))
        assert got == want, (f"matmul_cost({m}, {n}, {k}, in_bytes={ib}, out_bytes={ob}) = {got}, expected {want}: "
                             "2 m n k FLOPs; A [m, k] and B [k, n] read at in_bytes, C [m, n] written at out_bytes")
    got = tuple(sm.matmul_cost(4, 8, 16, 2))
    assert got == (1024, (64 + 128 + 32) * 2), f"matmul_cost(4, 8, 16, 2) = {got}: out_bytes defaults to in_bytes"
    with pytest.raises(ValueError):
        sm.matmul_cost(-1, 8, 16, 2)


@pytest.mark.check("roofline")
def test_causal_pairs(sm, rng):
    shapes = [(draw(rng, 0, 40), draw(rng, 0, 40)) for _ in range(20)] + [(1, 1), (5, 5), (3, 9), (9, 3)]
    for nq, nk in shapes:
        want = o.visible_pairs(nq, nk, True)
        got = sm.causal_pairs(nq, nk)
        assert got == want, (f"causal_pairs({nq}, {nk}) = {got}, expected {want} (a loop over every query and key): "
                             "query i sees keys 0 .. i + nk - nq, bottom-right aligned")


@pytest.mark.check("roofline")
def test_attention_bytes_and_full_flops(sm, rng):
    for _ in range(20):
        hkv = draw(rng, 1, 4)
        hq = hkv * draw(rng, 1, 4)
        b, nq, nk, d, e = draw(rng, 1, 4), draw(rng, 1, 300), draw(rng, 1, 300), pick(rng, [32, 64, 128]), pick(rng, [1, 2, 4])
        mat = bool(draw(rng, 0, 1))
        flops = 4 * b * hq * d * nq * nk
        moved = (2 * b * hq * nq * d + 2 * b * hkv * nk * d) * e + (4 * b * hq * nq * nk * e if mat else 0)
        got = tuple(sm.attention_cost(b, hq, hkv, nq, nk, d, False, e, mat))
        assert got == (flops, moved), (
            f"attention_cost(b={b}, hq={hq}, hkv={hkv}, nq={nq}, nk={nk}, d={d}, elem_bytes={e}, "
            f"materialize_scores={mat}), not causal: {got}, expected {(flops, moved)}: Q and O over hq heads, K and V over hkv, "
            "each once; a materialised S and P are each written and read once")


@pytest.mark.check("roofline")
def test_roofline(sm, rng):
    for _ in range(30):
        flops, moved = draw(rng, 1, 10 ** 12), draw(rng, 1, 10 ** 10)
        pf, bw = float(draw(rng, 1, 1000)) * 1e12, float(draw(rng, 1, 5000)) * 1e9
        got = sm.roofline(flops, moved, pf, bw)
        bound = "compute" if Fraction(flops) * Fraction(bw) >= Fraction(moved) * Fraction(pf) else "memory"
        want = {"intensity": flops / moved, "ridge": pf / bw, "bound": bound, "time": max(flops / pf, moved / bw)}
        assert isinstance(got, dict) and set(got) == set(want), (
            f"roofline returned {type(got).__name__} with keys {show(got) if isinstance(got, dict) else '-'}: "
            "expected a dict with intensity, ridge, bound and time")
        for key in ("intensity", "ridge", "time"):
            assert close(got[key], want[key]), (
                f"roofline({flops}, {moved}, {pf:g}, {bw:g})[{key!r}] = {got[key]}, expected {want[key]}: intensity "
                "is FLOPs per byte, ridge peak_flops / peak_bw, time the larger of the two times")
        assert got["bound"] == bound, (f"roofline({flops}, {moved}, {pf:g}, {bw:g}): bound {got['bound']!r}, expected "
                                       f"{bound!r} (intensity {want['intensity']:.4g}, ridge {want['ridge']:.4g})")


@pytest.mark.check("roofline")
def test_roofline_ties_and_edges(sm):
    got = sm.roofline(3 * 10 ** 12, 10 ** 10, 3e14, 1e12)
    assert got["bound"] == "compute", f"intensity 300 equals the ridge 300: a tie is compute-bound, got {got['bound']!r}"
    got = sm.roofline(10 ** 6, 0, 1e12, 1e9)
    assert got["bound"] == "compute" and got["intensity"] == float("inf"), (
        f"roofline with bytes = 0: expected intensity inf and compute-bound, got {got}")
    with pytest.raises(ValueError):
        sm.roofline(1, 1, 0, 1e9)


@pytest.mark.check("measured_flops")
def test_matmul_flops_are_measured(sm, rng):
    for _ in range(4):
        m, n, k = draw(rng, 1, 12), draw(rng, 1, 12), draw(rng, 1, 12)
        counted = o.measured_matmul_flops(m, n, k)
        got = sm.matmul_cost(m, n, k, 2)[0]
        assert got == counted, (f"matmul_cost({m}, {n}, {k}) FLOPs = {got}; FlopCounterMode counts {counted} on a real "
                                f"[{m}, {k}] @ [{k}, {n}]: a multiply-add is 2 FLOPs")


@pytest.mark.check("measured_flops")
@pytest.mark.parametrize("causal", [False, True])
def test_causal_flops_are_measured(sm, rng, causal):
    shapes = [(draw(rng, 1, 12), draw(rng, 1, 12)) for _ in range(5)] + [(7, 7), (3, 11), (11, 3)]
    for nq, nk in shapes:
        hkv = draw(rng, 1, 2)
        hq, b, d = hkv * draw(rng, 1, 3), draw(rng, 1, 2), pick(rng, [4, 8])
        counted = o.measured_attention_flops(b, hq, hkv, nq, nk, d, causal)
        pairs = o.visible_pairs(nq, nk, causal)
        got = sm.attention_cost(b, hq, hkv, nq, nk, d, causal, 2, False)[0]
        assert got == counted, (
            f"attention_cost(b={b}, hq={hq}, hkv={hkv}, nq={nq}, nk={nk}, d={d}, causal={causal}) FLOPs = {got}; "
            f"FlopCounterMode counts {counted} on real attention that computes only the visible pairs "
            f"({pairs} of {nq * nk}). "
            + ("Causal attention is not half the full count: under bottom-right alignment query i sees "
               "clamp(i + nk - nq + 1, 0, nk) keys (the diagonal is visible, and nq != nk shifts the mask)."
               if causal else "Non-causal attention: 2 matmuls of 2 d FLOPs per (query, key) pair and query head."))


@pytest.mark.check("roofline")
def test_attention_rejects(sm):
    with pytest.raises(ValueError):
        sm.attention_cost(1, 6, 4, 8, 8, 16, False, 2, False)
    assert sm.attention_cost(1, 8, 4, 8, 8, 16, False, 2, False)[0] == 4 * 8 * 16 * 64


# ------------------------------------------------------------------ KV cache and decode


@pytest.mark.check("kv_decode")
def test_kv_bytes(sm, rng):
    for _ in range(20):
        layers, heads, hd, e = draw(rng, 1, 96), pick(rng, [8, 32, 64]), pick(rng, [64, 128]), pick(rng, [1, 2, 4])
        kv = pick(rng, [heads, heads // 8, 1])            # MHA, GQA, MQA
        want = 2 * layers * kv * hd * e
        got = sm.kv_bytes_per_token(layers, kv, hd, e)
        assert got == want, (f"kv_bytes_per_token(layers={layers}, kv_heads={kv}, head_dim={hd}, elem_bytes={e}) = "
                             f"{got}, expected {want}: a K and a V vector per layer and per KV head (not per query "
                             f"head: {heads} query heads share {kv} KV heads here)")
    with pytest.raises(ValueError):
        sm.kv_bytes_per_token(32, 0, 128, 2)


@pytest.mark.check("kv_decode")
def test_decode_step(sm, rng):
    for _ in range(15):
        n, pb = draw(rng, 10 ** 6, 10 ** 10), pick(rng, [1, 2])
        per_tok = 2 * draw(rng, 1, 80) * pick(rng, [1, 8]) * 128 * 2
        contexts = [draw(rng, 0, 100_000) for _ in range(draw(rng, 1, 16))]
        want = (2 * n * len(contexts), n * pb + per_tok * sum(contexts))
        got = tuple(sm.decode_step_cost(n, pb, per_tok, contexts))
        assert got == want, (f"decode_step_cost(n_params={n}, param_bytes={pb}, kv_bytes_per_token={per_tok}, "
                             f"contexts of {len(contexts)} sequences) = {got}, expected {want}: the weights are read "
                             "once per step whatever the batch; each sequence reads its own cached K and V")
    with pytest.raises(ValueError):
        sm.decode_step_cost(10, 2, 4, [])


# ------------------------------------------------------------------ parameters and model states


def random_cfg(rng, tied=None):
    kv = pick(rng, [1, 2, 4])
    heads = kv * pick(rng, [1, 2, 3])
    return {"vocab": draw(rng, 10, 5000), "hidden": heads * pick(rng, [8, 16, 24]), "ffn": draw(rng, 8, 700),
            "layers": pick(rng, [1, 2, 3, 4, 6, 8]), "heads": heads, "kv_heads": kv,
            "tied": bool(draw(rng, 0, 1)) if tied is None else tied}


@pytest.mark.check("params")
@pytest.mark.parametrize("tied", [False, True])
def test_param_count_is_measured(sm, rng, tied):
    for _ in range(6):
        cfg = random_cfg(rng, tied)
        real = o.real_param_count(cfg)
        got = sm.param_count(cfg)
        extra = ("a tied lm_head is the embedding's own Parameter: count it once" if tied and got - real ==
                 cfg["vocab"] * cfg["hidden"] else "k and v are [hidden, kv_heads * head_dim], RMSNorm has a weight "
                 "and no bias, the MLP has gate, up and down")
        assert got == real, f"param_count({cfg}) = {got}; the real module has {real} parameters: {extra}"
    big = {"vocab": 128256, "hidden": 4096, "ffn": 14336, "layers": 32, "heads": 32, "kv_heads": 8, "tied": tied}
    assert sm.param_count(big) == o.real_param_count(big), f"param_count of a Llama-3-8B-shaped config ({big})"


@pytest.mark.check("params")
def test_param_count_rejects(sm):
    with pytest.raises(ValueError):
        sm.param_count({"vocab": 10, "hidden": 30, "ffn": 8, "layers": 1, "heads": 4, "kv_heads": 4, "tied": True})


@pytest.mark.check("model_states")
def test_model_states(sm, rng):
    for _ in range(12):
        n, dp = draw(rng, 1, 5000), draw(rng, 1, 24)
        for stage in range(4):
            want = o.states_by_rank(n, stage, dp)
            got = sm.model_state_bytes(n, stage, dp)
            assert got == want, (
                f"model_state_bytes({n}, zero_stage={stage}, dp={dp}) = {got}, expected {want}: 2 + 2 + 12 bytes per "
                "parameter (bf16 weights, gradients; the fp32 master copy, momentum, variance); stage 1 shards the 12, stage 2 "
                f"also the gradients, stage 3 everything; the largest rank holds ceil({n} / {dp}) parameters")
    with pytest.raises(ValueError):
        sm.model_state_bytes(100, 4, 2)


@pytest.mark.check("model_states")
def test_model_states_are_measured(sm, rng):
    sizes = [(draw(rng, 4, 40), draw(rng, 4, 40)) for _ in range(3)]
    sizes = [(sizes[0][0], sizes[0][1]), (sizes[0][1], sizes[1][1]), (sizes[1][1], sizes[2][1])]
    n, measured = o.measured_model_state_bytes(sizes)
    got = sm.model_state_bytes(n, 0, 1)
    assert got == measured, (
        f"model_state_bytes({n}, 0, 1) = {got}; a real mixed-precision AdamW step holds {measured} bytes "
        f"({measured // n} per parameter): bf16 weights and gradients, and torch.optim.AdamW's exp_avg and exp_avg_sq "
        "kept beside an fp32 master copy of the weights (Adam without the master copy counts 12, not 16)")


# ------------------------------------------------------------------ activations


@pytest.mark.check("activations")
def test_table2_rows(sm, rng):
    for _ in range(10):
        tp = pick(rng, [1, 2, 4, 8])
        heads = tp * pick(rng, [1, 2, 4])
        h, s, b = heads * pick(rng, [64, 128]), pick(rng, [512, 1024, 2048, 4096]), draw(rng, 1, 4)
        for sp in (False, True):
            for rec in ("none", "selective", "full"):
                want = o.table2_bytes(h, heads, s, b, tp, sp, rec)
                got = sm.activation_bytes(h, heads, s, b, tp, sp, rec)
                assert close(got, want), (
                    f"activation_bytes(hidden={h}, heads={heads}, seq={s}, batch={b}, tp={tp}, sp={sp}, "
                    f"recompute={rec!r}) = {got}, expected {float(want)} (Korthikanti et al., Table 2): without sp "
                    "the 10 sbh of layer norms, dropouts and the inputs to QKV and the MLP stay whole on every rank")
    with pytest.raises(ValueError):
        sm.activation_bytes(64, 4, 16, 1, 1, False, "some")
    with pytest.raises(ValueError):
        sm.activation_bytes(64, 4, 16, 1, 3, False, "none")


@pytest.mark.check("activations")
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_activations_are_measured(sm, rng, recompute):
    heads = pick(rng, [2, 4])
    h, b, s = heads * pick(rng, [8, 16]), draw(rng, 1, 2), pick(rng, [8, 12, 16])
    for seq in (s, 2 * s):
        measured = o.measured_activation_bytes(h, heads, seq, b, recompute)
        got = sm.activation_bytes(h, heads, seq, b, 1, False, recompute)
        assert close(got, measured), (
            f"activation_bytes(hidden={h}, heads={heads}, seq={seq}, batch={b}, recompute={recompute!r}) = {got}; a "
            f"real bf16 GPT layer saves {measured} bytes for its backward (saved_tensors_hooks). "
            + ("The scores term grows with seq squared: the softmax output (2 bytes), the dropout mask (1) and the "
               "dropped probabilities (2), 5 a s^2 b bytes" if recompute == "none" else
               "selective recompute drops exactly the attention core's tensors; full keeps the layer's input"))


# ------------------------------------------------------------------ memory per rank


def random_plan(rng, cfg):
    tp = pick(rng, [d for d in (1, 2, 4) if cfg["heads"] % d == 0])
    pp = pick(rng, [d for d in (1, 2, 3, 4) if cfg["layers"] % d == 0])
    cp = pick(rng, [1, 2, 4])
    return {"tp": tp, "pp": pp, "dp": draw(rng, 1, 8), "cp": cp, "zero_stage": draw(rng, 0, 3),
            "sp": bool(draw(rng, 0, 1)) and tp > 1, "recompute": pick(rng, ["none", "selective", "full"]),
            "micro_batch": draw(rng, 1, 4), "seq": cp * pick(rng, [128, 256, 512]), "num_microbatches": draw(rng, 1, 8)}


@pytest.mark.check("memory_per_rank")
def test_memory_per_rank(sm, rng):
    for _ in range(25):
        cfg = random_cfg(rng)
        plan = random_plan(rng, cfg)
        want = o.memory_oracle(cfg, plan)
        got = sm.memory_per_rank(cfg, plan)
        assert close(got, want), (
            f"memory_per_rank(cfg={cfg}, plan={plan}) = {got}, expected {float(want)}: model states of "
            "ceil(P / (tp pp)) parameters with ZeRO over dp * cp ranks, plus layers / pp layers of activations at "
            "seq / cp tokens, times min(pp, num_microbatches) microbatches in flight")
    cfg = random_cfg(rng)
    plan = dict(random_plan(rng, cfg), pp=cfg["layers"] + 1)
    with pytest.raises(ValueError):
        sm.memory_per_rank(cfg, plan)


# ------------------------------------------------------------------ the mesh


@pytest.mark.check("mesh")
def test_mesh_random(sm, rng):
    names = ["tp", "cp", "ep", "dp", "pp"]
    for _ in range(12):
        perm = torch.randperm(5, generator=rng).tolist()
        order = "-".join(names[i] for i in perm)
        sizes = {n: pick(rng, [1, 2, 2, 3, 4]) for n in names if draw(rng, 0, 4)}
        world = 1
        for v in sizes.values():
            world *= v
        coords, groups = sm.rank_mesh(world, sizes, order)
        want_c, want_g = o.mesh_by_enumeration(world, sizes, order)
        assert {int(r): {k: int(v) for k, v in c.items()} for r, c in coords.items()} == want_c, (
            f"rank_mesh({world}, {sizes}, {order!r}): coordinates differ; the leftmost name varies fastest: "
            f"rank = sum(coord * product of the sizes of the names left of it)")
        for name in order.split("-"):
            assert [list(g) for g in groups[name]] == want_g[name], (
                f"rank_mesh({world}, {sizes}, {order!r}): groups[{name!r}] = {groups[name]}, expected "
                f"{want_g[name]}: each group's ranks in {name}'s index order, the groups in the order of the other "
                "names' indices, leftmost fastest")


@pytest.mark.check("mesh")
def test_mesh_megatron_example(sm):
    # generate_masked_orthogonal_rank_groups's docstring: order tp-pp-dp, sizes 2-2-2, dp groups
    _, groups = sm.rank_mesh(8, {"tp": 2, "pp": 2, "dp": 2}, "tp-pp-dp")
    assert [list(g) for g in groups["dp"]] == [[0, 4], [1, 5], [2, 6], [3, 7]], (
        f"order tp-pp-dp, sizes 2-2-2: dp groups {groups['dp']}, expected Megatron's [[0, 4], [1, 5], [2, 6], [3, 7]]")
    # and its [tp, dp, pp] = [2, 3, 4] example
    _, groups = sm.rank_mesh(24, {"tp": 2, "dp": 3, "pp": 4}, "tp-dp-pp")
    assert [list(g) for g in groups["dp"]][:2] == [[0, 2, 4], [1, 3, 5]] and list(groups["dp"][7]) == [19, 21, 23], (
        f"order tp-dp-pp, sizes 2-3-4: dp groups {groups['dp']}, expected [0, 2, 4], [1, 3, 5], ..., [19, 21, 23]")


@pytest.mark.check("mesh")
def test_mesh_rejects(sm):
    with pytest.raises(ValueError):
        sm.rank_mesh(8, {"tp": 2, "pp": 2}, "tp-cp-ep-dp-pp")
    with pytest.raises(ValueError):
        sm.rank_mesh(4, {"tp": 2, "xx": 2}, "tp-cp-ep-dp-pp")
    with pytest.raises(ValueError):
        sm.rank_mesh(4, {"tp": 2, "dp": 2}, "tp-dp-tp")
    coords, _ = sm.rank_mesh(4, {"tp": 2, "dp": 2})
    assert coords[3] == {"tp": 1, "cp": 0, "ep": 0, "dp": 1, "pp": 0}, f"rank_mesh(4, tp 2, dp 2)[3] = {coords[3]}"


# ------------------------------------------------------------------ the planner


@pytest.mark.check("planner")
def test_planner(sm, rng):
    cases = 0
    while cases < 4:
        world = pick(rng, [8, 12, 16])
        cfg = {"vocab": 32000, "hidden": 1024 * pick(rng, [1, 2]), "ffn": 4096, "layers": pick(rng, [8, 12, 16]),
               "heads": 16, "kv_heads": pick(rng, [4, 8, 16]), "tied": bool(draw(rng, 0, 1))}
        seq, gb, stage = pick(rng, [2048, 4096]), pick(rng, [16, 32, 48]), draw(rng, 0, 3)
        rec, gpn = pick(rng, ["none", "selective", "full"]), pick(rng, [2, 4])
        everything = o.plans_by_enumeration(cfg, world, gpn, float("inf"), seq, gb, stage, rec)
        if len(everything) < 2:                                # no choice to make (12 ranks, no dp of 3): draw again
            continue
        cases += 1
        need = sorted(float(o.memory_oracle(cfg, dict(tp=t, pp=p, dp=d, cp=c, zero_stage=stage, sp=t > 1, recompute=rec,
                                                      micro_batch=1, seq=seq, num_microbatches=gb // d)))
                      for t, p, d, c in everything)
        mid = len(need) // 2                                   # about half the plans fit, no plan at the edge
        budget = (need[mid - 1] + need[mid]) / 2 if need[mid] > need[mid - 1] else need[mid] * (1 + 1e-6)
        want = o.plans_by_enumeration(cfg, world, gpn, budget, seq, gb, stage, rec)
        got = [tuple(p) for p in sm.plan_4d(cfg, world, gpn, budget, seq, gb, stage, rec)]
        missing, extra = [p for p in want if p not in got], [p for p in got if p not in want]
        assert not missing and not extra, (
            f"plan_4d(world={world}, gpus_per_node={gpn}, gpu_bytes={budget:.6g}, seq={seq}, global_batch={gb}, zero_stage={stage}, "
            f"recompute={rec!r}, cfg={cfg}): missing {missing[:4]}, not expected {extra[:4]} (of {len(want)} plans "
            "that fit): every (tp, pp, dp, cp) with product world, tp <= gpus_per_node and dividing heads and "
            "kv_heads, pp dividing layers, cp dividing seq, dp dividing global_batch, memory_per_rank <= gpu_bytes")
        assert got == want, (f"plan_4d: the right plans in the wrong order: {got[:6]}, expected {want[:6]}: sort by the "
                             "bubble (pp - 1) / num_microbatches, then tp, cp and pp")


# ------------------------------------------------------------------ calibration (CUDA)
#
# The one place the course checks that the roofline holds on real hardware. The grader measures the GPU's two
# peaks in this run (speed.ceilings(): a bf16 8192^3 matmul's FLOP/s and a 512 MiB device copy's bytes per
# second), times six real bf16 ops, and asks the student's functions for each op's FLOPs and bytes and the
# roofline's time at those peaks. The figure is the agreement min(predicted / measured, measured / predicted):
# full marks within 2x (0.5), none past 4x (0.25), linear between. The 2x is the design's judgement, not yet
# calibrated on a GPU: `grader gpu-check` prints the reference's agreement per op against the bar, with a
# suggested bar where the margin is thin.
#
# What it measures is the fastest of torch's implementations of each op (every SDPA backend that accepts the
# inputs, GQA decode both as enable_gqa and with a group's query heads folded into rows): the roofline bounds
# what an implementation can reach, so a slow backend is not the model's miss. Softmax and the add have no
# cost function in the contract: the grader counts their bytes (read once, written once; 0 FLOPs, as the
# contract counts only matmuls) and the student's roofline alone predicts them.

CALIBRATION = ["gemm", "gemv", "softmax", "add", "sdpa_4k", "decode_sdpa"]
CALIBRATION_REPS = 50  # a rep takes 0.1-1 ms on an H100 at these sizes: a loop is 5-50 ms


def _sdpa_backends():
    """(name, context) for the default dispatch and for each SDPA backend forced alone."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = [("sdpa default", contextlib.nullcontext)]
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                    SDPBackend.MATH):
        out.append((f"sdpa {backend.name.lower()}", lambda backend=backend: sdpa_kernel(backend)))
    return out


def calibration_case(op: str) -> dict:
    """One op: what it is, the student's (flops, bytes) for it, the contract's counts, and the ways to run it
    as (name, context factory, fn); inputs made once here (bf16, fp16 in a CPU rehearsal), tiny in a rehearsal."""
    dev, dt, e = rehearsal.device(), rehearsal.dtype(torch.bfloat16), 2
    gen = torch.Generator(device=dev).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device=dev, dtype=dt, generator=gen)

    if op == "gemm":  # a prefill projection: 16384 tokens through a 4096 x 4096 weight
        m, n, k = rehearsal.size((16384, 4096, 4096), (64, 48, 32))
        a, b = randn(m, k), randn(k, n)
        return dict(what=f"GEMM [{m}, {k}] @ [{k}, {n}]", call=f"matmul_cost({m}, {n}, {k}, 2)",
                    cost=lambda sm: sm.matmul_cost(m, n, k, e), contract=(2 * m * n * k, (m * k + k * n + m * n) * e),
                    ways=[("torch.matmul", contextlib.nullcontext, lambda: a @ b)])
    if op == "gemv":  # one decode token through a 28672 x 8192 weight (Llama-70B's MLP up-projection)
        n, k = rehearsal.size((28672, 8192), (256, 128))
        x, w = randn(1, k), randn(n, k)
        return dict(what=f"GEMV [1, {k}] @ [{k}, {n}] (F.linear)", call=f"matmul_cost(1, {n}, {k}, 2)",
                    cost=lambda sm: sm.matmul_cost(1, n, k, e), contract=(2 * n * k, (k + k * n + n) * e),
                    ways=[("F.linear", contextlib.nullcontext, lambda: F.linear(x, w))])
    if op == "softmax":  # rows of 16384 scores
        r, c = rehearsal.size((16384, 16384), (64, 128))
        x = randn(r, c)
        moved = 2 * r * c * e
        return dict(what=f"softmax over the last dim of [{r}, {c}]", call=None, cost=lambda sm: (0, moved),
                    contract=(0, moved), ways=[("torch.softmax", contextlib.nullcontext, lambda: torch.softmax(x, -1))])
    if op == "add":
        n = rehearsal.size(1 << 28, 1 << 12)
        a, b = randn(n), randn(n)
        moved = 3 * n * e
        return dict(what=f"elementwise add of two [{n}] tensors", call=None, cost=lambda sm: (0, moved),
                    contract=(0, moved), ways=[("torch.add", contextlib.nullcontext, lambda: a + b)])
    if op == "sdpa_4k":  # prefill attention, flash_attention's speed shape
        b, h, n, d = rehearsal.size((4, 16, 4096, 128), (1, 2, 64, 16))
        q, k, v = randn(b, h, n, d), randn(b, h, n, d), randn(b, h, n, d)
        return dict(what=f"attention, non-causal, b={b} h={h} n={n} d={d}",
                    call=f"attention_cost({b}, {h}, {h}, {n}, {n}, {d}, causal=False, elem_bytes=2)",
                    cost=lambda sm: sm.attention_cost(b, h, h, n, n, d, False, e, False),
                    contract=(4 * b * h * d * n * n, 4 * b * h * n * d * e),
                    ways=[(name, ctx, lambda: F.scaled_dot_product_attention(q, k, v)) for name, ctx in _sdpa_backends()])
    if op == "decode_sdpa":  # one new token per sequence against a long GQA cache
        b, hq, hkv, nk, d = rehearsal.size((8, 32, 8, 32768, 128), (1, 4, 2, 64, 16))
        q, k, v = randn(b, hq, 1, d), randn(b, hkv, nk, d), randn(b, hkv, nk, d)
        folded = q.view(b, hkv, hq // hkv, d)  # query head h reads KV head h // group: a group's heads as rows
        ways = []
        for name, ctx in _sdpa_backends():
            ways.append((f"{name} (enable_gqa)", ctx, lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)))
            ways.append((f"{name} (group as rows)", ctx, lambda: F.scaled_dot_product_attention(folded, k, v)))
        # One query sees every key: bottom-right causal is no mask (torch's is_causal would align top-left).
        return dict(what=f"decode attention, b={b} hq={hq} hkv={hkv} nq=1 nk={nk} d={d}",
                    call=f"attention_cost({b}, {hq}, {hkv}, 1, {nk}, {d}, causal=True, elem_bytes=2)",
                    cost=lambda sm: sm.attention_cost(b, hq, hkv, 1, nk, d, True, e, False),
                    contract=(4 * b * hq * d * nk, (2 * b * hq * d + 2 * b * hkv * nk * d) * e), ways=ways)
    raise KeyError(op)


def fastest(ways, reps: int) -> tuple[float, str, list[str]]:
    """The least mean time of the ways that run here, its name, and the names of the ways that did not run."""
    best, best_name, refused = math.inf, "", []
    for name, ctx, fn in ways:
        try:
            with ctx():
                t = speed.time_here(fn, [], reps=reps)
        except RuntimeError as err:  # a backend that does not take these inputs on this device
            why = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
            refused.append((name, why))
            continue
        if t.mean_s < best:
            best, best_name = t.mean_s, name
    if not best_name:
        raise RuntimeError(f"none of the ways to run the op ran here: {refused}")
    return best, best_name, [name for name, _ in refused]


@pytest.mark.cuda
@pytest.mark.check("calibration")
@pytest.mark.parametrize("op", CALIBRATION)
def test_roofline_predicts_measured_time(sm, score, op):
    ceil = speed.ceilings()  # measured once per grading run, on this GPU, before any op
    peak, bw = ceil.matmul_flops_per_s, ceil.copy_bytes_per_s
    case = calibration_case(op)
    flops, moved = (tuple(case["cost"](sm)) if case["call"] else case["contract"])
    verdict = sm.roofline(flops, moved, peak, bw)
    predicted = float(verdict["time"])
    measured, way, refused = fastest(case["ways"], CALIBRATION_REPS)
    contract_s = max(case["contract"][0] / peak, case["contract"][1] / bw)
    agreement = min(predicted / measured, measured / predicted) if math.isfinite(predicted) and predicted > 0 else 0.0
    score.metrics(predicted_s=predicted, measured_s=measured, contract_predicted_s=contract_s,
                  achieved_tflops=case["contract"][0] / measured / 1e12,
                  achieved_gbps=case["contract"][1] / measured / 1e9, **ceil.figures())
    off = (f"{measured / predicted:.2f}x slower than" if measured >= predicted else f"{predicted / measured:.2f}x faster than"
           ) if predicted > 0 and math.isfinite(predicted) else "against"
    counts = ""
    if case["call"] and (flops, moved) != case["contract"]:
        counts = (f" Your {case['call']} gave ({flops}, {moved}); the contract counts {case['contract']}: the roofline "
                  "check grades those counts.")
    elif not case["call"]:
        counts = f" (The grader counted {moved} bytes, 0 FLOPs: each element read once and written once.)"
    message = (f"{case['what']}: your roofline predicts {predicted * 1e6:.4g} us ({verdict.get('bound')}-bound at "
               f"{peak / 1e12:.4g} TFLOP/s and {bw / 1e9:.4g} GB/s, both measured on this device in this run); "
               f"the fastest way ({way}) took {measured * 1e6:.4g} us, {off} predicted; the contract's counts predict "
               f"{contract_s * 1e6:.4g} us.{counts} Agreement {agreement:.2f}: full marks from 0.5 (within 2x), none "
               "at 0.25 (4x); time = max(flops / peak_flops, bytes / peak_bw).")
    if refused:
        message += f" Not run on this device: {', '.join(refused)}."
    score.speed(agreement, message)
