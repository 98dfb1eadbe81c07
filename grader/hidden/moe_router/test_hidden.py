"""Hidden checks for moe_router: per-token loop oracles, tie-heavy inputs, crafted priority cases,
auxiliary losses and their gradients, dispatch/combine, the whole layer's gradients, vectorisation, and
the technique's signature (each expert computes only its buffer; dispatch and combine move rows by index).

The oracles are naive code written for these checks: Python loops over tokens and experts on lists
(oracle.py), and autograd of the textbook formulas in fp64 (in the tests). Inputs come from the run's seed.

Contract clauses (exercises/moe_router/README.md, "The contract") and the tests that draw them
(check in brackets; "public" = exercises/moe_router/test_public.py):

| clause | tests |
| --- | --- |
| router_probs: [T, E] fp32 softmax over experts, in fp32 whatever the input dtype | test_probs_are_fp32_softmax (bf16), test_fields_have_the_contract_dtypes (fp32, bf16, fp16, fp64) [topk]; public test_router_probs_is_an_fp32_softmax |
| any finite logits (offset by 100, -100, 1000): probabilities, choices, weights, losses | test_large_logits [topk], test_losses_of_large_logits [aux] |
| expert_capacity: Python int, exactly max(min_capacity, ceil(k*T*cf/E)) in that order; min_capacity default 1 | test_capacity_is_the_formula, test_capacity_evaluation_order [capacity]; public test_expert_capacity |
| route: min_capacity passed on; never above capacity | test_route_uses_that_capacity [capacity]; assert_invariants in every route test |
| expert_index [T, k] int64, descending probability, ties to the lower index | test_choices_and_weights_without_drops (all-zero, duplicated, integer logits), test_fields_have_the_contract_dtypes [topk]; generated families (exact ties, constant logits) [drops, priority] |
| combine_weight [T, k] fp32: renormalised over the k chosen when renormalize, raw otherwise; 0 where dropped, no renormalisation after the drop | test_renormalize_defaults_and_overrides, test_fields_have_the_contract_dtypes, test_combine_weight_gradient [topk]; assert_routing_matches in test_route_against_the_loop, test_fully_dropped_tokens [drops]; test_probs_policy_crafted [priority] |
| renormalize=None: True for k > 1, False for k = 1; explicit True/False override | test_renormalize_defaults_and_overrides [topk] |
| slot [T, k] int64, -1 if dropped; slots follow priority from 0 with no gaps | assert_invariants and assert_routing_matches in test_route_against_the_loop, the generated tests [drops, priority]; test_fields_have_the_contract_dtypes [topk] |
| tokens_per_expert [E] int64, assignments kept (never above capacity) | test_route_uses_that_capacity [capacity]; assert_routing_matches [drops, priority]; test_fields_have_the_contract_dtypes (dtype) [topk] |
| aux_loss: scalar fp32, E * sum f_e P_e, f_e over the T*k choices before drops, differentiable through P_e only | test_aux_loss_balanced_is_one_and_collapse_is_E, test_aux_loss_value_and_gradient_with_drops, test_losses_are_fp32_scalars [aux] |
| z_loss: scalar fp32, mean logsumexp(logits)^2, differentiable | test_z_loss_value_and_gradient (and bf16), test_losses_are_fp32_scalars, test_losses_of_large_logits [aux] |
| priority "position": all first choices (tokens in order), then all second choices | test_gshard_first_choices_win [priority]; test_route_against_the_loop, test_generated_routing_position_policy [drops] |
| priority "probs": higher router probability (not the renormalised weight) first, ties to the earlier token | test_probs_policy_crafted, test_probs_policy_ties_go_to_earlier_tokens, test_probs_policy_against_the_loop, test_generated_routing_probs_policy [priority] |
| capacity 0 (min_capacity=0, cf=0): every slot -1, every weight 0; dispatch [E, 0, d]; combine zeros | gen_capacity_zero in the generated route tests [drops, priority]; random_valid_routing capacity 0 in test_generated_dispatch_and_combine_against_the_loops [dispatch_combine] |
| capacity edges: exactly full, one over, one short; capacity 1; k = E; tiny T and E | the generated families (gen_exact_capacity, gen_capacity_one, gen_k_is_E, gen_tiny) [drops, priority] |
| errors: ValueError for k not in [1, E] (0, -1, E + 1) and for an unknown drop policy | test_bad_arguments [topk] |
| dispatch: [E, capacity, d] in x's dtype, rows copied to (expert, slot), zeros elsewhere, E = len(tokens_per_expert), differentiable in x | test_dispatch_against_the_loop (gradient), test_generated_dispatch_and_combine_against_the_loops (fp32, fp64, unused experts), test_bf16_buffers_and_combine_accumulates_in_fp32 (bf16) [dispatch_combine] |
| combine: [T, d] in expert_out's dtype, accumulated in fp32; gradients to expert_out and combine_weight | test_combine_against_the_loop (gradients), test_generated_dispatch_and_combine_against_the_loops, test_bf16_buffers_and_combine_accumulates_in_fp32 [dispatch_combine] |
| combine: a dropped assignment contributes nothing, whatever the slot holds (inf, NaN) | test_combine_never_reads_dropped_or_empty_slots, test_generated_dispatch_and_combine_against_the_loops [dispatch_combine] |
| moe_layer: (y, routing), logits = x @ gate_weight.T, route's defaults, experts[e](buffers[e]), combine; gradients to x, gate_weight, every expert parameter | test_layer_output_and_gradients [layer]; public test_moe_layer_matches_a_loop |
| no Python loop over tokens (route, dispatch, combine, moe_layer) | test_route_is_vectorised, test_dispatch_and_combine_are_vectorised (lines, operators, read-backs, the grader's clock), test_layer_is_vectorised (lines, operators, read-backs) [vectorised] |
| the work: each expert computes at most capacity rows; dispatch and combine move rows by index, no one-hot [T, E, capacity] | test_each_expert_computes_only_its_buffer (rows at each expert's forward; FLOPs and elements of everything in the call, hooks of the student's included; an operator the counter cannot count fails, assert_all_counted), test_dispatch_and_combine_move_the_assignments_not_a_one_hot [sparse_experts] |
| near ties (probabilities an fp32 softmax's rounding can swap): either order, for the chosen experts and the probs policy's priority; exact ties keep the rules | `accepting` in assert_routing_matches, assert_choices_and_weights and check_route_decisions (the clock's T = 4096) [topk, drops, priority, vectorised, layer, capacity, aux]; tests/test_moe_router_ties.py |
| Routing is the stub's named tuple (six fields) | as_routing / assert_fields in every route test |
"""

from __future__ import annotations

import copy
import math
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from grader.cases.moe_router import ROUTE
from grader.harness.client import SandboxError, StudentCrash, StudentTimeout
from grader.hidden.moe_router.oracle import (
    capacity_formula,
    oracle_combine,
    oracle_dispatch,
    oracle_route,
    oracle_slots,
    ranked_experts,
)
from grader.structure import Scaling, assert_flat_on_the_clock, assert_no_hidden_loop, clock
from grader.support.moe_router import Routing, as_routing
from grader.testing import assert_close, assert_equal, show

DRIVER = "grader.support.moe_router:"
HUGE = 1000.0


@pytest.fixture(scope="module")
def sm(student):
    return student.load("moe_router")


# --------------------------------------------------------------------------------------------------
# Inputs: the oracle's decisions for the student's dispatch/combine, logits, token counts


def oracle_routing(o: dict) -> Routing:
    """The oracle's decisions as a Routing to feed the student's dispatch/combine."""
    return Routing(o["expert_index"], o["combine_weight"].float(), o["slot"], o["tokens_per_expert"],
                   torch.tensor(o["aux_loss"]), torch.tensor(o["z_loss"]))


def make_logits(kind: str, T: int, E: int, rng: torch.Generator) -> torch.Tensor:
    if kind == "random":
        return torch.randn(T, E, generator=rng) * 2
    if kind == "zeros":
        return torch.zeros(T, E)
    if kind == "duplicated":  # every value twice, in columns far apart
        half = torch.randn(T, (E + 1) // 2, generator=rng)
        cols = torch.cat([torch.arange(E // 2 + E % 2), torch.arange(E // 2)])
        return half[:, cols[torch.randperm(E, generator=rng)]]
    if kind == "integers":  # a few distinct values per row: ties everywhere
        return torch.randint(-2, 3, (T, E), generator=rng).float()
    raise ValueError(kind)


def ragged_tokens(E: int, rng: torch.Generator) -> int:
    """A token count that is not a multiple of E, a few times E."""
    T = int(torch.randint(2 * E, 4 * E + 7, (1,), generator=rng))
    return T + 1 if T % E == 0 else T


# --------------------------------------------------------------------------------------------------
# Comparisons that explain themselves


def first_mismatch(got: torch.Tensor, want: torch.Tensor) -> tuple[int, ...] | None:
    bad = (got != want).nonzero()
    return None if len(bad) == 0 else tuple(int(i) for i in bad[0])


def priority_key(o: dict, t: int, j: int) -> tuple:
    """Where assignment (token t, choice j) stands in the contract's priority order (smaller: earlier)."""
    if o["policy"] == "position":
        return (j, t)  # every first choice (tokens in order) before any second choice
    e = int(o["expert_index"][t, j])
    return (-float(o["p32"][t, e]), t)  # higher router probability first, earlier token on ties


def assignments_ahead(o: dict, t: int, j: int) -> list[tuple[int, int]]:
    """The assignments to the same expert as (t, j) that come before it, in priority order."""
    T, k = o["slot"].shape
    e = int(o["expert_index"][t, j])
    mine = priority_key(o, t, j)
    ahead = [(t2, j2) for t2 in range(T) for j2 in range(k)
             if int(o["expert_index"][t2, j2]) == e and priority_key(o, t2, j2) < mine]
    return sorted(ahead, key=lambda tj: priority_key(o, *tj))


def listed(pairs: list[tuple[int, int]], most: int = 6) -> str:
    text = ", ".join(f"token {t} choice {j}" for t, j in pairs[:most])
    return text + (f", ... ({len(pairs)} in all)" if len(pairs) > most else "")


PRIORITY_RULE = {
    "position": "all first choices (tokens in order) come before any second choice, then all second choices, ... "
                "(GShard)",
    "probs": "per expert, higher router probability first (the softmax probability of that expert for that token, "
             "not the renormalised weight); equal probabilities: the earlier token first",
}


def drop_cause(r, o: dict, t: int, j: int) -> str:
    """What usually makes a student's keep/drop decision for (t, j) differ from the oracle's."""
    e, cap, policy = int(o["expert_index"][t, j]), o["capacity"], o["policy"]
    got_kept = (r.slot >= 0) & (r.expert_index == e)
    n_got = int(got_kept.sum())
    n_want = int((o["kept"] & (o["expert_index"] == e)).sum())
    if n_got > cap:
        return (f"Your routing keeps {n_got} assignments at expert {e}, more than its capacity {cap} = "
                "max(min_capacity, ceil(k * T * capacity_factor / E)): keep an assignment only while fewer than "
                "capacity assignments of higher priority went to its expert.")
    if n_got < n_want:
        return (f"Your expert {e} keeps {n_got} assignments where {n_want} fit: an off-by-one at the capacity edge "
                "(an assignment's slot counts the assignments BEFORE it, and it is kept while that count is below "
                "the capacity), or a capacity smaller than max(min_capacity, ceil(k * T * capacity_factor / E)).")
    rule = f"Expert {e} keeps the right number of assignments but not the right ones: the priority is wrong. " \
           f"Priority: {PRIORITY_RULE[policy]}."
    if policy == "probs":
        mine = float(o["p32"][t, e])
        tied = [(t2, j2) for t2, j2 in (got_kept ^ (o["kept"] & (o["expert_index"] == e))).nonzero().tolist()
                if (t2, j2) != (t, j) and float(o["p32"][t2, e]) == mine]
        if tied:
            rule += (f" Token {t} and token {tied[0][0]} give expert {e} the same probability {mine:.6g}: the earlier "
                     "token wins (a stable sort keeps the token order among equal values; a flipped ascending sort "
                     "reverses it).")
    else:
        T, k = o["slot"].shape
        token_major = sorted(((t2, j2) for t2 in range(T) for j2 in range(k) if int(o["expert_index"][t2, j2]) == e))
        if got_kept.nonzero().tolist() == sorted(map(list, token_major[:cap])):
            rule += (" Yours keeps what token-by-token order would keep (token 0's choices, then token 1's, ...): a "
                     "token's second choice must not beat a later token's first choice.")
    return rule


def assert_drop_decisions(r, o: dict, where: str) -> None:
    """Every keep/drop decision against the oracle's; the first divergence in priority order, with its reason."""
    got_kept, want_kept = r.slot >= 0, o["kept"]
    if torch.equal(got_kept, want_kept):
        return
    T, k = want_kept.shape
    t, j = min(((t, j) for t in range(T) for j in range(k) if bool(got_kept[t, j]) != bool(want_kept[t, j])),
               key=lambda tj: priority_key(o, *tj))
    e, cap = int(o["expert_index"][t, j]), o["capacity"]
    ahead = assignments_ahead(o, t, j)
    if bool(want_kept[t, j]):
        oracle = (f"the oracle keeps it in slot {int(o['slot'][t, j])} ({len(ahead)} assignment"
                  f"{'' if len(ahead) == 1 else 's'} of higher priority want expert {e}, which has {cap} slots)")
        yours = "yours drops it (slot -1)"
    else:
        holders = [tj for tj in ahead if bool(want_kept[tj])]
        oracle = (f"the oracle drops it (expert {e} has no slot at all: capacity 0)" if cap == 0 else
                  f"the oracle drops it (expert {e} is full after {len(holders)} assignment"
                  f"{'' if len(holders) == 1 else 's'} of higher priority: {listed(holders)})")
        yours = f"yours keeps it (slot {int(r.slot[t, j])})"
    raise AssertionError(f"{where}: token {t}, choice {j} (expert {e}), capacity {cap}: {oracle}; {yours}. "
                         + drop_cause(r, o, t, j))


def described(value) -> str:
    """What a call returned, for a message, in bounded space: "[8, 2, 5] torch.float32" for a tensor."""
    if isinstance(value, torch.Tensor):
        return f"{show(value.shape)} {value.dtype}"
    return f"{type(value).__name__} {show(value)}"


def assert_fields(r, T: int, k: int, E: int, where: str) -> None:
    """The routing's fields as tensors of the contract's shapes, checked before anything reads their values:
    a reply may hold up to max_result_mb of any shape, and a message formats only what this bounds."""
    shapes = {"expert_index": (T, k), "combine_weight": (T, k), "slot": (T, k), "tokens_per_expert": (E,)}
    for name, shape in shapes.items():
        got = getattr(r, name)
        assert isinstance(got, torch.Tensor), f"{where}: routing.{name} should be a tensor, found {type(got).__name__}"
        assert tuple(got.shape) == shape, f"{where}: routing.{name} has shape {tuple(got.shape)}, expected {shape}"


def assert_same_experts(r, o: dict, where: str) -> None:
    """The routing's fields as tensors of the right shapes, and the chosen experts against the oracle's."""
    p32 = o["p32"]
    assert_fields(r, *o["slot"].shape, o["tokens_per_expert"].shape[0], where)  # type: ignore[call-arg]  # *(T, k)
    assert r.expert_index.dtype == torch.long and r.slot.dtype == torch.long, (
        f"{where}: expert_index and slot must be int64, found {r.expert_index.dtype} and {r.slot.dtype}"
    )
    at = first_mismatch(r.expert_index, o["expert_index"])
    if at is not None:
        t, j = at
        got_e, want_e = int(r.expert_index[t, j]), int(o["expert_index"][t, j])
        valid = 0 <= got_e < p32.shape[1]
        tie = valid and float(p32[t, got_e]) == float(p32[t, want_e])
        raise AssertionError(
            f"{where}: token {t}, choice {j}: expected expert {want_e} (p={float(p32[t, want_e]):.6g}), found "
            f"{got_e}" + (f" (p={float(p32[t, got_e]):.6g}). " if valid else " (not an expert id). ")
            + ("These probabilities are equal: ties go to the LOWER expert index, and torch.topk does not "
               "promise any order among equal values." if tie else
               "Experts must be listed in descending router probability.")
        )


def weight_hint(o: dict, found: torch.Tensor | None = None):
    """The rule behind a wrong combine_weight at `at`, told apart by the value found there (`found`: the student's
    combine_weight) when it is one a known mistake gives: 1 for a lone choice renormalised, or the weight
    renormalised over the token's kept choices only."""
    def hint(at: tuple[int, ...]) -> str:
        t, j = at
        if not bool(o["kept"][t, j]):
            return f"Token {t}'s choice {j} is dropped (in your routing too): its weight must be 0"
        got = float(found[t, j]) if found is not None else math.nan
        want = float(o["combine_weight"][t, j])
        if o["slot"].shape[1] == 1 and not o["args"]["renormalize"] and abs(got - 1.0) <= 1e-5 < abs(want - 1.0):
            return (f"With k = 1 the weight is the raw router probability ({want:.6g} here), not renormalised: "
                    "renormalising a lone choice makes every weight 1, and the router gets no gradient")
        kept = o["kept"][t]
        if bool((~kept).any()):
            over_kept = float(o["weight"][t, j]) / float(o["weight"][t][kept].sum())
            if abs(got - over_kept) <= 1e-5 < abs(want - over_kept):
                return (f"Token {t} lost a choice to capacity and you renormalised over its kept choices only "
                        f"({got:.6g}): kept assignments keep the weight they had before any drop ({want:.6g})")
        return ("Kept assignments keep the weight they had before any drop (renormalise over the k chosen "
                "when renormalize is on, never over the kept ones only)")
    return hint


def accepting(r, o: dict, where: str) -> dict:
    """The oracle's routing, with the student's decisions adopted wherever they differ from it only by near ties:
    probabilities a correct fp32 softmax may round either way (oracle.near_tie; a hand-written exp / sum rounds
    otherwise than torch.softmax). Per token, a choice of experts whose probability at every rank is the oracle's
    or a near tie of it; per expert (probs policy), kept assignments in slot order likewise. Exactly equal
    probabilities (equal logits) still follow the tie rules. Everything else follows from those decisions."""
    assert_fields(r, *o["slot"].shape, o["tokens_per_expert"].shape[0], where)  # type: ignore[call-arg]  # *(T, k)
    if torch.equal(r.expert_index, o["expert_index"]) and torch.equal(r.slot, o["slot"]):
        return o
    return oracle_route(o["logits"], **o["args"], accept=(r.expert_index.tolist(), r.slot.tolist()))


def assert_choices_and_weights(r, o: dict, where: str) -> dict:
    """topk's share of a routing: the chosen experts, and the weights of the assignments whose keep/drop
    decision agrees with the oracle's. Drops and slots are judged by the drops and priority checks. Returns the
    oracle's routing as judged (near ties resolved as the student did: `accepting`)."""
    o = accepting(r, o, where)
    assert_same_experts(r, o, where)
    agree = (r.slot >= 0) == o["kept"]
    assert_close(torch.where(agree, r.combine_weight.double(), 0.0), torch.where(agree, o["combine_weight"], 0.0),
                 atol=1e-5, what=f"{where}: combine_weight [token, choice]", hint=weight_hint(o, r.combine_weight))
    return o


def assert_routing_matches(r, o: dict, logits: torch.Tensor, where: str, policy: str = "position") -> dict:
    """The student's routing against the oracle's, one kind of decision at a time: the chosen experts, then
    which assignments are kept, then their slots, then the weights (on decisions that now agree), then
    the counts. Each failure names the first divergence and the rule behind it. Near ties may go either way
    (`accepting`); the oracle's routing as judged is returned."""
    o = accepting(r, o, where)
    assert_same_experts(r, o, where)
    assert_drop_decisions(r, o, where)
    at = first_mismatch(r.slot, o["slot"])
    if at is not None:
        t, j = at
        e = int(o["expert_index"][t, j])
        raise AssertionError(
            f"{where}: slot[{t}, {j}] (token {t}'s choice {j}, expert {e}) is {int(r.slot[t, j])}, expected "
            f"{int(o['slot'][t, j])} (the same assignments are kept; their order in the buffer differs). Priority: "
            f"{PRIORITY_RULE[o['policy']]}; the expert's buffer fills in that order from slot 0, with no gaps."
        )
    assert_close(r.combine_weight, o["combine_weight"], atol=1e-5, what=f"{where}: combine_weight [token, choice]",
                 hint=weight_hint(o, r.combine_weight))
    at = first_mismatch(r.tokens_per_expert.long(), o["tokens_per_expert"])
    assert at is None, (
        f"{where}: tokens_per_expert[{at[0]}] is {int(r.tokens_per_expert[at[0]])}, expected "
        f"{int(o['tokens_per_expert'][at[0]])}: count the assignments KEPT (never more than the capacity "
        f"{o['capacity']})"
    )
    return o


def assert_invariants(r, T: int, k: int, E: int, capacity: int, where: str) -> None:
    """Properties any valid routing has, whatever the priority rule (the fields' shapes first: the values
    are read into Python lists below)."""
    assert_fields(r, T, k, E, where)
    slot, idx = r.slot, r.expert_index
    kept = slot >= 0
    assert int(slot.max()) < capacity, f"{where}: a slot is {int(slot.max())}, but capacity is {capacity}"
    assert bool((slot >= -1).all()), f"{where}: slots must be -1 (dropped) or a position in the buffer"
    pairs = (idx[kept] * capacity + slot[kept]).tolist()
    assert len(pairs) == len(set(pairs)), f"{where}: two assignments share one (expert, slot): a buffer row was overwritten"
    for e in range(E):
        used = sorted(slot[kept & (idx == e)].tolist())
        assert used == list(range(len(used))), (
            f"{where}: expert {e} uses slots {used[:12]}; its buffer must fill from slot 0 with no gaps"
        )
        assert int(r.tokens_per_expert[e]) == len(used) <= capacity, (
            f"{where}: expert {e} keeps {len(used)} assignments, tokens_per_expert says "
            f"{int(r.tokens_per_expert[e])}, capacity is {capacity}"
        )
    assert bool((r.combine_weight[~kept] == 0).all()), f"{where}: a dropped assignment has a nonzero combine_weight"


# --------------------------------------------------------------------------------------------------
# capacity


@pytest.mark.check("capacity")
def test_capacity_is_the_formula(sm, rng):
    cases = [(8, 4, 1, 1.0, 1), (10, 4, 1, 1.0, 1), (10, 4, 2, 1.0, 1), (10, 4, 2, 1.25, 1), (7, 64, 1, 1.0, 1),
             (7, 64, 1, 1.0, 4), (1000, 8, 2, 0.5, 1), (33, 8, 4, 1.1, 1), (13, 3, 2, 0.7, 1), (100, 64, 2, HUGE, 1)]
    for _ in range(40):
        T = int(torch.randint(1, 5000, (1,), generator=rng))
        E = (4, 8, 16, 64, 7)[int(torch.randint(0, 5, (1,), generator=rng))]
        k = int(torch.randint(1, 5, (1,), generator=rng))
        cf = round(float(torch.rand(1, generator=rng)) * 3 + 0.05, 3)
        cases.append((T, E, k, cf, int(torch.randint(1, 9, (1,), generator=rng))))
    for T, E, k, cf, mc in cases:
        got = sm.expert_capacity(T, E, k, cf, mc)
        want = capacity_formula(T, E, k, cf, mc)
        assert isinstance(got, int) and not isinstance(got, bool), (
            f"expert_capacity must return a Python int, found {type(got).__name__}"
        )
        assert got == want, (
            f"expert_capacity(num_tokens={T}, num_experts={E}, k={k}, capacity_factor={cf}, min_capacity={mc}) "
            f"is {got}, expected {want} = max(min_capacity, ceil(k * T * cf / E)). "
            + ("Round UP: a floor leaves the last assignments without a slot. " if got == max(mc, math.floor(k * T * cf / E)) else "")
            + ("There are k * T assignments to share, not T. " if got == max(mc, math.ceil(T * cf / E)) else "")
        )


@pytest.mark.check("capacity")
def test_capacity_evaluation_order(sm):
    # Inputs where ceil of the same product in another order lands on a different integer.
    found = []
    for T in range(1, 400):
        for cf in (0.1, 0.3, 0.7, 1.1, 1.15, 1.3):
            for E, k in ((3, 1), (5, 2), (7, 2), (10, 1), (6, 4)):
                a = math.ceil(k * T * cf / E)
                b = math.ceil(cf * T * k / E)
                c = math.ceil(k * T / E * cf)
                if a != b or a != c:
                    found.append((T, E, k, cf))
    assert found, "test setup: no order-sensitive inputs found"
    for T, E, k, cf in found[:30]:
        got = sm.expert_capacity(T, E, k, cf)
        want = capacity_formula(T, E, k, cf)
        assert got == want, (
            f"expert_capacity({T}, {E}, {k}, {cf}) is {got}, expected {want}: evaluate exactly "
            "max(min_capacity, math.ceil(k * num_tokens * capacity_factor / num_experts)) in that order, in "
            "Python floats (no torch, no reordering): floating-point products differ in the last bit by order"
        )


@pytest.mark.check("capacity")
@pytest.mark.parametrize("cf", [0.5, 1.25])
def test_route_uses_that_capacity(sm, rng, cf):
    E, k = 8, 2
    T = ragged_tokens(E, rng)
    logits = torch.randn(T, E, generator=rng) + torch.linspace(2, 0, E)  # low experts overflow
    r = sm.route(logits, k, cf)
    cap = capacity_formula(T, E, k, cf)
    assert_invariants(r, T, k, E, cap, f"route(T={T}, E={E}, k={k}, capacity_factor={cf}), capacity {cap}")
    o = accepting(r, oracle_route(logits, k, cf), f"route(T={T}, E={E}, k={k}, capacity_factor={cf})")
    full = o["tokens_per_expert"] == cap
    one_short = bool(full.any()) and torch.equal(r.tokens_per_expert.long()[full], o["tokens_per_expert"][full] - 1)
    assert torch.equal(r.tokens_per_expert.long(), o["tokens_per_expert"]), (
        f"route(T={T}, E={E}, k={k}, capacity_factor={cf}): tokens_per_expert {show(r.tokens_per_expert)}, "
        f"expected {show(o['tokens_per_expert'])} with capacity {cap} = ceil(k * T * cf / E)"
        + (f". Every full expert keeps one assignment fewer than its capacity: an assignment has room when the "
           f"number kept BEFORE it is below {cap} (rank < capacity), not when the count with it is" if one_short else "")
    )
    r = sm.route(logits, k, 0.01, min_capacity=3)
    assert_invariants(r, T, k, E, 3, f"route(T={T}, E={E}, k={k}, capacity_factor=0.01, min_capacity=3)")
    assert int(r.tokens_per_expert.max()) == 3, (
        f"with min_capacity=3 and a tiny factor every busy expert keeps exactly 3 assignments; found "
        f"tokens_per_expert {show(r.tokens_per_expert)}"
    )


# --------------------------------------------------------------------------------------------------
# topk: choices, ties, weights, defaults


@pytest.mark.check("topk")
@pytest.mark.parametrize("kind", ["random", "zeros", "duplicated", "integers"])
@pytest.mark.parametrize("E", [4, 8, 64])
def test_choices_and_weights_without_drops(sm, rng, kind, E):
    T = ragged_tokens(E, rng) if E < 64 else 70
    logits = make_logits(kind, T, E, rng)
    for k in (1, 2, 4):
        o = oracle_route(logits, k, HUGE)
        r = sm.route(logits, k, HUGE)
        assert_choices_and_weights(r, o, f"{kind} logits, T={T}, E={E}, k={k}, no drops")


@pytest.mark.check("topk")
def test_probs_are_fp32_softmax(sm, rng):
    logits = (torch.randn(37, 8, generator=rng) * 3).bfloat16()
    p = sm.router_probs(logits)
    assert p.dtype == torch.float32, f"router_probs must return fp32 for bf16 logits, found {p.dtype}"
    want = torch.softmax(logits.double(), -1)
    assert_close(p, want, atol=1e-6, what="router_probs of bf16 logits (against their softmax in fp64)", hint=(
        "Cast to fp32 BEFORE the softmax (a bf16 softmax has only 8 bits of mantissa)"
    ))
    o = oracle_route(logits, 2, HUGE)
    r = sm.route(logits, 2, HUGE)
    assert r.combine_weight.dtype == torch.float32, f"combine_weight must be fp32, found {r.combine_weight.dtype}"
    assert_choices_and_weights(r, o, "bf16 logits, T=37, E=8, k=2")


@pytest.mark.check("topk")
def test_renormalize_defaults_and_overrides(sm, rng):
    logits = torch.randn(20, 8, generator=rng)
    for k, renorm in ((1, None), (1, True), (2, None), (2, False), (4, True)):
        r = sm.route(logits, k, HUGE, renormalize=renorm)
        o = accepting(r, oracle_route(logits, k, HUGE, renormalize=renorm), f"k={k}, renormalize={renorm}")
        default = " (the default for this k)" if renorm is None else ""
        sums = r.combine_weight.sum(-1)
        assert_close(r.combine_weight, o["combine_weight"], atol=1e-5, rtol=1e-5,
                     what=f"k={k}, renormalize={renorm}{default}: combine_weight", hint=(
            "renormalize=None means True for k > 1 (Mixtral) and "
            f"False for k = 1 (Switch); row sums found {show(sums[:4])}"
        ))


@pytest.mark.check("topk")
@pytest.mark.parametrize("k", [1, 2])
def test_combine_weight_gradient(student, sm, rng, k):
    T, E = 12, 6
    logits = torch.randn(T, E, generator=rng, dtype=torch.float64).float()
    g = torch.randn(T, k, generator=rng)
    r, grad = student.drive(DRIVER + "route_backward", sm.route, logits, [k, HUGE], {}, g, 0.0, 0.0)
    o = accepting(r, oracle_route(logits, k, HUGE), f"route(T={T}, E={E}, k={k}) (driven)")
    x = logits.double().requires_grad_(True)
    w = torch.softmax(x, -1).gather(1, o["expert_index"])
    if k > 1:
        w = w / w.sum(-1, keepdim=True)
    (w * g.double()).sum().backward()
    assert_close(grad, x.grad, atol=1e-5, what=f"k={k}: the gradient of sum(g * combine_weight) with respect to the logits",
                 hint=("With k = 1 the weight is the raw probability, so the router still learns: do not renormalise it. "
                       if k == 1 else "The renormalised weight p_i / sum(p_chosen) depends on every chosen logit. ")
                 + "Keep the weights on the autograd graph (no .detach(), no index math through .tolist()).")


@pytest.mark.check("topk")
@pytest.mark.parametrize("E", [4, 8])
def test_bad_arguments(sm, E):
    logits = torch.zeros(6, E)
    for bad in (0, -1, E + 1):
        assert_refused(lambda bad=bad: sm.route(logits, bad, 1.0), f"route(logits [6, {E}], k={bad}, capacity_factor=1.0)",
                       f"k must be in 1..E = 1..{E}: check its range before using it")
    for policy in ("random", "Position", "prob", ""):
        assert_refused(lambda policy=policy: sm.route(logits, 1, 1.0, drop_policy=policy), f"route(..., drop_policy={policy!r})",
                       "drop_policy must be 'position' or 'probs', spelt exactly so")


def assert_refused(call, where: str, rule: str) -> None:
    """`call()` raises ValueError; anything else (another exception, or none) fails naming the argument and rule."""
    try:
        call()
    except ValueError:
        return
    except (SandboxError, StudentCrash, StudentTimeout):  # the grading machine's, or a crash: never this verdict
        raise
    except Exception as exc:  # noqa: BLE001  (named in the message: the contract asks for a ValueError)
        said = str(exc).removeprefix(f"{type(exc).__name__}: ")  # some wrappers repeat the type in the text
        raise AssertionError(f"{where}: expected a ValueError ({rule}); your code raised {type(exc).__name__}: "
                             f"{said[:200]}") from None
    raise AssertionError(f"{where}: expected a ValueError ({rule}); your code returned without raising")


LOGIT_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


@pytest.mark.check("topk")
@pytest.mark.parametrize("dtype", LOGIT_DTYPES, ids=str)
def test_fields_have_the_contract_dtypes(sm, rng, dtype):
    T, E, k = 29, 8, 2
    logits = (torch.randn(T, E, generator=rng, dtype=torch.float64) * 2).to(dtype)
    p = sm.router_probs(logits)
    assert isinstance(p, torch.Tensor) and p.dtype == torch.float32 and tuple(p.shape) == (T, E), (
        f"router_probs of {dtype} logits [T={T}, E={E}] must be [T, E] fp32 whatever the logits' dtype, found "
        f"{described(p)}" + (" (fp64 logits too: cast to fp32, the router's precision, not up to fp64)"
                             if dtype == torch.float64 else ""))
    assert_close(p, torch.softmax(logits.double(), -1), atol=1e-6, what=f"router_probs of {dtype} logits",
                 hint="a softmax over the experts (the last dim), computed in fp32 from the logits as given")
    where = f"route({dtype} logits [T={T}, E={E}], k={k}, capacity_factor=1.0)"
    r = sm.route(logits, k, 1.0)
    assert_fields(r, T, k, E, where)
    want = {"expert_index": torch.int64, "slot": torch.int64, "tokens_per_expert": torch.int64,
            "combine_weight": torch.float32}
    found = {name: getattr(r, name).dtype for name in want}
    assert found == want, (
        f"{where}: the Routing's fields have dtypes {found}, expected {want} (whatever the logits' dtype)")
    o = oracle_route(logits, k, 1.0)
    assert_choices_and_weights(r, o, where)


@pytest.mark.check("topk")
@pytest.mark.parametrize("offset", [100.0, -100.0, 1000.0])
def test_large_logits(sm, rng, offset):
    """Any finite logits: a softmax is shift-invariant, so logits offset by a large constant route exactly as
    the same logits without it; exp(100) overflows fp32 and exp(-100) underflows to 0."""
    T, E = 31, 8
    for dtype in (torch.float32, torch.bfloat16):
        logits = (torch.randn(T, E, generator=rng) * 2 + offset).to(dtype)
        where = f"{dtype} logits around {offset:g} (randn * 2 + {offset:g}), T={T}, E={E}"
        p = sm.router_probs(logits)
        assert isinstance(p, torch.Tensor) and tuple(p.shape) == (T, E), (
            f"router_probs of {where} should be [T, E], found {described(p)}")
        assert_close(p, torch.softmax(logits.double(), -1), atol=1e-6, what=f"router_probs of {where}", hint=(
            "subtract each row's maximum before exp (torch.softmax does): exp of a logit of 100 overflows fp32 "
            "to inf, of -100 underflows to 0, and inf / inf or 0 / 0 is NaN"))
        for k in (1, 2):
            o = oracle_route(logits, k, 1.0)
            assert_choices_and_weights(sm.route(logits, k, 1.0), o, f"route({where}, k={k})")


# --------------------------------------------------------------------------------------------------
# drops: the position policy against the loop, on every shape family


@pytest.mark.check("drops")
@pytest.mark.parametrize("E", [4, 8, 64])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_route_against_the_loop(sm, rng, k, E):
    T = ragged_tokens(E, rng)
    skew = torch.linspace(1.5, 0, E)[torch.randperm(E, generator=rng)]  # some experts overflow
    for kind in ("random", "zeros", "duplicated"):
        logits = make_logits(kind, T, E, rng) + (skew if kind == "random" else 0)
        for cf in (0.5, 1.0, 1.25, HUGE):
            where = f"{kind} logits, T={T}, E={E}, k={k}, capacity_factor={cf}"
            r = sm.route(logits, k, cf)
            o = oracle_route(logits, k, cf)
            assert_invariants(r, T, k, E, o["capacity"], where)
            assert_routing_matches(r, o, logits, where)


@pytest.mark.check("drops")
def test_fully_dropped_tokens(sm):
    # Everyone wants expert 0 first and expert 1 second; capacity 1 keeps one of each.
    logits = torch.tensor([[3.0, 2.0, 0.0, 0.0]]).repeat(6, 1)
    r = sm.route(logits, 2, 0.1)  # capacity ceil(2 * 6 * 0.1 / 4) = 1
    o = oracle_route(logits, 2, 0.1)
    assert_routing_matches(r, o, logits, "6 identical tokens, k=2, capacity 1")
    assert bool((r.slot[1:] == -1).all()) and bool((r.combine_weight[1:] == 0).all()), (
        "tokens 1..5 lose both choices (token 0 takes the only slot of experts 0 and 1): their slots must be -1 "
        f"and their weights 0; found slots {show(r.slot)}"
    )


# --------------------------------------------------------------------------------------------------
# priority: GShard's rule and the probs policy


@pytest.mark.check("priority")
def test_gshard_first_choices_win(sm):
    # Expert 0 is token 0's SECOND choice and tokens 1 and 2's FIRST choice; capacity is 2.
    logits = torch.tensor([
        [2.0, 3.0, 0.0, -1.0],   # token 0: expert 1, then expert 0
        [3.0, -1.0, 2.0, 0.0],   # token 1: expert 0, then expert 2
        [3.0, -1.0, 0.0, 2.0],   # token 2: expert 0, then expert 3
        [-1.0, 0.0, 3.0, 2.0],   # token 3: expert 2, then expert 3
    ])
    r = sm.route(logits, 2, 1.0)  # capacity ceil(2 * 4 * 1.0 / 4) = 2
    o = oracle_route(logits, 2, 1.0)  # expert_index [[1, 0], [0, 2], [0, 3], [2, 3]]
    where = "GShard's case (T=4, E=4, k=2, capacity 2)"
    assert_same_experts(r, o, where)
    gshard = r.slot[1, 0] == 0 and r.slot[2, 0] == 1 and r.slot[0, 1] == -1
    if not gshard and not (int(r.slot[0, 1]) >= 0 and int(r.slot[2, 0]) == -1):  # not token-by-token: say why
        assert_routing_matches(r, o, logits, where)
    assert gshard, (
        "expert 0 can take 2 assignments: tokens 1 and 2 chose it FIRST, token 0 only second, so tokens 1 and 2 "
        f"get slots 0 and 1 and token 0's second choice is dropped. Found slot[0, 1]={int(r.slot[0, 1])}, "
        f"slot[1, 0]={int(r.slot[1, 0])}, slot[2, 0]={int(r.slot[2, 0])}. Order the assignments choice by choice "
        "(all first choices, then all second choices), not token by token."
    )
    assert float(r.combine_weight[0, 1]) == 0.0 and float(r.combine_weight[0, 0]) < 1.0, (
        f"token 0 keeps its first choice with its pre-drop renormalised weight and drops the second: "
        f"found combine_weight[0] = {show(r.combine_weight[0])}"
    )


@pytest.mark.check("priority")
def test_probs_policy_crafted(sm):
    # Expert 0 (capacity 2) is wanted by token 0 (p=0.40, first choice), token 1 (p=0.45, second choice)
    # and token 2 (p=0.60, first choice). By probability: tokens 2 and 1. By renormalised weight it
    # would be tokens 2 and 0; by position, tokens 0 and 2.
    p = torch.tensor([
        [0.40, 0.35, 0.15, 0.10],
        [0.45, 0.50, 0.03, 0.02],
        [0.60, 0.10, 0.05, 0.25],
        [0.05, 0.05, 0.50, 0.40],
    ])
    logits = p.log()
    r = sm.route(logits, 2, 1.0, drop_policy="probs")
    assert_fields(r, 4, 2, 4, "drop_policy='probs', T=4, E=4, k=2")
    got = {"token 0": int(r.slot[0, 0]), "token 1": int(r.slot[1, 1]), "token 2": int(r.slot[2, 0])}
    want = {"token 0": -1, "token 1": 1, "token 2": 0}
    assert got == want, (
        f"drop_policy='probs', expert 0 with capacity 2: slots {got}, expected {want}. Rank by the router "
        "probability of expert 0 for each token (0.60 > 0.45 > 0.40), not by the renormalised weight "
        "(which would favour token 0) nor by position; slot 0 goes to the highest."
    )
    assert float(r.combine_weight[0, 0]) == 0.0, (
        f"token 0's first choice is dropped: its weight must be 0, found combine_weight {show(r.combine_weight)}"
    )
    assert_close(float(r.combine_weight[1, 1]), 0.45 / 0.95, atol=1e-5, what="combine_weight[1, 1]",
                 hint=f"kept weights stay renormalised over the k chosen, before the drop: found {show(r.combine_weight)}")


@pytest.mark.check("priority")
def test_probs_policy_ties_go_to_earlier_tokens(sm):
    logits = torch.zeros(10, 4)
    for k, cap in ((1, 3), (2, 5)):
        r = sm.route(logits, k, 1.0, drop_policy="probs")
        o = oracle_route(logits, k, 1.0, "probs")
        assert_routing_matches(r, o, logits, f"all-zero logits, k={k}, drop_policy='probs' (capacity {cap})", "probs")


@pytest.mark.check("priority")
@pytest.mark.parametrize("k", [1, 2, 4])
def test_probs_policy_against_the_loop(sm, rng, k):
    for E in (4, 8, 64):
        T = ragged_tokens(E, rng)
        for kind in ("random", "integers"):
            logits = make_logits(kind, T, E, rng) + torch.linspace(1, 0, E)
            for cf in (0.5, 1.0):
                where = f"drop_policy='probs', {kind} logits, T={T}, E={E}, k={k}, capacity_factor={cf}"
                r = sm.route(logits, k, cf, drop_policy="probs")
                o = oracle_route(logits, k, cf, "probs")
                assert_invariants(r, T, k, E, o["capacity"], where)
                assert_routing_matches(r, o, logits, where, "probs")


# --------------------------------------------------------------------------------------------------
# generated: routing ties and capacity edges, against the per-token loop
#
# Each generator below draws one case from the run's rng; a test runs ROUNDS cases of every family.
# Cross-token ties in probability come only from identical rows (a pool of rows, constant rows): any
# elementwise fp32 softmax gives equal rows equal probabilities, so the oracle's tie is a real one.
# Within a row, equal logits give equal probabilities whatever the softmax.

CAPACITY_FACTORS = (0.0, 0.1, 0.25, 0.5, 0.75, 1.0, 1.25, 2.0, HUGE)
ROUNDS = 4


def pick(rng: torch.Generator, options):
    return options[int(torch.randint(0, len(options), (1,), generator=rng))]


def between(rng: torch.Generator, lo: int, hi: int) -> int:
    """An integer in [lo, hi], both ends included."""
    return int(torch.randint(lo, hi + 1, (1,), generator=rng))


@dataclass(frozen=True)
class RouteCase:
    family: str
    logits: torch.Tensor
    k: int
    capacity_factor: float
    min_capacity: int

    def where(self, i: int, n: int, policy: str) -> str:
        T, E = self.logits.shape
        cap = capacity_formula(T, E, self.k, self.capacity_factor, self.min_capacity)
        return (f"generated case {i + 1} of {n} ({self.family}): route(logits [T={T}, E={E}], k={self.k}, "
                f"capacity_factor={self.capacity_factor}, drop_policy={policy!r}, min_capacity={self.min_capacity}), "
                f"capacity {cap}")


@contextmanager
def during(where: str):
    """Name the generated case in the message of an exception the student's code raises on it."""
    try:
        yield
    except AssertionError:
        raise
    except Exception as exc:  # the student's exception (or its stand-in from the worker): same object, more words
        exc.args = (f"on {where}: {exc.args[0] if exc.args else ''}", *exc.args[1:])
        raise


def rows_from_pool(pool: torch.Tensor, T: int, rng: torch.Generator) -> torch.Tensor:
    return pool[torch.randint(0, len(pool), (T,), generator=rng)].clone()


def gen_random(rng, policy) -> RouteCase:
    E = pick(rng, (2, 3, 4, 5, 8, 16))
    T = between(rng, 1, 40)
    skew = torch.linspace(1.5, 0, E)[torch.randperm(E, generator=rng)]
    logits = torch.randn(T, E, generator=rng) * pick(rng, (0.5, 2.0, 6.0)) + skew
    return RouteCase("random logits, some experts favoured", logits, between(rng, 1, min(E, 4)),
                     pick(rng, CAPACITY_FACTORS), pick(rng, (0, 1, 2)))


def gen_expert_ties(rng, policy) -> RouteCase:
    E = pick(rng, (2, 3, 4, 6, 8))
    T = between(rng, 2, 30)
    if policy == "position":
        logits = torch.randint(-1, 2, (T, E), generator=rng).float()
    else:  # identical rows, so that equal probabilities across tokens are exactly equal
        logits = rows_from_pool(torch.randint(-1, 2, (between(rng, 1, 3), E), generator=rng).float(), T, rng)
    return RouteCase("exact ties between experts' logits", logits, between(rng, 1, E),
                     pick(rng, CAPACITY_FACTORS[1:]), pick(rng, (0, 1)))


def gen_all_equal(rng, policy) -> RouteCase:
    E = pick(rng, (1, 2, 4, 8))
    T = between(rng, 1, 30)
    logits = torch.full((T, E), pick(rng, (0.0, 3.5, -2.0)))
    return RouteCase("every expert tied (constant logits)", logits, between(rng, 1, E),
                     pick(rng, (0.25, 0.5, 1.0, 1.25)), 1)


def gen_one_expert(rng, policy) -> RouteCase:
    E = pick(rng, (2, 4, 8))
    T = between(rng, 2, 40)
    logits = torch.randn(T, E, generator=rng) * 0.5
    logits[:, between(rng, 0, E - 1)] += 6.0
    return RouteCase("every token's first choice on one expert", logits, between(rng, 1, min(E, 3)),
                     pick(rng, (0.25, 0.5, 1.0)), pick(rng, (0, 1)))


def gen_identical_tokens(rng, policy) -> RouteCase:
    E = pick(rng, (2, 3, 4, 8))
    T = between(rng, 2, 30)
    row = torch.randn(1, E, generator=rng) * 1.5 if between(rng, 0, 1) else torch.randint(-1, 2, (1, E), generator=rng).float()
    return RouteCase("every token identical (ties in priority)", row.expand(T, E).clone(), between(rng, 1, min(E, 3)),
                     pick(rng, (0.25, 0.5, 1.0)), pick(rng, (0, 1)))


def gen_token_pool(rng, policy) -> RouteCase:
    E = pick(rng, (3, 4, 8))
    T = between(rng, 4, 40)
    pool = torch.randn(between(rng, 2, 4), E, generator=rng) * 2
    return RouteCase("tokens drawn from a few distinct rows (ties in priority)", rows_from_pool(pool, T, rng),
                     between(rng, 1, min(E, 3)), pick(rng, (0.25, 0.5, 1.0)), pick(rng, (0, 1)))


def gen_exact_capacity(rng, policy) -> RouteCase:
    """First choices put exactly `capacity` tokens on one expert, capacity + 1 on another and capacity - 1
    on a third; with k = 2, some second choices go to the full expert (all dropped) and some to the one
    short by one (exactly one of them fits)."""
    E, k, T = between(rng, 4, 8), pick(rng, (1, 2)), between(rng, 16, 40)
    cf, mc = pick(rng, (0.25, 0.5)), pick(rng, (0, 1))
    cap = capacity_formula(T, E, k, cf, mc)
    experts = torch.randperm(E, generator=rng).tolist()
    full, over, short, rest = experts[0], experts[1], experts[2], experts[3:]
    first = [full] * cap + [over] * (cap + 1) + [short] * max(cap - 1, 0)
    first += [pick(rng, rest) for _ in range(T - len(first))]
    first = [first[i] for i in torch.randperm(T, generator=rng).tolist()]
    logits = torch.rand(T, E, generator=rng)
    logits[torch.arange(T), torch.tensor(first)] += 4.0
    if k == 2:
        for t in range(T):
            wanted = pick(rng, (full, short, short, pick(rng, experts)))
            second = wanted if wanted != first[t] else pick(rng, [e for e in experts if e != first[t]])
            logits[t, second] += 2.0
    return RouteCase("experts exactly at capacity, one over by one, one short by one", logits, k, cf, mc)


def gen_capacity_zero(rng, policy) -> RouteCase:
    E = pick(rng, (1, 2, 4, 8))
    T = between(rng, 1, 20)
    return RouteCase("capacity 0: every assignment dropped", torch.randn(T, E, generator=rng),
                     between(rng, 1, E), 0.0, 0)


def gen_capacity_one(rng, policy) -> RouteCase:
    E = pick(rng, (2, 4, 8))
    T = between(rng, 1, 30)
    logits = torch.randn(T, E, generator=rng) if between(rng, 0, 1) else rows_from_pool(torch.randn(2, E, generator=rng), T, rng)
    return RouteCase("capacity 1", logits, between(rng, 1, min(E, 4)), pick(rng, (0.0, 0.01)), 1)


def gen_k_is_E(rng, policy) -> RouteCase:
    E = between(rng, 1, 6)
    T = between(rng, 1, 30)
    logits = torch.randn(T, E, generator=rng) * 2 if between(rng, 0, 1) else \
        rows_from_pool(torch.randint(-1, 2, (2, E), generator=rng).float(), T, rng)
    return RouteCase("k = number of experts", logits, E, pick(rng, CAPACITY_FACTORS), pick(rng, (0, 1)))


def gen_tiny(rng, policy) -> RouteCase:
    E = pick(rng, (1, 2, 3))
    T = pick(rng, (1, 2, 3))
    return RouteCase("one to three tokens and experts", torch.randn(T, E, generator=rng), between(rng, 1, E),
                     pick(rng, CAPACITY_FACTORS), pick(rng, (0, 1)))


ROUTE_FAMILIES = [gen_random, gen_expert_ties, gen_all_equal, gen_one_expert, gen_identical_tokens, gen_token_pool,
                  gen_exact_capacity, gen_capacity_zero, gen_capacity_one, gen_k_is_E, gen_tiny]


def run_generated_routes(sm, rng, policy: str) -> None:
    cases = [family(rng, policy) for _ in range(ROUNDS) for family in ROUTE_FAMILIES]
    for i, case in enumerate(cases):
        where = case.where(i, len(cases), policy)
        with during(where):
            r = as_routing(sm.route(case.logits, case.k, case.capacity_factor, drop_policy=policy,
                                    min_capacity=case.min_capacity))
        o = oracle_route(case.logits, case.k, case.capacity_factor, policy, case.min_capacity)
        assert_routing_matches(r, o, case.logits, where, policy)


@pytest.mark.check("drops")
def test_generated_routing_position_policy(sm, rng):
    run_generated_routes(sm, rng, "position")


@pytest.mark.check("priority")
def test_generated_routing_probs_policy(sm, rng):
    run_generated_routes(sm, rng, "probs")


# --------------------------------------------------------------------------------------------------
# aux: Switch's balancing loss and the router z-loss


@pytest.mark.check("aux")
@pytest.mark.parametrize("E", [4, 8])
def test_aux_loss_balanced_is_one_and_collapse_is_E(sm, E):
    T = 4 * E
    balanced = torch.zeros(T, E)
    balanced[torch.arange(T), torch.arange(T) % E] = 4.0  # token t prefers expert t % E
    r = sm.route(balanced, 1, 1.0)
    assert_close(float(r.aux_loss), 1.0, atol=1e-5, what=f"aux_loss of perfectly balanced routing (E={E})", hint=(
        "Every expert gets 1/E of the tokens and 1/E of the probability mass: "
        "aux_loss = E * sum_e (1/E)(1/E) = 1"
    ))
    collapsed = torch.zeros(T, E)
    collapsed[:, 0] = 20.0
    r = sm.route(collapsed, 1, 1.0)
    assert_close(float(r.aux_loss), E, atol=1e-3, what=f"aux_loss with every token on expert 0 (E={E})", hint=(
        "f_0 = 1 counts the choices BEFORE capacity drops, P_0 is about 1"
    ))


@pytest.mark.check("aux")
@pytest.mark.parametrize("k", [1, 2])
def test_aux_loss_value_and_gradient_with_drops(student, sm, rng, k):
    E = 8
    T = ragged_tokens(E, rng)
    logits = torch.randn(T, E, generator=rng) + torch.linspace(2, 0, E)  # overflowing experts
    cf = 0.5
    r, grad = student.drive(DRIVER + "route_backward", sm.route, logits, [k, cf], {}, None, 1.0, 0.0)
    o = accepting(r, oracle_route(logits, k, cf), f"route(T={T}, E={E}, k={k}, capacity_factor={cf}) (driven)")
    assert_close(float(r.aux_loss), o["aux_loss"], atol=1e-5,
                 what=f"k={k}, capacity_factor={cf} (some assignments dropped): aux_loss", hint=(
        "aux_loss = E * sum_e f_e P_e with f_e the fraction of all T*k choices that picked e BEFORE "
        "drops (the router is penalised for what it wanted, not for what fitted) and P_e the mean probability"
    ))
    x = logits.double().requires_grad_(True)
    aux = E * (o["f"] * torch.softmax(x, -1).mean(0)).sum()
    aux.backward()
    assert_close(grad, x.grad, atol=1e-6, what=f"k={k}: d aux_loss / d logits", hint=(
        "f_e is a count (no gradient); the gradient flows through P_e, the mean router probability"
    ))


@pytest.mark.check("aux")
def test_z_loss_value_and_gradient(student, sm, rng):
    logits = torch.randn(23, 8, generator=rng) * 4
    r, grad = student.drive(DRIVER + "route_backward", sm.route, logits, [2, 1.0], {}, None, 0.0, 1.0)
    x = logits.double().requires_grad_(True)
    z = torch.logsumexp(x, -1).square().mean()
    z.backward()
    z = z.detach()
    assert_close(float(r.z_loss), float(z), atol=1e-4 * max(1.0, float(z)), what="z_loss",
                 hint="z_loss is the mean over tokens of logsumexp(logits)^2")
    assert_close(grad, x.grad, atol=1e-5, what="d z_loss / d logits", hint="compute it with differentiable torch ops")
    r = sm.route(logits.bfloat16(), 2, 1.0)
    zb = torch.logsumexp(logits.bfloat16().double(), -1).square().mean()
    assert_close(float(r.z_loss), float(zb), atol=0.0, rtol=1e-4, what="z_loss for bf16 logits", hint="compute it in fp32")


@pytest.mark.check("aux")
@pytest.mark.parametrize("dtype", LOGIT_DTYPES, ids=str)
def test_losses_are_fp32_scalars(sm, rng, dtype):
    T, E, k = 26, 8, 2
    logits = (torch.randn(T, E, generator=rng, dtype=torch.float64) * 2).to(dtype)
    r = sm.route(logits, k, 0.5)
    o = accepting(r, oracle_route(logits, k, 0.5), f"route({dtype} logits [T={T}, E={E}], k={k})")
    for name in ("aux_loss", "z_loss"):
        got = getattr(r, name)
        assert isinstance(got, torch.Tensor) and got.dim() == 0 and got.dtype == torch.float32, (
            f"route({dtype} logits, k={k}): {name} should be a scalar fp32 tensor (shape []), found "
            f"{described(got)}" + (" (fp64 logits too: the losses are fp32)" if dtype == torch.float64 else ""))
        assert_close(float(got), o[name], atol=1e-5, rtol=1e-5, what=f"route({dtype} logits, k={k}): {name}")


@pytest.mark.check("aux")
@pytest.mark.parametrize("offset", [100.0, -100.0, 1000.0])
def test_losses_of_large_logits(sm, rng, offset):
    T, E, k = 31, 8, 2
    logits = torch.randn(T, E, generator=rng) * 2 + offset
    r = sm.route(logits, k, 0.5)
    where = f"route(fp32 logits around {offset:g}, T={T}, E={E}, k={k})"
    o = accepting(r, oracle_route(logits, k, 0.5), where)
    assert_close(float(r.aux_loss), o["aux_loss"], atol=1e-5, what=f"{where}: aux_loss",
                 hint="P_e is the mean router probability: a softmax that stays finite for any logits")
    assert_close(float(r.z_loss), o["z_loss"], atol=0.0, rtol=1e-5, what=f"{where}: z_loss", hint=(
        "logsumexp(logits) = max + log(sum(exp(logits - max))): log(sum(exp(logits))) overflows at 100 "
        "and is -inf at -100 (torch.logsumexp is stable)"))


# --------------------------------------------------------------------------------------------------
# dispatch / combine


@pytest.mark.check("dispatch_combine")
@pytest.mark.parametrize("k,cf", [(1, 0.5), (2, 1.0), (2, HUGE), (4, 1.25)])
def test_dispatch_against_the_loop(student, sm, rng, k, cf):
    E, d = 8, 5
    T = ragged_tokens(E, rng)
    logits = torch.randn(T, E, generator=rng) + torch.linspace(1, 0, E)
    o = oracle_route(logits, k, cf)
    cap = o["capacity"]
    x = torch.randn(T, d, generator=rng)
    g = torch.randn(E, cap, d, generator=rng)
    buf, dx = student.drive(DRIVER + "dispatch_backward", sm.dispatch, x, oracle_routing(o), cap, g)
    want = oracle_dispatch(x, o, E, cap)
    assert isinstance(buf, torch.Tensor) and tuple(buf.shape) == (E, cap, d) and buf.dtype == x.dtype, (
        f"dispatch should return [E, capacity, d] = {[E, cap, d]} {x.dtype}, found {described(buf)}"
    )
    bad = (buf != want).any(-1).nonzero()
    if len(bad):
        e, s = (int(i) for i in bad[0])
        owner = [(t, j) for t in range(T) for j in range(k) if int(o["expert_index"][t, j]) == e and int(o["slot"][t, j]) == s]
        what = f"token {owner[0][0]}'s row" if owner else "zeros (no assignment has this slot)"
        raise AssertionError(f"k={k}, capacity {cap}: dispatch buffer[{e}, {s}] should hold {what}")
    want_dx = torch.zeros(T, d)
    for t in range(T):
        for j in range(k):
            if int(o["slot"][t, j]) >= 0:
                want_dx[t] += g[int(o["expert_index"][t, j]), int(o["slot"][t, j])]
    assert_close(dx, want_dx, atol=1e-6, rtol=1e-5, what="the gradient of dispatch with respect to x", hint=(
        "Each token should receive the sum of the buffer "
        "gradients at its kept slots (use differentiable indexing such as index_copy / index_add, not .tolist())"
    ))


@pytest.mark.check("dispatch_combine")
@pytest.mark.parametrize("k,cf", [(1, 0.5), (2, 0.5), (2, 1.25), (4, 1.0)])
def test_combine_against_the_loop(student, sm, rng, k, cf):
    E, d = 8, 6
    T = ragged_tokens(E, rng)
    logits = torch.randn(T, E, generator=rng) + torch.linspace(1.5, 0, E)
    o = oracle_route(logits, k, cf)
    cap = o["capacity"]
    expert_out = torch.randn(E, cap, d, generator=rng) * 3
    g = torch.randn(T, d, generator=rng)
    y, d_out, d_w = student.drive(DRIVER + "combine_backward", sm.combine, expert_out, oracle_routing(o), g)
    want = oracle_combine(expert_out, o)
    assert isinstance(y, torch.Tensor) and tuple(y.shape) == (T, d), (
        f"combine should return [T, d] = {[T, d]}, found {described(y)}")
    def dropped(at: tuple[int, ...]) -> str:
        t = at[0]
        return f"Token {t}: all of its assignments were dropped, so it must be zeros" if not bool(o["kept"][t].any()) else (
            f"Token {t}'s kept (expert, slot) choices are "
            f"{[(int(o['expert_index'][t, j]), int(o['slot'][t, j])) for j in range(k) if o['kept'][t, j]]}")

    assert_close(y, want, atol=1e-5, what=f"k={k}, capacity {cap}: combine [token, feature]", hint=dropped)
    want_dout = torch.zeros(E, cap, d, dtype=torch.float64)
    want_dw = torch.zeros(T, k, dtype=torch.float64)
    for t in range(T):
        for j in range(k):
            s, e = int(o["slot"][t, j]), int(o["expert_index"][t, j])
            if s >= 0:
                want_dout[e, s] += float(o["combine_weight"][t, j]) * g[t].double()
                want_dw[t, j] = float((expert_out[e, s].double() * g[t].double()).sum())
    assert_close(d_out, want_dout, atol=1e-5, rtol=1e-5, what="the gradient of combine with respect to expert_out", hint=(
        "Each kept slot receives its token's "
        "output gradient times the combine weight; slots no kept assignment uses receive 0"
    ))
    assert_close(d_w, want_dw, atol=1e-4, rtol=1e-5, what="the gradient of combine with respect to combine_weight", hint=(
        "For a kept choice it is "
        "<expert output, grad of y>; for a dropped one 0. This is the path by which the router learns."
    ))


@pytest.mark.check("dispatch_combine")
def test_combine_never_reads_dropped_or_empty_slots(sm, rng):
    E, d, k = 4, 3, 2
    logits = torch.randn(14, E, generator=rng) + torch.tensor([2.0, 1.0, 0.0, 0.0])
    o = oracle_route(logits, k, 0.5)
    cap = o["capacity"]
    expert_out = torch.full((E, cap, d), float("inf"))
    for t in range(14):
        for j in range(k):
            if int(o["slot"][t, j]) >= 0:
                expert_out[int(o["expert_index"][t, j]), int(o["slot"][t, j])] = 1.0
    y = sm.combine(expert_out, oracle_routing(o))
    assert torch.isfinite(y).all(), (
        "unused buffer slots hold inf here (an expert may produce anything on an empty slot), and combine's "
        "output is not finite: a dropped assignment (slot -1) must contribute nothing, and multiplying what it "
        "reads by its weight 0 is not enough (0 * inf is NaN). Mask with torch.where."
    )
    want = oracle_combine(torch.where(expert_out.isinf(), 0.0, expert_out), o)
    assert_close(y, want, atol=1e-5, rtol=1e-5, what="combine with ones in every used slot")


@pytest.mark.check("dispatch_combine")
@pytest.mark.parametrize("k", [1, 2])
def test_round_trip_with_identity_experts(sm, rng, k):
    E, d = 8, 4
    T = ragged_tokens(E, rng)
    logits = torch.randn(T, E, generator=rng)
    cf = 1.0
    x = torch.randn(T, d, generator=rng)
    o = oracle_route(logits, k, cf)  # the oracle's routing: route's own decisions are judged by drops and priority
    r = oracle_routing(o)
    y = sm.combine(sm.dispatch(x, r, o["capacity"]), r)
    want = o["combine_weight"].sum(-1, keepdim=True) * x.double()
    assert_close(y, want, atol=1e-5, what="combine(dispatch(x)) with identity experts [token, feature]",
                 hint="It should give (sum of token t's kept weights) * x[t]")


def random_valid_routing(rng: torch.Generator) -> tuple[dict, int, str]:
    """Any routing dispatch and combine must handle, not only route's: random distinct experts per token,
    a random subset of each expert's assignments kept (at most the capacity), kept ones in random slot
    order, random weights. Returns (the routing as an oracle dict, E, its family)."""
    E = between(rng, 1, 8)
    T, k, cap = between(rng, 1, 30), between(rng, 1, min(E, 4)), pick(rng, (0, 1, 1, 2, 3, 5))
    index = torch.stack([torch.randperm(E, generator=rng)[:k] for _ in range(T)])
    slot = torch.full((T, k), -1, dtype=torch.long)
    fill = pick(rng, ("full", "random"))
    for e in range(E):
        wanting = (index == e).nonzero().tolist()
        wanting = [wanting[i] for i in torch.randperm(len(wanting), generator=rng).tolist()]
        n = min(cap, len(wanting)) if fill == "full" else between(rng, 0, min(cap, len(wanting)))
        for s_, (t, j) in zip(torch.randperm(n, generator=rng).tolist(), wanting[:n]):
            slot[t, j] = s_
    kept = slot >= 0
    weight = torch.where(kept, torch.rand(T, k, generator=rng, dtype=torch.float64) + 0.05, 0.0)
    o = {"expert_index": index, "slot": slot, "kept": kept, "capacity": cap, "combine_weight": weight,
         "tokens_per_expert": torch.bincount(index[kept], minlength=E), "aux_loss": 0.0, "z_loss": 0.0}
    family = (f"a random valid routing, T={T}, E={E}, k={k}, capacity {cap}, "
              + ("every expert filled as far as it can be" if fill == "full" else "random kept subsets"))
    return o, E, family


def generated_routings(rng: torch.Generator, n: int) -> list[tuple[dict, int, str]]:
    """Half from route's oracle on the generated route cases (capacity 0 and 1, ties, k = E), half random."""
    out = []
    for i in range(n):
        if i % 2:
            out.append(random_valid_routing(rng))
        else:
            case = ROUTE_FAMILIES[(i // 2) % len(ROUTE_FAMILIES)](rng, "position")
            T, E = case.logits.shape
            o = oracle_route(case.logits, case.k, case.capacity_factor, "position", case.min_capacity)
            out.append((o, E, f"the oracle's routing of {case.where(0, 1, 'position').split(': ', 1)[1]}"))
    return out


@pytest.mark.check("dispatch_combine")
def test_generated_dispatch_and_combine_against_the_loops(sm, rng):
    cases = generated_routings(rng, 40)
    for i, (o, E, family) in enumerate(cases):
        T, k = o["slot"].shape
        cap = o["capacity"]
        where = f"generated routing {i + 1} of {len(cases)} ({family})"
        d = between(rng, 1, 5)
        dtype = pick(rng, (torch.float32, torch.float32, torch.float64))
        x = torch.randn(T, d, generator=rng, dtype=dtype)
        routing = oracle_routing(o)
        with during(where):
            buf = sm.dispatch(x, routing, cap)
        assert isinstance(buf, torch.Tensor) and tuple(buf.shape) == (E, cap, d) and buf.dtype == dtype, (
            f"{where}: dispatch should return [E, capacity, d] = {[E, cap, d]} {dtype}, found {described(buf)}"
            + (" (capacity 0 is legal: every assignment was dropped, and the buffers are [E, 0, d])" if cap == 0 else "")
        )
        owner = {(int(o["expert_index"][t, j]), int(o["slot"][t, j])): (t, j) for t in range(T) for j in range(k)
                 if o["kept"][t, j]}

        def dispatch_hint(at: tuple[int, ...]) -> str:
            e, s_ = at[0], at[1]
            if (e, s_) in owner:
                return f"buffer[{e}, {s_}] is token {owner[e, s_][0]}'s row (its choice {owner[e, s_][1]} has that slot)"
            return f"buffer[{e}, {s_}] must be zeros: no kept assignment has expert {e}, slot {s_}"

        assert_equal(buf, oracle_dispatch(x, o, E, cap), what=f"{where}: dispatch buffers [expert, slot, feature]",
                     hint=dispatch_hint)

        expert_out = torch.randn(E, cap, d, generator=rng, dtype=dtype) * 3
        for e in range(E):  # what no kept assignment reads may hold anything: inf, -inf, NaN
            for s_ in range(cap):
                if (e, s_) not in owner:
                    expert_out[e, s_] = pick(rng, (float("inf"), float("-inf"), float("nan")))
        with during(where):
            y = sm.combine(expert_out, routing)
        assert isinstance(y, torch.Tensor) and tuple(y.shape) == (T, d) and y.dtype == dtype, (
            f"{where}: combine should return [T, d] = {[T, d]} {dtype}, found {described(y)}"
        )

        def combine_hint(at: tuple[int, ...]) -> str:
            t = at[0]
            reads = [(int(o["expert_index"][t, j]), int(o["slot"][t, j])) for j in range(k) if o["kept"][t, j]]
            if not reads:
                return (f"Token {t} lost every assignment, so its output is zeros" + (
                    " (capacity 0: there is no buffer row to read at all)" if cap == 0 else
                    "; a dropped assignment reads nothing: mask with torch.where (the unused slots here hold "
                    "inf and NaN, and 0 * inf is NaN)"))
            return (f"Token {t} reads (expert, slot) {reads} with weights "
                    f"{[round(float(o['combine_weight'][t, j]), 4) for j in range(k) if o['kept'][t, j]]}; its dropped "
                    "choices read nothing (the unused slots hold inf and NaN here: mask with torch.where)")

        assert_close(y, oracle_combine(expert_out.nan_to_num(0.0, 0.0, 0.0), o), atol=1e-5, rtol=1e-5,
                     what=f"{where}: combine [token, feature]", hint=combine_hint)


def ulp_bf16(v: torch.Tensor) -> torch.Tensor:
    """The spacing of bf16 values (8 significant bits) at v, for v > 0."""
    return torch.exp2(torch.floor(torch.log2(v.abs())) - 7)


@pytest.mark.check("dispatch_combine")
def test_bf16_buffers_and_combine_accumulates_in_fp32(sm, rng):
    """dispatch keeps x's dtype (a copy is exact); combine returns expert_out's dtype, accumulated in fp32.

    Each token reads one large row (a value v in [4, 8)) and k - 1 = 3 small rows, in a random order of its
    choices. Each small product is 0.2 to 0.45 of a bf16 step at v, their sum 0.6 to 1.35: summed in fp32 and
    rounded once, the result is v plus one step; added to v one at a time in bf16, each rounds away and the
    result stays v (whatever the order, some token has v first)."""
    E, k, T, d = 4, 4, 24, 3
    cap = T
    index = torch.stack([torch.randperm(E, generator=rng) for _ in range(T)])  # [T, k]: every token on all 4
    slot = torch.arange(T)[:, None].expand(T, k).clone()  # token t in slot t of every expert
    weight = torch.full((T, k), 0.25)
    o = {"expert_index": index, "slot": slot, "kept": torch.ones(T, k, dtype=torch.bool), "capacity": cap,
         "combine_weight": weight.double(), "tokens_per_expert": torch.full((E,), T), "aux_loss": 0.0, "z_loss": 0.0}
    routing = oracle_routing(o)
    where = f"bf16 buffers, T={T}, E={E}, k={k}, d={d}, capacity {cap}"

    x = (torch.randn(T, d, generator=rng) * 3).bfloat16()
    buf = sm.dispatch(x, routing, cap)
    assert isinstance(buf, torch.Tensor) and tuple(buf.shape) == (E, cap, d) and buf.dtype == torch.bfloat16, (
        f"{where}: dispatch of bf16 x should return [E, capacity, d] = {[E, cap, d]} bf16 (x's dtype), found "
        f"{described(buf)}")
    assert_equal(buf, oracle_dispatch(x, o, E, cap), what=f"{where}: dispatch buffers [expert, slot, feature]",
                 hint="a copy of x's rows, exact in any dtype")

    big = (4 + 4 * torch.rand(T, d, generator=rng)).bfloat16().float()  # v in [4, 8), a bf16 value
    step = ulp_bf16(big)
    small = [((0.2 + 0.25 * torch.rand(T, d, generator=rng)) * step).bfloat16().float() for _ in range(k - 1)]
    first = torch.randint(0, k, (T,), generator=rng)  # which choice reads the large row
    rows = torch.zeros(T, k, d)
    for t in range(T):
        smalls = iter(range(k - 1))
        for j in range(k):
            rows[t, j] = big[t] if j == first[t] else small[next(smalls)][t]
    expert_out = torch.zeros(E, cap, d)
    expert_out[index, slot] = 4 * rows  # times the weight 0.25: every product is exact
    expert_out = expert_out.bfloat16()
    assert torch.equal(expert_out[index, slot].float(), 4 * rows), "test setup: the rows are not bf16 values"
    y = sm.combine(expert_out, routing)
    assert isinstance(y, torch.Tensor) and tuple(y.shape) == (T, d) and y.dtype == torch.bfloat16, (
        f"{where}: combine of bf16 expert_out should return [T, d] = {[T, d]} bf16 (expert_out's dtype), found "
        f"{described(y)}")
    want = oracle_combine(expert_out, o).to(torch.bfloat16)  # fp64, rounded once
    assert_equal(y, want, what=f"{where}: combine [token, feature]", hint=lambda at: (
        f"token {at[0]} sums a row of about {float(big[at]):.4g} and three of about {float(small[0][at]):.2g}, each "
        "under half a bf16 step there: accumulate the weighted rows in fp32 and cast the sum to bf16 once (added in "
        "bf16 one at a time, every small row rounds away)"))


# --------------------------------------------------------------------------------------------------
# layer: the whole MoE layer against a per-token reference, forward and backward


def make_experts(E: int, d: int, h: int, seed: int) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [nn.Sequential(nn.Linear(d, h), nn.GELU(), nn.Linear(h, d)) for _ in range(E)]


def layer_decisions(sm, r, logits: torch.Tensor, k: int, cf: float, where: str) -> dict:
    """The routing decisions (chosen experts, kept assignments) the layer check builds its reference on.

    route's own decisions are judged by topk, drops and priority; this check judges the layer around them.
    So where moe_layer routes exactly as the student's route() does on the same logits, the reference uses
    those decisions (once they form a valid routing), and a wrong drop is charged there, not here again.
    Where moe_layer routes otherwise, the layer itself is at fault, and the routing is compared with the
    oracle's."""
    o = oracle_route(logits, k, cf)
    r = as_routing(r)
    T, E = logits.shape
    assert_fields(r, T, k, E, where)  # before any value is read: the comparisons below copy them
    same = lambda a, b: all(isinstance(getattr(a, f), torch.Tensor) and getattr(a, f).shape == getattr(b, f).shape
                            and torch.equal(getattr(a, f).long(), getattr(b, f).long()) for f in ("expert_index", "slot"))
    if same(r, Routing(o["expert_index"], None, o["slot"], None, None, None)):  # type: ignore[arg-type]  # `same` reads two
        return o
    own = as_routing(sm.route(logits, k, cf))
    if not same(r, own):
        return assert_routing_matches(r, o, logits, where + " (it also differs from your own route() on the same "
                                      "logits, so moe_layer routes otherwise than route with its defaults)")
    assert_invariants(r, T, k, E, o["capacity"], where + " (your route's routing; the drops check compares it with the contract)")
    return {**o, "expert_index": r.expert_index.long(), "kept": r.slot >= 0}


@pytest.mark.check("layer")
@pytest.mark.parametrize("k,cf", [(1, 0.75), (2, 0.75), (2, 2.0)])
def test_layer_output_and_gradients(student, sm, rng, seed, k, cf):
    E, d, h = 4, 6, 8
    T = 23
    x = torch.randn(T, d, generator=rng)
    gate = torch.randn(E, d, generator=rng) * 0.7
    experts = make_experts(E, d, h, seed)
    gy = torch.randn(T, d, generator=rng)
    y, r, dx, dgate, dparams = student.drive(DRIVER + "moe_layer_backward", sm.moe_layer, x, gate, experts, k, cf, gy)

    # Reference: one token at a time, in fp64, on the routing decisions judged below.
    logits32 = x @ gate.t()
    o = layer_decisions(sm, r, logits32, k, cf, f"moe_layer routing (T={T}, E={E}, k={k}, capacity_factor={cf})")
    x64 = x.double().requires_grad_(True)
    g64 = gate.double().requires_grad_(True)
    ref = [copy.deepcopy(m).double() for m in experts]
    p = torch.softmax(x64 @ g64.t(), -1)
    rows = []
    for t in range(T):
        w = p[t, o["expert_index"][t]]
        if k > 1:
            w = w / w.sum()
        out = torch.zeros(d, dtype=torch.float64)
        for j in range(k):
            if o["kept"][t, j]:
                out = out + w[j] * ref[int(o["expert_index"][t, j])](x64[t : t + 1])[0]
        rows.append(out)
    want = torch.stack(rows)
    (want * gy.double()).sum().backward()

    assert_close(y, want.detach(), atol=1e-4, what="moe_layer output against the per-token reference [token, feature]",
                 hint="y[t] = sum over kept choices of weight * expert(x[t])")
    for name, got, want_g in (("x", dx, x64.grad), ("gate_weight", dgate, g64.grad)):
        assert_close(got, want_g, atol=1e-4 * max(1.0, float(want_g.abs().max())), what=f"moe_layer: d loss / d {name}",
                     hint=("The router learns through combine_weight; keep it on the graph from the logits" if name == "gate_weight" else
                           "x reaches y through dispatch (each expert) and through the router"))
    for e_idx, (got_list, module) in enumerate(zip(dparams, ref)):
        for (pname, param), got in zip(module.named_parameters(), got_list):
            want_g = param.grad if param.grad is not None else torch.zeros_like(param)
            assert_close(got, want_g, atol=1e-4 * max(1.0, float(want_g.abs().max())),
                         what=f"moe_layer: the gradient of expert {e_idx}'s parameter {pname}", hint=(
                "Only kept "
                "assignments reach an expert (empty buffer rows must not add to the bias gradient through combine)"
            ))


# --------------------------------------------------------------------------------------------------
# vectorised: the lines executed must not grow with T


def spread_logits(T: int, E: int, rng: torch.Generator) -> torch.Tensor:
    """Every expert busy at any T: token t prefers t % E, plus noise."""
    logits = torch.randn(T, E, generator=rng) * 0.5
    logits[torch.arange(T), torch.arange(T) % E] += 2.0
    return logits


# The grader's own clock at two sizes (grader/structure.py) beside the worker's line counts, which the
# submission can forge: T = 16, then 4096 tokens through the sandbox (1024 in-process), E = 8, d = 4. Every timed
# call gets fresh inputs and is checked against the grader's own answer (the oracle's loops over lists for the
# routing decisions; index arithmetic for dispatch and combine). Measured on the course's shared 2-core machine
# under load, best of 5 runs each, ratio large / small, min-max over 3 measurements, sandbox / in-process:
#   reference   route (position) 1.4-2.5 / 1.7-2.2, route (probs) 2.0-3.4 / 1.9-2.8,
#               dispatch 0.9-1.7 / 2.5-3.0, combine 1.4-3.3 / 2.3-3.1
#   loop_over_tokens (dispatch) 42-83 / 100-120;  a running count per expert in a loop (route) 23-38 / 25-26
MOE_CLOCK = Scaling(16, 4096, bar=8.0, large_in_process=1024, unit="tokens")
CLOCK_E, CLOCK_D = 8, 4


def assert_flat(student, fn, make_args, check, name: str, clocked=None) -> None:
    """Run `fn` at T=48 and T=480: the results must be right (`check`) and the line count flat. Then, when
    `clocked` = (make, check) is given, the grader's own clock at MOE_CLOCK's sizes must agree."""
    work = {}
    for T in (48, 480):
        args = make_args(T)
        _, work[T] = student.work_executed(fn, *args, check=lambda result, args=args: check(result, *args))
    small, big = work[48].lines, work[480].lines
    advice = ("Use whole-tensor operations: a cumulative sum of one-hot rows gives every assignment its slot at once.")
    assert big <= small + 10, (
        f"{name} executed {small} lines of your file for T=48 and {big} for T=480: the count grows with the "
        f"number of tokens, so something loops over tokens (or over slots) in Python. {advice}"
    )
    assert_no_hidden_loop(name, ("T=48", "T=480"), work[48], work[480], advice)
    if clocked is not None:
        make, fast_check = clocked
        timing = clock(student.mode, fn, make, fast_check, MOE_CLOCK)
        assert_flat_on_the_clock(timing, name, advice, lines=(small, big), loop="a loop over tokens (or over slots)")


def clocked_routing(T: int, k: int, cf: float, rng: torch.Generator, policy: str = "position"):
    """Spread logits for T tokens and the grader's routing decisions for them: (logits, Routing, capacity)."""
    logits = spread_logits(T, CLOCK_E, rng)
    p32 = torch.softmax(logits.float(), -1).tolist()
    cap = capacity_formula(T, CLOCK_E, k, cf)
    idx = [ranked_experts(row, k) for row in p32]
    slot = torch.tensor(oracle_slots(idx, p32, cap, policy), dtype=torch.long)
    index = torch.tensor(idx, dtype=torch.long)
    kept = slot >= 0
    weight = torch.where(kept, torch.rand(T, k, generator=rng), torch.zeros(T, k))
    tokens = torch.bincount(index[kept], minlength=CLOCK_E)
    return logits, Routing(index, weight, slot, tokens, torch.tensor(0.0), torch.tensor(0.0)), cap


def check_route_decisions(r, logits, k, cf, policy) -> None:
    """The experts and slots of a timed route against the per-token loop's, near ties resolved as the student
    did (`accepting`: at T = 4096 a hand-written fp32 softmax flips some near-tied token pairs of the probs
    policy against torch.softmax's rounding, which cost a correct submission 1.5 points before)."""
    T = logits.shape[0]
    where = f"route(T={T}, drop_policy={policy!r}) (timed on the grader's clock)"
    assert_fields(r, T, k, logits.shape[1], where)
    o = accepting(r, oracle_route(logits, k, cf, policy), where)
    assert r.expert_index.tolist() == o["expert_index"].tolist() and r.slot.tolist() == o["slot"].tolist(), (
        f"route(T={T}, drop_policy={policy!r}) chose other experts or slots than the per-token loop (timed on the "
        "grader's clock), beyond any near tie of fp32 rounding"
    )


@pytest.mark.check("vectorised")
@pytest.mark.parametrize("policy", ["position", "probs"])
def test_route_is_vectorised(student, sm, rng, policy):
    E = 8

    def check(r, logits, k, cf, policy):
        where = f"route(T={logits.shape[0]}, E={E}, k={k}, capacity_factor={cf}, drop_policy={policy!r})"
        assert_routing_matches(r, oracle_route(logits, k, cf, policy), logits, where, policy)

    assert_flat(student, sm.route, lambda T: (spread_logits(T, E, rng), 2, 1.0, policy), check,
                f"route (drop_policy={policy!r})",
                clocked=(lambda T: (spread_logits(T, CLOCK_E, rng), 2, 1.0, policy), check_route_decisions))


def check_dispatch_indexing(buf, x, routing, cap) -> None:
    kept = routing.slot >= 0
    token = torch.arange(x.shape[0])[:, None].expand_as(routing.slot)
    want = torch.zeros(routing.tokens_per_expert.shape[0], cap, x.shape[1], dtype=x.dtype)
    want[routing.expert_index[kept], routing.slot[kept]] = x[token[kept]]
    assert buf.shape == want.shape and torch.equal(buf, want), f"dispatch is wrong for T={x.shape[0]} (timed on the grader's clock)"


def check_combine_indexing(y, expert_out, routing) -> None:
    kept = (routing.slot >= 0)[..., None]
    rows = expert_out.double()[routing.expert_index, routing.slot.clamp(min=0)]  # [T, k, d]
    want = (routing.combine_weight.double()[..., None] * torch.where(kept, rows, 0.0)).sum(1)
    assert_close(y, want, atol=1e-5, rtol=1e-5, what=f"combine for T={routing.slot.shape[0]} (timed on the grader's clock)")


@pytest.mark.check("vectorised")
def test_dispatch_and_combine_are_vectorised(student, sm, rng):
    E, d, k, cf = 8, 4, 2, 1.0
    oracles = {}

    def args(T):
        o = oracle_route(spread_logits(T, E, rng), k, cf)
        oracles[T] = o
        return torch.randn(T, d, generator=rng), oracle_routing(o), o["capacity"]

    def check_dispatch(buf, x, routing, cap):
        want = oracle_dispatch(x, oracles[x.shape[0]], E, cap)
        assert buf.shape == want.shape and torch.equal(buf, want), f"dispatch is wrong for T={x.shape[0]}"

    def clocked_dispatch(T):
        _, routing, cap = clocked_routing(T, k, cf, rng)
        return torch.randn(T, CLOCK_D, generator=rng), routing, cap

    assert_flat(student, sm.dispatch, args, check_dispatch, "dispatch", clocked=(clocked_dispatch, check_dispatch_indexing))

    def combine_args(T):
        x, r, cap = args(T)
        return torch.randn(E, cap, d, generator=rng), r

    def check_combine(y, expert_out, routing):
        want = oracle_combine(expert_out, oracles[routing.slot.shape[0]])
        assert_close(y, want, atol=1e-5, rtol=1e-5, what=f"combine for T={routing.slot.shape[0]}")

    def clocked_combine(T):
        _, routing, cap = clocked_routing(T, k, cf, rng)
        return torch.randn(CLOCK_E, cap, CLOCK_D, generator=rng), routing

    assert_flat(student, sm.combine, combine_args, check_combine, "combine", clocked=(clocked_combine, check_combine_indexing))


@pytest.mark.check("vectorised")
def test_layer_is_vectorised(student, sm, rng, seed):
    """moe_layer's own code (around route, dispatch and combine) loops over experts, never over tokens."""
    E, d, h, k, cf = 4, 4, 8, 2, 2.0
    experts = make_experts(E, d, h, seed)
    gate = torch.randn(E, d, generator=rng)

    def check(result, x, gate, experts, k, cf):
        where = f"moe_layer(T={x.shape[0]}, E={E}, k={k}, capacity_factor={cf}) (counted)"
        assert isinstance(result, tuple) and len(result) == 2, f"{where}: should return (y, routing)"
        y, r = result
        assert isinstance(y, torch.Tensor) and tuple(y.shape) == tuple(x.shape), (
            f"{where}: y should be [T, d] = {list(x.shape)}, found {described(y)}")
        o = layer_decisions(sm, r, x @ gate.t(), k, cf, where)
        with torch.no_grad():
            p = torch.softmax(x.double() @ gate.double().t(), -1)
            w = p.gather(1, o["expert_index"])
            w = torch.where(o["kept"], w / w.sum(-1, keepdim=True), 0.0)
            dense = torch.stack([copy.deepcopy(m).double()(x.double()) for m in experts])
            want = (w[..., None] * dense[o["expert_index"], torch.arange(x.shape[0])[:, None]]).sum(1)
        assert_close(y, want, atol=1e-4, what=f"{where}: y [token, feature]")

    assert_flat(student, sm.moe_layer, lambda T: (torch.randn(T, d, generator=rng), gate, experts, k, cf), check, "moe_layer")


# --------------------------------------------------------------------------------------------------
# sparse_experts: the signature. The technique buys back compute: expert e computes the rows of its buffer,
# at most `capacity` of them, not all T tokens; dispatch and combine move the T*k assignments' rows, not a
# one-hot [T, E, capacity] tensor (GShard's einsum formulation, whose cost is k * T^2 * cf elements, quadratic
# in T). The textbook computation of the same numbers runs every expert on every token and masks or weights the
# outputs afterwards ("dense MoE"), or dispatches and combines through the one-hot tensor: the oracle
# comparisons cannot tell it apart, since the numbers agree.
#
# Instruments (grader/support/moe_router.py), taken where the student's code runs, so the tests call
# student.assert_untampered first and check the counted call's result: a wrapper that a course driver puts on the
# `forward` of each expert module the test builds (rows each expert's forward body computes: the leading
# dimensions of its input, after any pre-hook of the student's; `.forward` called directly counts too), and a
# dispatch mode (WorkCounter) over everything between entering and leaving the call (the student's own hooks and
# whatever they run included) that adds up the FLOPs (torch.utils.flop_counter's formulas for the matmul family,
# the course's for the contractions torch leaves out: addbmm, mv, addmv, dot, bilinear's _trilinear, cdist,
# embedding_bag, _addmm_activation; an operator with no formula that is not bounded by the elements it moves is
# named in `uncounted` and fails the check, never counted as zero) and, as gptq's TrafficCounter does, the
# elements every aten operation reads and writes; with the elements read back into Python or numpy. The element
# budget of the whole call is the layer's own (routing, dispatch, combine) plus the experts' forwards on the rows
# they were handed, measured here in the grader on copies of the same modules (expert_traffic).
#
# Issue 36 (red team): with the old instruments, forward pre-hooks and FLOPs of the matmul family only, a dense MoE
# computed in a pre-hook of the student's (which ran inside the window whose elements were left out as the
# experts' own) by F.bilinear (aten._trilinear: no formula, zero FLOPs) kept 95/95; so did the same computed
# elementwise (mul and sum: no FLOPs by convention, 144 M elements moved). Known-wrong
# dense_in_a_pre_hook_via_bilinear, dense_in_a_pre_hook_elementwise, dense_in_a_forward_hook_via_addbmm.
#
# Measured in-process on this course's CPU (the counts are deterministic, torch 2.13):
#   moe_layer, T=1024, E=16, d=32, h=64, expert FLOPs per row 4*d*h = 8192, gate 2*T*d*E:
#     k=1, cf=1.0 (capacity 64):   reference  FLOPs = gate + E * 64 * 8192 exactly, at most 64 rows an expert;
#                                  textbook (every expert on all 1024 tokens, masked)  16x the experts' FLOPs,
#                                  1024 rows an expert
#     k=2, cf=1.25 (capacity 160): reference  gate + E * 160 * 8192;  textbook 6.4x, 1024 rows an expert
#     elements moved by the whole call (budget: the experts' 352 a row and 4,192 a call, plus the layer's own):
#     k=1 1,307,676 of 2,786,816; k=2 2,576,096 of 4,900,352. Dense experts in a pre-hook, elementwise: 144 M.
#   dispatch / combine, T=2048, E=16, k=2, cf=1.0 (capacity 256), d=8: the reference moves 256,388 / 393,216
#     elements (read + written), 0 FLOPs; a one-hot [T, E, C] einsum dispatch 120,868,880 and 134 MFLOPs, the
#     same one-hot applied elementwise (no matmul) 255,086,608. Budget: 16 * (T*k*(d + E) + E*C*d) = 2,097,152,
#     four times below the one-hot tensor's own T*E*C = 8,388,608 elements, eight times above the reference.

SPARSE_LAYER = dict(T=1024, E=16, d=32, h=64)
SPARSE_ROUTE = dict(T=2048, E=16, d=8, k=2, cf=1.0)


def expert_row_flops(expert: nn.Module) -> int:
    """The matmul FLOPs one token row costs an expert: 2 * in * out for each of its nn.Linear layers (the
    experts here are Linear, GELU, Linear), worked out here, in the grader."""
    return sum(2 * m.in_features * m.out_features for m in expert.modules() if isinstance(m, nn.Linear))


def layer_flop_budget(T: int, E: int, d: int, k: int, capacity: int, row_flops: int) -> tuple[int, int, int]:
    """(the gate's FLOPs, the experts' FLOPs on their buffers, the budget for the whole call): the gate
    x @ gate_weight.T, E * capacity rows through the experts, and an allowance of 16 FLOPs per assignment
    feature for small matmuls around them (a bmm combine costs 2)."""
    gate = 2 * T * d * E
    buffers = E * capacity * row_flops
    return gate, buffers, gate + buffers + 16 * T * k * d


def moved_budget(T: int, E: int, d: int, k: int, capacity: int) -> int:
    """Elements dispatch or combine (or moe_layer outside its experts' calls, with the router's T*E on top) may
    read and write: 16 per element of the assignments' rows and their expert ids, and of the buffers."""
    return 16 * (T * k * (d + E) + E * capacity * d)


@pytest.mark.check("sparse_experts")
@pytest.mark.parametrize("k,cf", [(1, 1.0), (2, 1.25)])
def test_each_expert_computes_only_its_buffer(student, sm, rng, seed, k, cf):
    T, E, d, h = (SPARSE_LAYER[n] for n in ("T", "E", "d", "h"))
    x = torch.randn(T, d, generator=rng)
    gate = torch.randn(E, d, generator=rng) * 0.5
    experts = make_experts(E, d, h, seed)
    cap = capacity_formula(T, E, k, cf)
    where = f"moe_layer(T={T}, E={E}, d={d}, k={k}, capacity_factor={cf}), capacity {cap}"
    out = student.drive(DRIVER + "expert_work", sm.moe_layer, x, gate, experts, k, cf)
    student.assert_untampered(sm.moe_layer, "the rows, FLOPs and elements counted beside your moe_layer")

    # The counted call did the work: its output against the dense fp64 reference on the routing decisions.
    result = out["result"]
    assert isinstance(result, tuple) and len(result) == 2, (
        f"{where}: moe_layer should return (y, routing), found {type(result).__name__}")
    y, r = result
    assert isinstance(y, torch.Tensor) and tuple(y.shape) == (T, d), (
        f"{where}: y should be [T, d] = {[T, d]}, found {described(y)}")
    o = layer_decisions(sm, r, x @ gate.t(), k, cf, where)
    with torch.no_grad():
        p = torch.softmax((x.double() @ gate.double().t()), -1)
        w = p.gather(1, o["expert_index"])
        if k > 1:
            w = w / w.sum(-1, keepdim=True)
        w = torch.where(o["kept"], w, 0.0)
        dense = torch.stack([copy.deepcopy(m).double()(x.double()) for m in experts])  # the oracle may be dense
        want = (w[..., None] * dense[o["expert_index"], torch.arange(T)[:, None]]).sum(1)
    assert_close(y, want, atol=1e-4, what=f"{where}: the counted call's output [token, feature]",
                 hint="y[t] = sum over kept choices of weight * expert(x[t]); the layer check says more")

    rows, calls, flops = out["rows"], out["calls"], out["flops"]
    assert isinstance(rows, list) and len(rows) == E and all(type(n) is int for n in rows), (
        f"{where}: the driver's row count came back as {type(rows).__name__}: the count was tampered with")
    over = [(e, n) for e, n in enumerate(rows) if n > cap]
    assert not over, (
        f"{where}: expert {over[0][0]} computed {over[0][1]} token rows (over {calls[over[0][0]]} call"
        f"{'' if calls[over[0][0]] == 1 else 's'}); "
        f"{len(over)} of the {E} experts computed more than their capacity of {cap} rows. The technique is that "
        f"expert e runs on its buffer, buffers[e] = [capacity, d] (the tokens routed to it, at most {cap}): "
        f"{E} x {cap} rows in all, not {E} x {T}. Running every expert on every token and masking or weighting "
        "the outputs afterwards gives the same numbers at the price of a dense layer: the compute MoE exists "
        "to save. Call experts[e](buffers[e]) on dispatch's buffers."
    )
    assert_all_counted(out.get("uncounted"), where)
    row_flops = expert_row_flops(experts[0])
    gate_flops, buffer_flops, budget = layer_flop_budget(T, E, d, k, cap, row_flops)
    assert type(flops) is int and 0 <= flops <= budget, (
        f"{where}: the call's matmuls cost {show(flops)} FLOPs (torch's FLOP formulas and the course's, counted under a dispatch mode), more than the "
        f"{budget} its technique needs: the gate {gate_flops}, the experts on their buffers {E} x {cap} rows x "
        f"{row_flops} = {buffer_flops}, and small change. Every expert on every token costs {E * T * row_flops} "
        f"for the experts alone ({T / cap:.1f} times more); a one-hot [T, E, capacity] dispatch or combine by "
        f"matrix multiply costs {2 * T * E * cap * d} each. Busiest operations: {busiest(out['ops'])}. Run each "
        "expert on its [capacity, d] buffer only (the counter sees every matmul, however the expert is called, hooks of your own included), "
        "and dispatch and combine with indexing."
    )
    assert all(type(n) is int and n >= 0 for n in calls) and len(calls) == E, (
        f"{where}: the driver's call count came back as {show(calls)}: the count was tampered with")
    own = moved_budget(T, E, d, k, cap) + 64 * T * E
    per_call, per_row = zip(*(expert_traffic(m, d) for m in experts))
    in_experts = sum(min(calls[e], 2) * per_call[e] + rows[e] * per_row[e] for e in range(E))
    moved, budget = out["moved"], own + in_experts
    assert type(moved) is int and 0 <= moved <= budget, (
        f"{where}: your moe_layer read and wrote {show(moved)} tensor elements in all (every torch operation "
        f"between entering and leaving the call, your own hooks on the experts included), more than the budget of "
        f"{budget}: the experts' forwards on the rows they were handed, {in_experts} (measured here on the same "
        f"modules: {sum(rows)} rows over {sum(calls)} calls), and {own} for routing, dispatch and combine. A one-hot "
        f"[T, E, capacity] dispatch or combine tensor alone holds {T * E * cap}; every expert on every token moves "
        f"some {E * T * per_row[0]}, however its FLOPs are reached (elementwise products, a hook of your own). "
        f"Busiest: {busiest(out['ops'])}. Run each expert on its buffer only, and copy each kept assignment's row "
        "into its buffer (one index per row) and read it back the same way."
    )
    assert_few_host_reads(out["host_reads"], T * d // 4, where, "x")


def expert_traffic(expert: nn.Module, d: int) -> tuple[int, int]:
    """(elements moved by one call, elements moved per row) of the expert's forward, measured here, in the
    grader, on a copy of the module (the counter is the driver's WorkCounter): it moves its weights once a
    call, and a fixed number of elements a row (the Linear, GELU, Linear experts are affine in the rows)."""
    from grader.support.moe_router import WorkCounter

    module = copy.deepcopy(expert)
    moved = []
    for n in (1, 2):
        counter = WorkCounter()
        with counter:
            module(torch.zeros(n, d))
        moved.append(counter.read + counter.written)
    return 2 * moved[0] - moved[1], moved[1] - moved[0]


def assert_all_counted(uncounted, where: str) -> None:
    """The counter met no operator whose arithmetic it cannot count (WorkCounter.uncounted: neither a FLOP
    formula, torch's or the course's, nor bounded by the elements it moves); one would count as zero FLOPs."""
    assert isinstance(uncounted, dict), (
        f"{where}: the driver's list of uncounted operators came back as {show(uncounted)}: it was tampered with")
    names = sorted(str(n)[:60] for n in list(uncounted)[:20])
    assert not names, (
        f"{where}: the check cannot count the FLOPs of {', '.join('aten.' + n for n in names)}: torch's FLOP "
        "counter has no formula for it and its arithmetic is not bounded by the elements it reads and writes, so "
        "counting it as zero would let any computation through. Write the expert computation with matmul (@), "
        "nn.Linear / torch.nn.functional.linear or torch.einsum, call experts[e](buffers[e]), and dispatch and "
        "combine by indexing."
    )


def busiest(ops, limit: int = 4) -> str:
    """The operations that moved the most elements, for a message (the driver's tally, bounded)."""
    if not isinstance(ops, dict):
        return "(not reported)"
    top = sorted(((str(n)[:40], v) for n, v in list(ops.items())[:200] if isinstance(v, list) and len(v) == 2
                  and all(type(i) is int for i in v)), key=lambda kv: -(kv[1][0] + kv[1][1]))[:limit]
    return ", ".join(f"{name} ({read} read, {written} written)" for name, (read, written) in top)


def assert_few_host_reads(host_reads, bound: int, where: str, what: str) -> None:
    assert type(host_reads) is int and 0 <= host_reads <= bound, (
        f"{where}: the call read {show(host_reads)} tensor elements back into Python or numpy (.tolist(), .numpy(), "
        f".item() ...); at most {bound} may be, a fraction of one copy of {what}: the counters see torch's "
        "operators only, so the work must stay in torch tensors"
    )


@pytest.mark.check("sparse_experts")
def test_dispatch_and_combine_move_the_assignments_not_a_one_hot(student, sm, rng):
    T, E, d, k, cf = (SPARSE_ROUTE[n] for n in ("T", "E", "d", "k", "cf"))
    o = oracle_route(spread_logits(T, E, rng), k, cf)
    cap = o["capacity"]
    routing = oracle_routing(o)
    budget = moved_budget(T, E, d, k, cap)
    one_hot = T * E * cap
    advice = (f"A one-hot [T, E, capacity] tensor (GShard's einsum formulation) holds {one_hot} elements here, "
              f"k * T^2 * capacity_factor, quadratic in the tokens, to move {T * k} rows of {d}. Index instead: "
              "row = expert_index * capacity + slot in a flat [E * capacity, d] buffer.")

    x = torch.randn(T, d, generator=rng)
    out = student.drive(DRIVER + "traffic", sm.dispatch, x, routing, cap)
    student.assert_untampered(sm.dispatch, "the elements counted beside your dispatch")
    where = f"dispatch(x [T={T}, d={d}], routing with E={E}, k={k}, capacity {cap})"
    buf = out["result"]
    assert isinstance(buf, torch.Tensor) and tuple(buf.shape) == (E, cap, d), (
        f"{where}: should return [E, capacity, d] = {[E, cap, d]}, found {described(buf)}")
    check_dispatch_indexing(buf, x, routing, cap)
    assert_all_counted(out.get("uncounted"), where)
    assert type(out["flops"]) is int and out["flops"] <= 4 * T * k * d, (
        f"{where}: dispatch ran {show(out['flops'])} FLOPs of matrix multiplies (torch's FLOP formulas, counted under a dispatch mode) to copy "
        f"rows; a copy needs none. {advice}")
    assert type(out["moved"]) is int and 0 <= out["moved"] <= budget, (
        f"{where}: dispatch read and wrote {show(out['moved'])} tensor elements, summed over its operations; the "
        f"budget is {budget} (16 per element of the assignments' rows and expert ids, and of the buffers; the "
        f"reference moves about 256,000). Busiest: {busiest(out['ops'])}. {advice}")
    assert_few_host_reads(out["host_reads"], T * d // 4, where, "x")

    expert_out = torch.randn(E, cap, d, generator=rng)
    out = student.drive(DRIVER + "traffic", sm.combine, expert_out, routing)
    student.assert_untampered(sm.combine, "the elements counted beside your combine")
    where = f"combine(expert_out [E={E}, capacity {cap}, d={d}], routing with T={T}, k={k})"
    y = out["result"]
    assert isinstance(y, torch.Tensor) and tuple(y.shape) == (T, d), (
        f"{where}: should return [T, d] = {[T, d]}, found {described(y)}")
    check_combine_indexing(y, expert_out, routing)
    assert_all_counted(out.get("uncounted"), where)
    assert type(out["flops"]) is int and out["flops"] <= 4 * T * k * d, (
        f"{where}: combine ran {show(out['flops'])} FLOPs of matrix multiplies (torch's FLOP formulas, counted under a dispatch mode); a weighted "
        f"sum of each token's k rows needs at most {2 * T * k * d}. {advice}")
    assert type(out["moved"]) is int and 0 <= out["moved"] <= budget, (
        f"{where}: combine read and wrote {show(out['moved'])} tensor elements, summed over its operations; the "
        f"budget is {budget} (the reference moves about 393,000). Busiest: {busiest(out['ops'])}. {advice}")
    assert_few_host_reads(out["host_reads"], E * cap * d // 4, where, "expert_out")


# --------------------------------------------------------------------------------------------------
# route_speed (CUDA): against one torch.topk plus one softmax over the same logits


def assert_timed_route(r, logits, k, cf):
    """One route() of the speed check against the contract, on the GPU: the k best experts (stable
    sort of the fp32 probabilities), the position policy's slots (every first choice before any
    second, in token order: an assignment's slot is how many earlier assignments chose its expert,
    -1 from the capacity on), the kept counts, and the renormalised gate weights of the kept ones."""
    T, E = logits.shape
    probs = torch.softmax(logits.float(), -1)
    order = torch.sort(probs, dim=-1, descending=True, stable=True)
    want_index = order.indices[:, :k]
    assert torch.equal(r.expert_index.to(want_index.device), want_index), "route chose the wrong experts"
    cap = capacity_formula(T, E, k, cf)
    flat = want_index.t().reshape(-1)  # assignments in priority order: (choice j, token t)
    earlier = torch.nn.functional.one_hot(flat, E).cumsum(0).gather(1, flat[:, None]).squeeze(1) - 1
    want_slot = torch.where(earlier < cap, earlier, torch.full_like(earlier, -1)).view(k, T).t()
    assert torch.equal(r.slot.to(want_slot.device), want_slot), (
        "route's slots differ from the position policy's: every first choice before any second choice, tokens in "
        f"order, slot = assignments the expert already holds, -1 once it holds capacity = {cap}"
    )
    kept = want_slot >= 0
    want_tokens = torch.bincount(want_index[kept], minlength=E)
    assert torch.equal(r.tokens_per_expert.to(want_tokens.device), want_tokens), "route's tokens_per_expert is wrong"
    top = order.values[:, :k].double()
    want_weight = torch.where(kept, top / top.sum(-1, keepdim=True), torch.zeros_like(top))
    assert_close(r.combine_weight, want_weight, atol=1e-5, what="route's combine_weight [token, choice]")


@pytest.mark.cuda
@pytest.mark.check("route_speed")
def test_route_speed(student, sm, score):
    from grader import rehearsal, speed

    case = rehearsal.size(ROUTE, ROUTE.tiny_case())
    T, E, k, cf = case.tokens, case.experts, case.k, case.capacity_factor
    spec = speed.Randn((T, E), rehearsal.dtype(case.dtype))
    # At the bar a route may take 25 times one topk + softmax (tens of us), up to about 0.75 ms: 300 reps
    # are some 0.2 s there, well above the wall-clock bound's slack (5 ms + 3%, grader/speed.py).
    t = speed.time_student(student, sm.route, [spec, k, cf], reps=300,
                           check=lambda args, out: assert_timed_route(out, args[0], k, cf))
    base = speed.time_here(case.baseline, [spec], reps=300)
    ratio = base.mean_s / t.mean_s
    score.metrics(route_us=t.mean_s * 1e6, topk_softmax_us=base.mean_s * 1e6)
    score.speed(ratio, f"route takes {t.mean_s * 1e6:.0f} us, one topk + softmax {base.mean_s * 1e6:.0f} us: "
                       f"ratio {ratio:.3f}")
