"""Builders of hostile submissions for staging (tests/test_hostile_staging.py): folders that reach
outside themselves through links, special files, and archives built to exhaust the grader's time,
memory or disk before a single test runs. Each builder writes into a folder it is given and returns
the path to hand in. Archives are written header by header, quickly, without the tools that would
refuse to build them."""

from __future__ import annotations

import io
import os
import struct
import tarfile
import zipfile
import zlib
from pathlib import Path

EXERCISE = "online_softmax"
FILE = f"{EXERCISE}.py"
SOURCE = b"def online_softmax(x, block_size=1024):\n    raise NotImplementedError\n"


def _folder(at: Path) -> Path:
    at.mkdir(parents=True, exist_ok=True)
    return at


# ---------------------------------------------------------------------------------------------
# Folders


def exercise_folder_linked_to_the_solution(at: Path, root: Path) -> Path:
    """exercises/<id> is a symlink to solutions/<id>: graded from the link, it would earn full marks."""
    sub = _folder(at / "linked-exercise")
    _folder(sub / "exercises")
    (sub / "exercises" / EXERCISE).symlink_to(root / "solutions" / EXERCISE, target_is_directory=True)
    return sub


def linked_root(at: Path) -> Path:
    """The submission itself is a symlink to a folder holding a plain, honest file."""
    real = _folder(at / "real-folder")
    (real / FILE).write_bytes(SOURCE)
    link = at / "linked-root"
    link.symlink_to(real, target_is_directory=True)
    return link


def link_in_the_middle(at: Path) -> Path:
    """exercises/ itself is a symlink to a folder elsewhere that holds <id>/<file>."""
    elsewhere = _folder(at / "elsewhere" / EXERCISE)
    (elsewhere / FILE).write_bytes(SOURCE)
    sub = _folder(at / "linked-middle")
    (sub / "exercises").symlink_to(at / "elsewhere", target_is_directory=True)
    return sub


def linked_file(at: Path, target: Path) -> Path:
    """The flat file is a symlink (to `target`, say the solution)."""
    sub = _folder(at / "linked-file")
    (sub / FILE).symlink_to(target)
    return sub


def hard_link_to_a_file_outside(at: Path, outside: bytes) -> Path:
    """The flat file is a second name of a file outside the submission (a copy of the solution, say)."""
    secret = _folder(at / "outside") / "secret.py"
    secret.write_bytes(outside)
    sub = _folder(at / "hard-linked")
    os.link(secret, sub / FILE)
    return sub


def fifo_named_like_the_file(at: Path) -> Path:
    """A FIFO where the exercise file would be: opening it for reading blocks until someone writes."""
    sub = _folder(at / "fifo")
    os.mkfifo(sub / FILE)
    return sub


def fifo_named_like_an_archive(at: Path) -> Path:
    """The submission itself is a FIFO called <id>.tar.gz (in a batch's folder of submissions)."""
    path = _folder(at) / "mallory.tar.gz"
    os.mkfifo(path)
    return path


# ---------------------------------------------------------------------------------------------
# Tar archives


def _header(name: str, size: int = 0, kind: bytes = tarfile.REGTYPE, fmt: int = tarfile.USTAR_FORMAT) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    return info.tobuf(fmt)


def _pad(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 512)


def many_headers_tar_gz(at: Path, headers: int = 2_000_000, distinct: int = 10_000) -> Path:
    """A .tar.gz of `headers` empty members: the first `distinct` named f000000, f000001, ..., the rest
    repeating one name. Written as `headers / distinct` concatenated gzip members (a valid .tar.gz: gzip
    files may be concatenated), each compressed once, so building it takes well under a second."""
    path = _folder(at) / "many-headers.tar.gz"
    first = b"".join(_header(f"f{i:06d}") for i in range(distinct))
    rest = _header("same") * distinct
    gz = lambda data: zlib.compress(data, 9, wbits=16 + zlib.MAX_WBITS)
    first_gz, rest_gz = gz(first), gz(rest)
    with open(path, "wb") as f:
        f.write(first_gz)
        for _ in range(headers // distinct - 1):
            f.write(rest_gz)
        f.write(gz(b"\0" * 1024))  # the end-of-archive blocks
    return path


def gzip_bomb_tar_gz(at: Path, members: int = 5, size: int = 16 << 20) -> Path:
    """A tiny .tar.gz whose `members` files of zeros (each at the per-file limit) unpack to 80 MiB."""
    path = _folder(at) / "gzip-bomb.tar.gz"
    zeros = b"\0" * size
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    with open(path, "wb") as f:
        for i in range(members):
            f.write(z.compress(_header(f"zeros{i}.bin", size)))
            f.write(z.compress(zeros))
        f.write(z.compress(b"\0" * 1024))
        f.write(z.flush())
    return path


def many_gzip_members(at: Path, members: int = 1_000_000) -> Path:
    """A .tar.gz of `members` empty gzip streams one after another (20 MB): each one costs a decompressor."""
    path = _folder(at) / "many-gzip-members.tar.gz"
    path.write_bytes(zlib.compress(b"", 9, wbits=16 + zlib.MAX_WBITS) * members)
    return path


def tar_with(at: Path, name: str, members: list[tuple[bytes, bytes]]) -> Path:
    """A plain .tar of raw (header, data) pairs, then the end-of-archive blocks."""
    path = _folder(at) / name
    path.write_bytes(b"".join(h + _pad(d) for h, d in members) + b"\0" * 1024)
    return path


def pax_header_bomb_tar(at: Path, size: int = 4 << 20) -> Path:
    """A pax extended header of `size` bytes of tiny records before one member: tarfile would read it
    whole and parse every record."""
    record = b"9 a=1234\n"  # "<length> <key>=<value>\n", length counting itself
    body = record * (size // len(record))
    return tar_with(at, "pax-bomb.tar", [(_header("././@PaxHeader", len(body), tarfile.XHDTYPE), body),
                                         (_header(FILE, len(SOURCE)), SOURCE)])


def pax_header_run_tar(at: Path, run: int = 5000) -> Path:
    """A run of `run` small pax headers in a row before one member (tarfile follows them by recursion)."""
    body = b"15 comment=abc\n"
    pax = _header("././@PaxHeader", len(body), tarfile.XHDTYPE) + _pad(body)
    path = _folder(at) / "pax-run.tar"
    path.write_bytes(pax * run + _header(FILE, len(SOURCE)) + _pad(SOURCE) + b"\0" * 1024)
    return path


def sparse_map_bomb_tar(at: Path) -> Path:
    """A pax 1.0 sparse file whose map claims 10**9 regions: tarfile would read (and keep) the map."""
    body = b"".join(_pax_record(k, v) for k, v in (("GNU.sparse.major", "1"), ("GNU.sparse.minor", "0"),
                                                     ("GNU.sparse.name", FILE), ("GNU.sparse.realsize", "10")))
    sparse_map = b"1000000000\n" + b"0\n1\n" * 20000
    return tar_with(at, "sparse.tar", [(_header("././@PaxHeader", len(body), tarfile.XHDTYPE), body),
                                       (_header("GNUSparseFile.0/x", len(sparse_map)), sparse_map)])


def _pax_record(key: str, value: str) -> bytes:
    payload = f" {key}={value}\n".encode()
    n = len(payload) + 1
    while len(str(n)) + len(payload) != n:
        n += 1
    return str(n).encode() + payload


def deep_path_tar(at: Path, depth: int = 40) -> Path:
    name = "/".join(["d"] * depth) + "/" + FILE
    return tar_with(at, "deep.tar", [(_header(name, len(SOURCE), fmt=tarfile.PAX_FORMAT), SOURCE)])


def long_name_tar(at: Path, part: int = 300) -> Path:
    name = "x" * part + "/" + FILE
    return tar_with(at, "long-name.tar", [(_header(name, len(SOURCE), fmt=tarfile.PAX_FORMAT), SOURCE)])


def long_path_tar(at: Path, parts: int = 12, part: int = 100) -> Path:
    name = "/".join(["y" * part] * parts) + "/" + FILE
    return tar_with(at, "long-path.tar", [(_header(name, len(SOURCE), fmt=tarfile.PAX_FORMAT), SOURCE)])


def linked_member_tar(at: Path, root: Path) -> Path:
    """exercises/<id> as a symlink member to the solutions, then the file through it."""
    link = tarfile.TarInfo(f"exercises/{EXERCISE}")
    link.type, link.linkname = tarfile.SYMTYPE, str(root / "solutions" / EXERCISE)
    return tar_with(at, "linked-member.tar", [(link.tobuf(tarfile.USTAR_FORMAT), b"")])


# ---------------------------------------------------------------------------------------------
# Zip archives


def _central_entry(name: bytes) -> bytes:
    """One central-directory record of an empty stored file whose local header is at offset 0."""
    return struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, 0, 0, 0, 0, 0, 0, len(name), 0, 0, 0, 0, 0, 0) + name


def _eocd(entries: int, cd_size: int, cd_offset: int) -> bytes:
    return struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, min(entries, 0xFFFF), min(entries, 0xFFFF),
                       min(cd_size, 0xFFFFFFFF), min(cd_offset, 0xFFFFFFFF), 0)


def huge_central_directory_zip(at: Path, entries: int = 200_000, declared: int | None = None,
                               zip64: bool = False) -> Path:
    """A zip whose central directory lists `entries` empty files (one local header serves them all);
    the end record declares `declared` entries (default: the truth), through a zip64 record if asked."""
    declared = entries if declared is None else declared
    local = struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, 0, 0, 0, 1, 0) + b"a"
    table = _central_entry(b"a") * entries
    path = _folder(at) / f"huge-cd-{entries}-{declared}{'-zip64' if zip64 else ''}.zip"
    with open(path, "wb") as f:
        f.write(local)
        f.write(table)
        end = len(local) + len(table)
        if zip64:
            f.write(struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, declared, declared, len(table),
                                len(local)))
            f.write(struct.pack("<4sLQL", b"PK\x06\x07", 0, end, 1))
            f.write(_eocd(0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF))
        else:
            f.write(_eocd(declared, len(table), len(local)))
    return path


def _raw_zip(path: Path, members: list[tuple[bytes, int, bytes, int, int]]) -> Path:
    """A zip of (name, method, compressed data, crc, uncompressed size) members, written field by field."""
    local, central = io.BytesIO(), io.BytesIO()
    for name, method, data, crc, size in members:
        offset = local.tell()
        local.write(struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, method, 0, 0, crc, len(data), size, len(name), 0)
                    + name + data)
        central.write(struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, method, 0, 0, crc, len(data), size,
                                  len(name), 0, 0, 0, 0, 0, offset) + name)
    table = central.getvalue()
    path.write_bytes(local.getvalue() + table + _eocd(len(members), len(table), local.tell()))
    return path


def zip_bomb(at: Path, members: int = 8, size: int = 16 << 20) -> Path:
    """`members` deflated files of zeros, each at the per-file limit (128 MiB in all), in ~130 KB; the
    sizes are declared honestly, so only the totals give it away."""
    zeros = b"\0" * size
    z = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    data = z.compress(zeros) + z.flush()
    crc = zlib.crc32(zeros)
    return _raw_zip(_folder(at) / "zip-bomb.zip", [(f"zeros{i}.bin".encode(), 8, data, crc, size) for i in range(members)])


def linked_member_zip(at: Path) -> Path:
    path = _folder(at) / "linked-member.zip"
    with zipfile.ZipFile(path, "w") as zf:
        info = zipfile.ZipInfo(FILE)
        info.external_attr = (0o120777 << 16)  # S_IFLNK
        zf.writestr(info, "/etc/passwd")
    return path


def plain_tar_gz(at: Path, name: str = "honest.tar.gz") -> Path:
    """An honest archive, for comparison: the file in exercises/<id>/."""
    path = _folder(at) / name
    with tarfile.open(path, "w:gz") as tf:
        info = tarfile.TarInfo(f"exercises/{EXERCISE}/{FILE}")
        info.size = len(SOURCE)
        tf.addfile(info, io.BytesIO(SOURCE))
    return path
