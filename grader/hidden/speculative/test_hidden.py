"""Hidden checks for speculative decoding.

The oracles (oracle.py) are the textbook: sum(min(p, q)), the geometric sum written out, a per-row loop for greedy,
exact enumeration of short sequences (the target's chain-rule probability of each one), and the exact law of
(drafts accepted, extra token) of one case, by loops over positions and tokens.

The signature: the coupling. Sampling y from the target at every position and keeping a draft when y == x (or
never keeping one) emits every position with the target's law, the same numbers a test of the output sees.
Speculative decoding is the maximal coupling of draft and target: x is kept with probability min(1, p(x)/q(x)), a
rejected position is redrawn from norm(max(0, p - q)), so a position is accepted with probability sum(min(p, q))
and the tokens per target call follow equation 1. The `coupling` check observes exactly that: per drafted token
the fraction kept, the law of the token drawn after a rejection, the law of the number of drafts accepted (named
cases), the exact law of (n, x) given the drafts (generated families), outcomes only the rule forbids, p == q
keeping every draft, the target calls of whole generations (equation 1), and, at B > 1, that each row advances by
its own num_accepted + 1 (a batch advanced together by its smallest count keeps every output law and loses the
speed-up). What it cannot see: how the law is
produced (any code whose outputs have the rule's law, given the drafts, is the technique as far as a CPU can
tell), a deviation below its resolution, and whether the work is fast (that is accept_speed's, on CUDA).

Contract clauses (README "The contract") and the tests that draw them:

| clause | tests |
| --- | --- |
| probabilities float32; float64 must work too | float32 everywhere; float64: test_inputs_are_left_alone_and_float64_works, one generated call (test_generated_outcomes_are_possible/_the_rules) and one generated family, test_expected_* (tensors), test_greedy_compares_float64_in_float64 |
| token ids int64 (inputs and outputs) | assert_outputs in every accept/greedy test (outputs int64); inputs are int64 throughout |
| randomness only from `generator`, never the global generator | test_same_seed_same_tokens_other_seed_other_tokens, test_the_global_generator_is_not_touched, test_generate_is_reproducible |
| no Python loop over rows or the vocabulary | test_speculative_accept_is_vectorised[batch, vocabulary], test_greedy_accept_is_vectorised |
| acceptance_rate: sum of min(p, q) over the last dim, Tensor[..., V] -> Tensor[...] | test_acceptance_rate_on_random_batches ([3, 5, 17], float64), test_acceptance_rate_over_the_last_dim_of_any_shape ([17] -> 0-d, [2, 3, 4, 9], float32) |
| expected_tokens_per_step / expected_speedup: equation 1, Theorem 3.8 | test_expected_tokens_per_step_on_floats, test_expected_tokens_per_step_elementwise_and_near_one, test_expected_speedup |
| a float alpha gives a float, a tensor alpha a tensor of its shape | test_expected_tokens_per_step_on_floats, test_expected_speedup (isinstance float); the elementwise tests (shape) |
| alpha = 1 gives gamma + 1, never NaN; 1 - 1e-9 accurate to 1e-5 | test_expected_tokens_per_step_on_floats (floats, both), test_expected_tokens_per_step_elementwise_and_near_one, test_expected_speedup (tensors, both) |
| gamma = 0 (formulas) | test_expected_tokens_per_step_on_floats[0] |
| accept: shapes [B, gamma], [B, gamma, V], [B, gamma + 1, V] -> [B, gamma + 1], [B] | assert_outputs / check_layout, every accept test |
| accept x_i while u_i <= p/q, u in (0, 1]: p(x) = 0 never kept; p >= q always kept | test_a_token_the_target_forbids_is_never_emitted, test_p_equal_q_never_rejects, test_generated_outcomes_are_the_rules, the coupling tests (kept with probability min(1, p/q)) |
| q_i(x_i) = 0 is rejected | test_a_draft_token_with_q_zero_is_rejected, test_generated_outcomes_are_possible ("drafted where p or q is 0"), the empty_residual named case |
| at the first rejection: the prefix, one token from norm(max(0, p - q)) | test_the_coupling_on_the_named_cases (the residual's law), test_generated_families_follow_the_rule, test_generated_outcomes_are_the_rules (its support) |
| a residual summing to 0: from p, in that row only | test_an_empty_residual_gives_a_token_of_p_not_nan, test_the_empty_residual_fallback_is_per_row, the empty_residual named case, generated "empty residual" and "nearly empty residual" (2^-24 is not 0) |
| all gamma accepted: the drafts, then a bonus token from p_gamma | test_p_equal_q_never_rejects, test_each_position_is_distributed_as_the_target (position gamma), generated families |
| layout: kept drafts, the extra token, then -1; both int64 | check_layout (every accept test), assert_outputs |
| never NaN; inputs not modified | test_an_empty_residual_gives_a_token_of_p_not_nan, test_inputs_are_left_alone_and_float64_works (and the harness fails any call that changes an argument) |
| gamma = 0: tokens [B, 1], a draw from p_0 | test_gamma_zero_is_one_draw_from_p0, the gamma = 0 generated call and family |
| rows independent | test_rows_do_not_interfere, test_the_empty_residual_fallback_is_per_row, the per-case laws (one coin per row and position) |
| value ranges: exact zeros, q = 0 where p > 0, p = 0 where q > 0, ties p == q, one-hot rows, V = 1 | the generated families and sweep (multiples of 1/64), the disjoint and q_on_zero_of_p named cases |
| greedy: keep drafts while they equal the argmax (ties: lowest id), then the argmax; the same layout | test_greedy_tables_from_vllm (gamma = 0 included), test_greedy_random_batches_match_a_per_row_loop, test_generated_greedy_against_a_per_row_loop, test_greedy_compares_float64_in_float64 |
| generate: tokens [B, max_new_tokens] int64, no prefix, no -1 | check_generate_result, every generate test |
| generate: each step gamma draft calls, then ONE target call; the count reported as an int | check_generate_result (draft calls = gamma x target calls; reported is an int equal to the counted calls) |
| generate: each row advances by its own num_accepted + 1 | test_each_row_advances_by_its_own_count (B > 1, rows that keep different numbers of drafts, one-hot models: exactly the slowest row's target calls; advancing the batch by its smallest count takes max_new_tokens calls), test_tokens_per_target_call_match_equation_1 (B = 1), test_whole_sequences_are_distributed_as_the_target (a row advanced past what it kept emits padding) |
| generate: the output follows the target | test_whole_sequences_are_distributed_as_the_target |
| generate: finished rows may keep stepping or be frozen; extra tokens dropped | test_each_row_advances_by_its_own_count (rows finish at different calls; the loop must run until the slowest is done), test_whole_sequences_are_distributed_as_the_target |
| generate: gamma = 0 is plain sampling; max_new_tokens = 0 gives [B, 0] and 0 calls | test_edge_cases_gamma_zero_and_nothing_to_generate |
| generate: prefix not modified | the driver (grader.support.speculative.generate) fails a run that changed it |
| generate: tens of thousands of rows | test_whole_sequences_are_distributed_as_the_target (100,000 rows a call) |
| errors | the contract lists none |

Statistics. Every statistical assertion here is a two-sided bound on a count of independent Bernoulli
trials (a histogram cell, a number of acceptances), from Bernstein's inequality:

    P(|S - n p| >= t) <= 2 exp(-t^2 / (2 (n p (1 - p) + t / 3)))

A histogram is accepted when every cell is within its bound, each bound at the test's false alarm split over
its cells (a union bound), with no large-sample approximation, whatever the seed. Per grade (ALARM_*):
distribution 3e-8 (30 histograms at 1e-9), coupling 4e-8 on the named cases and 4e-8 on the generated families,
whole sequences 2e-9, target calls 1e-9: 1.13e-7 in all, a correct solution fails a grade less than once in
8.8 * 10^6 (before issue 36: 1.57e-7, 57 assertions at 1e-9 and 1e-7 for the generated cases). The deterministic
tests' only chance failures are below 2^-999.

Power (smallest_shift, smallest_shift_for): a test detects a move of delta of probability mass between two
outcomes of a case when it then fails with probability at least 1 - MISS = 0.999. With N_NAMED = 320,000 rows
per named case, distribution and coupling detect delta = 0.0096 (the worst pair of cells, near 1/2); each
generated family gets the fewest FAMILY_ROWS (40,000 to 320,000) whose exact table gives delta <= 0.01 (320,000
give 0.0096 on any table); the whole sequences the fewest SEQUENCE_ROWS per prefix that give delta <= 0.01 on both
tables (100,000 on most seeds; 400,000 give 0.0088 on any table). The target-call count over whole generations is coarse (an acceptance off by about 0.065): the same law,
accepted drafts per target call, is resolved to 1% by the named cases. Before issue 36 the named cases resolved
0.017 and the generated cases 0.11. The inputs and the generators come from the run's seed.
"""

from __future__ import annotations

import itertools
import math
import zlib

import numpy as np
import pytest
import torch

from grader.cases.speculative import ACCEPT
from grader.hidden.speculative.oracle import (
    calls_distribution,
    greedy_oracle,
    one_hot_lockstep_calls,
    one_hot_row_calls,
    oracle_acceptance,
    oracle_tokens_per_step,
    outcome_table,
    sequence_probabilities,
    sum_distribution,
)
from grader.structure import Scaling, assert_flat_on_the_clock, assert_no_hidden_loop, clock
from grader.testing import assert_close, show

V, GAMMA = 10, 4
FALSE_ALARM = 1e-9  # one assertion of the tests that are not split below
# False alarms per grade, by test (each split over its cells; the module docstring adds them up)
ALARM_MARGINALS = 3e-8  # distribution: 6 named cases x 5 positions, 1e-9 each
ALARM_COUPLING = 4e-8  # coupling, the named cases: acceptance per drafted token, the residual, accepted counts
ALARM_FAMILIES = 4e-8  # coupling, one high-power generated case per family
DRIVER = "grader.support.speculative:generate"


@pytest.fixture(scope="module")
def sm(student):
    return student.load("speculative")


def fresh_generator(rng: torch.Generator) -> torch.Generator:
    """A new generator for one call, seeded from the test's rng (the grader's copy never advances)."""
    return torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,), generator=rng)))


def new_seed(rng: torch.Generator) -> int:
    return int(torch.randint(0, 2**62, (1,), generator=rng))


# --------------------------------------------------------------------------------------------------
# Statistics (see the module docstring)


def bernstein_halfwidth(n: int, prob: float, delta: float) -> float:
    """t with P(|Binomial(n, prob) - n prob| >= t) <= delta."""
    log_term = math.log(2 / delta)
    var = n * prob * (1 - prob)
    return log_term / 3 + math.sqrt((log_term / 3) ** 2 + 2 * log_term * var)


def assert_counts(
    counts: torch.Tensor,
    probs: torch.Tensor,
    what: str,
    hint: str,
    name=lambda k: f"token {k}",
    false_alarm: float = FALSE_ALARM,
) -> None:
    """Counts of n independent draws (cell k counted counts[k] times) distributed as `probs`: no cell with
    probability 0, every cell within its Bernstein bound.

    `name(k)` says what cell k is in the message (a token, a whole sequence). A correct sampler fails
    with probability at most `false_alarm` (split over the cells)."""
    counts = counts.double()
    n = int(counts.sum())
    probs = probs.double() / probs.double().sum()
    impossible = (probs == 0) & (counts > 0)
    if impossible.any():
        k = int(impossible.nonzero()[0])
        raise AssertionError(
            f"{what}: {name(k)} has probability 0 but came out {int(counts[k])} times. {hint}"
        )
    if n == 0:
        return
    cells = int((probs > 0).sum())
    worst: tuple[int, float, float] | None = None
    worst_ratio = 0.0
    for k in range(probs.numel()):
        p = float(probs[k])
        if p == 0:
            continue
        half = bernstein_halfwidth(n, p, false_alarm / cells)
        ratio = abs(int(counts[k]) - n * p) / half  # a count: never NaN
        if ratio > worst_ratio:
            worst, worst_ratio = (k, p, half), ratio
    if worst_ratio > 1:
        assert worst is not None  # set with worst_ratio
        k, p, half = worst
        raise AssertionError(
            f"{what}: {name(k)} came out {float(counts[k]) / n:.4f} of the time over {n} samples, but the "
            f"law gives it {p:.4f} (a correct sampler lands within +-{half / n:.4f}, with probability "
            f"1 - {false_alarm:.1g}). {hint}"
        )


def assert_histogram(
    samples: torch.Tensor,
    probs: torch.Tensor,
    what: str,
    hint: str,
    name=lambda k: f"token {k}",
    false_alarm: float = FALSE_ALARM,
) -> None:
    """Samples (cell ids) distributed as `probs`: `assert_counts` on their counts."""
    counts = torch.bincount(samples.long().flatten(), minlength=probs.numel())
    assert_counts(counts[: probs.numel()], probs, what, hint, name, false_alarm)


# Power. A test "detects" a shift of delta when a sampler that moves delta of probability mass from one
# outcome of a case to another fails it with probability at least 1 - MISS. Moving delta * n rows' worth
# of mass changes two cells' counts by delta * n; the move is seen when either count leaves its band:
#     n delta >= bernstein_halfwidth(n, pi, alarm) + bernstein_halfwidth(n, pi +- delta, MISS)
# for the cell's probability pi (Bernstein again, so the statement needs no approximation). The worst
# cells are those near pi = 1/2 (the largest variance); `smallest_shift` takes the worst pair over every
# pi (a statement about the test, whatever its case), `smallest_shift_for` the worst pair of one law's cells.
MISS = 1e-3


def _detects(n: int, prob: float, moved: float, alarm: float) -> bool:
    """A cell of probability `prob` whose count really follows `moved` leaves its band with probability
    >= 1 - MISS (or the move is impossible: a probability outside [0, 1])."""
    if not 0.0 <= moved <= 1.0:
        return True
    if prob == 0.0:  # a count above 0 there fails at once (assert_counts: "has probability 0")
        return (1 - moved) ** n <= MISS
    return n * abs(moved - prob) >= bernstein_halfwidth(n, prob, alarm) + bernstein_halfwidth(n, moved, MISS)


def _needed(n: int, prob: float, alarm: float, up: bool) -> float:
    """The smallest shift (up or down) of a cell of probability `prob` that n draws detect."""
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        if _detects(n, prob, prob + mid if up else prob - mid, alarm):
            hi = mid
        else:
            lo = mid
    return hi


def smallest_shift_for(n: int, probs, alarm: float) -> float:
    """The smallest delta such that moving delta of mass between ANY two cells of this law (probabilities
    `probs`, each cell's band at `alarm`) is detected: the worst pair (source loses, target gains)."""
    probs = [float(x) for x in probs]
    down = [_needed(n, x, alarm, up=False) if x > 0 else 1.0 for x in probs]
    up = [_needed(n, x, alarm, up=True) for x in probs]
    worst = 0.0  # a shift larger than the source cell's probability is impossible: _needed stops there
    for s, d in enumerate(down):
        for t, u in enumerate(up):
            if s != t and probs[s] > 0:
                worst = max(worst, min(d, u))
    return worst


def smallest_shift(n: int, alarm: float) -> float:
    """The worst case over every law: two cells near probability 1/2 (a grid over pi)."""
    grid = [k / 200 for k in range(1, 200)]
    return min(max(_needed(n, x, alarm, up=True) for x in grid), max(_needed(n, x, alarm, up=False) for x in grid))


# --------------------------------------------------------------------------------------------------
# Inputs


def random_dist(
    shape: tuple[int, ...], rng: torch.Generator, sharpness: float = 1.0, floor: float = 0.2
) -> torch.Tensor:
    """Random distributions over the last dim, every token at least floor / V (big histogram cells)."""
    z = torch.randn(shape, generator=rng) * sharpness
    return (1 - floor) * torch.softmax(z, -1) + floor / shape[-1]


def sample_rows(dists: torch.Tensor, n: int, rng: torch.Generator) -> torch.Tensor:
    """[n, positions] tokens, column i drawn from dists[i]."""
    return torch.multinomial(dists, n, replacement=True, generator=rng).t().contiguous()


def named_case(kind: str, rng: torch.Generator, n: int):
    """(p [gamma+1, V], q [gamma, V], draft tokens [n, gamma], acceptance per position, hint) of a named case.

    The draft tokens are drawn from q (except in "empty_residual", see there), so the acceptance at
    position i, among the rows that reach it, is sum(min(p_i, q_i)) (the maximal coupling's rate)."""
    if kind == "random_close":
        z = torch.randn(GAMMA + 1, V, generator=rng)
        p = 0.8 * torch.softmax(z, -1) + 0.02
        q = 0.8 * torch.softmax(z[:GAMMA] + 0.9 * torch.randn(GAMMA, V, generator=rng), -1) + 0.02
        hint = (
            "Accept with probability min(1, p(x)/q(x)), stop at the first rejection, resample from norm(max(0, p - q))."
        )
    elif kind == "random_far":
        p = random_dist((GAMMA + 1, V), rng, sharpness=1.5)
        q = random_dist((GAMMA, V), rng, sharpness=1.5)
        hint = "After a rejection the token must come from norm(max(0, p - q)), not from p or q; p is the target, q the draft."
    elif kind == "equal":
        p = random_dist((GAMMA + 1, V), rng)
        q = p[:GAMMA].clone()
        hint = "With p == q every draft token passes (u <= p/q = 1) and the bonus token comes from p at position gamma."
    elif kind == "disjoint":
        p, q = torch.zeros(GAMMA + 1, V), torch.zeros(GAMMA, V)
        for i in range(GAMMA + 1):
            perm = torch.randperm(V, generator=rng)
            p[i, perm[: V // 2]] = random_dist((V // 2,), rng)
            if i < GAMMA:
                q[i, perm[V // 2 :]] = random_dist((V // 2,), rng)
        hint = (
            "Supports do not overlap: every draft token has p = 0 and must be rejected; the residual is then p itself."
        )
    elif kind == "q_on_zero_of_p":
        p, q = random_dist((GAMMA + 1, V), rng), torch.zeros(GAMMA, V)
        for i in range(GAMMA):
            t = int(torch.randint(0, V, (1,), generator=rng))
            p[i, t] = 0.0
            q[i, t] = 1.0
        p = p / p.sum(-1, keepdim=True)
        hint = (
            "The draft is certain of a token the target forbids: reject it (u > 0 = p/q) and sample max(0, p - q) = p."
        )
    elif kind == "empty_residual":
        # p == q with a token of probability 0 that is drafted anyway in 30% of the rows: rejected (q = 0), and the
        # residual max(0, p - q) is all zeros, so the contract says: sample that row from p.
        p = random_dist((GAMMA + 1, V), rng)
        forbidden = torch.randint(0, V, (GAMMA,), generator=rng)
        p[torch.arange(GAMMA), forbidden] = 0.0
        p = p / p.sum(-1, keepdim=True)
        q = p[:GAMMA].clone()
        draft = sample_rows(q, n, rng)
        swap = torch.rand(n, GAMMA, generator=rng) < 0.3
        draft = torch.where(swap, forbidden.expand(n, GAMMA), draft)
        hint = (
            "p == q, so after the (forced) rejection of a token with q = 0 the residual max(0, p - q) is all "
            "zeros: sample that row from p instead"
        )
        return p, q, draft, torch.full((GAMMA,), 0.7, dtype=torch.float64), hint
    else:
        raise ValueError(kind)
    return p, q, sample_rows(q, n, rng), oracle_acceptance(p[:GAMMA], q), hint


NAMED = ("random_close", "random_far", "equal", "disjoint", "q_on_zero_of_p", "empty_residual")
N_NAMED = 320_000  # rows per named case: smallest_shift(N_NAMED, ...) < 0.01 (see the module docstring)
CHUNK = 80_000  # rows per call: about 30 MB of probabilities, built in the worker (accept_rows); the worker's
# peak memory grows with the largest call (a grade's peak is course.yaml's memory_mb)
ACCEPT_DRIVER = "grader.support.speculative:accept_rows"


def accept_in_chunks(student, sm, case_of_row, draft, q, p, rng, where: str):
    """speculative_accept on len(draft) rows, CHUNK at a time, the probabilities of case case_of_row[b] (q [cases,
    gamma, V], p [cases, gamma + 1, V]) built in the worker; yields (rows, tokens, num_accepted), layout checked."""
    V = p.shape[-1]
    for start in range(0, draft.shape[0], CHUNK):
        rows = slice(start, start + CHUNK)
        d = draft[rows]
        tokens, num_accepted = student.drive(
            ACCEPT_DRIVER, sm.speculative_accept, case_of_row[rows].to(torch.uint8), d.to(torch.uint8), q, p,
            fresh_generator(rng),
        )
        assert_outputs(tokens, num_accepted, d.shape[0], d.shape[1], where)
        check_layout(tokens, num_accepted, d, V)
        yield rows, tokens, num_accepted


def cell_counts(values: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """[positions, V] counts of values[b, i] over the rows b where where[b, i] (one bincount, no masked copies)."""
    positions = values.shape[1]
    codes = torch.arange(positions)[None, :] * V + values.clamp(0, V - 1)
    codes = torch.where(where, codes, positions * V)  # a cell of its own for what is not counted
    return torch.bincount(codes.flatten(), minlength=positions * V + 1)[: positions * V].reshape(positions, V)


class NamedRun:
    """One named case, run once per grade (N_NAMED rows), kept as counts for the tests that read it:

    marginal[i, t]    rows that emitted token t at position i (distribution: each position follows p_i)
    reached[i, t]     rows that reached position i with draft token t there; kept[i, t]: of those, kept it
    after_reject[i, t] rows rejected at position i that then emitted t (the residual's law)
    accepted[k]       rows that accepted exactly k drafts (tokens per target call, equation 1)
    """

    def __init__(self, student, sm, kind: str, rng: torch.Generator):
        self.kind = kind
        self.p, self.q, draft, self.acceptance, self.hint = named_case(kind, rng, N_NAMED)
        self.marginal = torch.zeros(GAMMA + 1, V, dtype=torch.long)
        self.reached = torch.zeros(GAMMA, V, dtype=torch.long)
        self.kept = torch.zeros(GAMMA, V, dtype=torch.long)
        self.after_reject = torch.zeros(GAMMA, V, dtype=torch.long)
        self.accepted = torch.zeros(GAMMA + 1, dtype=torch.long)
        case_of_row = torch.zeros(N_NAMED, dtype=torch.long)
        for rows, tokens, n in accept_in_chunks(
            student, sm, case_of_row, draft, self.q[None], self.p[None], rng, f"[{kind}] speculative_accept"
        ):
            d, at = draft[rows], torch.arange(GAMMA + 1)
            self.accepted += torch.bincount(n, minlength=GAMMA + 1)[: GAMMA + 1]
            self.marginal += cell_counts(tokens, n[:, None] >= at)  # emitted: up to and with position n
            self.reached += cell_counts(d, n[:, None] >= at[:GAMMA])
            self.kept += cell_counts(d, n[:, None] > at[:GAMMA])
            self.after_reject += cell_counts(tokens[:, :GAMMA], n[:, None] == at[:GAMMA])


class NamedRuns:
    """The named cases' runs, made on first use and shared by `distribution` and `coupling` (one set of calls
    serves both: the marginals are the first's, the acceptances and the residual the second's). A call that
    failed fails every test that reads it, with the same error."""

    def __init__(self, student, sm, seed: int):
        self.student, self.sm, self.seed = student, sm, seed
        self.done: dict[str, NamedRun | BaseException] = {}

    def get(self, kind: str) -> NamedRun:
        if kind not in self.done:
            rng = torch.Generator().manual_seed((self.seed * 1_000_003 + zlib.crc32(kind.encode())) % 2**63)
            try:
                self.done[kind] = NamedRun(self.student, self.sm, kind, rng)
            except RuntimeError as exc:
                # torch.multinomial refuses a NaN or inf row: say which case's rows made one
                self.done[kind] = exc if "nan" not in str(exc) else AssertionError(
                    f"[{kind}] speculative_accept raised RuntimeError: {str(exc).removeprefix('RuntimeError: ')}: "
                    "a probability row you sampled from "
                    f"held NaN or inf. In this case: {named_case(kind, torch.Generator().manual_seed(0), 1)[4]} "
                    "(a sum of 0 divided by 0 is NaN)")
            except BaseException as exc:  # noqa: BLE001  (re-raised below, for every test that reads this run)
                self.done[kind] = exc
        run = self.done[kind]
        if isinstance(run, BaseException):
            raise run
        return run


@pytest.fixture(scope="module")
def named(student, sm, seed):
    return NamedRuns(student, sm, seed)


def described(value) -> str:
    """What a call returned, for a message, in bounded space: "torch.int64 [3, 5]" for a tensor."""
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} {show(value.shape)}"
    return f"{type(value).__name__} {show(value)}"


def assert_outputs(tokens, num_accepted, B: int, gamma: int, what: str = "") -> None:
    """tokens [B, gamma + 1] and num_accepted [B], int64 tensors: checked before anything reads their values
    (a reply may hold up to max_result_mb of any shape; the messages below format only what this bounds)."""
    where = f"{what}: " if what else ""
    assert isinstance(tokens, torch.Tensor) and isinstance(num_accepted, torch.Tensor), (
        f"{where}expected tokens and num_accepted as tensors, found {described(tokens)} and {described(num_accepted)}"
    )
    assert tokens.dtype == torch.int64 and num_accepted.dtype == torch.int64, (
        f"{where}tokens and num_accepted must be int64, found {tokens.dtype} and {num_accepted.dtype}"
    )
    assert tuple(tokens.shape) == (B, gamma + 1) and tuple(num_accepted.shape) == (B,), (
        f"{where}expected tokens [{B}, {gamma + 1}] and num_accepted [{B}], found {show(tokens.shape)} and "
        f"{show(num_accepted.shape)}"
    )


def check_layout(tokens, num_accepted, draft, vocab):
    """The contract's layout: int64, accepted prefix, one extra token, then -1."""
    B, gamma = draft.shape
    assert_outputs(tokens, num_accepted, B, gamma)
    assert bool(((num_accepted >= 0) & (num_accepted <= gamma)).all()), "num_accepted must lie in 0..gamma"
    pos = torch.arange(gamma + 1)
    n = num_accepted[:, None]
    prefix_ok = torch.where(pos[:gamma] < n, tokens[:, :gamma] == draft, True).all(1)
    extra = tokens.gather(1, num_accepted[:, None]).squeeze(1)
    extra_ok = (extra >= 0) & (extra < vocab)
    tail_ok = torch.where(pos > n, tokens == -1, True).all(1)
    bad = ~(prefix_ok & extra_ok & tail_ok)
    if bad.any():
        b = int(bad.nonzero()[0])
        k = int(num_accepted[b])
        bonus = (f" All {gamma} drafts were accepted, so the extra token is the bonus, drawn from target_probs[:, gamma]."
                 if k == gamma and not bool(extra_ok[b]) else "")
        raise AssertionError(
            f"row {b}: num_accepted = {k} and tokens = {show(tokens[b])} for draft {show(draft[b])}. "
            f"Expected the first {k} draft tokens, then one token in [0, {vocab}), then -1 up to the end: "
            "stop at the first rejection, emit exactly one extra token, and pad the rest with -1." + bonus
        )


# --------------------------------------------------------------------------------------------------
# Formulas


@pytest.mark.check("formulas")
def test_acceptance_rate_on_random_batches(sm, rng):
    p = torch.softmax(torch.randn(3, 5, 17, generator=rng, dtype=torch.float64) * 2, -1)
    q = torch.softmax(torch.randn(3, 5, 17, generator=rng, dtype=torch.float64) * 2, -1)
    got = sm.acceptance_rate(p, q)
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == (3, 5), (
        f"expected a tensor of shape [3, 5] (one rate per distribution), found {described(got)}"
    )
    want = oracle_acceptance(p, q)
    assert_close(
        got,
        want,
        atol=1e-6,
        what="acceptance_rate [batch, position]",
        hint="It is sum over the vocabulary of min(p(x), q(x))",
    )
    same = sm.acceptance_rate(p, p)
    assert_close(
        same,
        torch.ones(3, 5, dtype=torch.float64),
        atol=1e-8,
        rtol=1e-5,
        what="acceptance_rate(p, p)",
        hint="It must be 1",
    )
    assert_close(
        sm.acceptance_rate(q, p),
        got,
        atol=1e-8,
        rtol=1e-5,
        what="acceptance_rate(q, p) against acceptance_rate(p, q)",
        hint="min(p, q) is symmetric",
    )


@pytest.mark.check("formulas")
@pytest.mark.parametrize("shape", [(17,), (2, 3, 4, 9)])
def test_acceptance_rate_over_the_last_dim_of_any_shape(sm, rng, shape):
    """Tensor[..., V] -> Tensor[...]: one vocabulary (a 0-d result) and four dims, in float32."""
    p = torch.softmax(torch.randn(shape, generator=rng) * 2, -1)
    q = torch.softmax(torch.randn(shape, generator=rng) * 2, -1)
    try:
        got = sm.acceptance_rate(p, q)
    except IndexError as exc:
        raise AssertionError(
            f"acceptance_rate of two {show(shape)} tensors raised IndexError "
            f"({str(exc).removeprefix('IndexError: ')}): the sum runs over the LAST dim "
            "(dim=-1), whatever the number of leading dims, not over a fixed dim"
        ) from None
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == shape[:-1], (
        f"acceptance_rate of two {show(shape)} tensors: expected a tensor of shape {show(shape[:-1])} (the sum runs over "
        f"the LAST dim, whatever the leading dims), found {described(got)}"
    )
    assert_close(got, oracle_acceptance(p, q), atol=1e-6, what=f"acceptance_rate {show(shape)}",
                 hint="It is sum over the last dim of min(p(x), q(x))")


@pytest.mark.check("formulas")
@pytest.mark.parametrize("gamma", [0, 1, 4, 7])
def test_expected_tokens_per_step_on_floats(sm, gamma):
    for alpha in [0.0, 0.25, 0.6, 0.9, 0.999, 1 - 1e-9]:
        value = sm.expected_tokens_per_step(alpha, gamma)
        assert isinstance(value, float), (
            f"expected_tokens_per_step({alpha}, {gamma}): a float alpha gives a float, found {described(value)}"
        )
        got = float(value)
        want = oracle_tokens_per_step(alpha, gamma)
        assert_close(
            got,
            want,
            atol=0.0,
            rtol=1e-9 if alpha < 0.9999 else 1e-5,
            what=f"expected_tokens_per_step({alpha}, {gamma})",
            hint="It is (1 - alpha^(gamma+1)) / (1 - alpha)" + (
                f"; yours is 1 + alpha + ... + alpha^(gamma - 1) = {want - alpha ** gamma:.12g}, the sum without the "
                "bonus term alpha^gamma (all gamma drafts accepted, plus the bonus token)"
                if gamma > 0 and abs(got - (want - alpha ** gamma)) <= 1e-9 * max(1.0, abs(want)) else ""),
        )
    at_one = sm.expected_tokens_per_step(1.0, gamma)
    assert float(at_one) == gamma + 1, (
        f"at alpha = 1 every draft is accepted: the limit is gamma + 1 = {gamma + 1}, found {float(at_one)} "
        "(the closed form divides 0 by 0 there)"
    )


@pytest.mark.check("formulas")
def test_expected_tokens_per_step_elementwise_and_near_one(sm, rng):
    gamma = 5
    alpha = torch.cat(
        [
            torch.rand(2, 6, generator=rng, dtype=torch.float64).flatten(),
            torch.tensor([0.0, 1.0, 1 - 1e-9, 1 - 1e-6], dtype=torch.float64),
        ]
    ).reshape(4, 4)
    got = sm.expected_tokens_per_step(alpha, gamma)
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == (4, 4), (
        "a tensor alpha gives a tensor of the same shape"
    )
    assert not torch.isnan(got).any(), f"NaN in {show(got)}: alpha = 1 must give gamma + 1, not 0/0"
    want = torch.tensor(
        [oracle_tokens_per_step(a, gamma) for a in alpha.flatten().tolist()], dtype=torch.float64
    ).reshape(4, 4)
    assert_close(
        got,
        want,
        atol=0.0,
        rtol=1e-5,
        what="elementwise expected_tokens_per_step",
        hint=lambda at: (
            f"There alpha = {float(alpha[at]):.12g}. "
            "Just below alpha = 1 the closed form loses digits: the sum 1 + alpha + ... + alpha^gamma does not"
        ),
    )


@pytest.mark.check("formulas")
def test_expected_speedup(sm, rng):
    for alpha, gamma, c in [(0.8, 4, 0.05), (0.6, 3, 0.0), (0.5, 7, 0.2), (1.0, 2, 0.1), (0.0, 3, 0.01)]:
        try:
            value = sm.expected_speedup(alpha, gamma, c)
        except ZeroDivisionError as exc:
            raise AssertionError(
                f"expected_speedup({alpha}, {gamma}, {c}) raised ZeroDivisionError "
                f"({str(exc).removeprefix('ZeroDivisionError: ')}): the closed form "
                "(1 - alpha^(gamma+1)) / (1 - alpha) divides 0 by 0 at alpha = 1, where the limit is gamma + 1 tokens "
                "per step: sum alpha^0 + ... + alpha^gamma instead (expected_tokens_per_step), then divide by gamma * c + 1"
            ) from None
        assert isinstance(value, float), (
            f"expected_speedup({alpha}, {gamma}, {c}): a float alpha gives a float, found {described(value)}"
        )
        got = float(value)
        want = oracle_tokens_per_step(alpha, gamma) / (gamma * c + 1)
        assert_close(
            got,
            want,
            atol=0.0,
            rtol=1e-9,
            what=f"expected_speedup({alpha}, {gamma}, {c})",
            hint=(
                "Tokens per step "
                "(1 - alpha^(gamma+1)) / (1 - alpha), over the cost of a step, gamma * c + 1 target passes"
            ),
        )
    alpha = torch.cat(
        [torch.rand(7, generator=rng, dtype=torch.float64), torch.tensor([1.0, 0.0, 1 - 1e-9], dtype=torch.float64)]
    )
    got = sm.expected_speedup(alpha, 3, 0.1)
    want = torch.tensor([oracle_tokens_per_step(a, 3) / 1.3 for a in alpha.tolist()], dtype=torch.float64)
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == (10,), "a tensor alpha gives a tensor of the same shape"
    assert not torch.isnan(got).any(), (
        f"NaN in {show(got)} for alpha = {show(alpha)}: at alpha = 1 use the limit, gamma + 1 tokens"
    )
    assert_close(
        got,
        want,
        atol=1e-8,
        rtol=1e-5,
        what="expected_speedup(alpha, 3, 0.1)",
        hint=lambda at: f"There alpha = {float(alpha[at]):.12g}. Elementwise, tokens per step over gamma * c + 1",
    )


# --------------------------------------------------------------------------------------------------
# Distribution: every emitted position follows the target (N_NAMED rows per named case)


@pytest.mark.check("distribution")
@pytest.mark.parametrize("kind", NAMED)
def test_each_position_is_distributed_as_the_target(named, sm, kind):
    """Among the rows that emit position i, its token follows p_i (the bonus at i = gamma included): what any
    exact sampler of the target gives, speculative or not. Power: see the module docstring (ALARM_MARGINALS).
    A failure says which step of the rule the same rows broke (`which_step_is_off`)."""
    run = named.get(kind)
    for i in range(GAMMA + 1):
        try:
            assert_counts(
                run.marginal[i],
                run.p[i],
                f"[{kind}] position {i} (the {'bonus' if i == GAMMA else 'emitted'} token, {int(run.marginal[i].sum())} rows "
                "emitted it)",
                run.hint,
                false_alarm=ALARM_MARGINALS / (len(NAMED) * (GAMMA + 1)),
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc} {which_step_is_off(sm, run)}") from None


def which_step_is_off(sm, run) -> str:
    """The step of the rule the rows broke, for a failed marginal: first whether a row stops at its first rejection
    (a second call whose answer is certain: position 0's draft has p = 0, position 1's has p = q = 1), then, on the
    run's own rows, the keep rate of each drafted token against min(1, p/q), then the law of the token drawn after
    a rejection against norm(max(0, p - q)). Each bound at FALSE_ALARM per cell; '' when none of them is off."""
    draft = torch.tensor([[0, 1]]).expand(64, 2)
    q = torch.nn.functional.one_hot(draft, 4).double()
    p = torch.tensor([[0.0, 0.5, 0.25, 0.25], [0.0, 1.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]]).double().expand(64, 3, 4)
    try:
        _, num_accepted = sm.speculative_accept(draft, q.contiguous(), p.contiguous(), torch.Generator().manual_seed(0))
    except Exception:  # noqa: BLE001  (the failed marginal is the verdict; this call only explains it)
        num_accepted = None
    if isinstance(num_accepted, torch.Tensor) and tuple(num_accepted.shape) == (64,) and bool((num_accepted > 0).any()):
        return (f"The step that is off: a second call, gamma = 2, where position 0's draft token has p = 0 (always "
                f"rejected) and position 1's has p = q = 1 (always kept), returned num_accepted = "
                f"{int(num_accepted.max())} in {int((num_accepted > 0).sum())} of 64 rows: you counted draft tokens "
                "after the first rejection. A row stops at its first rejection: num_accepted counts the LEADING "
                "accepted drafts (a cumprod along the positions, then a sum).")
    def matches(m: int, k: int, a: float) -> bool:
        half = 0.0 if a in (0.0, 1.0) else bernstein_halfwidth(m, a, FALSE_ALARM)
        return abs(k - m * a) <= half

    def every_cell_follows(law) -> bool:  # a whole other rule, told apart only when all the rows fit it
        return all(matches(int(run.reached[i, t]), int(run.kept[i, t]), law(i, t))
                   for i in range(GAMMA) for t in range(V) if int(run.reached[i, t]) > 0)

    swapped = every_cell_follows(lambda i, t: keep_probability(float(run.q[i, t]), float(run.p[i, t])))
    shifted = every_cell_follows(lambda i, t: keep_probability(float(run.p[i + 1, t]), float(run.q[i, t])))
    position_0_right = True
    for i in range(GAMMA):
        for t in range(V):
            m, k = int(run.reached[i, t]), int(run.kept[i, t])
            pt, qt = float(run.p[i, t]), float(run.q[i, t])
            a = keep_probability(pt, qt)
            if m == 0 or matches(m, k, a):
                continue
            if i == 0:
                position_0_right = False
            why = ""
            if swapped and not shifted:
                why = (f"; that is min(1, q/p) = {keep_probability(qt, pt):.4f}, and every drafted token's keep rate "
                       "fits min(1, q/p): p is the target (target_probs), q the draft (draft_probs)")
            elif shifted and not swapped:
                why = (f"; that is min(1, p_{i + 1}(x)/q_{i}(x)), and every drafted token's keep rate fits that "
                       "shifted rule: draft token i is scored with target row i (target_probs[:, i]), not row i + 1")
            elif m >= 100 and 0.0 < a < 1.0 and k in (0, m):
                why = ("; every one of those rows decided alike, which independent coins do not do: is one u shared "
                       "by the rows?")
            elif position_0_right and i > 0 and k > m * a:
                why = (f"; position 0 follows the rule, but rows that reached position {i} keep more often: their coins "
                       "were small to get there, so are a row's coins reused across positions?")
            return (f"The step that is off, in the same rows: at position {i}, draft token {t} was kept in {k} of "
                    f"the {m} rows that reached it ({k / m:.4f}), where the rule keeps it with probability "
                    f"min(1, p/q) = min(1, {pt:.4g}/{qt:.4g}) = {a:.4f}{why}{'' if why.endswith('?') else '.'} "
                    "The acceptance test: keep x when "
                    "u <= p(x)/q(x), p the target's row i, q the draft's, one fresh u per row and position.")
    for i in range(GAMMA):
        want = residual_of(run.p[i], run.q[i])
        try:
            assert_counts(run.after_reject[i], want, f"position {i}", "", false_alarm=FALSE_ALARM)
        except AssertionError as exc:
            return (f"The step that is off, in the same rows: the token drawn after a rejection at position {i} "
                    f"({str(exc).removeprefix(f'position {i}: ').strip().rstrip('.')}) does not follow the residual "
                    "norm(max(0, p_i - q_i)) (p_i where that is all zeros): sample it from the residual, not from "
                    "p_i or q_i.")
    return ""


# --------------------------------------------------------------------------------------------------
# Coupling (the signature): how the draft and the target are coupled, not only what comes out.
#
# Sampling y_i from p_i and keeping the draft when y_i == x_i (or never keeping it) emits every position
# with the right law too; what makes it speculative decoding is the maximal coupling: x is kept with
# probability min(1, p(x)/q(x)), so a position is accepted with probability sum(min(p, q)) (the most any
# rule that leaves the output exact can keep), the rejected position is redrawn from norm(max(0, p - q)),
# and the tokens per target call follow equation 1. These tests observe exactly that: per drafted token,
# the fraction kept; per position, the law of the token drawn after a rejection; per case, the law of the
# number of accepted drafts.


def residual_of(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) in float64, or p where that is all zeros (the contract's fallback)."""
    r = (p.double() - q.double()).clamp(min=0)
    return r / r.sum() if float(r.sum()) > 0 else p.double() / p.double().sum()


def keep_probability(p: float, q: float) -> float:
    return 0.0 if q == 0 else min(1.0, p / q)


TEXTBOOK = (
    "Sampling y from the target and keeping the draft token when y == x (or rejecting every draft and sampling "
    "from p) gives each position the right law but keeps x only with probability p(x) (or never): that is not "
    "speculative decoding's coupling, and it spends more target calls per token than equation 1 promises."
)


@pytest.mark.check("coupling")
@pytest.mark.parametrize("kind", NAMED)
def test_the_coupling_on_the_named_cases(named, kind):
    run = named.get(kind)
    cells = (GAMMA + 1) + 2 * GAMMA * V  # the assertions' cells below, each at alarm / cells
    alarm = ALARM_COUPLING / len(NAMED) / cells
    # 1. Per position and drafted token: kept with probability min(1, p/q), a fresh coin per row and position.
    for i in range(GAMMA):
        for t in range(V):
            m, k = int(run.reached[i, t]), int(run.kept[i, t])
            if m == 0:
                continue
            pt, qt = float(run.p[i, t]), float(run.q[i, t])
            a = keep_probability(pt, qt)
            half = 0.0 if a in (0.0, 1.0) else bernstein_halfwidth(m, a, alarm)
            assert abs(k - m * a) <= half, (
                f"[{kind}] position {i}: draft token {t} was kept in {k} of the {m} rows that reached it "
                f"({k / m:.4f}), where the rule keeps it with probability min(1, p/q) = min(1, {pt:.4g}/{qt:.4g}) = "
                f"{a:.4f}" + (f" (+-{half / m:.4f} at probability 1 - {alarm:.1g})" if half else " (for certain)")
                + ". Keep x when u <= p(x)/q(x), u uniform on (0, 1], one fresh u per row and position. " + TEXTBOOK
            )
    # 2. After a rejection at position i: the token comes from norm(max(0, p_i - q_i)).
    for i in range(GAMMA):
        assert_counts(
            run.after_reject[i],
            residual_of(run.p[i], run.q[i]),
            f"[{kind}] position {i}, the token drawn after a rejection there ({int(run.after_reject[i].sum())} rows)",
            "After a rejection at position i the token comes from the residual norm(max(0, p_i - q_i)) (p_i where "
            "that is all zeros), not from p_i or q_i: only then are the kept and the redrawn tokens together exactly "
            "p, with the most drafts kept.",
            false_alarm=alarm * V,
        )
    # 3. The number of accepted drafts: P(n >= k) = alpha_0 ... alpha_{k-1}, alpha_i = sum(min(p_i, q_i)).
    alpha = [float(x) for x in run.acceptance]
    survive = [math.prod(alpha[:k]) for k in range(GAMMA + 1)]
    law = torch.tensor([survive[k] - survive[k + 1] if k < GAMMA else survive[GAMMA] for k in range(GAMMA + 1)])
    n = int(run.accepted.sum())
    mean = float((run.accepted.double() * torch.arange(GAMMA + 1)).sum()) / n + 1
    assert_counts(
        run.accepted,
        law,
        f"[{kind}] the number of accepted drafts per row",
        f"Your rows emitted {mean:.4f} tokens per target call on average; equation 1 with alpha_i = sum(min(p_i, q_i)) = "
        f"{show([round(x, 4) for x in alpha])} predicts {float((law * torch.arange(1, GAMMA + 2)).sum()):.4f}. "
        + TEXTBOOK,
        name=lambda k: f"'{k} drafts accepted'",
        false_alarm=alarm * (GAMMA + 1),
    )


# --------------------------------------------------------------------------------------------------
# Rules: deterministic consequences of the contract


@pytest.mark.check("accept_rules")
def test_a_token_the_target_forbids_is_never_emitted(sm, rng):
    B = 4000
    p = random_dist((B, GAMMA + 1, V), rng)
    forbidden = torch.randint(0, V, (B, GAMMA), generator=rng)
    p[:, :GAMMA].scatter_(-1, forbidden[..., None], 0.0)
    p = p / p.sum(-1, keepdim=True)
    q = torch.nn.functional.one_hot(forbidden, V).float()
    tokens, num_accepted = sm.speculative_accept(forbidden, q, p, fresh_generator(rng))
    check_layout(tokens, num_accepted, forbidden, V)
    assert bool((num_accepted == 0).all()), (
        f"{int((num_accepted > 0).sum())} rows accepted a draft token whose target probability is 0: "
        "u must be uniform on (0, 1] so that u <= p/q = 0 never holds"
    )
    hit = tokens[:, 0] == forbidden[:, 0]
    assert not hit.any(), (
        f"row {int(hit.nonzero()[0])} emitted its forbidden token: after a rejection sample max(0, p - q), not q"
    )


@pytest.mark.check("coupling")
def test_p_equal_q_never_rejects(sm, rng):
    """The coupling at its extreme: with p == q the rule keeps every draft (u <= p/q = 1), where a sampler that
    only gets each position's law right (y ~ p, keep x when y == x) rejects most of them."""
    B = 4000
    p = random_dist((B, GAMMA + 1, V), rng, floor=0.0)
    q = p[:, :GAMMA].clone()
    draft = torch.multinomial(q.reshape(-1, V), 1, generator=rng).reshape(B, GAMMA)
    tokens, num_accepted = sm.speculative_accept(draft, q, p, fresh_generator(rng))
    check_layout(tokens, num_accepted, draft, V)
    assert bool((num_accepted == GAMMA).all()), (
        f"{int((num_accepted < GAMMA).sum())} rows rejected a draft token although p == q: u <= p/q = 1 always holds "
        "when u is uniform on (0, 1]"
    )
    assert bool((tokens[:, GAMMA] >= 0).all()), (
        "all gamma accepted: the bonus token from p at position gamma must follow"
    )


@pytest.mark.check("accept_rules")
def test_a_draft_token_with_q_zero_is_rejected(sm, rng):
    B = 3000
    p = random_dist((B, GAMMA + 1, V), rng)
    q = random_dist((B, GAMMA, V), rng)
    draft = torch.multinomial(q.reshape(-1, V), 1, generator=rng).reshape(B, GAMMA)
    at = torch.randint(0, GAMMA, (B,), generator=rng)
    q[torch.arange(B), at, draft[torch.arange(B), at]] = 0.0  # this token "could not have been drafted"
    q = q / q.sum(-1, keepdim=True)
    tokens, num_accepted = sm.speculative_accept(draft, q, p, fresh_generator(rng))
    check_layout(tokens, num_accepted, draft, V)
    over = num_accepted > at
    assert not over.any(), (
        f"row {int(over.nonzero()[0])} accepted a draft token with q(x) = 0 (p(x) > 0, so p/q is infinite): "
        "the contract rejects it"
    )
    assert not torch.isnan(tokens.float()).any()


@pytest.mark.check("accept_rules")
def test_an_empty_residual_gives_a_token_of_p_not_nan(sm, rng):
    """p == q, and the drafted token has p = q = 0: rejected, residual all zeros, so sample from p."""
    B = 2000
    p = random_dist((B, GAMMA + 1, V), rng)
    draft = torch.randint(0, V, (B, GAMMA), generator=rng)
    p[:, :GAMMA].scatter_(-1, draft[..., None], 0.0)
    p = p / p.sum(-1, keepdim=True)
    q = p[:, :GAMMA].clone()
    tokens, num_accepted = sm.speculative_accept(draft, q, p, fresh_generator(rng))
    check_layout(tokens, num_accepted, draft, V)
    assert bool((num_accepted == 0).all()), "the first draft token has q = 0 (and p = 0): it must be rejected"
    picked = p[torch.arange(B), 0, tokens[:, 0]]
    assert bool((picked > 0).all()), (
        f"row {int((picked == 0).nonzero()[0])} emitted a token with p = 0 after a rejection whose residual "
        "max(0, p - q) is all zeros (p == q): the contract says sample that row from p"
    )


@pytest.mark.check("accept_rules")
def test_the_empty_residual_fallback_is_per_row(sm, rng):
    """Half the rows have an empty residual (fall back to p); the other half have a residual that is NOT p.

    Normal rows: the draft is sure of token a (q = one-hot a) and the target gives a probability 1/2,
    so a is kept half the time, and after a rejection the residual max(0, p - q) is p with a removed:
    a rejected normal row can never emit a. Falling back to p for the whole batch as soon as ONE row
    has an empty residual would emit a in about half of those rows."""
    B = 4000
    rows = torch.arange(B)
    empty = torch.rand(B, generator=rng) < 0.5
    token = torch.randint(0, V, (B,), generator=rng)  # a for normal rows, the forbidden token for empty rows
    p = random_dist((B, GAMMA + 1, V), rng)
    p[rows, 0, token] = 0.0
    p[:, 0] = p[:, 0] / p[:, 0].sum(-1, keepdim=True)
    normal_p0 = 0.5 * p[:, 0] + 0.5 * torch.nn.functional.one_hot(token, V).float()
    p[:, 0] = torch.where(empty[:, None], p[:, 0], normal_p0)
    q = torch.where(empty[:, None, None], p[:, :GAMMA], random_dist((B, GAMMA, V), rng))
    q[:, 0] = torch.where(empty[:, None], p[:, 0], torch.nn.functional.one_hot(token, V).float())
    draft = torch.multinomial(q.reshape(-1, V), 1, generator=rng).reshape(B, GAMMA)
    draft[:, 0] = token  # empty rows: q = p = 0 there, rejected; normal rows: the draft's only choice
    tokens, num_accepted = sm.speculative_accept(draft, q, p, fresh_generator(rng))
    check_layout(tokens, num_accepted, draft, V)
    assert bool((num_accepted[empty] == 0).all()), "a draft token with q = 0 (and p = 0) must be rejected"
    picked = p[rows, 0, tokens[:, 0]]
    bad = empty & (picked == 0)
    assert not bad.any(), (
        f"row {int(bad.nonzero()[0])} has an empty residual (p == q) and emitted a token with p = 0: sample that row from p"
    )
    rejected = ~empty & (num_accepted == 0)
    kept_normal, normal = int((~empty & (num_accepted > 0)).sum()), int((~empty).sum())
    assert bool(rejected.any()) and kept_normal > 0, (
        f"in the {normal} rows whose draft is sure of token a (q(a) = 1) and whose target gives it p(a) = 1/2, "
        f"{kept_normal} kept it: the acceptance test keeps x when u <= p(x)/q(x), here with probability "
        "min(1, p(a)/q(a)) = 1/2, so about half of them keep it and half reject it"
    )
    leak = rejected & (tokens[:, 0] == token)
    assert not leak.any(), (
        f"{int(leak.sum())} of {int(rejected.sum())} rows rejected draft token a and then emitted a again, although their "
        "residual max(0, p - q) gives a probability 0. Other rows of the batch have an empty residual: fall back to p "
        "only in THOSE rows (torch.where on each row's residual sum), never for the whole batch"
    )


@pytest.mark.check("accept_rules")
def test_gamma_zero_is_one_draw_from_p0(sm, rng):
    """gamma = 0: tokens [B, 1], one draw from p_0. Half the rows have a one-hot p_0 (one possible token), the
    other half two tokens of probability 1/2 each: both must come out (a correct sampler misses one of them with
    probability 2 * 2^-1000), and no token of probability 0."""
    B = 2000
    rows = torch.arange(B)
    first = torch.randint(0, V, (B,), generator=rng)
    second = (first + torch.randint(1, V, (B,), generator=rng)) % V
    certain = rows < B // 2
    p = torch.zeros(B, 1, V)
    p[rows, 0, first] = torch.where(certain, 1.0, 0.5)
    p[rows[~certain], 0, second[~certain]] = 0.5
    tokens, num_accepted = sm.speculative_accept(
        torch.zeros(B, 0, dtype=torch.long), torch.zeros(B, 0, V), p, fresh_generator(rng)
    )
    assert_outputs(tokens, num_accepted, B, 0, "gamma = 0")
    assert bool((num_accepted == 0).all()), "gamma = 0: num_accepted must be all 0 (there is no draft token to accept)"
    assert bool(((tokens >= 0) & (tokens < V)).all()), "gamma = 0: the one token is the bonus, sampled from p_0"
    wrong = certain & (tokens[:, 0] != first)
    assert not wrong.any(), (
        f"gamma = 0, row {int(wrong.nonzero()[0])}: p_0 is one-hot at token {int(first[int(wrong.nonzero()[0])])}, "
        f"found {int(tokens[int(wrong.nonzero()[0]), 0])}: the one token is a draw from target_probs[:, 0]"
    )
    other = tokens[~certain, 0]
    outside = (other != first[~certain]) & (other != second[~certain])
    assert not outside.any(), "gamma = 0: a token of probability 0 under p_0 came out: draw from target_probs[:, 0]"
    lower = int((other == torch.minimum(first, second)[~certain]).sum())  # the argmax's choice on a tie
    assert 0 < lower < int((~certain).sum()), (
        f"gamma = 0: in {int((~certain).sum())} rows whose p_0 gives two tokens 1/2 each, the lower of the two came out "
        f"{lower} times: the one token must be a random draw from p_0 (torch.multinomial with the generator), not its "
        "argmax"
    )


@pytest.mark.check("accept_rules")
def test_rows_do_not_interfere(sm, rng):
    """Rows with one-hot p == q have one possible outcome, whatever their neighbours do."""
    B = 3000
    p = random_dist((B, GAMMA + 1, V), rng, sharpness=2.0)
    q = random_dist((B, GAMMA, V), rng, sharpness=2.0)
    certain = torch.rand(B, generator=rng) < 0.5
    fixed = torch.randint(0, V, (B, GAMMA + 1), generator=rng)
    one_hot = torch.nn.functional.one_hot(fixed, V).float()
    p = torch.where(certain[:, None, None], one_hot, p)
    q = torch.where(certain[:, None, None], one_hot[:, :GAMMA], q)
    draft = torch.multinomial(q.reshape(-1, V), 1, generator=rng).reshape(B, GAMMA)
    tokens, num_accepted = sm.speculative_accept(draft, q, p, fresh_generator(rng))
    check_layout(tokens, num_accepted, draft, V)
    wrong = certain & ~(tokens == fixed).all(1)
    assert not wrong.any(), (
        f"row {int(wrong.nonzero()[0])} has one-hot p == q, so it must come out as {show(fixed[int(wrong.nonzero()[0])])}, "
        f"found {show(tokens[int(wrong.nonzero()[0])])}: is one row's outcome leaking into another's "
        "(a batch-wide count, a shared position)?"
    )
    assert bool((num_accepted[~certain] < GAMMA).any()), "the random rows should see some rejections"


@pytest.mark.check("accept_rules")
def test_inputs_are_left_alone_and_float64_works(sm, rng):
    B = 500
    p = random_dist((B, GAMMA + 1, V), rng).double()
    q = random_dist((B, GAMMA, V), rng).double()
    draft = torch.multinomial(q.reshape(-1, V), 1, generator=rng).reshape(B, GAMMA)
    copies = (draft.clone(), q.clone(), p.clone())
    tokens, num_accepted = sm.speculative_accept(draft, q, p, fresh_generator(rng))
    check_layout(tokens, num_accepted, draft, V)
    for name, before, after in zip(("draft_tokens", "draft_probs", "target_probs"), copies, (draft, q, p)):
        assert torch.equal(before, after), f"speculative_accept changed its input {name}: work on new tensors"


# --------------------------------------------------------------------------------------------------
# Greedy


def probs_with_argmax(best: list[list[int]], vocab: int = 100) -> torch.Tensor:
    """Target probabilities whose argmax at each position is the given token (vLLM's test tables)."""
    logits = torch.full((len(best), len(best[0]), vocab), -10.0)
    for b, row in enumerate(best):
        for i, t in enumerate(row):
            logits[b, i, t] = 10.0
    return torch.softmax(logits, -1)


VLLM_GREEDY_TABLES = [
    # (draft tokens, target argmax at each of the gamma + 1 positions, expected tokens)
    ([[1, 2, 3]], [[1, 2, 3, 4]], [[1, 2, 3, 4]]),  # all accepted, bonus 4
    ([[1, 2, 3]], [[1, 5, 3, 4]], [[1, 5, -1, -1]]),  # mismatch in the middle
    ([[1, 2]], [[1, 2, 5]], [[1, 2, 5]]),  # one sequence of a batch
    ([[3]], [[3, 4]], [[3, 4]]),  # ... and the other
    ([[1]], [[1, 2]], [[1, 2]]),  # a single draft token
    ([[]], [[5]], [[5]]),  # no draft tokens: the bonus
    ([[1, 2, 3], [4, 5, 6]], [[1, 2, 7, 6], [4, 8, 6, 9]], [[1, 2, 7, -1], [4, 8, -1, -1]]),
    ([[1, 2]], [[1, 2, 3]], [[1, 2, 3]]),
    ([[1]], [[2, 3]], [[2, -1]]),  # first token wrong
    ([[1, 2], [3, 4]], [[1, 5, 6], [3, 4, 7]], [[1, 5, -1], [3, 4, 7]]),  # mixed rows
]


@pytest.mark.check("greedy")
@pytest.mark.parametrize("case", range(len(VLLM_GREEDY_TABLES)))
def test_greedy_tables_from_vllm(sm, case):
    draft, best, expected = VLLM_GREEDY_TABLES[case]
    draft_tokens = torch.tensor(draft, dtype=torch.long).reshape(len(draft), -1)
    tokens, num_accepted = sm.greedy_accept(draft_tokens, probs_with_argmax(best))
    assert_outputs(tokens, num_accepted, *draft_tokens.shape, f"greedy_accept, draft {draft}")
    assert tokens.tolist() == expected, (
        f"draft {draft} against target argmax {best}: expected {expected}, found {show(tokens)}. "
        "Keep draft tokens while they equal the argmax; at the first mismatch emit the argmax and stop (-1 after); "
        "if all match, add the argmax of the last position"
        + greedy_table_hint(draft, best, tokens[:16, :16].tolist())  # the tables are a few tokens
    )
    want_n = [sum(1 for t in row if t != -1) - 1 for row in expected]
    assert num_accepted.tolist() == want_n, f"num_accepted should be {want_n}, found {show(num_accepted)}"


def greedy_table_hint(draft: list, best: list, found: list) -> str:
    """The rule a wrong row of a greedy table breaks: a missing bonus (every draft matched, the last position holds
    -1), or draft tokens kept after the first mismatch."""
    for d, b, f in zip(draft, best, found):
        gamma = len(d)
        if d == b[:gamma] and f[:gamma] == d and f[gamma] == -1:
            return (f". Draft {d} matches the argmax everywhere, and the bonus is missing: when every draft token "
                    f"matches, emit the argmax of the last position ({b[gamma]}) after them")
        miss = next((i for i in range(gamma) if d[i] != b[i]), None)
        if miss is not None and f[miss] == d[miss]:
            return (f". Draft {d} first differs from the argmax at position {miss}, and you kept draft token "
                    f"{d[miss]} there: the first mismatch ends the row (emit the argmax {b[miss]}, then -1), even if "
                    "later draft tokens match again")
    return ""


@pytest.mark.check("greedy")
def test_greedy_random_batches_match_a_per_row_loop(sm, rng):
    B, gamma, vocab = 300, 5, 6
    target = torch.softmax(torch.randn(B, gamma + 1, vocab, generator=rng) * 3, -1)
    best = target.argmax(-1)
    noise = torch.randint(0, vocab, (B, gamma), generator=rng)
    draft = torch.where(torch.rand(B, gamma, generator=rng) < 0.75, best[:, :gamma], noise)
    tokens, num_accepted = sm.greedy_accept(draft, target)
    assert_outputs(tokens, num_accepted, B, gamma, "greedy_accept")
    want, counts = greedy_oracle(draft, target)
    got = tokens.tolist()
    for b in range(B):
        assert got[b] == want[b], (
            f"row {b}: draft {show(draft[b])}, target argmax {show(best[b])}: expected {want[b]}, found {got[b]}"
        )
    assert num_accepted.tolist() == counts, "num_accepted must count the draft tokens kept in each row"


@pytest.mark.check("greedy")
def test_greedy_compares_float64_in_float64(sm, rng):
    """float64 targets whose best token beats a lower id by 1e-12: distinct in float64, a tie once rounded to
    float32 (where the lower id would win). The argmax is taken in the input's own precision."""
    B, gamma = 200, 3
    best = torch.randint(1, V, (B, gamma + 1), generator=rng)
    runner = (torch.rand(B, gamma + 1, generator=rng) * best).long()  # a lower id, in [0, best)
    target = torch.full((B, gamma + 1, V), (1 - 0.375 - (0.375 - 1e-12)) / (V - 2), dtype=torch.float64)
    target.scatter_(-1, best[..., None], 0.375)
    target.scatter_(-1, runner[..., None], 0.375 - 1e-12)
    draft = best[:, :gamma].clone()
    tokens, num_accepted = sm.greedy_accept(draft, target)
    assert_outputs(tokens, num_accepted, B, gamma, "greedy_accept, float64")
    wrong = ~(tokens == best).all(1)
    assert not wrong.any(), (
        f"greedy_accept, float64, row {int(wrong.nonzero()[0])}: the target's argmax is {show(best[int(wrong.nonzero()[0])])} "
        f"(0.375 against 0.375 - 1e-12 at a lower id), the drafts match it, so expected {show(best[int(wrong.nonzero()[0])])}; "
        f"found {show(tokens[int(wrong.nonzero()[0])])}. Take the argmax of target_probs as given (float64 here): rounded "
        "to float32 the two values tie and the lower id wins"
    )


# --------------------------------------------------------------------------------------------------
# Generated cases against a per-row oracle: random vocabularies and gammas, zeros, ties, p == q, one-hot
# rows, empty and nearly empty residuals, rows of one batch with different acceptance lengths.
#
# A call holds GEN_CASES cases, each copied into a block of rows (the same draft tokens, q and p), so that
# each case's outcomes can be counted. Given its draft tokens, the outcome "n drafts accepted, then token
# x" of a row has an exact probability (outcome_table, a loop over positions and tokens):
#     P(n, x) = a_0 ... a_{n-1} (1 - a_n) r_n(x)   for n < gamma,     a_0 ... a_{gamma-1} p_gamma(x)   for n = gamma,
# with a_i = min(1, p_i(x_i) / q_i(x_i)) (0 where q_i(x_i) = 0) and r_n = norm(max(0, p_n - q_n)), or p_n
# where that is all zeros. Where zeros and ties are wanted the probabilities are multiples of 1/64, exact
# in float32, so a tie is a tie and a zero a zero.
#
# Deterministic sweep (GEN_ROWS_EXACT rows per case, 6 calls x 16 cases): no row may show an outcome of
# probability 0; a correct solution never does, on any draw. accept_rules fails what no exact sampler of the
# target may do (keep a draft with q = 0 or p = 0, emit a token of probability 0); coupling fails the rest of
# what the rule forbids (reject a draft with p >= q > 0, draw outside the residual's support).
#
# Statistical part (coupling): one case of each family, each with its own gamma and V drawn from the seed, at
# the rows its law needs for a resolution of 1% (FAMILY_ROWS, chosen by smallest_shift_for on the case's
# exact table), counted against that table: the (n, x) cells, each at ALARM_FAMILIES / (8 x cells).

GEN_GAMMAS = (0, 1, 2, 3, 4, 6)  # one call per gamma
GEN_VOCABS = (1, 2, 3, 5, 8, 13)
GEN_MAX_ROW = 80  # V * (2 gamma + 1) per row at most: a call stays under 16 MB
GEN_CASES = 16  # cases per call
GEN_ROWS_EXACT = 200  # rows per case (deterministic)
FAMILY_ROWS = (40_000, 80_000, 160_000, 320_000)  # the first that resolves 1% (320_000 always does)
RESOLUTION = 0.01
LATTICE = 64
TINY = 2.0**-24  # a residual of this mass is still a residual


def pick(rng: torch.Generator, options):
    return options[int(torch.randint(0, len(options), (1,), generator=rng))]


def lattice(V: int, rng: torch.Generator, forbid: int | None = None) -> torch.Tensor:
    """A distribution over V tokens in multiples of 1/64 (zeros and equal values are common); `forbid`
    gets probability 0."""
    weights = torch.rand(V, generator=rng) ** 2 + 1e-3
    if forbid is not None:
        weights[forbid] = 0.0
    counts = torch.bincount(torch.multinomial(weights, LATTICE, replacement=True, generator=rng), minlength=V)
    return counts.float() / LATTICE


def one_hot(V: int, token: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(token), V).float()


def draw(dist: torch.Tensor, rng: torch.Generator) -> int:
    return int(torch.multinomial(dist.double(), 1, generator=rng))


def accepted_prefix(c: int, V: int, rng: torch.Generator) -> tuple[list[int], list[torch.Tensor], list[torch.Tensor]]:
    """c positions that are accepted for certain (p == q, drafted where q > 0): drafts, q rows, p rows."""
    drafts, qs, ps = [], [], []
    for _ in range(c):
        row = pick(rng, (lattice(V, rng), one_hot(V, int(torch.randint(0, V, (1,), generator=rng)))))
        drafts.append(draw(row, rng))
        qs.append(row)
        ps.append(row.clone())
    return drafts, qs, ps


def gen_case(family: str, gamma: int, V: int, rng: torch.Generator):
    """(draft [gamma], q [gamma, V], p [gamma + 1, V]) of one family, float32."""
    if V == 1:  # one token: p = q = [1], every draft accepted
        family = "lattice"
    drafts, qs, ps = [], [], []
    if family == "lattice":  # zeros and ties between p and q everywhere
        for _ in range(gamma):
            q, p = lattice(V, rng), lattice(V, rng)
            drafts.append(draw(q, rng))
            qs.append(q)
            ps.append(p)
    elif family == "p == q":
        drafts, qs, ps = accepted_prefix(gamma, V, rng)
    elif family == "one-hot rows":
        for _ in range(gamma):
            q = pick(rng, (lattice(V, rng), one_hot(V, int(torch.randint(0, V, (1,), generator=rng)))))
            p = pick(rng, (lattice(V, rng), one_hot(V, int(torch.randint(0, V, (1,), generator=rng))), q.clone()))
            drafts.append(draw(q, rng))
            qs.append(q)
            ps.append(p)
    elif family == "drafted where p or q is 0":
        for _ in range(gamma):
            x = int(torch.randint(0, V, (1,), generator=rng))
            q = lattice(V, rng, forbid=pick(rng, (x, None, None)))
            p = lattice(V, rng, forbid=pick(rng, (x, x, None)))
            drafts.append(x)
            qs.append(q)
            ps.append(p)
    elif family in ("empty residual", "nearly empty residual", "certain cut"):
        c = int(torch.randint(0, max(gamma, 1), (1,), generator=rng))  # accepted for certain before c < gamma
        drafts, qs, ps = accepted_prefix(c, V, rng)
        if c < gamma:
            x = int(torch.randint(0, V, (1,), generator=rng))
            base = lattice(V, rng, forbid=x)  # p(x) = 0: x is rejected for certain
            if family == "empty residual":  # p == q, both 0 at x: nothing left, so the extra token comes from p
                q = base.clone()
            elif family == "nearly empty residual":  # q = p but for TINY moved from a to x: the residual is TINY at a
                a = int(base.argmax())
                q = base.clone()
                q[x], q[a] = TINY, q[a] - TINY
            else:  # a residual of its own
                q = lattice(V, rng, forbid=pick(rng, (None, int(base.argmax()))))
                q[x] = q[x] if q[x] > 0 else 1.0 / LATTICE
            drafts.append(x)
            qs.append(q)
            ps.append(base)
            more = gamma - c - 1  # after the cut: anything
            for _ in range(more):
                q = lattice(V, rng)
                drafts.append(draw(q, rng))
                qs.append(q)
                ps.append(lattice(V, rng))
    elif family == "dense random":
        q = random_dist((max(gamma, 1), V), rng, sharpness=1.5, floor=0.0)[:gamma]
        for i in range(gamma):
            drafts.append(draw(q[i], rng))
        qs = list(q)
        ps = list(random_dist((max(gamma, 1), V), rng, sharpness=1.5, floor=0.0)[:gamma])
    else:
        raise ValueError(family)
    bonus = pick(rng, (lattice(V, rng), one_hot(V, int(torch.randint(0, V, (1,), generator=rng)))))
    q = torch.stack(qs) if gamma else torch.zeros(0, V)
    p = torch.stack(ps + [bonus])
    return torch.tensor(drafts, dtype=torch.long).reshape(gamma), q.float(), p.float(), family


GEN_FAMILIES = (
    "lattice",
    "p == q",
    "one-hot rows",
    "drafted where p or q is 0",
    "empty residual",
    "nearly empty residual",
    "certain cut",
    "dense random",
)


def vocab_per_call(rng: torch.Generator) -> list[int]:
    """Every vocabulary size of GEN_VOCABS once, shuffled over the calls, within GEN_MAX_ROW."""
    while True:
        vocabs = [GEN_VOCABS[i] for i in torch.randperm(len(GEN_VOCABS), generator=rng).tolist()]
        if all(V * (2 * gamma + 1) <= GEN_MAX_ROW for gamma, V in zip(GEN_GAMMAS, vocabs)):
            return vocabs


def generated_calls(rng: torch.Generator, rows: int):
    """One call per gamma in GEN_GAMMAS: (where, draft [B, gamma], q [B, gamma, V], p [B, gamma + 1, V], cases),
    cases = [(family, draft, q, p, table, accept)], case c on rows c * rows .. (c + 1) * rows - 1."""
    calls = []
    vocabs = vocab_per_call(rng)
    for call, (gamma, V) in enumerate(zip(GEN_GAMMAS, vocabs)):
        dtype = torch.float64 if call == int(torch.randint(0, len(GEN_GAMMAS), (1,), generator=rng)) else torch.float32
        cases = []
        for c in range(GEN_CASES):
            draft, q, p, family = gen_case(GEN_FAMILIES[c % len(GEN_FAMILIES)], gamma, V, rng)
            cases.append((family, draft, q, p, *outcome_table(draft, q, p)))
        draft = torch.cat([c[1].expand(rows, gamma) for c in cases])
        q = torch.cat([c[2].expand(rows, gamma, V) for c in cases]).to(dtype)
        p = torch.cat([c[3].expand(rows, gamma + 1, V) for c in cases]).to(dtype)
        where = f"generated call {call + 1} of {len(GEN_GAMMAS)} (gamma={gamma}, V={V}, {str(dtype).split('.')[1]})"
        calls.append((where, draft, q, p, cases))
    return calls


def describe_case(where: str, c: int, case, rows: int) -> str:
    family, draft, q, p, _, accept = case
    drafted = draft.tolist()  # the case's own draft tokens (gamma of them)
    at = ", ".join(f"({float(p[i, t]):.4g}, {float(q[i, t]):.4g})" for i, t in enumerate(drafted))
    return (
        f"{where}, case {c + 1} of {GEN_CASES} ({family}; rows {c * rows} to {(c + 1) * rows - 1}): draft tokens "
        f"{show(draft)}, (p, q) at them [{at}], so min(1, p/q) = {[round(a, 4) for a in accept]}"
    )


def impossible_outcome(case, n: int, token: int) -> str:
    """Why the oracle gives the outcome (n accepted, then `token`) probability 0."""
    family, draft, q, p, table, accept = case
    gamma = len(accept)
    for i in range(n):
        if accept[i] == 0:
            x = int(draft[i])
            why = (
                "q(x) = 0: it could not have been drafted, and the contract rejects it"
                if float(q[i, x]) == 0
                else "p(x) = 0: the target forbids it, and u <= p/q = 0 never holds for u in (0, 1]"
            )
            return f"it accepted the draft token {x} at position {i}, where {why}"
    if n < gamma and accept[n] == 1:
        x = int(draft[n])
        return (
            f"it rejected the draft token {x} at position {n}, where p(x) = {float(p[n, x]):.6g} >= q(x) = "
            f"{float(q[n, x]):.6g} > 0: u <= 1 <= p/q holds for every u in (0, 1], so it is always accepted"
        )
    if n == gamma:
        return (
            f"all {gamma} drafts were accepted, then the bonus token {token}, where p_{gamma}({token}) = 0: the bonus "
            f"comes from target_probs[:, {gamma}]"
        )
    residual = (p[n].double() - q[n].double()).clamp(min=0)
    if float(residual.sum()) == 0:
        return (
            f"after the rejection at position {n} it emitted token {token}. There max(0, p - q) is all zeros "
            f"(p <= q everywhere), so the contract samples from p, and p({token}) = 0"
        )
    return (
        f"after the rejection at position {n} it emitted token {token}, where max(0, p - q) = 0 (p = "
        f"{float(p[n, token]):.6g}, q = {float(q[n, token]):.6g}): the extra token comes from norm(max(0, p - q)), "
        f"whose support here is {show(residual.nonzero().flatten())}"
        + (
            f" (its mass is only {float(residual.sum()):.3g}, but it is not 0: no tolerance)"
            if float(residual.sum()) < 1e-3
            else ""
        )
    )


def outcomes(tokens: torch.Tensor, num_accepted: torch.Tensor) -> torch.Tensor:
    """[B] the extra token of each row (the one at position num_accepted)."""
    return tokens.gather(1, num_accepted.long()[:, None]).squeeze(1)


def contract_allows(case, gamma: int, V: int) -> torch.Tensor:
    """[gamma + 1, V] bool: outcomes (n accepted, then x) that an exact sampler of the target may show, whatever
    its coupling: every kept draft had q > 0 and p > 0, and the extra token has p_n(x) > 0."""
    _, draft, q, p, _, _ = case
    kept_ok = [True]
    for i in range(gamma):
        x = int(draft[i])
        kept_ok.append(kept_ok[-1] and float(q[i, x]) > 0 and float(p[i, x]) > 0)
    return torch.tensor(kept_ok)[:, None] & (p.double() > 0)


def assert_generated_outcomes_possible(sm, rng, rule: bool) -> None:
    """The deterministic sweep: `rule` False checks what any exact sampler obeys (accept_rules), True the rule's
    own table (coupling)."""
    rows = GEN_ROWS_EXACT
    for where, draft, q, p, cases in generated_calls(rng, rows):
        gamma, V = draft.shape[1], p.shape[-1]
        tokens, num_accepted = sm.speculative_accept(draft, q, p, fresh_generator(rng))
        check_layout(tokens, num_accepted, draft, V)
        if rule:
            allowed = torch.stack([case[4] > 0 for case in cases])  # [cases, gamma + 1, V]
        else:
            allowed = torch.stack([contract_allows(case, gamma, V) for case in cases])
        case_of_row = torch.arange(draft.shape[0]) // rows
        extra = outcomes(tokens, num_accepted)
        possible = allowed[case_of_row, num_accepted.long(), extra]
        if not possible.all():
            b = int((~possible).nonzero()[0])
            c = b // rows
            n, x = int(num_accepted[b]), int(extra[b])
            raise AssertionError(
                f"{describe_case(where, c, cases[c], rows)}. Row {b} came out as tokens {show(tokens[b])} "
                f"(num_accepted = {n}), which has probability 0: {impossible_outcome(cases[c], n, x)}. "
                f"{int((~possible).sum())} of {draft.shape[0]} rows show an impossible outcome."
            )


@pytest.mark.check("accept_rules")
def test_generated_outcomes_are_possible(sm, rng):
    assert_generated_outcomes_possible(sm, rng, rule=False)


@pytest.mark.check("coupling")
def test_generated_outcomes_are_the_rules(sm, rng):
    """Rejecting a draft token with p >= q > 0, or drawing the extra token outside norm(max(0, p - q))'s support,
    is possible for a sampler that only gets each position's law right; the rule never does it."""
    assert_generated_outcomes_possible(sm, rng, rule=True)


def rows_for(table: torch.Tensor, alarm: float) -> tuple[int, float]:
    """The fewest FAMILY_ROWS that resolve RESOLUTION on this law (and the resolution they give)."""
    probs = table.flatten().tolist()
    for n in FAMILY_ROWS:
        shift = smallest_shift_for(n, probs, alarm)
        if shift <= RESOLUTION:
            return n, shift
    return FAMILY_ROWS[-1], shift


def family_shape(rng: torch.Generator) -> tuple[int, int]:
    while True:
        gamma, V = pick(rng, GEN_GAMMAS), pick(rng, GEN_VOCABS)
        if V * (2 * gamma + 1) <= GEN_MAX_ROW:
            return gamma, V


@pytest.mark.check("coupling")
def test_generated_families_follow_the_rule(student, sm, rng):
    """One case of each family at the rows it needs to resolve 1%: every (n accepted, token x) against its exact
    probability. Power: a move of 1% of the mass between any two outcomes fails it with probability >= 1 - MISS."""
    float64 = pick(rng, GEN_FAMILIES)
    for family in GEN_FAMILIES:
        gamma, V = family_shape(rng)
        draft, q, p, family = gen_case(family, gamma, V, rng)
        table, accept = outcome_table(draft, q, p)
        cells = int((table > 0).sum())
        alarm = ALARM_FAMILIES / len(GEN_FAMILIES) / max(cells, 1)
        n_rows, resolution = rows_for(table, alarm)
        dtype = torch.float64 if family == float64 else torch.float32
        case = (family, draft, q, p, table, accept)
        where = f"generated {family} case (gamma={gamma}, V={V}, {str(dtype).split('.')[1]}, {n_rows} rows)"
        counts = torch.zeros((gamma + 1) * V, dtype=torch.long)
        rows_draft = draft.expand(n_rows, gamma)
        for rows, tokens, num_accepted in accept_in_chunks(
            student, sm, torch.zeros(n_rows, dtype=torch.long), rows_draft, q[None].to(dtype), p[None].to(dtype),
            rng, where,
        ):
            extra = outcomes(tokens, num_accepted)
            impossible = table[num_accepted.long(), extra] == 0
            if impossible.any():
                b = int(impossible.nonzero()[0])
                n, x = int(num_accepted[b]), int(extra[b])
                raise AssertionError(
                    f"{describe_case(where, 0, case, n_rows)}. Row {rows.start + b} came out as tokens "
                    f"{show(tokens[b])} (num_accepted = {n}), which has probability 0: {impossible_outcome(case, n, x)}."
                )
            counts += torch.bincount(num_accepted.long() * V + extra, minlength=(gamma + 1) * V)

        def outcome(k: int) -> str:
            m, t = divmod(k, V)
            return f"'all {gamma} accepted, then bonus token {t}'" if m == gamma else f"'{m} accepted, then token {t}'"

        assert_counts(
            counts,
            table.flatten(),
            describe_case(where, 0, case, n_rows),
            (
                "Each outcome must come out as often as the rule makes it: accept x_i when u_i <= p_i(x_i) / q_i(x_i) "
                "with u_i uniform on (0, 1] (so with probability min(1, p/q)), one fresh u per row and position, stop at "
                "the first rejection; after a rejection at position i draw from norm(max(0, p_i - q_i)) (p_i where that "
                f"is all zeros), after all gamma accepted from p_gamma. (This test resolves a move of {resolution:.4f} of "
                "the mass between two outcomes.)"
            ),
            name=outcome,
            false_alarm=alarm * max(cells, 1),
        )


def tied_target(B: int, gamma: int, V: int, rng: torch.Generator) -> torch.Tensor:
    """[B, gamma + 1, V] target rows in multiples of 1/64, many with a tie for the largest probability."""
    rows = torch.stack([lattice(V, rng) for _ in range(B * (gamma + 1))]).reshape(B, gamma + 1, V)
    flat = torch.full((B, gamma + 1, V), 1.0 / V)
    return torch.where(torch.rand(B, gamma + 1, 1, generator=rng) < 0.15, flat, rows)


@pytest.mark.check("greedy")
def test_generated_greedy_against_a_per_row_loop(sm, rng):
    for gamma in (0, 1, 2, 3, 5):
        V = pick(rng, GEN_VOCABS)
        B = 150
        target = tied_target(B, gamma, V, rng)
        probs = target.tolist()
        draft = torch.zeros(B, gamma, dtype=torch.long)
        for b in range(B):
            for i in range(gamma):
                top = max(probs[b][i])
                tied = [t for t in range(V) if probs[b][i][t] == top]
                choice = float(torch.rand(1, generator=rng))
                draft[b, i] = (
                    tied[0]
                    if choice < 0.6
                    else tied[-1]
                    if choice < 0.8
                    else int(torch.randint(0, V, (1,), generator=rng))
                )
        tokens, num_accepted = sm.greedy_accept(draft, target)
        assert_outputs(tokens, num_accepted, B, gamma, f"greedy_accept, gamma={gamma}, V={V}")
        want, counts = greedy_oracle(draft, target)
        got = tokens.tolist()
        for b in range(B):
            if got[b] != want[b] or int(num_accepted[b]) != counts[b]:
                maxima = [[t for t in range(V) if probs[b][i][t] == max(probs[b][i])] for i in range(gamma + 1)]
                ties = [i for i, m in enumerate(maxima) if len(m) > 1]
                raise AssertionError(
                    f"greedy_accept, gamma={gamma}, V={V}, row {b}: draft {show(draft[b])}, the tokens of largest "
                    f"target probability at each position {maxima}: expected {want[b]} (num_accepted {counts[b]}), "
                    f"found {got[b]} (num_accepted {int(num_accepted[b])}). "
                    + (
                        f"Positions {ties} have a tie for the largest probability: the argmax is the LOWEST id "
                        "(torch.argmax's rule), and a draft token equal to another tied token is a mismatch. "
                        if ties
                        else ""
                    )
                    + "Keep drafts while they equal the argmax, then emit the argmax (the last position's if all match), "
                    "-1 after."
                )


# --------------------------------------------------------------------------------------------------
# Reproducible, and randomness only from the generator


@pytest.mark.check("reproducible")
def test_same_seed_same_tokens_other_seed_other_tokens(sm, rng):
    B = 2000
    p = random_dist((B, GAMMA + 1, V), rng, sharpness=1.5)
    q = random_dist((B, GAMMA, V), rng, sharpness=1.5)
    draft = torch.multinomial(q.reshape(-1, V), 1, generator=rng).reshape(B, GAMMA)
    seed = new_seed(rng)
    a = sm.speculative_accept(draft, q, p, torch.Generator().manual_seed(seed))
    b = sm.speculative_accept(draft, q, p, torch.Generator().manual_seed(seed))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), (
        "two calls with generators seeded alike gave different tokens: draw every random number from "
        "`generator` (torch.rand(..., generator=generator), torch.multinomial(..., generator=generator))"
    )
    c = sm.speculative_accept(draft, q, p, torch.Generator().manual_seed(seed + 1))
    assert not torch.equal(a[0], c[0]), "a different seed gave the very same 2000 rows: is the generator used at all?"


@pytest.mark.check("reproducible")
def test_the_global_generator_is_not_touched(student, sm, rng):
    B = 500
    p = random_dist((B, GAMMA + 1, V), rng, sharpness=1.5)
    q = random_dist((B, GAMMA, V), rng, sharpness=1.5)
    draft = torch.multinomial(q.reshape(-1, V), 1, generator=rng).reshape(B, GAMMA)
    _, untouched = student.drive(
        "grader.support.speculative:global_rng_untouched", sm.speculative_accept, draft, q, p, fresh_generator(rng)
    )
    assert untouched, "speculative_accept drew from torch's global generator: take every random number from `generator`"
    # `untouched` is the worker's word. What the grader sees itself: the acceptance test's coins must change with
    # the generator's seed. Coins from anywhere else (a global generator seeded or restored to the same state at
    # every call) repeat from call to call, and every row then keeps the same number of tokens. With honest coins
    # two seeds agree on a row's count with probability at most max_k P(k) < 1, so on all 500 rows almost never.
    student.assert_untampered(sm.speculative_accept, "whether torch's global generator was touched")
    counts = [sm.speculative_accept(draft, q, p, fresh_generator(rng))[1] for _ in range(2)]
    assert not torch.equal(counts[0], counts[1]), (
        "two generators seeded differently gave the very same number of accepted tokens in all 500 rows: the "
        "acceptance test's coins do not come from `generator` (torch.rand(..., generator=generator))"
    )


@pytest.mark.check("reproducible")
def test_generate_is_reproducible(student, sm, rng):
    target = random_dist((4, 4, 4), rng)
    draft = random_dist((4, 4), rng)
    prefix = torch.randint(0, 4, (64, 2), generator=rng)
    seed = new_seed(rng)
    one = student.drive(DRIVER, sm.speculative_generate, target, draft, prefix, 3, 12, seed)
    two = student.drive(DRIVER, sm.speculative_generate, target, draft, prefix, 3, 12, seed)
    assert torch.equal(one["tokens"][0], two["tokens"][0]), (
        "speculative_generate with generators seeded alike gave different tokens: draw the drafts with `generator` too"
    )


# --------------------------------------------------------------------------------------------------
# Vectorised: the lines of your module executed must not grow with the batch or the vocabulary


def accept_inputs(B: int, vocab: int, rng: torch.Generator):
    p = random_dist((B, GAMMA + 1, vocab), rng, sharpness=1.5)
    q = random_dist((B, GAMMA, vocab), rng, sharpness=1.5)
    draft = torch.multinomial(q.reshape(-1, vocab), 1, generator=rng).reshape(B, GAMMA)
    return draft, q, p


SLACK_LINES = 8  # a data-dependent `if` may add a line or two; a loop over rows adds hundreds

# The grader's own clock at two sizes (grader/structure.py): the line counts above come from the worker,
# which the submission can forge. V = 4 and gamma = 2 keep the inputs small (about 130 bytes a row), so a
# vectorised call costs little more than its fixed cost (the round trip, ~40 torch ops). Measured on the
# course's shared 2-core machine under load from other jobs, best of 5 runs each, ratio large / small,
# min-max over 3-4 measurements, sandbox (8192 / 16) then in-process (2048 / 16):
#   reference                 batch 2.8-3.1 / 2.8-3.7   vocabulary 2.2-2.4 / 2.7-2.8   greedy 2.4-2.7 / 4.0-4.2
#   one draw per row, map()   batch 61-65 / 35-51 (the lines stay flat: the loop runs in C)
#   loop over rejected rows   batch 36-44
#   greedy cumprod per row    greedy 23-24 / 39-50
CLOCK = {
    "batch": Scaling(16, 8192, bar=10.0, large_in_process=2048, unit="rows"),
    "vocabulary": Scaling(16, 8192, bar=10.0, large_in_process=2048, unit="vocabulary entries"),
    "greedy": Scaling(16, 8192, bar=10.0, large_in_process=2048, unit="rows"),
}
CLOCK_GAMMA, CLOCK_V = 2, 4
# The counted calls' draft length: a match bit per draft token at B of about 500 is 250 bytes, above what a
# call may read back (grader.structure.READ_ALLOWANCE), so a loop over rows cannot read its data packed.
COUNTED_GAMMA = 4


def decided_accept_inputs(B: int, vocab: int, gamma: int, rng: torch.Generator):
    """Inputs whose outcome is certain, with the answer: row b keeps exactly cut[b] draft tokens.

    Kept positions have p = q = one-hot at the draft token (u * q <= p for every u in [0, 1]); at the cut
    p(x) = 0 < q(x) = 1 (rejected for every u > 0) and max(0, p - q) is one-hot at `extra`; a row that
    keeps all gamma tokens draws its bonus from a one-hot p. So the timed calls can be checked exactly.
    """
    cut = torch.randint(0, gamma + 1, (B,), generator=rng)
    draft = torch.randint(0, vocab, (B, gamma), generator=rng)
    extra = torch.randint(0, vocab, (B,), generator=rng)
    at_cut = draft.gather(1, cut.clamp(max=gamma - 1)[:, None])[:, 0]
    extra = torch.where((cut < gamma) & (extra == at_cut), (extra + 1) % vocab, extra)  # the residual's token
    q = torch.full((B, gamma, vocab), 1.0 / vocab)
    p = torch.full((B, gamma + 1, vocab), 1.0 / vocab)
    positions = torch.arange(gamma + 1)
    one_hot_draft = torch.nn.functional.one_hot(draft, vocab).float()  # [B, gamma, V]
    kept_or_cut = (positions[:gamma][None, :] <= cut[:, None])[..., None]  # q one-hot at x up to the cut
    q = torch.where(kept_or_cut, one_hot_draft, q)
    kept = (positions[:gamma][None, :] < cut[:, None])[..., None]
    p[:, :gamma] = torch.where(kept, one_hot_draft, p[:, :gamma])
    one_hot_extra = torch.nn.functional.one_hot(extra, vocab).float()  # [B, V]
    p[torch.arange(B), cut] = one_hot_extra
    want = torch.where(positions[None, :] < cut[:, None], torch.cat([draft, draft[:, :1]], 1), -1)
    want[torch.arange(B), cut] = extra
    return (draft, q, p), (want, cut)


def check_decided(result, draft, q, p, generator, want) -> None:
    tokens, num_accepted = result
    B, V = draft.shape[0], q.shape[-1]
    assert_outputs(
        tokens, num_accepted, B, draft.shape[1], f"speculative_accept (B={B}, V={V}, timed on the grader's clock)"
    )
    assert torch.equal(num_accepted, want[1]) and torch.equal(tokens, want[0]), (
        f"speculative_accept (B={B}, V={V}, timed on the grader's clock) is wrong on inputs whose outcome is certain "
        "(p = q one-hot at the kept tokens, p(x) = 0 at the first rejection)"
    )


@pytest.mark.check("vectorised")
@pytest.mark.parametrize("grow", ["batch", "vocabulary"])
def test_speculative_accept_is_vectorised(student, sm, rng, grow):
    # Inputs whose outcome is certain, at sizes drawn from the seed: the counted calls' results are checked too,
    # so a call that knows it is counted (by its shapes, say) cannot return a placeholder (red team round 15).
    n = int(torch.randint(448, 577, (1,), generator=rng))
    sizes = {"small": (16, 16), "big": (n, 16) if grow == "batch" else (16, n)}
    work = {}
    for size, (B, V) in sizes.items():
        args, want = decided_accept_inputs(B, V, COUNTED_GAMMA, rng)
        _, work[size] = student.work_executed(
            sm.speculative_accept,
            *args,
            fresh_generator(rng),
            check=lambda out, args=args, want=want: check_decided(out, *args, None, want),
        )
    work_small, work_big = work["small"], work["big"]
    lines_small, lines_big = work_small.lines, work_big.lines
    big_name = f"B={n}" if grow == "batch" else f"V={n}"
    advice = "Do it for all rows at once: gather, cumprod, torch.where, one torch.multinomial over [B, V]"
    assert lines_big <= lines_small + SLACK_LINES, (
        f"speculative_accept executed {lines_small} lines of your module for B=16, V=16 but {lines_big} for "
        f"{big_name}: a Python loop over the {'rows' if grow == 'batch' else 'vocabulary'} "
        f"(perhaps only around the resampling draw). {advice}"
    )
    assert_no_hidden_loop("speculative_accept", ("B=16, V=16", big_name), work_small, work_big, advice)

    def make(n: int):
        B, V = (n, CLOCK_V) if grow == "batch" else (4, n)
        args, want = decided_accept_inputs(B, V, CLOCK_GAMMA, rng)
        return (*args, fresh_generator(rng), want)

    timing = clock(
        student.mode, lambda d, q, p, g, want: sm.speculative_accept(d, q, p, g), make, check_decided, CLOCK[grow]
    )
    assert_flat_on_the_clock(timing, "speculative_accept", advice, lines=(lines_small, lines_big))


def decided_greedy_inputs(B: int, vocab: int, gamma: int, rng: torch.Generator):
    """Target rows with one clear argmax; row b's draft matches it for exactly cut[b] positions."""
    best = torch.randint(0, vocab, (B, gamma + 1), generator=rng)
    target = torch.rand(B, gamma + 1, vocab, generator=rng) + 2 * torch.nn.functional.one_hot(best, vocab)
    target = target / target.sum(-1, keepdim=True)
    cut = torch.randint(0, gamma + 1, (B,), generator=rng)
    positions = torch.arange(gamma + 1)
    miss = (best[:, :gamma] + torch.randint(1, vocab, (B, gamma), generator=rng)) % vocab
    draft = torch.where(positions[None, :gamma] < cut[:, None], best[:, :gamma], miss)
    want = torch.where(positions[None, :] <= cut[:, None], best, -1)
    return (draft, target), (want, cut)


def check_greedy_decided(result, draft, target, want) -> None:
    tokens, num_accepted = result
    assert_outputs(  # type: ignore[call-arg]  # mypy gives *draft.shape every parameter left (it is B, gamma)
        tokens, num_accepted, *draft.shape, f"greedy_accept (B={draft.shape[0]}, timed on the grader's clock)"
    )
    assert torch.equal(num_accepted, want[1]) and torch.equal(tokens, want[0]), (
        f"greedy_accept (B={draft.shape[0]}, timed on the grader's clock) is wrong: keep draft tokens while they "
        "equal the target's argmax, then emit the argmax"
    )


@pytest.mark.check("vectorised")
def test_greedy_accept_is_vectorised(student, sm, rng):
    n = int(torch.randint(448, 577, (1,), generator=rng))  # drawn from the seed; results checked (as above)
    work = {}
    for B in (16, n):
        args, want = decided_greedy_inputs(B, 16, COUNTED_GAMMA, rng)
        _, work[B] = student.work_executed(
            sm.greedy_accept, *args, check=lambda out, args=args, want=want: check_greedy_decided(out, *args, want)
        )
    work_small, work_big = work[16], work[n]
    lines_small, lines_big = work_small.lines, work_big.lines
    assert lines_big <= lines_small + SLACK_LINES, (
        f"greedy_accept executed {lines_small} lines for 16 rows and {lines_big} for {n}: a loop over rows; "
        "compare with the argmax for all rows at once"
    )
    assert_no_hidden_loop(
        "greedy_accept", ("16 rows", f"{n} rows"), work_small, work_big, "Compare with the argmax for all rows at once"
    )

    def make(n: int):
        args, want = decided_greedy_inputs(n, CLOCK_V, CLOCK_GAMMA, rng)
        return (*args, want)

    timing = clock(student.mode, lambda d, t, want: sm.greedy_accept(d, t), make, check_greedy_decided, CLOCK["greedy"])
    assert_flat_on_the_clock(
        timing, "greedy_accept", "Compare with the argmax for all rows at once", lines=(lines_small, lines_big)
    )


# --------------------------------------------------------------------------------------------------
# The whole loop


def check_generate_result(result: dict, B: int, max_new: int, vocab: int, gamma: int) -> None:
    runs = zip(result["tokens"], result["reported_calls"], result["target_calls"], result["draft_calls"])
    for tokens, reported, counted, drafted in runs:
        assert (
            isinstance(tokens, torch.Tensor) and tokens.dtype == torch.int64 and tuple(tokens.shape) == (B, max_new)
        ), (
            f"speculative_generate must return the {max_new} new tokens per row as int64 [{B}, {max_new}], "
            f"found {described(tokens)}"
        )
        assert bool(((tokens >= 0) & (tokens < vocab)).all()), (
            "the generated tokens must be real token ids in [0, V): no -1 padding in what you return"
        )
        assert type(reported) is int, (
            f"speculative_generate must return the number of target calls as a Python int, found {described(reported)}"
        )
        assert reported == counted, (
            f"speculative_generate reported {reported} target calls but the target model was called {counted} times"
        )
        assert drafted == gamma * counted, (
            f"speculative_generate called the draft model {drafted} times for {counted} target calls with gamma = "
            f"{gamma}: each step makes exactly gamma draft calls (one per drafted position, every row at once), "
            f"then one target call, so {gamma * counted} draft calls"
        )


def sequence_table(table: torch.Tensor, prefix: list[int], length: int) -> torch.Tensor:
    sequences = itertools.product(range(table.shape[-1]), repeat=length)
    probs = sequence_probabilities(table, prefix, length)
    return torch.tensor([probs[s] for s in sequences], dtype=torch.float64)


SEQUENCE_ROWS = (50_000, 100_000, 200_000, 400_000)  # rows per prefix: the first that resolves 1% on the tables
GENERATE_CHUNK = 50_000  # rows per prefix and call (each call is a whole generation of its own rows)


@pytest.mark.check("generate")
def test_whole_sequences_are_distributed_as_the_target(student, sm, rng):
    """Trigram target, bigram draft, two prefixes in one batch; every 4-token continuation enumerated. The rows
    per prefix are the fewest of SEQUENCE_ROWS at which a move of 1% of the mass between any two sequences fails
    the test with probability >= 1 - MISS (smallest_shift_for on the two exact tables)."""
    vocab, gamma, max_new = 3, 2, 4
    # A random trigram table, pulled toward "last token + 1" so that the context always matters (no sequence
    # much above 1/10, so that 1e5 rows per prefix usually resolve 1%).
    follow = torch.nn.functional.one_hot((torch.arange(vocab) + 1) % vocab, vocab).float()
    target = 0.75 * random_dist((vocab, vocab, vocab), rng, sharpness=1.0, floor=0.2) + 0.25 * follow
    draft = random_dist((vocab, vocab), rng, sharpness=1.5, floor=0.2)
    prefixes = [[0, 1], [2, 2]]
    tables = [sequence_table(target, pre, max_new) for pre in prefixes]
    alarm = FALSE_ALARM / 81
    per_prefix = next(
        (n for n in SEQUENCE_ROWS if all(smallest_shift_for(n, t.tolist(), alarm) <= RESOLUTION for t in tables)),
        SEQUENCE_ROWS[-1],
    )
    counts = torch.zeros(len(prefixes), vocab**max_new, dtype=torch.long)
    per_call = min(per_prefix, GENERATE_CHUNK)  # rows per prefix in one call: the worker's memory stays bounded
    for _ in range(per_prefix // per_call):
        prefix = torch.tensor([prefixes[0]] * per_call + [prefixes[1]] * per_call)
        result = student.drive(DRIVER, sm.speculative_generate, target, draft, prefix, gamma, max_new, new_seed(rng))
        check_generate_result(result, 2 * per_call, max_new, vocab, gamma)
        codes = (result["tokens"][0] * vocab ** torch.arange(max_new - 1, -1, -1)).sum(1)  # sequence -> its index
        for j in range(len(prefixes)):
            counts[j] += torch.bincount(codes[j * per_call : (j + 1) * per_call], minlength=vocab**max_new)
    sequences = list(itertools.product(range(vocab), repeat=max_new))
    for j, pre in enumerate(prefixes):
        try:
            assert_counts(
                counts[j],
                tables[j],
                f"after prefix {pre}, {max_new} new tokens",
                "Whole sequences must follow the target's chain rule. Check that the drafts are written into "
                "the sequence the models read, that draft i reads the draft at position length - 1 + i of ITS "
                "row, that the target's gamma + 1 rows start at length - 1, and that each row advances by "
                "its own num_accepted + 1.",
                name=lambda k: f"the sequence {show(sequences[k])}",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc} {where_the_loop_reads_wrong(student, sm, rng, gamma)}") from None


def where_the_loop_reads_wrong(student, sm, rng, gamma: int) -> str:
    """For a failed whole-sequence law: runs whose every next token is certain (one-hot bigram models,
    rows_of_their_own), whose right output is the target's chain from each row's last prefix token. First one row at
    a time (a first new token one step ahead of the chain: the target's rows read one position late; another
    departure: the models did not read the drafts), then the whole batch (rows right alone but wrong together:
    a row read at another row's length). '' when every run follows the chain."""
    target, draft, prefix, target_next, _, _ = rows_of_their_own(gamma, rng)
    max_new = 3 * (gamma + 1)

    def departure(rows: torch.Tensor):
        try:
            tokens = student.drive(DRIVER, sm.speculative_generate, target, draft, prefix[rows], gamma, max_new, 0)[
                "tokens"][0]
        except Exception:  # noqa: BLE001  (the failed law is the verdict; these runs only explain it)
            return None
        if not (isinstance(tokens, torch.Tensor) and tuple(tokens.shape) == (len(rows), max_new)):
            return None
        for b, row in enumerate(tokens.tolist()):
            at, want = int(prefix[rows[b], -1]), []
            for _ in range(max_new):
                at = target_next[at]
                want.append(at)
            j = next((j for j in range(max_new) if row[j] != want[j]), None)
            if j is not None:
                return int(rows[b]), j, row, want
        return None

    for b in range(min(len(prefix), 4)):
        found = departure(torch.tensor([b]))
        if found is None:
            continue
        _, j, row, want = found
        last = int(prefix[b, -1])
        if j == 0 and row[0] == target_next[want[0]]:
            return (f"Where your loop goes wrong: one row, one-hot target and draft (every next token certain), prefix "
                    f"ending in {last}: the target puts all its mass on {want[0]} next, yet your first new token is "
                    f"{row[0]}, the token AFTER it. The target's rows were read one position late: the gamma + 1 rows "
                    "that score draft i (and the bonus) start at length - 1, the prefix's last position.")
        return (f"Where your loop goes wrong: one row, one-hot target and draft (every next token certain), prefix "
                f"ending in {last}: new token {j} is {row[j]}, where the target's chain gives {want[j]} "
                f"(expected {show(want)}, found {show(row)}). The models did not read the sequence so far: write "
                "draft i into the row at length + i before the next draft call and before the target call reads it.")
    found = departure(torch.arange(len(prefix)))
    if found is not None:
        b, j, row, want = found
        return (f"Where your loop goes wrong: one-hot models (every next token certain); each row alone follows the "
                f"target's chain, but in a batch of {len(prefix)} rows that keep different numbers of drafts, row {b}'s "
                f"new token {j} is {row[j]} where its chain gives {want[j]}: read each row at ITS own length "
                "(position length[b] - 1 + i for draft i), not at another row's.")
    return ""


# The tokens-per-call test's power, measured with calls_distribution (exact): at alpha in 0.4..0.9 its band
# [lo, hi] holds the total of a loop whose acceptance is alpha +- 0.065 with probability below MISS (0.042 to
# 0.064 by alpha). It sees the loop's calls, not small biases: those are the accept-level tests' (1%).


@pytest.mark.check("coupling")
def test_tokens_per_target_call_match_equation_1(student, sm, rng):
    """B = 1, context-free models (acceptance alpha at every position): the exact law of the call count."""
    vocab, gamma, max_new, runs = 4, 3, 40, 150
    target = random_dist((vocab,), rng, sharpness=1.0, floor=0.2)
    draft = random_dist((vocab,), rng, sharpness=1.0, floor=0.2)
    alpha = float(oracle_acceptance(target, draft))
    prefix = torch.tensor([[1, 2]])
    result = student.drive(
        DRIVER, sm.speculative_generate, target, draft, prefix, gamma, max_new, new_seed(rng), runs=runs
    )
    check_generate_result(result, 1, max_new, vocab, gamma)
    total = sum(result["target_calls"])
    lo, hi = calls_band(alpha, gamma, max_new, runs)
    per_call = oracle_tokens_per_step(alpha, gamma)
    assert lo <= total <= hi, (
        f"{runs} runs of {max_new} new tokens took {total} target calls ({runs * max_new / total:.3f} tokens per call). "
        f"With alpha = sum(min(p, q)) = {alpha:.3f} and gamma = {gamma}, equation 1 gives {per_call:.3f} tokens per call, "
        f"and a correct loop needs between {lo} and {hi} calls in all (probability 1 - 1e-9). Each step must keep the "
        "accepted tokens AND the extra one (num_accepted + 1), with the bonus when all gamma pass, and keep each draft "
        "with probability min(1, p/q). " + TEXTBOOK
    )


def calls_band(alpha: float, gamma: int, max_new: int, runs: int) -> tuple[int, int]:
    """[lo, hi]: where the total number of target calls of `runs` runs lies with probability 1 - FALSE_ALARM."""
    cdf = np.cumsum(sum_distribution(calls_distribution(alpha, gamma, max_new), runs))
    return int(np.searchsorted(cdf, FALSE_ALARM / 2)), int(np.searchsorted(cdf, 1 - FALSE_ALARM / 2))


@pytest.mark.check("coupling")
def test_target_equal_to_draft_accepts_every_draft(student, sm, rng):
    table = random_dist((6, 6), rng)
    prefix = torch.randint(0, 6, (100, 4), generator=rng)
    for gamma, max_new in [(2, 9), (4, 11), (1, 1)]:
        result = student.drive(DRIVER, sm.speculative_generate, table, table, prefix, gamma, max_new, new_seed(rng))
        check_generate_result(result, 100, max_new, 6, gamma)
        want = math.ceil(max_new / (gamma + 1))
        assert result["target_calls"][0] == want, (
            f"with target == draft every draft passes, so each step emits gamma + 1 = {gamma + 1} tokens: "
            f"{max_new} tokens need {want} target calls, found {result['target_calls'][0]}. " + TEXTBOOK
        )


def rows_of_their_own(gamma: int, rng: torch.Generator):
    """One-hot bigram models where rows keep different numbers of drafts, deterministically.

    Tokens form two cycles under the target (t -> its successor with probability 1). On the FAST cycle
    (3 tokens) the draft is the target: a row there keeps all gamma drafts at every step. On the TRAP cycle
    (c tokens, c in gamma .. gamma + 2) the draft agrees except after one trap token, where it puts all its mass
    on a token the target gives 0: a row there keeps drafts up to the trap, is rejected there and takes the
    target's token. Token ids are shuffled. The rows' last prefix tokens cover every token of both cycles,
    so at every step some row sits right at the trap (keeps 0) while others keep more.
    Returns (target table, draft table, prefix, target_next, draft_next, the fast cycle's tokens)."""
    c = gamma + int(torch.randint(0, 3, (1,), generator=rng))
    V = c + 3
    ids = torch.randperm(V, generator=rng).tolist()  # position on the cycles -> token id
    target_next, draft_next = [0] * V, [0] * V
    for cycle in (ids[:c], ids[c:]):
        for k, t in enumerate(cycle):
            target_next[t] = cycle[(k + 1) % len(cycle)]
    draft_next[:] = target_next
    trap = ids[int(torch.randint(0, c, (1,), generator=rng))]
    draft_next[trap] = target_next[target_next[trap]]  # on the cycle, never the target's next token (c >= 2)
    eye = torch.eye(V)
    target, draft = eye[target_next], eye[draft_next]
    per_token = 4
    last = torch.tensor(ids).repeat(per_token)[torch.randperm(V * per_token, generator=rng)]
    prefix = torch.cat([torch.randint(0, V, (len(last), 2), generator=rng), last[:, None]], dim=1)
    return target, draft, prefix, target_next, draft_next, set(ids[c:])


@pytest.mark.check("coupling")
@pytest.mark.parametrize("gamma", [2, 4])
def test_each_row_advances_by_its_own_count(student, sm, rng, gamma):
    """B > 1 and rows that keep different numbers of drafts: each row's own target calls are known exactly
    (one-hot models, nothing random), so a loop that advances every row by its own num_accepted + 1 makes
    exactly the largest of them. A loop that advances the batch together is seen in the count."""
    target, draft, prefix, target_next, draft_next, fast_tokens = rows_of_their_own(gamma, rng)
    max_new = 30
    V, B = target.shape[-1], prefix.shape[0]
    result = student.drive(DRIVER, sm.speculative_generate, target, draft, prefix, gamma, max_new, new_seed(rng))
    check_generate_result(result, B, max_new, V, gamma)
    lasts = prefix[:, -1].tolist()
    own = [one_hot_row_calls(target_next, draft_next, last, gamma, max_new) for last in lasts]
    want, found = max(own), result["target_calls"][0]
    together = one_hot_lockstep_calls(target_next, draft_next, lasts, gamma, max_new)
    fast = sorted({n for n, last in zip(own, lasts) if last in fast_tokens})
    trap = [n for n, last in zip(own, lasts) if last not in fast_tokens]
    seen = "that is what advancing every row by the batch's smallest num_accepted + 1 gives" if found == together else (
        f"advancing every row by the batch's smallest num_accepted + 1 would take {together}")
    if found < want:
        seen += (f"; fewer calls than the slowest row needs, so the loop stopped while some rows still had fewer than "
                 f"{max_new} new tokens: run it while the row with the FEWEST new tokens still needs some (the min "
                 "over rows), not until the fastest row is done")
    assert found == want, (
        f"B = {B} rows, gamma = {gamma}, {max_new} new tokens, one-hot target and draft (nothing random): rows whose "
        f"draft equals the target keep every draft and emit gamma + 1 = {gamma + 1} tokens per call, rows that "
        "meet a token the target forbids keep the drafts before it and emit the target's token there. Each row on "
        f"its own needs a known number of target calls: {'/'.join(map(str, fast))} on the cycle where the draft is the target, "
        f"{min(trap)} to {max(trap)} on the cycle with the forbidden token, so a loop that advances each row by its own num_accepted + 1 "
        f"makes exactly {want} calls, the slowest row's. Found {found} ({seen}). Keep one length per row and add "
        "that row's own num_accepted + 1 to it; one row's rejection must not hold back the others: "
        "advancing all rows together throws away the drafts the other rows kept, and the speed-up with them."
    )


@pytest.mark.check("generate")
def test_edge_cases_gamma_zero_and_nothing_to_generate(student, sm, rng):
    target = random_dist((5, 5), rng)
    draft = random_dist((5, 5), rng)
    prefix = torch.randint(0, 5, (8, 3), generator=rng)
    result = student.drive(DRIVER, sm.speculative_generate, target, draft, prefix, 0, 6, new_seed(rng))
    check_generate_result(result, 8, 6, 5, 0)
    assert result["target_calls"][0] == 6, (
        f"gamma = 0 is plain sampling: one target call per token, 6 calls for 6 tokens, found {result['target_calls'][0]}"
    )
    result = student.drive(DRIVER, sm.speculative_generate, target, draft, prefix, 3, 0, new_seed(rng))
    check_generate_result(result, 8, 0, 5, 3)
    assert result["target_calls"][0] == 0, "max_new_tokens = 0: nothing to generate, so no target call"


# --------------------------------------------------------------------------------------------------
# Speed on CUDA


def assert_accept_plausible(tokens, num_accepted, draft, q, p):
    """One call's output against what its own inputs allow (the speed check sees one call, so no
    histogram): after a rejection at position j the extra token lies where p_j > q_j (the residual's
    support), and the number of accepted tokens over the batch is within Bernstein's bound (at
    FALSE_ALARM) of what min(1, p(x) / q(x)) predicts. A kernel that never reads the probabilities
    cannot pass both."""
    B, gamma = draft.shape
    index = draft.long().unsqueeze(-1)
    a = (p[:, :gamma].gather(-1, index) / q.gather(-1, index)).squeeze(-1).double().clamp(max=1.0).cpu()
    survive = torch.cat([torch.ones(B, 1, dtype=torch.float64), torch.cumprod(a, 1)], 1)  # P(N >= j), j = 0..gamma
    pmf = survive - torch.cat([survive[:, 1:], torch.zeros(B, 1, dtype=torch.float64)], 1)  # P(N = j)
    values = torch.arange(gamma + 1, dtype=torch.float64)
    mean = (pmf * values).sum(1)
    var = float(((pmf * values**2).sum(1) - mean**2).sum())
    log_term = math.log(2 / FALSE_ALARM)
    half = gamma * log_term / 3 + math.sqrt((gamma * log_term / 3) ** 2 + 2 * log_term * var)
    accepted, expected = int(num_accepted.sum()), float(mean.sum())
    assert abs(accepted - expected) <= half, (
        f"{accepted} draft tokens accepted over {B} rows, where min(1, p(x) / q(x)) predicts {expected:.1f} "
        f"(+-{half:.1f} at probability 1 - 1e-9): keep x_i when u_i <= p_i(x_i) / q_i(x_i), stop at the first rejection"
    )
    rejected = (num_accepted < gamma).nonzero().flatten()
    if len(rejected):
        j = num_accepted[rejected]
        extra = tokens[rejected, j]
        p_t = p[rejected.to(p.device), j.to(p.device), extra.to(p.device)].cpu()
        q_t = q[rejected.to(q.device), j.to(q.device), extra.to(q.device)].cpu()
        outside = (p_t <= q_t).nonzero().flatten()
        assert len(outside) == 0, (
            f"row {int(rejected[outside[0]])}: rejected at position {int(j[outside[0]])}, then emitted token "
            f"{int(extra[outside[0]])}, where p = {float(p_t[outside[0]]):.3g} <= q = {float(q_t[outside[0]]):.3g}: "
            "after a rejection the extra token comes from norm(max(0, p - q)), which gives it probability 0"
        )


@pytest.mark.cuda
@pytest.mark.check("accept_speed")
def test_speculative_accept_bandwidth(student, sm, score):
    from grader import rehearsal, speed
    from grader.support.speculative import Probs, SeededGenerator, Tokens

    case = rehearsal.size(ACCEPT, ACCEPT.tiny_case())
    B, gamma, vocab = case.batch, case.gamma, case.vocab
    ceil = speed.ceilings()
    specs = [
        Tokens((B, gamma), high=vocab),
        Probs((B, gamma, vocab)),
        Probs((B, gamma + 1, vocab)),
        SeededGenerator(()),
    ]

    def check(args, out):
        draft, q, p, _ = args
        assert isinstance(out, (tuple, list)) and len(out) == 2, (
            "speculative_accept should return (tokens, num_accepted)"
        )
        tokens, num_accepted = (x.cpu() for x in out)
        check_layout(tokens, num_accepted, draft.cpu(), vocab)
        assert_accept_plausible(tokens, num_accepted, draft.cpu(), q, p)

    # Each rep reads ~300 MB at most: at the bar (0.15 of a ~4 TB/s copy) about 0.5 ms, so 400 reps
    # are about 0.2 s, well above the wall-clock bound's slack (5 ms + 3%, grader/speed.py).
    t = speed.time_student(student, sm.speculative_accept, specs, check=check, reps=400)
    moved = case.bytes()  # both probability tensors, read once
    score.metrics(gbps=moved / t.mean_s / 1e9, copy_gbps=ceil.copy_bytes_per_s / 1e9, mean_us=t.mean_s * 1e6)
    score.speed(ceil.copy_fraction(moved, t.mean_s))
