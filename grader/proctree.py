"""A process and everything it started: list the tree from /proc, and kill all of it.

The batch's lanes, the container entry point and the project's leftover-process checks use these; a
grade's own processes are killed by process group and PID namespace (grader/harness/launch.py).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _wait_stopped(pid: int, timeout_s: float = 1.0) -> None:
    """Until `pid` is stopped (or gone), at most `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state in ("T", "t", "Z", "X"):
            return
        time.sleep(0.001)


def kill_tree(pid: int) -> None:
    """Kill `pid` and everything it started, including processes in sessions of their own.

    Each process is stopped before its children are listed, so none can fork or be orphaned away
    while the tree is walked; then all are killed.
    """
    if not Path("/proc/self/stat").exists():  # not Linux: the process group is the best we have
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return
    stopped: list[int] = []
    frontier = [pid]
    for _ in range(100):
        for p in frontier:
            try:
                os.kill(p, signal.SIGSTOP)
                stopped.append(p)
            except (ProcessLookupError, PermissionError):
                pass
        for p in frontier:  # SIGSTOP lands asynchronously: one still finishing a fork would add a child unseen
            _wait_stopped(p)
        frontier = [p for p in descendants(pid) if p not in stopped]
        if not frontier:
            break
    for p in stopped:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
