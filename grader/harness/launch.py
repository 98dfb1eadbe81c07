"""Start the worker inside its sandbox. Runs as a fresh, single-threaded Python (no torch imported).

``python -I -m grader.harness.launch CONFIG_JSON`` is started by the trusted test process
(client.py) with four descriptors: the request socket, the student's file (opened there), a status
pipe, and the log (stdout and stderr, an unlinked file only the trusted side can name). In order:

1. Namespaces (Linux). As root: new mount, network, PID and IPC namespaces. Otherwise: the same
   inside a new user namespace, where the kernel allows it. Where neither works, it goes on without
   and says so (the grader turns that into a warning in the result). In the course's grading
   container (GRADER_IN_CONTAINER=1) the container is the sandbox: steps 1-3 are skipped.
2. Forks, so the worker is PID 1 of its PID namespace: when it dies, the kernel kills every process
   it left behind, including ones that called setsid() to escape the process group.
3. Builds the worker's file system, an allow-list view on a private tmpfs (view.py): system
   folders, the Python environment and the grader package read-only, the student's file copied in,
   a private scratch /tmp; nothing else of the machine. Without namespaces, a scratch folder of its
   own instead, inside a folder only the trusted side can write.
4. Resource limits: CPU seconds, file size, number of processes, address space (CPU-only hosts;
   CUDA reserves huge virtual ranges), no core dumps.
5. As root: drops to the grade's own unprivileged uid (identity.py), with no supplementary groups
   and no way back (PR_SET_NO_NEW_PRIVS: no setuid binary can raise it again); then a seccomp filter
   refuses the system calls a worker has no use for (seccomp.py: new namespaces, mounts, bpf, ...).
6. Reports its warnings on the status pipe, closes it, and execs the worker (or, started warm by the
   zygote, grader/harness/zygote.py, runs it in this same process), which the kernel kills if the
   process that started it dies (PR_SET_PDEATHSIG). The worker itself adds the lock (seccomp.py)
   before it imports the student's module: no thread, and on CPU hosts no process, starts after that.

Root never opens, creates or changes a path inside a folder a worker can write: the log and the
student's file travel as descriptors, and the scratch folder is created before it is handed over.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys
from typing import Callable

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def enter_namespaces(as_root: bool) -> list[str]:
    """Returns warnings for isolation that could not be had (an empty list: fully isolated)."""
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC
    if as_root:
        try:
            _check(_libc.unshare(flags), "unshare")
            return []
        except OSError as exc:
            return [f"no namespaces for the worker ({exc}); it shares this machine's file system, network "
                    "and process table, and runs as its grade's own uid"]
    uid, gid = os.getuid(), os.getgid()
    try:
        _check(_libc.unshare(flags | CLONE_NEWUSER), "unshare")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
        return []
    except OSError as exc:
        return [f"no user namespace for the worker ({exc}); it runs as the grader's own user, can read what "
                "that user can read, has network access and can see other processes"]


def loopback_up() -> list[str]:
    """Bring up `lo` in the new network namespace: localhost works, nothing else is reachable."""
    import fcntl
    import socket
    import struct

    SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            ifreq = struct.pack("16sH14s", b"lo", 0, b"")
            flags = struct.unpack("16sH14s", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, ifreq))[1]
            fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | IFF_UP, b""))
        return []
    except OSError as exc:
        return [f"cannot bring up the loopback interface ({exc}); localhost connections will fail"]


def set_limits(limits: dict) -> None:
    mb = 1 << 20
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 5))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_size_mb"] * mb,) * 2)
    if limits.get("memory_mb"):
        resource.setrlimit(resource.RLIMIT_AS, (limits["memory_mb"] * mb,) * 2)
    if limits.get("processes"):
        resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"],) * 2)


def python_usable_by(uid: int, gid: int) -> str | None:
    """None if the user can run this Python and import the grader; else the first path it cannot reach."""
    import grader

    paths = [(os.path.realpath(sys.executable), os.X_OK), (os.path.dirname(os.__file__), os.R_OK | os.X_OK),
             (os.path.dirname(grader.__file__), os.R_OK | os.X_OK)]
    os.setegid(gid)
    os.seteuid(uid)
    try:
        for path, mode in paths:
            if not os.access(path, mode, effective_ids=True):
                return path
        return None
    finally:
        os.seteuid(0)
        os.setegid(0)


def drop_privileges(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() == 0 or os.geteuid() == 0 or os.getgid() == 0:  # paranoia: setuid must have taken effect
        raise OSError("could not drop root privileges")


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (set again after fork and setuid,
    which clear it), so a worker never outlives the grader that started it."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def no_new_privileges() -> None:
    """From here on, no exec can gain privileges (setuid-root binaries run as the caller)."""
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def scratch_folder(parent: str, module_fd: int, module_name: str, uid: int | None, gid: int | None) -> str:
    """Without a mount namespace: a fresh folder for the worker, made inside `parent` (a folder only the
    trusted side can write), holding a copy of the student's file; handed to `uid` only once complete."""
    import tempfile

    folder = tempfile.mkdtemp(prefix="worker-", dir=parent)
    fd = os.open(os.path.join(folder, module_name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444)
    try:
        while chunk := os.read(module_fd, 1 << 20):
            os.write(fd, chunk)
    finally:
        os.close(fd)
        os.close(module_fd)
    if uid is not None:
        assert gid is not None  # the worker's identity is both or neither
        os.chmod(parent, 0o711)  # the worker may pass through to its own folder, list nothing
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchown(dfd, uid, gid)
        finally:
            os.close(dfd)
    return folder


class WorkerReady(BaseException):
    """Raised by the zygote's `run_worker` once the sandbox is set up (grader/harness/zygote.py), to leave every
    frame of the launcher and of the server that forked it (their locals: this sandbox's description, the
    server's table of its children) before the worker runs on a stack as bare as a fresh interpreter's. A
    BaseException, so that no `except Exception` on the way stops it."""

    def __init__(self, argv: list[str]):
        super().__init__()
        self.argv = argv


def exec_worker(argv: list[str]) -> None:
    """Replace this process by the worker (a fresh interpreter, which imports torch and the probes)."""
    os.execv(sys.executable, [sys.executable, "-I", "-m", "grader.harness.worker", *argv])


def main(config: dict | None = None, run_worker: Callable[[list[str]], None] = exec_worker) -> None:
    """Set up the sandbox described by `config` (this process's argument when None) and run the worker in it:
    `run_worker` gets the worker's arguments (grader/harness/zygote.py runs it in this process, already warm)."""
    die_with_parent()
    config = json.loads(sys.argv[1]) if config is None else config
    status = os.fdopen(config["status_fd"], "w")
    try:
        start(config, status, run_worker)
    except BaseException as exc:  # noqa: BLE001 - reported to the trusted side, which fails the grade
        if isinstance(exc, WorkerReady) and status.closed:  # the zygote's way out: the worker runs next
            raise
        try:
            status.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
            status.close()
        except OSError:
            pass
        os._exit(70)


def start(config: dict, status, run_worker: Callable[[list[str]], None] = exec_worker) -> None:
    for procs in config.get("cgroup_procs") or []:  # the worker's own cgroup, before anything else runs
        fd = os.open(procs, os.O_WRONLY | os.O_NOFOLLOW)
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)
    as_root = os.geteuid() == 0
    uid, gid = config.get("uid"), config.get("gid")
    drop = as_root and uid is not None
    # In the course image's container, the container is the sandbox (no network, its own process
    # table and file system, limits from outside); its seccomp profile forbids new namespaces, and
    # file modes keep the grader's files from the unprivileged user this process drops to below.
    in_container = os.environ.get("GRADER_IN_CONTAINER") == "1"
    if not config["isolate"]:
        warnings = ["isolation disabled by the grader: the worker shares this machine's file system, network "
                    "and process table"]
    else:
        warnings = [] if in_container else enter_namespaces(as_root)
    isolated = config["isolate"] and not in_container and not warnings

    pid = os.fork() if isolated else 0
    if pid:
        # The launcher outside the PID namespace: wait for the worker and report its fate.
        status.close()
        signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
        _, wait_status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(wait_status):
            os.kill(os.getpid(), os.WTERMSIG(wait_status))
        os._exit(os.waitstatus_to_exitcode(wait_status))

    die_with_parent()  # fork cleared it
    module_name = os.path.basename(config["module_name"])
    if isolated:
        from grader.harness import view

        warnings += view.build(uid=uid if drop else os.getuid(), gid=gid if drop else os.getgid(),  # type: ignore[arg-type]  # drop: both set
                               course_root=config["course_root"], masks=config["masks"],
                               module_fd=config["module_fd"], module_name=module_name,
                               scratch_mb=config["scratch_mb"], shm_mb=config["shm_mb"], cuda=config["cuda"])
        warnings += loopback_up()
        module_path = f"{view.SUBMISSION_DIR}/{module_name}"
        workdir = view.SCRATCH_DIR
    else:
        workdir = scratch_folder(config["scratch_parent"], config["module_fd"], module_name,
                                 uid if drop else None, gid if drop else None)
        module_path = os.path.join(workdir, module_name)
    if drop:
        assert uid is not None and gid is not None  # the worker's identity is both or neither
        blocked = python_usable_by(uid, gid)
        if blocked:
            raise OSError(f"the worker's user {uid} cannot reach {blocked} (make the virtual environment "
                          "from a Python outside /root, e.g. /usr/bin/python3)")
    limits = dict(config["limits"])
    if in_container:
        limits["processes"] = 0  # RLIMIT_NPROC counts per uid across containers: --pids-limit bounds it there
    set_limits(limits)
    if drop:
        assert uid is not None and gid is not None
        drop_privileges(uid, gid)
    no_new_privileges()
    if config["isolate"]:
        from grader.harness import seccomp

        try:  # the system calls a worker has no use for (new namespaces, mounts, bpf, ...): refused
            seccomp.install()
        except OSError as exc:
            warnings.append(f"no seccomp filter for the worker ({exc}): it may make user namespaces and reach "
                            "more of the kernel")
    die_with_parent()  # the launcher, or for an unisolated worker the grader's pytest
    os.chdir(workdir)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an over-long write fails with EFBIG, not a kill
    status.write(json.dumps({"warnings": warnings, "workdir": workdir}) + "\n")
    status.close()
    lock = config.get("lock", "none") if config["isolate"] else "none"
    run_worker([str(config["sock_fd"]), module_path, lock])


if __name__ == "__main__":
    main()
