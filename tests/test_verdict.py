"""Verdicts that rest on the trusted side's own copies (issue "Trust II"): a call may change its
arguments only where the contract says so, in the sandbox and in-process alike."""

from __future__ import annotations

import pytest

from grader.runner import warm_server_pids
import torch

from grader.harness.client import CallOptions, InputModified, Sandbox, allowed_mutations
from grader.harness.session import StudentSession
from tests.conftest import checks_of
from tests.test_hostile import EXERCISE, grade_hostile, hand_in


def test_a_submission_that_zeroes_its_inputs_earns_nothing(tmp_path):
    result = grade_hostile(hand_in(tmp_path, "mutates_input"))
    checks = checks_of(result, EXERCISE)
    tensor_checks = ["normalizer_public", "merge_public", "softmax_public"]
    for cid in tensor_checks:
        assert checks[cid]["points"] < checks[cid]["max_points"] / 2, (cid, checks[cid]["tests"])
    text = "\n".join(t["message"] for c in checks.values() for t in c["tests"])
    assert "changed its argument x in place" in text, text[:600]
    assert "merge_states changed its argument m_a in place" in text, text[:600]


MODULE = '''
import torch

def scale(x, factor):
    x.mul_(factor)
    return x

def accumulate(H, x):
    H.add_(x)
    return H

def reads(x):
    return x * 2
'''


@pytest.mark.parametrize("mode", ["sandbox", "local"])
def test_the_contract_on_arguments_holds_in_both_modes(tmp_path, mode):
    path = tmp_path / "contract.py"
    path.write_text(MODULE)
    contract = {"mutates": {"accumulate": ("H",)}, "parameters": {"scale": ("x", "factor"), "accumulate": ("H", "x")}}
    student = StudentSession(mode, lambda _id: path, Sandbox(), lambda _id: 30.0, lambda _id: contract)
    try:
        mod = student.load("contract")
        x = torch.ones(3)
        with pytest.raises(InputModified, match=r"scale changed its argument x in place; the contract says it only reads it"):
            mod.scale(x, 2.0)
        if mode == "sandbox":
            assert torch.equal(x, torch.ones(3)), "the grader's own tensor must stay as it was before the call"
        H = torch.zeros(3)
        mod.accumulate(H, torch.ones(3))
        assert torch.equal(H, torch.ones(3)), "an argument the contract lets the call update is updated"
        nan = torch.tensor([float("nan"), 1.0])
        assert torch.equal(mod.reads(nan)[1:], torch.tensor([2.0])), "an input holding NaN is not 'changed'"
    finally:
        student.close()


def test_the_message_names_the_argument_by_keyword_and_by_position():
    options = CallOptions(mutates={"f": ("out",)}, parameters={"f": ("x", "out")})
    with pytest.raises(InputModified, match="f changed its argument x in place"):
        allowed_mutations("f", [([0, 0], None)], options)
    with pytest.raises(InputModified, match=r"f changed its argument blocks\[2\] in place \(it may change only out\)"):
        allowed_mutations("f", [([1, "blocks", 2], None)], options)
    assert allowed_mutations("f", [([0, 1], None), ([1, "out"], None)], options) == [([0, 1], None), ([1, "out"], None)]


# --------------------------------------------------------------------------------------------------
# A failure of the grading machine is an error of the grade, never a low score


def test_a_sandbox_that_cannot_start_is_an_error_of_the_grade(tmp_path, monkeypatch, root):
    import os

    if os.geteuid() != 0:
        pytest.skip("the uid lease (what this test breaks) is taken only as root")
    planted = tmp_path / "locks"
    planted.mkdir(mode=0o777)
    planted.chmod(0o777)  # a lock folder anyone may write: refused, so no worker can get an identity
    monkeypatch.setenv("GRADER_LOCK_DIR", str(planted))
    folder = tmp_path / "sub"
    folder.mkdir()
    (folder / f"{EXERCISE}.py").write_text((root / "solutions" / EXERCISE / f"{EXERCISE}.py").read_text())
    result = _grade(folder)
    assert result["state"] == "error" and result["gradable"] is False, result["state"]
    assert result["format_errors"][0].startswith("internal error of the grader, not a fault of the submission"), result
    assert "no identity for the worker" in result["format_errors"][0]
    assert result["exercises"][0]["status"] == "ungradable"


def test_a_test_process_killed_mid_grade_is_an_error_of_the_grade(tmp_path, root):
    import os
    import signal
    import threading
    import time as clock

    folder = tmp_path / "sub"
    folder.mkdir()
    (folder / f"{EXERCISE}.py").write_text(
        (root / "solutions" / EXERCISE / f"{EXERCISE}.py").read_text()
        + "\n\nimport time\n\ndef softmax_triton(x):\n    time.sleep(600)\n")
    killed = []
    out = tmp_path / "result.json"

    def started() -> bool:  # the run is under way: a test has reported
        import json

        try:
            return any(c["tests"] for e in json.loads(out.read_text())["exercises"] for c in e["checks"])
        except (OSError, ValueError, KeyError):
            return False

    def kill_pytest():  # the OOM killer, say: SIGKILL to the grader's own pytest while a test runs
        deadline = clock.monotonic() + 240
        while clock.monotonic() < deadline and not started():
            clock.sleep(0.2)
        while clock.monotonic() < deadline and not killed:
            for pid in (p for p in os.listdir("/proc") if p.isdigit()):
                try:  # the grade's pytest is a child of this process
                    ppid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
                    cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
                except (OSError, ValueError, IndexError):
                    continue
                # a cold start is this process's child; a warm one the fork server's (grader/forkserver.py)
                cold = ppid == os.getpid() and b"pytest" in cmdline and b"--grader-events" in cmdline
                if cold or ppid in warm_server_pids():
                    os.kill(int(pid), signal.SIGKILL)
                    killed.append(pid)
                    break
            clock.sleep(0.2)

    killer = threading.Thread(target=kill_pytest)
    killer.start()
    result = _grade(folder, call_timeout_s=300, time_limit_s=300, out=out)
    killer.join()
    assert killed, "the test could not find the grade's pytest process"
    assert result["state"] == "error" and result["gradable"] is False, (result["state"], result.get("format_errors"))
    assert "the grader's test process for online_softmax stopped before it finished: killed by SIGKILL" in (
        result["format_errors"][0]), result["format_errors"]
    unrun = [t for c in checks_of(result, EXERCISE).values() for t in c["tests"] if t["message"].startswith("not run:")]
    assert unrun, "the tests that never ran are listed, with the reason"


def _grade(folder, **options):
    from tests.conftest import grade_folder

    options.setdefault("call_timeout_s", 20)
    return grade_folder(folder, [EXERCISE], tests="public", **options)


def test_a_failed_public_test_shows_its_teaching_message_without_pytests_dump():
    from grader.plugin import classify

    rewritten = AssertionError("row 1: max error 0.0499; check the mask of the last block\nassert False\n"
                               " +  where False = <built-in method allclose of type object at 0x7f00>(tensor([...]))")
    for visibility in ("public", "hidden"):
        verdict = classify(rewritten, visibility, "test_triton_small_rows")
        assert verdict == {"status": "failed", "message": "row 1: max error 0.0499; check the mask of the last block"}
    bare = AssertionError("assert 3 == 4\n +  where 3 = len([1, 2, 3])")
    assert classify(bare, "public", "t")["message"].startswith("assert 3 == 4"), "a bare public assert keeps its detail"
    assert classify(bare, "hidden", "t")["message"] == "a check in t failed", "a hidden test's source never shows"


def test_first_failure_mode_stops_a_check_at_its_first_loss_and_scores_the_rest_zero(tmp_path):
    """GradeOptions(first_failure=True), for the project's tests of known-wrong submissions: a check that lost
    points runs no further test (each scores zero, "not run"), and a check without a loss runs them all."""
    from tests.conftest import COURSE, ROOT, grade_folder
    from tests.known_wrong import load_mutants, write_mutant

    exercise = next(e for e in COURSE.exercises if e.id == "online_softmax")
    mutant = next(m for m in load_mutants("online_softmax") if m.name == "no_rescale")
    folder = write_mutant(ROOT, exercise, mutant, tmp_path / mutant.name)
    checks = checks_of(grade_folder(folder, ["online_softmax"], tests="public", first_failure=True), "online_softmax")
    lost = [c for c in checks.values() if c["tests"] and c["points"] < c["max_points"]]  # public checks only ran
    assert lost, "the mutant must lose a public check"
    for check in lost:
        outcomes = [t["status"] for t in check["tests"]]
        first = next(i for i, t in enumerate(check["tests"]) if t["status"] != "passed")
        rest = check["tests"][first + 1:]
        assert all(t["status"] == "failed" and "not run: an earlier test" in t["message"] for t in rest), outcomes
    triton = checks["triton_public"]
    assert triton["points"] == triton["max_points"], "a check without a loss keeps every test and its points"
