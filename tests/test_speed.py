"""The whole scoring path of a speed check, on the CPU: the student's timing in a real sandboxed
worker, the grader's wall-clock bound and its own measure of the loop's overhead, the rep it checks,
the fraction of an injected ceiling, and the credit on the check's course.yaml bar. The speed checks
themselves need CUDA (events, ceilings); everything they score from is exercised here, with an
honest function and with the forgeries in tests/hostile/speed.

Timings here assert structure and rejection, never absolute speed: the honest work is a sleep, a
lower bound on every rep whatever the load, and each forgery misreports it by far more than the
generous slack these tests allow for the sandbox's round trip on a busy machine."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from grader import speed
from grader.harness.client import Sandbox
from grader.harness.session import StudentSession
from grader.plugin import Score
from grader.support import timing
from grader.testing import assert_close
from tests.conftest import COURSE

HOSTILE = Path(__file__).parent / "hostile" / "speed"
SLEEP_S = 0.06  # each call's honest work, in the hostile files and in HONEST below
REPS = 8
ROWS, COLS = 4, 32
SPECS = [speed.Randn((ROWS, COLS), scale=3.0)]
MOVED = 2 * ROWS * COLS * 4  # read x once, write y once, fp32
SLACK_S = 0.2  # the sandbox's round trip on a loaded 2-core machine; the forgeries misreport ~0.4 s
CEILINGS = speed.Ceilings("test device", copy_bytes_per_s=1e6, matmul_flops_per_s=1e9)

HONEST = (HOSTILE / "understates_every_rep.py").read_text().split("import grader.support.timing")[0]


def session_for(tmp_path: Path, source: str, mode: str = "sandbox") -> StudentSession:
    path = tmp_path / "online_softmax.py"
    path.write_text(source)
    return StudentSession(mode, lambda _id: path, Sandbox(), lambda _id: 60.0)


def softmax_is_right(args: list, out) -> None:
    assert isinstance(out, torch.Tensor), f"expected a tensor, found {type(out).__name__}"
    assert_close(out, torch.softmax(args[0].double(), dim=-1), atol=1e-5, rtol=1e-4, what="softmax [row, column]")


def time_softmax(student: StudentSession, rng: random.Random | None = None, **options) -> speed.Timing:
    sm = student.load("online_softmax")
    return speed.time_student(student, sm.softmax_triton, SPECS, check=softmax_is_right, reps=REPS, warmup=1,
                              slack_s=SLACK_S, rng=rng, **options)


def time_hostile(tmp_path: Path, name: str, rng: random.Random | None = None) -> speed.Timing:
    student = session_for(tmp_path, (HOSTILE / f"{name}.py").read_text())
    try:
        return time_softmax(student, rng)
    finally:
        student.close()


def speed_score(t: speed.Timing) -> tuple[float, float]:
    """(achieved fraction of the injected copy ceiling, credit on online_softmax's triton_speed bar)."""
    score = Score(COURSE.exercise("online_softmax").check("triton_speed"))
    achieved = CEILINGS.copy_fraction(MOVED, t.mean_s)
    return achieved, score.speed(achieved)


# --------------------------------------------------------------------------------------------------
# An honest function


@pytest.mark.parametrize("mode", ["local", "sandbox"])
def test_an_honest_function_passes_and_is_scored_from_the_mean(tmp_path, mode):
    student = session_for(tmp_path, HONEST, mode)
    try:
        t = time_softmax(student)
    finally:
        student.close()
    assert len(t.times_s) == REPS and min(t.times_s) >= SLEEP_S, f"every rep sleeps {SLEEP_S} s: {t.times_s}"
    assert t.mean_s == pytest.approx(sum(t.times_s) / REPS), "checks score the mean, which the wall clock bounds"
    assert t.wall_s >= sum(t.times_s) and t.overhead_s >= 0
    assert t.rep is not None and 0 <= t.rep < REPS
    rebuilt = timing.rep_inputs(SPECS, "cpu", t.nonce, t.rep)
    assert torch.equal(t.args[0], rebuilt[0]), "the checked rep's inputs are made by the grader, from the nonce"
    softmax_is_right(t.args, t.out)
    achieved, credit = speed_score(t)
    assert achieved == pytest.approx(MOVED / t.mean_s / CEILINGS.copy_bytes_per_s)
    bar = COURSE.exercise("online_softmax").check("triton_speed").speed
    assert credit == bar.credit(achieved), "the credit is the course.yaml bar applied to the fraction of the ceiling"


def test_the_rep_is_picked_after_the_timing_and_its_output_taken_after(tmp_path):
    events: list[str] = []

    class Recording(StudentSession):
        def drive(self, driver, fn, *args, **kwargs):
            events.append(f"drive reps={kwargs.get('reps')}")
            return super().drive(driver, fn, *args, **kwargs)

    class Picker(random.Random):
        def randrange(self, *args):
            events.append("pick")
            return super().randrange(*args)

    path = tmp_path / "online_softmax.py"
    path.write_text(HONEST)
    student = Recording("local", lambda _id: path, Sandbox(), lambda _id: 60.0)
    t = time_softmax(student, rng=Picker(3))
    assert events == ["drive reps=0", f"drive reps={REPS}", "pick"], (
        f"expected the warm-up, then the timed reps, then the pick; found {events}"
    )
    assert t.rep == random.Random(3).randrange(REPS)


# --------------------------------------------------------------------------------------------------
# Forged timings and outputs (tests/hostile/speed), each through a real sandboxed worker

# A seed whose pick is neither the first rep nor the last (the old grader checked only the last).
PICK = next(s for s in range(100) if random.Random(s).randrange(REPS) not in (0, REPS - 1))


def test_one_rep_carrying_the_whole_sum_gains_nothing(tmp_path):
    t = time_hostile(tmp_path, "one_rep_carries_the_sum")
    assert t.median_s < 1e-6, f"the forged times should have reached the grader: {t.times_s}"
    assert t.mean_s >= SLEEP_S, f"the mean is the honest one (each call sleeps {SLEEP_S} s), found {t.mean_s}"
    achieved, _ = speed_score(t)
    assert achieved <= MOVED / SLEEP_S / CEILINGS.copy_bytes_per_s, "the forgery must not raise the scored fraction"


@pytest.mark.parametrize("name,match", [
    ("understates_every_rep", "the worker's figures and the grader's clock disagree"),
    ("inflates_the_overhead", "the worker's figures and the grader's clock disagree"),
    ("computes_when_asked", "is not the one the worker fingerprinted during it"),
    ("reuses_its_output_buffer", "not a buffer a later call overwrites"),
    ("returns_a_lazy_result", r"holds the output \(a RemoteHandle\): a timed function must return plain data"),
])
def test_forged_figures_are_rejected(tmp_path, name, match):
    with pytest.raises(speed.TimingRejected, match=match):
        time_hostile(tmp_path, name, rng=random.Random(PICK))


@pytest.mark.parametrize("name", ["garbage_but_the_last", "caches_its_output", "forges_its_inputs"])
def test_a_wrong_output_on_the_picked_rep_fails_the_check(tmp_path, name):
    rep = random.Random(PICK).randrange(REPS)
    with pytest.raises(speed.WrongTimedOutput, match=rf"the output of rep {rep + 1} of {REPS} \(picked at random "
                                                     r"after the timing\) is wrong: softmax"):
        time_hostile(tmp_path, name, rng=random.Random(PICK))


# --------------------------------------------------------------------------------------------------
# The pieces


@pytest.mark.parametrize("reported,wall,overhead,ok", [
    ([0.1] * 10, 1.05, 0.05, True),
    ([0.2] * 10, 1.0, 0.0, False),  # more than the wall clock
    ([0.001] * 10, 1.0, 0.0, False),  # far less than the wall clock minus the loop's overhead
    ([0.001] * 10, 0.06, 0.05, True),  # a fast function: the loop's own overhead explains the wall time
    ([0.5] + [1e-9] * 9, 0.52, 0.01, True),  # the forgery: the sum is honest (and so is the mean)
    ([0.05] * 10, 0.52, 0.01, True),
    ([0.04] * 10, 0.52, 0.01, False),  # 20% under: more than the slack
    ([float("nan")] * 10, 1.0, 0.0, False),
    ([float("inf")] + [0.0] * 9, 1.0, 0.0, False),
    ([-0.1] + [0.11] * 9, 1.0, 0.0, False),
])
def test_wall_clock_bounds(reported, wall, overhead, ok):
    if ok:
        speed.check_wall_clock(reported, wall, overhead)
    else:
        with pytest.raises(speed.TimingRejected, match="the worker's figures and the grader's clock disagree"):
            speed.check_wall_clock(reported, wall, overhead)


def test_each_rep_has_inputs_of_its_own_that_the_grader_can_rebuild():
    specs = [speed.Randn((3, 5), torch.float16, scale=2.0, shift=1.0, transpose=True), "not a recipe"]
    a, b = timing.rep_inputs(specs, "cpu", 42, 0), timing.rep_inputs(specs, "cpu", 42, 1)
    assert a[0].shape == (3, 5) and a[0].dtype == torch.float16 and a[0].stride() == (1, 3)
    assert a[1] == "not a recipe"
    assert not torch.equal(a[0], b[0]), "each rep must get new values, so a cached output cannot pass"
    assert torch.equal(a[0], timing.rep_inputs(specs, "cpu", 42, 0)[0]), "the same nonce and rep make the same inputs"
    assert not torch.equal(a[0], timing.rep_inputs(specs, "cpu", 43, 0)[0]), "another request, other inputs"


def test_the_loop_keeps_what_fits_and_makes_the_rest_again():
    result = timing.timed_loop(lambda x: x * 2, SPECS, reps=5, nonce=7, keep_bytes=2 * ROWS * COLS * 4)
    runs = result["runs"]
    assert sorted(runs.kept) == [0, 1], "two outputs fit in the budget"
    for rep in (4, 1):
        want = timing.rep_inputs(SPECS, "cpu", 7, rep)[0] * 2
        fresh = timing.timed_loop(lambda x: x * 2, SPECS, reps=5, nonce=7, keep_bytes=2 * ROWS * COLS * 4)["runs"]
        assert torch.equal(fresh.take(rep), want), f"rep {rep}: kept or made again, the same output"
    assert len(result["fingerprints"]) == 5 and all(len(f) == 1 for f in result["fingerprints"])


def test_fingerprints_cover_every_tensor_number_and_string():
    x = torch.arange(12.0).reshape(3, 4)
    norms, numbers = timing.fingerprint((x, {"n": 3, "name": "a"}, [torch.tensor([3, 4]), None]))
    assert norms.tolist() == pytest.approx([float(x.norm()), 5.0]) and len(numbers) == 2 and numbers[0] == 3.0
    assert timing.fingerprint("b")[1] != timing.fingerprint("a")[1], "a string is part of the commitment too"
    strided = timing.fingerprint_values(timing.fingerprint(x, stride=2))
    assert strided == pytest.approx([float(x[:, ::2].norm())]), "a stride thins each row, every row still counts"
    assert speed.same_fingerprint([1.0, float("nan")], [1.0000001, float("nan")])
    assert not speed.same_fingerprint([1.0], [1.01]) and not speed.same_fingerprint([1.0], [1.0, 2.0])


def test_only_plain_data_can_be_held_to_its_fingerprint():
    class Lazy:
        pass

    assert timing.foreign_part((torch.zeros(2), [1, 2.0, "s", None], {"a": torch.ones(1)})) is None
    assert timing.foreign_part((torch.zeros(2), {"a": [Lazy()]})) == "the output[1]['a'][0] (a Lazy)"
    assert timing.foreign_part({1, 2}) == "the output (a set)"


@pytest.mark.parametrize("line,clocks,driver", [
    ("1980, 3201, 1980, 550.54.15", {"sm": 1980.0, "mem": 3201.0, "max_sm": 1980.0}, "550.54.15"),
    ("[N/A], 3201, [N/A], 535.1", {"mem": 3201.0}, "535.1"),  # some virtualised GPUs hide the SM clock
])
def test_nvidia_smi_clocks_are_parsed(line, clocks, driver):
    assert speed.parse_clocks(line) == (clocks, driver)


def test_ceilings_record_the_clocks_they_were_measured_at():
    ceil = speed.Ceilings("NVIDIA H200", 4.0e12, 7.0e14, {"sm": 1980.0, "mem": 3201.0})
    assert ceil.figures() == {"matmul_tflops": 700.0, "copy_gbps": 4000.0, "sm_clock_mhz": 1980.0,
                              "mem_clock_mhz": 3201.0}, "speed checks record ceilings and clocks as float metrics"
    assert ceil.copy_fraction(2e12, 1.0) == 0.5 and ceil.matmul_fraction(7e13, 0.5) == pytest.approx(0.2)


def test_gpu_clocks_never_fail():
    clocks, driver = speed.gpu_clocks()
    if not torch.cuda.is_available():
        assert (clocks, driver) == ({}, None), "without a GPU there are no clocks to record"
    else:
        assert set(clocks) <= {"sm", "mem", "max_sm"} and all(mhz > 0 for mhz in clocks.values()), clocks
