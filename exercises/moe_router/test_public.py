"""Public tests for the MoE router: small, hand-checkable cases whose failures say what to look at.

Run: make check EX=moe_router   (or: .venv/bin/pytest exercises/moe_router)
Every expected value below is worked out by hand in the comments, or by a plain loop over tokens.
"""

from __future__ import annotations

import math

import pytest
import torch

from grader import testing
from torch import nn

from grader.support.moe_router import Routing, as_routing
from grader.testing import assert_close, show


def holds(value, expected: list) -> bool:
    """Whether `value` is a tensor holding exactly `expected` (a nested list): its shape is checked before
    any value is read, and the messages below show what it holds with show() (a few elements, whatever
    its size)."""
    want = torch.tensor(expected)
    return isinstance(value, torch.Tensor) and value.shape == want.shape and bool((value == want).all())


@pytest.fixture(scope="module")
def sm(student):
    return student.load("moe_router")


# --------------------------------------------------------------------------------------------------
# router_probs and expert_capacity


@pytest.mark.check("probs_public")
def test_router_probs_is_an_fp32_softmax(sm):
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.0, 2.0, 3.0, 4.0]], dtype=torch.bfloat16)
    p = sm.router_probs(logits)
    assert p.dtype == torch.float32, f"router_probs must return fp32 whatever the logits' dtype, found {p.dtype}"
    assert_close(p[0], torch.full((4,), 0.25), atol=1e-8, rtol=1e-5, what="router_probs row 0",
                 hint="equal logits give equal probabilities 1/4")
    want = torch.softmax(torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64), 0)
    assert_close(p[1], want, atol=1e-6, rtol=1e-5, what="router_probs row 1",
                 hint=f"expected {show(want)}: a softmax over the experts (the last dim), in fp32")


@pytest.mark.check("probs_public")
@pytest.mark.parametrize("T,E,k,cf,mc,want", [
    (8, 4, 1, 1.0, 1, 2),      # 8 tokens over 4 experts: 2 each
    (10, 4, 1, 1.0, 1, 3),     # 2.5 rounds UP to 3
    (10, 4, 2, 1.0, 1, 5),     # top-2: 20 assignments to share, 5 each
    (10, 4, 2, 1.25, 1, 7),    # 6.25 -> 7
    (3, 64, 1, 1.0, 1, 1),     # fewer tokens than experts: at least min_capacity
    (3, 64, 1, 1.0, 4, 4),
])
def test_expert_capacity(sm, T, E, k, cf, mc, want):
    got = sm.expert_capacity(T, E, k, cf, mc)
    hint = ""
    if got != want and got == max(mc, math.floor(k * T * cf / E)):
        hint = ": round UP (a floor leaves the last assignments of a fair share without a slot)"
    elif got != want and k > 1 and got == max(mc, math.ceil(T * cf / E)):
        hint = f": there are k * T = {k * T} assignments to share among the experts, not T = {T}"
    assert got == want and isinstance(got, int), (
        f"expert_capacity(num_tokens={T}, num_experts={E}, k={k}, capacity_factor={cf}, min_capacity={mc}) "
        f"is {got!r}, expected {want} = max(min_capacity, ceil(k * T * cf / E)) as a Python int{hint}"
    )


# --------------------------------------------------------------------------------------------------
# route


@pytest.mark.check("route_public")
def test_top1_switch_routing(sm):
    # 4 tokens, 2 experts, k = 1, capacity ceil(1 * 4 * 1.0 / 2) = 2.
    logits = torch.tensor([[2.0, 0.0], [1.0, 0.0], [3.0, 0.0], [0.0, 1.0]])
    r = sm.route(logits, 1, 1.0)
    assert isinstance(r, tuple) and hasattr(r, "slot"), "route must return the Routing named tuple"
    assert holds(r.expert_index, [[0], [0], [0], [1]]), f"expert_index is {show(r.expert_index)}"
    # Expert 0 is wanted by tokens 0, 1, 2 but has 2 slots: earlier tokens first, token 2 is dropped.
    slot_hint = ""
    if holds(r.slot, [[1], [-1], [-1], [1]]):
        slot_hint = (". Your slots start at 1: an assignment's slot is the number of assignments to its expert "
                     "BEFORE it (an exclusive count), not counting itself")
    elif holds(r.slot, [[0], [-1], [-1], [0]]):
        slot_hint = (". Expert 0 kept one assignment fewer than its capacity: there is room while the number kept "
                     "BEFORE the assignment is below the capacity (rank < capacity), not the count with it")
    assert holds(r.slot, [[0], [1], [-1], [0]]), (
        f"slot is {show(r.slot)}, expected [[0], [1], [-1], [0]]: expert 0 has capacity 2, so tokens 0 and 1 "
        f"take its slots 0 and 1 and token 2 is dropped (slot -1); token 3 is expert 1's first{slot_hint}"
    )
    p = torch.softmax(logits, -1)
    want_w = torch.tensor([[p[0, 0]], [p[1, 0]], [0.0], [p[3, 1]]])
    assert_close(r.combine_weight, want_w, atol=1e-6, rtol=1e-5, what="combine_weight", hint=(
        f"expected {show(want_w.flatten())}: with k = 1 "
        "the weight is the raw router probability (no renormalisation), and 0 for the dropped token"
    ))
    assert holds(r.tokens_per_expert, [2, 1]), f"tokens_per_expert is {show(r.tokens_per_expert)}, expected [2, 1]"


@pytest.mark.check("route_public")
def test_top2_renormalised_weights(sm):
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.2, 0.7]]))
    r = sm.route(logits, 2, 10.0)  # plenty of room: nothing dropped
    assert holds(r.expert_index, [[0, 1], [2, 1]]), f"expert_index is {show(r.expert_index)}, best first"
    want = torch.tensor([[0.5 / 0.8, 0.3 / 0.8], [0.7 / 0.9, 0.2 / 0.9]])
    assert_close(r.combine_weight, want, atol=1e-5, rtol=1e-5, what="combine_weight", hint=(
        f"expected {show(want)}: for k > 1 the default is to "
        "divide the k chosen probabilities by their sum (Mixtral)"
    ))


@pytest.mark.check("route_public")
def test_ties_go_to_the_lower_expert(sm):
    r = sm.route(torch.zeros(3, 8), 2, 10.0)
    assert holds(r.expert_index, [[0, 1]] * 3), (
        f"all-zero logits: every probability is 1/8 and the choices must be experts 0 and 1 for every token; found "
        f"{show(r.expert_index)}. torch.topk does not promise an order among equal values; a stable sort does."
    )


@pytest.mark.check("route_public")
def test_first_choices_before_second_choices(sm):
    # Expert 0 is token 0's SECOND choice and tokens 1 and 2's FIRST. Capacity ceil(2*3*1.0/3) = 2.
    logits = torch.tensor([[2.0, 3.0, 0.0], [3.0, 0.0, 2.0], [3.0, 2.0, 0.0]])
    r = sm.route(logits, 2, 1.0)
    assert isinstance(r.slot, torch.Tensor) and r.slot.shape == (3, 2), f"slot should be [T, k] = [3, 2], found {show(r.slot)}"
    assert r.slot[1, 0] == 0 and r.slot[2, 0] == 1 and r.slot[0, 1] == -1, (
        f"slot is {show(r.slot)}. Expert 0 has 2 slots and three assignments want it. All first choices go "
        "before any second choice (GShard), so tokens 1 and 2 keep it and token 0's second choice is dropped."
    )


@pytest.mark.check("route_public")
def test_aux_loss_and_z_loss(sm):
    logits = torch.tensor([[4.0, 0.0], [0.0, 4.0], [4.0, 0.0], [0.0, 4.0]])
    r = sm.route(logits, 1, 1.0)
    # f = [1/2, 1/2], P = [1/2, 1/2]: E * sum f * P = 2 * (1/4 + 1/4) = 1.
    assert_close(float(r.aux_loss), 1.0, atol=1e-5, what="aux_loss", hint="balanced routing should give aux_loss 1.0")
    z = torch.logsumexp(logits.double(), -1).square().mean()
    assert_close(float(r.z_loss), float(z), atol=1e-4, what="z_loss", hint=f"expected mean(logsumexp^2) = {float(z)}")


# --------------------------------------------------------------------------------------------------
# dispatch and combine on a routing built by hand


def hand_routing() -> tuple[Routing, int]:
    # 3 tokens, 2 experts, k = 2, capacity 2. Expert 0: token 0 (slot 0), token 2 (slot 1).
    # Expert 1: token 1 (slot 0); token 2's second choice and token 0's second choice are dropped.
    return Routing(
        expert_index=torch.tensor([[0, 1], [1, 0], [0, 1]]),
        combine_weight=torch.tensor([[0.6, 0.0], [0.7, 0.0], [0.9, 0.0]]),
        slot=torch.tensor([[0, -1], [0, -1], [1, -1]]),
        tokens_per_expert=torch.tensor([2, 1]),
        aux_loss=torch.tensor(1.0),
        z_loss=torch.tensor(0.0),
    ), 2


@pytest.mark.check("dispatch_public")
def test_dispatch_by_hand(sm):
    routing, cap = hand_routing()
    x = torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    buf = sm.dispatch(x, routing, cap)
    want = torch.tensor([[[1.0, 1.0], [3.0, 3.0]], [[2.0, 2.0], [0.0, 0.0]]])
    assert isinstance(buf, torch.Tensor) and tuple(buf.shape) == (2, 2, 2), (
        f"dispatch returns [E, capacity, d] = (2, 2, 2), found {type(buf).__name__} {show(getattr(buf, 'shape', None))}")
    assert torch.equal(buf, want), (
        f"dispatch gave {show(buf)}, expected {show(want)}: buffer[e, s] is the row of the token whose kept "
        "assignment has expert e and slot s; unused slots are zero; dropped assignments go nowhere"
    )


@pytest.mark.check("dispatch_public")
def test_combine_by_hand(sm):
    routing, cap = hand_routing()
    expert_out = torch.tensor([[[10.0, 1.0], [30.0, 3.0]], [[20.0, 2.0], [99.0, 99.0]]])
    y = sm.combine(expert_out, routing)
    want = torch.tensor([[6.0, 0.6], [14.0, 1.4], [27.0, 2.7]])
    assert_close(y, want, atol=1e-8, rtol=1e-5, what="combine", hint=(
        f"expected {show(want)}: y[t] = sum over kept choices of "
        "combine_weight * expert_out[expert, slot]; slot [1, 1] is unused and must not leak in"
    ))


@pytest.mark.check("dispatch_public")
def test_round_trip_with_identity_experts(sm):
    logits = torch.randn(12, 4, generator=testing.generator(0))
    x = torch.randn(12, 3, generator=testing.generator(1))
    routing = as_routing(sm.route(logits, 2, 1.0))
    cap = sm.expert_capacity(12, 4, 2, 1.0)
    y = sm.combine(sm.dispatch(x, routing, cap), routing)
    assert bool(torch.isfinite(routing.combine_weight).all()), (
        f"route gave combine weights that are not finite: {show(routing.combine_weight)}"
    )
    want = routing.combine_weight.sum(-1, keepdim=True) * x
    assert_close(y, want, atol=1e-6, rtol=1e-5, what="combine(dispatch(x)) with identity experts",
                 hint="it must be each token's kept weight total times x")


# --------------------------------------------------------------------------------------------------
# moe_layer


@pytest.mark.check("layer_public")
def test_moe_layer_matches_a_loop(sm):
    torch.manual_seed(testing.public_seed(0))
    T, d, E, k = 10, 4, 4, 2
    x = torch.randn(T, d)
    gate = torch.randn(E, d)
    experts = [nn.Linear(d, d) for _ in range(E)]
    y, r = sm.moe_layer(x, gate, experts, k, 4.0)  # capacity 20: nothing dropped
    probs = torch.softmax(x @ gate.t(), -1)
    want = torch.zeros(T, d)
    with torch.no_grad():
        for t in range(T):
            top = sorted(range(E), key=lambda e: (-float(probs[t, e]), e))[:k]
            w = probs[t, top] / probs[t, top].sum()
            for j, e in enumerate(top):
                want[t] += w[j] * experts[e](x[t])
    y = y.detach()
    assert y.shape == (T, d), f"moe_layer output should be [T, d] = {(T, d)}, found {tuple(y.shape)}"
    assert_close(y, want, atol=1e-5, what="moe_layer output (rows are tokens)", hint=(
        "y[t] = sum over its 2 experts of renormalised weight * expert(x[t]); "
        "check dispatch and combine use the same slot for each assignment"
    ))


# --------------------------------------------------------------------------------------------------
# No Python loop over tokens (the hidden `vectorised` check does this for every function, with the clock)


@pytest.mark.check("vectorised_public")
def test_route_runs_the_same_lines_for_16_and_160_tokens(sm, student):
    from grader.structure import assert_no_hidden_loop

    work = {}
    for T in (16, 160):
        E = 4
        logits = torch.randn(T, E, generator=testing.generator(T))
        expert = logits.argmax(-1).tolist()
        # k = 1 and room for every token (capacity_factor = E): token t's slot is how many earlier tokens chose
        # its expert, the plain loop below.
        slots = [sum(1 for u in range(t) if expert[u] == expert[t]) for t in range(T)]

        def check(out, expert=expert, slots=slots, T=T):
            r = as_routing(out)
            index, slot = r.expert_index, r.slot
            assert isinstance(index, torch.Tensor) and index.shape == (T, 1) and index[:, 0].tolist() == expert, (
                f"route(T={T}, k=1): expert_index must be each token's argmax expert, found {show(index)}")
            assert isinstance(slot, torch.Tensor) and slot.shape == (T, 1) and slot[:, 0].tolist() == slots, (
                f"route(T={T}, k=1, capacity for every token): a token's slot counts the earlier tokens that chose "
                f"its expert; expected {show(torch.tensor(slots))}, found {show(slot)}")

        _, work[T] = student.work_executed(sm.route, logits, 1, float(E), check=check)
    advice = "Count every expert's earlier assignments at once (one-hot rows and a cumulative sum), not token by token."
    assert work[160].lines <= work[16].lines + 10, (
        f"route ran {work[16].lines} lines of your file for 16 tokens and {work[160].lines} for 160: a Python loop "
        f"over tokens. {advice}")
    assert_no_hidden_loop("route", ("16 tokens", "160 tokens"), work[16], work[160], advice, max_ops=None)


@pytest.mark.check("dispatch_public")
def test_combine_reads_nothing_from_a_dropped_slot(sm):
    # Token 0 keeps choice 0 (expert 1, slot 0) and drops choice 1; token 1 keeps nothing. The buffer rows no
    # kept assignment points at hold inf and NaN: a combine that multiplies them by a zero weight gives NaN
    # (0 * inf), one that masks them (torch.where) gives exactly weight * row.
    E, cap, d = 2, 2, 3
    expert_out = torch.full((E, cap, d), float("inf"))
    expert_out[0, 1] = float("nan")
    expert_out[1, 0] = torch.tensor([1.0, 2.0, 3.0])
    index = torch.tensor([[1, 0], [0, 1]])
    slot = torch.tensor([[0, -1], [-1, -1]])
    weight = torch.tensor([[0.75, 0.0], [0.0, 0.0]])
    routing = Routing(index, weight, slot, torch.tensor([0, 1]), torch.tensor(0.0), torch.tensor(0.0))
    y = sm.combine(expert_out, routing)
    want = torch.tensor([[0.75, 1.5, 2.25], [0.0, 0.0, 0.0]])
    assert isinstance(y, torch.Tensor) and y.shape == want.shape and torch.equal(y, want), (
        f"combine with unused buffer rows full of inf and NaN: expected {show(want)}, found {show(y)}. A dropped "
        "choice (slot -1) reads nothing: mask with torch.where, since 0 * inf is NaN")
