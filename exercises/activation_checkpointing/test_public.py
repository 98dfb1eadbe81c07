"""Public tests for activation_checkpointing: small, fast, and each failure says what to look at.

Run: make check EX=activation_checkpointing   (or: .venv/bin/pytest exercises/activation_checkpointing)

The 4-layer costs below, worked by hand (a = bytes a layer saves, its input included; x = its input; f = FLOPs):

    layer   a   x   f
      0    10   2   5
      1    10   2   5
      2    30   2   1
      3    10   2   5

Plan [(0, 2, True), (2, 3, True), (3, 4, False)]: the forward leaves 2 + 2 + 10 = 14 held. In backward, layer 3's
segment is freed first; then segment (2, 3) recomputes: held before it 2, plus its 30 = 32; then (0, 2): 0 + 20 = 20.
The peak is max(14, 32, 20) = 32, and it recomputes 5 + 5 + 1 = 11 FLOPs.
"""

import pytest
import torch

from grader.support.activation_checkpointing import run_plain
from grader.testing import assert_close

COSTS = [(10, 2, 5), (10, 2, 5), (30, 2, 1), (10, 2, 5)]


@pytest.fixture(scope="module")
def sm(student):
    return student.load("activation_checkpointing")


@pytest.mark.check("checkpoint_public")
def test_checkpoint_on_a_three_layer_mlp(sm, student):
    got = student.drive("grader.support.activation_checkpointing:run_case", sm.checkpoint, "mlp", 0)
    want = run_plain("mlp", 0)
    assert_close(got["outputs"][0], want["outputs"][0], atol=1e-6, rtol=1e-5, what="checkpoint(mlp, x)",
                 hint="the forward returns fn(*args), computed under no_grad")
    for k, (g, w) in enumerate(zip(got["param_grads"], want["param_grads"])):
        assert g is not None, (
            f"weight {k} inside the MLP got no .grad: in backward, call torch.autograd.backward on the recomputed "
            "outputs (torch.autograd.grad(outputs, inputs) gives the inputs' gradients only)")
        assert_close(g, w, atol=1e-6, rtol=1e-5, what=f".grad of weight {k}", hint="recompute fn with grad enabled")
    assert_close(got["input_grads"][0], want["input_grads"][0], atol=1e-6, rtol=1e-5, what="gradient of x",
                 hint="twice the right value means the recompute reached the original x: detach the saved inputs")
    assert got["calls_forward"] == 1 and got["calls_total"] == 2, (
        f"fn ran {got['calls_forward']} time(s) in forward and {got['calls_total']} in all; a checkpoint runs it once "
        "in forward (under no_grad) and once more in backward (with grad) to rebuild the graph")
    others = [s for s in got["forward_saves"] if not s[2]]
    assert not others, (
        f"checkpoint's forward saved {len(others)} tensor(s) that are not its inputs (shape, bytes: {others[:4]}): "
        "run fn under no_grad and save only the inputs")


@pytest.mark.check("planner_public")
def test_peak_bytes_by_hand(sm):
    cases = [
        ([(0, 4, False)], 60, "store everything: 10 + 10 + 30 + 10"),
        ([(0, 4, True)], 60, "one checkpointed segment: its recompute spike saves all 60 bytes at once"),
        ([(0, 2, True), (2, 3, True), (3, 4, False)], 32, "the recompute spike of (2, 3): 2 held before it + 30"),
        ([(0, 1, False), (1, 4, True)], 60, "the recompute spike of (1, 4): 10 held before it + 50"),
    ]
    for plan, want, why in cases:
        got = sm.peak_bytes(plan, COSTS)
        assert got == want, f"peak_bytes({plan}, COSTS) = {got}, expected {want} ({why})"
    assert sm.recompute_flops([(0, 2, True), (2, 3, True), (3, 4, False)], COSTS) == 11, (
        "recompute_flops sums f over the checkpointed segments' layers: 5 + 5 + 1 = 11")


@pytest.mark.check("planner_public")
def test_plan_checkpoints_at_three_budgets(sm):
    got = [tuple(s) for s in sm.plan_checkpoints(COSTS, 60)]
    assert got == [(0, 4, False)], f"at a budget of 60 everything fits: expected [(0, 4, False)], found {got}"
    got = [tuple(s) for s in sm.plan_checkpoints(COSTS, 40)]
    want = [(0, 2, True), (2, 3, True), (3, 4, False)]
    assert got == want, (
        f"at a budget of 40, expected {want} (peak 32, 11 FLOPs: layer 3 cannot be recomputed after 30 bytes are "
        f"held, and a segment (0, 3) would spike to 50), found {got}")
    with pytest.raises(ValueError, match="32"):
        sm.plan_checkpoints(COSTS, 31)  # no plan peaks under 32: the message names 32
