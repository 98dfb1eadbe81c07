"""A control group per worker: one memory and process budget for the worker and all it starts.

RLIMIT_AS caps each process's address space, and RLIMIT_NPROC the number of processes, so a worker
that forks could hold N times its memory limit. A cgroup counts them together: the worker's memory
limit (course.yaml ``worker.memory_mb``) and its process cap (``worker.processes``) bound the whole
tree, and the kernel's OOM killer stays inside it. On CUDA hosts, where RLIMIT_AS cannot be used, it is
the only memory bound on the CPU side.

As root, the trusted side creates the group (below its own, so limits that bind the grader bind the
worker too), the launcher moves itself in before it runs anything of the student's, and the group is
removed when the worker is gone. cgroup v2 and v1 (memory and pids controllers, and cpu where the host
has it: one CPU weight for the whole tree) are both handled;
where neither can be had (a container with a read-only /sys/fs/cgroup), the grade goes on and the
result's warnings say so.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PREFIX = "llm-lab-worker-"
TAG = re.compile(r"[a-z0-9_]{1,32}")  # a grade's tag (runner.py: its private folder's random suffix)


# The cpu controller gives the worker and everything it starts one share of the CPU, as much as any other
# group beside it: without it a worker that splits into many sessions (setsid spinners) took a classmate's
# grade in the same batch from 90 to 59.5 points by the exercise's time limit. Used where the host has it.
OPTIONAL = ("cpu",)


class CgroupError(OSError):
    """No control group could be made for the worker."""


def _own_path(controller: str | None) -> str:
    """This process's cgroup path in the v2 hierarchy (controller None) or in a v1 controller's."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (controller is None and controllers == "") or (controller and controller in controllers.split(",")):
            return path
    raise CgroupError(f"this process is in no {controller or 'v2'} cgroup")


def _own_folder(controller: str | None) -> Path:
    """The folder of this process's own cgroup (v2 if controller is None, else that v1 controller's).

    /proc/self/cgroup names the group from the root of the hierarchy, but a container or a cgroup
    namespace mounts only a subtree: the mount's root (in /proc/self/mountinfo) is cut off first.
    """
    own = _own_path(controller)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        fields, (fstype, _source, options) = before.split(), (after.split() + ["", "", ""])[:3]
        if (controller is None and fstype != "cgroup2") or (controller and (
                fstype != "cgroup" or controller not in options.split(","))):
            continue
        mount_root, mountpoint = fields[3], fields[4]
        if own == mount_root or own.startswith(mount_root.rstrip("/") + "/"):
            return Path(mountpoint) / own[len(mount_root.rstrip("/")):].lstrip("/")
    base = ROOT if controller is None else ROOT / controller
    return base / own.lstrip("/")


def memory_limit_mb() -> int | None:
    """The memory this process and everything it starts may use, in MiB: the tightest of its cgroup's limit
    (and every parent's: a Gradescope container's 768 MiB binds all it runs) and the machine's RAM; None where
    it cannot be read."""
    limits: list[int] = []
    for controller, name in ((None, "memory.max"), ("memory", "memory.limit_in_bytes")):
        try:
            folder = _own_folder(controller)
        except (CgroupError, OSError, ValueError):
            continue
        for level in [folder, *folder.parents]:
            try:
                text = (level / name).read_text().strip()
            except OSError:
                continue
            if text.isdigit() and int(text) < 1 << 60:  # "max", or v1's 2**63 - 4096 for no limit
                limits.append(int(text) >> 20)
            if level == ROOT or level == ROOT / "memory":
                break
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                limits.append(int(line.split()[1]) >> 10)
    except (OSError, ValueError, IndexError):
        pass
    return min(limits) if limits else None


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


class WorkerGroup:
    """The cgroup(s) of one worker: made by `create`, joined by the launcher, removed by `remove`."""

    def __init__(self, folders: list[Path]):
        self.folders = folders

    @property
    def procs_files(self) -> list[str]:
        """The files the launcher writes its pid to (one per hierarchy)."""
        return [str(f / "cgroup.procs") for f in self.folders]

    @classmethod
    def create(cls, memory_mb: int, processes: int, tag: str | None = None) -> "WorkerGroup":
        """The worker's groups, named ``llm-lab-worker-<tag>-<random>``: `tag` names the grade, whose
        runner removes every group of its tag once the grade's pytest has ended, however it ended (`reap`)."""
        if os.geteuid() != 0:
            raise CgroupError("only root makes cgroups for the workers here")
        if tag is not None and not TAG.fullmatch(tag):
            raise CgroupError(f"expected a grade tag of 1-32 characters a-z, 0-9 or _, found {tag!r}")
        name = f"{PREFIX}{tag + '-' if tag else ''}{secrets.token_hex(6)}"
        if (ROOT / "cgroup.controllers").exists():  # cgroup v2, unified
            return cls([_create_v2(name, memory_mb, processes)])
        folders = []
        try:
            for controller, settings in (("memory", {"memory.limit_in_bytes": str(memory_mb << 20)}),
                                         ("pids", {"pids.max": str(processes)}),
                                         ("cpu", {"cpu.shares": "1024"})):
                base = ROOT / controller
                if controller in OPTIONAL and not base.is_dir():
                    continue
                if not base.is_dir():
                    raise CgroupError(f"no {controller} controller at {base}")
                folder = _own_folder(controller) / name
                folder.mkdir(mode=0o755)
                folders.append(folder)
                for key, value in settings.items():
                    _write(folder / key, value)
                if controller == "memory" and (folder / "memory.memsw.limit_in_bytes").exists():
                    _write(folder / "memory.memsw.limit_in_bytes", str(memory_mb << 20))  # no way out through swap
        except OSError as exc:
            cls(folders).remove()
            raise CgroupError(f"cannot make the worker's cgroup ({exc})") from None
        return cls(folders)

    def remove(self, timeout_s: float = 10.0) -> None:
        """Remove the groups; waits for the kernel to let the last (killed) processes go."""
        deadline = time.monotonic() + timeout_s
        for folder in reversed(self.folders):
            while True:
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.02)
        self.folders = []


def _parents() -> list[Path]:
    """Every folder a worker's group can be made in: this process's own group (v2, and each v1
    controller's) and the hierarchies' roots."""
    found: list[Path] = []
    if (ROOT / "cgroup.controllers").exists():
        candidates: list[tuple[str | None, Path]] = [(None, ROOT)]
    else:
        candidates = [(c, ROOT / c) for c in ("memory", "pids", *OPTIONAL)]
    for controller, top in candidates:
        folders = [top]
        try:
            folders.append(_own_folder(controller))
        except (OSError, CgroupError, ValueError):
            pass
        for folder in folders:
            if folder.is_dir() and folder.resolve() not in found:
                found.append(folder.resolve())
    return found


def reap(tag: str, timeout_s: float = 10.0) -> list[Path]:
    """Remove every worker group of the grade `tag`, killing whatever is still in one first. The trusted
    pytest removes its worker's groups itself, but a pytest that is killed (the exercise's time limit, the
    OOM killer) cannot, and its groups stayed behind for good; the runner, which outlives it, calls this."""
    if os.geteuid() != 0 or not TAG.fullmatch(tag):
        return []
    removed = []
    for parent in _parents():
        try:
            groups = [p for p in parent.iterdir() if p.name.startswith(f"{PREFIX}{tag}-") and p.is_dir()]
        except OSError:
            continue
        for group in groups:
            try:
                for pid in (group / "cgroup.procs").read_text().split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (OSError, ValueError):
                        pass
            except OSError:
                pass
            holder = WorkerGroup([group])
            holder.remove(timeout_s)
            if not group.exists():
                removed.append(group)
    return removed


def _create_v2(name: str, memory_mb: int, processes: int) -> Path:
    own = _own_folder(None)
    for parent in (own, ROOT):  # below our own group where the kernel allows, else at the top
        try:
            controllers = set((parent / "cgroup.subtree_control").read_text().split())
            missing = {"memory", "pids"} - controllers
            if missing:
                _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(missing)))
            if "cpu" not in controllers and "cpu" in (parent / "cgroup.controllers").read_text().split():
                try:  # optional: one CPU weight for the worker's whole tree
                    _write(parent / "cgroup.subtree_control", "+cpu")
                except OSError:
                    pass
            folder = parent / name
            folder.mkdir(mode=0o755)
        except OSError:
            continue
        try:
            _write(folder / "memory.max", str(memory_mb << 20))
            if (folder / "memory.swap.max").exists():
                _write(folder / "memory.swap.max", "0")
            _write(folder / "pids.max", str(processes))
        except OSError as exc:
            folder.rmdir()
            raise CgroupError(f"cannot set the worker's cgroup limits ({exc})") from None
        return folder
    raise CgroupError("cannot make a cgroup v2 group with the memory and pids controllers")
