"""Known-wrong budgets submissions: the mistakes students make, each as an edit of the reference.

The signature is formulas that agree with measurement. The textbook calculator counts causal attention as half
the full count: the right number for a long square sequence, give or take the diagonal, and exactly what
FlopCounterMode does not count on attention that computes only the visible pairs, so it loses `measured_flops`
and keeps the rest. The other textbook simplifications (tied embeddings counted twice, Adam without its fp32
master copy, activations without the scores) lose the check that measures the real module, step or layer.
Two lose the CUDA check `calibration` too (a roofline that forgets the bytes, attention bytes over query heads):
the project's tests prove only that it is not graded without CUDA; `grader gpu-check` proves the loss on a GPU.
"""

from tests.known_wrong import Mutant

_ALL = ["roofline_public", "memory_public", "mesh_public", "roofline", "measured_flops", "kv_decode", "params",
        "model_states", "activations", "memory_per_rank", "mesh", "planner", "calibration"]


def _keeps(*lost):
    return [c for c in _ALL if c not in lost]


MUTANTS = [
    Mutant(
        name="textbook_causal_is_half",
        why="causal attention costs half of the full nq * nk pairs (the textbook's shortcut)",
        cause=r"Causal attention is not half the full count",
        edits=[("    pairs = causal_pairs(nq, nk) if causal else nq * nk\n",
                "    pairs = nq * nk / 2 if causal else nq * nk\n")],
        loses=["measured_flops"],
        keeps=_keeps("measured_flops"),
    ),
    Mutant(
        name="roofline_flops_only",
        why="an op costs its FLOPs: time = flops / peak_flops, the bytes never counted",
        cause=r"bytes / peak_bw|larger of the two times",
        edits=[("        \"time\": max(flops / peak_flops, bytes / peak_bw),\n",
                "        \"time\": flops / peak_flops,\n")],
        # On a GPU it predicts 0 s for softmax and the add and almost nothing for the GEMV and decode: `calibration`.
        loses=["roofline_public", "roofline", "calibration"],
        keeps=_keeps("roofline_public", "roofline", "calibration"),
    ),
    Mutant(
        name="kv_missing_factor_2",
        why="the KV cache holds K only: V is forgotten",
        cause=r"a K and a V vector per layer",
        edits=[("    return 2 * layers * kv_heads * head_dim * elem_bytes\n",
                "    return layers * kv_heads * head_dim * elem_bytes\n")],
        loses=["kv_decode"],
        keeps=_keeps("kv_decode"),
    ),
    Mutant(
        name="gqa_counts_q_heads",
        why="attention reads K and V for every query head, as if there were no grouped-query sharing",
        cause=r"K and V over hkv",
        edits=[("    moved = (2 * b * hq * nq * d + 2 * b * hkv * nk * d) * elem_bytes\n",
                "    moved = (2 * b * hq * nq * d + 2 * b * hq * nk * d) * elem_bytes\n")],
        # On a GPU the decode op's predicted time is 4x the contract's (hq = 4 hkv): it loses `calibration` too.
        loses=["roofline", "calibration"],
        keeps=_keeps("roofline", "calibration"),
    ),
    Mutant(
        name="adam_without_master",
        why="Adam's state is momentum and variance only: 12 bytes per parameter, no fp32 master copy",
        cause=r"master copy",
        edits=[("    if zero_stage == 0:\n        return 16 * n_params\n    if zero_stage == 1:\n"
                "        return 4 * n_params + 12 * piece\n    if zero_stage == 2:\n        return 2 * n_params + 14 * piece\n"
                "    return 16 * piece\n",
                "    if zero_stage == 0:\n        return 12 * n_params\n    if zero_stage == 1:\n"
                "        return 4 * n_params + 8 * piece\n    if zero_stage == 2:\n        return 2 * n_params + 10 * piece\n"
                "    return 12 * piece\n")],
        loses=["model_states", "memory_per_rank", "planner"],
    ),
    Mutant(
        name="mesh_pp_fastest",
        why="the order string read right to left: pp varies fastest",
        cause=r"leftmost name varies fastest|varies fastest",
        edits=[("    names = order.split(\"-\")\n    _need(len(set(names))",
                "    names = order.split(\"-\")[::-1]\n    _need(len(set(names))")],
        loses=["mesh_public", "mesh"],
    ),
    Mutant(
        name="tied_counted_twice",
        why="a tied lm_head counted as a second vocab x hidden matrix",
        cause=r"count it once",
        edits=[("    embeddings = cfg[\"vocab\"] * h * (1 if cfg[\"tied\"] else 2)\n",
                "    embeddings = cfg[\"vocab\"] * h * 2\n")],
        loses=["params"],
    ),
    Mutant(
        name="no_score_term",
        why="activations without the attention scores (as if flash attention ran without selective recompute)",
        cause=r"scores term grows with seq squared|Table 2",
        edits=[("    return linear + 5 * heads * seq * seq * batch / t\n", "    return linear\n")],
        loses=["activations", "memory_per_rank"],
    ),
    Mutant(
        name="sp_ignored",
        why="sequence parallelism does not change the activations: the 10 sbh stays whole",
        cause=r"Table 2",
        edits=[("    linear = 34 * sbh / t if sp else sbh * (10 + 24 / t)\n", "    linear = sbh * (10 + 24 / t)\n")],
        loses=["activations"],
    ),
    Mutant(
        name="zero_over_dp_only",
        why="ZeRO shards over dp only, forgetting the cp ranks that hold the same weights",
        cause=r"ZeRO over dp \* cp",
        edits=[("    states = model_state_bytes(shard, plan[\"zero_stage\"], dp * cp)\n",
                "    states = model_state_bytes(shard, plan[\"zero_stage\"], dp)\n")],
        loses=["memory_per_rank"],
    ),
    Mutant(
        name="planner_ignores_node",
        why="the planner lets tensor parallelism span nodes",
        cause=r"tp <= gpus_per_node",
        edits=[("        if (tp > gpus_per_node or cfg", "        if (cfg")],
        loses=["planner"],
    ),
]
