"""Public tests for tensor_parallel: 2 simulated ranks, small shapes, and each failure says what to look at.

Run: make check EX=tensor_parallel   (or: .venv/bin/pytest exercises/tensor_parallel)

Your functions run on the course's simulated ranks through `student.drive`, which calls
grader.support.tensor_parallel.run_tp: rank r calls your function with its own communicator, then
backpropagates a gradient, and the driver logs every collective each rank ran, per phase.
The oracles are single-device torch modules in float64.
"""

import pytest
import torch
import torch.nn.functional as F

from grader.testing import assert_close

RUN = "grader.support.tensor_parallel:run_tp"
CALL = "grader.support.tensor_parallel:run_call"


@pytest.fixture(scope="module")
def tp(student):
    from grader.support.ring_allreduce import forbidden_collectives
    return student.load("tensor_parallel", forbid=forbidden_collectives(),
                        forbid_why="use the communicator's collectives (comm.all_reduce, ...)")


def ops(entries):
    return [e["op"] for e in entries]


@pytest.mark.check("conjugates_public")
def test_f_and_g(student, tp):
    xs = [torch.full((4, 1, 2), 1.0, dtype=torch.float64), torch.full((4, 1, 2), 10.0, dtype=torch.float64)]
    gs = [torch.full((4, 1, 2), 2.0, dtype=torch.float64), torch.full((4, 1, 2), 20.0, dtype=torch.float64)]
    res = student.drive(RUN, tp.copy_to_tp, xs, grads=gs)
    for r in range(2):
        assert ops(res[r]["forward"]) == [], (
            f"your f ran {ops(res[r]['forward'])} in forward: the input of a column-parallel layer is already "
            "replicated; f's reduction belongs to the backward pass")
        assert_close(res[r]["out"], xs[r], atol=0, rtol=0, what=f"f forward, rank {r}", hint="f is the identity forward")
        assert_close(res[r]["x_grad"], gs[0] + gs[1], atol=0, rtol=0, what=f"f backward, rank {r}",
                     hint="f's backward all-reduces: each rank's gradient holds only its own columns' part")
    res = student.drive(RUN, tp.reduce_from_tp, xs, grads=gs)
    for r in range(2):
        assert_close(res[r]["out"], xs[0] + xs[1], atol=0, rtol=0, what=f"g forward, rank {r}",
                     hint="g all-reduces forward: the row-parallel layer's outputs are partial sums")
        assert_close(res[r]["x_grad"], gs[r], atol=0, rtol=0, what=f"g backward, rank {r}",
                     hint="g's backward is the identity: an all-reduce there makes gradients t times too big")


@pytest.mark.check("mlp_public")
def test_tp_mlp_equals_one_mlp(student, tp):
    torch.manual_seed(0)
    s, b, h, f = 4, 2, 8, 16
    full = {"w1": torch.randn(f, h, dtype=torch.float64), "b1": torch.randn(f, dtype=torch.float64),
            "w2": torch.randn(h, f, dtype=torch.float64), "b2": torch.randn(h, dtype=torch.float64)}
    x, g = torch.randn(s, b, h, dtype=torch.float64), torch.randn(s, b, h, dtype=torch.float64)
    shards = [r["value"] for r in student.drive(CALL, tp.shard_mlp, 2, [full], 1)]
    res = student.drive(RUN, tp.tp_mlp, [x, x], shards, [g, g])
    xr = x.clone().requires_grad_(True)
    want = F.linear(F.gelu(F.linear(xr, full["w1"], full["b1"])), full["w2"], full["b2"])
    want.backward(g)
    for r in range(2):
        assert_close(res[r]["out"], want.detach(), atol=1e-12, rtol=1e-12, what=f"tp_mlp output, rank {r}",
                     hint="column then row: add the row layer's bias once, after the all-reduce")
        assert ops(res[r]["forward"]) == ["all_reduce"] and ops(res[r]["backward"]) == ["all_reduce"], (
            f"rank {r}: forward ran {ops(res[r]['forward'])}, backward {ops(res[r]['backward'])}; a TP MLP runs "
            "exactly one all-reduce each way (g forward, f backward), nothing between the two layers")
        assert_close(res[r]["x_grad"], xr.grad, atol=1e-12, rtol=1e-12, what=f"tp_mlp x gradient, rank {r}")


@pytest.mark.check("sp_public")
def test_sp_block_shards(student, tp):
    torch.manual_seed(1)
    s, b, h, f = 4, 1, 8, 16
    full = {"w1": torch.randn(f, h, dtype=torch.float64), "b1": torch.randn(f, dtype=torch.float64),
            "w2": torch.randn(h, f, dtype=torch.float64), "b2": torch.randn(h, dtype=torch.float64),
            "ln_w": torch.randn(h, dtype=torch.float64), "ln_b": torch.randn(h, dtype=torch.float64)}
    x, g = torch.randn(s, b, h, dtype=torch.float64), torch.randn(s, b, h, dtype=torch.float64)
    shards = [r["value"] for r in student.drive(CALL, tp.shard_mlp, 2, [full], 1)]
    res = student.drive(RUN, tp.tp_mlp_block, list(x.chunk(2)), shards, list(g.chunk(2)),
                        {"sequence_parallel": True}, finalize=True)
    y = F.layer_norm(x, (h,), full["ln_w"], full["ln_b"], 1e-5)
    want = x + F.linear(F.gelu(F.linear(y, full["w1"], full["b1"])), full["w2"], full["b2"])
    assert_close(torch.cat([res[0]["out"], res[1]["out"]]), want, atol=1e-12, rtol=1e-12,
                 what="SP block, the ranks' output shards concatenated [s, b, h]",
                 hint="under SP rank r holds rows r*s/t .. (r+1)*s/t - 1: gather before the column layer (gather_from_sp), "
                      "reduce-scatter after the row layer")
    for r in range(2):
        assert ops(res[r]["forward"]) == ["all_gather", "reduce_scatter"], (
            f"rank {r}: the SP block's forward ran {ops(res[r]['forward'])}; expected an all-gather, then a "
            "reduce-scatter")


@pytest.mark.check("attention_public")
def test_tp_attention_gqa(student, tp):
    torch.manual_seed(2)
    s, b, h, nh, nkv, d = 4, 2, 8, 4, 2, 2
    full = {"w_qkv": torch.randn((nh + 2 * nkv) * d, h, dtype=torch.float64),
            "b_qkv": torch.randn((nh + 2 * nkv) * d, dtype=torch.float64),
            "w_o": torch.randn(h, nh * d, dtype=torch.float64), "b_o": torch.randn(h, dtype=torch.float64)}
    x, g = torch.randn(s, b, h, dtype=torch.float64), torch.randn(s, b, h, dtype=torch.float64)
    shards = [r["value"] for r in student.drive(CALL, tp.shard_attention, 2, [full, nh, nkv], 1)]
    # rank 0: Q heads 0, 1 (rows 0..3), K head 0 (rows 8, 9), V head 0 (rows 12, 13); rank 1 the others
    for r, rows in enumerate(([0, 1, 2, 3, 8, 9, 12, 13], [4, 5, 6, 7, 10, 11, 14, 15])):
        assert_close(shards[r]["w_qkv"], full["w_qkv"][rows], atol=0, rtol=0, what=f"shard_attention's w_qkv, rank {r}",
                     hint="w_qkv stacks Q (n_heads*d rows), K and V (n_kv_heads*d rows each): rank r takes block r of "
                          "each of the three, whose widths differ under GQA")
    res = student.drive(RUN, tp.tp_attention, [x, x], shards, [g, g], {"n_heads": nh, "n_kv_heads": nkv, "causal": True})
    xr = x.clone().requires_grad_(True)
    q, k, v = F.linear(xr, full["w_qkv"], full["b_qkv"]).split([nh * d, nkv * d, nkv * d], dim=-1)
    q = q.reshape(s, b, nh, d).permute(1, 2, 0, 3)
    k = k.reshape(s, b, nkv, d).permute(1, 2, 0, 3).repeat_interleave(nh // nkv, dim=1)
    v = v.reshape(s, b, nkv, d).permute(1, 2, 0, 3).repeat_interleave(nh // nkv, dim=1)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # Nq == Nk: top-left and bottom-right agree
    want = F.linear(o.permute(2, 0, 1, 3).reshape(s, b, nh * d), full["w_o"], full["b_o"])
    want.backward(g)
    for r in range(2):
        assert_close(res[r]["out"], want.detach(), atol=1e-12, rtol=1e-12, what=f"tp_attention output, rank {r}",
                     hint="query head j reads key/value head j // (n_heads / n_kv_heads); w_o is row-parallel: "
                          "all-reduce its partial products, then add b_o once")
        assert ops(res[r]["forward"]) == ["all_reduce"] and ops(res[r]["backward"]) == ["all_reduce"], (
            f"rank {r}: forward ran {ops(res[r]['forward'])}, backward {ops(res[r]['backward'])}; TP attention runs "
            "exactly one all-reduce each way, as the MLP: heads are independent until w_o")
        assert_close(res[r]["x_grad"], xr.grad, atol=1e-12, rtol=1e-12, what=f"tp_attention x gradient, rank {r}")
