"""One identity per grade: a lease on an unprivileged uid that no other grade on this host holds.

When the grader runs as root, every worker runs as a uid of its own, taken from a range that no
account uses (course.yaml ``worker.uid_first`` / ``worker.uid_count``). Two grades running at once
(``grader batch --jobs N``, several graders on one host, Slurm tasks sharing a node) therefore never
share a uid: no worker can read, write or signal another's files and processes, and the per-user
process cap (RLIMIT_NPROC, which the kernel counts per uid) is per grade.

A lease is an exclusive ``flock`` on ``<lock dir>/<uid>.lock``, held by the trusted process that
starts the worker; the kernel drops it when that process dies, however it dies. Before a uid is
handed out, and again when it is given back, every process still running as it is killed (`sweep`),
so nothing of one grade survives into the next.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import random
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_UID_FIRST = 1_900_000_000
DEFAULT_UID_COUNT = 1000
_LOCK_DIRS = ("/run/llm-efficiency-lab", "/var/lock/llm-efficiency-lab", "/tmp/.llm-efficiency-lab-root")


class IdentityError(RuntimeError):
    """No unprivileged identity could be leased for a worker."""


def lock_dir() -> Path:
    """A folder only root can write, shared by every grader on this host (GRADER_LOCK_DIR overrides).

    An existing folder is used only if it is a real directory owned by root that nobody else can
    write: a folder a local user planted (or a symlink) is refused, never followed."""
    candidates = [os.environ["GRADER_LOCK_DIR"]] if os.environ.get("GRADER_LOCK_DIR") else list(_LOCK_DIRS)
    problems = []
    for name in candidates:
        path = Path(name) / "uids"
        try:
            for folder in (path.parent, path):
                try:
                    os.mkdir(folder, 0o700)
                except FileExistsError:
                    pass
                info = os.lstat(folder)
                if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
                    raise IdentityError(f"{folder} is not a directory that only root can write "
                                        f"(mode {stat.filemode(info.st_mode)}, owner uid {info.st_uid})")
            return path
        except (OSError, IdentityError) as exc:
            problems.append(f"{path}: {exc}")
    raise IdentityError("no folder for uid leases: " + "; ".join(problems))


def processes_of(uid: int) -> list[int]:
    """Pids of live (non-zombie) processes whose real, effective or saved uid is `uid`."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", "rb") as f:
                text = f.read(4096).decode("ascii", "replace")
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        if fields.get("State", "").strip().startswith("Z"):
            continue
        uids = fields.get("Uid", "").split()
        if str(uid) in uids[:3]:
            found.append(int(entry.name))
    return found


def sweep(uid: int, timeout_s: float = 10.0) -> None:
    """Kill every process running as `uid` and wait until none is left.

    The kill is sent by a short-lived process that itself runs as `uid`: ``kill(-1, SIGKILL)`` from
    there reaches exactly the processes of that uid (and not itself), wherever they hid."""
    deadline = time.monotonic() + timeout_s
    while processes_of(uid):
        _kill_all_as(uid)
        if time.monotonic() > deadline:
            raise IdentityError(f"processes of uid {uid} survived SIGKILL for {timeout_s:g} s: {processes_of(uid)}")
        time.sleep(0.02)


def _kill_all_as(uid: int) -> None:
    """Fork a child that becomes `uid` and sends SIGKILL to every process it may signal."""
    pid = os.fork()
    if pid == 0:  # only system calls from here on: this process may have had other threads
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        except BaseException:  # noqa: BLE001
            os._exit(1)
        os._exit(0)
    os.waitpid(pid, 0)


@dataclass
class UidLease:
    """An exclusive hold on one uid (and the gid of the same number) for one grade's worker."""

    uid: int
    gid: int
    _fd: int | None

    def sweep(self) -> None:
        """Kill whatever still runs as this uid (the lease stays held)."""
        if self._fd is not None:
            sweep(self.uid)

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            sweep(self.uid)
        finally:
            os.close(self._fd)
            self._fd = None


def lease(first: int = DEFAULT_UID_FIRST, count: int = DEFAULT_UID_COUNT) -> UidLease:
    """Lease a uid in [first, first + count) that no account and no other grade uses. Root only."""
    if os.geteuid() != 0:
        raise IdentityError("only root can run workers as uids of their own")
    folder = lock_dir()
    start = random.randrange(count)  # spread concurrent graders over the range
    for i in range(count):
        uid = first + (start + i) % count
        try:
            pwd.getpwuid(uid)
            continue  # an account owns it: never run student code as a real user
        except KeyError:
            pass
        fd = os.open(folder / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            sweep(uid)  # a grade killed before it could give the uid back may have left processes
        except BaseException:
            os.close(fd)
            raise
        return UidLease(uid, uid, fd)
    raise IdentityError(f"all {count} worker uids from {first} are leased by grades running now; "
                        "widen course.yaml's worker.uid_count or run fewer grades at once")


def user_namespaces_available() -> bool:
    """Can this (unprivileged) process make a user namespace? Asked of a throwaway child."""
    probe = ("import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); "
             "sys.exit(0 if libc.unshare(0x10000000 | 0x00020000 | 0x20000000) == 0 else 1)")
    try:
        return subprocess.run([sys.executable, "-I", "-S", "-c", probe], timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def shared_identity_problem(user: str | None, isolate: bool) -> str | None:
    """Why workers of grades running at once on this host would share an identity (files, signals,
    the per-user process cap), or None when each grade's worker is walled off from the others."""
    if not isolate:
        return "isolation is off, so every worker shares this machine's processes and files"
    if os.geteuid() == 0:
        if user and user != "auto":
            return f"every worker runs as the account {user!r}"
        try:
            lock_dir()
        except IdentityError as exc:
            return f"no uid of its own for each worker ({exc})"
        return None
    if os.environ.get("GRADER_IN_CONTAINER") == "1" or not user_namespaces_available():
        return (f"not root and without user namespaces, every worker runs as this user (uid {os.getuid()}), "
                "sees what it can read and shares its process cap")
    return None
