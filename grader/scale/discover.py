"""Finding the submissions of a folder: one per sub-folder or archive, named by the student's id.

An id names a result file, so it must be one: `safe_id` keeps the student's own name where it can and
gives a stable hashed id where it cannot (reserved, too long, not printable, or another entry's but for
letter case). Two entries that claim one id, and symbolic links, are reported, never graded.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from grader.course import Course
from grader.scale.errors import BatchError
from grader.scale.summary import SUMMARY_FILE
from grader.submission import SubmissionError, locate, raw_digest

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".zip", ".tar")
RESERVED_IDS = {Path(SUMMARY_FILE).stem}


@dataclass(frozen=True)
class Entry:
    id: str
    path: Path


def submission_id(path: Path) -> str:
    """The id of the submission at `path`: its name without an archive suffix, made safe to be a file
    name in the results folder (see `safe_id`)."""
    return safe_id(_natural_id(path))


def _natural_id(path: Path) -> str:
    name = path.name
    if path.is_file():
        for suffix in ARCHIVE_SUFFIXES:
            if name.lower().endswith(suffix) and len(name) > len(suffix):
                return name[: -len(suffix)]
        return path.stem or name
    return name


# A result is RESULTS_DIR/<id>.json, written through a temporary ".<id>.json.XXXXXXXX" beside it: an id
# of at most this many bytes keeps both within the 255 bytes most file systems allow in one name.
MAX_ID_BYTES = 200


def safe_id(natural: str) -> str:
    """`natural` itself where it can name a result file; otherwise a stable id that can, made of its
    first printable characters, "~" and 12 hex digits of its hash. That covers an id the batch keeps for
    itself ("summary", in any case: a case-insensitive file system would mix the two files up), one too
    long for a file name, and one whose bytes are not text (or hold control characters). Grading one
    student must never depend on another's choice of name, and never stop the batch."""
    raw = natural.encode("utf-8", "surrogateescape")
    printable = natural.isprintable() and not any(0xD800 <= ord(c) <= 0xDFFF for c in natural)
    if printable and len(raw) <= MAX_ID_BYTES and natural.lower() not in RESERVED_IDS and natural:
        return natural
    return _hashed_id(natural)


def _hashed_id(natural: str) -> str:
    raw = natural.encode("utf-8", "surrogateescape")
    head = "".join(c for c in natural if c.isprintable() and not 0xD800 <= ord(c) <= 0xDFFF)
    while len(head.encode()) > 96:
        head = head[:-1]
    return f"{head}~{hashlib.sha256(raw).hexdigest()[:12]}"


def hidden_entries(folder: Path) -> list[str]:
    """Names in `folder` that are not submissions: dot files and macOS's "__MACOSX" archive folders."""
    return sorted(p.name for p in Path(folder).iterdir() if p.name.startswith((".", "__MACOSX")))


def discover(folder: Path) -> tuple[list[Entry], dict[str, list[Path]]]:
    """The submissions in `folder`, by id; and the ids that cannot be graded (id -> paths): claimed by
    more than one entry, or a symbolic link (never followed: it could point at the course's solutions)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise BatchError(f"expected a folder of submissions at {folder}, found "
                         f"{'a file' if folder.exists() else 'nothing'} there")
    by_id: dict[str, list[Path]] = {}
    for path in sorted(folder.iterdir()):
        if path.name.startswith((".", "__MACOSX")):
            continue
        by_id.setdefault(submission_id(path), []).append(path)
    # Ids that differ only in letter case ("Bob", "bob") would share one result file on a case-insensitive file
    # system (macOS, Windows): each gets its hash, as an unusable name does.
    folded: dict[str, list[str]] = {}
    for i in by_id:
        folded.setdefault(i.casefold(), []).append(i)
    for group in (g for g in folded.values() if len(g) > 1):
        for i in group:
            by_id.setdefault(_hashed_id(i), []).extend(by_id.pop(i))
    entries = [Entry(i, paths[0]) for i, paths in sorted(by_id.items())]
    conflicts = {i: paths for i, paths in by_id.items() if len(paths) > 1 or any(p.is_symlink() for p in paths)}
    return entries, conflicts


def describe_entries(folder: Path, entries: list[Entry]) -> list[str]:
    """Lines for the console about entries graded under another name, and names that are not graded."""
    lines = [f"{e.path.name!r} is graded as {e.id!r} (its own name cannot name a result file: reserved, "
             f"too long, not printable, or another entry's but for letter case)" for e in entries
             if e.id != _natural_id(e.path)]
    hidden = hidden_entries(folder)
    if hidden:
        shown = ", ".join(repr(n) for n in hidden[:5]) + (f" and {len(hidden) - 5} more" if len(hidden) > 5 else "")
        lines.append(f"not submissions, skipped: {shown} (names starting with '.' or '__MACOSX'; rename to grade)")
    return lines


def content_fingerprint(course: Course, entry: Entry, exercise_ids: list[str]) -> tuple[str | None, str | None]:
    """(the submission hash a result graded now would record, a key for the state file).

    A readable submission: its hash, exactly as the runner computes it. An unreadable one records
    an empty hash, so the key holds the hash of the archive's bytes (replacing a bad archive with
    another bad archive is noticed), or for a folder the hash of the reason it was refused (a folder
    changed so that it reads, or fails otherwise, is noticed). (None, None) if even that fails: grade
    it and see.

    Bounded like the grade itself: `locate` refuses any archive within its limits (count, sizes,
    ratio, headers) without unpacking more than they allow, and the raw hash reads at most
    `submission.RAW_HASH_BYTES` of a plain file (never a FIFO or a link). Never raises: a submission
    it cannot fingerprint is graded, and the grade says what is wrong with it.
    """
    try:
        sub = locate(course, entry.path, exercise_ids, entry.id)
    except SubmissionError as exc:
        raw = raw_digest(entry.path)
        if raw is not None:
            return "", "raw:" + raw
        # A folder: its reason stands for it (the same reason, the same not-gradable result).
        return "", "refused:" + hashlib.sha256(str(exc).encode("utf-8", "surrogateescape")).hexdigest()
    except Exception:  # noqa: BLE001 -- whatever else went wrong (the machine, a bug) shows when it is graded
        return None, None
    sub.cleanup()
    return sub.sha256, sub.sha256

