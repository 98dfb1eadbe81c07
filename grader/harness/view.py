"""The worker's file system: an allow-list view, built in the worker's own mount namespace.

The launcher (still privileged inside its new namespaces) builds a fresh root on a tmpfs and pivots
the worker into it. The view holds, read-only, only what the worker needs:

* the system folders Python and its libraries load from (/usr, /lib*, /bin, /sbin),
* the Python environment (its prefixes and the folders on ``sys.path``),
* the grader package, minus ``grader/hidden``,
* the student's file, copied (not bound) into ``/submission``,
* a minimal /etc, /dev (null, zero, full, random, urandom; the NVIDIA devices on CUDA hosts), a
  private /proc of the worker's PID namespace, /sys read-only,
* a private, size-capped scratch folder ``/tmp`` owned by the worker.

Nothing else of the host is there: not the course checkout (its ``.git``, ``solutions/``,
``grader/hidden/``, ``tests/``), not other submissions, results or batch state, not other grades'
scratch. Anything on that list that an allow-listed folder happens to contain is covered by an empty
read-only tmpfs ("masks"). The whole view lives in the mount namespace, so it disappears with the
worker however the worker ends: nothing is ever created on the host's disk.
"""

from __future__ import annotations

import ctypes
import os
import platform
import stat
import sys

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MNT_DETACH = 2
O_PATH = getattr(os, "O_PATH", 0o10000000)

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "os-release", "localtime", "nsswitch.conf")
DEVICES = ("null", "zero", "full", "random", "urandom")
SUBMISSION_DIR = "/submission"
SCRATCH_DIR = "/tmp"
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "arm64": 41, "riscv64": 41, "ppc64le": 203, "ppc64": 203, "s390x": 217}

_libc = ctypes.CDLL(None, use_errno=True)


class ViewError(OSError):
    """The worker's view of the file system could not be built."""


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    result = _libc.mount(None if source is None else source.encode(), target.encode(),
                         None if fstype is None else fstype.encode(), ctypes.c_ulong(flags),
                         None if data is None else data.encode())
    if result != 0:
        err = ctypes.get_errno()
        raise ViewError(err, f"mount {source or fstype} on {target}: {os.strerror(err)}")


def _locked_flags(path: str) -> int:
    """The flags of the mount holding `path` that a remount must keep (the kernel refuses to clear
    them inside a user namespace)."""
    f = os.statvfs(path).f_flag
    pairs = ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
             (getattr(os, "ST_NOATIME", 1024), MS_NOATIME), (getattr(os, "ST_NODIRATIME", 2048), MS_NODIRATIME),
             (getattr(os, "ST_RELATIME", 4096), MS_RELATIME))
    return sum(ms for st, ms in pairs if f & st)


def _mounts_below(target: str) -> list[str]:
    """Mount points strictly below `target`, from this mount namespace's mountinfo."""
    prefix = target.rstrip("/") + "/"
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")  # octal escapes such as \040
            if point.startswith(prefix):
                points.append(point)
    return points


def _inside(path: str, folder: str) -> bool:
    """True if `path` is `folder` or lies below it (both absolute and normalised)."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def needed_paths() -> list[str]:
    """Host paths the worker's Python loads from: system folders, the interpreter's prefixes, the
    folders on sys.path, and the grader package. All absolute, normalised, existing."""
    import grader

    paths = [*SYSTEM_DIRS, sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *sys.path,
             os.path.dirname(grader.__file__)]
    out: list[str] = []
    for p in paths:
        if not p or not os.path.isabs(p):
            continue
        p = os.path.normpath(p)
        if os.path.lexists(p) and p not in out:
            out.append(p)
    return out


class ViewBuilder:
    """Builds the view under `new_root` (a fresh tmpfs), then pivots into it."""

    def __init__(self, new_root: str, uid: int, gid: int):
        self.new = new_root.rstrip("/")
        self.uid, self.gid = uid, gid
        self.bound: list[str] = []  # host paths visible in the view (read-only binds)
        self.masked: list[str] = []
        self.to_seal: list[str] = []  # tmpfs mounts to make read-only at the end
        self.warnings: list[str] = []

    def at(self, path: str) -> str:
        return self.new + path

    def visible(self, path: str) -> bool:
        """Is `path` already shown by a bind above it, with no mask in between?"""
        for b in self.bound:
            if _inside(path, b) and not any(_inside(m, b) and _inside(path, m) and m != b for m in self.masked):
                return True
        return False

    def makedirs(self, path: str, mode: int = 0o755) -> None:
        target = self.at(path)
        if not os.path.isdir(target):
            os.makedirs(target, mode=mode, exist_ok=True)

    def bind(self, host_path: str, fd: int | None = None, recursive: bool = True) -> None:
        """Show `host_path` (opened earlier as `fd`, so it stays reachable) read-only at the same path."""
        source = f"/proc/self/fd/{fd}" if fd is not None else host_path
        target = self.at(host_path)
        info = os.stat(source)
        if stat.S_ISDIR(info.st_mode):
            self.makedirs(host_path)
        else:
            self.makedirs(os.path.dirname(host_path))
            if not os.path.exists(target):
                os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o444))
        flags = MS_BIND | (MS_REC if recursive else 0)
        _mount(source, target, None, flags)
        for point in [target, *_mounts_below(target)]:  # a recursive bind brings submounts: all read-only
            _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | _locked_flags(point))
        self.bound.append(host_path)

    def mask(self, path: str) -> None:
        """Cover `path` with an empty tmpfs (writable until `seal`, so allowed paths inside can be bound)."""
        target = self.at(path)
        if not os.path.isdir(target):
            if os.path.lexists(target):  # a file: cover it with an empty one
                _mount("/dev/null" if os.path.exists("/dev/null") else None, target, None, MS_BIND)
                self.masked.append(path)
            return
        _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
        self.masked.append(path)
        self.to_seal.append(target)

    def seal(self) -> None:
        for target in self.to_seal:
            _mount(None, target, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)

    def write(self, path: str, data: bytes, mode: int = 0o444) -> None:
        target = self.at(path)
        self.makedirs(os.path.dirname(path))
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


def _etc(builder: ViewBuilder, held: dict[str, int]) -> None:
    builder.makedirs("/etc")
    for name in ETC_FILES:
        host = f"/etc/{name}"
        if host in held:
            builder.bind(host, held[host])
    builder.write("/etc/passwd", (f"root:x:0:0:root:/root:/usr/sbin/nologin\n"
                                  f"student:x:{builder.uid}:{builder.gid}:student:/tmp:/usr/sbin/nologin\n"
                                  "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n").encode())
    builder.write("/etc/group", f"root:x:0:\nstudent:x:{builder.gid}:\nnogroup:x:65534:\n".encode())
    builder.write("/etc/hosts", b"127.0.0.1 localhost\n::1 localhost\n")


def _dev(builder: ViewBuilder, cuda: bool, shm_mb: int) -> None:
    builder.makedirs("/dev")
    _mount("tmpfs", builder.at("/dev"), "tmpfs", MS_NOSUID, "size=64k,mode=0755")
    names = list(DEVICES)
    if cuda:
        names += [n for n in sorted(os.listdir("/dev")) if n.startswith("nvidia")]
    for name in names:
        host = f"/dev/{name}"
        if os.path.isdir(host):
            builder.makedirs(host)
            _mount(host, builder.at(host), None, MS_BIND | MS_REC)
        elif os.path.exists(host) and stat.S_ISCHR(os.stat(host).st_mode):
            os.close(os.open(builder.at(host), os.O_WRONLY | os.O_CREAT, 0o666))
            _mount(host, builder.at(host), None, MS_BIND)
    for link, to in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                     ("stderr", "/proc/self/fd/2")):
        os.symlink(to, builder.at(f"/dev/{link}"))
    builder.makedirs("/dev/shm")
    _mount("tmpfs", builder.at("/dev/shm"), "tmpfs", MS_NOSUID | MS_NODEV, f"size={shm_mb}m,mode=1777")


def _pivot(new_root: str) -> None:
    """Make `new_root` the root; the old root is detached entirely. chroot where pivot_root is not
    available (the worker holds no privilege, so a chroot is as good a wall for it)."""
    number = _PIVOT_ROOT.get(platform.machine())
    old = os.path.join(new_root, ".old-root")
    os.mkdir(old, 0o700)
    if number is not None and _libc.syscall(number, new_root.encode(), old.encode()) == 0:
        os.chdir("/")
        if _libc.umount2(b"/.old-root", MNT_DETACH) != 0:
            err = ctypes.get_errno()
            raise ViewError(err, f"cannot detach the old root: {os.strerror(err)}")
        os.rmdir("/.old-root")
        return
    os.rmdir(old)
    os.chroot(new_root)
    os.chdir("/")


def build(*, uid: int, gid: int, course_root: str, masks: list[str], module_fd: int, module_name: str,
          scratch_mb: int, shm_mb: int, cuda: bool, max_module_bytes: int = 16 << 20) -> list[str]:
    """Build the view and pivot into it. Must run in a fresh mount namespace, before dropping
    privileges. Returns warnings for parts of the view that could not be had."""
    import grader

    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    grader_dir = os.path.normpath(os.path.dirname(grader.__file__))
    course_root = os.path.normpath(course_root) if course_root else "/nonexistent-course-root"
    masks = sorted({os.path.normpath(m) for m in [course_root, os.path.join(grader_dir, "hidden"), *masks] if m},
                   key=lambda p: p.count("/"))
    paths = needed_paths() + [f"/etc/{n}" for n in ETC_FILES if os.path.lexists(f"/etc/{n}")]
    # Open every host path now: the new root is mounted over /tmp below, which may hide some of them.
    held: dict[str, int] = {}
    for p in paths:
        if os.path.islink(p) and p in SYSTEM_DIRS:
            continue  # /bin -> usr/bin: recreated as the same symlink
        try:
            held[p] = os.open(p, O_PATH | os.O_CLOEXEC)
        except OSError:
            continue
    module = b""
    while len(module) <= max_module_bytes:
        chunk = os.read(module_fd, 1 << 20)
        if not chunk:
            break
        module += chunk
    os.close(module_fd)

    new_root = "/tmp"
    _mount("tmpfs", new_root, "tmpfs", MS_NOSUID | MS_NODEV, f"size={scratch_mb}m,mode=0755")
    builder = ViewBuilder(new_root, uid, gid)
    for p in SYSTEM_DIRS:
        if os.path.islink(p):
            os.symlink(os.readlink(p), builder.at(p))
    # Binds and masks, shallowest first: a mask hides what a bind above it showed, and the allowed
    # paths inside a mask (the grader package inside the course checkout, a virtual environment in
    # it) are bound again on top of the mask.
    items = sorted([(p, "bind") for p in held if not p.startswith("/etc/")] + [(m, "mask") for m in masks],
                   key=lambda item: (item[0].count("/"), item[1] == "bind"))
    hidden = os.path.join(grader_dir, "hidden")
    prefix = os.path.normpath(sys.prefix)

    def allowed_inside_mask(path: str) -> bool:
        # the grader package, or the Python environment (a virtual environment inside the checkout)
        return ((_inside(path, grader_dir) or _inside(path, prefix)) and not _inside(path, hidden)
                and not _inside(course_root, path))

    for path, kind in items:
        if kind == "mask":
            if builder.visible(path):
                builder.mask(path)
            continue
        if path not in SYSTEM_DIRS and _inside(course_root, path):
            continue  # a folder holding the checkout (and its neighbours): never shown whole
        if any(_inside(path, m) for m in masks) and not allowed_inside_mask(path):
            continue
        if builder.visible(path):
            continue
        builder.bind(path, held[path])
    _etc(builder, held)
    for fd in held.values():
        os.close(fd)
    _dev(builder, cuda, shm_mb)
    builder.makedirs("/proc")
    builder.makedirs("/sys")
    try:  # sysfs (devices, for CUDA and the CPU topology), read-only; alone where the kernel allows
        try:
            _mount("/sys", builder.at("/sys"), None, MS_BIND)
        except OSError:  # inside a user namespace, sysfs's submounts are locked to it
            _mount("/sys", builder.at("/sys"), None, MS_BIND | MS_REC)
        for point in [builder.at("/sys"), *_mounts_below(builder.at("/sys"))]:
            _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | _locked_flags(point))
    except OSError as exc:
        builder.warnings.append(f"no /sys for the worker ({exc})")
    builder.write(f"{SUBMISSION_DIR}/{module_name}", module[:max_module_bytes])
    os.chmod(builder.at(SUBMISSION_DIR), 0o555)
    builder.makedirs(SCRATCH_DIR)  # may exist already: a virtual environment under /tmp is bound there
    os.chown(builder.at(SCRATCH_DIR), uid, gid)
    os.chmod(builder.at(SCRATCH_DIR), 0o700)
    # A /proc of the worker's own PID namespace (it sees its own processes only), mounted while the
    # host's /proc is still in view: inside a user namespace the kernel allows a new proc only then.
    try:
        _mount("proc", builder.at("/proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError as exc:
        builder.warnings.append(f"no private /proc for the worker ({exc}); it runs without /proc")
    builder.seal()
    _pivot(new_root)
    os.chdir(SCRATCH_DIR)
    return builder.warnings

