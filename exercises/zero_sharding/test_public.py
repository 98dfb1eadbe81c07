"""Public tests for zero_sharding: small, fast, and each failure says what to look at.

Run: make check EX=zero_sharding   (or: .venv/bin/pytest exercises/zero_sharding)
"""

import pytest
import torch

from grader.testing import assert_close

RUN = "grader.support.zero_sharding:run_optimizer"


@pytest.fixture(scope="module")
def zs(student):
    return student.load("zero_sharding")


@pytest.mark.check("partition_public")
def test_shard_range_is_tensor_split(zs):
    got = [tuple(zs.shard_range(10, 4, r)) for r in range(4)]
    assert got == [(0, 3), (3, 6), (6, 8), (8, 10)], (
        f"shard_range(10, 4, r) for r = 0..3 gave {got}; torch.tensor_split cuts 10 into 3, 3, 2, 2: the first "
        "10 % 4 = 2 ranks hold one extra element")
    got = [tuple(zs.shard_range(2, 3, r)) for r in range(3)]
    assert got == [(0, 1), (1, 2), (2, 2)], f"shard_range(2, 3, r) gave {got}: rank 2's piece is empty, (2, 2)"


@pytest.mark.check("step_public")
def test_stage1_step_equals_adamw(student, zs):
    g = torch.Generator().manual_seed(0)
    numel, lr = 11, 1e-2
    full = torch.randn(numel, generator=g)
    grads = [[torch.randn(numel, generator=g) for _ in range(2)] for _ in range(3)]
    out = student.drive(RUN, zs.ZeroAdamW, [numel], 2, full, grads, stage=1, lr=lr, eps=1e-2, weight_decay=0.1,
                        param_dtype=torch.float32)
    p = torch.nn.Parameter(full.clone())
    ref = torch.optim.AdamW([p], lr=lr, eps=1e-2, weight_decay=0.1, foreach=False)
    for per_rank in grads:
        p.grad = (per_rank[0] + per_rank[1]) / 2
        ref.step()
    for r in range(2):
        assert_close(out[r]["params"], p.detach(), atol=1e-6, rtol=1e-5, what=f"rank {r}'s params after 3 stage-1 steps [i]",
                     hint="the gradient is the MEAN over ranks (reduce-scatter, then divide by world_size); every "
                          "rank updates its piece and all-gathers the whole parameter vector")
    steps = out[0]["steps"]
    ops = [e["op"] for e in steps[0]["log"]]
    assert ops == ["reduce_scatter_flat", "all_gather_flat"], (
        f"a stage-1 step called {ops}; expected one reduce_scatter_flat of the gradient and one all_gather_flat "
        "of the new parameters")


@pytest.mark.check("memory_public")
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_memory_bytes_paper_formula(student, zs, stage):
    numel, world = 1000, 4
    full = torch.zeros(numel)
    grads = [[torch.zeros(numel if stage < 3 else 250, dtype=torch.bfloat16 if stage < 3 else torch.float32)
              for _ in range(world)]]
    out = student.drive(RUN, zs.ZeroAdamW, [numel], world, full, grads, stage=stage, lr=1e-3)
    paper = {0: "16 Psi = 16000", 1: "4 Psi + 12 Psi / N = 7000", 2: "2 Psi + 14 Psi / N = 5500",
             3: "16 Psi / N = 4000"}[stage]
    want = {0: 16000, 1: 7000, 2: 5500, 3: 4000}[stage]
    got = out[0]["memory_bytes"]
    assert sum(got.values()) == want, (
        f"stage {stage}, Psi = 1000 bf16 params on N = 4 ranks: memory_bytes() sums to {sum(got.values())} ({got}); "
        f"ZeRO's paper: {paper} bytes (2 for the bf16 param, 2 for its gradient, 4 + 4 + 4 for the fp32 master "
        "and Adam's two moments)")
    assert out[0]["held_bytes"] == want, (
        f"stage {stage}: the tensors held_tensors() returns hold {out[0]['held_bytes']} bytes, expected {want}")
