"""Start the worker inside its sandbox. Runs as a fresh, single-threaded Python (no torch imported).

``python -I -m grader.harness.launch CONFIG_JSON`` does, in order:

1. Namespaces (Linux). As root: new mount, network, PID and IPC namespaces. Otherwise: the same
   inside a new user namespace, where the kernel allows it. Where neither works, it goes on without
   and says so on stderr (the grader turns that into a warning in the result). In the course's
   grading container (GRADER_IN_CONTAINER=1) the container is the sandbox: steps 1-3 are skipped.
2. Forks, so the worker is PID 1 of its PID namespace: when it dies, the kernel kills every process
   it left behind, including ones that called setsid() to escape the process group.
3. In the mount namespace, hides the folders the student must not read (hidden tests, solutions,
   other submissions) under empty read-only tmpfs mounts.
4. Resource limits: CPU seconds, file size, number of processes, address space (CPU-only hosts;
   CUDA reserves huge virtual ranges), no core dumps.
5. As root: drops to the unprivileged user (default ``nobody``), with no supplementary groups.
6. Sends stdout/stderr to a capped log file in the worker's private folder and execs the worker,
   which the kernel kills if the process that started it dies (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REC = 16384
MS_PRIVATE = 1 << 18

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def enter_namespaces(as_root: bool) -> list[str]:
    """Returns warnings for isolation that could not be had."""
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC
    if as_root:
        try:
            _check(_libc.unshare(flags), "unshare")
            return []
        except OSError as exc:
            return [f"no namespaces for the worker ({exc}); it shares this machine's network and process table"]
    uid, gid = os.getuid(), os.getgid()
    try:
        _check(_libc.unshare(flags | CLONE_NEWUSER), "unshare")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
        return []
    except OSError as exc:
        return [f"no user namespace for the worker ({exc}); it has network access and can see other processes"]


def hide_paths(paths: list[str]) -> list[str]:
    warnings = []
    try:
        _check(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    except OSError as exc:
        return [f"cannot hide grader files from the worker ({exc})"]
    for path in paths:
        if not os.path.isdir(path):
            continue
        try:
            _check(
                _libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, b"size=4k,mode=0555"),
                f"mount tmpfs on {path}",
            )
        except OSError as exc:
            warnings.append(f"cannot hide {path} from the worker ({exc})")
    try:  # a /proc of the new PID namespace: the worker sees its own processes only
        _check(_libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV, None), "mount /proc")
    except OSError as exc:
        warnings.append(f"cannot mount a private /proc ({exc})")
    return warnings


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
    if os.getuid() == 0 or os.geteuid() == 0:  # paranoia: setuid must have taken effect
        raise OSError("could not drop root privileges")


PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (set again after fork and setuid,
    which clear it), so a worker never outlives the grader that started it."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def main() -> None:
    die_with_parent()
    config = json.loads(sys.argv[1])
    as_root = os.geteuid() == 0
    # In the course image's container, the container is the sandbox (no network, its own process
    # table and file system, limits from outside); its seccomp profile forbids new namespaces, and
    # file modes keep the grader's files from the unprivileged user this process drops to below.
    in_container = os.environ.get("GRADER_IN_CONTAINER") == "1"
    if not config["isolate"]:
        warnings = ["isolation disabled by the grader"]
    else:
        warnings = [] if in_container else enter_namespaces(as_root)
    isolated = config["isolate"] and not in_container and not warnings

    pid = os.fork() if isolated else 0
    if pid:
        # The launcher outside the PID namespace: wait for the worker and report its fate.
        signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            os.kill(os.getpid(), os.WTERMSIG(status))
        os._exit(os.waitstatus_to_exitcode(status))

    if isolated:
        warnings += hide_paths(config["hide"])
        warnings += loopback_up()
    drop = as_root and config.get("uid") is not None
    if drop:
        blocked = python_usable_by(config["uid"], config["gid"])
        if blocked:
            drop = False
            warnings.append(
                f"the worker runs as root: user {config['uid']} cannot reach {blocked} "
                "(make the virtual environment from a Python outside /root, e.g. /usr/bin/python3)"
            )
    # The log file takes stdout and stderr; stdin is empty.
    log = os.open(config["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    if drop:
        os.chown(config["log"], config["uid"], config["gid"])
    for message in warnings:
        os.write(log, f"grader-sandbox-warning: {message}\n".encode())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    set_limits(config["limits"])
    if drop:
        drop_privileges(config["uid"], config["gid"])
    die_with_parent()  # the launcher, or for an unisolated worker the grader's pytest
    os.chdir(config["workdir"])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an over-long write fails with EFBIG, not a kill
    os.execv(sys.executable, [sys.executable, "-I", "-m", "grader.harness.worker", *config["argv"]])


if __name__ == "__main__":
    main()
