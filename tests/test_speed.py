"""The speed machinery on the CPU: the timed loop runs beside the student's code, and the grader's
wall clock rejects reported times it contradicts. (Ceilings and CUDA events need a GPU.)"""

import pytest
import torch

from grader import speed
from grader.harness.client import Sandbox
from grader.harness.session import StudentSession

HONEST = """
import time
def work(x):
    time.sleep(0.02)
    return x * 2
"""

# Freezes the clock the timing loop reads, so every rep reports 0 s while really taking 20 ms.
CHEAT = HONEST + """
time.perf_counter = lambda: 0.0
"""


def session_for(tmp_path, source: str, mode: str) -> StudentSession:
    path = tmp_path / "speedy.py"
    path.write_text(source)
    return StudentSession(mode, lambda _id: path, Sandbox(), lambda _id: 60.0)


@pytest.mark.parametrize("mode", ["local", "sandbox"])
def test_honest_times_pass_and_the_last_output_comes_back(tmp_path, mode):
    student = session_for(tmp_path, HONEST, mode)
    try:
        work = student.load("speedy").work
        t = speed.time_student(student, work, [speed.Randn((4, 8))], reps=5, warmup=1)
    finally:
        student.close()
    assert len(t.times_s) == 5 and 0.015 < t.median_s < 1.0
    assert torch.equal(t.out, t.args[0] * 2), "the last timed output must match the last timed inputs"


def test_a_frozen_clock_is_rejected(tmp_path):
    student = session_for(tmp_path, CHEAT, "sandbox")
    try:
        work = student.load("speedy").work
        with pytest.raises(speed.TimingRejected, match="the timing was not honest"):
            speed.time_student(student, work, [speed.Randn((4, 8))], reps=10, warmup=1)
    finally:
        student.close()


@pytest.mark.parametrize("reported,wall,overhead,ok", [
    ([0.1] * 10, 1.05, 0.05, True),
    ([0.2] * 10, 1.0, 0.0, False),  # more than the wall clock
    ([0.001] * 10, 1.0, 0.0, False),  # far less than the wall clock minus the loop's overhead
    ([0.001] * 10, 0.06, 0.05, True),  # a fast kernel: the loop's overhead explains the wall time
    ([float("nan")] * 10, 1.0, 0.0, False),
])
def test_wall_clock_bounds(reported, wall, overhead, ok):
    if ok:
        speed.check_wall_clock(reported, wall, overhead)
    else:
        with pytest.raises(speed.TimingRejected):
            speed.check_wall_clock(reported, wall, overhead)


def test_randn_recipes_make_fresh_inputs():
    g = torch.Generator().manual_seed(0)
    spec = speed.Randn((3, 5), torch.float16, scale=2.0, shift=1.0, transpose=True)
    a, b = spec.make("cpu", g), spec.make("cpu", g)
    assert a.shape == (3, 5) and a.dtype == torch.float16 and a.stride() == (1, 3)
    assert not torch.equal(a, b), "each rep must get new values, so a cached output cannot pass"


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


def test_gpu_clocks_never_fail():
    clocks, driver = speed.gpu_clocks()
    if not torch.cuda.is_available():
        assert (clocks, driver) == ({}, None), "without a GPU there are no clocks to record"
    else:
        assert set(clocks) <= {"sm", "mem", "max_sm"} and all(mhz > 0 for mhz in clocks.values()), clocks
