"""Find an exercise's file in whatever a student handed in, safely.

Accepted layouts (the first that matches wins, per exercise):

* a folder laid out like the course: ``<sub>/exercises/<id>/<file>`` or ``<sub>/<id>/<file>``;
* a folder of flat files, as Gradescope uploads them: ``<sub>/<file>``;
* a ``.zip``, ``.tar``, ``.tar.gz``/``.tgz`` archive of either, possibly with one top-level folder.

Archives are unpacked by hand, member by member, into a fresh folder: absolute paths, ``..``,
links, device files and oversize or over-numerous members are refused with a clear message, so
nothing is ever written outside that folder.
"""

from __future__ import annotations

import hashlib
import shutil
import stat
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from grader.course import Course

MAX_MEMBERS = 2000
MAX_TOTAL_BYTES = 64 << 20
MAX_FILE_BYTES = 16 << 20


class SubmissionError(ValueError):
    """The submission cannot be graded at all (a bad archive, nothing found)."""


@dataclass
class Submission:
    id: str
    source: Path
    files: dict[str, Path]  # exercise id -> the student's file (inside `folder`)
    folder: Path  # a private copy holding exactly the graded files, flat
    sha256: str
    notes: list[str] = field(default_factory=list)

    def cleanup(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _safe_member(name: str) -> PurePosixPath:
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or name.startswith(("/", "\\")) or ".." in path.parts or (path.parts and ":" in path.parts[0]):
        raise SubmissionError(f"archive member {name!r} points outside the archive (absolute path or '..'); refused")
    return path


def _extract_zip(archive: Path, dest: Path) -> None:
    with zipfile.ZipFile(archive) as zf:
        members = zf.infolist()
        if len(members) > MAX_MEMBERS:
            raise SubmissionError(f"archive has {len(members)} members, more than the {MAX_MEMBERS} allowed")
        total = 0
        for info in members:
            rel = _safe_member(info.filename)
            mode = (info.external_attr >> 16) & 0o170000
            if mode and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise SubmissionError(f"archive member {info.filename!r} is a link or special file; refused")
            if info.is_dir():
                (dest / rel).mkdir(parents=True, exist_ok=True)
                continue
            total += info.file_size
            if info.file_size > MAX_FILE_BYTES or total > MAX_TOTAL_BYTES:
                raise SubmissionError(f"archive unpacks to more than {MAX_TOTAL_BYTES >> 20} MiB; refused")
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as out:
                out.write(src.read(MAX_FILE_BYTES + 1)[:MAX_FILE_BYTES])


def _extract_tar(archive: Path, dest: Path) -> None:
    with tarfile.open(archive) as tf:
        members = tf.getmembers()
        if len(members) > MAX_MEMBERS:
            raise SubmissionError(f"archive has {len(members)} members, more than the {MAX_MEMBERS} allowed")
        total = 0
        for m in members:
            rel = _safe_member(m.name)
            if m.isdir():
                (dest / rel).mkdir(parents=True, exist_ok=True)
                continue
            if not m.isfile():
                kind = "link" if (m.issym() or m.islnk()) else "special file"
                raise SubmissionError(f"archive member {m.name!r} is a {kind}; refused")
            total += m.size
            if m.size > MAX_FILE_BYTES or total > MAX_TOTAL_BYTES:
                raise SubmissionError(f"archive unpacks to more than {MAX_TOTAL_BYTES >> 20} MiB; refused")
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tf.extractfile(m)
            if src is None:
                raise SubmissionError(f"archive member {m.name!r} cannot be read")
            with src, open(target, "wb") as out:
                out.write(src.read())


def unpack(archive: Path, dest: Path) -> Path:
    name = archive.name.lower()
    try:
        if name.endswith(".zip"):
            _extract_zip(archive, dest)
        elif name.endswith((".tar", ".tar.gz", ".tgz")):
            _extract_tar(archive, dest)
        else:
            raise SubmissionError(f"expected a folder, .zip, .tar or .tar.gz, found {archive.name!r}")
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as exc:
        raise SubmissionError(f"{archive.name}: not a readable archive ({exc})") from None
    entries = [p for p in dest.iterdir() if not p.name.startswith((".", "__MACOSX"))]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else dest


def _candidates(root: Path, exercise_id: str, filename: str) -> list[Path]:
    return [root / "exercises" / exercise_id / filename, root / exercise_id / filename, root / filename]


def locate(course: Course, source: Path, only: list[str] | None = None, submission_id: str | None = None) -> Submission:
    """Stage a submission: copy each exercise's file into a private flat folder."""
    source = Path(source)
    if not source.exists():
        raise SubmissionError(f"no submission at {source}")
    folder = Path(tempfile.mkdtemp(prefix="grader-submission-"))
    try:
        root = source
        if source.is_file():
            root = unpack(source, Path(tempfile.mkdtemp(prefix="unpacked-", dir=folder)))
        files: dict[str, Path] = {}
        digest = hashlib.sha256()
        for exercise in course.exercises:
            if only and exercise.id not in only:
                continue
            for candidate in _candidates(root, exercise.id, exercise.file):
                if candidate.is_file() and not candidate.is_symlink():
                    staged = folder / "files" / exercise.file
                    staged.parent.mkdir(parents=True, exist_ok=True)
                    data = candidate.read_bytes()[:MAX_FILE_BYTES]
                    staged.write_bytes(data)
                    digest.update(exercise.id.encode() + b"\0" + data + b"\0")
                    files[exercise.id] = staged
                    break
        sub_id = submission_id or (source.stem if source.is_file() else source.resolve().name)
        return Submission(sub_id, source, files, folder, digest.hexdigest())
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
