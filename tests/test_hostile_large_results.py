"""A submission that returns a large, wrong value: the grade's messages format it in bounded space.

The hidden tests run in the grader's own pytest process, and a student's call may return up to the
reply limit (max_result_mb) of any shape. tests/hostile/huge_wrong_result.py, handed in as
moe_router.py, returns a routing whose tokens_per_expert runs on for 25 million entries (100 MB of
float32) past the E it should hold; everything else about the routing is valid. Before the messages
went through grader.testing.show (and the routing's shapes were checked first), the capacity check
formatted that tensor with .tolist() in its message. Measured on this machine with 10 million entries
(40 MB): the grader's pytest process peaked at 1424 MB before, 370 MB after (252 MB with no large
reply at all); at the reply limit the old messages would need tens of GB.

The test grades it and watches the grader's pytest process from the outside (its peak resident set,
VmHWM in /proc, sampled while it runs): the grade must finish, score 0 on the check, say what is
wrong with the shape, and the process must stay within what decoding the reply itself costs.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import checks_of, grade_folder

HOSTILE = Path(__file__).parent / "hostile"
PADDING_MB = 100  # tokens_per_expert's extra entries, float32 (tests/hostile/huge_wrong_result.py)
# The grader's pytest process: torch and the course (about 250 MB here), a reply while it is received
# and decoded (about 3x its size: 200 MB padding gave a peak of 828 MB), and slack. Formatting the
# padding with tolist() alone would add some 800 MB of float objects and list, and str() of it 300 MB.
MAX_GRADER_RSS_MB = 900


def grader_processes() -> list[int]:
    """The processes that run the grade's pytest (one per exercise): this process's children when started cold,
    the fork server's when warm (grader/forkserver.py)."""
    from grader.runner import warm_server_pids

    servers = warm_server_pids()
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid in servers or (ppid == os.getpid() and b"--grader-events" in Path(entry.path, "cmdline").read_bytes()):
                pids.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue  # the process ended while it was read
    return pids


def peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class PeakWatcher:
    """Samples the peak resident set of the grade's pytest processes every 20 ms while a grade runs."""

    def __init__(self) -> None:
        self.peaks: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in grader_processes():
                peak = peak_rss_mb(pid)
                if peak is not None:
                    self.peaks[pid] = max(peak, self.peaks.get(pid, 0.0))
            time.sleep(0.02)

    def __enter__(self) -> "PeakWatcher":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.slow  # about 30 s: the capacity check's tests through the sandbox
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the grader's memory from /proc")
def test_a_large_wrong_result_is_formatted_in_bounded_space(tmp_path):
    folder = tmp_path / "huge_wrong_result"
    folder.mkdir()
    (folder / "moe_router.py").write_text((HOSTILE / "huge_wrong_result.py").read_text())
    started = time.perf_counter()
    with PeakWatcher() as watcher:
        result = grade_folder(folder, ["moe_router"], checks=["capacity"], call_timeout_s=60)
    seconds = time.perf_counter() - started
    assert result["state"] == "complete", f"the grade must finish: {result.get('state')}"
    capacity = checks_of(result, "moe_router")["capacity"]
    assert capacity["points"] == 0, f"nothing in the capacity check is earned: {capacity}"
    route_tests = [t for t in capacity["tests"] if "route_uses_that_capacity" in t.get("name", t.get("id", ""))]
    assert route_tests and all(t["status"] == "failed" for t in route_tests), capacity["tests"]
    for test in route_tests:
        assert "routing.tokens_per_expert has shape (25000008,), expected (8,)" in test["message"], test["message"][:500]
        assert len(test["message"]) < 2000, f"a message of {len(test['message'])} characters"
    assert watcher.peaks, "the grade's pytest process was never seen"
    peak = max(watcher.peaks.values())
    assert peak < MAX_GRADER_RSS_MB, (
        f"the grader's pytest process peaked at {peak:.0f} MB (bound {MAX_GRADER_RSS_MB} MB) grading a submission "
        f"that returns {PADDING_MB} MB it should not; the grade took {seconds:.1f} s"
    )
