"""The harness against hostile submissions (README.md, "Threat model: the sandbox"). Each file in tests/hostile is
handed in as online_softmax.py; each must end with an honest score, a clear message, and a grade
that finishes. Graded on the public tests with short time limits, to keep the suite fast."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from grader import runner
from grader.harness import cgroup
from tests.conftest import COURSE, checks_of, grade_folder

HOSTILE = Path(__file__).parent / "hostile"
EXERCISE = "online_softmax"


def hand_in(tmp_path: Path, name: str, replace: dict[str, str] | None = None) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    source = (HOSTILE / f"{name}.py").read_text()
    for old, new in (replace or {}).items():
        assert old in source
        source = source.replace(old, new)
    (folder / f"{EXERCISE}.py").write_text(source)
    return folder


def grade_hostile(folder: Path, **options) -> dict:
    options.setdefault("call_timeout_s", 20)
    result = grade_folder(folder, [EXERCISE], tests="public", **options)
    assert result["state"] == "complete", "the grade must finish"
    return result


def messages(result: dict) -> str:
    return "\n".join(t["message"] for c in checks_of(result, EXERCISE).values() for t in c["tests"])


def test_patched_assertions_do_not_reach_the_grader(tmp_path):
    result = grade_hostile(hand_in(tmp_path, "patch_asserts"))
    assert result["score"] == 0, "patching torch.allclose in the student's process must not change the verdict"


@pytest.mark.skipif(os.geteuid() != 0, reason="the worker drops to an unprivileged user only when run as root")
def test_the_grader_never_imports_student_code(tmp_path):
    marker_dir = tmp_path / "only-root"
    marker_dir.mkdir(mode=0o700)
    marker = marker_dir / "imported"
    result = grade_hostile(hand_in(tmp_path, "imports_in_grader", {"/nonexistent/marker": str(marker)}))
    assert not marker.exists(), "the student's module was imported by a process running as root (the grader)"
    assert result["score"] == 0


def test_sys_exit_at_import_scores_zero_with_a_message(tmp_path):
    result = grade_hostile(hand_in(tmp_path, "exit_at_import"))
    assert result["score"] == 0
    assert "sys.exit(0)" in messages(result)


def test_os_exit_in_a_call_fails_that_test_and_the_grade_goes_on(tmp_path):
    result = grade_hostile(hand_in(tmp_path, "os_exit_in_call"))
    tests = [t for c in checks_of(result, EXERCISE).values() for t in c["tests"]]
    assert result["score"] == 0 and len(tests) >= 10, "every test must still run after the worker dies"
    assert all(t["status"] == "error" for t in tests)
    assert "exited with code 0" in messages(result)


def worker_groups_of(tag: str) -> list[str]:
    """The worker cgroups left with this grade's tag (its private folder's suffix)."""
    return [str(g) for parent in cgroup._parents() for g in parent.iterdir() if g.name.startswith(f"{cgroup.PREFIX}{tag}-")]


def test_infinite_loop_times_out_per_call(tmp_path, monkeypatch):
    folders = []
    make_folder = runner.private_folder
    monkeypatch.setattr(runner, "private_folder", lambda: folders.append(make_folder()) or folders[-1])
    result = grade_hostile(hand_in(tmp_path, "infinite_loop"), call_timeout_s=1.5, time_limit_s=12)
    tags = [runner.grade_tag(f) for f in folders]
    assert tags and all(tags), f"the grade's private folders carry its tag: {folders}"
    assert [g for tag in tags for g in worker_groups_of(tag)] == [], (
        "the exercise's time limit killed the grade's pytest, which removes its workers' cgroups itself: the runner "
        "must remove what it left (red team round 15: three empty groups per stalled grade, for good)")
    statuses = {t["status"] for c in checks_of(result, EXERCISE).values() for t in c["tests"]}
    assert result["score"] == 0
    assert "timeout" in statuses, "a call that never returns must be reported as a timeout"
    here = bool(result["device"]["gpu"])  # a host without CUDA grades no CUDA check, timed out or not
    assert all(c["status"] == "timeout" for c in checks_of(result, EXERCISE).values() if here or not c["cuda"]), (
        "checks that never ran because the exercise's time limit ran out are timeouts too"
    )


def test_segfault_is_a_crash_not_a_grader_failure(tmp_path):
    result = grade_hostile(hand_in(tmp_path, "segfault"))
    assert result["score"] == 0
    assert "SIGSEGV" in messages(result)


def test_malicious_pickle_is_never_unpickled(tmp_path):
    marker_dir = tmp_path / "only-root"
    marker_dir.mkdir(mode=0o700)
    marker = marker_dir / "pwned"
    result = grade_hostile(hand_in(tmp_path, "malicious_pickle", {"/nonexistent/marker": str(marker)}))
    assert not marker.exists(), "the grader ran code from the worker's reply"
    assert result["score"] == 0
    # Refused before any unpickler runs: a plain pickle is not the archive torch.save writes (grader/harness/wire.py).
    assert "the worker's reply is not a torch.save archive" in messages(result)


def test_fake_pytest_and_json_output_is_ignored(tmp_path):
    result = grade_hostile(hand_in(tmp_path, "fake_output"))
    assert result["score"] == 0


def test_writing_result_files_changes_nothing(tmp_path):
    out = tmp_path / "out" / "result.json"
    result = grade_hostile(hand_in(tmp_path, "writes_results"), out=out)
    assert result["score"] == 0
    assert '"score": 0.0' in out.read_text(), "the result file must hold the honest score"


@pytest.mark.skipif(os.geteuid() != 0, reason="hiding files from the worker needs root (mount namespace)")
def test_hidden_tests_and_solutions_cannot_be_read(tmp_path, root):
    folder = hand_in(tmp_path, "reads_hidden", {'os.environ.get("COURSE_ROOT", "/work/main")': repr(str(root))})
    result = grade_hostile(folder)
    text = messages(result)
    assert "READ " not in text, f"the worker read grader files: {text[:300]}"
    assert "cannot read grader/hidden" in text


def test_syntax_error_is_reported(tmp_path):
    """A file that does not compile is parsed (never run) in the grader: one message with the line, no worker."""
    result = grade_hostile(hand_in(tmp_path, "syntax_error"))
    exercise = result["exercises"][0]
    assert result["score"] == 0 and exercise["status"] == "ungradable", exercise["status"]
    assert exercise["message"].startswith(f"{EXERCISE}.py does not compile: SyntaxError at line 1"), exercise["message"]
    cuda = {c.id for c in COURSE.exercise(EXERCISE).checks if c.cuda}
    assert all(c["message"] == exercise["message"] and c["points"] == 0
               for c in exercise["checks"] if c["id"] not in cuda), exercise["checks"]
    # on a host without CUDA the CUDA checks read "not graded", as a run would report them, not zero out of their points
    if not torch.cuda.is_available():
        assert all(c["status"] == "not_graded" for c in exercise["checks"] if c["id"] in cuda), exercise["checks"]


@pytest.mark.skipif(shutil.which("pgrep") is None, reason="needs pgrep")
def test_no_process_outlives_the_grade(tmp_path):
    """Where the worker may start processes at all (an exercise whose drivers spawn, like ring_allreduce's;
    elsewhere the lock refuses the Popen), none outlives the worker: it is PID 1 of its PID namespace."""
    from grader.harness.client import Sandbox
    from grader.harness.session import StudentSession

    folder = hand_in(tmp_path, "outlives_grade")
    session = StudentSession("sandbox", lambda _id: folder / f"{EXERCISE}.py", Sandbox(), lambda _id: 20.0,
                             spawns=lambda _id: True)
    try:
        with pytest.raises(NotImplementedError):
            session.load(EXERCISE).online_normalizer([])
        alive = subprocess.run(["pgrep", "-f", "sleep 4242"], capture_output=True, text=True).stdout.split()
        assert alive, "the submission's process never started: this test proves nothing"
    finally:
        session.close()
    left = subprocess.run(["pgrep", "-f", "sleep 4242"], capture_output=True, text=True).stdout.split()
    for pid in left:  # clean up before failing, so one failure does not leak into the next run
        subprocess.run(["kill", "-9", pid])
    assert not left, "a process started by the submission outlived the grade"


def test_no_network_from_the_worker(tmp_path):
    result = grade_hostile(hand_in(tmp_path, "network"))
    text = messages(result)
    assert "CONNECTED" not in text
    assert "blocked" in text


def test_memory_bomb_fails_the_call_not_the_grader(tmp_path):
    result = grade_hostile(hand_in(tmp_path, "memory_bomb"))
    assert result["score"] == 0
    tests = [t for c in checks_of(result, EXERCISE).values() for t in c["tests"]]
    assert all(t["status"] == "error" for t in tests)


def test_missing_file_scores_zero_as_not_submitted(tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    (folder / "notes.txt").write_text("nothing here")
    result = grade_hostile(folder)
    ex = result["exercises"][0]
    assert ex["status"] == "missing" and ex["score"] == 0
    assert "online_softmax.py" in ex["message"]


@pytest.mark.skipif(os.geteuid() != 0 or not cgroup.ROOT.is_dir(), reason="worker cgroups are made as root only")
def test_the_runner_reaps_a_grades_cgroups_and_what_is_left_in_them():
    try:
        group = cgroup.WorkerGroup.create(64, 16, tag="reaptest1")
    except cgroup.CgroupError as exc:
        pytest.skip(f"no cgroup can be made here: {exc}")
    sleeper = subprocess.Popen(["sleep", "4343"])
    try:
        for procs in group.procs_files:
            Path(procs).write_text(str(sleeper.pid))
        other = cgroup.WorkerGroup.create(64, 16, tag="reaptest2")
        removed = cgroup.reap("reaptest1")
        assert sorted(map(str, removed)) == sorted(map(str, group.folders)), "every hierarchy's group of the tag goes"
        assert sleeper.wait(timeout=10) == -9, "what was still in the group is killed first"
        assert all(f.is_dir() for f in other.folders), "another grade's groups stay"
        other.remove()
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        group.remove(timeout_s=1)


def test_a_stale_private_folder_takes_its_cgroups_with_it(tmp_path, monkeypatch):
    reaped = []
    monkeypatch.setattr(cgroup, "reap", lambda tag: reaped.append(tag) or [])
    stale = tmp_path / f"{runner.PRIVATE_PREFIX}abc123_x"
    stale.mkdir()
    (stale / ".lock").write_text("")
    assert runner.reap_private_folders(str(tmp_path)) == [str(stale)]
    assert reaped == ["abc123_x"]
