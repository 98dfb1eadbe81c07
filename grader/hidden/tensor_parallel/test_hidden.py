"""Hidden checks for tensor_parallel: the conjugate operators, the column/row split, a TP MLP and an MLP block
with sequence parallelism, on simulated ranks (grader/support/tensor_parallel.py), and one run on real processes.

The oracles (oracle.py) are the unsharded module in float64 with autograd on whole tensors, shards taken by
index lists written from the contract, and the ring's closed-form traffic.

The signature: the communication pattern. `communication` reads each rank's log of collectives (kept by the
driver, out of the rank's reach) and asserts the exact operations, their order and the elements each rank sent,
forward and backward: TP one all-reduce of s*b*h each way per MLP; SP an all-gather then a reduce-scatter
forward, and all-gather, all-gather (the column layer's input gathered again), reduce-scatter backward.
`activation_memory` reads the shapes autograd saved (saved-tensor hooks) under SP. Right values reached by an
all-reduce then a slice, by gathering the whole sequence before the norm, or by keeping the gathered input for
backward lose these two. They cannot see traffic that bypasses the given collectives (a module-level variable
shared by the simulated ranks): the real-process check would then fail.

Contract clauses (README "The contract") and the tests that draw them:

| clause | tests |
| --- | --- |
| f, g, the SP pair (gather_from_sp, reduce_scatter_to_sp): forward and backward, t in 1..4, fp32/fp64 | test_conjugates |
| shard_linear column/row, stride 1..3, errors | test_shard_linear, test_shard_linear_rejects |
| column then row equal one linear pair, bias once | test_column_then_row |
| tp_mlp GeLU and SwiGLU, values and every gradient | test_mlp |
| tp_mlp_block with and without SP, finalize_grads | test_block_sp |
| the collectives each way, elements per rank | test_communication |
| saved tensors under SP | test_activation_memory |
| real processes | test_distributed |
| shard_attention by heads (MHA, GQA), tp_attention values and gradients, causal with a cache (Nq != Nk), SP | test_shard_attention, test_attention |
| n_kv_heads % t, n_heads % n_kv_heads: ValueError | test_attention_rejects |
| attention's collectives each way | test_attention_communication |
| no Python loop over heads | test_attention_no_head_loop |
| tp_block (attention then MLP, pre-LN) with and without SP, finalize_grads of both norms, b_o and b2 | test_layer_sp |
| a whole layer's collectives each way, and finalize's | test_layer_communication |
"""

import pytest
import torch

from grader.hidden.tensor_parallel.oracle import (
    attention_full, attention_grads, block_full, column_rows, expected_layer_pattern, expected_pattern, full_grads,
    layer_full, mlp_full, o_cols, qkv_rows, row_cols, shard_attention_params, shard_params,
)
from grader.structure import assert_no_loop_over
from grader.testing import assert_close

RUN = "grader.support.tensor_parallel:run_tp"
CALL = "grader.support.tensor_parallel:run_call"
DIST = "grader.support.tensor_parallel:run_tp_distributed"
SOLO = "grader.support.tensor_parallel:solo_comm"


@pytest.fixture(scope="module")
def tp(student):
    from grader.support.ring_allreduce import forbidden_collectives
    return student.load("tensor_parallel", forbid=forbidden_collectives(),
                        forbid_why="use the communicator's collectives (comm.all_reduce, ...)")


def mlp_params(h, f, act, rng, ln=False):
    rows = 2 * f if act == "swiglu" else f
    p = {"w1": torch.randn(rows, h, generator=rng, dtype=torch.float64) / h ** 0.5,
         "b1": torch.randn(rows, generator=rng, dtype=torch.float64),
         "w2": torch.randn(h, f, generator=rng, dtype=torch.float64) / f ** 0.5,
         "b2": torch.randn(h, generator=rng, dtype=torch.float64)}
    if ln:
        p["ln_w"] = 1 + 0.1 * torch.randn(h, generator=rng, dtype=torch.float64)
        p["ln_b"] = 0.1 * torch.randn(h, generator=rng, dtype=torch.float64)
    return p


def ops(entries):
    return [(e["op"], e["elements"]) for e in entries]


# ---------------------------------------------------------------- conjugates

OPS = {  # name: (forward of the per-rank inputs, backward of the per-rank grads), summed with Python loops
    "copy_to_tp": (lambda xs, r: xs[r], lambda gs, r: sum(gs[k] for k in range(len(gs)))),
    "reduce_from_tp": (lambda xs, r: sum(xs[k] for k in range(len(xs))), lambda gs, r: gs[r]),
    "gather_from_sp": (lambda xs, r: torch.cat([xs[k] for k in range(len(xs))]),
                       lambda gs, r: sum(gs[k] for k in range(len(gs))).chunk(len(gs))[r]),
    "reduce_scatter_to_sp": (lambda xs, r: sum(xs[k] for k in range(len(xs))).chunk(len(xs))[r],
                             lambda gs, r: torch.cat([gs[k] for k in range(len(gs))])),
}
WHY = {
    "copy_to_tp": "f is the identity forward and all-reduces the gradient backward: the input of a column-parallel "
                  "layer is already replicated, so f's reduction belongs to the backward pass",
    "reduce_from_tp": "g all-reduces forward (the row-parallel layer's partial sums) and passes the gradient "
                      "unchanged backward: each rank's gradient is already the whole gradient",
    "gather_from_sp": "gather_from_sp (the SP paper's g) all-gathers the sequence forward and reduce-scatters the gradient backward",
    "reduce_scatter_to_sp": "reduce_scatter_to_sp (the SP paper's g-bar) reduce-scatters forward and all-gathers the gradient backward",
}


@pytest.mark.check("conjugates")
@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_conjugates(student, tp, rng, name, world, dtype):
    shape_in = (4 * world, 3, 5) if name in ("reduce_from_tp", "copy_to_tp", "reduce_scatter_to_sp") else (4, 3, 5)
    xs = [torch.randn(*shape_in, generator=rng, dtype=torch.float64) for _ in range(world)]
    fwd, bwd = OPS[name]
    out_shape = fwd(xs, 0).shape
    gs = [torch.randn(*out_shape, generator=rng, dtype=torch.float64) for _ in range(world)]
    res = student.drive(RUN, getattr(tp, name), [x.to(dtype) for x in xs], grads=[g.to(dtype) for g in gs])
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for r in range(world):
        assert_close(res[r]["out"], fwd(xs, r), atol=tol, rtol=tol, what=f"{name} forward, rank {r} of {world}",
                     hint=WHY[name])
        assert res[r]["out"].dtype == dtype, f"{name} forward returned {res[r]['out'].dtype} for {dtype} input"
        assert_close(res[r]["x_grad"], bwd(gs, r), atol=tol, rtol=tol,
                     what=f"{name} backward (x's gradient), rank {r} of {world}", hint=WHY[name])
        if world == 1:
            assert sum(e["elements"] for e in res[r]["forward"] + res[r]["backward"]) == 0, \
                f"{name} sent elements with world_size 1"


# ---------------------------------------------------------------- shard_linear, column and row


@pytest.mark.check("column_row")
@pytest.mark.parametrize("world,stride", [(1, 1), (2, 1), (3, 1), (2, 2), (4, 2), (2, 3), (3, 3)])
def test_shard_linear(student, tp, rng, world, stride):
    out_f, in_f = 4 * world * stride, 6 * world
    w = torch.randn(out_f, in_f, generator=rng, dtype=torch.float64)
    b = torch.randn(out_f, generator=rng, dtype=torch.float64)
    col = student.drive(CALL, tp.shard_linear, world, [w, b, "column", stride], 2)
    row = student.drive(CALL, tp.shard_linear, world, [w, b, "row", 1], 2)
    for r in range(world):
        rows = column_rows(out_f, world, r, stride)
        hint = ("with stride k the output is k fused matrices: rank r takes block r of each, not the r-th "
                "contiguous block of the stack" if stride > 1 else "rank r takes the r-th block of rows")
        assert_close(col[r]["value"][0], w[rows], atol=0, rtol=0, what=f"column w, rank {r}, stride {stride}",
                     hint=hint)
        assert_close(col[r]["value"][1], b[rows], atol=0, rtol=0, what=f"column b, rank {r}, stride {stride}",
                     hint=hint)
        assert_close(row[r]["value"][0], w[:, row_cols(in_f, world, r)], atol=0, rtol=0, what=f"row w, rank {r}")
        assert_close(row[r]["value"][1], b, atol=0, rtol=0, what=f"row b, rank {r}",
                     hint="a row-parallel layer's bias is not split: every rank holds it whole")


@pytest.mark.check("column_row")
@pytest.mark.parametrize("kind,out_f,in_f,stride", [("column", 6, 4, 1), ("column", 8, 4, 3), ("row", 4, 5, 1)])
def test_shard_linear_rejects(student, tp, kind, out_f, in_f, stride):
    w, b = torch.zeros(out_f, in_f, dtype=torch.float64), torch.zeros(out_f, dtype=torch.float64)
    with pytest.raises(ValueError):
        student.drive(CALL, tp.shard_linear, 4, [w, b, kind, stride], 2)


@pytest.mark.check("column_row")
@pytest.mark.parametrize("world", [2, 3])
def test_column_then_row(student, tp, rng, world):
    """Each rank's column output is its columns of x @ W1.T + b1; the row layer's reduced output is the whole
    x @ W2.T + b2 with the bias counted once; gradients of w, b and x match the full linear's slices."""
    s, b, h, f = 6, 2, 8, 4 * world
    w1, b1 = torch.randn(f, h, generator=rng, dtype=torch.float64), torch.randn(f, generator=rng, dtype=torch.float64)
    w2, b2 = torch.randn(h, f, generator=rng, dtype=torch.float64), torch.randn(h, generator=rng, dtype=torch.float64)
    x = torch.randn(s, b, h, generator=rng, dtype=torch.float64)
    g1 = torch.randn(s, b, f, generator=rng, dtype=torch.float64)
    hid = x @ w1.T + b1
    rows = [column_rows(f, world, r) for r in range(world)]
    res = student.drive(RUN, tp.column_parallel_linear, [x] * world, [(w1[rw], b1[rw]) for rw in rows],
                        [g1[..., rw] for rw in rows])
    for r in range(world):
        assert_close(res[r]["out"], hid[..., rows[r]], atol=1e-12, rtol=1e-12,
                     what=f"column_parallel_linear output, rank {r} of {world}",
                     hint="rank r computes its own columns of the output: x @ w_r.T + b_r, with no communication")
        assert_close(res[r]["grads"]["0"], g1[..., rows[r]].reshape(-1, f // world).T @ x.reshape(-1, h),
                     atol=1e-10, rtol=1e-10, what=f"column w's gradient, rank {r}")
    assert_close(res[0]["x_grad"], g1 @ w1, atol=1e-10, rtol=1e-10, what="column_parallel_linear's x gradient",
                 hint="each rank's x gradient holds only its columns' part: f's backward all-reduces it")
    g2 = torch.randn(s, b, h, generator=rng, dtype=torch.float64)
    cols = [row_cols(f, world, r) for r in range(world)]
    res = student.drive(RUN, tp.row_parallel_linear, [hid[..., c] for c in cols], [(w2[:, c], b2) for c in cols],
                        [g2] * world)
    for r in range(world):
        assert_close(res[r]["out"], hid @ w2.T + b2, atol=1e-10, rtol=1e-10,
                     what=f"row_parallel_linear output, rank {r} of {world}",
                     hint="sum the partial products over the ranks, then add the bias once: a bias added before "
                          "the all-reduce is counted t times")
        assert_close(res[r]["grads"]["1"], g2.reshape(-1, h).sum(0), atol=1e-10, rtol=1e-10,
                     what=f"row b's gradient, rank {r}")
        assert_close(res[r]["x_grad"], g2 @ w2[:, cols[r]], atol=1e-10, rtol=1e-10, what=f"row x gradient, rank {r}")


# ---------------------------------------------------------------- the MLP


@pytest.mark.check("mlp")
@pytest.mark.parametrize("act", ["gelu", "swiglu"])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_mlp(student, tp, rng, act, world):
    s, b, h, f = 8, 2, 16, 8 * world
    p = mlp_params(h, f, act, rng)
    x = torch.randn(s, b, h, generator=rng, dtype=torch.float64)
    g = torch.randn(s, b, h, generator=rng, dtype=torch.float64)
    out, xg, pg = full_grads(mlp_full, x, p, g, act)
    shards = student.drive(CALL, tp.shard_mlp, world, [p], 1, {"act": act})
    for r in range(world):
        want = shard_params(p, world, r, act)
        for k in ("w1", "b1", "w2", "b2"):
            assert_close(shards[r]["value"][k], want[k], atol=0, rtol=0, what=f"shard_mlp({act})[{k!r}], rank {r}",
                         hint="SwiGLU's fc1 stacks gate and up: shard it with stride 2" if act == "swiglu" else None)
    res = student.drive(RUN, tp.tp_mlp, [x] * world, [shard_params(p, world, r, act) for r in range(world)],
                        [g] * world, {"act": act})
    for r in range(world):
        stride = 2 if act == "swiglu" else 1
        rows, cols = column_rows(p["w1"].shape[0], world, r, stride), row_cols(f, world, r)
        assert_close(res[r]["out"], out, atol=1e-10, rtol=1e-10, what=f"tp_mlp({act}) output, rank {r} of {world}")
        assert_close(res[r]["x_grad"], xg, atol=1e-10, rtol=1e-10, what=f"tp_mlp({act}) x gradient, rank {r}",
                     hint="x's gradient is the sum of every rank's part: f's backward must all-reduce")
        for k, sl in (("w1", rows), ("b1", rows)):
            assert_close(res[r]["grads"][k], pg[k][sl], atol=1e-10, rtol=1e-10, what=f"{k}'s gradient, rank {r}")
        assert_close(res[r]["grads"]["w2"], pg["w2"][:, cols], atol=1e-10, rtol=1e-10, what=f"w2's gradient, rank {r}")
        assert_close(res[r]["grads"]["b2"], pg["b2"], atol=1e-10, rtol=1e-10, what=f"b2's gradient, rank {r}",
                     hint="g's backward is the identity: an all-reduce there makes upstream gradients t times too big")


# ---------------------------------------------------------------- sequence parallelism


def _block_run(student, tp, rng, world, sp, act="gelu", saved=False, s=8, b=2, h=16):
    f = 2 * h
    p = mlp_params(h, f, act, rng, ln=True)
    x = torch.randn(s, b, h, generator=rng, dtype=torch.float64)
    g = torch.randn(s, b, h, generator=rng, dtype=torch.float64)
    xs = list(x.chunk(world)) if sp else [x] * world
    gs = list(g.chunk(world)) if sp else [g] * world
    res = student.drive(RUN, tp.tp_mlp_block, xs, [shard_params(p, world, r, act) for r in range(world)], gs,
                        {"sequence_parallel": sp, "act": act}, finalize=True, saved=saved)
    return res, (x, p, g, f, (s, b, h))


@pytest.mark.check("sequence_parallel")
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("act", ["gelu", "swiglu"])
def test_block_sp(student, tp, rng, world, act):
    for sp in (False, True):
        res, (x, p, g, f, _) = _block_run(student, tp, rng, world, sp, act)
        out, xg, pg = full_grads(block_full, x, p, g, act)
        what = "SP block" if sp else "TP block"
        got = torch.cat([r["out"] for r in res]) if sp else res[0]["out"]
        assert_close(got, out, atol=1e-10, rtol=1e-10, what=f"{what} output, shards concatenated")
        got = torch.cat([r["x_grad"] for r in res]) if sp else res[0]["x_grad"]
        assert_close(got, xg, atol=1e-10, rtol=1e-10, what=f"{what} x gradient")
        for r in range(world):
            for k in ("ln_w", "ln_b", "b2"):
                assert_close(res[r]["grads"][k], pg[k], atol=1e-10, rtol=1e-10, what=f"{what}: {k}'s gradient, rank {r}",
                             hint="under SP each rank's norm and the row layer's bias see only its shard of the "
                                  "sequence: finalize_grads must all-reduce the gradients of ln_w, ln_b and b2"
                                  if sp else None)
            stride = 2 if act == "swiglu" else 1
            rows = column_rows(p["w1"].shape[0], world, r, stride)
            assert_close(res[r]["grads"]["w1"], pg["w1"][rows], atol=1e-10, rtol=1e-10, what=f"{what}: w1's gradient, rank {r}")


# ---------------------------------------------------------------- the signature


@pytest.mark.check("communication")
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("sp", [False, True])
def test_communication(student, tp, rng, world, sp):
    res, (*_, (s, b, h)) = _block_run(student, tp, rng, world, sp)
    want = expected_pattern(s, b, h, world, sp)
    for r in range(world):
        for phase in ("forward", "backward"):
            got = ops(res[r][phase])
            assert got == want[phase], (
                f"{'SP' if sp else 'TP'} block, rank {r} of {world}, {phase}: your collectives were {got} "
                f"(operation, elements this rank sent); the block must run exactly {want[phase]}. "
                + ("Under SP the forward is one all-gather (gather_from_sp, before the column layer) and one reduce-scatter "
                   "(after the row layer): an all-reduce then a slice sends twice what a reduce-scatter sends, and "
                   "gathering the sequence before the norm runs it on the whole sequence. Backward: the row layer's "
                   "all-gather, then the column layer gathers its saved input shard again and reduce-scatters "
                   "the input's gradient." if sp else
                   "Without SP each MLP runs one all-reduce forward (g, after the row layer) and one backward "
                   "(f, before the column layer)."))
        if sp:
            got = ops(res[r]["finalize"])
            assert got and all(op == "all_reduce" for op, _ in got) and sum(e for _, e in got) == 3 * (
                    2 * (world - 1) * h // world), (
                f"finalize_grads under SP, rank {r}: {got}; expected all-reduces of ln_w's, ln_b's and b2's "
                f"gradients (3 h = {3 * h} elements in all, one all-reduce each or fewer, coalesced), "
                f"so {3 * 2 * (world - 1) * h // world} elements sent per rank")
    total = sum(e for _, e in want["forward"])
    tp_total = sum(e for _, e in expected_pattern(s, b, h, world, False)["forward"])
    assert total == tp_total  # the oracle's own claim: RS + AG moves what AR moves


@pytest.mark.check("activation_memory")
@pytest.mark.parametrize("act", ["gelu", "swiglu"])
def test_activation_memory(student, tp, rng, act):
    world, s, b, h = 4, 8, 2, 16
    res, _ = _block_run(student, tp, rng, world, True, act, saved=True, s=s, b=b, h=h)
    for r in range(world):
        big = [shape for shape, is_param in res[r]["saved"] if not is_param and _numel(shape) >= s * b * h]
        assert not big, (
            f"SP block, rank {r} of {world}: autograd saved tensors of shapes {big[:4]} for backward, each as big as "
            f"a whole [s, b, h] = [{s}, {b}, {h}] activation. Under SP every activation a rank keeps is 1/t of the "
            "full one: the norm runs on the sequence shard, and the column layer saves its input shard and "
            "gathers it again in backward instead of keeping the gathered input")


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


# ---------------------------------------------------------------- real processes


@pytest.mark.check("distributed")
def test_distributed(student, tp, rng):
    world, s, b, h, f = 2, 4, 2, 8, 16
    p = mlp_params(h, f, "gelu", rng)
    x = torch.randn(s, b, h, generator=rng, dtype=torch.float64)
    g = torch.randn(s, b, h, generator=rng, dtype=torch.float64)
    out, xg, _ = full_grads(mlp_full, x, p, g, "gelu")
    res = student.drive(DIST, tp.tp_mlp, [x] * world, [shard_params(p, world, r, "gelu") for r in range(world)],
                        [g] * world)
    for r in range(world):
        assert_close(res[r]["out"], out, atol=1e-10, rtol=1e-10, what=f"tp_mlp on 2 gloo processes, rank {r}")
        assert_close(res[r]["x_grad"], xg, atol=1e-10, rtol=1e-10, what=f"tp_mlp's x gradient on gloo, rank {r}")
        assert ops(res[r]["forward"]) == [("all_reduce", s * b * h)], (
            f"rank {r} on gloo sent {ops(res[r]['forward'])} forward; expected one all-reduce")


# ---------------------------------------------------------------- attention

ATTN_HINT = ("w_qkv stacks Q's heads, then K's, then V's; under GQA the three have unequal widths (n_heads d, "
             "n_kv_heads d, n_kv_heads d): rank r takes block r of each of the three, not the r-th contiguous block "
             "of the stack, and not three equal thirds")


def attention_params(h, n_heads, n_kv_heads, d, rng, past=0, b=2):
    rows = (n_heads + 2 * n_kv_heads) * d
    p = {"w_qkv": torch.randn(rows, h, generator=rng, dtype=torch.float64) / h ** 0.5,
         "b_qkv": 0.1 * torch.randn(rows, generator=rng, dtype=torch.float64),
         "w_o": torch.randn(h, n_heads * d, generator=rng, dtype=torch.float64) / (n_heads * d) ** 0.5,
         "b_o": torch.randn(h, generator=rng, dtype=torch.float64)}
    if past:
        p["k_cache"] = torch.randn(past, b, n_kv_heads, d, generator=rng, dtype=torch.float64)
        p["v_cache"] = torch.randn(past, b, n_kv_heads, d, generator=rng, dtype=torch.float64)
    return p


@pytest.mark.check("attention")
@pytest.mark.parametrize("world,n_heads,n_kv_heads", [(2, 4, 4), (2, 8, 2), (4, 8, 4), (3, 6, 3)])
def test_shard_attention(student, tp, rng, world, n_heads, n_kv_heads):
    h, d = 12, 3
    p = attention_params(h, n_heads, n_kv_heads, d, rng)
    got = student.drive(CALL, tp.shard_attention, world, [p, n_heads, n_kv_heads], 1)
    for r in range(world):
        want = shard_attention_params(p, n_heads, n_kv_heads, world, r)
        for k in ("w_qkv", "b_qkv", "w_o", "b_o"):
            assert_close(got[r]["value"][k], want[k], atol=0, rtol=0,
                         what=f"shard_attention(n_heads={n_heads}, n_kv_heads={n_kv_heads})[{k!r}], rank {r} of {world}",
                         hint=ATTN_HINT if k.endswith("qkv") else "w_o is row-parallel: rank r takes its query heads' "
                                                                   "columns; b_o stays whole")


ATTN_CASES = [  # world, n_heads, n_kv_heads, causal, past (cached positions: Nk = past + s), sequence_parallel
    (1, 4, 2, True, 0, False),
    (2, 4, 4, False, 0, False),   # MHA
    (2, 8, 2, True, 0, False),    # GQA, causal, Nq == Nk
    (2, 8, 4, True, 5, False),    # causal with a cache: Nk = s + 5, bottom-right
    (4, 8, 4, False, 3, False),
    (2, 8, 2, True, 0, True),     # SP
    (4, 4, 4, True, 2, True),
]


def _attention_run(student, tp, rng, world, n_heads, n_kv_heads, causal, past, sp, s=8, b=2, h=12, d=3):
    p = attention_params(h, n_heads, n_kv_heads, d, rng, past, b)
    x = torch.randn(s, b, h, generator=rng, dtype=torch.float64)
    g = torch.randn(s, b, h, generator=rng, dtype=torch.float64)
    xs = list(x.chunk(world)) if sp else [x] * world
    gs = list(g.chunk(world)) if sp else [g] * world
    res = student.drive(RUN, tp.tp_attention, xs,
                        [shard_attention_params(p, n_heads, n_kv_heads, world, r) for r in range(world)], gs,
                        {"n_heads": n_heads, "n_kv_heads": n_kv_heads, "causal": causal, "sequence_parallel": sp})
    return res, (x, p, g, d, (s, b, h))


@pytest.mark.check("attention")
@pytest.mark.parametrize("world,n_heads,n_kv_heads,causal,past,sp", ATTN_CASES)
def test_attention(student, tp, rng, world, n_heads, n_kv_heads, causal, past, sp):
    res, (x, p, g, d, _) = _attention_run(student, tp, rng, world, n_heads, n_kv_heads, causal, past, sp)
    out, xg, pg = attention_grads(x, p, g, n_heads, n_kv_heads, causal)
    what = (f"tp_attention(t={world}, n_heads={n_heads}, n_kv_heads={n_kv_heads}, causal={causal}, "
            f"{past} cached positions, sequence_parallel={sp})")
    mask_hint = (" With a cache the keys are the cached positions then the new ones, and the causal mask is aligned "
                 "bottom-right: query i is position past + i and sees keys 0 .. past + i" if causal and past else "")
    got = torch.cat([r["out"] for r in res]) if sp else res[0]["out"]
    assert_close(got, out, atol=1e-10, rtol=1e-10, what=f"{what} output" + (", shards concatenated" if sp else ""),
                 hint="each rank attends with its own query heads (query head j reads key/value head j // (n_heads / "
                      "n_kv_heads)), then w_o's partial products are summed over the ranks and b_o added once, after "
                      "the sum." + mask_hint)
    if not sp:
        for r in range(1, world):
            assert_close(res[r]["out"], out, atol=1e-10, rtol=1e-10, what=f"{what} output, rank {r}",
                         hint="every rank must hold the whole output: the row-parallel projection all-reduces")
    got = torch.cat([r["x_grad"] for r in res]) if sp else res[0]["x_grad"]
    assert_close(got, xg, atol=1e-10, rtol=1e-10, what=f"{what} x gradient",
                 hint="x feeds every rank's Q, K and V columns: its gradient is the sum of every rank's part (f's "
                      "backward all-reduces; under SP the column layer reduce-scatters it)")
    for r in range(world):
        rows, cols = qkv_rows(n_heads, n_kv_heads, d, world, r), o_cols(n_heads, d, world, r)
        assert_close(res[r]["grads"]["w_qkv"], pg["w_qkv"][rows], atol=1e-10, rtol=1e-10,
                     what=f"{what}: w_qkv's gradient, rank {r}", hint=ATTN_HINT)
        assert_close(res[r]["grads"]["b_qkv"], pg["b_qkv"][rows], atol=1e-10, rtol=1e-10,
                     what=f"{what}: b_qkv's gradient, rank {r}")
        assert_close(res[r]["grads"]["w_o"], pg["w_o"][:, cols], atol=1e-10, rtol=1e-10,
                     what=f"{what}: w_o's gradient, rank {r}")
        if past:
            kv = [r * (n_kv_heads // world) + j for j in range(n_kv_heads // world)]
            for name in ("k_cache", "v_cache"):
                assert_close(res[r]["grads"][name], pg[name][:, :, kv], atol=1e-10, rtol=1e-10,
                             what=f"{what}: {name}'s gradient, rank {r}")
    b_o = sum(r["grads"]["b_o"] for r in res) if sp else res[0]["grads"]["b_o"]
    assert_close(b_o, pg["b_o"], atol=1e-10, rtol=1e-10,
                 what=f"{what}: b_o's gradient" + (" summed over the ranks (each saw its sequence shard)" if sp else ""),
                 hint="b_o is added once, after the reduction")


@pytest.mark.check("attention")
@pytest.mark.parametrize("world,n_heads,n_kv_heads", [(2, 4, 1), (4, 8, 2), (2, 6, 4)])
def test_attention_rejects(student, tp, rng, world, n_heads, n_kv_heads):
    """n_kv_heads % t != 0 (MQA on 2 ranks, GQA with 2 KV heads on 4): ValueError, from shard_attention and from
    tp_attention; n_heads % n_kv_heads != 0 too."""
    h, d = 8, 2
    p = attention_params(h, n_heads, n_kv_heads, d, rng)
    with pytest.raises(ValueError):
        student.drive(CALL, tp.shard_attention, world, [p, n_heads, n_kv_heads], 1)
    shard = {"w_qkv": p["w_qkv"], "b_qkv": p["b_qkv"], "w_o": p["w_o"], "b_o": p["b_o"]}  # any shapes: it must refuse first
    x = torch.randn(4 * world, 1, h, generator=rng, dtype=torch.float64)
    with pytest.raises(ValueError):
        student.drive(RUN, tp.tp_attention, [x] * world, [shard] * world, None,
                      {"n_heads": n_heads, "n_kv_heads": n_kv_heads, "causal": False})


@pytest.mark.check("communication")
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("sp", [False, True])
def test_attention_communication(student, tp, rng, world, sp):
    res, (*_, (s, b, h)) = _attention_run(student, tp, rng, world, 8, 4, True, 0, sp)
    want = expected_pattern(s, b, h, world, sp)
    for r in range(world):
        for phase in ("forward", "backward"):
            got = ops(res[r][phase])
            assert got == want[phase], (
                f"tp_attention ({'SP' if sp else 'TP'}), rank {r} of {world}, {phase}: your collectives were {got} "
                f"(operation, elements this rank sent); attention must run exactly {want[phase]}, as the MLP does. "
                + ("Under SP: an all-gather before the QKV projection and a reduce-scatter after w_o forward; "
                   "backward the reduce-scatter's all-gather, the QKV layer's input gathered again, and a "
                   "reduce-scatter of x's gradient." if sp else
                   "Q, K and V are column-parallel by heads and attention is local to each rank's heads, so the "
                   "forward's one all-reduce is the row-parallel output projection's (g), and backward's one is f's, "
                   "before the QKV projection."))


@pytest.mark.check("no_head_loop")
def test_attention_no_head_loop(student, tp, rng):
    """At real model sizes (8 and 128 query heads, GQA with a quarter as many KV heads) on one rank: the lines of
    the student's file, the operators and the bytes read back must not grow with the heads."""
    comm = student.drive(SOLO, tp.tp_attention)
    s, b, h, d = 16, 2, 64, 16

    def make(n):
        p = attention_params(h, n, n // 4, d, rng, 0, b)
        return torch.randn(s, b, h, generator=rng, dtype=torch.float64), p, comm, n, n // 4, True

    def check(out, x, p, _comm, n, n_kv, causal):
        with torch.no_grad():
            want = attention_full(x, p, n, n_kv, causal)
        assert_close(out, want, atol=1e-10, rtol=1e-10, what=f"tp_attention's output with {n} heads on one rank")

    assert_no_loop_over(student, tp.tp_attention, make, check, over="query heads", sizes=(8, 128),
                        advice="Attend with every head of the rank at once: view Q as [b, heads, s, d], repeat (or "
                               "view) K and V per group of n_heads / n_kv_heads, and use one batched matmul.")



# ---------------------------------------------------------------- a whole layer: tp_block

LAYER_SHARDED = ("ln1_w", "ln1_b", "ln2_w", "ln2_b", "b_o", "b2")  # applied to the sequence shard under SP


def _layer_run(student, tp, rng, world, sp, act, s=8, b=2, h=16):
    n_heads, n_kv_heads, d = 8, 4, 2
    f = 2 * h
    p = {**mlp_params(h, f, act, rng), **attention_params(h, n_heads, n_kv_heads, d, rng)}
    for k in ("ln1", "ln2"):
        p[f"{k}_w"] = 1 + 0.1 * torch.randn(h, generator=rng, dtype=torch.float64)
        p[f"{k}_b"] = 0.1 * torch.randn(h, generator=rng, dtype=torch.float64)
    x = torch.randn(s, b, h, generator=rng, dtype=torch.float64)
    g = torch.randn(s, b, h, generator=rng, dtype=torch.float64)
    xs = list(x.chunk(world)) if sp else [x] * world
    gs = list(g.chunk(world)) if sp else [g] * world
    shards = [{**shard_params(p, world, r, act), **shard_attention_params(p, n_heads, n_kv_heads, world, r)}
              for r in range(world)]
    res = student.drive(RUN, tp.tp_block, xs, shards, gs,
                        {"n_heads": n_heads, "n_kv_heads": n_kv_heads, "causal": True, "sequence_parallel": sp,
                         "act": act}, finalize=True)
    return res, (x, p, g, (n_heads, n_kv_heads, d), (s, b, h))


@pytest.mark.check("sequence_parallel")
@pytest.mark.parametrize("world,act", [(2, "gelu"), (4, "swiglu")])
def test_layer_sp(student, tp, rng, world, act):
    for sp in (False, True):
        res, (x, p, g, (nh, nkv, d), _) = _layer_run(student, tp, rng, world, sp, act)
        xd = x.detach().clone().requires_grad_(True)
        q = {k: v.detach().clone().requires_grad_(True) for k, v in p.items()}
        out = layer_full(xd, q, nh, nkv, True, act)
        out.backward(g)
        what = f"tp_block ({'SP' if sp else 'TP'}, t={world}, {act})"
        got = torch.cat([r["out"] for r in res]) if sp else res[0]["out"]
        assert_close(got, out.detach(), atol=1e-10, rtol=1e-10, what=f"{what} output",
                     hint="a layer is x + tp_attention(ln1(x)), then that + tp_mlp(ln2(that)): each half's row-parallel "
                          "output (w_o's, w2's) summed over the ranks, its bias added once, the norms with eps 1e-5")
        got = torch.cat([r["x_grad"] for r in res]) if sp else res[0]["x_grad"]
        assert_close(got, xd.grad, atol=1e-10, rtol=1e-10, what=f"{what} x gradient")
        for r in range(world):
            for k in LAYER_SHARDED:
                assert_close(res[r]["grads"][k], q[k].grad, atol=1e-10, rtol=1e-10, what=f"{what}: {k}'s gradient, rank {r}",
                             hint="under SP both norms and both row-parallel biases (b_o, b2) see only this rank's "
                                  "rows: finalize_grads must all-reduce the gradients of ln1_w, ln1_b, ln2_w, ln2_b, "
                                  "b_o and b2" if sp else None)
            rows = qkv_rows(nh, nkv, d, world, r)
            assert_close(res[r]["grads"]["w_qkv"], q["w_qkv"].grad[rows], atol=1e-10, rtol=1e-10,
                         what=f"{what}: w_qkv's gradient, rank {r}")
            rows = column_rows(p["w1"].shape[0], world, r, 2 if act == "swiglu" else 1)
            assert_close(res[r]["grads"]["w1"], q["w1"].grad[rows], atol=1e-10, rtol=1e-10,
                         what=f"{what}: w1's gradient, rank {r}")


@pytest.mark.check("communication")
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("sp", [False, True])
def test_layer_communication(student, tp, rng, world, sp):
    res, (*_, (s, b, h)) = _layer_run(student, tp, rng, world, sp, "gelu")
    want = expected_layer_pattern(s, b, h, world, sp)
    for r in range(world):
        for phase in ("forward", "backward"):
            got = ops(res[r][phase])
            assert got == want[phase], (
                f"tp_block ({'SP' if sp else 'TP'}), rank {r} of {world}, {phase}: your collectives were {got}; a "
                f"layer must run exactly {want[phase]}: attention's and the MLP's, each as one block's "
                "(two all-reduces forward and two backward without SP)")
        if sp:
            got = ops(res[r]["finalize"])
            want_elements = len(LAYER_SHARDED) * (2 * (world - 1) * h // world)
            assert got and all(op == "all_reduce" for op, _ in got) and sum(e for _, e in got) == want_elements, (
                f"finalize_grads after a whole SP layer, rank {r}: {got}; expected all-reduces of the gradients of "
                f"ln1_w, ln1_b, ln2_w, ln2_b, b_o and b2 (6 h = {6 * h} elements), so {want_elements} elements sent "
                "per rank")
