"""The warm start of the sandboxed worker (grader/harness/zygote.py): a worker forked from the zygote must be
what a cold one is. It holds the same descriptors and the same environment. It holds nothing of the zygote's
or of another grade's: no socket to the zygote, no configuration of an earlier worker, no shared random
stream. It dies with its grader. And a grade that starts warm scores as one that starts cold."""

from __future__ import annotations

import os
import re
import signal
import sys
import time

import pytest

from grader.harness import zygote
from grader.harness.client import Sandbox
from grader.harness.session import StudentSession
from grader.runner import worker_zygote
from tests.conftest import checks_of, grade_folder

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the zygote is for Linux")

PROBE = '''
import os
import socket
import stat


def descriptors():
    """Each open descriptor: its number, its kind, and for a socket its family and type."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            continue  # the listing's own descriptor
        kind = "socket" if stat.S_ISSOCK(mode) else "pipe" if stat.S_ISFIFO(mode) else "file"
        if kind == "socket":
            s = socket.socket(fileno=os.dup(fd))
            kind = f"socket {int(s.family)} {int(s.type)}"
            s.close()
        found[fd] = kind
    return found


def environment():
    return dict(os.environ)


def draws():
    import random

    import numpy
    import torch

    return [numpy.random.rand(), random.random(), float(torch.rand(1))]


def spin():
    while True:
        pass
'''


def session_for(tmp_path, name: str = "probe") -> StudentSession:
    (tmp_path / f"{name}.py").write_text(PROBE)
    return StudentSession("sandbox", lambda _id: tmp_path / f"{name}.py", Sandbox(), lambda _id: 60.0)


def in_worker(tmp_path, start: str, *functions: str) -> tuple[list, int]:
    """The values of `functions` called in one worker started `start` ("warm" or "cold"), and its warm starts."""
    values, starts, _ = in_worker_with_environ(tmp_path, *functions)
    return values, starts


def in_worker_with_environ(tmp_path, *functions: str) -> tuple[list, int, list[str]]:
    """As `in_worker`, and the names in the launcher's initial environment (/proc/PID/environ, which a
    worker's memory holds too: a fork keeps its parent's)."""
    session = session_for(tmp_path)
    try:
        module = session.load("probe")
        values = [getattr(module, f)() for f in functions]
        launcher = next(iter(session._workers.values())).proc.pid
        with open(f"/proc/{launcher}/environ", "rb") as f:
            initial = sorted(e.split(b"=", 1)[0].decode() for e in f.read().split(b"\0") if e)
        return values, session.warm_worker_starts(), initial
    finally:
        session.close()


@pytest.fixture
def warm(monkeypatch):
    server = worker_zygote()
    if server is None:
        pytest.skip("no zygote on this machine (GRADER_COLD_START=1 or a GPU): workers start cold")
    monkeypatch.setenv(zygote.ENV_VAR, server.handle())
    return server


def test_a_warm_worker_is_forked_from_the_zygote(tmp_path, warm):
    _, starts = in_worker(tmp_path, "warm", "environment")
    assert starts == 1, "the worker started cold although this process has a zygote for its environment"


def test_a_warm_worker_holds_the_descriptors_and_environment_of_a_cold_one(tmp_path, warm, monkeypatch):
    (warm_fds, warm_env), _, warm_initial = in_worker_with_environ(tmp_path, "descriptors", "environment")
    monkeypatch.delenv(zygote.ENV_VAR)
    (cold_fds, cold_env), starts, cold_initial = in_worker_with_environ(tmp_path, "descriptors", "environment")
    assert starts == 0
    assert sorted(warm_fds.values()) == sorted(cold_fds.values()), (
        f"a warm worker holds other descriptors than a cold one: warm {warm_fds}, cold {cold_fds}")
    seqpacket = [fd for fd, kind in warm_fds.items() if kind.endswith(f" {int(__import__('socket').SOCK_SEQPACKET)}")]
    assert not seqpacket, f"the warm worker holds a SEQPACKET socket (the zygote's kind): {seqpacket}"
    assert warm_env == cold_env, "a warm worker's environment differs from a cold one's"
    assert warm_initial == cold_initial, (
        f"the initial environment of a warm worker names {warm_initial}, a cold one's {cold_initial}: the zygote "
        "must start with the worker's environment only")


def test_two_warm_workers_share_no_random_stream(tmp_path, warm):
    """numpy's global generator is seeded from the OS in each cold worker; a fork would copy one stream."""
    (first,), _ = in_worker(tmp_path, "warm", "draws")
    (second,), _ = in_worker(tmp_path, "warm", "draws")
    assert first[0] != second[0], "two warm workers drew the same numpy numbers"
    assert first[1] != second[1], "two warm workers drew the same random numbers"
    assert first[2] == second[2], "torch's default generator should start as a fresh process's does (unseeded, fixed)"


@pytest.mark.skipif(os.geteuid() != 0, reason="reading another process's memory needs root")
def test_the_zygote_never_holds_a_grade_s_configuration(tmp_path, warm):
    """The request the zygote reads is empty: the sandbox's description goes to the child only. A marker in
    the hidden paths of one worker's configuration must not be anywhere in the zygote's memory afterwards."""
    marker = f"zygote-marker-{os.getpid()}-{time.time_ns()}"
    hidden = tmp_path / marker
    hidden.mkdir()
    (tmp_path / "probe.py").write_text(PROBE)
    session = StudentSession("sandbox", lambda _id: tmp_path / "probe.py", Sandbox(hide=[str(hidden)]),
                             lambda _id: 60.0)
    try:
        session.load("probe").environment()
        assert session.warm_worker_starts() == 1
    finally:
        session.close()
    found = memory_holds(warm.proc.pid, marker.encode())
    assert not found, f"the zygote's memory holds a worker's configuration at {found}"


def memory_holds(pid: int, needle: bytes) -> list[str]:
    """The regions of process `pid`'s memory that contain `needle`."""
    hits = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            addresses, perms = line.split()[:2]
            if "r" not in perms:
                continue
            start, end = (int(a, 16) for a in addresses.split("-"))
            try:
                mem.seek(start)
                data = mem.read(end - start)
            except (OSError, ValueError, OverflowError):
                continue
            if data and needle in data:
                hits.append(line.strip())
    return hits


def test_a_warm_worker_dies_when_its_grader_gives_it_up(tmp_path, warm):
    """A cold launcher dies with its parent, the grader's pytest (PR_SET_PDEATHSIG); a warm one's parent is the
    zygote, which kills a child whose status socket the grader closed (its process died, or gave it up)."""
    session = session_for(tmp_path)
    module = session.load("probe")
    module.environment()
    worker = next(iter(session._workers.values()))
    pid = worker.proc.pid
    assert worker.warm_starts == 1
    worker.proc._status.close()  # what the kernel does when the grader's process dies
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.1)
    assert not alive(pid), "the warm worker's launcher outlived the grader that gave it up"
    del module
    worker.proc = None  # already gone: nothing to kill
    session.close()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_worker_that_loops_is_stopped_warm_as_cold(tmp_path, warm):
    """The call timeout kills the warm worker's process group, as it kills a cold one's."""
    (tmp_path / "probe.py").write_text(PROBE)
    session = StudentSession("sandbox", lambda _id: tmp_path / "probe.py", Sandbox(), lambda _id: 3.0)
    try:
        module = session.load("probe")
        module.environment()
        pid = next(iter(session._workers.values())).proc.pid
        started = time.monotonic()
        with pytest.raises(Exception, match=re.compile("time", re.IGNORECASE)):
            module.spin()
        assert time.monotonic() - started < 30
        assert not alive(pid), "the looping worker's launcher is still running after its timeout"
    finally:
        session.close()


def test_a_zygote_that_died_costs_the_warm_start_only(tmp_path, monkeypatch):
    """A handle to a zygote that is gone: the worker starts cold, and the grade goes on."""
    server = zygote.Zygote(dict(worker_environment_for_test()))
    monkeypatch.setenv(zygote.ENV_VAR, server.handle())
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=10)
    (env,), starts = in_worker(tmp_path, "warm", "environment")
    server.close()
    assert starts == 0 and env["TRITON_INTERPRET"] == "1"


def worker_environment_for_test() -> dict[str, str]:
    from grader.harness.client import worker_environment

    return worker_environment(Sandbox())


EXERCISE = "online_softmax"


def test_a_grade_started_warm_scores_as_one_started_cold(tmp_path, monkeypatch, root):
    """The reference's public checks of one exercise, graded with the zygote and with GRADER_COLD_START=1."""
    import shutil

    folder = tmp_path / "submission"
    folder.mkdir()
    shutil.copy(root / "solutions" / EXERCISE / f"{EXERCISE}.py", folder)
    warm_result = grade_folder(folder, [EXERCISE], tests="public")
    monkeypatch.setenv("GRADER_COLD_START", "1")
    cold_result = grade_folder(folder, [EXERCISE], tests="public")
    points = lambda r: {c: v["points"] for c, v in checks_of(r, EXERCISE).items()}  # noqa: E731
    assert points(warm_result) == points(cold_result), (points(warm_result), points(cold_result))
    assert any(points(warm_result).values()), "the reference earned nothing: the comparison proves nothing"


# --------------------------------------------------------------------------------------------------
# Red team: what a warm worker inherits on its own stack. The worker runs in the zygote's child, called from
# forkserver.serve and from launch.start: their frames stay live under the student's code, and a submission
# reads them (sys._getframe().f_back..., gc). A cold worker exec'd: nothing of its launcher is left.

LEAK_PROBE = '''
import gc
import sys


def _containers():
    """Every frame's locals above this call, and every container the collector tracks."""
    frame = sys._getframe(2)
    while frame is not None:
        yield dict(frame.f_locals)
        frame = frame.f_back
    yield from gc.get_objects()


def ints_held():
    """Every int held by a frame's locals above this call: as a value, a key, or in a container there."""
    found = set()
    frame = sys._getframe(1)
    while frame is not None:
        for value in frame.f_locals.values():
            items = value.items() if isinstance(value, dict) else value if isinstance(value, (list, tuple, set)) else [value]
            for item in items:
                for x in item if isinstance(item, tuple) else (item,):
                    if type(x) is int:
                        found.add(x)
        frame = frame.f_back
    return sorted(found)


def strings_holding(reversed_needle):
    """Where a string (or bytes) containing the needle is reachable: frames' locals and tracked containers."""
    needle = reversed_needle[::-1]
    hits = []
    for container in _containers():
        if isinstance(container, dict):
            values = [*container.keys(), *container.values()]
        elif isinstance(container, (list, tuple, set, frozenset)):
            values = list(container)
        else:
            continue
        for value in values:
            if value is needle:
                continue
            if isinstance(value, str) and needle in value:
                hits.append(value[:200])
            elif isinstance(value, (bytes, bytearray)) and needle.encode() in value:
                hits.append(repr(bytes(value[:200])))
    return hits
'''


def leak_session(tmp_path, name: str, hide: list[str] | None = None) -> StudentSession:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "leak.py").write_text(LEAK_PROBE)
    return StudentSession("sandbox", lambda _id: folder / "leak.py", Sandbox(hide=hide or []), lambda _id: 60.0)


def test_a_warm_worker_holds_no_other_worker_s_pid(tmp_path, warm):
    """The zygote's table of its children (forkserver.serve's `waiting`: pid -> status socket) is copied into each
    child, and serve's frame stays live under the worker: a submission read the host pid of another grade's
    worker, running at the same time, off its own stack."""
    other = leak_session(tmp_path, "other")
    try:
        other.load("leak").ints_held()
        other_pid = next(iter(other._workers.values())).proc.pid
        assert other.warm_worker_starts() == 1
        mine = leak_session(tmp_path, "mine")
        try:
            held = mine.load("leak").ints_held()
            assert mine.warm_worker_starts() == 1
        finally:
            mine.close()
    finally:
        other.close()
    assert other_pid not in held, (
        f"a warm worker finds the host pid {other_pid} of another grade's worker on its own stack (the zygote's "
        "table of its children, forkserver.serve's `waiting`)")


@pytest.mark.parametrize("start", ["warm", "cold"])
def test_a_worker_never_reads_its_sandbox_s_configuration(tmp_path, start, request, monkeypatch):
    """The launcher's configuration (the folders the grader hides, its own scratch folder on the host, the
    cgroups) is the trusted side's: a cold worker's exec left none of it. A warm one runs under launch.start
    and the zygote's child, whose `config` and the request's raw JSON stay reachable."""
    if start == "warm":
        request.getfixturevalue("warm")
    else:
        monkeypatch.delenv(zygote.ENV_VAR, raising=False)
    marker = f"hidden-by-the-grader-{os.getpid()}-{time.time_ns()}"
    session = leak_session(tmp_path, "probe", hide=[f"/nonexistent/{marker}"])
    try:
        hits = session.load("leak").strings_holding(marker[::-1])
        assert session.warm_worker_starts() == (1 if start == "warm" else 0)
    finally:
        session.close()
    assert not hits, f"a {start} worker reads its sandbox's configuration (a folder the grader hides): {hits[:3]}"
