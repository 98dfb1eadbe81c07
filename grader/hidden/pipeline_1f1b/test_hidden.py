"""Hidden checks for pipeline_1f1b.

The oracles live in oracle.py and are naive on purpose: schedules transcribed from the contract's formulas
(as lists, and again one op at a time), a simulator that sweeps the stages over and over until nothing
moves, another that starts one op at a time, earliest first, and gradients of the whole batch in float64.
None of them comes from the reference solution. Generated cases (random sizes, random valid and broken
schedules) are drawn from the run's seed; a failure names the first divergence and its usual cause.

Contract clauses (exercises/pipeline_1f1b/README.md, "The contract") and the tests that draw them:

| clause | tests |
| --- | --- |
| ops `("F"/"B", mb)`; interleaved `("F"/"B", mb, chunk)`, global chunk ids, chunk c on stage c % p | test_interleaved_chunks_live_on_their_stage; every exact-order test (as_ops, first_difference) |
| a schedule is a list of one list of ops per stage, run in order | test_*_exact_order*, test_*_generated_sizes_op_by_op; test_simulate_rejects_malformed_schedules (a stage that is not a list) |
| dependencies F(mb, c) <- F(mb, c - 1); B(mb, c) <- F(mb, c), B(mb, c + 1) | test_1f1b_is_valid_for_every_size, test_interleaved_is_valid (trusted simulator); test_simulate_* (two oracles) |
| gpipe_schedule: per stage F0..F(m-1), B0..B(m-1); peak m | test_gpipe_lists_every_forward_then_every_backward, test_gpipe_generated_sizes_op_by_op, test_gpipe_makespan_and_bubble |
| 1F1B: w = min(p - s - 1, m), F/B pairs, w backwards; F and B in order 0..m-1 | test_1f1b_warmup_counts, test_1f1b_backwards_are_first_in_first_out, test_1f1b_exact_order_and_peak_memory, test_1f1b_generated_sizes_op_by_op |
| 1F1B holds at most min(p - s, m) on stage s (the signature, schedule side) | test_1f1b_holds_at_most_min_p_minus_s_m_microbatches, test_1f1b_exact_order_and_peak_memory |
| GPipe and 1F1B: makespan (m + p - 1)(t_f + t_b), bubble (p - 1)/(m + p - 1) | test_gpipe_makespan_and_bubble, test_1f1b_makespan_and_bubble |
| interleaved: warm-up min(2(p - s - 1) + (v - 1)p, m v), k-th forward / backward formulas | test_interleaved_exact_order, test_interleaved_generated_sizes_op_by_op |
| interleaved bubble (p - 1)/(v m + p - 1) (the signature, bubble side) | test_interleaving_shrinks_the_bubble_by_v |
| p, m: positive ints, else ValueError (gpipe, 1F1B): zero, negative, float | test_gpipe_rejects_bad_sizes, test_1f1b_rejects_bad_sizes |
| interleaved ValueError: a size not a positive int (zero, negative, float; m = 0), v < 2, m % p != 0 | test_interleaved_rejects_bad_sizes |
| p = 1, m < p, m = p, m = p - 1 | GRID and INTERLEAVED_GRID (p from 1), plain_sizes, interleaved_sizes |
| simulate defaults (1.0, 2.0, 0.0) | test_simulate_known_schedules_with_random_costs; test_simulate_is_linear_* (makespans) |
| simulate: p = len(schedule), m = largest mb + 1, v = (largest chunk + 1) / p | test_simulate_random_valid_schedules, test_simulate_interleaved_schedules, test_simulate_against_an_event_by_event_oracle |
| cost model: stage free, each dependency done, p2p only across stages, F = t_f / v, B = t_b / v | test_simulate_known_schedules_with_random_costs, test_simulate_interleaved_schedules, test_simulate_against_an_event_by_event_oracle (start_cause, duration_cause) |
| makespan, bubble_fraction, peak_activations, timeline (start, end, op spelled as in the schedule) | sim_divergence in every simulate test |
| ValueError: an empty schedule, no ops | test_simulate_rejects_malformed_schedules ([], [[], []]) |
| ValueError: not an op (kind, arity, int ids >= 0, type) | test_simulate_rejects_malformed_schedules |
| ValueError: plain and interleaved mixed; missing, twice, misplaced; chunks not a multiple of p | test_simulate_rejects_malformed_schedules, test_simulate_flags_exactly_the_invalid_schedules, test_simulate_against_an_event_by_event_oracle |
| ValueError: a negative time | test_simulate_rejects_negative_times |
| ValueError: a deadlock, naming each stuck op by its repr | test_simulate_names_the_stuck_ops, test_simulate_against_an_event_by_event_oracle |
| simulate and the schedules: work linear in the ops | test_*_work_is_linear, test_simulate_is_linear_* |
| run_pipeline arguments: p pieces (plain) or p v (interleaved); m microbatches and targets | test_run_pipeline_matches_full_batch_gradients, test_run_pipeline_interleaved_chunks |
| run_pipeline ValueError: as simulate (a deadlock, a missing op, an op twice, an empty schedule) | test_run_pipeline_refuses_a_deadlock, test_run_pipeline_refuses_what_does_not_match_the_schedule |
| run_pipeline ValueError: pieces, microbatches or targets that do not match the schedule | test_run_pipeline_refuses_what_does_not_match_the_schedule |
| loss_fn(last output, targets[i]) / m, the loss_fn handed (MSE; cross-entropy, int64 targets) | test_run_pipeline_matches_full_batch_gradients, test_run_pipeline_scores_with_the_loss_fn_it_is_given |
| dtypes: float32 or float64 model and microbatches, gradients in the parameter's dtype | check_run (every run_pipeline test), test_run_pipeline_in_float64 |
| 1. gradients zeroed first | test_run_pipeline_zeroes_the_gradients_first |
| 2. the ops in an order that respects the schedule (any valid one) | test_run_pipeline_random_schedules, test_run_pipeline_with_your_own_1f1b; test_run_pipeline_holds_what_the_schedule_holds |
| 3./4. detached inputs, backward with the next piece's gradient, every reference dropped after B | check_run; test_run_pipeline_holds_what_the_schedule_holds (the census: autograd's hold and the saved storages) |
| 5. loss a float (the mean), grads per piece in parameters() order, zeros for a parameter with none | check_run, test_run_pipeline_gives_zeros_to_a_parameter_without_gradient |
| 5. peak_activations per stage, (mb, chunk) pairs | check_reported_peaks (1F1B, GPipe, interleaved), test_run_pipeline_holds_what_the_schedule_holds |
| the executor holds per stage what the schedule has in flight, nothing afterwards (the signature) | test_run_pipeline_holds_what_the_schedule_holds |
| microbatches all the same batch size | the caller's promise: every test keeps it, none breaks it |
"""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
import torch

from grader.hidden.pipeline_1f1b.oracle import (
    Invalid,
    Verdict,
    defined_schedule,
    event_oracle,
    expected_1f1b,
    expected_gpipe,
    expected_interleaved,
    full_batch_oracle,
    gpipe_op,
    interleaved_op,
    is_valid,
    one_f_one_b_op,
    trusted_simulate,
)
from grader.harness.client import SandboxError, StudentCrash, StudentLoadError, StudentTimeout
from grader.structure import Scaling, assert_flat_on_the_clock, clock
from grader.support import pipeline_1f1b as support
from grader.testing import assert_close, is_close, show, must_accept

DRIVER = "grader.support.pipeline_1f1b:census"
GRID = [(p, m) for p in range(1, 9) for m in range(1, 17)]
INTERLEAVED_GRID = [(p, m, v) for p in range(1, 9) for m in range(p, 17, p) for v in (2, 3, 4)]


@pytest.fixture(scope="module")
def pm(student):
    return student.load("pipeline_1f1b")


# --------------------------------------------------------------------------------------------------
# Reading the student's schedules, and messages that explain a difference


def plain_list(value, what: str) -> list:
    """A list or tuple the student's code returned, copied as a list once its type is checked. A tensor, an
    array or an object of the student's is refused unread: copying one element by element (list(), tuple(),
    a loop) makes a Python object per element in the grader's process, and a reply may hold a gigabyte."""
    if not isinstance(value, (list, tuple)):
        raise AssertionError(f"{what} should be a list, found {type(value).__name__} {show(value)}")
    return list(value)


def as_ops(schedule, what: str = "the schedule") -> list[list[tuple]]:
    """The student's schedule as lists of op tuples: a list per stage, each op a tuple or list
    ('F' or 'B', microbatch[, chunk])."""
    rows = [plain_list(row, f"{what}, stage {s}") for s, row in enumerate(plain_list(schedule, what))]
    for s, row in enumerate(rows):
        for i, op in enumerate(row):
            if not isinstance(op, (list, tuple)):
                raise AssertionError(
                    f"{what}, stage {s}, op {i}: an op is a tuple ('F' or 'B', microbatch) or "
                    f"('F' or 'B', microbatch, chunk), found {type(op).__name__} {show(op)}"
                )
    return [[tuple(op) for op in row] for row in rows]


def peaks_of(value, p: int, what: str) -> list:
    """peak_activations as a list of p numbers; a list or tuple, or a 1-D tensor of p entries (read only
    once its size is known). Anything else fails with `what` and the value, shown in bounded space."""
    if isinstance(value, torch.Tensor) and value.dim() == 1 and value.numel() == p:
        return value.tolist()
    if not isinstance(value, (list, tuple)):
        raise AssertionError(
            f"{what}: peak_activations should be a list of {p} ints (one per stage), found "
            f"{type(value).__name__} {show(value)}"
        )
    return list(value)


def show_ops(row, start: int = 0, stop: int | None = None) -> str:
    """Ops as the README draws them: F0 B0 (interleaved F0.2: microbatch 0 on chunk 2); a window [start:stop]."""
    stop = len(row) if stop is None else min(stop, len(row))
    text = " ".join(op[0] + ".".join(str(x) for x in op[1:]) for op in row[max(start, 0) : stop])
    return ("... " if start > 0 else "") + text + (" ..." if stop < len(row) else "")


def difference_cause(got_row, want_row, i: int, s: int, p: int, warmup_rule: str = "") -> str:
    """What usually makes op i of stage s differ from the definition (every op before it agrees)."""
    a, b = tuple(got_row[i]), tuple(want_row[i])
    nf_got, nf_want = forwards_before_first_backward(got_row), forwards_before_first_backward(want_row)
    if len(a) in (2, 3) and a[0] == "B" and ("F", *a[1:3]) not in {tuple(op) for op in got_row[:i]}:
        return (
            f"stage {s} runs {show(a)} before its own forward {show(('F', *a[1:3]))} ({nf_got} forwards before its first "
            f"backward, the definition {nf_want}): a backward needs its forward first. After the warm-up, each "
            "steady-state pair is a forward THEN a backward"
        )
    if nf_got != nf_want:
        return (
            f"stage {s} runs {nf_got} forwards before its first backward, the definition {nf_want}"
            + (f" ({warmup_rule})" if warmup_rule else "")
            + (": it runs every forward before any backward, GPipe's order"
               if 0 < nf_got < len(got_row) and all(op[0] == "B" for op in got_row[nf_got:]) else "")
            + ": check the warm-up count and its cap, and that each steady-state pair is a forward THEN a backward"
        )
    if len(a) != len(b) or a[0] not in ("F", "B"):
        return "an op is ('F' or 'B', microbatch) for a plain schedule, ('F' or 'B', microbatch, chunk) for an interleaved one"
    if a[0] != b[0]:
        return (
            "a forward and a backward out of turn: after the warm-up a stage alternates one forward, then one backward "
            "(of the oldest microbatch in flight), and then drains the backwards it still owes"
        )
    if len(b) == 3 and a[1] == b[1] and a[2] != b[2]:
        if a[2] % p != s:
            return (
                f"chunk {a[2]} lives on stage {a[2] % p}: stage {s} holds the global chunks {s}, {s + p}, "
                f"{s + 2 * p}, ... (local chunk j is global chunk j p + s)"
            )
        if b[0] == "B":
            return (
                "backwards visit a stage's chunks in the reverse order of its forwards: the k-th backward is on "
                "local chunk v - 1 - (k % (p v)) // p"
            )
        return "the k-th forward is on local chunk (k % (p v)) // p: a group of p microbatches goes through one chunk before the next"
    if a[0] == "B":
        return f"backwards go oldest first (first in, first out): here the oldest microbatch in flight is {b[1]}"
    return "forwards run in microbatch order" + (
        ", in groups of p per chunk: the k-th is microbatch (k // (p v)) p + k % p" if len(b) == 3 else ""
    )


def first_difference(got, want, what: str, warmup_rule=None) -> str:
    """The first op where `got` leaves `want`, with the ops around it and the usual cause ('' if none).
    `warmup_rule(s)`, if given, spells the definition's warm-up for stage s."""
    if len(got) != len(want):
        return f"{what}: expected {len(want)} stages, found {len(got)}"
    p = len(want)
    for s, (g, w) in enumerate(zip(got, want)):
        g = [tuple(op) for op in g]
        for i, (a, b) in enumerate(zip(g, w)):
            if a != b:
                rule = warmup_rule(s) if warmup_rule else ""
                return (
                    f"{what}: stage {s}, op {i} is {a!r}, the definition gives {b!r}. Around it, yours: "
                    f"{show_ops(g, i - 4, i + 5)}; the definition: {show_ops(w, i - 4, i + 5)}. Usual cause: "
                    f"{difference_cause(g, w, i, s, p, rule)}"
                )
        if len(g) != len(w):
            return (
                f"{what}: stage {s} has {len(g)} ops, expected {len(w)} (every microbatch's F and B once per chunk "
                f"the stage holds); the definition ends {show_ops(w, len(w) - 6)}"
            )
    return ""


def gpipe_rule(p: int, m: int):
    return lambda s: f"GPipe runs all m = {m} forwards first"


def one_f_one_b_rule(p: int, m: int):
    def rule(s: int) -> str:
        w = min(p - s - 1, m)
        return f"w = min(p - s - 1, m) = {w} warm-up forwards" + (
            ", then the steady state's first forward" if w < m else ""
        )

    return rule


def interleaved_rule(p: int, m: int, v: int):
    def rule(s: int) -> str:
        w = min(2 * (p - s - 1) + (v - 1) * p, m * v)
        return f"w = min(2(p - s - 1) + (v - 1)p, m v) = {w} warm-up forwards" + (
            ", then the steady state's first forward" if w < m * v else ""
        )

    return rule


def forwards_before_first_backward(row) -> int:
    for i, op in enumerate(row):
        if op[0] == "B":
            return i
    return len(row)


def random_valid_schedule(rnd: random.Random, p: int, m: int, v: int = 1) -> list[list[tuple]]:
    """Project a random topological order of all ops onto the stages: always deadlock-free."""
    n = p * v
    done: set = set()
    ready = [("F", mb, 0) for mb in range(m)]
    order = []
    while ready:
        op = ready.pop(rnd.randrange(len(ready)))
        order.append(op)
        done.add(op)
        kind, mb, c = op
        if kind == "F":
            if c + 1 < n:
                ready.append(("F", mb, c + 1))
            else:
                ready.append(("B", mb, c))
        elif c > 0:
            ready.append(("B", mb, c - 1))
    schedule: list[list[tuple]] = [[] for _ in range(p)]
    for kind, mb, c in order:
        schedule[c % p].append((kind, mb, c) if v > 1 else (kind, mb))
    return schedule


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


# Failures of the grader's machinery, never the student's own exception: passed on as they are.
NOT_THE_STUDENTS = (AssertionError, SandboxError, StudentCrash, StudentTimeout, StudentLoadError)


def must_raise_value_error(call, what: str, why: str) -> None:
    """`call()` must raise ValueError; another exception fails naming it (a TypeError from deep inside the code
    is not the clear refusal the contract asks for), and so does a return."""
    try:
        call()
    except ValueError:
        return
    except NOT_THE_STUDENTS:
        raise
    except Exception as exc:  # noqa: BLE001 - the student's own exception, named in the failure
        shown = f"{type(exc).__name__}: {exc}" if type(exc).__module__ != "student" else str(exc)
        pytest.fail(f"{what} raised {shown[:300]}, expected ValueError: {why}. Check the argument up front and "
                    "raise ValueError naming what was expected and what was found")
    pytest.fail(f"{what} should raise ValueError: {why}")


# --------------------------------------------------------------------------------------------------
# GPipe


@pytest.mark.check("gpipe")
def test_gpipe_lists_every_forward_then_every_backward(pm):
    for p, m in GRID:
        got = as_ops(pm.gpipe_schedule(p, m))
        diff = first_difference(got, expected_gpipe(p, m), f"gpipe_schedule({p}, {m})", gpipe_rule(p, m))
        assert not diff, diff
        sim = trusted_simulate(got, 1.0, 2.0)
        assert sim["peaks"] == [m] * p, (
            f"gpipe_schedule({p}, {m}): every stage should hold all {m} microbatches at its peak"
        )


FLUSH_TIMES = [(1.0, 2.0), (1.0, 1.0), (0.5, 1.5)]


def assert_flush_makespan_and_bubble(schedule, what: str, tf: float, tb: float, sizes, expected, rule) -> None:
    """GPipe and 1F1B both take (m + p - 1)(t_f + t_b), a bubble of (p - 1)/(m + p - 1). A failure names the
    first op where the schedule leaves `expected` (the definition; `rule` spells its warm-up)."""
    for p, m in sizes:
        got = as_ops(schedule(p, m))
        why = first_difference(got, expected(p, m), f"{what}({p}, {m})", rule(p, m)) or "the order is right"
        try:
            sim = trusted_simulate(got, tf, tb)
        except Invalid as exc:
            pytest.fail(f"{what}({p}, {m}) cannot run: {exc.args[0]}. First difference from the definition: {why}")
        want = (m + p - 1) * (tf + tb)
        assert close(sim["makespan"], want), (
            f"{what}({p}, {m}) takes {sim['makespan']:g} with t_f={tf}, t_b={tb}; GPipe and 1F1B both take "
            f"(m + p - 1)(t_f + t_b) = {want:g}. First difference from the definition: {why}"
        )
        assert close(sim["bubble"], (p - 1) / (m + p - 1)), (
            f"{what}({p}, {m}): bubble fraction {sim['bubble']:.4f}, expected (p-1)/(m+p-1) = {(p - 1) / (m + p - 1):.4f}. "
            f"First difference from the definition: {why}"
        )


@pytest.mark.check("gpipe")
@pytest.mark.parametrize("times", FLUSH_TIMES)
def test_gpipe_makespan_and_bubble(pm, times):
    assert_flush_makespan_and_bubble(
        pm.gpipe_schedule,
        "gpipe_schedule",
        *times,
        [(1, 1), (2, 5), (4, 8), (4, 3), (8, 16), (8, 2)],
        expected_gpipe,
        gpipe_rule,
    )


def runnable_schedule(expected, args: tuple, what: str):
    """A check for a counted call: the schedule holds each stage's ops of the definition, once each, and the
    trusted simulator runs it (the counts of a call that returned a placeholder say nothing of the work)."""

    def check(got) -> None:
        ops = as_ops(got, f"{what}{args}")
        want = expected(*args)
        assert [sorted(row) for row in ops] == [sorted(row) for row in want], (
            f"{what}{args} (a call whose lines are counted) does not hold each stage's ops, once each: "
            f"{first_difference(ops, want, f'{what}{args}')}"
        )
        try:
            trusted_simulate(ops)
        except Invalid as exc:
            raise AssertionError(f"{what}{args} (a call whose lines are counted) cannot run: {exc.args[0]}") from None

    return check


def assert_linear_work(student, fn, small: tuple, large: tuple, what: str, expected) -> None:
    """The lines of the student's module that fn(*large) executes grow at most 2x faster than its ops do; both
    calls' schedules are checked (`runnable_schedule`)."""
    got_small, lines_small = student.lines_executed(fn, *small, check=runnable_schedule(expected, small, what))
    got_large, lines_large = student.lines_executed(fn, *large, check=runnable_schedule(expected, large, what))
    ops_small = sum(len(row) for row in plain_list(got_small, f"{what}{small}"))
    ops_large = sum(len(row) for row in plain_list(got_large, f"{what}{large}"))
    assert ops_small > 0 and ops_large > ops_small, f"{what}{large} returned {ops_large} ops, {what}{small} {ops_small}"
    growth, ops_growth = lines_large / lines_small, ops_large / ops_small
    assert growth <= 2 * ops_growth, (
        f"{what}{small} ran {lines_small} lines of your code for {ops_small} ops and {what}{large} ran "
        f"{lines_large} for {ops_large} ({growth:.1f}x the lines for {ops_growth:.0f}x the ops): {LINEAR_ADVICE}"
    )


LINEAR_ADVICE = (
    "generating a schedule should cost a constant amount of work per op. Build each stage's list from the "
    "formulas directly; do not build every stage's ops and filter them per stage, or search a list for each op."
)

# The grader's own clock (grader/structure.py) beside the worker's line counts, which the submission can forge:
# about 128 ops, then 8192 (64x: p from 2 to 128 at m = 32; interleaved, p from 2 to 32 and m from 16 to 64).
# The schedules travel compactly (grader.support.pipeline_1f1b: a generator's result stays in the worker and only
# its digest comes back; a schedule to simulate goes as one tensor and only its makespan comes back), so the timed
# calls are the student's work and not the round trip's. m grows at every call (by 1, or by p when interleaved),
# so no call repeats an earlier one (a cache gains nothing), and each time is scaled to exactly 128 or 8192 ops.
#
# Linear work itself grows faster than its size on a busy machine (the allocator, the caches, the other jobs):
# with absolute bars the reference once took 116x for interleaved against a bar of 60x. So each run also times a
# trusted linear baseline of the same size through the same path (schedule_baseline: as many ops, built by the
# simplest loop; simulate_baseline: the same unpacking and one dependency lookup per op), and the bar applies to
# the call's growth beyond the baseline's. Measured on the course's shared 2-core machine under heavy load (a CI
# run, two graders and the tests at once), sandbox, two runs each, growth / baseline growth = ratio:
#   reference   gpipe 27-29 / 19-23 = 1.2-1.5   1f1b 22-29 / 18-26 = 1.1-1.3   interleaved 19-43 / 21-35 = 0.9-1.2
#               simulate 46-53 / 9-13 = 3.5-6.0   simulate interleaved 56-61 / 11-21 = 2.9-5.1
#   walk_rescans_from_stage_0 (simulate interleaved) 245-343 / 13-30 = 11.6-19
# Earlier, absolute figures: interleaved_filters_every_stage interleaved 47-95 (sandbox), walk_rescans_from_stage_0
# simulate 284-676. The bars sit 2.5x or more above the reference's worst; in-process (make check, where nothing
# needs to be forged) twice the sandbox's. So the clock proves gross superlinear work (rescanning the stages for
# each op of a 1F1B schedule, about 20-45 times linear work's growth); milder growth (a filter over every stage's
# ops, 2-4 times; a rescan on interleaved schedules, 12-19 times) is caught only now and then, and is left to the
# lines.
LINEAR_CLOCK = {
    "plain": Scaling(128, 8192, bar=4.0, bar_in_process=8.0, unit="ops"),
    "interleaved": Scaling(128, 8192, bar=4.0, bar_in_process=8.0, unit="ops"),
    "simulate": Scaling(128, 8192, bar=12.0, bar_in_process=24.0, unit="ops"),
    "simulate_interleaved": Scaling(128, 8192, bar=12.0, bar_in_process=24.0, unit="ops"),
}
LINEAR_SIZES: dict[str, dict[int, tuple[int, ...]]] = {
    "plain": {128: (2, 32), 8192: (128, 32)}, "interleaved": {128: (2, 16, 2), 8192: (32, 64, 2)}}
SUPPORT = "grader.support.pipeline_1f1b"


def sizes_per_run(kind: str):
    """make(n) for the clock: the sizes for about n ops, m larger at every call of that size."""
    calls: Counter = Counter()

    def make(n: int) -> tuple:
        base = LINEAR_SIZES[kind][n]
        p, m = base[0], base[1] + calls[n] * (base[0] if len(base) == 3 else 1)
        calls[n] += 1
        return (p, m, *base[2:])

    return make


def assert_linear_on_the_clock(student, fn, oracle, kind: str, what: str) -> None:
    """The grader's clock around fn at about 128 and 8192 ops, and for the same ops over 2 stages and over many
    (STAGES_CLOCK); each result's digest checked against the oracle's."""
    timing = schedule_timing(student, fn, oracle, what, sizes_per_run(kind), LINEAR_CLOCK[kind],
                             work=lambda got, *args: got["ops"])
    assert_flat_on_the_clock(timing, what, LINEAR_ADVICE, loop="more work per op when there are more stages")
    timing = schedule_timing(student, fn, oracle, what, shapes_per_run(kind), STAGES_CLOCK[kind],
                             work=lambda got, *args: shape_of(args[0], kind) * got["ops"] / STAGES_OPS[kind])
    assert_flat_on_the_clock(timing, what, LINEAR_ADVICE, loop="work per op that grows with the stages")
    timing = schedule_timing(student, fn, oracle, what, microbatches_per_run(kind), MICROBATCH_CLOCK[kind],
                             work=lambda got, p, m, *rest: m)
    assert_flat_on_the_clock(timing, what, LINEAR_ADVICE, loop="work per op that grows with the micro-batches")


def schedule_timing(student, fn, oracle, what: str, make, scaling: Scaling, work):
    """`clock` around the schedule generator fn, its result's digest checked against the oracle's, beside the
    trusted linear baseline of the same sizes."""

    def check(got, *args) -> None:
        want = oracle(*args)
        assert isinstance(got, dict) and got.get("digest") == support.digest(want), (
            f"{what}{args} (timed on the grader's clock) did not return the schedule it returns when its result "
            f"is sent back, or a wrong one: expected {sum(map(len, want))} ops"
        )

    return clock(
        student.mode,
        lambda *args: student.drive(f"{SUPPORT}:schedule_digest", fn, *args),
        make,
        check,
        scaling,
        work=work,
        linear=lambda *args: student.drive(f"{SUPPORT}:schedule_baseline", fn, *args),
    )


# The same work over few stages and over many: the probes above grow the ops and the stages together, so a
# per-op cost that grows with p (a filter over every stage's ops, a rescan of the stages for each op) shows
# only as fast as p grows beside the ops, and work done by C (itertools, map over operator functions,
# list.index) costs 5-50 ns per stage visited, against 0.2-3 us per op of honest Python: at p = 32 or 128
# such code grew only 2-5 times as fast as linear work (red team rounds 15 and 16). Here the ops stay
# fixed and only p changes, 2 against 4096 (plain schedules: m = 2048 against 1) or 2 against 128
# (interleaved, where m is a multiple of p: 65536 ops), so honest code costs about the same at both and a
# per-stage term shows whole. Measured in the sandbox on the course's 2-core machine (four grades, seeds 1-3
# and 7, beside other jobs), cost growth / linear growth:
#   reference   gpipe 0.9-1.2   1f1b 1.0-1.4   interleaved 0.7-0.95   simulate 0.6-1.1
#   interleaved_filters_in_c (each stage's forwards filtered from every stage's by compress and operator): 5.6
#   next_stage_by_index (simulate finds a stage to run by flags.index(True)): 4.9
#   walk_rescans_in_c (simulate rescans from stage 0 by compress(count(), map(done.__contains__, ...))): 16.8
# (in-process, one thread, the interleaved filter costs 6.6x the reference per op at p = 64 and 11x at p = 128;
# the digest the driver returns is hashed from the schedule's repr, so it no longer hides that: support.digest)
# The small shape counts for at most `linear_cap` times the trusted baseline of that shape, so padding it
# with work (a scan padded to a fixed length) buys only that much (grader/CHECKS.md says what is left).
STAGES_CLOCK = {
    "plain": Scaling(2, 4096, bar=3.0, bar_in_process=4.0, unit="stages", same="8192 ops", small_cap=math.inf,
                     linear_cap=10.0),
    "interleaved": Scaling(2, 128, bar=3.0, bar_in_process=4.0, unit="stages", same="65536 ops",
                           small_cap=math.inf, linear_cap=10.0),
    "simulate": Scaling(2, 4096, bar=3.0, bar_in_process=4.0, unit="stages", same="8192 ops", small_cap=math.inf,
                        linear_cap=15.0),
}
STAGES_OPS = {"plain": 8192, "interleaved": 65536, "simulate": 8192}

# More micro-batches over the same 2 stages: the probes above hold m at 32 or sweep it down as p grows, so work
# per op that grows with m (a check of each op against a list of those seen, `op in seen`; a dependency found by
# list.index) went unseen, and at STAGES_CLOCK's small shape (p = 2, m = 2048) it only lowered the ratio (red
# team round 18: 1F1B and simulate quadratic in m kept 15/15 and 5/5, ratios 0.13-0.32). Here m grows 64-fold
# (32x for interleaved, v = 2) at p = 2, against the trusted baseline of the same sizes.
MICROBATCH_CLOCK = {
    "plain": Scaling(64, 4096, bar=3.0, bar_in_process=4.0, unit="micro-batches"),
    "interleaved": Scaling(64, 2048, bar=3.0, bar_in_process=4.0, unit="micro-batches"),
    "simulate": Scaling(64, 4096, bar=8.0, bar_in_process=16.0, unit="micro-batches"),
}


def microbatches_per_run(kind: str):
    """make(m) for the micro-batch probes: p = 2 and m micro-batches (v = 2 interleaved), m a little larger at
    every call of that size (by p where m must be a multiple of it), so that no call repeats an earlier one."""
    calls: Counter = Counter()

    def make(m: int) -> tuple:
        k, calls[m] = calls[m], calls[m] + 1
        return (2, m + 2 * k, 2) if kind == "interleaved" else (2, m + k)

    return make


def shapes_per_run(kind: str):
    """make(p) for the stage probes: the sizes for STAGES_OPS[kind] ops over p stages, and a little more at
    every call of that shape (m at the few stages, p at the many), so that no call repeats an earlier one."""
    calls: Counter = Counter()

    def make(p: int) -> tuple:
        k, calls[p] = calls[p], calls[p] + 1
        if kind == "interleaved":
            return (p, STAGES_OPS[kind] // (4 * p) + p * k, 2) if p == 2 else (p + k, p + k, 2)
        return (p, STAGES_OPS[kind] // (2 * p) + k) if p == 2 else (p + k, 1)

    return make


def shape_of(p: int, kind: str) -> int:
    """Which of the probe's two shapes a call of p stages is (its Scaling size): `clock` scales each time to it."""
    return 2 if p == 2 else STAGES_CLOCK[kind].large


@pytest.mark.check("gpipe")
def test_gpipe_work_is_linear(student, pm):
    assert_linear_work(student, pm.gpipe_schedule, (4, 8), (32, 32), "gpipe_schedule", expected_gpipe)
    assert_linear_on_the_clock(student, pm.gpipe_schedule, expected_gpipe, "plain", "gpipe_schedule")


@pytest.mark.check("gpipe")
@pytest.mark.parametrize("args", [(0, 4), (3, 0), (-1, 2), (2.0, 4)])
def test_gpipe_rejects_bad_sizes(pm, args):
    must_accept("gpipe_schedule(2, 3)", lambda: pm.gpipe_schedule(2, 3))
    with pytest.raises(ValueError):
        pm.gpipe_schedule(*args)
        pytest.fail(f"gpipe_schedule{args} should raise ValueError: sizes are positive ints")


# --------------------------------------------------------------------------------------------------
# 1F1B


@pytest.mark.check("one_f_one_b")
def test_1f1b_is_valid_for_every_size(pm):
    for p, m in GRID:
        got = as_ops(pm.one_f_one_b_schedule(p, m))
        assert len(got) == p, f"one_f_one_b_schedule({p}, {m}) returned {len(got)} stages, expected {p}"
        try:
            trusted_simulate(got)
        except Invalid as exc:
            why = first_difference(got, expected_1f1b(p, m), f"one_f_one_b_schedule({p}, {m})", one_f_one_b_rule(p, m))
            pytest.fail(
                f"one_f_one_b_schedule({p}, {m}) cannot run: {exc.args[0]}. First difference from the definition: {why}"
            )


@pytest.mark.check("one_f_one_b")
def test_1f1b_warmup_counts(pm):
    for p, m in GRID:
        got = as_ops(pm.one_f_one_b_schedule(p, m))
        for s, row in enumerate(got):
            w = min(p - s - 1, m)
            got_n, want_n = forwards_before_first_backward(row), min(w + 1, m)
            assert got_n == want_n, (
                f"one_f_one_b_schedule({p}, {m}), stage {s}: {got_n} forwards before the first backward, expected "
                f"{want_n}: w = min(p - s - 1, m) = {w} warm-up forwards, then the steady state's first forward"
                + (" (m < p: the warm-up is capped by m)" if m < p else "")
                + (f"; all {m} forwards before any backward is GPipe's order, which holds every microbatch"
                   if got_n == m else "")
            )


@pytest.mark.check("one_f_one_b")
def test_1f1b_backwards_are_first_in_first_out(pm):
    for p, m in GRID:
        got = as_ops(pm.one_f_one_b_schedule(p, m))
        for s, row in enumerate(got):
            backs = [op[1] for op in row if op[0] == "B"]
            fwds = [op[1] for op in row if op[0] == "F"]
            assert fwds == list(range(m)), (
                f"one_f_one_b_schedule({p}, {m}), stage {s}: forwards run {fwds}, expected 0..{m - 1} in order"
            )
            assert backs == list(range(m)), (
                f"one_f_one_b_schedule({p}, {m}), stage {s}: backwards run {backs}, expected 0..{m - 1} in order: "
                "the oldest microbatch in flight goes back first (its gradient arrives first)"
            )


@pytest.mark.check("one_f_one_b")
def test_1f1b_holds_at_most_min_p_minus_s_m_microbatches(pm):
    """The point of 1F1B: stage s holds at most min(p - s, m) microbatches' activations (GPipe holds m), counted by
    the trusted simulator along each stage's list."""
    for p, m in GRID:
        got = as_ops(pm.one_f_one_b_schedule(p, m))
        assert len(got) == p, f"one_f_one_b_schedule({p}, {m}) returned {len(got)} stages, expected {p}"
        peaks = trusted_simulate(got)["peaks"] if is_valid(got) else None
        want = [min(p - s, m) for s in range(p)]
        if peaks is None:
            pytest.fail(f"one_f_one_b_schedule({p}, {m}) cannot run (test_1f1b_is_valid_for_every_size says why)")
        more = [s for s in range(p) if peaks[s] > want[s]]
        assert not more, (
            f"one_f_one_b_schedule({p}, {m}): stage {more[0]} has up to {peaks[more[0]]} microbatches in flight "
            f"(forward run, backward not yet), where 1F1B holds at most min(p - s, m) = {want[more[0]]}; per stage "
            f"{peaks} against {want}. A schedule that runs more forwards before its backwards is valid, and takes as "
            "long, but it keeps more activations: the warm-up is p - s - 1 forwards, then one forward and one backward"
        )
        assert peaks == want, (
            f"one_f_one_b_schedule({p}, {m}): peak microbatches in flight per stage are {peaks}, expected {want}"
        )


@pytest.mark.check("one_f_one_b")
def test_1f1b_exact_order_and_peak_memory(pm):
    for p, m in GRID:
        got = as_ops(pm.one_f_one_b_schedule(p, m))
        diff = first_difference(got, expected_1f1b(p, m), f"one_f_one_b_schedule({p}, {m})", one_f_one_b_rule(p, m))
        assert not diff, diff
        peaks = trusted_simulate(got)["peaks"]
        want = [min(p - s, m) for s in range(p)]
        assert peaks == want, (
            f"one_f_one_b_schedule({p}, {m}): peak microbatches in flight per stage are {peaks}, expected {want}"
        )


@pytest.mark.check("one_f_one_b")
@pytest.mark.parametrize("times", FLUSH_TIMES)
def test_1f1b_makespan_and_bubble(pm, times):
    assert_flush_makespan_and_bubble(
        pm.one_f_one_b_schedule,
        "one_f_one_b_schedule",
        *times,
        [(1, 1), (2, 5), (4, 8), (4, 3), (8, 16), (8, 2), (6, 7)],
        expected_1f1b,
        one_f_one_b_rule,
    )


@pytest.mark.check("one_f_one_b")
def test_1f1b_work_is_linear(student, pm):
    assert_linear_work(student, pm.one_f_one_b_schedule, (4, 8), (32, 32), "one_f_one_b_schedule", expected_1f1b)
    assert_linear_on_the_clock(student, pm.one_f_one_b_schedule, expected_1f1b, "plain", "one_f_one_b_schedule")


@pytest.mark.check("one_f_one_b")
def test_1f1b_rejects_bad_sizes(pm):
    must_accept("one_f_one_b_schedule(2, 3)", lambda: pm.one_f_one_b_schedule(2, 3))
    for args in [(0, 3), (2, 0), (2, -3), (2.0, 3), (2, 3.0)]:
        bad = next(x for x in args if isinstance(x, float) or x < 1)
        must_raise_value_error(lambda: pm.one_f_one_b_schedule(*args), f"one_f_one_b_schedule{args}",
                               f"sizes are positive ints, and {bad!r} is " + (
                                   "a float, not an int" if isinstance(bad, float) else "not positive"))


# --------------------------------------------------------------------------------------------------
# Interleaved


@pytest.mark.check("interleaved")
def test_interleaved_chunks_live_on_their_stage(pm):
    for p, m, v in INTERLEAVED_GRID:
        got = as_ops(pm.interleaved_schedule(p, m, v))
        assert len(got) == p, f"interleaved_schedule({p}, {m}, {v}) returned {len(got)} stages, expected {p}"
        for s, row in enumerate(got):
            chunks = sorted({op[2] for op in row if len(op) == 3})
            want = list(range(s, p * v, p))
            assert all(len(op) == 3 for op in row), (
                f"interleaved_schedule({p}, {m}, {v}): ops must be ('F'|'B', mb, chunk), found {row[:3]}"
            )
            assert chunks == want, (
                f"interleaved_schedule({p}, {m}, {v}), stage {s} runs chunks {chunks}, expected {want}: "
                "chunk ids are global and chunk c lives on stage c % p (local chunk j of stage s is j*p + s)"
            )


@pytest.mark.check("interleaved")
def test_interleaved_is_valid(pm):
    for p, m, v in INTERLEAVED_GRID:
        got = as_ops(pm.interleaved_schedule(p, m, v))
        try:
            trusted_simulate(got)
        except Invalid as exc:
            why = first_difference(
                got, expected_interleaved(p, m, v), f"interleaved_schedule({p}, {m}, {v})", interleaved_rule(p, m, v)
            )
            pytest.fail(
                f"interleaved_schedule({p}, {m}, {v}) cannot run: {exc.args[0]}. First difference from the "
                f"definition: {why}"
            )


@pytest.mark.check("interleaved")
def test_interleaved_exact_order(pm):
    for p, m, v in INTERLEAVED_GRID:
        got = as_ops(pm.interleaved_schedule(p, m, v))
        for s, row in enumerate(got):
            w = min(2 * (p - s - 1) + (v - 1) * p, m * v)
            got_n, want_n = forwards_before_first_backward(row), min(w + 1, m * v)
            assert got_n == want_n, (
                f"interleaved_schedule({p}, {m}, {v}), stage {s}: {got_n} forwards before the first backward, expected "
                f"{want_n}: w = min(2(p - s - 1) + (v - 1)p, m v) = {w} warm-up forwards, then the steady state's first forward"
                + (f"; all m v = {m * v} forwards before any backward is GPipe's order over the chunks, which holds "
                   "every (microbatch, chunk) pair" if got_n == m * v else "")
            )
        diff = first_difference(
            got, expected_interleaved(p, m, v), f"interleaved_schedule({p}, {m}, {v})", interleaved_rule(p, m, v)
        )
        assert not diff, diff


@pytest.mark.check("interleaved")
def test_interleaving_shrinks_the_bubble_by_v(pm):
    for p, m, v in [(4, 8, 2), (4, 8, 4), (2, 6, 3), (8, 16, 2), (3, 3, 2)]:
        got = as_ops(pm.interleaved_schedule(p, m, v))
        why = (
            first_difference(
                got, expected_interleaved(p, m, v), f"interleaved_schedule({p}, {m}, {v})", interleaved_rule(p, m, v)
            )
            or "the order is right"
        )
        try:
            sim = trusted_simulate(got, 1.0, 2.0)
        except Invalid as exc:
            pytest.fail(f"interleaved_schedule({p}, {m}, {v}) cannot run: {exc.args[0]}. First difference: {why}")
        want = (m + (p - 1) / v) * 3.0
        assert close(sim["makespan"], want), (
            f"interleaved_schedule({p}, {m}, {v}) takes {sim['makespan']:g} (t_f=1, t_b=2, each chunk op 1/v of that); "
            f"the Megatron schedule takes (m + (p-1)/v)(t_f + t_b) = {want:g}: the bubble shrinks by v. First "
            f"difference from the definition: {why}"
        )
        assert close(sim["bubble"], (p - 1) / (v * m + p - 1)), (
            f"interleaved_schedule({p}, {m}, {v}): bubble fraction {sim['bubble']:.4f}, expected (p-1)/(vm+p-1) = "
            f"{(p - 1) / (v * m + p - 1):.4f} (plain 1F1B: {(p - 1) / (m + p - 1):.4f})"
        )


@pytest.mark.check("interleaved")
def test_interleaved_work_is_linear(student, pm):
    # 128 ops, then 4096 (32x); then v = 4 at the same p and m: twice the ops, so at most 4x the lines.
    assert_linear_work(
        student, pm.interleaved_schedule, (4, 8, 2), (16, 64, 2), "interleaved_schedule", expected_interleaved
    )
    assert_linear_work(
        student, pm.interleaved_schedule, (16, 64, 2), (16, 64, 4), "interleaved_schedule", expected_interleaved
    )
    assert_linear_on_the_clock(
        student, pm.interleaved_schedule, expected_interleaved, "interleaved", "interleaved_schedule"
    )


@pytest.mark.check("interleaved")
@pytest.mark.parametrize(
    "args,why",
    [((4, 6, 2), "m = 6 is not a multiple of p = 4"), ((4, 8, 1), "v = 1 chunk per stage: interleaving needs v >= 2"),
     ((3, 5, 2), "m = 5 is not a multiple of p = 3"), ((0, 4, 2), "p = 0 stages"), ((2, 4, 0), "v = 0 chunks"),
     ((2, 0, 2), "m = 0 microbatches (0 is a multiple of p, but m must be positive)"), ((-2, 4, 2), "p = -2 stages"),
     ((2.0, 4, 2), "p = 2.0 is a float, not an int"), ((2, 4, 2.0), "v = 2.0 is a float, not an int")],
)
def test_interleaved_rejects_bad_sizes(pm, args, why):
    must_accept("interleaved_schedule(2, 4, 2)", lambda: pm.interleaved_schedule(2, 4, 2))
    must_raise_value_error(lambda: pm.interleaved_schedule(*args), f"interleaved_schedule{args}",
                           f"{why} (sizes are positive ints, with m % p == 0 and v >= 2)")


# --------------------------------------------------------------------------------------------------
# Generated sizes: each schedule, op by op, at random (p, m, v) beyond the grids above


def seeded(rng: torch.Generator) -> random.Random:
    return random.Random(int(torch.randint(0, 2**31, (1,), generator=rng)))


def plain_sizes(rnd: random.Random) -> list[tuple[int, int]]:
    """Past the grid (p up to 16, m up to 64), with the edges every schedule has: m < p, m = p, m = p - 1, p = 1."""
    p = rnd.randint(9, 16)
    return [
        (p, rnd.randint(1, p - 2)),
        (p, p),
        (p, p - 1),
        (1, rnd.randint(17, 64)),
        (rnd.randint(2, 16), 1),
        (rnd.randint(2, 16), rnd.randint(17, 48)),
        (rnd.randint(2, 8), rnd.randint(1, 48)),
    ]


def interleaved_sizes(rnd: random.Random) -> list[tuple[int, int, int]]:
    """p up to 12, m = p times 1 to 6 groups, v up to 5, at most about 1500 forwards in all."""
    sizes = [(1, rnd.randint(1, 12), rnd.randint(2, 5))]
    while len(sizes) < 6:
        p, v = rnd.randint(2, 12), rnd.randint(2, 5)
        groups = rnd.randint(1, max(1, min(6, 1500 // (p * p * v))))
        sizes.append((p, p * groups, v))
    return sizes


def assert_matches_definition(got, op_at, sizes: tuple, what: str, rule) -> None:
    want = defined_schedule(op_at, *sizes)
    diff = first_difference(as_ops(got), want, f"{what}{sizes}", rule(*sizes))
    assert not diff, diff


@pytest.mark.check("gpipe")
def test_gpipe_generated_sizes_op_by_op(pm, rng):
    for p, m in plain_sizes(seeded(rng)):
        assert_matches_definition(pm.gpipe_schedule(p, m), gpipe_op, (p, m), "gpipe_schedule", gpipe_rule)


@pytest.mark.check("one_f_one_b")
def test_1f1b_generated_sizes_op_by_op(pm, rng):
    for p, m in plain_sizes(seeded(rng)):
        assert_matches_definition(
            pm.one_f_one_b_schedule(p, m), one_f_one_b_op, (p, m), "one_f_one_b_schedule", one_f_one_b_rule
        )


@pytest.mark.check("interleaved")
def test_interleaved_generated_sizes_op_by_op(pm, rng):
    for p, m, v in interleaved_sizes(seeded(rng)):
        assert_matches_definition(
            pm.interleaved_schedule(p, m, v), interleaved_op, (p, m, v), "interleaved_schedule", interleaved_rule
        )


# --------------------------------------------------------------------------------------------------
# Simulator


def show_schedule(schedule) -> str:
    return "; ".join(f"stage {s}: {show_ops(row)}" for s, row in enumerate(schedule))


def start_cause(want: Verdict, s: int, i: int, got_start: float, times: tuple) -> str:
    """Why op i of stage s starts at got_start rather than when the contract starts it (every op that starts
    earlier is right, so its inputs' end times and its stage's free time are the oracle's)."""
    tf, tb, p2p = times
    row = want.timeline[s]
    start, _, op = row[i]
    free = row[i - 1][1] if i else 0.0
    ends = {(o[0], o[1], o[2] if len(o) == 3 else t): (e, t) for t, r in enumerate(want.timeline) for _, e, o in r}
    kind, mb, c = op[0], op[1], op[2] if len(op) == 3 else s
    deps = [("F", mb, c - 1)] if kind == "F" and c > 0 else []
    if kind == "B":
        deps = [("F", mb, c)] + ([("B", mb, c + 1)] if ("B", mb, c + 1) in ends else [])
    spell = (lambda d: d) if len(op) == 3 else (lambda d: d[:2])
    arrivals = [(spell(d), ends[d][0], ends[d][1]) for d in deps]
    no_p2p = max([free] + [e for _, e, _ in arrivals])
    all_p2p = max([free] + [e + p2p for _, e, _ in arrivals])
    same = [d for d, _, t in arrivals if t == s]
    other = [(d, t) for d, _, t in arrivals if t != s]
    if p2p > 0 and same and close(got_start, all_p2p) and not close(all_p2p, start):
        return (
            f"that is p2p_time = {p2p:g} late: its input {same[0]!r} ran on this same stage, and only an input from "
            "another stage arrives p2p_time after it ends"
        )
    if p2p > 0 and other and close(got_start, no_p2p) and not close(no_p2p, start):
        return (
            f"p2p_time = {p2p:g} is missing: its input {other[0][0]!r} ran on stage {other[0][1]}, so it arrives "
            "p2p_time after it ends"
        )
    limits = [f"its stage is free at {free:g} (after {spell(row[i - 1][2])!r})" if i else "its stage is free at 0"]
    limits += [
        f"{d!r} (stage {t}) ends at {e:g}" + (f" and arrives at {e + p2p:g}" if t != s and p2p else "")
        for d, e, t in arrivals
    ]
    if got_start < start and not close(got_start, start):
        return "it starts before all of its inputs are ready: " + "; ".join(limits)
    return "it starts later than it can: an op starts as soon as " + "; ".join(limits)


def duration_cause(got: float, want: float, kind: str, times: tuple, v: int) -> str:
    tf, tb, _ = times
    mine, other = (tf, tb) if kind == "F" else (tb, tf)
    if v > 1 and close(got, mine):
        return f"an op on one of v = {v} chunks costs 1/v of the stage's time: {'forward' if kind == 'F' else 'backward'}_time / v = {want:g}"
    if close(got, other / v) and not close(other, mine):
        return "that is the other kind's cost: a forward costs forward_time / v, a backward backward_time / v"
    return f"a forward costs forward_time / v = {tf / v:g} and a backward backward_time / v = {tb / v:g} (v = {v})"


def sim_divergence(got, want: Verdict, times: tuple) -> str:
    """The first place where the student's SimResult leaves the oracle's, and what usually causes it ('' if none)."""
    fields = getattr(got, "_fields", ())
    if not isinstance(fields, tuple) or fields != ("makespan", "bubble_fraction", "peak_activations", "timeline"):
        return (
            f"simulate should return the SimResult NamedTuple (makespan, bubble_fraction, peak_activations, "
            f"timeline), found a {type(got).__name__} with fields {show(fields)}"
        )
    p = len(want.timeline)
    if not isinstance(got.timeline, (list, tuple)):
        return f"the timeline should be a list (one list of (start, end, op) per stage), found {type(got.timeline).__name__} {show(got.timeline)}"
    if len(got.timeline) != p:
        return f"the timeline has {len(got.timeline)} rows, expected one per stage ({p})"
    first = None
    for s, (g, w) in enumerate(zip(got.timeline, want.timeline)):
        if not isinstance(g, (list, tuple)):
            return f"stage {s}'s timeline should be a list of (start, end, op), found {type(g).__name__} {show(g)}"
        if len(g) != len(w):
            return f"stage {s}'s timeline has {len(g)} entries, expected {len(w)}: one (start, end, op) per op, in the stage's order"
        for i, (entry, (ws, we, wop)) in enumerate(zip(g, w)):
            if not (isinstance(entry, (list, tuple)) and len(entry) == 3 and isinstance(entry[2], (list, tuple))):
                return (
                    f"stage {s}'s timeline entry {i} should be (start, end, op) with op a tuple such as {wop!r}, "
                    f"found {type(entry).__name__} {show(entry)}"
                )
            gs, ge, gop = entry
            gop = tuple(gop)
            if gop != wop:
                return f"stage {s}'s timeline lists {gop!r} at entry {i}, where the schedule has {wop!r}: keep each stage's order and spell ops as the schedule does"
            if not (close(gs, ws) and close(ge, we)) and (first is None or (ws, s) < first[:2]):
                first = (ws, s, i, gs, ge)
    if first is not None:
        ws, s, i, gs, ge = first
        _, we, op = want.timeline[s][i]
        cause = (
            start_cause(want, s, i, gs, times)
            if not close(gs, ws)
            else duration_cause(ge - gs, we - ws, op[0], times, want.v)
        )
        return (
            f"first divergence at time {ws:g}: stage {s}, op {i} {op!r} runs ({gs:g}, {ge:g}), the contract gives "
            f"({ws:g}, {we:g}): {cause}"
        )
    if not close(got.makespan, want.makespan):
        return (
            f"the timeline is right but makespan is {got.makespan:g}: it is the end of the last op, {want.makespan:g}"
        )
    if not close(got.bubble_fraction, want.bubble):
        busy = (1 - want.bubble) * p * want.makespan
        why = "idle stage-time over total stage-time, (p * makespan - busy) / (p * makespan)"
        if close(got.bubble_fraction, (p * want.makespan - busy) / want.makespan):
            why = "you divided by the makespan; divide by p * makespan, the total stage-time"
        elif close(got.bubble_fraction, 1 - want.bubble):
            why = "that is the busy fraction; the bubble is the idle one, 1 minus it"
        return f"bubble_fraction is {got.bubble_fraction:.6g}, the contract gives {want.bubble:.6g}: {why}"
    try:
        got_peaks = peaks_of(got.peak_activations, p, "simulate")
    except AssertionError as exc:
        return str(exc)
    if got_peaks != list(want.peaks):
        if len(got_peaks) != p:
            return f"peak_activations has {len(got_peaks)} entries, expected one per stage ({p})"
        s = next(s for s in range(p) if got_peaks[s] != want.peaks[s])
        return (
            f"stage {s}: peak_activations is {got_peaks[s]}, the contract gives {want.peaks[s]}: along the stage's "
            "own list, the most (microbatch, chunk) pairs whose F ran and whose B has not"
        )
    return ""


def compare_sim(got, want: dict, what: str, times: tuple = (1.0, 2.0, 0.0)) -> None:
    """The student's SimResult against the trusted simulator's, at its first divergence (see sim_divergence)."""
    timeline = tuple(tuple(row) for row in want["timeline"])
    ops = [op for row in timeline for _, _, op in row]
    v = (1 + max(op[2] for op in ops)) // len(timeline) if len(ops[0]) == 3 else 1
    verdict = Verdict(
        makespan=want["makespan"], bubble=want["bubble"], peaks=tuple(want["peaks"]), timeline=timeline, v=v
    )
    diff = sim_divergence(got, verdict, times)
    assert not diff, f"{what}: {diff}"


@pytest.mark.check("simulate")
def test_simulate_known_schedules_with_random_costs(pm, rng):
    rnd = random.Random(int(torch.randint(0, 2**31, (1,), generator=rng)))
    for p, m in [(1, 3), (3, 2), (4, 8), (5, 5)]:
        tf, tb, p2p = rnd.uniform(0.5, 2), rnd.uniform(0.5, 3), rnd.choice([0.0, rnd.uniform(0.05, 0.5)])
        for name, sched in [("gpipe", expected_gpipe(p, m)), ("1F1B", expected_1f1b(p, m))]:
            want = trusted_simulate(sched, 1.0, 2.0, 0.0)
            label = f"simulate({name} p={p} m={m}) with the default times (t_f=1, t_b=2, p2p=0)"
            try:
                compare_sim(pm.simulate(sched), want, label)
            except AssertionError as exc:
                try:  # the same times spelled out: if that is right, the defaults are what is wrong
                    compare_sim(pm.simulate(sched, 1.0, 2.0, 0.0), want, label)
                except AssertionError:
                    raise exc from None
                raise AssertionError(
                    f"{label}: your default times are not the contract's (forward_time=1.0, backward_time=2.0, "
                    f"p2p_time=0.0): simulate(schedule, 1.0, 2.0, 0.0), the same times spelled out, is right, and "
                    f"simulate(schedule) is not: {exc.args[0].removeprefix(label + ': ')}"
                ) from None
            got = pm.simulate(sched, tf, tb, p2p)
            compare_sim(
                got,
                trusted_simulate(sched, tf, tb, p2p),
                f"simulate({name} p={p} m={m}, t_f={tf:.3f}, t_b={tb:.3f}, p2p={p2p:.3f})",
                (tf, tb, p2p),
            )


@pytest.mark.check("simulate")
def test_simulate_random_valid_schedules(pm, rng):
    rnd = random.Random(int(torch.randint(0, 2**31, (1,), generator=rng)))
    for _ in range(12):
        p, m = rnd.randint(1, 5), rnd.randint(1, 6)
        sched = random_valid_schedule(rnd, p, m)
        tf, tb, p2p = rnd.uniform(0.3, 2), rnd.uniform(0.3, 3), rnd.choice([0.0, rnd.uniform(0.05, 0.7)])
        compare_sim(
            pm.simulate(sched, tf, tb, p2p),
            trusted_simulate(sched, tf, tb, p2p),
            f"simulate({sched}, {tf:.3f}, {tb:.3f}, {p2p:.3f})",
            (tf, tb, p2p),
        )


@pytest.mark.check("simulate")
def test_simulate_interleaved_schedules(pm, rng):
    rnd = random.Random(int(torch.randint(0, 2**31, (1,), generator=rng)))
    cases = [expected_interleaved(2, 4, 2), expected_interleaved(3, 3, 3), expected_interleaved(1, 2, 2)]
    cases += [random_valid_schedule(rnd, rnd.randint(1, 4), rnd.randint(1, 4), rnd.randint(2, 3)) for _ in range(6)]
    for sched in cases:
        tf, tb, p2p = rnd.uniform(0.3, 2), rnd.uniform(0.3, 3), rnd.choice([0.0, rnd.uniform(0.05, 0.7)])
        compare_sim(
            pm.simulate(sched, tf, tb, p2p),
            trusted_simulate(sched, tf, tb, p2p),
            f"simulate({sched}, {tf:.3f}, {tb:.3f}, {p2p:.3f}) (each op costs its time / v; peaks count (mb, chunk) pairs)",
            (tf, tb, p2p),
        )


def perturbed(rnd: random.Random, sched: list[list[tuple]]) -> tuple[list[list[tuple]], str]:
    sched = [list(row) for row in sched]
    p = len(sched)
    kind = rnd.choice(["drop", "duplicate", "move", "swap", "swap", "hoist"])
    s = rnd.randrange(p)
    row = sched[s]
    i = rnd.randrange(len(row))
    if kind == "drop":
        op = row.pop(i)
        return sched, f"stage {s} lost {op}"
    if kind == "duplicate":
        row.insert(rnd.randrange(len(row) + 1), row[i])
        return sched, f"stage {s} runs {row[i]} twice"
    if kind == "move" and p > 1:
        op = row.pop(i)
        t = rnd.choice([t for t in range(p) if t != s])
        sched[t].insert(rnd.randrange(len(sched[t]) + 1), op)
        return sched, f"{op} moved from stage {s} to stage {t}"
    if kind == "hoist":
        op = row.pop(i)
        row.insert(0, op)
        return sched, f"{op} moved to the front of stage {s}"
    j = rnd.randrange(len(row))
    row[i], row[j] = row[j], row[i]
    return sched, f"stage {s}: ops {i} and {j} swapped"


@pytest.mark.check("simulate")
def test_simulate_flags_exactly_the_invalid_schedules(pm, rng):
    rnd = random.Random(int(torch.randint(0, 2**31, (1,), generator=rng)))
    seen = Counter()
    for trial in range(40):
        p, m = rnd.randint(1, 4), rnd.randint(1, 4)
        v = rnd.choice([1, 1, 2])
        base = random_valid_schedule(rnd, p, m, v)
        sched, change = perturbed(rnd, base)
        valid = is_valid(sched)
        seen[valid] += 1
        if valid:
            label = f"simulate({sched}) (still valid after: {change})"
            got, refused = call_simulate(pm, sched, (1.0, 2.0, 0.0), label)
            assert refused is None, (
                f"{label}: simulate raised ValueError({refused}), but every op of this schedule can run"
            )
            compare_sim(got, trusted_simulate(sched), label)
        else:
            with pytest.raises(ValueError):
                pm.simulate(sched, 1.0, 2.0)
                pytest.fail(f"simulate({sched}) should raise ValueError ({change}), it returned a result")
    assert seen[False] > 0


@pytest.mark.check("simulate")
@pytest.mark.parametrize(
    "case",
    [
        ([[("F", 0), ("B", 0), ("F", 1), ("B", 1)], [("F", 1), ("F", 0), ("B", 0), ("B", 1)]], "('F', 1)"),
        ([[("F", 0), ("B", 0)], [("B", 0), ("F", 0)]], "('B', 0)"),
        (
            [
                [("F", 0, 0), ("F", 0, 2), ("B", 0, 0), ("B", 0, 2)],
                [("F", 0, 1), ("B", 0, 1), ("F", 0, 3), ("B", 0, 3)],
            ],
            "('B', 0, 1)",
        ),
    ],
)
def test_simulate_names_the_stuck_ops(pm, case):
    sched, stuck = case
    must_accept("simulate([[('F', 0), ('B', 0)]])", lambda: pm.simulate([[("F", 0), ("B", 0)]]))
    with pytest.raises(ValueError) as info:
        pm.simulate(sched)
        pytest.fail(f"simulate({sched}) deadlocks and should raise ValueError")
    assert stuck in str(info.value), (
        f"simulate({sched}) deadlocks; the ValueError should name the stuck op {stuck}, found: {info.value}"
    )


@pytest.mark.check("simulate")
@pytest.mark.parametrize(
    "sched,why",
    [
        ([], "an empty schedule"),
        ([[("F", 0), ("B", 0)], [("F", 0)]], "stage 1 lacks ('B', 0)"),
        ([[("F", 0), ("B", 0), ("F", 0), ("B", 0)]], "an op run twice"),
        (
            [
                [("F", 0, 0), ("B", 0, 0), ("F", 0, 1), ("B", 0, 1)],
                [("F", 0, 2), ("B", 0, 2), ("F", 0, 3), ("B", 0, 3)],
            ],
            "chunk 1 on stage 0 (it lives on stage 1)",
        ),
        ([[("F", 0, 0), ("B", 0, 0), ("F", 0, 2), ("B", 0, 2)], [("F", 0, 1), ("B", 0, 1)]], "3 chunks over 2 stages"),
        ([[("F", 0), ("B", 0, 0)]], "plain and interleaved ops mixed"),
        ([[("X", 0), ("B", 0)]], "an op that is neither F nor B"),
        ([[("F", -1), ("B", -1)]], "a negative microbatch"),
        ([[], []], "two stages and no ops"),
        ([[("F", 1.5), ("B", 1.5)]], "a microbatch id that is not an int"),
        ([[("F", 0, 0.0), ("B", 0, 0.0)]], "a chunk id that is not an int"),
        ([[("F",), ("B",)]], "ops without a microbatch"),
        ([[("F", 0, 0, 0), ("B", 0, 0, 0)]], "ops of four items"),
        ([["F0", "B0"]], "ops spelled as strings"),
        ([[("F", 0), ("B", 0)], "F0"], "a stage that is not a list of ops"),
    ],
)
def test_simulate_rejects_malformed_schedules(pm, sched, why):
    must_accept("simulate([[('F', 0), ('B', 0)]])", lambda: pm.simulate([[("F", 0), ("B", 0)]]))
    must_raise_value_error(lambda: pm.simulate(sched), f"simulate({sched})", why)


@pytest.mark.check("simulate")
@pytest.mark.parametrize("times", [(-1.0, 2.0, 0.0), (1.0, -0.5, 0.0), (1.0, 2.0, -0.25)])
def test_simulate_rejects_negative_times(pm, times):
    sched = expected_1f1b(2, 2)
    must_accept("simulate(1F1B p=2 m=2, 1.0, 2.0, 0.5)", lambda: pm.simulate(sched, 1.0, 2.0, 0.5))
    with pytest.raises(ValueError):
        pm.simulate(sched, *times)
        pytest.fail(f"simulate(1F1B p=2 m=2, {times[0]}, {times[1]}, {times[2]}) should raise ValueError: a time is >= 0")


# --------------------------------------------------------------------------------------------------
# Generated cases: simulate against the event-by-event oracle, on random valid and broken schedules


def break_schedule(rnd: random.Random, kind: str, sched: list[list[tuple]]) -> tuple[list[list[tuple]], str]:
    """A broken copy of a valid schedule, and what was done to it."""
    sched = [list(row) for row in sched]
    p = len(sched)
    s = rnd.randrange(p)
    row = sched[s]
    if kind == "backward before its forward":
        b = rnd.choice([op for op in row if op[0] == "B"])
        row.remove(b)
        f = row.index(("F", *b[1:]))
        row.insert(rnd.randint(0, f), b)
        return sched, f"stage {s} runs {b!r} before its forward"
    if kind == "missing op":
        if rnd.random() < 0.5:  # a backward of chunk 0, which no other op waits on: no deadlock gives it away
            s, row = 0, sched[0]
            op = rnd.choice([op for op in row if op[0] == "B" and (len(op) == 2 or op[2] == 0)])
        else:
            op = rnd.choice(row)
        row.remove(op)
        return sched, f"stage {s} never runs {op!r}"
    if kind == "duplicate op":
        op = rnd.choice(row)
        row.insert(rnd.randint(0, len(row)), op)
        return sched, f"stage {s} runs {op!r} twice"
    if kind == "one op for another":  # the count of ops stays right
        s, row = 0, sched[0]
        gone = rnd.choice([op for op in row if op[0] == "B" and (len(op) == 2 or op[2] == 0)])
        twice = rnd.choice([op for op in row if op != gone])
        row[row.index(gone)] = twice
        return sched, f"stage 0 runs {twice!r} twice and never {gone!r}"
    if kind == "misplaced op" and p > 1:
        op = row.pop(rnd.randrange(len(row)))
        t = rnd.choice([t for t in range(p) if t != s])
        sched[t].insert(rnd.randint(0, len(sched[t])), op)
        return sched, f"{op!r} moved from stage {s} to stage {t}"
    if kind == "dependency cycle":
        # Stage a runs B(x) before F(y); the stage after it runs F(y) before F(x). B(x) on a needs B(x) there,
        # which needs F(x) there, which comes after F(y) there, which needs F(y) on a: a cycle.
        interleaved = len(row[0]) == 3
        chunks = p * (1 + max(op[2] for r in sched for op in r) // p) if interleaved else p
        m = 1 + max(op[1] for r in sched for op in r)
        if chunks >= 2 and m >= 2:
            c = rnd.randrange(chunks - 1)
            spell = (lambda k, mb, ch: (k, mb, ch)) if interleaved else (lambda k, mb, ch: (k, mb))
            here, after = sched[c % p], sched[(c + 1) % p]
            fwd = [op for op in here if op[0] == "F" and (not interleaved or op[2] == c)]
            i, j = sorted(rnd.sample(range(len(fwd)), 2))
            x, y = fwd[i][1], fwd[j][1]
            bx = spell("B", x, c)
            here.remove(bx)
            here.insert(here.index(spell("F", y, c)), bx)
            fy = spell("F", y, c + 1)
            after.remove(fy)
            after.insert(after.index(spell("F", x, c + 1)), fy)
            return (
                sched,
                f"a cycle: {bx!r} before {spell('F', y, c)!r} on stage {c % p}, {fy!r} before {spell('F', x, c + 1)!r} on stage {(c + 1) % p}",
            )
    return break_schedule(rnd, "backward before its forward", sched)


VALID_KINDS = ["random interleaving", "random interleaving", "gpipe", "1f1b", "interleaved"]
BROKEN_KINDS = [
    "backward before its forward",
    "missing op",
    "duplicate op",
    "one op for another",
    "misplaced op",
    "dependency cycle",
]


def generated_case(rnd: random.Random, trial: int):
    """(schedule, (t_f, t_b, p2p), label): trial t cycles through every kind and every p in 1..5."""
    kinds = VALID_KINDS + BROKEN_KINDS
    kind = kinds[trial % len(kinds)]
    p, m = 1 + (trial // len(kinds)) % 5, rnd.randint(1, 5)
    v = rnd.choice([1, 1, 2, 3])
    if kind == "gpipe":
        v, base = 1, expected_gpipe(p, m)
    elif kind == "1f1b":
        v, base = 1, expected_1f1b(p, m)
    elif kind == "interleaved":
        v, m = rnd.randint(2, 3), p * rnd.randint(1, 2)
        base = expected_interleaved(p, m, v)
    else:
        base = random_valid_schedule(rnd, p, max(m, 2) if kind == "dependency cycle" else m, v)
    if kind in BROKEN_KINDS:
        base, done = break_schedule(rnd, kind, base)
        kind = f"{kind} ({done})"
    times = (
        rnd.choice([1.0, rnd.uniform(0.2, 2.0)]),
        rnd.choice([2.0, rnd.uniform(0.2, 3.0)]),
        rnd.choice([0.0, rnd.uniform(0.05, 0.8), rnd.uniform(0.05, 0.8)]),
    )
    label = (
        f"simulate(schedule, {times[0]:.4g}, {times[1]:.4g}, {times[2]:.4g}) on this schedule ({kind}): "
        f"[{show_schedule(base)}]"
    )
    return base, times, label


def call_simulate(pm, sched, times: tuple, label: str):
    """(result, None) or (None, the ValueError it raised); any other exception is re-raised, naming the case."""
    try:
        return pm.simulate(sched, *times), None
    except ValueError as exc:
        return None, exc
    except Exception as exc:  # noqa: BLE001 - the student's own error, kept as is, with the case it broke on
        exc.args = (f"{label}: {exc.args[0] if exc.args else ''}", *exc.args[1:])
        raise


@pytest.mark.check("simulate")
def test_simulate_against_an_event_by_event_oracle(pm, rng):
    rnd = seeded(rng)
    verdicts = Counter()
    for trial in range(70):
        sched, times, label = generated_case(rnd, trial)
        want = event_oracle(sched, *times)
        got, refused = call_simulate(pm, sched, times, label)
        verdicts[want.why.split(" ")[0] or "valid"] += 1
        if not want.why:
            assert refused is None, (
                f"{label}: simulate raised ValueError({refused}), but the schedule is valid: every op can run, each "
                "after its inputs (F(mb, c) needs F(mb, c - 1); B(mb, c) needs F(mb, c) and B(mb, c + 1))"
            )
            diff = sim_divergence(got, want, times)
            assert not diff, f"{label}: {diff}"
        elif want.stuck:
            assert refused is not None, (
                f"{label}: simulate returned a result, but the schedule deadlocks (stuck: "
                f"{', '.join(map(repr, want.stuck))}): when no stage can start its next op, raise ValueError"
            )
            unnamed = [op for op in want.stuck if repr(op) not in str(refused)]
            assert not unnamed, (
                f"{label}: the schedule deadlocks with each unfinished stage stuck at its next op "
                f"({', '.join(map(repr, want.stuck))}); your ValueError does not name {', '.join(map(repr, unnamed))}: "
                f"{refused}"
            )
        else:
            assert refused is not None, (
                f"{label}: simulate returned a result, but the schedule {want.why}: check each stage runs F and B "
                "exactly once per microbatch and chunk it holds, before timing anything (a missing op that nothing "
                "waits on, or one op swapped for a copy of another, leaves no deadlock to notice)"
            )
    assert verdicts["valid"] >= 20 and verdicts["deadlocks"] >= 5, f"the generator drew too few of a kind: {verdicts}"


def assert_simulate_linear(
    student, pm, small, large, what: str, makespan: float, advice: str, kind: str = "plain"
) -> None:
    """simulate runs at most 2x more lines per op on `large` (32x the ops of `small`) than on `small`; and on
    the grader's clock, 64x the ops take no more than LINEAR_CLOCK's bar."""
    n_small, n_large = sum(map(len, small)), sum(map(len, large))

    def makespan_of(schedule, want: float):
        def check(result) -> None:
            got = getattr(result, "makespan", None)
            assert isinstance(got, (int, float)) and close(got, want), (
                f"simulate({what}) (a call whose lines are counted) gave makespan {show(got)}, expected {want:g}"
            )

        return check

    _, lines_small = student.lines_executed(
        pm.simulate, small, check=makespan_of(small, trusted_simulate(small)["makespan"])
    )
    result, lines_large = student.lines_executed(pm.simulate, large, check=makespan_of(large, makespan))
    growth, ops_growth = lines_large / lines_small, n_large / n_small
    assert growth <= 2 * ops_growth, (
        f"simulate ran {lines_small} lines of your code for {n_small} ops and {lines_large} for {n_large} ops of "
        f"{what} ({growth:.1f}x for {ops_growth:.0f}x the ops): the work should grow linearly. {advice}"
    )
    sizes = sizes_per_run(kind)
    timing = simulate_timing(student, pm, lambda n: packed_schedule(*sizes(n)),
                             LINEAR_CLOCK["simulate" if kind == "plain" else "simulate_interleaved"],
                             work=lambda got, ops, lengths, want: len(ops))
    assert_flat_on_the_clock(timing, "simulate", advice, loop="more work per op when there are more stages")
    assert_flat_on_the_clock(simulate_stages_timing(student, pm), "simulate", STAGES_ADVICE,
                             loop="work per op that grows with the stages")
    if kind == "plain":  # one simulate serves both kinds: timed once, on 1F1B schedules
        more = microbatches_per_run("simulate")
        timing = simulate_timing(student, pm, lambda m: packed_schedule(*more(m)), MICROBATCH_CLOCK["simulate"],
                                 work=lambda got, ops, lengths, want: len(ops) / (2 * len(lengths)))
        assert_flat_on_the_clock(timing, "simulate", advice, loop="work per op that grows with the micro-batches")


def packed_schedule(p: int, m: int, v: int | None = None) -> tuple:
    """The arguments of a timed simulate: 1F1B (or interleaved, with v) packed for travel, and its makespan."""
    if v is None:
        return (*support.pack(expected_1f1b(p, m)), (m + p - 1) * 3.0)
    return (*support.pack(expected_interleaved(p, m, v)), (m + (p - 1) / v) * 3.0)


def simulate_timing(student, pm, make, scaling: Scaling, work):
    """`clock` around the student's simulate on packed schedules (`packed_schedule`), each makespan checked,
    beside the trusted linear baseline (the same unpacking, one dependency lookup per op)."""

    def check(got, ops, lengths, want: float) -> None:
        assert close(got["makespan"], want), (
            f"simulate gave makespan {got['makespan']:g} for a schedule of {len(ops)} ops over {len(lengths)} stages "
            f"(timed on the grader's clock), expected {want:g}"
        )

    return clock(
        student.mode,
        lambda ops, lengths, want: student.drive(f"{SUPPORT}:simulate_packed", pm.simulate, ops, lengths),
        make,
        check,
        scaling,
        work=work,
        linear=lambda ops, lengths, want: student.drive(f"{SUPPORT}:simulate_baseline", pm.simulate, ops, lengths),
    )


STAGES_ADVICE = (
    "Do not look for the next op to run by scanning the stages (a loop, or C doing it for you: list.index, in, "
    "map, compress): park a stage on the op it waits for, and wake it when that op finishes."
)
_stages_timings: dict[int, object] = {}


def simulate_stages_timing(student, pm):
    """simulate on 1F1B schedules of the same ops over 2 stages and over 4096 (STAGES_CLOCK), on the grader's
    clock. One simulate serves both schedule kinds, and an interleaved schedule cannot spread its ops over
    thousands of stages (m is a multiple of p), so both simulate_linear tests assert this one timing, taken
    once per grade."""
    if id(pm) not in _stages_timings:
        shapes = shapes_per_run("simulate")
        _stages_timings[id(pm)] = simulate_timing(
            student, pm, lambda p: packed_schedule(*shapes(p)), STAGES_CLOCK["simulate"],
            work=lambda got, ops, lengths, want: shape_of(len(lengths), "simulate") * len(ops) / STAGES_OPS["simulate"],
        )
    return _stages_timings[id(pm)]


@pytest.mark.check("simulate_linear")
def test_simulate_is_linear_in_the_number_of_ops(student, pm):
    assert_simulate_linear(
        student,
        pm,
        expected_1f1b(4, 8),
        expected_1f1b(32, 32),
        "1F1B p=32, m=32",
        (32 + 31) * 3.0,
        "Do not rescan every stage (or every finished op) to find what can run next: keep finish times in a "
        "dict, and wake a stage only when the op it waits for finishes.",
    )


@pytest.mark.check("simulate_linear")
def test_simulate_is_linear_for_interleaved_schedules(student, pm):
    assert_simulate_linear(
        student,
        pm,
        expected_interleaved(4, 8, 2),
        expected_interleaved(16, 64, 2),
        "interleaved p=16, m=64, v=2",
        (64 + 15 / 2) * 3.0,
        "Find v and each op's dependencies from the op itself (chunk c - 1 or c + 1), not by searching the schedule.",
        kind="interleaved",
    )


# --------------------------------------------------------------------------------------------------
# run_pipeline


def mlp_stages(seed: int, widths=(6, 12, 12, 10, 3)) -> list[torch.nn.Module]:
    torch.manual_seed(seed)
    pieces: list[torch.nn.Module] = []
    acts = [torch.nn.Tanh, torch.nn.ReLU, torch.nn.GELU, torch.nn.Tanh]
    for i in range(len(widths) - 1):
        lin = torch.nn.Linear(widths[i], widths[i + 1])
        pieces.append(lin if i == len(widths) - 2 else torch.nn.Sequential(lin, acts[i % len(acts)]()))
    return pieces


def batch(rng: torch.Generator, m: int, n: int = 5, d_in: int = 6, d_out: int = 3):
    xs = [torch.randn(n, d_in, generator=rng) for _ in range(m)]
    ys = [torch.randn(n, d_out, generator=rng) for _ in range(m)]
    return xs, ys


def check_run(run, stages, xs, ys, what: str, loss: str = "mse", tol: tuple = (1e-5, 1e-4)) -> None:
    """The student's PipelineRun against the full-batch oracle: the mean loss as a float, every piece's gradients
    in parameters() order, in each parameter's dtype (`loss` names loss_fn for the oracle; `tol` is (atol, rtol))."""
    want_loss, want_grads = full_batch_oracle(stages, xs, ys, loss)
    atol, rtol = tol
    fields = getattr(run, "_fields", ())
    assert isinstance(fields, tuple) and fields == ("loss", "grads", "peak_activations"), (
        f"{what}: run_pipeline should return the PipelineRun NamedTuple (loss, grads, peak_activations), "
        f"found a {type(run).__name__} with fields {show(fields)}"
    )
    assert isinstance(run.loss, float), f"{what}: loss should be a Python float, found {type(run.loss).__name__}"
    m = len(xs)
    if m > 1 and math.isclose(run.loss, want_loss * m, rel_tol=1e-4):
        pytest.fail(
            f"{what}: loss is {run.loss:.6g}, m = {m} times the mean {want_loss:.6g}: divide each microbatch's loss by m"
        )
    assert math.isclose(run.loss, want_loss, rel_tol=max(rtol, 1e-9), abs_tol=1e-6), (
        f"{what}: loss {run.loss:.6g}, expected the mean {want_loss:.6g}"
    )
    grads = plain_list(run.grads, f"{what}: grads")
    assert len(grads) == len(want_grads), f"{what}: grads for {len(grads)} pieces, expected {len(want_grads)}"
    for c, (got_c, want_c) in enumerate(zip(grads, want_grads)):
        params = list(stages[c].parameters())
        got_c = plain_list(got_c, f"{what}: piece {c}'s gradients")
        assert len(got_c) == len(want_c), (
            f"{what}: piece {c} has {len(want_c)} parameters, found {len(got_c)} gradients (one per parameter, "
            "in parameters() order, zeros for a parameter that got none)"
        )
        for i, (g, w) in enumerate(zip(got_c, want_c)):
            assert isinstance(g, torch.Tensor), (
                f"{what}: piece {c} grad {i} should be a tensor, found {type(g).__name__} {show(g)}"
                + (": a parameter that got no gradient (frozen, or unused) gets zeros" if g is None else "")
            )
            assert tuple(g.shape) == tuple(w.shape), (
                f"{what}: piece {c} grad {i} has shape {tuple(g.shape)}, expected {tuple(w.shape)}"
            )
            assert g.dtype == params[i].dtype, (
                f"{what}: piece {c} grad {i} is {g.dtype}, its parameter {params[i].dtype}: a gradient comes back "
                "in its parameter's dtype (run the pieces in the dtype they hold, cast nothing)"
            )
            if m > 1 and is_close(g, w * m, atol=atol, rtol=rtol) and not is_close(g, w, atol=atol, rtol=rtol):
                pytest.fail(
                    f"{what}: piece {c} grad {i} is m = {m} times too large: divide each microbatch's loss by m before its backward"
                )
            assert_close(
                g,
                w,
                atol=atol,
                rtol=rtol,
                what=f"{what}: piece {c} parameter {i} gradient, against the full-batch one",
                hint="Did you zero the gradients first, send each piece the detached output of the one before, and "
                "backpropagate the gradient the next piece sent back?",
            )


def check_reported_peaks(run, sched, what: str) -> None:
    """peak_activations as the contract defines it: per stage, the most (mb, chunk) pairs in flight."""
    want = trusted_simulate(sched)["peaks"]
    peaks = peaks_of(run.peak_activations, len(sched), what)
    every = [sum(1 for op in row if op[0] == "F") for row in sched]  # what a stage holds running every F first
    assert peaks == want, (
        f"{what}: peak_activations {show(peaks)}, expected {want}: per STAGE, the most (microbatch, chunk) pairs "
        "whose forward ran and whose backward has not"
        + (f". {show(peaks)} is every forward of each stage in flight at once, as when all forwards run before any "
           "backward: run the ops in the schedule's order (the walk), each backward when the schedule says"
           if peaks == every and every != want else "")
    )


def run_error_hint(text: str) -> str:
    """What a torch error from inside run_pipeline usually means ('' when it has no usual meaning)."""
    if "grad can be implicitly created only for scalar outputs" in text:
        return (
            ". That is a backward of a piece's (non-scalar) output without the gradient the next piece sent back. "
            "That gradient is the next piece's input's .grad, which autograd fills only when that input is a leaf: "
            "hand each piece the detached output of the one before, x = y.detach().requires_grad_()"
        )
    return ""


def drive(student, pm, stages, xs, ys, sched, loss_fn=None, what: str = ""):
    """run_pipeline under the census; an exception the student's code raises names the case `what`."""
    try:
        return student.drive(DRIVER, pm.run_pipeline, stages, xs, ys, sched,
                             torch.nn.MSELoss() if loss_fn is None else loss_fn)
    except NOT_THE_STUDENTS:
        raise
    except Exception as exc:
        if what:
            text = exc.args[0] if exc.args and isinstance(exc.args[0], str) else ""
            exc.args = (f"{what}: {text}{run_error_hint(text)}", *exc.args[1:])
        raise


@pytest.mark.check("run_pipeline")
@pytest.mark.parametrize("kind", ["1f1b", "gpipe"])
def test_run_pipeline_matches_full_batch_gradients(student, pm, rng, seed, kind):
    stages = mlp_stages(seed)
    xs, ys = batch(rng, 8)
    sched = expected_1f1b(4, 8) if kind == "1f1b" else expected_gpipe(4, 8)
    what = f"run_pipeline(4-stage MLP, 8 microbatches, {kind})"
    run, *_ = drive(student, pm, stages, xs, ys, sched, what=what)
    check_run(run, stages, xs, ys, what)
    check_reported_peaks(run, sched, what)


@pytest.mark.check("run_pipeline")
def test_run_pipeline_random_schedules(student, pm, rng, seed):
    rnd = random.Random(seed + 17)
    for p, m in [(4, 5), (2, 3), (3, 1)]:
        stages = mlp_stages(seed + p, widths=(6, 9, 11, 7)[:p] + (3,))
        xs, ys = batch(rng, m)
        sched = random_valid_schedule(rnd, p, m)
        what = f"run_pipeline(p={p}, m={m}, schedule {sched})"
        run, *_ = drive(student, pm, stages, xs, ys, sched, what=what)
        check_run(run, stages, xs, ys, what)


@pytest.mark.check("run_pipeline")
def test_run_pipeline_zeroes_the_gradients_first(student, pm, rng, seed):
    stages = mlp_stages(seed)
    xs, ys = batch(rng, 4)
    run, *_ = student.drive(
        DRIVER, pm.run_pipeline, stages, xs, ys, expected_1f1b(4, 4), torch.nn.MSELoss(), dirty_grads=True
    )
    _, want_grads = full_batch_oracle(stages, xs, ys)
    assert_close(
        run.grads[0][0],
        want_grads[0][0],
        atol=1e-5,
        rtol=1e-4,
        what="piece 0's first gradient",
        hint=(
            "run_pipeline was called on pieces that already held gradients (from an earlier step): "
            "zero the pieces' gradients first"
        ),
    )
    check_run(run, stages, xs, ys, "run_pipeline on pieces with stale gradients")


@pytest.mark.check("run_pipeline")
def test_run_pipeline_interleaved_chunks(student, pm, rng, seed):
    p, m, v = 2, 4, 2
    stages = mlp_stages(seed, widths=(6, 8, 10, 8, 3))
    xs, ys = batch(rng, m)
    sched = expected_interleaved(p, m, v)
    what = "run_pipeline(4 chunks on 2 stages, interleaved schedule)"
    run, *_ = drive(student, pm, stages, xs, ys, sched, what=what)
    check_run(run, stages, xs, ys, what)
    check_reported_peaks(run, sched, "interleaved run (each stage counts the (mb, chunk) pairs alive on it)")


@pytest.mark.check("run_pipeline")
def test_run_pipeline_with_your_own_1f1b(student, pm, rng, seed):
    stages = mlp_stages(seed)
    xs, ys = batch(rng, 8)
    sched = as_ops(pm.one_f_one_b_schedule(4, 8))
    if not is_valid(sched):  # graded by the 1F1B checks; here only the executor is graded
        sched = expected_1f1b(4, 8)
    what = "run_pipeline(4-stage MLP, 8 microbatches, your one_f_one_b_schedule(4, 8))"
    run, *_ = drive(student, pm, stages, xs, ys, sched, what=what)
    check_run(run, stages, xs, ys, what)


@pytest.mark.check("run_pipeline")
def test_run_pipeline_scores_with_the_loss_fn_it_is_given(student, pm, rng, seed):
    """loss_fn is an argument: cross-entropy over class ids (int64 targets) gives other gradients than MSE."""
    p, m, classes = 3, 6, 5
    stages = mlp_stages(seed, widths=(6, 9, 8, classes))
    xs = [torch.randn(4, 6, generator=rng) for _ in range(m)]
    ys = [torch.randint(0, classes, (4,), generator=rng) for _ in range(m)]
    what = ("run_pipeline(3 stages, 6 microbatches, loss_fn = CrossEntropyLoss(), int64 class targets): score each "
            "microbatch with the loss_fn you are handed")
    run, *_ = drive(student, pm, stages, xs, ys, expected_1f1b(p, m), torch.nn.CrossEntropyLoss(), what=what)
    check_run(run, stages, xs, ys, what, loss="cross_entropy")


@pytest.mark.check("run_pipeline")
def test_run_pipeline_in_float64(student, pm, rng, seed):
    """A float64 model and batch: gradients in float64, as exact as float64 allows."""
    p, m, v = 2, 4, 2
    stages = [piece.double() for piece in mlp_stages(seed, widths=(6, 8, 10, 8, 3))]
    xs, ys = batch(rng, m)
    xs, ys = [x.double() for x in xs], [y.double() for y in ys]
    what = ("run_pipeline(a float64 model, 4 chunks on 2 stages, interleaved): run the pieces in the dtype they hold "
            "and feed them the microbatches as they are, cast nothing")
    run, *_ = drive(student, pm, stages, xs, ys, expected_interleaved(p, m, v), what=what)
    check_run(run, stages, xs, ys, what, tol=(1e-12, 1e-10))


@pytest.mark.check("run_pipeline")
def test_run_pipeline_gives_zeros_to_a_parameter_without_gradient(student, pm, rng, seed):
    """A frozen parameter (requires_grad False) gets no gradient: its entry is zeros, in parameters() order."""
    stages = mlp_stages(seed, widths=(6, 9, 8, 3))
    stages[1][0].bias.requires_grad_(False)
    xs, ys = batch(rng, 3)
    what = "run_pipeline(3 stages, piece 1's bias frozen: requires_grad=False)"
    run, *_ = drive(student, pm, stages, xs, ys, expected_1f1b(3, 3), what=what)
    check_run(run, stages, xs, ys, what)


@pytest.mark.check("run_pipeline")
def test_run_pipeline_refuses_a_deadlock(pm, seed):
    stages = mlp_stages(seed, widths=(6, 8, 3))
    xs, ys = [torch.ones(2, 6)] * 2, [torch.zeros(2, 3)] * 2
    valid = [[("F", 0), ("F", 1), ("B", 0), ("B", 1)], [("F", 0), ("B", 0), ("F", 1), ("B", 1)]]
    must_accept(
        "run_pipeline on a valid 2-stage schedule", lambda: pm.run_pipeline(stages, xs, ys, valid, torch.nn.MSELoss())
    )
    sched = [[("F", 0), ("B", 0), ("F", 1), ("B", 1)], [("F", 1), ("F", 0), ("B", 0), ("B", 1)]]
    with pytest.raises(ValueError):
        pm.run_pipeline(stages, xs, ys, sched, torch.nn.MSELoss())
        pytest.fail("run_pipeline ran a schedule that deadlocks; it should raise ValueError naming the stuck ops")


MISMATCHES = [
    ("three pieces for a 2-stage plain schedule", 3, 2, 2, "plain"),
    ("one piece for a 2-stage plain schedule", 1, 2, 2, "plain"),
    ("two pieces for an interleaved schedule of 2 stages x 2 chunks", 2, 2, 2, "interleaved"),
    ("3 microbatches for a schedule of 2", 2, 3, 2, "plain"),
    ("1 microbatch for a schedule of 2", 2, 1, 2, "plain"),
    ("3 targets for a schedule of 2 microbatches", 2, 2, 3, "plain"),
    ("a schedule that never runs ('B', 1) on stage 0", 2, 2, 2, "missing"),
    ("a schedule that runs ('F', 1) twice on stage 1", 2, 2, 2, "twice"),
    ("an empty schedule", 2, 2, 2, "empty"),
]


@pytest.mark.check("run_pipeline")
def test_run_pipeline_refuses_what_does_not_match_the_schedule(pm, seed):
    valid = [[("F", 0), ("F", 1), ("B", 0), ("B", 1)], [("F", 0), ("B", 0), ("F", 1), ("B", 1)]]
    xs, ys = [torch.ones(2, 6)] * 2, [torch.zeros(2, 3)] * 2
    must_accept(
        "run_pipeline on a valid 2-stage schedule, 2 pieces, 2 microbatches",
        lambda: pm.run_pipeline(mlp_stages(seed, widths=(6, 8, 3)), xs, ys, valid, torch.nn.MSELoss()),
    )
    schedules = {
        "plain": valid,
        "interleaved": expected_interleaved(2, 2, 2),
        "missing": [[("F", 0), ("F", 1), ("B", 0)], [("F", 0), ("B", 0), ("F", 1), ("B", 1)]],
        "twice": [[("F", 0), ("F", 1), ("B", 0), ("B", 1)], [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 1)]],
        "empty": [],
    }
    for why, pieces, n_x, n_y, kind in MISMATCHES:
        stages = mlp_stages(seed, widths=(6, 8, 7, 9, 3)[:pieces] + (3,))
        xs, ys = [torch.ones(2, 6)] * n_x, [torch.zeros(2, 3)] * n_y
        need = ("a schedule of p stages and v chunks needs p v pieces, one microbatch and one target per microbatch "
                "id, and every op of every stage once")
        try:
            pm.run_pipeline(stages, xs, ys, schedules[kind], torch.nn.MSELoss())
        except ValueError:
            continue
        except NOT_THE_STUDENTS:
            raise
        except Exception as exc:  # noqa: BLE001 - the student's own exception, named in the failure
            shown = f"{type(exc).__name__}: {exc}" if type(exc).__module__ != "student" else str(exc)
            pytest.fail(f"run_pipeline with {why} raised {shown[:300]}, expected ValueError up front: {need}; "
                        "compare them with the schedule before running anything")
        pytest.fail(f"run_pipeline ran with {why}: it should raise ValueError ({need})")


# --------------------------------------------------------------------------------------------------
# run_pipeline_memory: the signature. The executor holds, per stage, the activations of the microbatches the
# schedule has in flight and no more: counted by the census (grader/support/pipeline_1f1b.py) in autograd's saved
# tensors and in the storages they hold, where the student's code runs, behind the tamper gate.


def memory_case(kind: str, pm, seed: int) -> tuple:
    """(schedule, pieces, microbatch count, label) for a census run. Every case holds fewer microbatches than m on
    some stage, so a run that pushes every forward first, or the whole batch at once, shows more."""
    if kind == "1f1b":
        return expected_1f1b(4, 8), mlp_stages(seed), 8, "1F1B, p=4, m=8"
    if kind == "own":
        sched = as_ops(pm.one_f_one_b_schedule(3, 7))
        sched = sched if is_valid(sched) else expected_1f1b(3, 7)
        return sched, mlp_stages(seed, widths=(6, 9, 11, 3)), 7, "your one_f_one_b_schedule(3, 7)"
    if kind == "interleaved":
        return (expected_interleaved(2, 4, 2), mlp_stages(seed, widths=(6, 8, 10, 8, 3)), 4,
                "interleaved, p=2, m=4, v=2")
    rnd = random.Random(seed + 29)
    for _ in range(200):  # a random valid order that keeps some stage below all m microbatches
        sched = random_valid_schedule(rnd, 4, 6)
        if min(trusted_simulate(sched)["peaks"]) < 6:
            break
    else:
        sched = expected_1f1b(4, 6)
    return sched, mlp_stages(seed), 6, f"a random valid schedule, p=4, m=6: [{show_schedule(sched)}]"


@pytest.mark.check("run_pipeline_memory")
@pytest.mark.parametrize("kind", ["1f1b", "own", "interleaved", "random"])
def test_run_pipeline_holds_what_the_schedule_holds(student, pm, rng, seed, kind):
    sched, stages, m, label = memory_case(kind, pm, seed)
    p = len(sched)
    xs, ys = batch(rng, m)
    run, measured, held, left = drive(student, pm, stages, xs, ys, sched)
    # The census's counts come from beside the student's code; no trusted cross-check exists for them
    # (CHECKS.md, "What each structural check can and cannot prove"), so a file that tampers with them fails.
    student.assert_untampered(pm.run_pipeline, "the saved activations the census counted")
    want = trusted_simulate(sched)["peaks"]
    what = f"run_pipeline({label})"
    peaks = peaks_of(run.peak_activations, p, what)
    assert peaks == want, (
        f"{what} reported peak_activations {show(peaks)}; the schedule keeps at most {want} microbatches alive per stage"
    )
    assert any(measured), (
        f"{what}: no activation saved by autograd was seen: run each piece as piece(x) (its forward hooks must fire, "
        "so not piece.forward(x)), with gradients enabled"
    )
    more = [s for s in range(p) if measured[s] > want[s]]
    assert not more, (
        f"{what}: autograd held the saved activations of up to {measured} microbatches per stage at once (a forward "
        f"of the whole batch counts m), but the schedule needs only {want}: stage {more[0]} held {measured[more[0]]}. "
        "Run each op when the schedule says, one microbatch per forward, and let a microbatch's graph go as soon as "
        "its backward ran (no retain_graph, no extra references)."
    )
    assert measured == want, (
        f"{what}: autograd held the saved activations of up to {measured} microbatches per stage, fewer than the "
        f"schedule's {want}: keep each microbatch's graph from its forward to its backward (no forward under "
        "torch.no_grad, no recomputation), one microbatch per forward"
    )
    kept = [s for s in range(p) if held[s] > want[s] + 1]
    assert not kept, (
        f"{what}: autograd released each graph at its backward, but the tensors those forwards saved stayed alive: "
        f"up to {held} microbatches' per stage (the schedule's {want}, and one more allowed for a variable that "
        f"outlives its backward until the stage's next op). Stage {kept[0]} kept {held[kept[0]]}. After a backward, "
        "drop every reference to that microbatch's input and output (pop them from your dicts, keep no list of outputs)."
    )
    assert left == [0] * p, (
        f"{what}: after run_pipeline returned, the activations of {left} microbatches per stage were still alive: a "
        "finished step holds no graph and no activation"
    )
