"""The sandbox against hostile submissions (README, threat model; issue "Trust I").

Each test hands in a submission that tries one class of attack on the worker's sandbox and proves it
ends honestly: its score, a clear message, nothing outside its own scratch changed, nothing left
behind. Graded as root where the property needs root (a uid of its own, the allow-list view).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import time
from pathlib import Path

import pytest

from grader.harness import identity
from grader.harness.client import Sandbox
from grader.harness.session import StudentSession
from tests.conftest import checks_of, grade_folder
from tests.test_hostile import EXERCISE, grade_hostile, hand_in, messages

# Every attack below on a worker forked warm from the zygote, as a grade starts it, and on a cold one.
pytestmark = pytest.mark.usefixtures("worker_start")

SPAWNS = lambda _id: True  # noqa: E731 - a session whose exercise's drivers start threads or processes (no lock)
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="uids of their own and the allow-list view need root here")


def digest(*paths: Path) -> str:
    """A hash of each file (name, bytes, mode, owner): proof that the attack changed none of them."""
    h = hashlib.sha256()
    for path in paths:
        info = path.lstat()
        h.update(f"{path}\0{info.st_mode}\0{info.st_uid}\0".encode() + path.read_bytes())
    return h.hexdigest()


def targets(root: Path) -> list[Path]:
    """The files the hostile submissions aim at."""
    paths = [root / "solutions" / EXERCISE / f"{EXERCISE}.py", root / "grader" / "hidden" / EXERCISE / "test_hidden.py",
             root / "grader" / "__init__.py", root / "grader" / "harness" / "worker.py"]
    return paths + [p for p in (Path("/etc/shadow"), Path("/etc/passwd")) if p.exists()]


@as_root
def test_the_worker_sees_nothing_of_the_course_but_its_allow_list(tmp_path, root):
    before = digest(*targets(root))
    result = grade_hostile(hand_in(tmp_path, "reads_course", {'os.environ.get("COURSE_ROOT", "/work/main")': repr(str(root))}))
    text = messages(result)
    assert "READ" not in text, f"the worker read something it must not: {text[:600]}"
    for rel in (".git/HEAD", "solutions/online_softmax/online_softmax.py", "grader/hidden/online_softmax/test_hidden.py",
                "tests/test_hostile.py"):
        assert f"cannot read {rel}" in text, f"expected {rel} to be out of the worker's view: {text[:600]}"
    assert "git show failed" in text
    uid = int(text.split("| uid ")[1].split()[0])
    assert uid != 0 and identity.DEFAULT_UID_FIRST <= uid < identity.DEFAULT_UID_FIRST + identity.DEFAULT_UID_COUNT, (
        f"the worker ran as uid {uid}, expected a leased uid of its own"
    )
    assert result["score"] == 0
    assert digest(*targets(root)) == before, "a file the submission aimed at changed during the grade"


@as_root
def test_a_log_swapped_for_a_symlink_leaks_nothing_when_the_worker_crashes(tmp_path, root):
    shadow = Path("/etc/shadow")
    secret = (root / "solutions" / EXERCISE / f"{EXERCISE}.py").read_text().splitlines()[0]
    before = digest(*targets(root))
    source = hand_in(tmp_path, "log_symlink_crash", {'os.environ.get("COURSE_ROOT", "/work/main")': repr(str(root))})
    result = grade_hostile(source)
    text = messages(result)
    assert "exited with code 3" in text, f"the crash must be reported as the worker's exit: {text[:400]}"
    assert "planted" in text, "the worker's own output belongs in the crash message"
    assert secret not in text, "the crash message holds the reference solution"
    if shadow.exists():
        assert "root:" not in text, "the crash message holds /etc/shadow"
    assert digest(*targets(root)) == before, "a file the submission aimed at changed during the grade"


def test_a_reply_that_stops_part_way_is_a_timeout_not_a_hang(tmp_path):
    started = time.monotonic()
    result = grade_hostile(hand_in(tmp_path, "half_frame"), call_timeout_s=3, time_limit_s=90)
    tests = [t for c in checks_of(result, EXERCISE).values() for t in c["tests"]]
    first = next(t for t in tests if t["name"].startswith("test_normalizer_one_chunk"))
    assert first["status"] == "timeout" and "part-way" in first["message"], first
    assert first["duration_s"] < 30, f"the half-sent reply held the call for {first['duration_s']:.1f} s"
    assert result["score"] == 0
    assert time.monotonic() - started < 90 + 60


def test_stalling_until_the_time_limit_keeps_no_points(tmp_path):
    """Checks are scored over every test collected: the ones the run never reached score zero."""
    result = grade_hostile(hand_in(tmp_path, "stalls"), call_timeout_s=25, time_limit_s=40)
    check = checks_of(result, EXERCISE)["normalizer_public"]
    passed = [t for t in check["tests"] if t["status"] == "passed"]
    unrun = [t for t in check["tests"] if t["message"].startswith("not run:")]
    assert len(passed) == 2, f"the stalling submission answers its first two calls correctly: {check['tests']}"
    assert unrun and all("time limit" in t["message"] for t in unrun), check["tests"]
    assert check["points"] == pytest.approx(check["max_points"] * len(passed) / len(check["tests"]))
    assert check["points"] < check["max_points"], "stalling kept full marks on a check whose tests did not all run"


def test_nothing_of_a_killed_grade_is_left_in_the_temporary_folder(tmp_path, monkeypatch):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    grade_hostile(hand_in(tmp_path, "infinite_loop"), call_timeout_s=30, time_limit_s=8)  # pytest is killed
    assert sorted(p.name for p in tmp.iterdir()) == [], "the grade left files behind"


# --------------------------------------------------------------------------------------------------
# One identity per grade: two workers at once, one hostile


HOG = '''
import os, signal, time

def hog(n):
    """Hold as many processes as the cap allows, write wherever it can, signal whatever it can see."""
    kids = []
    for _ in range(n):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(3600)
            os._exit(0)
        kids.append(pid)
    wrote = []
    for folder, dirs, files in os.walk("/"):
        if folder.startswith(("/proc", "/sys", "/dev")) or os.statvfs(folder).f_flag & os.ST_RDONLY:
            dirs.clear()  # a read-only mount, or devices: nothing of anyone else below
            continue
        for name in files:
            path = os.path.join(folder, name)
            try:
                with open(path, "a") as f:
                    f.write("pwned")
                wrote.append(path)
            except OSError:
                pass
    killed = 0
    for pid in range(2, 4 << 15):
        if pid not in kids and pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    return len(kids), wrote, killed
'''

THREADS = '''
import threading

def threads(n):
    done = []
    ts = [threading.Thread(target=done.append, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return len(done)
'''


@as_root
@pytest.mark.slow
def test_concurrent_workers_cannot_reach_each_other(tmp_path):
    (tmp_path / "hog.py").write_text(HOG)
    (tmp_path / "threads.py").write_text(THREADS)
    sandbox = Sandbox(processes=48)
    # Workers allowed to spawn (as ring_allreduce's are): the per-grade identity keeps them apart.
    hostile = StudentSession("sandbox", lambda _id: tmp_path / "hog.py", sandbox, lambda _id: 120.0, spawns=SPAWNS)
    honest = StudentSession("sandbox", lambda _id: tmp_path / "threads.py", sandbox, lambda _id: 60.0, spawns=SPAWNS)
    try:
        assert honest.load("threads").threads(4) == 4
        kids, wrote, killed = hostile.load("hog").hog(200)
        assert kids >= 40, f"the hostile worker should hold (almost) its whole process cap, held {kids}"
        assert all(p.startswith("/tmp/") for p in wrote), f"the worker wrote outside its scratch: {wrote[:5]}"
        assert killed == 0, f"the worker could signal {killed} processes outside its own"
        a, b = hostile._workers["hog"].lease, honest._workers["threads"].lease
        assert a.uid != b.uid, "two grades at once ran as the same uid"
        assert honest.load("threads").threads(24) == 24, (
            "the honest worker could not start threads while another grade held its own process cap"
        )
        # The race of the old design, repeated: the honest worker restarts (its sandbox is built
        # again by root) while the hostile one keeps trying to plant links wherever it can write.
        stop = threading.Event()
        planted = []

        def plant():
            while not stop.is_set():
                planted.append(hostile.load("hog").hog(0)[1])

        attacker = threading.Thread(target=plant)
        attacker.start()
        try:
            for _ in range(20):
                honest._workers["threads"].close()
                assert honest.load("threads").threads(2) == 2
        finally:
            stop.set()
            attacker.join()
        assert all(p.startswith("/tmp/") for paths in planted for p in paths)
    finally:
        hostile.close()
        honest.close()
    assert not identity.processes_of(a.uid), "processes of the hostile grade outlived it"


@as_root
def test_a_uid_lease_is_exclusive_and_sweeps_what_was_left():
    first = identity.lease()
    try:
        second = identity.lease()
        try:
            assert second.uid != first.uid
        finally:
            second.release()
    finally:
        first.release()
    assert not identity.processes_of(first.uid)


VIEW_PROBE = '''
import os

def probe(root):
    seen = {}
    for rel in (".git", "solutions", "tests", "grader/hidden", "grader/harness"):
        path = os.path.join(root, rel)
        seen[rel] = sorted(os.listdir(path)) if os.path.isdir(path) else None
    seen["pids"] = sorted(p for p in os.listdir("/proc") if p.isdigit())
    seen["uid"] = os.getuid()
    return seen
'''

AS_USER = '''
import json, sys
from pathlib import Path
from grader.harness.client import Sandbox
from grader.harness.session import StudentSession
path, root = Path(sys.argv[1]), sys.argv[2]
session = StudentSession("sandbox", lambda _id: path, Sandbox(course_root=root), lambda _id: 60.0)
try:
    print(json.dumps({"seen": session.load("probe").probe(root), "warnings": session.warnings()}))
finally:
    session.close()
'''


@as_root
def test_without_root_the_worker_gets_the_same_view_in_a_user_namespace(root):
    """An instructor's laptop or a Slurm node: the grader is not root, the user namespace walls it off."""
    import json
    import pwd
    import subprocess
    import sys

    nobody = pwd.getpwnam("nobody")
    blocked = [p for p in (sys.executable, str(root / "grader")) if not _reachable_by(p, nobody.pw_uid, nobody.pw_gid)]
    if blocked or not _user_namespaces_for(nobody.pw_uid, nobody.pw_gid):
        pytest.skip(f"nobody cannot run this checkout's Python here ({blocked}) or make a user namespace")
    folder = Path(tempfile.mkdtemp(prefix="sandbox-as-nobody-"))  # pytest's own tmp_path is root's only
    try:
        os.chown(folder, nobody.pw_uid, nobody.pw_gid)
        (folder / "probe.py").write_text(VIEW_PROBE)
        (folder / "probe.py").chmod(0o644)
        proc = subprocess.run([sys.executable, "-c", AS_USER, str(folder / "probe.py"), str(root)], cwd=root,
                              user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[], capture_output=True, text=True,
                              timeout=300, env={"PATH": "/usr/bin:/bin", "TMPDIR": str(folder)})
    finally:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    seen = report["seen"]
    assert report["warnings"] == [], report["warnings"]
    assert seen[".git"] is None and seen["solutions"] is None and seen["tests"] is None, seen
    assert seen["grader/hidden"] == [] and "worker.py" in seen["grader/harness"], seen
    assert seen["pids"] == ["1"], f"the worker sees processes other than its own: {seen['pids']}"


def _reachable_by(path: str, uid: int, gid: int) -> bool:
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-I", "-S", "-c", f"import os; os.listdir({path!r}) if os.path.isdir({path!r}) "
                           "else None"], user=uid, group=gid, extra_groups=[], capture_output=True).returncode == 0


def _user_namespaces_for(uid: int, gid: int) -> bool:
    import subprocess
    import sys

    probe = "from grader.harness.identity import user_namespaces_available as a; raise SystemExit(0 if a() else 1)"
    return subprocess.run([sys.executable, "-c", probe], user=uid, group=gid, extra_groups=[],
                          capture_output=True).returncode == 0


FORKED_MEMORY = '''
import os, time

def bomb(n, gib):
    """n children, each touching `gib` GiB: under the per-process limit one by one, over it together."""
    kids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            block = bytearray(gib << 30)
            for i in range(0, len(block), 4096):
                block[i] = 1
            time.sleep(60)
            os._exit(0)
        kids.append(pid)
    time.sleep(8)
    return [os.waitpid(pid, os.WNOHANG)[1] for pid in kids]
'''


@as_root
def test_a_worker_that_forks_shares_one_memory_budget(tmp_path, monkeypatch):
    from grader.harness import cgroup

    made = []  # this worker's groups only: other tests' workers may be alive in the same parent
    create = cgroup.WorkerGroup.create.__func__

    def recording_create(cls, *args, **kwargs):
        group = create(cls, *args, **kwargs)
        made.extend(group.folders)
        return group

    monkeypatch.setattr(cgroup.WorkerGroup, "create", classmethod(recording_create))
    (tmp_path / "bomb.py").write_text(FORKED_MEMORY)
    session = StudentSession("sandbox", lambda _id: tmp_path / "bomb.py", Sandbox(memory_mb=2048), lambda _id: 90.0)
    try:
        try:
            statuses = session.load("bomb").bomb(3, 1)
        except Exception as exc:  # the worker itself may be the one the kernel picks
            statuses = [f"the worker died: {exc}"]
        warnings = session.warnings()
    finally:
        session.close()
    if any("cgroup" in w for w in warnings):
        pytest.skip(f"no cgroup for the worker here: {warnings}")
    assert statuses != [0, 0, 0], "three 1 GiB children lived in a worker whose memory limit is 2 GiB"
    assert made, "the worker made no cgroup, yet no warning said so"
    assert not [f for f in made if f.exists()], "the worker's cgroup outlived it"


def test_the_folder_of_a_killed_grade_is_removed_by_the_next_one(tmp_path, monkeypatch):
    import fcntl
    import subprocess
    import sys

    from grader import runner

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = tmp_path / f"{runner.PRIVATE_PREFIX}dead"
    (dead / "grader-submission-x" / "files").mkdir(parents=True)
    (dead / "grader-submission-x" / "files" / "online_softmax.py").write_text("student code")
    (dead / ".lock").touch()
    alive = tmp_path / f"{runner.PRIVATE_PREFIX}alive"
    alive.mkdir()
    (alive / ".lock").touch()
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); "
                               "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
                               str(alive / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        folder = runner.private_folder()
        assert not dead.exists(), "the folder of a grade whose process died must go"
        assert alive.exists(), "the folder of a grade in progress must stay"
        assert Path(folder).parent == tmp_path and (Path(folder) / ".lock").exists()
        fd = os.open(Path(folder) / ".lock", os.O_RDWR)
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by this grade
        os.close(fd)
    finally:
        holder.kill()
        holder.wait()


def test_a_submission_with_two_candidate_files_says_which_was_graded(tmp_path, root):
    folder = tmp_path / "two"
    (folder / EXERCISE).mkdir(parents=True)
    (folder / EXERCISE / f"{EXERCISE}.py").write_text("x = 1\n")
    (folder / f"{EXERCISE}.py").write_text("x = 2\n")
    result = grade_folder(folder, [EXERCISE], tests="public", checks=["merge_public"], call_timeout_s=20)
    assert any(w == f"{EXERCISE}: graded {EXERCISE}/{EXERCISE}.py; also found {EXERCISE}.py (not graded)"
               for w in result["warnings"]), result["warnings"]


NAMESPACES = '''
import ctypes, subprocess, threading

def probe():
    libc = ctypes.CDLL(None, use_errno=True)
    unshared = libc.unshare(0x10000000 | 0x00020000)  # a user and a mount namespace
    err = ctypes.get_errno()
    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join()
    tool = subprocess.run(["unshare", "-Ur", "true"], capture_output=True).returncode
    return unshared, err, tool
'''


def test_the_worker_cannot_make_namespaces_of_its_own(tmp_path):
    """The seccomp filter: no user namespace (the first step of most kernel escalations), threads fine."""
    import errno

    (tmp_path / "ns.py").write_text(NAMESPACES)
    # Without the lock (an exercise whose drivers spawn, like ring_allreduce's): the first filter alone holds.
    session = StudentSession("sandbox", lambda _id: tmp_path / "ns.py", Sandbox(), lambda _id: 60.0, spawns=SPAWNS)
    try:
        unshared, err, tool = session.load("ns").probe()
        warnings = session.warnings()
    finally:
        session.close()
    if any("seccomp" in w for w in warnings):
        pytest.skip(f"no seccomp filter here: {warnings}")
    assert (unshared, err) == (-1, errno.EPERM), "the worker made a user namespace"
    assert tool != 0, "unshare(1) in the worker made a user namespace"


OWN_MEMORY = '''
import ctypes, os

SECRET = ctypes.create_string_buffer(b"probe-state")

def rewrite():
    """Try to rewrite this process's own memory, as a submission would to switch off the probes."""
    name = "/".join(["", "proc", "self", "m" + "em"])
    try:
        fd = os.open(name, os.O_RDWR)
    except OSError as exc:
        return "refused", exc.errno
    try:
        os.pwrite(fd, b"PWNED", ctypes.addressof(SECRET))
    finally:
        os.close(fd)
    return "wrote", SECRET.value.decode()

def dumpable():
    return ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
'''


@as_root
def test_the_worker_cannot_rewrite_its_own_memory(tmp_path):
    """The probes live in the worker's memory: /proc/self/mem must not open for the student's code."""
    import errno

    (tmp_path / "mem.py").write_text(OWN_MEMORY)
    session = StudentSession("sandbox", lambda _id: tmp_path / "mem.py", Sandbox(), lambda _id: 60.0)
    try:
        module = session.load("mem")
        outcome, detail = module.rewrite()
        flag = module.dumpable()
    finally:
        session.close()
    assert flag == 0, "the worker is dumpable: its /proc files are its own uid's"
    assert (outcome, detail) == ("refused", errno.EACCES), f"the worker rewrote its own memory: {outcome} {detail}"


SOCKETS = '''
import socket

def families():
    found = {}
    for name in ("AF_UNIX", "AF_INET", "AF_INET6", "AF_VSOCK", "AF_ALG", "AF_PACKET"):
        try:
            socket.socket(getattr(socket, name), socket.SOCK_STREAM if name != "AF_ALG" else socket.SOCK_SEQPACKET).close()
            found[name] = "made"
        except OSError as exc:
            found[name] = exc.errno
    return found
'''


def call_in_worker(tmp_path, name: str, source: str, function: str, spawns: bool = False):
    """(`function()` of a module `source` run in a sandboxed worker, the session's warnings)."""
    (tmp_path / f"{name}.py").write_text(source)
    session = StudentSession("sandbox", lambda _id: tmp_path / f"{name}.py", Sandbox(), lambda _id: 60.0,
                             spawns=lambda _id: spawns)
    try:
        return getattr(session.load(name), function)(), session.warnings()
    finally:
        session.close()


def test_the_worker_gets_local_sockets_only(tmp_path):
    """AF_VSOCK reaches a VM grader's hypervisor past the network namespace (a red team could listen on it)."""
    import errno

    found, warnings = call_in_worker(tmp_path, "sockets", SOCKETS, "families")
    if any("seccomp" in w for w in warnings):
        pytest.skip(f"no seccomp filter here: {warnings}")
    assert found["AF_UNIX"] == found["AF_INET"] == "made", found
    assert found["AF_VSOCK"] == found["AF_ALG"] == found["AF_PACKET"] == errno.EAFNOSUPPORT, found


CGROUPS = '''
def groups():
    with open("/proc/self/cgroup") as f:
        return f.read()
'''


@as_root
def test_the_worker_and_all_it_starts_share_one_cpu_weight(tmp_path):
    """A worker that split into 250 sessions of spinners took a classmate's grade from 90 to 59.5 points:
    with a cpu group per worker, all of them together weigh as much as one classmate's worker."""
    from grader.harness import cgroup

    if not (cgroup.ROOT / "cpu").is_dir() and not (cgroup.ROOT / "cgroup.controllers").exists():
        pytest.skip("no cpu controller on this host")
    seen, warnings = call_in_worker(tmp_path, "groups", CGROUPS, "groups")
    if any("cgroup" in w for w in warnings):
        pytest.skip(f"no cgroup for the worker here: {warnings}")
    lines = {line.split(":")[1]: line.split(":", 2)[2] for line in seen.splitlines()}
    cpu = next((path for names, path in lines.items() if "cpu" in names.split(",")), lines.get(""))
    assert cpu is not None and "llm-lab-worker-" in cpu, f"the worker is in no cpu group of its own: {seen}"


def test_the_seccomp_program_refuses_what_it_says():
    from grader.harness import seccomp

    for machine in ("x86_64", "aarch64"):
        prog = seccomp.program(machine)
        assert all(0 <= jt < 256 and 0 <= jf < 256 for _, jt, jf, _ in prog)
        _, _, numbers = seccomp._TABLES[machine]
        ks = {k for code, _, _, k in prog if code == seccomp._JEQ}
        assert {numbers[n] for n in ("unshare", "setns", "mount", "bpf", "ptrace", "clone3")} <= ks, machine


def test_a_reply_written_ahead_of_its_request_is_refused(tmp_path):
    """Every request carries a fresh nonce that its reply must echo: a frame the worker wrote on its own
    cannot be taken for the answer to a call."""
    result = grade_hostile(hand_in(tmp_path, "replies_ahead"), call_timeout_s=10, time_limit_s=120)
    tests = [t for c in checks_of(result, EXERCISE).values() for t in c["tests"]]
    refused = [t for t in tests if "does not answer the request it was sent" in t["message"]]
    assert refused, f"no call refused the forged frame: {[t['message'][:80] for t in tests]}"
    assert result["score"] == 0


HELPER_AT_IMPORT = '''
import logging.handlers, queue

JOBS = queue.Queue()
LISTENER = logging.handlers.QueueListener(JOBS)  # a thread of logging's, started at import
LISTENER.start()

def answer():
    return 42
'''

SPAWNING = '''
import os, subprocess, sys, threading

def attempts():
    found = {}
    try:
        t = threading.Thread(target=lambda: None)
        t.start()
        t.join()
        found["thread"] = "started"
    except RuntimeError as exc:
        found["thread"] = str(exc)
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        found["fork"] = "forked"
    except OSError as exc:
        found["fork"] = exc.errno
    try:
        found["exec"] = subprocess.run([sys.executable, "-c", "pass"]).returncode
    except OSError as exc:
        found["exec"] = exc.errno
    return found
'''


def test_a_helper_thread_started_at_import_cannot_run(tmp_path):
    """Work handed to a thread the module started at import ran outside every probe (the red team's logging
    QueueListener ran torch.softmax for online_softmax, 90 of 100): the worker starts no thread once the
    student's module is being imported, and the student is told why."""
    (tmp_path / "helper.py").write_text(HELPER_AT_IMPORT)
    session = StudentSession("sandbox", lambda _id: tmp_path / "helper.py", Sandbox(), lambda _id: 60.0)
    try:
        with pytest.raises(Exception) as raised:
            session.load("helper").answer()
        warnings = session.warnings()
    finally:
        session.close()
    if any("seccomp" in w for w in warnings):
        pytest.skip(f"no seccomp filter here: {warnings}")
    assert "can't start new thread" in str(raised.value) and "starts no thread or process" in str(raised.value), raised.value


def test_the_worker_starts_no_thread_process_or_program_in_a_call(tmp_path):
    import errno

    found, warnings = call_in_worker(tmp_path, "spawning", SPAWNING, "attempts")
    if any("seccomp" in w for w in warnings):
        pytest.skip(f"no seccomp filter here: {warnings}")
    assert "can't start new thread" in found["thread"], found
    assert found["fork"] == errno.EPERM and found["exec"] == errno.EPERM, found


def test_an_exercise_whose_drivers_spawn_keeps_threads_and_processes(tmp_path):
    """ring_allreduce's drivers run ranks as threads and processes (course.yaml `spawns: true`): no lock there."""
    found, _ = call_in_worker(tmp_path, "spawning", SPAWNING, "attempts", spawns=True)
    assert found == {"thread": "started", "fork": "forked", "exec": 0}, found


def test_the_lock_program_refuses_what_it_says():
    from grader.harness import seccomp

    for machine in ("x86_64", "aarch64"):
        _, _, numbers = seccomp._TABLES[machine]
        threads = seccomp.lock_program(False, machine)
        assert [k for code, _, _, k in threads if code == seccomp._JSET] == [seccomp.CLONE_THREAD], machine
        everything = {k for code, _, _, k in seccomp.lock_program(True, machine) if code == seccomp._JEQ}
        assert {numbers["clone"], *seccomp._SPAWN[machine].values()} <= everything, machine
