"""Public tests for pipeline_1f1b: small, fast, and each failure says what to look at.

Run: make check EX=pipeline_1f1b   (or: .venv/bin/pytest exercises/pipeline_1f1b)
The expected schedules below are written out by hand from the README's pictures; the gradients are
checked against the whole batch pushed through the unsplit model in float64.
"""

import copy

import pytest
import torch

from grader import testing

from grader.testing import assert_close, must_accept


@pytest.fixture(scope="module")
def pm(student):
    return student.load("pipeline_1f1b")


def plain(value, what: str) -> list:
    """A list or tuple your code returned, as a list: anything else (a tensor, an object) is refused before
    it is copied element by element, which for a large one costs the grader a Python object per element."""
    assert isinstance(value, (list, tuple)), f"{what} should be a list, found {type(value).__name__}"
    return list(value)


def ops(schedule):
    rows = [plain(row, f"stage {s}") for s, row in enumerate(plain(schedule, "the schedule"))]
    return [[tuple(plain(op, f"stage {s}, op {i}")) for i, op in enumerate(row)] for s, row in enumerate(rows)]


def peaks(value, p: int) -> list:
    """peak_activations as a list: a list or tuple, or a 1-D tensor of p entries."""
    if isinstance(value, torch.Tensor) and value.dim() == 1 and value.numel() == p:
        return value.tolist()
    return plain(value, "peak_activations")


def show(schedule) -> str:
    return "\n".join(f"  stage {s}: {' '.join(op[0] + ''.join(str(x) for x in op[1:]) for op in row)}"
                     for s, row in enumerate(schedule))


def why_different(got: list, want: list, s: int) -> str:
    """What makes stage s's ops `got` differ from `want`, in words ('' if nothing usual)."""
    def n_forwards_first(row):
        return next((i for i, op in enumerate(row) if op[:1] == ("B",)), len(row))

    for i, op in enumerate(got):
        if op[:1] == ("B",) and ("F", *op[1:]) not in got[:i]:
            return (f"stage {s} runs {op} before its own forward: a backward needs its forward first, so after the "
                    "warm-up each pair is a forward THEN a backward")
    chunked = len(want[0]) == 3
    if not chunked and any(len(op) == 3 for op in got):
        return "a plain schedule's ops are ('F' or 'B', microbatch), without a chunk"
    if chunked and sorted({op[2] for op in got if len(op) == 3}) != sorted({op[2] for op in want}):
        return (f"stage {s} runs chunks {sorted({op[2] for op in got if len(op) == 3})}, expected "
                f"{sorted({op[2] for op in want})}: chunk ids are global, and chunk c lives on stage c % p")
    n_got, n_want = n_forwards_first(got), n_forwards_first(want)
    if n_got != n_want:
        every = n_got == sum(op[:1] == ("F",) for op in got) and n_want < n_got
        return (f"stage {s} runs {n_got} forwards before its first backward, expected {n_want}: check the warm-up"
                + (" (this is every forward first, GPipe's order, which holds every microbatch at once)" if every else ""))
    backs, want_backs = [op[1:] for op in got if op[:1] == ("B",)], [op[1:] for op in want if op[0] == "B"]
    if chunked and [b[1:] for b in backs] != [b[1:] for b in want_backs]:
        return "backwards visit the stage's chunks in the reverse order of its forwards (the last chunk first)"
    if [b[0] for b in backs] != [b[0] for b in want_backs]:
        return "backwards go oldest microbatch first (first in, first out): its gradient comes back first"
    return ""


# --------------------------------------------------------------------------------------------------
# Schedules


@pytest.mark.check("schedules_public")
def test_gpipe_small(pm):
    got = ops(pm.gpipe_schedule(2, 3))
    want = [[("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)]] * 2
    why = next((why_different(g, w, s) for s, (g, w) in enumerate(zip(got, want)) if g != w), "")
    assert got == want, (f"gpipe_schedule(2, 3) gave\n{show(got)}\nexpected every stage to run\n{show(want[:1])}"
                         + (f"\n{why}" if why else ""))


@pytest.mark.check("schedules_public")
def test_1f1b_four_stages_eight_microbatches(pm):
    got = ops(pm.one_f_one_b_schedule(4, 8))
    F = lambda i: ("F", i)  # noqa: E731
    B = lambda i: ("B", i)  # noqa: E731
    want = [
        [F(0), F(1), F(2), F(3), B(0), F(4), B(1), F(5), B(2), F(6), B(3), F(7), B(4), B(5), B(6), B(7)],
        [F(0), F(1), F(2), B(0), F(3), B(1), F(4), B(2), F(5), B(3), F(6), B(4), F(7), B(5), B(6), B(7)],
        [F(0), F(1), B(0), F(2), B(1), F(3), B(2), F(4), B(3), F(5), B(4), F(6), B(5), F(7), B(6), B(7)],
        [F(0), B(0), F(1), B(1), F(2), B(2), F(3), B(3), F(4), B(4), F(5), B(5), F(6), B(6), F(7), B(7)],
    ]
    assert len(got) == 4, f"one_f_one_b_schedule(4, 8) has {len(got)} stages, expected 4"
    # A backward before its own forward shows on the last stage (no warm-up) first: named whichever stage fails.
    stuck = next((w for s in range(4) if "before its own forward" in (w := why_different(got[s], want[s], s))), "")
    for s in range(4):
        why = stuck or why_different(got[s], want[s], s)
        assert got[s] == want[s], (
            f"one_f_one_b_schedule(4, 8), stage {s}:\n{show([got[s]])}\nexpected\n{show([want[s]])}\n"
            + (f"{why}. " if why else "")
            + f"Stage {s} warms up with p - s - 1 = {3 - s} forwards, then alternates F, B, then drains its backwards"
        )


@pytest.mark.check("schedules_public")
def test_1f1b_with_fewer_microbatches_than_stages(pm):
    got = ops(pm.one_f_one_b_schedule(4, 2))
    want = [[("F", 0), ("F", 1), ("B", 0), ("B", 1)]] * 3 + [[("F", 0), ("B", 0), ("F", 1), ("B", 1)]]
    assert got == want, (
        f"one_f_one_b_schedule(4, 2) gave\n{show(got)}\nexpected\n{show(want)}\n"
        "with m < p the warm-up min(p - s - 1, m) is capped by m: there are only 2 forwards to run"
    )


@pytest.mark.check("schedules_public")
def test_interleaved_two_stages_two_chunks(pm):
    got = ops(pm.interleaved_schedule(2, 4, 2))
    want = [
        [("F", 0, 0), ("F", 1, 0), ("F", 0, 2), ("F", 1, 2), ("F", 2, 0), ("B", 0, 2), ("F", 3, 0), ("B", 1, 2),
         ("F", 2, 2), ("B", 0, 0), ("F", 3, 2), ("B", 1, 0), ("B", 2, 2), ("B", 3, 2), ("B", 2, 0), ("B", 3, 0)],
        [("F", 0, 1), ("F", 1, 1), ("F", 0, 3), ("B", 0, 3), ("F", 1, 3), ("B", 1, 3), ("F", 2, 1), ("B", 0, 1),
         ("F", 3, 1), ("B", 1, 1), ("F", 2, 3), ("B", 2, 3), ("F", 3, 3), ("B", 3, 3), ("B", 2, 1), ("B", 3, 1)],
    ]
    assert len(got) == 2, f"interleaved_schedule(2, 4, 2) has {len(got)} stages, expected 2"
    for s in range(2):
        why = why_different(got[s], want[s], s)
        assert got[s] == want[s], (
            f"interleaved_schedule(2, 4, 2), stage {s}:\n{show([got[s]])}\nexpected\n{show([want[s]])}\n"
            + (f"{why}. " if why else "")
            + "Stage s holds global chunks s and s + p; warm-up is 2(p - s - 1) + (v - 1)p forwards"
        )


@pytest.mark.check("schedules_public")
def test_interleaved_needs_whole_groups(pm):
    must_accept("interleaved_schedule(2, 4, 2)", lambda: pm.interleaved_schedule(2, 4, 2))
    with pytest.raises(ValueError):
        pm.interleaved_schedule(4, 6, 2)
        pytest.fail("interleaved_schedule(4, 6, 2) should raise ValueError: m = 6 is not a multiple of p = 4")


def each_op_once(name: str, args: tuple, stage_ops):
    """check= for a counted call of a schedule: every stage holds its ops (stage_ops(s)), each once; the order is
    what the tests above check."""
    what = f"{name}{args}"

    def check(got) -> None:
        rows = ops(got)
        assert len(rows) == args[0], f"{what} (a call whose lines are counted) has {len(rows)} stages, expected {args[0]}"
        for s, row in enumerate(rows):
            assert sorted(row) == sorted(stage_ops(s)), (
                f"{what} (a call whose lines are counted), stage {s}: expected each of its ops once, found\n"
                f"{show([row])}")

    return check


def assert_lines_grow_with_the_ops(student, fn, what: str, small: tuple, large: tuple, stage_ops, n_ops) -> None:
    """The hidden checks' "work linear in the ops", in small: the lines of your file fn runs grow at most twice
    as fast as the ops it returns, from `small` to `large` (8 to 32 stages)."""
    _, lines_small = student.lines_executed(fn, *small, check=each_op_once(what, small, lambda s: stage_ops(small, s)))
    _, lines_large = student.lines_executed(fn, *large, check=each_op_once(what, large, lambda s: stage_ops(large, s)))
    growth, ops_growth = lines_large / max(lines_small, 1), n_ops(large) / n_ops(small)
    assert growth <= 2 * ops_growth, (
        f"{what}{small} ran {lines_small} lines of your code for {n_ops(small)} ops and {what}{large} ran "
        f"{lines_large} for {n_ops(large)} ({growth:.1f}x the lines for {ops_growth:.0f}x the ops): a schedule "
        "costs a constant amount of work per op. Build each stage's list from the formulas; do not build every "
        "stage's ops and filter them per stage, or search a list for each op"
    )


def plain_ops(args: tuple, s: int) -> list:
    return [(kind, i) for kind in "FB" for i in range(args[1])]


def chunk_ops(args: tuple, s: int) -> list:
    p, m, v = args
    return [(kind, i, s + k * p) for kind in "FB" for i in range(m) for k in range(v)]


@pytest.mark.check("schedules_public")
@pytest.mark.parametrize("name", ["gpipe_schedule", "one_f_one_b_schedule"])
def test_plain_schedules_do_linear_work(student, pm, name):
    assert_lines_grow_with_the_ops(student, getattr(pm, name), name, (8, 8), (32, 32), plain_ops,
                                   lambda a: 2 * a[0] * a[1])


@pytest.mark.check("schedules_public")
def test_interleaved_schedule_does_linear_work(student, pm):
    assert_lines_grow_with_the_ops(student, pm.interleaved_schedule, "interleaved_schedule", (8, 8, 2), (32, 32, 2),
                                   chunk_ops, lambda a: 2 * a[0] * a[1] * a[2])


# --------------------------------------------------------------------------------------------------
# Simulator


@pytest.mark.check("simulate_public")
def test_simulate_gpipe_two_stages(pm):
    sched = [[("F", 0), ("F", 1), ("B", 0), ("B", 1)]] * 2
    r = pm.simulate(sched, forward_time=1.0, backward_time=2.0)
    assert abs(r.makespan - 9.0) < 1e-9, (
        f"makespan {r.makespan}, expected (m + p - 1)(t_f + t_b) = 3 * 3 = 9. Stage 1 runs F0 at 1-2, F1 at 2-3, "
        "B0 at 3-5, B1 at 5-7; stage 0 runs B0 at 5-7 (after stage 1's B0) and B1 at 7-9"
    )
    assert abs(r.bubble_fraction - 1 / 3) < 1e-9, (
        f"bubble_fraction {r.bubble_fraction}, expected (p - 1)/(m + p - 1) = 1/3"
        + (": that is the idle time over the makespan; divide by p * makespan, the total stage-time"
           if abs(r.bubble_fraction - 2 / 3) < 1e-9 else ""))
    got_peaks = peaks(r.peak_activations, 2)
    assert got_peaks == [2, 2], f"peak_activations {got_peaks}, expected [2, 2]"
    want = [(1.0, 2.0, ("F", 0)), (2.0, 3.0, ("F", 1)), (3.0, 5.0, ("B", 0)), (5.0, 7.0, ("B", 1))]
    got = [(float(a), float(b), tuple(plain(op, "a timeline op"))) for a, b, op in plain(r.timeline[1], "stage 1's timeline")]
    assert got == want, f"stage 1 timeline {got}, expected {want}"


@pytest.mark.check("simulate_public")
def test_simulate_charges_p2p_only_across_stages(pm):
    sched = [[("F", 0), ("B", 0)], [("F", 0), ("B", 0)]]
    r = pm.simulate(sched, 1.0, 2.0, p2p_time=0.5)
    # F0 on stage 0: 0-1; sent: F0 on stage 1: 1.5-2.5; B0 there right away: 2.5-4.5; sent: B0 on stage 0: 5-7.
    assert abs(r.makespan - 7.0) < 1e-9, (
        f"makespan {r.makespan}, expected 7: p2p_time is paid on the two hops between stages, never between "
        "a stage's own forward and backward"
    )


@pytest.mark.check("simulate_public")
def test_simulate_names_a_deadlock(pm):
    must_accept("simulate([[('F', 0), ('B', 0)]])", lambda: pm.simulate([[("F", 0), ("B", 0)]]))
    sched = [[("F", 0), ("B", 0)], [("B", 0), ("F", 0)]]
    with pytest.raises(ValueError) as info:
        pm.simulate(sched)
        pytest.fail("stage 1 runs B0 before F0, so nothing can ever happen there: simulate should raise ValueError")
    assert "('B', 0)" in str(info.value), f"the ValueError should name the stuck op ('B', 0), found: {info.value}"


@pytest.mark.check("simulate_public")
def test_simulate_refuses_a_missing_op(pm):
    must_accept("simulate([[('F', 0), ('B', 0)]])", lambda: pm.simulate([[("F", 0), ("B", 0)]]))
    with pytest.raises(ValueError):
        pm.simulate([[("F", 0), ("F", 1), ("B", 0), ("B", 1)], [("F", 0), ("F", 1), ("B", 1)]])
        pytest.fail("stage 1 never runs ('B', 0): simulate should raise ValueError")


@pytest.mark.check("simulate_public")
def test_simulate_interleaved_costs_and_peaks(pm):
    sched = [[("F", 0, 0), ("F", 0, 2), ("B", 0, 2), ("B", 0, 0)], [("F", 0, 1), ("F", 0, 3), ("B", 0, 3), ("B", 0, 1)]]
    r = pm.simulate(sched, 1.0, 2.0)
    # v = 2: forwards take 0.5, backwards 1. Chunks 0 -> 1 -> 2 -> 3, then back: 4 * 0.5 + 4 * 1 = 6.
    assert abs(r.makespan - 6.0) < 1e-9, f"makespan {r.makespan}, expected 6" + (
        ": each chunk op costs the whole forward_time or backward_time here; it costs its time / v, v = 2"
        if abs(r.makespan - 12.0) < 1e-9 else " (each chunk op costs its time / v, v = 2)")
    got_peaks = peaks(r.peak_activations, 2)
    assert got_peaks == [2, 2], f"peak_activations {got_peaks}, expected [2, 2]: count (mb, chunk) pairs"


@pytest.mark.check("simulate_public")
def test_simulate_does_linear_work(student, pm):
    """The hidden `simulate_linear` check, in small: on GPipe schedules of 8 stages by 8 micro-batches and of
    32 by 32 (16x the ops), the lines of your file simulate runs grow at most twice as fast as the ops."""
    counted = []
    for p, m in ((8, 8), (32, 32)):
        sched = [[("F", i) for i in range(m)] + [("B", i) for i in range(m)] for _ in range(p)]

        def check(r, p=p, m=m) -> None:
            want = (m + p - 1) * 3.0
            got = getattr(r, "makespan", None)
            assert isinstance(got, (int, float)) and abs(got - want) < 1e-6, (
                f"simulate on GPipe p={p}, m={m} (a call whose lines are counted) gave makespan {got!r}, "
                f"expected (m + p - 1)(t_f + t_b) = {want:g}")

        counted.append(student.lines_executed(pm.simulate, sched, 1.0, 2.0, check=check)[1])
    (small, large), ops_growth = counted, 16
    assert large / max(small, 1) <= 2 * ops_growth, (
        f"simulate ran {small} lines of your code for 128 ops and {large} for 2048 ({large / max(small, 1):.1f}x "
        f"for {ops_growth}x the ops): do not rescan every stage (or every finished op) to find what can run next; "
        "keep finish times in a dict, and wake a stage only when the op it waits for finishes"
    )


# --------------------------------------------------------------------------------------------------
# Executor


def tiny_model():
    torch.manual_seed(testing.public_seed(0))
    return [torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh()), torch.nn.Linear(5, 2)]


@pytest.mark.check("run_pipeline_public")
def test_run_pipeline_two_stages(pm):
    stages = tiny_model()
    g = testing.generator(1)
    xs = [torch.randn(4, 3, generator=g) for _ in range(4)]
    ys = [torch.randn(4, 2, generator=g) for _ in range(4)]
    sched = [[("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)],
             [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)]]

    whole = copy.deepcopy(torch.nn.Sequential(*stages)).double()
    want_loss = torch.nn.functional.mse_loss(whole(torch.cat(xs).double()), torch.cat(ys).double())
    want_loss.backward()
    want_loss = float(want_loss.detach())
    try:
        run = pm.run_pipeline(stages, xs, ys, sched, torch.nn.MSELoss())
    except RuntimeError as exc:
        if "grad can be implicitly created only for scalar outputs" not in str(exc):
            raise
        raise AssertionError(
            f"run_pipeline raised {exc if type(exc).__module__ == 'student' else f'RuntimeError: {exc}'}. That is a backward of a piece's output without the gradient "
            "the next piece sent back. That gradient is the next piece's input's .grad, which autograd fills only "
            "when that input is a leaf: hand each piece the detached output of the one before, "
            "x = y.detach().requires_grad_()") from None

    assert abs(run.loss - want_loss) < 1e-5, (
        f"loss {run.loss:.6f}, expected the mean {want_loss:.6f}"
        + (": it is 4x too big; divide each microbatch's loss by m" if abs(run.loss - 4 * want_loss) < 1e-4 else "")
    )
    for c, piece in enumerate(whole):
        for i, w in enumerate(piece.parameters()):
            assert_close(run.grads[c][i], w.grad, atol=1e-5, rtol=1e-5,
                         what=f"stage {c} parameter {i}: gradient, against the full-batch one", hint=(
                "Stage 1 must backpropagate loss / m; stage 0 must backpropagate the gradient "
                "stage 1 computed for its input"
            ))
    got_peaks = peaks(run.peak_activations, 2)
    assert got_peaks == [2, 1], f"peak_activations {got_peaks}, expected [2, 1]" + (
        ": [4, 4] is all 4 microbatches in flight on each stage, as when every forward runs before any backward; "
        "run the ops in the schedule's order" if got_peaks == [4, 4] else "")
