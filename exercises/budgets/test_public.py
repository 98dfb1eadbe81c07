"""Public tests for budgets: hand-worked numbers, each failure says what to look at.

Run: make check EX=budgets   (or: .venv/bin/pytest exercises/budgets)
"""

import pytest

H100_FLOPS = 989e12      # dense bf16 FLOP/s of an H100 SXM
H100_BW = 3.35e12        # HBM3 bytes/s


@pytest.fixture(scope="module")
def sm(student):
    return student.load("budgets")


@pytest.mark.check("roofline_public")
def test_square_matmul_is_compute_bound(sm):
    flops, moved = sm.matmul_cost(4096, 4096, 4096, 2)
    assert flops == 2 * 4096 ** 3, f"matmul_cost(4096, 4096, 4096) FLOPs = {flops}: a multiply-add is 2 FLOPs, 2 m n k"
    assert moved == 3 * 4096 * 4096 * 2, (f"matmul_cost(4096, 4096, 4096, 2) bytes = {moved}: A, B read once and C "
                                          "written once, 2 bytes each: 3 * 4096^2 * 2")
    verdict = sm.roofline(flops, moved, H100_FLOPS, H100_BW)
    assert verdict["bound"] == "compute", (f"a 4096^3 bf16 matmul does {flops / moved:.0f} FLOPs per byte, above the "
                                           f"H100's ridge of {H100_FLOPS / H100_BW:.0f}: compute-bound, got {verdict}")


@pytest.mark.check("roofline_public")
def test_gemv_is_memory_bound(sm):
    flops, moved = sm.matmul_cost(1, 4096, 4096, 2)
    verdict = sm.roofline(flops, moved, H100_FLOPS, H100_BW)
    assert verdict["bound"] == "memory", (f"one token times a 4096 x 4096 weight does about 1 FLOP per byte, far below "
                                          f"the ridge: memory-bound, got {verdict}")
    assert abs(verdict["time"] - moved / H100_BW) <= 1e-12 * verdict["time"], (
        f"a memory-bound op takes bytes / peak_bw = {moved / H100_BW:.3g} s, got {verdict['time']}")


@pytest.mark.check("memory_public")
def test_llama2_7b_parameter_count(sm):
    cfg = {"vocab": 32000, "hidden": 4096, "ffn": 11008, "layers": 32, "heads": 32, "kv_heads": 32, "tied": False}
    got = sm.param_count(cfg)
    assert got == 6_738_415_616, (
        f"param_count(Llama-2-7B) = {got:,}, expected 6,738,415,616 (the checkpoint's count): per layer 4 hidden^2 of "
        "attention, 3 hidden * ffn of MLP, two RMSNorm weights; plus embedding, lm_head (untied) and the final norm")


@pytest.mark.check("mesh_public")
def test_eight_rank_mesh(sm):
    coords, groups = sm.rank_mesh(8, {"tp": 2, "pp": 2, "dp": 2})
    assert [list(g) for g in groups["tp"]] == [[0, 1], [2, 3], [4, 5], [6, 7]], (
        f"tp groups {groups['tp']}: in order tp-cp-ep-dp-pp tp varies fastest, so a TP group is consecutive ranks "
        "(inside one node)")
    assert [list(g) for g in groups["dp"]] == [[0, 2], [1, 3], [4, 6], [5, 7]], (
        f"dp groups {groups['dp']}: dp's stride is tp * cp * ep = 2; the groups in the order of (tp, pp) indices")
    assert [list(g) for g in groups["pp"]] == [[0, 4], [1, 5], [2, 6], [3, 7]], (
        f"pp groups {groups['pp']}: pp varies slowest, stride tp * dp = 4")
    assert coords[5] == {"tp": 1, "cp": 0, "ep": 0, "dp": 0, "pp": 1}, f"rank 5's coordinates: {coords[5]}"
