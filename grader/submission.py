"""Find an exercise's file in whatever a student handed in, safely.

Accepted layouts (the first that matches wins, per exercise):

* a folder laid out like the course: ``<sub>/exercises/<id>/<file>`` or ``<sub>/<id>/<file>``;
* a folder of flat files, as Gradescope uploads them: ``<sub>/<file>``;
* a ``.zip``, ``.tar``, ``.tar.gz``/``.tgz`` archive of either, possibly with one top-level folder.

What is refused, with a message naming the path and what was found there (the whole submission is then
ungradable, never graded from something else):

* in a folder: a symlink at any step of the path to a graded file, the submission itself included (each
  step is opened relative to the last with ``O_NOFOLLOW``, so nothing is followed, even if the folder
  changes while it is read); a graded file with more than one hard link (it may be another file, a
  solution, under a second name); a FIFO, device or socket where a file or folder would be; a file
  over `MAX_FILE_BYTES`. The bytes staged are read from the very descriptor that was checked.
* in an archive, read member by member and never as a whole list: an absolute path or ``..``; a link
  or special member anywhere; more than `MAX_MEMBERS` members; a file over `MAX_FILE_BYTES`, more
  than `MAX_TOTAL_BYTES` in all, or more than `MAX_RATIO` times the archive's own size (above
  `RATIO_FLOOR_BYTES`); a path deeper than `MAX_DEPTH`, a name part over `MAX_NAME_BYTES` or a whole
  name over `MAX_PATH_BYTES`. A tar is streamed through a reader that counts the decompressed bytes
  and stops past its cap, so headers (pax, GNU long names) and gzip bombs are bounded too; a zip's
  end-of-central-directory record is parsed here, and its central directory walked, before
  `zipfile` reads it. Every limit is checked while reading, so any archive is refused in time and
  memory bounded by the limits, not by what the archive claims.

Members are unpacked into a fresh private folder, and the graded files are then staged from it by the
same code that reads a folder.

A Jupyter notebook ``<id>.ipynb`` (or ``<file stem>.ipynb``) stands for ``<file>`` in any of these layouts
when no ``<file>`` is found for the exercise (``<file>`` wins, with a warning naming the notebook): its code
cells become the module staged, scratch cells left out, nothing executed (grader/notebook.py). A notebook
that cannot become a module (not a notebook, a syntax error, a shell or magic line, none of the contract's
names) is refused like any other unreadable file, with the cell named.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import shutil
import stat
import struct
import tarfile
import tempfile
import zipfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, BinaryIO, Callable, Iterator

from grader.course import Course, Exercise
from grader.notebook import NotebookError, build_module, contract_names, notebook_names

MAX_MEMBERS = 2000  # entries of an archive, folders included
MAX_TOTAL_BYTES = 64 << 20  # the files of an archive, unpacked
MAX_FILE_BYTES = 16 << 20  # one file, in a folder or an archive
MAX_ARCHIVE_BYTES = 64 << 20  # the archive file itself
MAX_RATIO = 100  # unpacked bytes per byte of archive ...
RATIO_FLOOR_BYTES = 8 << 20  # ... checked only above this much: a small archive of plain text may unpack far more
MAX_DEPTH = 32  # folders in a member's path
MAX_NAME_BYTES = 255  # one part of a path (UTF-8), as most file systems allow
MAX_PATH_BYTES = 1024  # a whole member name (UTF-8)
MAX_META_BYTES = 64 << 10  # one pax header or GNU long name
MAX_META_RUN = 8  # such headers in a row before one member
TAR_OVERHEAD_BYTES = 8 << 10  # headers and padding a tar stream may carry per member, beyond its files
MAX_CENTRAL_DIRECTORY_BYTES = MAX_MEMBERS * 2048  # a zip's table of contents
MAX_GZIP_MEMBERS = 4096  # gzip streams one after another in one file (bgzip writes one per 64 KiB)
RAW_HASH_BYTES = MAX_ARCHIVE_BYTES  # what `raw_digest` reads of an unreadable submission

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_CHUNK = 1 << 16


class SubmissionError(ValueError):
    """The submission cannot be graded at all (a bad archive, a link, nothing found)."""


class StagingFault(RuntimeError):
    """The grading machine failed while it read a submission (its disk full, out of memory or file
    descriptors, an I/O error): an error of the grade, to be done again, never the student's fault."""


# An OSError with one of these says the machine is short of something or broken, whatever file it was
# reading or writing: never a property of the student's material.
MACHINE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.ENOMEM, errno.EMFILE, errno.ENFILE, errno.EIO,
                            errno.EROFS})


@contextmanager
def student_material(what: str) -> Iterator[None]:
    """Read the student's material inside this block. Whatever it raises, of any type, is the
    material's: a SubmissionError that names `what` and the exception ("not gradable", that student
    alone). The exceptions are the machine's own failures (`MACHINE_ERRNOS`, MemoryError), which become
    a StagingFault, and KeyboardInterrupt or SystemExit, which pass. Archive, notebook and codec
    libraries raise many types; none is listed, so a new one cannot escape as a crash of the batch."""
    try:
        yield
    except (SubmissionError, StagingFault):
        raise
    except MemoryError:
        raise StagingFault(f"{what}: the grading machine ran out of memory") from None
    except OSError as exc:
        if exc.errno in MACHINE_ERRNOS:
            raise StagingFault(f"{what}: the grading machine failed ({exc.strerror or exc})") from None
        raise SubmissionError(f"{what} ({exc.strerror or type(exc).__name__})") from None
    except Exception as exc:
        detail = str(exc).strip()[:200]
        raise SubmissionError(f"{what} ({type(exc).__name__}{': ' + detail if detail else ''})") from None


@dataclass
class Submission:
    id: str
    source: Path
    files: dict[str, Path]  # exercise id -> the student's file (inside `folder`)
    folder: Path  # a private copy holding exactly the graded files, flat
    sha256: str
    notes: list[str] = field(default_factory=list)
    nested_archives: list[str] = field(default_factory=list)  # archives inside it (never unpacked): named when nothing is found

    def cleanup(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Reading a folder without following anything


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"), (stat.S_ISREG, "a file")):
        if test(mode):
            return name
    return f"a file of unknown type (mode {mode:o})"


def _found(dir_fd: int | None, name: str | Path) -> str:
    """What is at `name` (relative to `dir_fd`), without following it: 'a symlink (to ...)', 'a FIFO', ..."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        return f"nothing readable ({exc.strerror})"
    if not stat.S_ISLNK(st.st_mode):
        return _kind(st.st_mode)
    try:
        target = os.readlink(name, dir_fd=dir_fd)
    except OSError:
        return "a symlink"
    return f"a symlink (to {target[:200]!r})"


def _refuse(shown: str, expected: str, found: str) -> SubmissionError:
    why = "links are refused: hand in the file itself" if "symlink" in found else "refused"
    return SubmissionError(f"{shown!r} in the submission: expected {expected}, found {found}; {why}")


def _open_dir(name: str, dir_fd: int, shown: str) -> int | None:
    """A folder of the submission, opened without following a link; None when there is none there."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None
        found = _found(dir_fd, name)
        if exc.errno == errno.ENOTDIR and found == "a file":
            return None  # a file where this layout wants a folder: not this layout
        raise _refuse(shown, "a folder", found if found != "a folder" else f"a folder it cannot open ({exc.strerror})") from None


def _read_file(name: str, dir_fd: int, shown: str) -> bytes | None:
    """The bytes of a plain file of the submission, read from the descriptor that was checked; None
    when there is nothing (or a folder) at `name`."""
    try:
        before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(before.st_mode):
        return None
    if not stat.S_ISREG(before.st_mode):  # never open a FIFO or a device: opening alone can block or act
        raise _refuse(shown, "a regular file", _found(dir_fd, name))
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise _refuse(shown, "a regular file", _found(dir_fd, name) if exc.errno == errno.ELOOP
                      else f"a file it cannot open ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise _refuse(shown, "a regular file", f"{_kind(st.st_mode)} put there while it was being read")
        if st.st_nlink > 1:
            raise _refuse(shown, "a file with one name",
                          f"a hard link (one of {st.st_nlink} names of the same file, so possibly another "
                          f"file seen under a second name); hand in a copy instead")
        if st.st_size > MAX_FILE_BYTES:
            raise SubmissionError(f"{shown!r} in the submission is {st.st_size} bytes; expected at most "
                                  f"{MAX_FILE_BYTES >> 20} MiB per file; refused")
        data = _read_at_most(fd, MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise SubmissionError(f"{shown!r} in the submission grew past {MAX_FILE_BYTES >> 20} MiB while it was "
                                  f"read; refused")
        return data
    finally:
        os.close(fd)


def _read_at_most(fd: int, limit: int) -> bytes:
    parts, got = [], 0
    while got < limit:
        block = os.read(fd, min(_CHUNK << 4, limit - got))
        if not block:
            break
        parts.append(block)
        got += len(block)
    return b"".join(parts)


def read_candidate(root_fd: int, parts: tuple[str, ...]) -> bytes | None:
    """The bytes of ``root/parts...``: each folder on the way opened relative to the last, never
    following a link. None when the path leads nowhere; SubmissionError when it leads through or to
    something that cannot be trusted, or cannot be read."""
    with student_material(f"{'/'.join(parts)!r} in the submission cannot be read"):
        return _read_candidate(root_fd, parts)


def _read_candidate(root_fd: int, parts: tuple[str, ...]) -> bytes | None:
    opened: list[int] = []
    try:
        fd = root_fd
        for depth, name in enumerate(parts[:-1], 1):
            step = _open_dir(name, fd, "/".join(parts[:depth]))
            if step is None:
                return None
            opened.append(step)
            fd = step
        return _read_file(parts[-1], fd, "/".join(parts))
    finally:
        for step in opened:
            os.close(step)


def _open_source(source: Path) -> tuple[int, os.stat_result]:
    """The submission itself (a folder or an archive), opened without following a link."""
    try:
        st = os.lstat(source)
    except FileNotFoundError:
        raise SubmissionError(f"no submission at {source}: expected a folder or an archive, found nothing") from None
    except OSError as exc:
        raise SubmissionError(f"cannot read the submission at {source}: {exc.strerror}") from None
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        raise SubmissionError(f"the submission {str(source)!r}: expected a folder or an archive, found "
                              f"{_found(None, source)}; "
                              + ("links are refused: hand in the folder or archive itself" if stat.S_ISLNK(st.st_mode)
                                 else "refused"))
    try:
        fd = os.open(source, _DIR_FLAGS if stat.S_ISDIR(st.st_mode) else _FILE_FLAGS)
    except OSError as exc:
        raise SubmissionError(f"the submission {str(source)!r}: expected a folder or an archive, found "
                              f"{_found(None, source) if exc.errno == errno.ELOOP else exc.strerror}; refused") from None
    now = os.fstat(fd)
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise SubmissionError(f"the submission {str(source)!r} was replaced while it was being read; refused")
    return fd, now


# ---------------------------------------------------------------------------------------------
# Archives: member by member, every limit checked while reading


def _member_path(name: str) -> PurePosixPath:
    """A member's name as a relative path inside the archive, or SubmissionError saying what is wrong."""
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or name.startswith(("/", "\\")) or ".." in path.parts or (path.parts and ":" in path.parts[0]):
        raise SubmissionError(f"archive member {name!r} points outside the archive (absolute path or '..'); refused")
    encoded = name.encode("utf-8", "surrogateescape")
    if len(encoded) > MAX_PATH_BYTES:
        raise SubmissionError(f"archive member {name[:80]!r}... has a name of {len(encoded)} bytes; expected at most "
                              f"{MAX_PATH_BYTES}; refused")
    if len(path.parts) > MAX_DEPTH:
        raise SubmissionError(f"archive member {name[:120]!r} is {len(path.parts)} levels deep; expected at most "
                              f"{MAX_DEPTH}; refused")
    for part in path.parts:
        size = len(part.encode("utf-8", "surrogateescape"))
        if size > MAX_NAME_BYTES:
            raise SubmissionError(f"archive member {name[:120]!r} has a name part of {size} bytes; expected at most "
                                  f"{MAX_NAME_BYTES}; refused")
    return path


class _Unpacker:
    """Checks every member of one archive against the limits, and writes into `dest` the files that
    could be graded (named like an exercise's file, wherever they lie; None: every file)."""

    def __init__(self, dest: Path, archive_bytes: int, wanted: set[str] | None):
        self.dest = dest
        self.wanted = wanted
        self.members = 0
        self.total = 0
        self.budget = max(RATIO_FLOOR_BYTES, MAX_RATIO * archive_bytes)
        self.seen: dict[PurePosixPath, bool] = {}  # path -> is a folder

    def count(self) -> None:
        self.members += 1
        if self.members > MAX_MEMBERS:
            raise SubmissionError(f"archive has more than {MAX_MEMBERS} members (found at least {self.members}); "
                                  f"expected at most {MAX_MEMBERS}; refused")

    def folder(self, name: str) -> None:
        rel = _member_path(name)
        if not rel.parts:
            return
        self._claim(rel, name, is_dir=True)

    def file(self, name: str, size: int, open_member: Callable[[], IO[bytes] | None]) -> None:
        """One file member of `size` bytes, as the archive declares it; `open_member()` gives its bytes."""
        rel = _member_path(name)
        if not rel.parts:
            raise SubmissionError(f"archive member {name!r} has no name; refused")
        if not 0 <= size <= MAX_FILE_BYTES:
            raise SubmissionError(f"archive member {name!r} is {size} bytes; expected at most "
                                  f"{MAX_FILE_BYTES >> 20} MiB per file; refused")
        self.add_bytes(size)
        self._claim(rel, name, is_dir=False)
        if self.wanted is not None and rel.name not in self.wanted:
            return  # checked and counted; never graded, so never written
        src = open_member()
        if src is None:
            raise SubmissionError(f"archive member {name!r} cannot be read")
        target = self.dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with src, open(fd, "wb") as out:
            left = size
            while left > 0:
                block = src.read(min(_CHUNK, left))
                if not block:
                    raise SubmissionError(f"archive member {name!r} ends before its declared {size} bytes; "
                                          f"not a readable archive")
                out.write(block[:left])
                left -= len(block)

    def add_bytes(self, size: int) -> None:
        self.total += size
        if self.total > MAX_TOTAL_BYTES:
            raise SubmissionError(f"archive unpacks to more than {MAX_TOTAL_BYTES >> 20} MiB; expected at most that; "
                                  f"refused")
        if self.total > self.budget:
            raise SubmissionError(_ratio_message(self.budget))

    def _claim(self, rel: PurePosixPath, name: str, is_dir: bool) -> None:
        for parent in list(rel.parents)[:-1]:
            if self.seen.get(parent) is False:
                raise SubmissionError(f"archive member {name!r} lies inside {str(parent)!r}, which the archive also "
                                      f"holds as a file; refused")
            self.seen.setdefault(parent, True)
        before = self.seen.get(rel)
        if before is not None and not (before and is_dir):
            raise SubmissionError(f"archive member {name!r} appears more than once; expected each path once; refused")
        self.seen[rel] = is_dir

    def root(self) -> Path:
        """The folder that holds the submission: `dest`, or the archive's one top-level folder."""
        tops = [p for p in self.seen if len(p.parts) == 1 and not p.name.startswith((".", "__MACOSX"))]
        if len(tops) == 1 and self.seen[tops[0]]:
            (self.dest / tops[0]).mkdir(exist_ok=True)
            return self.dest / tops[0]
        return self.dest


def _ratio_message(budget: int) -> str:
    return (f"archive unpacks to more than {MAX_RATIO} times its own size (more than {budget >> 20} MiB here: a "
            f"compression bomb?); expected at most that; refused")


class _TarStream:
    """The tar bytes of an archive, decompressing gzip when the archive starts with its magic number;
    SubmissionError as soon as more than `cap` decompressed bytes are asked for."""

    def __init__(self, raw: BinaryIO, archive_bytes: int):
        self.raw = raw
        self.read_raw = 0
        head = raw.read(2)
        self.read_raw += len(head)
        self.pending = head
        self.gzip = head == b"\x1f\x8b"
        self.z = zlib.decompressobj(16 + zlib.MAX_WBITS) if self.gzip else None
        self.gzip_members = 1
        self.count = 0
        self.size_cap = MAX_TOTAL_BYTES + (MAX_MEMBERS + 1) * TAR_OVERHEAD_BYTES
        self.ratio_cap = max(RATIO_FLOOR_BYTES, MAX_RATIO * archive_bytes)

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.size_cap + 1
        data = self._more(n)
        self.count += len(data)
        if self.count > self.size_cap:
            raise SubmissionError(f"archive unpacks to more than {self.size_cap >> 20} MiB of tar data; expected "
                                  f"at most {MAX_TOTAL_BYTES >> 20} MiB of files and their headers; refused")
        if self.gzip and self.count > self.ratio_cap:
            raise SubmissionError(_ratio_message(self.ratio_cap))
        return data

    def _raw(self) -> bytes:
        block = self.raw.read(_CHUNK)
        self.read_raw += len(block)
        if self.read_raw > MAX_ARCHIVE_BYTES:
            raise SubmissionError(f"archive grew past {MAX_ARCHIVE_BYTES >> 20} MiB while it was read; refused")
        return block

    def _more(self, n: int) -> bytes:
        while True:
            if not self.pending:
                self.pending = self._raw()
                if not self.pending:
                    if self.z is not None and not self.z.eof:
                        raise SubmissionError("not a readable archive (the gzip stream ends early)")
                    return b""
            if self.z is None:
                data, self.pending = self.pending[:n], self.pending[n:]
                return data
            if self.z.eof:  # another gzip member may follow (concatenated files); zeros may pad the end
                self.pending = self.pending.lstrip(b"\0")
                if not self.pending:
                    continue
                self.gzip_members += 1
                if self.gzip_members > MAX_GZIP_MEMBERS:
                    raise SubmissionError(f"archive is more than {MAX_GZIP_MEMBERS} gzip streams one after another; "
                                          f"expected one (or a few); refused")
                self.z = zlib.decompressobj(16 + zlib.MAX_WBITS)
            data = self.z.decompress(self.pending, n)
            self.pending = self.z.unused_data if self.z.eof else self.z.unconsumed_tail
            if data:
                return data


_META_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
               tarfile.GNUTYPE_LONGLINK)


class _BoundedTarInfo(tarfile.TarInfo):
    """Refuses an oversize pax header or GNU long name, and long runs of them, before tarfile reads them
    (tarfile reads such a header whole, and follows a run of them by recursion); refuses sparse files
    before tarfile reads their maps (``_proc_member`` is tarfile's documented hook for subclasses)."""

    def _proc_member(self, tf):
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise SubmissionError(f"archive member {self.name!r} is a sparse file; expected only files and folders; "
                                  f"refused")
        if self.type in _META_TYPES:
            if self.size > MAX_META_BYTES:
                raise SubmissionError(f"archive has a {self.size}-byte extended header; expected at most "
                                      f"{MAX_META_BYTES >> 10} KiB; refused")
            run = getattr(tf, "_grader_meta_run", 0) + 1
            if run > MAX_META_RUN:
                raise SubmissionError(f"archive has more than {MAX_META_RUN} extended headers in a row; refused")
            tf._grader_meta_run = run
        else:
            tf._grader_meta_run = 0
        return super()._proc_member(tf)

    def _refuse_sparse(self, *args):
        raise SubmissionError("archive holds a sparse file (pax GNU.sparse headers); expected only files and folders; "
                              "refused")

    # pax headers that describe a sparse file: refused before their map (which can be huge) is read
    _proc_gnusparse_00 = _proc_gnusparse_01 = _proc_gnusparse_10 = _refuse_sparse


def _unpack_tar(raw: BinaryIO, size: int, out: _Unpacker) -> None:
    stream = _TarStream(raw, size)
    with tarfile.open(fileobj=stream, mode="r|", tarinfo=_BoundedTarInfo) as tf:  # type: ignore[call-overload]  # "r|" only calls read()
        while True:
            m = tf.next()
            if m is None:
                return
            out.count()
            tf.members.clear()  # stream mode keeps every member seen; nothing here needs them
            if m.isdir():
                out.folder(m.name)
            elif m.type == tarfile.GNUTYPE_SPARSE or m.sparse is not None:
                raise SubmissionError(f"archive member {m.name!r} is a sparse file; refused")
            elif m.isfile():
                out.file(m.name, m.size, lambda: tf.extractfile(m))
            else:
                _member_path(m.name)
                kind = "link" if (m.issym() or m.islnk()) else "special file"
                raise SubmissionError(f"archive member {m.name!r} is a {kind}; expected only files and folders; refused")


def _zip_directory(f: BinaryIO, size: int) -> None:
    """Check the zip's table of contents before zipfile reads it: where the end-of-central-directory
    record says it is (zip64 too, found as zipfile finds it), how big it is, how many entries it holds."""
    if size < 22:
        raise SubmissionError("not a readable archive (too short for a zip)")
    f.seek(size - 22)
    tail = f.read(22)
    if tail[:4] == b"PK\x05\x06" and tail[-2:] == b"\0\0":
        eocd_at, record = size - 22, tail
    else:
        start = max(size - (1 << 16) - 22, 0)
        f.seek(start)
        data = f.read()
        found = data.rfind(b"PK\x05\x06")
        if found < 0 or len(data) - found < 22:
            raise SubmissionError("not a readable archive (no zip end-of-central-directory record)")
        eocd_at, record = start + found, data[found:found + 22]
    _, _, _, entries_here, entries, cd_size, cd_offset, _ = struct.unpack("<4s4H2LH", record)
    cd_end = eocd_at
    if eocd_at >= 20:
        f.seek(eocd_at - 20)
        locator = f.read(20)
        if locator[:4] == b"PK\x06\x07" and eocd_at >= 76:
            f.seek(eocd_at - 76)
            zip64 = f.read(56)
            if zip64[:4] == b"PK\x06\x06":
                (_, _, _, _, _, _, entries_here, entries, cd_size, cd_offset) = struct.unpack("<4sQ2H2L4Q", zip64)
                cd_end = eocd_at - 76
    declared = max(entries, entries_here)
    if declared > MAX_MEMBERS:
        raise SubmissionError(f"archive has {declared} members, more than the {MAX_MEMBERS} allowed; refused")
    if cd_size > MAX_CENTRAL_DIRECTORY_BYTES or cd_size > cd_end:
        raise SubmissionError(f"archive's central directory is {cd_size} bytes; expected at most "
                              f"{min(MAX_CENTRAL_DIRECTORY_BYTES, cd_end)} for {MAX_MEMBERS} members; refused")
    f.seek(cd_end - cd_size)
    table = f.read(cd_size)
    pos = found_entries = 0
    while pos + 46 <= len(table) and table[pos:pos + 4] == b"PK\x01\x02":
        name_len, extra_len, comment_len = struct.unpack_from("<3H", table, pos + 28)
        pos += 46 + name_len + extra_len + comment_len
        found_entries += 1
        if found_entries > MAX_MEMBERS:
            raise SubmissionError(f"archive has more than {MAX_MEMBERS} members in its central directory; refused")


class _GuardedFile(io.BufferedReader):
    """The archive as zipfile sees it: no single read may ask for more than a central directory's worth."""

    LIMIT = MAX_CENTRAL_DIRECTORY_BYTES + (1 << 16) + 64

    def read(self, n: int | None = -1) -> bytes:
        if n is None or n < 0 or n > self.LIMIT:
            here = self.tell()
            end = self.seek(0, io.SEEK_END)
            self.seek(here)
            if min(end - here, n if n is not None and n >= 0 else end) > self.LIMIT:
                raise SubmissionError(f"archive asks for a read of more than {self.LIMIT >> 20} MiB at once (an "
                                      f"oversize central directory); refused")
        return super().read(n)


def _unpack_zip(raw: BinaryIO, size: int, out: _Unpacker) -> None:
    _zip_directory(raw, size)
    raw.seek(0)
    with zipfile.ZipFile(raw) as zf:
        members = zf.infolist()
        if len(members) > MAX_MEMBERS:  # checked above already; zipfile may find another record than we did
            raise SubmissionError(f"archive has {len(members)} members, more than the {MAX_MEMBERS} allowed; refused")
        for info in members:
            out.count()
            mode = (info.external_attr >> 16) & 0o170000
            if mode and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                _member_path(info.filename)
                raise SubmissionError(f"archive member {info.filename!r} is a link or special file; expected only "
                                      f"files and folders; refused")
            if info.is_dir():
                out.folder(info.filename)
                continue
            if info.flag_bits & 0x1:
                raise SubmissionError(f"archive member {info.filename!r} is encrypted; expected a plain archive; refused")
            out.file(info.filename, info.file_size, lambda: zf.open(info))


ARCHIVE_NAMES = (".zip", ".tar", ".tar.gz", ".tgz")


def unpack(archive: Path, dest: Path, wanted: set[str] | None = None, nested: list[str] | None = None) -> Path:
    """Unpack `archive` (.zip, .tar, .tar.gz/.tgz) into the empty folder `dest`, within every limit above:
    every member is checked, the files named in `wanted` (None: all) are written. Returns the folder that
    holds the submission: `dest`, or the archive's one top-level folder. `nested`, when given, receives the
    names of the archives inside it (an archive is unpacked once: those are never opened)."""
    name = archive.name.lower()
    if not name.endswith((".zip", ".tar", ".tar.gz", ".tgz")):
        raise SubmissionError(f"expected a folder, .zip, .tar or .tar.gz, found {archive.name!r}")
    fd, st = _open_source(archive)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise SubmissionError(f"the submission {str(archive)!r}: expected an archive file, found {_kind(st.st_mode)}; "
                              f"refused")
    with _GuardedFile(io.FileIO(fd, "r", closefd=True)) as raw:
        if st.st_size > MAX_ARCHIVE_BYTES:
            raise SubmissionError(f"{archive.name} is {st.st_size} bytes; expected an archive of at most "
                                  f"{MAX_ARCHIVE_BYTES >> 20} MiB; refused")
        out = _Unpacker(dest, st.st_size, wanted)
        try:
            with student_material(f"{archive.name}: not a readable archive"):
                if name.endswith(".zip"):
                    _unpack_zip(raw, st.st_size, out)
                else:
                    _unpack_tar(raw, st.st_size, out)
        except SubmissionError as exc:  # the reason names the archive, whoever raised it
            if archive.name in str(exc):
                raise
            raise SubmissionError(f"{archive.name}: {exc}") from None
    if nested is not None:
        nested.extend(str(p) for p, is_dir in out.seen.items() if not is_dir and p.name.lower().endswith(ARCHIVE_NAMES))
    return out.root()


# ---------------------------------------------------------------------------------------------
# Staging


def _candidates(exercise_id: str, filename: str) -> list[tuple[str, ...]]:
    return [("exercises", exercise_id, filename), (exercise_id, filename), (filename,)]


def _notebook_candidates(exercise: Exercise) -> list[tuple[str, ...]]:
    """Where a notebook for the exercise may lie, layout by layout as for its file, each name in turn."""
    per_name = [_candidates(exercise.id, name) for name in notebook_names(exercise.id, exercise.file)]
    return [paths[layout] for layout in range(len(per_name[0])) for paths in per_name]


def _contract(root: Path | None, exercise: Exercise) -> list[str] | None:
    """The names the exercise's stub (``exercises/<id>/<file>`` of the course) defines; None when it is not there."""
    if root is None:
        here = Path(__file__).resolve().parent.parent
        root = here if (here / "course.yaml").is_file() else None
    if root is None:
        return None
    try:
        return contract_names((root / "exercises" / exercise.id / exercise.file).read_text()) or None
    except (OSError, SyntaxError, ValueError):
        return None


def _from_notebook(root: Path | None, exercise: Exercise, parts: tuple[str, ...], data: bytes) -> tuple[bytes, list[str]]:
    """The module a notebook of the submission stands for, as bytes, and notes; SubmissionError if it cannot be built."""
    shown = "/".join(parts)
    contract = _contract(root, exercise)
    with student_material(f"{shown!r} in the submission (the notebook for {exercise.id}) cannot be read"):
        try:
            source, notes = build_module(data, parts[-1], contract)
            built = source.encode("utf-8")
        except NotebookError as exc:
            raise SubmissionError(f"{shown!r} in the submission (the notebook for {exercise.id}): {exc}; refused") from None
        except UnicodeEncodeError:
            raise SubmissionError(f"{shown!r} in the submission (the notebook for {exercise.id}): expected text, found "
                                  f"a cell with characters that are not valid Unicode (lone surrogates); refused") from None
    return built, [f"{exercise.id}: graded the code cells of {shown} as {exercise.file} (a line number in a message "
                   f"counts in that file, where each cell follows a '# cell N' line)"] + [
        f"{exercise.id}: {note}" for note in notes]


def _archives_in(dir_fd: int) -> list[str]:
    """The archives among a folder's first `MAX_MEMBERS` entries (bounded: a folder may hold any number)."""
    found = []
    with os.scandir(dir_fd) as entries:
        for n, entry in enumerate(entries):
            if n >= MAX_MEMBERS:
                break
            if entry.name.lower().endswith(ARCHIVE_NAMES):
                found.append(entry.name)
    return sorted(found)


def locate(course: Course, source: Path, only: list[str] | None = None, submission_id: str | None = None,
           tmp_dir: str | Path | None = None, root: Path | None = None) -> Submission:
    """Stage a submission: copy each exercise's file into a private flat folder (inside `tmp_dir`,
    the grade's own folder, when given). `root`: the course's folder, whose stubs name each exercise's
    contract for a notebook (None: the course this grader package lies in)."""
    source = Path(source)
    fd, st = _open_source(source)
    folder = Path(tempfile.mkdtemp(prefix="grader-submission-", dir=tmp_dir))
    try:
        unpacked = None
        nested: list[str] = []
        if stat.S_ISREG(st.st_mode):
            os.close(fd)
            unpacked = Path(tempfile.mkdtemp(prefix="unpacked-", dir=folder))
            wanted = {name for e in course.exercises if not only or e.id in only
                      for name in (e.file, *notebook_names(e.id, e.file))}
            fd = os.open(unpack(source, unpacked, wanted, nested), _DIR_FLAGS)
        else:
            with student_material(f"the submission {str(source)!r} cannot be listed"):
                nested = _archives_in(fd)
        files: dict[str, Path] = {}
        notes: list[str] = []
        digest = hashlib.sha256()
        try:
            for exercise in course.exercises:
                if only and exercise.id not in only:
                    continue
                found = [(parts, data) for parts in _candidates(exercise.id, exercise.file)
                         if (data := read_candidate(fd, parts)) is not None]
                notebooks = [(parts, data) for parts in _notebook_candidates(exercise)
                             if (data := read_candidate(fd, parts)) is not None]
                if not found and not notebooks:
                    continue
                parts, data = found[0] if found else notebooks[0]
                others = found[1:] + notebooks if found else notebooks[1:]
                if others:  # say which one was graded: the instructor may be reading another
                    notes.append(f"{exercise.id}: graded {'/'.join(parts)}; also found "
                                 + ", ".join("/".join(p) for p, _ in others) + " (not graded"
                                 + ("; a .py is graded before a notebook" if found and notebooks else "") + ")")
                if not found:
                    data, built_notes = _from_notebook(root, exercise, parts, data)
                    notes.extend(built_notes)
                staged = folder / "files" / exercise.file
                staged.parent.mkdir(parents=True, exist_ok=True)
                staged.write_bytes(data)
                digest.update(exercise.id.encode() + b"\0" + data + b"\0")
                files[exercise.id] = staged
        finally:
            os.close(fd)
        if unpacked is not None:
            shutil.rmtree(unpacked, ignore_errors=True)
        sub_id = submission_id or (source.stem if stat.S_ISREG(st.st_mode) else source.resolve().name)
        return Submission(sub_id, source, files, folder, digest.hexdigest(), notes, nested)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def raw_digest(path: Path) -> str | None:
    """A key for the bytes of a submission that cannot be graded (a bad archive): the SHA-256 of its first
    `RAW_HASH_BYTES` and its size. None when it is not a plain file (a folder, a link, a FIFO: never opened)."""
    try:
        fd = os.open(path, _FILE_FLAGS)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        digest = hashlib.sha256()
        data_read = 0
        while data_read < RAW_HASH_BYTES:
            block = os.read(fd, min(1 << 20, RAW_HASH_BYTES - data_read))
            if not block:
                break
            digest.update(block)
            data_read += len(block)
        return digest.hexdigest() if data_read == st.st_size else f"{digest.hexdigest()}+{st.st_size}"
    except OSError:
        return None
    finally:
        os.close(fd)
