"""The warm start of the grader's own pytest processes (grader/forkserver.py): a forked child must be what a
cold `python -m pytest` would have been: its arguments, environment, working folder, descriptors and exit
status, killed by its process group, sharing nothing with the next one."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from grader import forkserver

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the fork server is for Linux")

PROBE = '''
import os

def test_what_the_child_sees():
    fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
    with open(os.environ["PROBE_OUT"], "w") as f:
        f.write(repr({"cwd": os.getcwd(), "seed": os.environ.get("GRADER_SEED"), "fds": fds,
                      "pgid": os.getpgid(0) == os.getpid(), "marker": os.environ.get("MARKER")}))
    os.write(int(os.environ["KEEP_FD"]), b"event\\n")

def test_fails():
    assert os.environ.get("FAIL") != "1"
'''


@pytest.fixture
def server():
    env = {k: v for k, v in os.environ.items() if k not in forkserver.PER_GRADE_ENV}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    s = forkserver.ForkServer(env)
    yield s
    s.close()


def spawn(server, tmp_path, **extra):
    (tmp_path / "test_probe.py").write_text(PROBE)
    read_fd, write_fd = os.pipe()
    env = dict(server.env, GRADER_SEED="1234", PROBE_OUT=str(tmp_path / "seen"), KEEP_FD=str(write_fd), **extra)
    log = open(tmp_path / "log", "wb")
    try:
        proc = server.spawn([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                            env, str(tmp_path), log.fileno(), [write_fd])
    finally:
        log.close()
        os.close(write_fd)
    return proc, read_fd


def test_a_forked_pytest_gets_its_own_arguments_environment_folder_and_descriptors(server, tmp_path):
    proc, read_fd = spawn(server, tmp_path)
    assert proc.wait(timeout=120) == 0, (tmp_path / "log").read_text()[-2000:]
    seen = eval((tmp_path / "seen").read_text())  # noqa: S307 - written by the test's own probe
    assert seen["cwd"] == str(tmp_path) and seen["seed"] == "1234" and seen["pgid"], seen
    cold = cold_fds(server, tmp_path)
    assert len(seen["fds"]) <= len(cold), f"descriptors leaked into the child: {seen['fds']}, cold {cold}"
    assert os.read(read_fd, 100) == b"event\n", "the kept descriptor did not reach the child under its number"
    os.close(read_fd)
    assert "2 passed" in (tmp_path / "log").read_text()


def cold_fds(server, tmp_path) -> list[int]:
    """The descriptors the same probe sees in a cold `python -m pytest` (pytest's capture opens some of its own)."""
    import subprocess

    read_fd, write_fd = os.pipe()
    env = dict(server.env, PROBE_OUT=str(tmp_path / "seen-cold"), KEEP_FD=str(write_fd))
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_probe.py")],
                   env=env, cwd=tmp_path, pass_fds=[write_fd], stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
    os.close(write_fd)
    os.close(read_fd)
    return eval((tmp_path / "seen-cold").read_text())["fds"]  # noqa: S307 - written by the test's own probe


def test_the_exit_status_is_pytests(server, tmp_path):
    proc, read_fd = spawn(server, tmp_path, FAIL="1")
    assert proc.wait(timeout=120) == 1 and "1 failed, 1 passed" in (tmp_path / "log").read_text()
    os.close(read_fd)


def test_a_child_is_killed_through_its_process_group(server, tmp_path):
    (tmp_path / "test_sleeps.py").write_text("import time\n\ndef test_sleeps():\n    time.sleep(3600)\n")
    read_fd, write_fd = os.pipe()
    proc = server.spawn([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_sleeps.py")],
                        dict(server.env), str(tmp_path), write_fd, [])
    os.close(write_fd)
    time.sleep(1)
    assert proc.poll() is None
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    os.close(read_fd)


def test_an_environment_that_differs_in_more_than_the_seed_starts_cold(server):
    assert server.usable_for(dict(server.env, GRADER_SEED="7", TMPDIR="/tmp/x"))
    assert not server.usable_for(dict(server.env, OMP_NUM_THREADS="64")), "import-time settings must match"


def test_a_grade_is_the_same_warm_and_cold(tmp_path, monkeypatch):
    from tests.conftest import ROOT, grade_folder

    warm = grade_folder(ROOT / "solutions", ["online_softmax"], tests="public", seed=5)
    monkeypatch.setenv("GRADER_COLD_START", "1")
    cold = grade_folder(ROOT / "solutions", ["online_softmax"], tests="public", seed=5)

    def verdicts(result):
        return [(c["id"], c["points"], [t["status"] for t in c["tests"]]) for e in result["exercises"] for c in e["checks"]]

    assert verdicts(warm) == verdicts(cold) and warm["score"] == cold["score"] > 0
