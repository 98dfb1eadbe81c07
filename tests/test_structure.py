"""The trusted side of the structural checks (grader/structure.py): the grader's own clock at two sizes,
the tamper gate on the worker's figures, and submissions that forge those figures.

The graded attacks below win the structural checks on main (the worker's figures say "flat") and lose
them once the grader cross-checks with what it observes itself."""

from __future__ import annotations

import sys
import textwrap
import time

import pytest
import torch

from grader import structure
from grader.harness import counters, tamper
from grader.harness.tamper import assert_untampered
from grader.structure import Scaling, Timing, assert_flat_on_the_clock, assert_worker_agrees, clock
from tests.conftest import COURSE, ROOT, checks_of, grade_folder
from tests.known_wrong import Mutant, write_mutant
from tests.known_wrong.speculative import MUTANTS as SPECULATIVE_MUTANTS

# --------------------------------------------------------------------------------------------------
# The clock


def test_sizes_and_bars_per_mode():
    s = Scaling(16, 8192, bar=10.0, large_in_process=2048, bar_in_process=12.0)
    assert s.sizes("sandbox") == (16, 8192) and s.sizes("local") == (16, 2048)
    assert s.bar_for("sandbox") == 10.0 and s.bar_for("local") == 12.0
    plain = Scaling(4, 400, bar=3.0)
    assert plain.sizes("local") == (4, 400) and plain.bar_for("local") == 3.0


def sleeping_call(per_item_s: float, fixed_s: float = 0.002):
    def call(n: int):
        time.sleep(fixed_s + per_item_s * n)
        return n
    return call


class FakeSession:
    """A sandboxed session as `clock` sees it: its mode and a round trip that costs `round_trip_s`."""

    mode = "sandbox"

    def __init__(self, round_trip_s: float = 0.002, files: tuple = ()):
        self.round_trip_s, self.trips, self.files = round_trip_s, 0, list(files)

    def round_trip(self, *args) -> bool:
        self.trips += 1
        time.sleep(self.round_trip_s)
        return True

    def student_files(self) -> list:
        return self.files


SANDBOX = FakeSession()


def test_a_flat_cost_passes_after_the_first_runs_and_every_result_is_checked():
    made, checked = [], []
    scaling = Scaling(1, 100, bar=3.0, runs=3, max_runs=9)

    def make(n: int):
        made.append(n)
        return (n,)

    timing = clock(SANDBOX, sleeping_call(0.0), make, lambda got, n: checked.append((got, n)), scaling)
    assert timing.flat and timing.ratio < 3.0, timing.describe()
    assert len(timing.small_s) == len(timing.large_s) == 3, "a flat ratio needs only `runs` runs"
    assert made == [1, 100] + [1, 100] * 3, f"fresh arguments for every call, alternating, found {made}"
    assert checked == [(n, n) for n in made], "every call's result goes through the check, the warm-up's too"


def test_a_growing_cost_fails_only_after_max_runs_and_says_what_the_clock_saw():
    scaling = Scaling(1, 100, bar=3.0, unit="rows", runs=2, max_runs=4)
    # about 6x (2.1 ms against 12 ms): above the bar, not so far above it that more runs could not help
    timing = clock(SANDBOX, sleeping_call(0.0001), lambda n: (n,), lambda got, n: None, scaling)
    assert not timing.flat and len(timing.large_s) == 4, f"a ratio above the bar takes max_runs runs: {timing.large_s}"
    with pytest.raises(AssertionError) as info:
        assert_flat_on_the_clock(timing, "f", "Do it at once.", lines=(12, 12))
    message = str(info.value)
    for part in ("the worker counted 12 and 12 lines", "100x the rows", "grader's own clock", "a loop over rows",
                 "Do it at once."):
        assert part in message, f"expected {part!r} in the message, found: {message}"


def test_a_ratio_far_above_the_bar_fails_without_the_remaining_runs():
    # 2.5 ms against 52 ms: 20x the size's cost, over GIVE_UP times the bar after `runs` runs. Retrying is for a
    # busy machine near the bar; a call this superlinear can take seconds each, paid from the exercise's time.
    scaling = Scaling(1, 100, bar=3.0, runs=2, max_runs=10)
    timing = clock(SANDBOX, sleeping_call(0.0005), lambda n: (n,), lambda got, n: None, scaling)
    assert timing.ratio > structure.GIVE_UP * 3.0 and len(timing.large_s) == 2, (timing.ratio, timing.large_s)


def test_a_wrong_result_under_the_clock_fails_the_check():
    def check(got, n):
        assert got == n + 1, f"expected {n + 1}, found {got}"

    with pytest.raises(AssertionError, match="expected 2, found 1"):
        clock(SANDBOX, sleeping_call(0.0, 0.0), lambda n: (n,), check, Scaling(1, 10, bar=3.0))


def test_work_scales_each_time_to_the_nominal_size():
    # Calls whose size varies run to run: a cost linear in the work done must read as flat per unit.
    sizes = iter([1, 10, 2, 20, 3, 30, 4, 40])
    timing = clock(SANDBOX, lambda n: time.sleep(0.001 * n) or n, lambda n: (next(sizes),), lambda got, n: None,
                   Scaling(1, 10, bar=15.0, runs=3, max_runs=3), work=lambda got, n: n)
    assert 5 < timing.ratio < 15, f"linear work at 10x the size reads about 10x once scaled, found {timing.ratio:.1f}"


def test_the_clock_is_the_one_bound_at_import(monkeypatch):
    """A module that replaces time.perf_counter (in-process, make check) does not change what the clock reads."""
    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
    timing = clock("local", sleeping_call(0.0005), lambda n: (n,), lambda got, n: None,
                   Scaling(1, 100, bar=3.0, runs=2, max_runs=2))
    assert timing.best_large > 0.02, f"the clock read {timing.best_large} s for a call that slept 50 ms"


class RecordingSession(FakeSession):
    """A FakeSession that keeps the arguments of every round trip."""

    def __init__(self, round_trip_s: float = 0.002):
        super().__init__(round_trip_s)
        self.sent: list[tuple] = []

    def round_trip(self, *args) -> bool:
        self.sent.append(args)
        return super().round_trip(*args)


def test_each_run_times_a_round_trip_with_the_small_calls_arguments():
    session, made = RecordingSession(), []

    def make(n: int):
        made.append((n, object()))  # a fresh object per call: the round trip must carry the small call's own
        return made[-1]

    timing = clock(session, lambda n, tag: n, make, lambda got, n, tag: None, Scaling(1, 100, bar=3.0, runs=3, max_runs=3))
    small_args = [args for args in made[2:] if args[0] == 1]
    assert session.sent == small_args, f"one round trip per run, with that run's small arguments: {session.sent}"
    assert len(timing.base_s) == 3 and timing.best_base >= 0.002, timing.base_s


def test_sleeping_at_the_small_size_buys_nothing():
    """Attack (b): the small call sleeps, so large / small reads flat; it counts for small_cap round trips only."""

    def call(n: int):
        time.sleep(0.03 if n < 50 else 0.0005 * n)  # 30 ms at n = 1, 50 ms at n = 100
        return n

    scaling = Scaling(1, 100, bar=3.0, runs=2, max_runs=3, small_cap=5.0)
    timing = clock(FakeSession(0.002), call, lambda n: (n,), lambda got, n: None, scaling)
    assert timing.best_large / timing.best_small < 3.0, "the plain ratio is flat: that is the attack"
    assert timing.padded and not timing.flat, timing.describe()
    with pytest.raises(AssertionError) as info:
        assert_flat_on_the_clock(timing, "f", "Do it at once.")
    message = str(info.value)
    for part in ("counts for 5 round trips only", "a sleep, a busy wait, a loop padded to a fixed length",
                 "the same arguments make the round trip"):
        assert part in message, f"expected {part!r} in the message, found: {message}"


def test_a_loop_padded_to_a_fixed_trip_count_costs_its_whole_price_at_the_small_size():
    """Attack (a): range(max(n, CAP)) makes both sizes cost the same; the small one is over the cap."""
    call = lambda n: time.sleep(0.0005 * max(n, 100)) or n  # noqa: E731 - 50 ms at any n <= 100
    timing = clock(FakeSession(0.002), call, lambda n: (n,), lambda got, n: None,
                   Scaling(1, 100, bar=3.0, runs=2, max_runs=3))
    assert timing.padded and not timing.flat and timing.ratio > 3.0, timing.describe()


def test_a_slow_but_flat_honest_call_passes():
    # 3 ms at both sizes against a 2 ms round trip: under the cap, and flat.
    timing = clock(FakeSession(0.002), sleeping_call(0.0, 0.003), lambda n: (n,), lambda got, n: None,
                   Scaling(1, 100, bar=3.0, runs=3, max_runs=3))
    assert timing.flat and not timing.padded, timing.describe()
    assert timing.metrics()["clock_round_trip_ms"] >= 2.0, timing.metrics()


def test_in_process_no_round_trip_is_timed():
    timing = clock("local", sleeping_call(0.0), lambda n: (n,), lambda got, n: None, Scaling(1, 10, bar=3.0, runs=2))
    assert timing.base_s == [] and timing.best_base is None and not timing.padded, timing.base_s


def test_the_mode_string_uses_the_registered_session_and_refuses_without_one(monkeypatch):
    from grader.harness import session as sessions

    monkeypatch.setattr(sessions, "_registered", [])
    with pytest.raises(RuntimeError, match="needs the session"):
        clock("sandbox", sleeping_call(0.0), lambda n: (n,), lambda got, n: None, Scaling(1, 10, bar=3.0))
    session = FakeSession()
    sessions.register_session(session)
    clock("sandbox", sleeping_call(0.0), lambda n: (n,), lambda got, n: None, Scaling(1, 10, bar=3.0, runs=2))
    assert session.trips >= 2, "clock(student.mode, ...) in the sandbox times its round trips through the session"


def test_a_session_registers_itself_and_a_round_trip_needs_a_worker(monkeypatch, tmp_path):
    from grader.harness import session as sessions
    from grader.harness.session import StudentSession

    monkeypatch.setattr(sessions, "_registered", [])
    session = StudentSession("sandbox", lambda _id: ROOT / "nowhere.py")
    assert sessions.registered_session() is session
    assert session.round_trip(1, 2) is False and session.student_files() == [], "no worker running: nothing to time"
    path = tmp_path / "mod.py"
    path.write_text("def f(n):\n    return n\n")
    local = StudentSession("local", lambda _id: path)
    assert sessions.registered_session() is local, "the latest session is the one the tests use"
    local.load("mod")
    assert local.student_files() == [path.resolve()], local.student_files()
    with pytest.raises(RuntimeError, match="needs the session"):
        clock("sandbox", sleeping_call(0.0), lambda n: (n,), lambda got, n: None, Scaling(1, 10, bar=3.0))


def test_the_clock_refuses_a_file_that_reads_a_clock_before_timing_anything(tmp_path):
    path = tmp_path / "padded.py"
    path.write_text("import time\n\n\ndef f(n):\n    if n < 50:\n        time.sleep(0.03)\n    return n\n")
    calls = []
    with pytest.raises(tamper.Tampered, match=r"the grader's own clock times your calls.*line 1: time"):
        clock(FakeSession(files=(path,)), lambda n: calls.append(n) or n, lambda n: (n,), lambda got, n: None,
              Scaling(1, 100, bar=3.0))
    assert calls == [], "nothing is timed once the file is refused"


def test_a_line_count_beyond_max_lines_fails_even_on_a_flat_clock():
    scaling = Scaling(16, 8192, bar=10.0, max_lines=400)
    timing = Timing(scaling, 16, 8192, 10.0, [0.002], [0.002], [0.002])
    assert timing.flat
    assert_flat_on_the_clock(timing, "f", "Do it at once.", lines=(40, 40))
    with pytest.raises(AssertionError, match=r"executed 32772 and 32772 lines .*\(the bar is 400, whatever the size\)"):
        assert_flat_on_the_clock(timing, "f", "Do it at once.", lines=(32772, 32772))


def test_a_worker_figure_the_clock_contradicts_fails_saying_so():
    timing = Timing(Scaling(512, 131072, bar=5.0, unit="blocks"), 512, 131072, 5.0, [0.001], [0.1])
    with pytest.raises(AssertionError, match="the worker's figures \\(1.0x longer\\) disagree with the grader's own clock"):
        assert_worker_agrees(timing, "the manager", "1.0x longer")
    assert_worker_agrees(Timing(timing.scaling, 512, 131072, 5.0, [0.001], [0.002]), "the manager", "1.0x")


# --------------------------------------------------------------------------------------------------
# The tamper gate and the line counter


def test_a_file_that_reaches_for_tracing_fails_the_gate(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import sys\n\ndef f(x):\n    sys.settrace(None)\n    return x\n")
    with pytest.raises(tamper.Tampered, match="line 4: sys.settrace"):
        assert_untampered(path, "the count of lines")
    clean = tmp_path / "clean.py"
    clean.write_text("import torch\n\ndef f(x):\n    return torch.cumsum(x, 0)\n")
    assert_untampered(clean, "the count of lines")


def test_the_line_counter_reports_a_trace_switched_off_during_the_call(tmp_path):
    src = tmp_path / "mod.py"
    src.write_text(textwrap.dedent("""
        import sys
        def quiet(n):
            tracer = sys.gettrace()
            sys.settrace(None)
            total = sum(range(n))
            return total
        def loud(n):
            return sum(range(n))
    """))
    namespace: dict = {}
    exec(compile(src.read_text(), str(src), "exec"), namespace)
    with counters.LineCounter(str(src)) as counter:
        namespace["quiet"](10)
    assert counter.count == counters.LineCounter.TAMPERED, f"expected the tampered mark, found {counter.count}"
    assert sys.gettrace() is None
    with counters.LineCounter(str(src)) as counter:
        namespace["loud"](10)
    assert counter.count > 0


def test_lines_executed_fails_a_tampering_file_in_process(tmp_path):
    from grader.harness.session import StudentSession

    path = tmp_path / "sneaky.py"
    path.write_text("import sys\n\ndef f(n):\n    sys.settrace(None)\n    return n\n")
    session = StudentSession("local", lambda _id: path)
    module = session.load("sneaky")
    with pytest.raises(tamper.Tampered, match="the count of lines your code executed"):
        session.lines_executed(module.f, 3, check=lambda value: None)


# --------------------------------------------------------------------------------------------------
# Graded attacks: each wins its structural check on main and loses it after the cross-check

SETTRACE_LOOP = Mutant(
    name="loop_with_the_trace_switched_off",
    why="loops over the rows for the extra token with tracing switched off around the loop, restored after",
    edits=[
        ("from collections.abc import Callable\n", "import sys\nfrom collections.abc import Callable\n"),
        ("extra = torch.multinomial(residual, 1, generator=generator).squeeze(1)  # normalises internally",
         "tracer = sys.gettrace()\n    sys.settrace(None)\n"
         "    extra = torch.stack([torch.multinomial(residual[b], 1, generator=generator)[0] for b in range(B)])\n"
         "    sys.settrace(tracer)"),
    ],
    loses=["vectorised"],
)

FREE_LIST = [
    ("self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))", "self._free = list(range(num_blocks))"),
    ("                del self._free[b]", "                self._free.remove(b)"),
    ("                self._free[b] = None  # to the back", "                self._free.append(b)  # to the back"),
    ("        block, _ = self._free.popitem(last=False)", "        block = self._free.pop(0)"),
]
FLAT_CLOCK = '''

# Every clock reading in this process advances by the same step, so whatever is timed here looks flat.
import itertools
import time

_ticks = itertools.count()
time.perf_counter = lambda: next(_ticks) * 1e-3
'''
PATCHED_DRIVER = '''

import itertools
import types

import grader.support.paged_kv as _driver

_driver_ticks = itertools.count()
_driver.time = types.SimpleNamespace(perf_counter=lambda: next(_driver_ticks) * 1e-3)
'''
# The red team's padding attacks on speculative_accept, and the by-name evasion of the old scan: each kept
# its points before the round-trip cap, the line bound and the new scan rules.
IMPORT_FUNCTOOLS = ("from collections.abc import Callable\n", "import functools\nfrom collections.abc import Callable\n")
DRAW = "extra = torch.multinomial(residual, 1, generator=generator).squeeze(1)  # normalises internally"
MAP_PADDED = Mutant(
    name="map_loop_padded_to_a_fixed_length",
    why="one draw per row through map() (the lines stay flat), padded with one-entry rows to max(B, 16384) draws, so "
        "that the small call already costs what the large one does and the ratio reads flat",
    edits=[IMPORT_FUNCTOOLS, (DRAW,
           "draw = functools.partial(torch.multinomial, num_samples=1, generator=generator)\n"
           "    pad = [residual.new_ones(1)] * max(0, 16384 - B)\n"
           "    extra = torch.cat(list(map(draw, list(residual.unbind(0)) + pad)))[:B]")],
    loses=["vectorised"],
)
MAP_SLEEPING = Mutant(
    name="map_loop_sleeping_when_small",
    why="one draw per row through map(), and a sleep when the batch is small so that the ratio reads flat",
    edits=[("from collections.abc import Callable\n", "import functools\nimport time\nfrom collections.abc import Callable\n"),
           (DRAW, "if B < 1024:\n        time.sleep(0.05)\n"
                  "    draw = functools.partial(torch.multinomial, num_samples=1, generator=generator)\n"
                  "    extra = torch.cat(list(map(draw, residual.unbind(0))))")],
    loses=["vectorised"],
)
LOOP_PADDED = Mutant(
    name="python_loop_padded_to_a_fixed_length",
    why="a Python loop over max(B, 8192) rows: the same (huge) line count at both traced sizes, the same time at both "
        "clocked sizes",
    edits=[(DRAW, "extra = torch.zeros(B, dtype=torch.long)\n"
                  "    one = residual.new_ones(1)\n"
                  "    for b in range(max(B, 8192)):\n"
                  "        if b < B:\n"
                  "            extra[b] = torch.multinomial(residual[b], 1, generator=generator)[0]\n"
                  "        else:\n"
                  "            torch.multinomial(one, 1, generator=generator)")],
    loses=["vectorised"],
)
SETTRACE_BY_NAME = Mutant(
    name="loop_with_the_trace_switched_off_by_name",
    why="the trace switched off around a loop over rows through functools.reduce(getattr, ...) with a name built at "
        "run time, which the old scan did not see",
    edits=[("from collections.abc import Callable\n", "import functools\nimport sys\nfrom collections.abc import Callable\n"),
           (DRAW, "name = ''.join(c for c in 'xsxextxtxrxaxcxe' if c != 'x')\n"
                  "    functools.reduce(getattr, [name], sys)(None)\n"
                  "    extra = torch.stack([torch.multinomial(residual[b], 1, generator=generator)[0] for b in range(B)])")],
    loses=["vectorised"],
)
BALLAST = [  # a small pool moves a ballast list as long as the large pool's free list: the same cost per op
    ("self._free = list(range(num_blocks))", "self._free = list(range(num_blocks))\n"
                                            "        self._ballast = [None] * max(0, 131072 - num_blocks)"),
    ("        block = self._free.pop(0)", "        for _ in range(8 if self._ballast else 0):\n"
                                          "            self._ballast.append(self._ballast.pop(0))\n"
                                          "        block = self._free.pop(0)"),
]
ATTACKS = [
    ("speculative", SETTRACE_LOOP, "tampered"),
    ("speculative", SETTRACE_BY_NAME, "tampered"),
    ("speculative", next(m for m in SPECULATIVE_MUTANTS if m.name == "one_draw_per_row_through_map"), "ops"),
    ("speculative", MAP_PADDED, "allowance"),  # padded operators: caught by the count's bar before the clock
    ("speculative", MAP_SLEEPING, "tampered"),
    ("speculative", LOOP_PADDED, "lines"),
    ("paged_kv", Mutant("free_list_behind_a_flat_clock", "a list as the free queue, and time.perf_counter replaced so "
                        "the worker's timing loop reads the same interval every time", FREE_LIST, ["manager_speed"]),
     "tampered"),
    ("paged_kv", Mutant("free_list_behind_a_patched_driver", "a list as the free queue, and the timing driver's clock "
                        "patched", FREE_LIST, ["manager_speed"]), "tampered"),
    ("paged_kv", Mutant("free_list_padded_for_small_pools", "a list as the free queue, and a scan of a ballast list that "
                        "makes a small pool cost what a large one does, so the worker's own times read flat",
                        FREE_LIST + BALLAST, ["manager_speed"]), "disagree"),
]
EXTRA_SOURCE = {"free_list_behind_a_flat_clock": FLAT_CLOCK, "free_list_behind_a_patched_driver": PATCHED_DRIVER}
MESSAGES = {"tampered": "your file reaches for", "clock": "on the grader's own clock",
            "ops": "torch operators for", "allowance": "at either size",
            "disagree": "disagree with the grader's own clock", "padded": "round trips only",
            "lines": "whatever the size"}


@pytest.mark.parametrize("exercise_id,mutant,kind", ATTACKS, ids=[m.name for _, m, _ in ATTACKS])
def test_a_forged_structural_figure_loses_its_check(tmp_path, exercise_id, mutant, kind):
    exercise = next(e for e in COURSE.exercises if e.id == exercise_id)
    folder = write_mutant(ROOT, exercise, mutant, tmp_path / mutant.name)
    if mutant.name in EXTRA_SOURCE:
        path = folder / exercise.file
        path.write_text(path.read_text() + EXTRA_SOURCE[mutant.name])
    result = grade_folder(folder, [exercise_id], checks=mutant.loses)
    checks = checks_of(result, exercise_id)
    for check_id in mutant.loses:
        check = checks[check_id]
        assert check["points"] < check["max_points"], (
            f"{mutant.name} ({mutant.why}) should lose points on {check_id}, kept {check['points']}/{check['max_points']}"
        )
        messages = " ".join(t.get("message", "") for t in check["tests"])
        assert MESSAGES[kind] in messages, f"expected {MESSAGES[kind]!r} in the messages of {check_id}, found: {messages}"


def test_a_linear_baseline_measured_in_the_same_runs_takes_the_machines_own_growth_out():
    """Linear work that grows faster than its size on a loaded machine (here: 1 ms per 10 units, plus 2 ms)
    reads as the baseline's growth, not as the bar; work that grows with the square of the size does not."""
    linear_call = sleeping_call(0.0001)
    scaling = Scaling(10, 400, bar=3.0, unit="ops", runs=2, max_runs=4)
    honest = clock(SANDBOX, linear_call, lambda n: (n,), lambda got, n: None, scaling, linear=sleeping_call(0.0001))
    assert honest.linear_growth is not None and honest.growth > 3.0, "the plain growth alone would fail the bar"
    assert honest.flat and honest.ratio < 3.0, honest.describe()
    quadratic = clock(SANDBOX, lambda n: time.sleep(0.002 + 0.0000025 * n * n) or n, lambda n: (n,),
                      lambda got, n: None, scaling, linear=sleeping_call(0.0001))
    assert not quadratic.flat, quadratic.describe()
    text = quadratic.describe()
    assert "linear work of the same sizes took" in text and "grows" in text and "the bar is 3x" in text, text


def shaped_call(per_stage_s: float, per_op_s: float = 0.00001, ops: int = 1200):
    """The same ops over n stages: honest code costs ops * per_op_s at any n; per_stage_s adds a cost per op
    that grows with the stages (a rescan of them for each op)."""
    def call(n: int):
        time.sleep(0.001 + ops * (per_op_s + per_stage_s * n))
        return n
    return call


# honest: 13 ms at both shapes; a rescan of 0.5 us per stage visited adds 60 ms at 100 stages (ratio ~5.6)
SHAPES = Scaling(2, 100, bar=3.0, unit="stages", same="1200 ops", small_cap=float("inf"), linear_cap=1.5, runs=2,
                 max_runs=3)


def test_the_same_work_over_more_stages_passes_when_honest_and_fails_when_it_rescans():
    baseline = shaped_call(0.0)
    honest = clock(SANDBOX, shaped_call(0.0), lambda n: (n,), lambda got, n: None, SHAPES, linear=baseline)
    assert honest.flat and not honest.padded, honest.describe()
    # a small call of several ms is real work here, not padding: small_cap (round trips) does not apply
    assert honest.best_small > 5 * honest.best_base, (honest.best_small, honest.best_base)
    rescans = clock(SANDBOX, shaped_call(0.0000005), lambda n: (n,), lambda got, n: None, SHAPES, linear=baseline)
    assert not rescans.flat, rescans.describe()
    text = rescans.describe()
    for part in ("the same 1200 ops over 100 stages took", "as long as over 2", "grows", "with the stages",
                 "the bar is 3x"):
        assert part in text, f"expected {part!r} in: {text}"


def test_padding_the_few_stages_with_work_counts_for_linear_cap_baselines_only():
    """A rescan padded to a fixed length (100 stages visited per op at any p) costs the same at both shapes;
    the small one is over `linear_cap` times the trusted baseline of its shape, so it counts for that only."""
    padded = lambda n: shaped_call(0.0000005)(max(n, 100))  # noqa: E731 - 73 ms at any n <= 100, 1.5 x 13 counted
    timing = clock(SANDBOX, padded, lambda n: (n,), lambda got, n: None, SHAPES, linear=shaped_call(0.0))
    assert timing.best_large / timing.best_small < 3.0, "the plain ratio is flat: that is the attack"
    assert timing.padded and not timing.flat, timing.describe()
    assert "counts for that much only" in timing.describe(), timing.describe()


def test_a_counted_call_is_never_taken_without_a_check_of_its_result():
    """The counts of a call say nothing of the work when its result is not checked: a submission that can tell a
    counted call from the others returns a placeholder there (red team round 15). So `work_executed` and
    `lines_executed` take no call without `check` (a call without one is a TypeError, which the references'
    full-marks tests would meet)."""
    import inspect
    import re

    from grader.harness.session import StudentSession

    for name in ("work_executed", "lines_executed"):
        check = inspect.signature(getattr(StudentSession, name)).parameters["check"]
        assert check.kind is inspect.Parameter.KEYWORD_ONLY and check.default is inspect.Parameter.empty, name
    files = [*ROOT.glob("grader/hidden/*/test_hidden.py"), *ROOT.glob("exercises/*/test_public.py")]
    calls = [(path.name, m) for path in files for m in re.findall(r"\.(?:work|lines)_executed\(", path.read_text())]
    assert len(calls) >= 10, "the structural tests must still count their calls"


def test_reads_padded_at_the_small_size_still_fail_at_the_big_one():
    """A loop over .tolist() values that pads its small call's reads to what the big call reads keeps the growth
    flat (red team round 16); the big call's bytes are bounded whatever the small one read."""
    from types import SimpleNamespace

    from grader.structure import READ_ALLOWANCE, assert_no_hidden_loop

    padded = SimpleNamespace(lines=20, ops=30, reads=2048, read_bytes=2048 * 8)
    with pytest.raises(AssertionError, match="bytes here"):
        assert_no_hidden_loop("route", ("T=48", "T=480"), padded, padded, "")
    packed = SimpleNamespace(lines=20, ops=30, reads=45, read_bytes=360)  # 960 expert ids of 3 bits, packed
    with pytest.raises(AssertionError, match="bytes here"):
        assert_no_hidden_loop("route", ("T=48", "T=480"), packed, packed, "")
    assert READ_ALLOWANCE >= 16 * 8, "the allowance must stay above what a few honest scalars need"
    honest = SimpleNamespace(lines=20, ops=30, reads=2, read_bytes=16)
    assert_no_hidden_loop("route", ("T=48", "T=480"), honest, honest, "")


# --------------------------------------------------------------------------------------------------
# The declared check: assert_no_loop_over, at real model shapes

HEADS = '''
import torch


def vectorised(x):
    return (x * 2).sum(-1)


def loop(x):
    return torch.stack([(x[h] * 2).sum() for h in range(x.shape[0])])


def loop_padded(x):
    out = []
    for h in range(200):  # a fixed trip count above any size: lines and operators the same at both sizes
        out.append((x[min(h, x.shape[0] - 1)] * 2).sum())
    return torch.stack(out[:x.shape[0]])


def loop_in_c(x):
    return torch.stack(list(map(torch.sum, x * 2)))


def on_values(x):
    return torch.tensor(list(map(sum, x.tolist()))) * 2  # the loop runs in C, on Python floats


def wrong(x):
    return x.sum(-1)
'''


@pytest.fixture
def heads(tmp_path):
    from grader.harness.session import StudentSession

    path = tmp_path / "heads.py"
    path.write_text(HEADS)
    session = StudentSession("local", lambda _id: path)
    return session, session.load("heads")


def _heads_input(n: int):
    return (torch.randn(n, 16, dtype=torch.float64),)


def _heads_check(result, x):
    assert torch.allclose(result.double(), (x * 2).sum(-1)), "not twice the row sums"



def test_a_vectorised_call_passes_the_declared_check_at_real_model_shapes(heads):
    session, module = heads
    structure.assert_no_loop_over(session, module.vectorised, _heads_input, _heads_check, over="query heads",
                                  sizes=(8, 128))


@pytest.mark.parametrize("fn,found", [("loop", "grows with the query heads"),
                                      ("loop_padded", "torch operators for 8 query heads"),
                                      ("loop_in_c", "torch operators"),
                                      ("on_values", "back into Python")])
def test_every_kind_of_loop_over_the_declared_dimension_fails(heads, fn, found):
    session, module = heads
    with pytest.raises(AssertionError, match=found):
        structure.assert_no_loop_over(session, getattr(module, fn), _heads_input, _heads_check, over="query heads",
                                      sizes=(8, 128), advice="Index all heads at once.")


def test_the_declared_check_counts_only_calls_whose_answer_is_right(heads):
    session, module = heads
    with pytest.raises(AssertionError, match="not twice the row sums"):
        structure.assert_no_loop_over(session, module.wrong, _heads_input, _heads_check, over="query heads")


@pytest.mark.parametrize("sizes", [(8, 32), (128, 128), (0, 128)])
def test_sizes_too_small_to_tell_a_loop_are_refused_with_what_is_needed(heads, sizes):
    session, module = heads
    with pytest.raises(ValueError, match=f"big >= {structure.FEWEST_ITEMS}"):
        structure.assert_no_loop_over(session, module.vectorised, _heads_input, _heads_check, over="query heads",
                                      sizes=sizes)
