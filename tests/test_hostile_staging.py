"""Staging against hostile submissions (tests/hostile/staging.py builds them): links anywhere on the path
to a graded file, hard links, FIFOs, and archives built to exhaust time, memory or disk. Each must be
refused with a message naming what was found, in bounded time, by `locate` (the trusted grader) and by
the batch's pre-scan (`content_fingerprint`) alike; none may be graded from what it points at."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from grader import results
from grader.scale.discover import Entry, content_fingerprint
from grader.submission import MAX_MEMBERS, SubmissionError, locate
from tests.conftest import COURSE, ROOT, grade_folder
from tests.hostile import staging as H

EXERCISES = [H.EXERCISE]
SOLUTION = ROOT / "solutions" / H.EXERCISE / H.FILE
BOUND_S = 5.0  # generous, so that a loaded machine does not flake: each of these takes well under 0.2 s here


def refuse(path: Path, *fragments: str) -> str:
    """`locate` refuses `path` with a message holding every fragment, within BOUND_S; the message."""
    started = time.perf_counter()
    with pytest.raises(SubmissionError) as caught:
        sub = locate(COURSE, path, EXERCISES)
        sub.cleanup()
    elapsed = time.perf_counter() - started
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, f"expected {fragment!r} in the refusal, found {message!r}"
    assert elapsed < BOUND_S, f"refusing {path.name} took {elapsed:.2f} s; expected well under {BOUND_S} s"
    return message


def prescan_is_bounded(path: Path) -> None:
    """The batch's pre-scan of `path` ends quickly, records no submission hash, and never hangs."""
    answer: list = []
    worker = threading.Thread(target=lambda: answer.append(content_fingerprint(COURSE, Entry("x", path), EXERCISES)),
                              daemon=True)
    started = time.perf_counter()
    worker.start()
    worker.join(BOUND_S)
    elapsed = time.perf_counter() - started
    assert not worker.is_alive(), f"the batch's pre-scan of {path.name} was still running after {BOUND_S} s"
    assert answer and answer[0][0] in ("", None), f"expected no submission hash for {path.name}, found {answer}"
    assert elapsed < BOUND_S


# ---------------------------------------------------------------------------------------------
# folders


def test_an_exercise_folder_linked_to_the_solution_is_refused_not_graded(tmp_path):
    sub = H.exercise_folder_linked_to_the_solution(tmp_path, ROOT)
    refuse(sub, "'exercises/online_softmax' in the submission", "expected a folder, found a symlink",
           str(ROOT / "solutions" / H.EXERCISE))
    result = grade_folder(sub, EXERCISES, tests="public")
    results.validate(result)
    assert result["gradable"] is False and result["score"] == 0, "a link to the solution must not earn its marks"
    assert "symlink" in result["format_errors"][0]
    prescan_is_bounded(sub)


def test_a_linked_submission_root_is_refused(tmp_path):
    refuse(H.linked_root(tmp_path), "expected a folder or an archive, found a symlink", "real-folder")


def test_a_link_in_the_middle_of_the_path_is_refused(tmp_path):
    refuse(H.link_in_the_middle(tmp_path), "'exercises' in the submission", "found a symlink", "elsewhere")


def test_a_linked_file_is_refused(tmp_path):
    refuse(H.linked_file(tmp_path, SOLUTION), "'online_softmax.py' in the submission: expected a regular file, "
                                              "found a symlink", "links are refused")


def test_a_hard_link_to_a_file_outside_is_refused(tmp_path):
    sub = H.hard_link_to_a_file_outside(tmp_path, SOLUTION.read_bytes())
    refuse(sub, "'online_softmax.py' in the submission: expected a file with one name, found a hard link",
           "one of 2 names")


def test_a_fifo_named_like_the_exercise_file_is_refused_without_blocking(tmp_path):
    sub = H.fifo_named_like_the_file(tmp_path)
    refuse(sub, "'online_softmax.py' in the submission: expected a regular file, found a FIFO")
    prescan_is_bounded(sub)


def test_a_fifo_named_like_an_archive_is_refused_without_blocking(tmp_path):
    path = H.fifo_named_like_an_archive(tmp_path)
    refuse(path, "expected a folder or an archive, found a FIFO")
    prescan_is_bounded(path)


def test_the_same_files_stage_from_a_plain_folder_and_a_plain_archive(tmp_path):
    """The rules refuse what they must and nothing else: honest forms of the same submission stage."""
    folder = tmp_path / "plain" / "exercises" / H.EXERCISE
    folder.mkdir(parents=True)
    (folder / H.FILE).write_bytes(H.SOURCE)
    for source in (tmp_path / "plain", H.plain_tar_gz(tmp_path)):
        sub = locate(COURSE, source, EXERCISES)
        try:
            assert sub.files[H.EXERCISE].read_bytes() == H.SOURCE
        finally:
            sub.cleanup()


# ---------------------------------------------------------------------------------------------
# archives


def test_two_million_tar_headers_are_refused_in_bounded_time_and_memory(tmp_path):
    import tracemalloc

    path = H.many_headers_tar_gz(tmp_path)
    assert path.stat().st_size < 8 << 20
    tracemalloc.start()
    try:
        refuse(path, f"archive has more than {MAX_MEMBERS} members")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, f"refusing it took {peak >> 20} MiB of Python memory; expected a few"
    prescan_is_bounded(path)


@pytest.mark.parametrize("entries,declared,zip64,fragment", [
    (200_000, None, False, "archive has 65535 members, more than the 2000 allowed"),
    (200_000, None, True, "archive has 200000 members, more than the 2000 allowed"),
    (200_000, 10, False, "central directory is 9400000 bytes; expected at most"),
    (80_000, 10, False, "more than 2000 members in its central directory"),
])
def test_a_zip_with_a_huge_central_directory_is_refused_before_zipfile_reads_it(tmp_path, entries, declared, zip64,
                                                                                fragment):
    path = H.huge_central_directory_zip(tmp_path, entries, declared, zip64)
    refuse(path, fragment)
    prescan_is_bounded(path)


@pytest.mark.parametrize("build", [H.gzip_bomb_tar_gz, H.zip_bomb], ids=["tar.gz", "zip"])
def test_compression_bombs_are_refused_before_they_unpack(tmp_path, build):
    path = build(tmp_path)
    refuse(path, "times its own size", "compression bomb")
    prescan_is_bounded(path)


@pytest.mark.parametrize("build,fragments", [
    (H.pax_header_bomb_tar, ["extended header", "expected at most 64 KiB"]),
    (H.pax_header_run_tar, ["more than 8 extended headers in a row"]),
    (H.sparse_map_bomb_tar, ["sparse file"]),
    (H.deep_path_tar, ["is 41 levels deep; expected at most 32"]),
    (H.long_name_tar, ["has a name part of 300 bytes; expected at most 255"]),
    (H.long_path_tar, ["has a name of 1229 bytes; expected at most 1024"]),
    (H.linked_member_zip, ["'online_softmax.py' is a link or special file"]),
    (H.many_gzip_members, ["more than 4096 gzip streams one after another"]),
], ids=["pax-bomb", "pax-run", "sparse-map", "deep", "long-part", "long-path", "zip-symlink", "gzip-members"])
def test_hostile_archive_members_are_refused(tmp_path, build, fragments):
    path = build(tmp_path)
    refuse(path, *fragments)
    prescan_is_bounded(path)


def test_a_linked_member_to_the_solution_is_refused_like_the_linked_folder(tmp_path):
    """The archive form of the first folder test: the same link, the same outcome."""
    path = H.linked_member_tar(tmp_path, ROOT)
    refuse(path, "archive member 'exercises/online_softmax' is a link")
    result = grade_folder(path, EXERCISES, tests="public")
    assert result["gradable"] is False and result["score"] == 0
