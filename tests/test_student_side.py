"""The student's side as a student meets it: `make check` and the interview rounds say why a file that does not
compile or import was not run (and exit 1), never record a round at 0/0, and never delete a practice file."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from grader import selfstudy

SYNTAX_ERROR = "def online_normalizer(chunks):\n    return (1,\n"  # line 2 opens a bracket it never closes
IMPORT_ERROR = "import numpy\n\nimport no_such_module_for_the_course\n"  # line 3 raises at import


def grader(cwd, *args):
    return subprocess.run([sys.executable, "-m", "grader", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "160"}, timeout=600)


def flat(text: str) -> str:
    """Rich wraps long lines: compare the words."""
    return " ".join(text.split())


@pytest.mark.parametrize("source,reason", [
    (SYNTAX_ERROR, "online_softmax.py does not compile: SyntaxError at line 2"),
    (IMPORT_ERROR, "ModuleNotFoundError: No module named 'no_such_module_for_the_course'"),
], ids=["syntax_error", "import_error"])
def test_check_of_a_file_that_does_not_run_exits_1_with_the_reason(root, tmp_path, source, reason):
    (tmp_path / "online_softmax").mkdir()
    (tmp_path / "online_softmax" / "online_softmax.py").write_text(source)
    run = grader(root, "check", "online_softmax", "--from", str(tmp_path))
    out = flat(run.stdout)
    assert run.returncode == 1, f"a file that does not run fails `make check` (exit 1), found {run.returncode}: {out}"
    assert f"NOT RUN online_softmax: expected {tmp_path}/online_softmax/online_softmax.py to compile and import, " \
           f"found: " in out, out
    assert reason in out, f"`make check` must name the reason ({reason!r}): {out}"
    if source == SYNTAX_ERROR:  # no test was collected
        assert re.search(r"online_softmax not run 0/\d+", out), f"the table says 'not run', not 0/0 tests: {out}"
    if source == IMPORT_ERROR:
        assert 'online_softmax.py", line 3, in <module>' in run.stdout, f"the import's line is shown: {run.stdout}"
        assert "FAILED online_softmax" not in out, "one reason, not a FAILED line per test that never ran its code"


@pytest.fixture(scope="module")
def lab(root, tmp_path_factory):
    """A student's copy of the course (grader release): its own grader, .pristine/ stubs, practice/ and
    .progress.json."""
    from grader.release import build_release

    out = tmp_path_factory.mktemp("student") / "lab"
    build_release(root, out)
    return out


def progress(lab) -> dict:
    return json.loads((lab / selfstudy.PROGRESS_FILE).read_text())


def test_an_interview_round_on_a_file_that_does_not_compile_is_not_recorded(lab, root):
    start = grader(lab, "interview", "start", "--exercise", "online_softmax/normalizer")
    assert start.returncode == 0, start.stdout + start.stderr
    mine = lab / "practice" / "online_softmax" / "online_softmax.py"
    mine.write_text(SYNTAX_ERROR)

    check = grader(lab, "interview", "check")
    out = flat(check.stdout)
    assert check.returncode == 1, f"`make interview-check` on a file that does not compile exits 1: {out}"
    assert "0/0" not in out, f"a round whose tests never ran is 'not run', not 0/0: {out}"
    assert "online_softmax/normalizer: not run" in out, out
    assert ("expected practice/online_softmax/online_softmax.py to compile and import, found: online_softmax.py "
            "does not compile: SyntaxError at line 2") in out, out

    done = grader(lab, "interview", "done")
    out = flat(done.stdout)
    assert done.returncode == 1, f"`make interview-done` on a file that does not compile exits 1: {out}"
    assert "not recorded: the round keeps running" in out, out
    state = progress(lab)
    assert state.get("interview", {}).get("round") == "online_softmax/normalizer", f"the round keeps running: {state}"
    assert not state.get("interviews"), f"nothing may be recorded at 0/0: {state.get('interviews')}"

    mine.write_text((root / "solutions" / "online_softmax" / "online_softmax.py").read_text())
    done = grader(lab, "interview", "done")
    out = flat(done.stdout)
    assert done.returncode == 0, out + done.stderr
    record = progress(lab)["interviews"][-1]
    passed, total = record["public_tests_passed"].split("/")
    assert record["exercise"] == "online_softmax/normalizer" and passed == total != "0", record
    assert f"recorded in .progress.json: {selfstudy.describe_round(record)}" in out, out
    assert "{" not in out, f"`make interview-done` prints a line for people, not a dict: {out}"


def test_interview_check_groups_the_functions_not_written_yet(lab):
    """A fresh round's stub: `make interview-check` says which functions are not written yet, once, as `make check`
    does, not a FAILED line per test repeating the stub's NotImplementedError."""
    start = grader(lab, "interview", "start", "--exercise", "online_softmax/normalizer")
    assert start.returncode == 0, start.stdout + start.stderr
    check = grader(lab, "interview", "check")
    out = flat(check.stdout)
    assert check.returncode == 1, out
    assert "NotImplementedError" not in out and "FAILED" not in out, f"no FAILED line per unwritten test: {out}"
    assert re.search(r"NOT WRITTEN YET online_softmax: online_normalizer, merge_states \(6 tests wait on them\)",
                     out), out


def test_starting_a_round_again_keeps_the_earlier_practice_file(lab):
    start = grader(lab, "interview", "start", "--exercise", "online_softmax")
    assert start.returncode == 0, start.stdout + start.stderr
    folder = lab / "practice" / "online_softmax"
    mine = folder / "online_softmax.py"
    stub = (lab / ".pristine" / "online_softmax" / "online_softmax.py").read_text()
    assert mine.read_text() == stub
    mine.write_text(stub + "\n# my earlier attempt\n")

    again = grader(lab, "interview", "start", "--exercise", "online_softmax/triton")
    out = flat(again.stdout)
    assert again.returncode == 0, out + again.stderr
    kept = sorted(folder.glob("online_softmax.py.*.bak"))
    assert [p.read_text() for p in kept].count(stub + "\n# my earlier attempt\n") == 1, (
        f"the earlier attempt must be kept beside the fresh stub, found {[p.name for p in kept]}")
    mine_kept = next(p for p in kept if p.read_text().endswith("# my earlier attempt\n"))
    assert f"your earlier practice/online_softmax/online_softmax.py is kept as " \
           f"practice/online_softmax/{mine_kept.name}" in out, out
    assert "the round online_softmax was still running: it is dropped, not recorded" in out, out
    assert mine.read_text() == stub, "the new round starts from the stub as handed out"

    untouched = grader(lab, "interview", "start", "--exercise", "online_softmax")
    assert untouched.returncode == 0, untouched.stdout + untouched.stderr
    assert sorted(folder.glob("online_softmax.py.*.bak")) == kept, "an untouched stub has nothing to keep"
    assert "is kept as" not in untouched.stdout


def test_a_kept_file_never_replaces_another(tmp_path):
    mine = tmp_path / "online_softmax.py"
    names = []
    for attempt in range(3):
        mine.write_text(f"attempt {attempt}\n")
        names.append(selfstudy.keep_aside(mine))
    assert not mine.exists()
    assert len(set(names)) == 3, f"three moves in a second need three names, found {[p.name for p in names]}"
    assert [p.read_text() for p in names] == ["attempt 0\n", "attempt 1\n", "attempt 2\n"]
    for path in names:
        assert re.fullmatch(r"online_softmax\.py\.\d{8}-\d{6}(-\d+)?\.bak", path.name), (
            f"expected <file>.<date>-<time>.bak, found {path.name}")


def test_a_round_whose_tests_never_ran_is_not_recorded(tmp_path):
    selfstudy.save(tmp_path, {"interview": {"round": "gptq/quantizer", "minutes": 30, "started": time.time(),
                                            "folder": "practice/gptq"}})
    with pytest.raises(ValueError, match=r"expected the round's public tests to run, found 0/0: the round is not "
                                         r"recorded and keeps running"):
        selfstudy.finish_interview(tmp_path, 0, 0)
    data = selfstudy.load(tmp_path)
    assert data["interview"]["round"] == "gptq/quantizer" and not data.get("interviews"), data
    record = selfstudy.finish_interview(tmp_path, 2, 3)
    assert record["public_tests_passed"] == "2/3" and "interview" not in selfstudy.load(tmp_path)
    assert selfstudy.describe_round(record).startswith(f"gptq/quantizer on {selfstudy.today()}: 2/3 public tests "
                                                       "passed in ")


# online_normalizer waits for a value that never comes, and swallows Exception while it waits (students do both)
ENDLESS_LOOP = "    m = l = None\n    while m is None:\n        try:\n            pass\n        except Exception:\n            pass\n"


@pytest.fixture
def looping(root, tmp_path):
    """The reference online_softmax with an endless loop in online_normalizer, as `grader check --from` reads it."""
    (tmp_path / "online_softmax").mkdir()
    source = (root / "solutions" / "online_softmax" / "online_softmax.py").read_text()
    assert source.count("    m = l = None\n") == 1, "the loop goes where online_normalizer sets its state"
    looping = source.replace("    m = l = None\n", ENDLESS_LOOP)
    (tmp_path / "online_softmax" / "online_softmax.py").write_text(looping)
    line = looping.splitlines().index("    while m is None:") + 1
    return tmp_path, line


def test_check_stops_an_endless_loop_per_test_names_it_and_goes_on(root, looping):
    source, line = looping
    run = grader(root, "check", "online_softmax", "--from", str(source), "--call-timeout", "1")
    out = flat(run.stdout)
    assert run.returncode == 1, f"a looping file fails `make check` (exit 1), found {run.returncode}: {out}"
    assert (f"stopped after 1 s, the exercise's time limit for one call into your code, in online_normalizer "
            f"(line {line} of online_softmax.py): an endless loop") in out, (
        f"the test that looped must name the function and the line it was stopped at: {out}")
    assert "time limit of" not in out and "not run" not in out, (
        f"each looping test is stopped alone and the run goes on: no test may be left 'not run': {out}")
    tests = re.search(r"online_softmax (\d+)/(\d+)", out)
    assert tests and 0 < int(tests.group(1)) < int(tests.group(2)), (
        f"the tests that never call online_normalizer still pass, the looping ones fail: {out}")


def test_a_long_test_is_named_while_it_runs_and_ctrl_c_ends_check_with_one_line(root, looping, tmp_path):
    """`make check` is never silent for long: every QUIET_S seconds without a result it says which test still runs;
    Ctrl-C then ends it with one line (no traceback) and exit status 130."""
    source, _ = looping
    out_file, err_file = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out_file, "w") as out, open(err_file, "w") as err:  # files, not pipes: no wait on another's EOF
        proc = subprocess.Popen([sys.executable, "-m", "grader", "check", "online_softmax", "--from", str(source),
                                 "--call-timeout", "300"], cwd=root, stdout=out, stderr=err, text=True,
                                env={**os.environ, "COLUMNS": "160"})
    try:
        deadline = time.monotonic() + 240
        while "still running" not in out_file.read_text() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
        said = flat(out_file.read_text())
        assert re.search(r"still running test_\w+ after \d+ s: it is stopped at 300 s \(the exercise's "
                         r"limit for one call\); Ctrl-C stops the run here", said), said
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        proc.kill()
    out, errors = out_file.read_text(), err_file.read_text()
    assert proc.returncode == 130, f"Ctrl-C exits 130, found {proc.returncode}: {out} {errors}"
    assert "Traceback" not in out + errors, f"Ctrl-C prints one line, not a traceback: {out} {errors}"
    assert re.search(r"interrupted \(Ctrl-C\) while checking online_softmax in test_\w+; nothing was recorded for "
                     r"it$", flat(out)), flat(out)


def splice(solution: str, stub: str, unwritten: set[str]) -> str:
    """The solution with the functions named in `unwritten` as the stub has them (raising NotImplementedError)."""
    import ast

    def spans(source: str) -> dict[str, tuple[int, int]]:
        return {n.name: (n.lineno - 1, n.end_lineno) for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}

    lines, stub_lines = solution.splitlines(keepends=True), stub.splitlines(keepends=True)
    for name, (start, end) in sorted(spans(solution).items(), key=lambda kv: -kv[1][0]):  # bottom up: spans hold
        if name in unwritten:
            s_start, s_end = spans(stub)[name]
            lines[start:end] = stub_lines[s_start:s_end]
    return "".join(lines)


def test_check_lists_the_functions_not_written_yet(root, tmp_path):
    """A half-done file: every failing test is accounted for, the unwritten functions' by name, not dropped."""
    folder = tmp_path / "online_softmax"
    folder.mkdir()
    solution = (root / "solutions" / "online_softmax" / "online_softmax.py").read_text()
    stub = (root / "exercises" / "online_softmax" / "online_softmax.py").read_text()
    (folder / "online_softmax.py").write_text(splice(solution, stub, {"online_softmax", "softmax_triton"}))
    run = grader(root, "check", "online_softmax", "--from", str(tmp_path))
    out = flat(run.stdout)
    assert run.returncode == 1, out
    passed, total = map(int, re.search(r"online_softmax (\d+)/(\d+) [\d.]+/[\d.]+", out).groups())  # the table
    said = re.search(r"NOT WRITTEN YET online_softmax: online_softmax, softmax_triton \((\d+) tests wait on them\)", out)
    assert said, f"`make check` must name the functions still raising NotImplementedError: {out}"
    failed = out.count("FAILED online_softmax")
    assert failed + int(said.group(1)) == total - passed, (
        f"every test that did not pass is listed, as FAILED or as waiting on an unwritten function: {out}")


def test_a_name_the_file_lacks_is_named_with_what_the_file_defines(tmp_path):
    """An empty file, or a misnamed function: the student reads what the contract expected, not Python's
    "module has no attribute" (both modes look names up through grader.harness.lookup)."""
    from grader.harness.lookup import student_attribute
    from grader.harness.worker import import_file

    empty = tmp_path / "online_softmax.py"
    empty.write_text("")
    with pytest.raises(AttributeError, match=r"^expected online_softmax.py to define 'merge_states', which the "
                                             r"contract names; found no such name: it defines no function or class "
                                             r"\(is the file empty\?\)$"):
        student_attribute(import_file(empty), "merge_states")
    misnamed = tmp_path / "gptq.py"
    misnamed.write_text("import math\n\ndef gptq(W, H):\n    return W\n\nclass Quant:\n    pass\n")
    with pytest.raises(AttributeError, match=r"found no such name: it defines Quant, gptq$"):
        student_attribute(import_file(misnamed), "gptq_quantize")


def test_a_bare_not_implemented_error_is_named_by_the_function_that_raised_it():
    """A stub whose `raise NotImplementedError` carries no message (tensor_parallel's, zero_sharding's): `make
    check` names the function from the traceback's last frame, not "a function of the stub"."""
    from grader import report

    traceback = ("grader/support/tensor_parallel.py:64: in _step\n    out = fn(*args, **kwargs)\n"
                 "exercises/tensor_parallel/tensor_parallel.py:31: in copy_to_tp\n    raise NotImplementedError\n"
                 "E   NotImplementedError\nE   (raised on rank 0 of 2, simulated ring)\n")
    failures = [report.Failure("tensor_parallel", f"tensor_parallel, check c: test_{i}", "NotImplementedError: ",
                               "NotImplementedError: ", traceback.replace("copy_to_tp", name), True)
                for i, name in enumerate(["copy_to_tp", "copy_to_tp", "reduce_from_tp"])]
    assert report.not_written(failures) == {"tensor_parallel": (["copy_to_tp", "reduce_from_tp"], 3)}, (
        "each unwritten function is named once, from the frame that raised, with every test that waits on it")


def test_check_names_each_cuda_check_once_on_a_cpu_host(root, tmp_path):
    """On a host without CUDA, `make check` says once which checks wait for a GPU (it said it twice: "skipped here"
    and "no CUDA device here", the same list)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CPU host's output")
    run = grader(root, "check", "speculative", "--from", str(root / "exercises"))
    out = flat(run.stdout)
    assert out.count("speculative/accept_speed") == 1, f"each CUDA-only check is named once: {out}"
    assert "no CUDA device here: these checks run only when graded on a GPU: speculative/accept_speed" in out, out


def test_one_endless_loop_costs_one_call_limit_not_one_per_test(root, looping):
    """A loop hangs every test that reaches it. The first is stopped at the call limit; a later test found at the
    same line is stopped after a few seconds, saying so (at 120 s each, eight hung tests spent online_softmax's
    600 s and left the rest "not run", ten minutes of `make check` for one `while True`)."""
    source, line = looping
    start = time.monotonic()
    run = grader(root, "check", "online_softmax", "--from", str(source), "--call-timeout", "20")
    took, out = time.monotonic() - start, flat(run.stdout)
    assert run.returncode == 1, out
    assert len(re.findall(r"FAILED online_softmax, check \w+: test_\S+ stopped after 20 s", out)) == 1, (
        f"one test, the first to loop, is given the whole limit: {out}")
    same = re.findall(rf"stopped after \d+ s in online_normalizer \(line {line} of online_softmax.py\), the line where "
                      r"test_\w+ ran out of the 20 s limit for one call into your code: the same endless loop", out)
    assert same, f"later tests at the same line name the test that ran out there: {out}"
    assert "not run" not in out, f"no test is left 'not run': {out}"
    assert took < 20 + 10 * (len(same) + 1) + 60, f"{took:.0f} s for {len(same) + 1} looping tests: {out}"
