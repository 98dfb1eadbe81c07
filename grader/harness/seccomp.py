"""A seccomp filter for the worker: the system calls it has no use for, refused.

The worker runs unprivileged, but an unprivileged process may still make a user namespace and, inside
it, mount file systems, load BPF programs and reach a wide part of the kernel: the usual first step
of a privilege escalation. The filter, installed just before the worker is exec'd (after
PR_SET_NO_NEW_PRIVS, so no privilege is needed), refuses with EPERM:

* new namespaces and joining others: unshare, setns, and clone with any CLONE_NEW* flag (threads and
  fork() are unaffected; clone3, whose flags a filter cannot read, answers ENOSYS, so the C library
  falls back to clone);
* mounting and changing the root: mount, umount2, pivot_root, chroot, and the new mount API;
* kernel surfaces no grade needs: bpf, io_uring, userfaultfd, perf_event_open, keyrings, ptrace and
  process_vm_readv/writev (another process's memory), pidfd_getfd (another's descriptors),
  kexec and module loading;
* sockets of any family but unix, IPv4, IPv6 and netlink (AF_VSOCK reaches a VM's host past the
  network namespace);
* any system call of another architecture's ABI (32-bit calls on a 64-bit kernel, x32).

Docker's default profile refuses the same for containers; this gives the local backend the same wall.

A second filter, the *lock* (`install_lock`), is installed by the worker itself just before it imports the
student's module: from then on the worker starts no thread (clone with CLONE_THREAD) and, where the exercise
and the host allow (`processes=True`), no process and no program either (fork, vfork, clone, execve,
execveat). The probes that decide points (the forbidden-call guard, the kernel rule, the work counters) watch
the thread that serves a call; work handed to a thread or process the student's module started beforehand
(a logging QueueListener's thread, a forked helper, a fresh interpreter) would run outside them. Exercises
whose course drivers start threads or processes themselves (ring_allreduce's ranks) go without the lock.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
CLONE_NEW_FLAGS = 0x7E020080  # NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME

_LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET = 0x06  # BPF_RET | BPF_K

# socket() only for these families: unix, IPv4, IPv6 (loopback only, in the worker's network namespace) and
# netlink (getifaddrs, which gloo uses). Every other family is a kernel surface a grade has no use for, and
# some reach past the network namespace: AF_VSOCK talks to the hypervisor of a VM grader.
SOCKET_FAMILIES = (1, 2, 10, 16)  # AF_UNIX, AF_INET, AF_INET6, AF_NETLINK

# (audit arch, x32 bit, {name: number}) per machine
_DENIED = ("unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen",
           "fsconfig", "fsmount", "fspick", "mount_setattr", "bpf", "io_uring_setup", "io_uring_enter",
           "io_uring_register", "userfaultfd", "perf_event_open", "keyctl", "add_key", "request_key", "ptrace",
           "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "process_vm_readv",
           "process_vm_writev", "pidfd_getfd")
CLONE_THREAD = 0x00010000
_SPAWN = {"x86_64": {"fork": 57, "vfork": 58, "execve": 59, "execveat": 322},
          "aarch64": {"execve": 221, "execveat": 281}}  # aarch64 forks through clone only
_SPAWN["arm64"] = _SPAWN["aarch64"]
_TABLES = {
    "x86_64": (0xC000003E, True, {
        "clone": 56, "clone3": 435, "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
        "chroot": 161, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
        "fspick": 433, "mount_setattr": 442, "bpf": 321, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "userfaultfd": 323, "perf_event_open": 298, "keyctl": 250, "add_key": 248,
        "request_key": 249, "ptrace": 101, "kexec_load": 246, "kexec_file_load": 320, "init_module": 175,
        "finit_module": 313, "delete_module": 176, "socket": 41, "process_vm_readv": 310, "process_vm_writev": 311,
        "pidfd_getfd": 438}),
    "aarch64": (0xC00000B7, False, {
        "clone": 220, "clone3": 435, "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41,
        "chroot": 51, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
        "fspick": 433, "mount_setattr": 442, "bpf": 280, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "userfaultfd": 282, "perf_event_open": 241, "keyctl": 219, "add_key": 217,
        "request_key": 218, "ptrace": 117, "kexec_load": 104, "kexec_file_load": 294, "init_module": 105,
        "finit_module": 273, "delete_module": 106, "socket": 198, "process_vm_readv": 270, "process_vm_writev": 271,
        "pidfd_getfd": 438}),
}
_TABLES["arm64"] = _TABLES["aarch64"]


def program(machine: str | None = None) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions for `machine` (default: this one)."""
    arch, x32, numbers = _TABLES[machine or platform.machine()]
    denied = [numbers[name] for name in _DENIED]
    # Laid out as: checks..., then the three returns and the clone check at fixed labels.
    body: list[tuple[int, str | int, str | int, int]] = [
        (_LD_ABS, 0, 0, 4),  # seccomp_data.arch
        (_JEQ, 0, "deny", arch),
        (_LD_ABS, 0, 0, 0),  # seccomp_data.nr
    ]
    if x32:
        body.append((_JGE, "deny", 0, 0x40000000))  # the x32 ABI's numbers
    body += [(_JEQ, "deny", 0, nr) for nr in denied]
    body += [(_JEQ, "nosys", 0, numbers["clone3"]), (_JEQ, "clone", 0, numbers["clone"]),
             (_JEQ, "socket", 0, numbers["socket"]), (_RET, 0, 0, RET_ALLOW)]
    labels = {"clone": len(body)}
    body += [(_LD_ABS, 0, 0, 16), (_JSET, "deny", 0, CLONE_NEW_FLAGS), (_RET, 0, 0, RET_ALLOW)]  # args[0], low word
    labels["socket"] = len(body)
    body.append((_LD_ABS, 0, 0, 16))  # args[0], the address family
    body += [(_JEQ, "allow", 0, family) for family in SOCKET_FAMILIES]
    body.append((_RET, 0, 0, RET_ERRNO | errno.EAFNOSUPPORT))
    labels["allow"] = len(body)
    body.append((_RET, 0, 0, RET_ALLOW))
    labels["deny"] = len(body)
    body.append((_RET, 0, 0, RET_ERRNO | errno.EPERM))
    labels["nosys"] = len(body)
    body.append((_RET, 0, 0, RET_ERRNO | errno.ENOSYS))

    def offset(at: int, target: str | int) -> int:
        return target if isinstance(target, int) else labels[target] - at - 1

    return [(code, offset(i, jt), offset(i, jf), k) for i, (code, jt, jf, k) in enumerate(body)]


def lock_program(processes: bool, machine: str | None = None) -> list[tuple[int, int, int, int]]:
    """The lock as (code, jt, jf, k) instructions: no new thread; with `processes`, no new process or program."""
    arch, _x32, numbers = _TABLES[machine or platform.machine()]
    spawn = _SPAWN[machine or platform.machine()]
    deny = (_RET, 0, 0, RET_ERRNO | errno.EPERM)
    allow = (_RET, 0, 0, RET_ALLOW)
    body = [(_LD_ABS, 0, 0, 4), (_JEQ, 1, 0, arch), deny, (_LD_ABS, 0, 0, 0)]  # another ABI: the first filter's
    if processes:
        for nr in [numbers["clone"], *spawn.values()]:
            body.append((_JEQ, 0, 1, nr))
            body.append(deny)
        return body + [allow]
    return body + [(_JEQ, 0, 3, numbers["clone"]), (_LD_ABS, 0, 0, 16), (_JSET, 0, 1, CLONE_THREAD), deny, allow]


def install_lock(processes: bool) -> None:
    """Install the lock on this process: from now on no thread starts (and, with `processes`, no process
    and no program). Raises OSError where the kernel or the machine is not supported."""
    if platform.machine() not in _TABLES:
        raise OSError(errno.ENOSYS, f"no seccomp table for {platform.machine()}")
    _load(lock_program(processes))


def install() -> None:
    """Install the filter on this process (and everything it execs or forks). Needs PR_SET_NO_NEW_PRIVS
    (or privilege) first. Raises OSError where the kernel or the machine is not supported."""
    if platform.machine() not in _TABLES:
        raise OSError(errno.ENOSYS, f"no seccomp table for {platform.machine()}")
    _load(program())


def _load(instructions: list[tuple[int, int, int, int]]) -> None:
    raw = b"".join(struct.pack("HBBI", *ins) for ins in instructions)
    buffer = ctypes.create_string_buffer(raw, len(raw))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = SockFprog(len(instructions), ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp: {errno.errorcode.get(err, err)}")
