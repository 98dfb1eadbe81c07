"""Hidden checks for zero_sharding: ZeRO stages 0-3 of a mixed-precision AdamW on simulated ranks
(grader/support/zero_sharding.py runs the student's optimizer on every rank and measures what each holds and sends).

The oracles (oracle.py) are AdamW's formulas in float64 on the whole vector, the shard bounds read off
torch.tensor_split, ZeRO's byte counts and the ring's element counts as closed forms, and the stage-3 model
run whole in float64 with autograd.

The signature: what each rank holds and sends. `memory` sums the bytes of the storages `held_tensors()` returns
and of every tensor reachable from the optimizer object, against ZeRO's per-stage formula; `traffic` counts the
elements each rank sends per step (the communicator's counters, out of the rank's reach) against 2 Psi (stages
0-2) and 3 Psi (stage 3) less the pieces the ring never sends; `stage3` counts the gathered layers alive at once
(weak references to every all_gather_flat result). A stage 2 that keeps the full gradient, a stage 1 that
all-reduces and slices, and a stage 3 that gathers every layer up front compute right numbers and lose these.
They cannot see memory held outside the optimizer object (a module-level cache, a closure), a copy of a
gathered layer made by the student (only all_gather_flat's own results are watched), or traffic that bypasses
the communicator (a variable shared by the simulated threads).

Contract clauses (README "The contract") and the tests that draw them:

| clause | tests |
| --- | --- |
| shard_range: tensor_split bounds, empty pieces, errors | test_shard_range, test_shard_range_rejects |
| AdamW exactly (decay, bias corrections, eps after sqrt), fp32 master | test_adamw_single_rank, test_master_copy_in_fp32 |
| the mean over ranks; stages 0-3 agree bit for bit across stages and ranks | test_stages_agree |
| memory_bytes, held_tensors and what the object holds, per stage | test_memory |
| elements sent per step, per stage; nothing outside the collectives | test_traffic |
| zero3_train_step: values, traffic, memory, at most 2 gathered layers alive | test_stage3 |
| max_grad_norm: the global norm | test_clip |
| the same code on real processes (gloo, torch.distributed's collectives) | test_distributed |
"""

import pytest
import torch

from grader.hidden.zero_sharding.oracle import (
    adamw_fp64, expected_memory, expected_traffic, mean_grad, own, pieces, stack_fp64,
)
from grader.testing import assert_close, assert_equal

RUN = "grader.support.zero_sharding:run_optimizer"
RUN3 = "grader.support.zero_sharding:run_zero3"
BF16_RTOL = 2.0 ** -7  # one bf16 ulp of a value in [1, 2)


@pytest.fixture(scope="module")
def zs(student):
    from grader.support.ring_allreduce import forbidden_collectives
    return student.load("zero_sharding", forbid=forbidden_collectives(),
                        forbid_why="use the communicator's collectives (comm.reduce_scatter_flat, ...)")


def exact_grads(rng, steps, world, numel, dtype):
    """Gradients k * 2**-14, |k| <= 64: exact in bf16, and their fp32 sums exact in any order."""
    return [[(torch.randint(-64, 65, (numel,), generator=rng).double() * 2.0 ** -14).to(dtype)
             for _ in range(world)] for _ in range(steps)]


def summed_shards(grads, sizes, world):
    """Stage 3's step input: each rank's piece of every layer of the gradient summed over ranks, in fp32."""
    return [[own(sum(g.float() for g in per_rank), sizes, world, r, 3) for r in range(world)] for per_rank in grads]


# ---------------------------------------------------------------- partition


@pytest.mark.check("partition")
@pytest.mark.parametrize("numel,world", [(0, 1), (0, 4), (3, 8), (13, 4), (97, 7), (64, 8), (1, 1), (101, 3)])
def test_shard_range(zs, numel, world):
    want = pieces(numel, world)
    got = [tuple(zs.shard_range(numel, world, r)) for r in range(world)]
    assert got == want, (
        f"shard_range({numel}, {world}, r) for r = 0..{world - 1}: {got}, expected {want} (torch.tensor_split's "
        "pieces: the first numel % world_size ranks hold one extra element, and pieces may be empty). Did you "
        "floor every piece to numel // world_size and lose the remainder?")


@pytest.mark.check("partition")
def test_shard_range_rejects(zs):
    assert tuple(zs.shard_range(5, 2, 1)) == (3, 5)
    for args in ((5, 2, 2), (5, 2, -1), (5, 0, 0)):
        with pytest.raises(ValueError):
            zs.shard_range(*args)


# ---------------------------------------------------------------- AdamW


@pytest.mark.check("adamw")
@pytest.mark.parametrize("wd,eps", [(0.0, 1e-8), (0.1, 1e-8), (0.05, 1e-3)])
def test_adamw_single_rank(student, zs, rng, wd, eps):
    numel, steps, lr = 300, 5, 1e-2
    full = torch.randn(numel, generator=rng)
    grads = [[torch.randn(numel, generator=rng)] for _ in range(steps)]
    out = student.drive(RUN, zs.ZeroAdamW, [numel], 1, full, grads, stage=0, lr=lr, weight_decay=wd, eps=eps,
                        param_dtype=torch.float32, betas=(0.9, 0.95))
    want = adamw_fp64(full, [g[0] for g in grads], lr, (0.9, 0.95), eps, wd)
    first = adamw_fp64(full, [grads[0][0]], lr, (0.9, 0.95), eps, wd)
    one = student.drive(RUN, zs.ZeroAdamW, [numel], 1, full, grads[:1], stage=0, lr=lr, weight_decay=wd,
                        eps=eps, param_dtype=torch.float32, betas=(0.9, 0.95))
    assert_close(one[0]["params"], first, atol=1e-6, rtol=1e-5, what=f"params after 1 step (wd={wd}, eps={eps}) [i]",
                 hint="at t = 1 AdamW moves each weight by about lr (m_hat / sqrt(v_hat) = g / |g|): divide m by "
                      "1 - beta1**t and v by 1 - beta2**t, add eps after the square root, and decay p by "
                      "lr * weight_decay * p (decoupled, not added to the gradient)")
    assert_close(out[0]["params"], want, atol=2e-6, rtol=1e-5, what=f"params after {steps} steps (wd={wd}, eps={eps}) [i]",
                 hint="torch.optim.AdamW's update: p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; "
                      "p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)")


@pytest.mark.check("adamw")
def test_master_copy_in_fp32(student, zs, rng):
    """bf16 params, lr 1e-3 for 20 steps: each update is under half a bf16 ulp near 1; only an fp32 master keeps them."""
    numel, steps, lr, world = 200, 20, 1e-3, 2
    full = 1 + torch.rand(numel, generator=rng)
    grads = [[torch.randn(numel, generator=rng).bfloat16() for _ in range(world)] for _ in range(steps)]
    out = student.drive(RUN, zs.ZeroAdamW, [numel], world, full, grads, stage=1, lr=lr)
    want = adamw_fp64(full, [mean_grad(g, torch.bfloat16) for g in grads], lr)
    for r in range(world):
        assert out[r]["params"].dtype == torch.bfloat16, f"params() returned {out[r]['params'].dtype}, expected bf16"
        assert_close(out[r]["params"], want, atol=1e-6, rtol=BF16_RTOL,
                     what=f"bf16 params after {steps} steps of lr {lr}, rank {r} [i]",
                     hint="near 1.0 a bf16 ulp is 2**-7 = 0.0078: an update of 0.001 written into bf16 params "
                          "rounds away. Keep an fp32 master copy, update it, and cast it to bf16 afterwards")


# ---------------------------------------------------------------- stages agree


@pytest.mark.check("stages_agree")
@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stages_agree(student, zs, rng, world, dtype):
    sizes, steps, lr = [37, 64, 10], 4, 1e-2
    numel = sum(sizes)
    full = torch.randn(numel, generator=rng)
    grads = exact_grads(rng, steps, world, numel, dtype)
    kw = dict(lr=lr, eps=1e-2, weight_decay=0.05, param_dtype=dtype)
    want = adamw_fp64(full, [mean_grad(g, dtype) for g in grads], lr, eps=1e-2, weight_decay=0.05)
    runs = {stage: student.drive(RUN, zs.ZeroAdamW, sizes, world, full, grads, stage=stage, **kw) for stage in (0, 1, 2)}
    runs[3] = student.drive(RUN, zs.ZeroAdamW, sizes, world, full, summed_shards(grads, sizes, world), stage=3, **kw)
    base = runs[0][0]["params"]
    assert_close(base, want, atol=1e-6, rtol=1e-5 if dtype == torch.float32 else BF16_RTOL,
                 what=f"stage 0 params on {world} ranks, eps 1e-2 [i]",
                 hint=(f"the data-parallel gradient is the MEAN over the {world} ranks: divide the reduced sum by "
                       "world_size (with eps = 1e-2 Adam is not scale-invariant, so a sum moves the weights "
                       f"{world} times as far)") if world > 1 else "compare your update with torch.optim.AdamW's")
    for stage in (0, 1, 2, 3):
        for r in range(world):
            got = runs[stage][r]["params"]
            expect = own(base, sizes, world, r, 3) if stage == 3 else base
            what = f"stage {stage}, rank {r} of {world}: params after {steps} steps"
            assert got.dtype == dtype, f"{what}: dtype {got.dtype}, expected {dtype}"
            assert_equal(got, expect, what=what + " against stage 0's (bit for bit) [i]",
                         hint="every stage computes the same elementwise update on the same mean gradient (the "
                              "fp32 ring sum divided by world_size, rounded to param_dtype); only who holds what "
                              "differs. Is every element of your piece updated, with the remainder's extra "
                              "element in the first numel % world_size pieces (torch.tensor_split)?")


# ---------------------------------------------------------------- memory

_STATE = {0: "stage 0 keeps the fp32 states for all Psi elements.", 1: "From stage 1 on, the fp32 master, exp_avg and "
          "exp_avg_sq hold only this rank's piece.", 2: "From stage 1 on, the fp32 master, exp_avg and exp_avg_sq hold "
          "only this rank's piece.", 3: "In stage 3, the fp32 states are this rank's piece of every layer."}
MEMORY_WHY = {
    "grads": {0: "Stages 0 and 1 keep a full-size gradient buffer (Psi elements in param_dtype).",
              1: "Stages 0 and 1 keep a full-size gradient buffer (Psi elements in param_dtype).",
              2: "Stage 2 keeps only its piece of the gradient: reduce-scatter into a piece-sized buffer.",
              3: "Stage 3 keeps only its piece of the gradient."},
    "params": {0: "Stages 0-2 keep every parameter in param_dtype.", 1: "Stages 0-2 keep every parameter in param_dtype.",
               2: "Stages 0-2 keep every parameter in param_dtype.",
               3: "Stage 3 keeps only its piece of each layer's parameters."},
    "master": _STATE, "exp_avg": _STATE, "exp_avg_sq": _STATE,
}


@pytest.mark.check("memory")
@pytest.mark.parametrize("world", [1, 3, 4])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_memory(student, zs, rng, world, stage, dtype):
    sizes = [29, 40, 7]
    full = torch.randn(sum(sizes), generator=rng)
    grads = exact_grads(rng, 2, world, sum(sizes), dtype)
    if stage == 3:
        grads = summed_shards(grads, sizes, world)
    out = student.drive(RUN, zs.ZeroAdamW, sizes, world, full, grads, stage=stage, lr=1e-2, param_dtype=dtype)
    for r in range(world):
        want = expected_memory(stage, sizes, world, r, 2 if dtype == torch.bfloat16 else 4)
        total = sum(want.values())
        where = f"stage {stage}, {dtype} params, rank {r} of {world}, Psi = {sum(sizes)}"
        wrong = [k for k in want if out[r]["memory_bytes"].get(k) != want[k]]
        assert out[r]["memory_bytes"] == want, (
            f"{where}: memory_bytes() = {out[r]['memory_bytes']}, expected {want}; " + " ".join(MEMORY_WHY[k][stage]
            for k in wrong if k in MEMORY_WHY) + " (ZeRO: params and grads in "
            "param_dtype, the master copy and Adam's two moments in fp32; stage 1 shards the three fp32 states, "
            "stage 2 the gradient too, stage 3 the parameters too, each to this rank's exact piece)")
        assert out[r]["held_bytes"] == total, (
            f"{where}: the storages of held_tensors() hold {out[r]['held_bytes']} bytes, expected {total} "
            "(each storage counts whole: a view of a slice of a full-size buffer still holds the whole buffer)")
        assert out[r]["reachable_bytes"] == total, (
            f"{where}: the tensors your optimizer object keeps between steps hold {out[r]['reachable_bytes']} "
            f"bytes, expected {total}. " + ("Stage 2 keeps only its piece of the gradient: reduce-scatter into a "
            "shard-sized buffer and keep no full-size gradient." if stage == 2 and out[r]["reachable_bytes"] > total
            else "Stage 3 keeps no full layer or full parameter vector between steps." if stage == 3 and
            out[r]["reachable_bytes"] > total else "Is a tensor kept that held_tensors() does not list?"))


# ---------------------------------------------------------------- traffic


@pytest.mark.check("traffic")
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("clip", [False, True])
def test_traffic(student, zs, rng, world, stage, clip):
    sizes = [50, 23]
    full = torch.randn(sum(sizes), generator=rng)
    grads = exact_grads(rng, 2, world, sum(sizes), torch.bfloat16)
    if stage == 3:
        grads = summed_shards(grads, sizes, world)
        # stage 3's step sends nothing: its traffic is zero3_train_step's (test_stage3)
    out = student.drive(RUN, zs.ZeroAdamW, sizes, world, full, grads, stage=stage, lr=1e-2,
                        max_grad_norm=1e-3 if clip else None)
    for r in range(world):
        want = expected_traffic(stage, sizes, world, r, clip) if stage < 3 else \
            expected_traffic(0, [1], world, r) if clip else 0
        assert out[r]["outside"] == 0, f"rank {r} sent {out[r]['outside']} elements outside the collectives"
        for k, step in enumerate(out[r]["steps"]):
            ops = [(e["op"], e["elements"]) for e in step["log"]]
            assert step["elements"] == want, (
                f"stage {stage}, rank {r} of {world}, step {k}{', clipping' if clip else ''}: sent {step['elements']} "
                f"elements ({ops}), expected {want}: " + ("clipping adds one all-reduce of ONE scalar, the sum of "
                "squares of each rank's piece (the global norm; stage 0 has the whole gradient and sends nothing "
                "for it). " if clip else "") + (
                "FEWER elements than the ring sends: every rank's new piece must reach the others through one "
                "all_gather_flat of the new parameters (the simulated ranks are threads of one process; a variable "
                "they share carries data the count never sees, and on real processes carries nothing). "
                if stage in (1, 2) and step["elements"] < want - 2 else "") + ("Psi for the reduce-scatter of the gradient and Psi for the all-gather of the "
                "new parameters, less the pieces a ring never sends. An all-reduce of the full gradient already "
                "costs 2 Psi; then all-gathering the parameters makes it 3 Psi. Reduce-scatter instead: each "
                "rank needs only its piece of the mean gradient." if stage in (1, 2) else
                "stage 0 all-reduces the gradient once (2 Psi) and sends nothing else." if stage == 0 else
                "stage 3's step gets its gradient already reduce-scattered: it sends nothing but the norm"))


# ---------------------------------------------------------------- stage 3

SPEC = [("tanh", 6, 8), ("tanh", 8, 8), ("tanh", 8, 5), ("linear", 5, 3)]


@pytest.mark.check("stage3")
@pytest.mark.parametrize("world", [1, 2, 3])
def test_stage3(student, zs, rng, world):
    sizes = [a * b for _, a, b in SPEC]
    steps, lr = 3, 1e-2
    full = torch.randn(sum(sizes), generator=rng) * 0.5
    xs = [[torch.randn(4, 6, generator=rng) for _ in range(world)] for _ in range(steps)]
    ys = [[torch.randn(4, 3, generator=rng) for _ in range(world)] for _ in range(steps)]
    out = student.drive(RUN3, zs.ZeroAdamW, SPEC, world, full, xs, ys, lr=lr, eps=1e-2,
                        param_dtype=torch.float32)
    means, losses = [], []
    for k in range(steps):
        w = adamw_fp64(full, means, lr, eps=1e-2) if means else full.double()
        per_rank = [stack_fp64(SPEC, w, xs[k][r], ys[k][r]) for r in range(world)]
        losses.append([lo for lo, _ in per_rank])
        means.append(mean_grad([g for _, g in per_rank], torch.float64))
    want = adamw_fp64(full, means, lr, eps=1e-2)
    for r in range(world):
        assert_close(torch.tensor(out[r]["losses"]), torch.tensor([lo[r] for lo in losses]), atol=1e-5, rtol=1e-5,
                     what=f"rank {r} of {world}: the loss of each step [step]",
                     hint="zero3_train_step returns this rank's loss, computed with the layers' gathered weights")
        assert_close(out[r]["params"], own(want, sizes, world, r, 3), atol=1e-5, rtol=1e-4,
                     what=f"rank {r} of {world}: its stage-3 piece of every layer after {steps} steps [i]",
                     hint="each layer's gradient is reduce-scattered (summed over ranks, cut like "
                          "torch.tensor_split of that layer) into this rank's piece; step divides by world_size (the "
                          "MEAN over ranks: with eps = 1e-2 a sum moves the weights further)")
        peak = out[r]["gathered_peak"]
        assert peak <= 2, (
            f"rank {r} of {world}: {peak} gathered layers were alive at once (of {len(SPEC)}): stage 3 gathers a "
            "layer's weights just before it runs and drops them after (at most the current layer and one "
            "prefetched). Keep only the layers' inputs between forward and backward, run the forward under "
            "torch.no_grad (autograd would save the weights), and gather each layer again in backward")
        want_mem = expected_memory(3, sizes, world, r, 4)
        assert out[r]["reachable_bytes"] == sum(want_mem.values()), (
            f"rank {r} of {world}: after zero3_train_step your optimizer holds {out[r]['reachable_bytes']} bytes, "
            f"expected {sum(want_mem.values())}: no gathered layer may stay in it between steps")
        assert out[r]["outside"] == 0, f"rank {r} sent {out[r]['outside']} elements outside the collectives"
        for k, step in enumerate(out[r]["steps"]):
            expect = expected_traffic(3, sizes, world, r)
            assert step["elements"] == expect, (
                f"rank {r} of {world}, step {k}: zero3_train_step sent {step['elements']} elements, expected "
                f"{expect} (3 Psi less the pieces a ring never sends: per layer an all-gather in forward, another "
                "in backward, and a reduce-scatter of its gradient); ops: "
                + str([(e['op'], e['elements']) for e in step["log"]][:12]))


# ---------------------------------------------------------------- clipping


@pytest.mark.check("clip")
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_clip(student, zs, rng, stage):
    world, sizes, steps, lr, max_norm = 3, [40, 21], 3, 1e-2, 0.05
    numel = sum(sizes)
    full = torch.randn(numel, generator=rng)
    grads = exact_grads(rng, steps, world, numel, torch.float32)
    # one piece of each rank's gradient much larger: the global norm differs from any shard's
    for per_rank in grads:
        for g in per_rank:
            g[:7] *= 64
    feed = summed_shards(grads, sizes, world) if stage == 3 else grads
    out = student.drive(RUN, zs.ZeroAdamW, sizes, world, full, feed, stage=stage, lr=lr, eps=1e-2,
                        param_dtype=torch.float32, max_grad_norm=max_norm)
    want = adamw_fp64(full, [mean_grad(g, torch.float32) for g in grads], lr, eps=1e-2, max_grad_norm=max_norm)
    for r in range(world):
        expect = own(want, sizes, world, r, 3) if stage == 3 else want
        assert_close(out[r]["params"], expect, atol=1e-6, rtol=1e-5,
                     what=f"stage {stage}, rank {r} of {world}, max_grad_norm {max_norm} [i]",
                     hint="clip by the GLOBAL norm of the mean gradient: each rank squares and sums its own piece, "
                          "one all-reduce of that scalar gives the total, then every rank scales its piece by "
                          "min(1, max_grad_norm / (norm + 1e-6)) before the update")


# ---------------------------------------------------------------- real processes

DIST = "grader.support.zero_sharding:run_distributed"


def _ops(steps):
    """Per step, the collectives called: (op, input shape). A simulated step is a dict with its "log"."""
    return [[(e["op"], tuple(e["shape"])) for e in (step["log"] if isinstance(step, dict) else step)]
            for step in steps]


@pytest.fixture(scope="module")
def zs_open(student):
    """The module without the torch.distributed guard: on real processes the communicator's collectives are
    torch.distributed's own (grader.support.zero_sharding.TorchCollectives), which the guard would refuse."""
    return student.load("zero_sharding")


@pytest.mark.check("distributed")
def test_distributed(student, zs, zs_open, rng):
    """Stages 1, 2 (clipping) and 3 (step, then zero3_train_step) on 2 gloo processes through torch.distributed's
    all_reduce, reduce_scatter and all_gather, against the same code on the simulated ranks: bit for bit (with
    2 ranks every sum is one addition, the same in any order), the same collectives called with the same shapes,
    the same bytes held; and against the fp64 oracle."""
    world, sizes, steps, lr = 2, [37, 64, 10], 3, 1e-2
    numel = sum(sizes)
    full = torch.randn(numel, generator=rng)
    grads = exact_grads(rng, steps, world, numel, torch.bfloat16)
    kw = dict(lr=lr, eps=1e-2, weight_decay=0.05)
    spec = [("tanh", 6, 8), ("tanh", 8, 5), ("linear", 5, 3)]
    full3 = torch.randn(sum(a * b for _, a, b in spec), generator=rng) * 0.5
    xs = [[torch.randn(4, 6, generator=rng) for _ in range(world)] for _ in range(2)]
    ys = [[torch.randn(4, 3, generator=rng) for _ in range(world)] for _ in range(2)]
    kw3 = dict(lr=lr, eps=1e-2, param_dtype=torch.float32)
    runs = [dict(sizes=sizes, full=full, grads=grads, stage=1, kwargs=kw),
            dict(sizes=sizes, full=full, grads=grads, stage=2, kwargs={**kw, "max_grad_norm": 0.005}),
            dict(sizes=sizes, full=full, grads=summed_shards(grads, sizes, world), stage=3, kwargs=kw),
            dict(spec=spec, full=full3, xs=xs, ys=ys, kwargs=kw3)]
    names = ["stage 1", "stage 2 with max_grad_norm 0.005", "stage 3's step", "zero3_train_step"]
    sim = [student.drive(RUN, zs.ZeroAdamW, r["sizes"], world, r["full"], r["grads"], stage=r["stage"], **r["kwargs"])
           if "sizes" in r else student.drive(RUN3, zs.ZeroAdamW, spec, world, full3, xs, ys, **kw3) for r in runs]
    real = student.drive(DIST, zs_open.ZeroAdamW, world, runs)
    means = [mean_grad(g, torch.bfloat16) for g in grads]
    oracle = [adamw_fp64(full, means, lr, eps=1e-2, weight_decay=0.05),
              adamw_fp64(full, means, lr, eps=1e-2, weight_decay=0.05, max_grad_norm=0.005),
              adamw_fp64(full, means, lr, eps=1e-2, weight_decay=0.05)]
    for i, name in enumerate(names):
        for r in range(world):
            got, want = real[r][i], sim[i][r]
            where = f"{name} on 2 gloo processes, rank {r}"
            assert _ops(got["steps"]) == _ops(want["steps"]), (
                f"{where}: the collectives called per step {_ops(got['steps'])[:1]} differ from the simulated "
                f"run's {_ops(want['steps'])[:1]} (first step shown): every rank must make the same calls, with "
                "the same shapes, whatever carries them")
            assert_equal(got["params"], want["params"], what=f"{where}: params against the simulated run's [i]",
                         hint="on real processes nothing is shared between ranks but what the collectives carry: "
                              "does a rank read another rank's data through a module-level or class variable, or "
                              "rely on anything but comm.rank, comm.world_size and the three collectives?")
            if "losses" in want and want["losses"]:
                assert got["losses"] == want["losses"], f"{where}: losses {got['losses']}, simulated {want['losses']}"
            assert got["memory_bytes"] == want["memory_bytes"] and got["reachable_bytes"] == want["reachable_bytes"], (
                f"{where}: holds {got['memory_bytes']} ({got['reachable_bytes']} bytes reachable), the simulated run "
                f"{want['memory_bytes']} ({want['reachable_bytes']})")
            if i < 3:
                expect = own(oracle[i], sizes, world, r, 3) if i == 2 else oracle[i]
                assert_close(got["params"].double(), expect, atol=1e-6, rtol=BF16_RTOL,
                             what=f"{where}: params against the fp64 AdamW loop [i]",
                             hint="the same update as on the simulated ranks: the mean gradient over ranks, AdamW "
                                  "on the fp32 master, the new params all-gathered")
