"""Finding the student's files in folders and archives, and refusing unsafe archives."""

import io
import tarfile
import zipfile

import pytest

from grader.submission import SubmissionError, locate

SOURCE = b"def online_softmax(x, block_size=1024):\n    raise NotImplementedError\n"


@pytest.mark.parametrize("layout", ["exercises/online_softmax/online_softmax.py", "online_softmax/online_softmax.py",
                                    "online_softmax.py"])
def test_folder_layouts(tmp_path, course, layout):
    path = tmp_path / "sub" / layout
    path.parent.mkdir(parents=True)
    path.write_bytes(SOURCE)
    sub = locate(course, tmp_path / "sub", ["online_softmax"])
    try:
        assert sub.files["online_softmax"].read_bytes() == SOURCE
        assert sub.id == "sub"
    finally:
        sub.cleanup()


def test_zip_with_a_top_level_folder(tmp_path, course):
    archive = tmp_path / "alice.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("alice-hw/online_softmax.py", SOURCE)
    sub = locate(course, archive, ["online_softmax"])
    try:
        assert sub.files["online_softmax"].read_bytes() == SOURCE and sub.id == "alice"
    finally:
        sub.cleanup()


def test_tar_gz(tmp_path, course):
    archive = tmp_path / "bob.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        info = tarfile.TarInfo("exercises/online_softmax/online_softmax.py")
        info.size = len(SOURCE)
        tf.addfile(info, io.BytesIO(SOURCE))
    sub = locate(course, archive)
    try:
        assert "online_softmax" in sub.files
    finally:
        sub.cleanup()


def _tar_with(tmp_path, member: tarfile.TarInfo, data: bytes = b"") -> str:
    archive = tmp_path / "evil.tar"
    with tarfile.open(archive, "w") as tf:
        tf.addfile(member, io.BytesIO(data) if data else None)
    return archive


@pytest.mark.parametrize("name,kind,message", [
    ("../escape.py", tarfile.REGTYPE, "points outside the archive"),
    ("/etc/evil.py", tarfile.REGTYPE, "points outside the archive"),
    ("online_softmax.py", tarfile.SYMTYPE, "is a link"),
    ("online_softmax.py", tarfile.LNKTYPE, "is a link"),
    ("dev", tarfile.CHRTYPE, "is a special file"),
])
def test_unsafe_tar_members_are_refused(tmp_path, course, name, kind, message):
    member = tarfile.TarInfo(name)
    member.type = kind
    member.linkname = "/etc/passwd" if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE) else ""
    data = SOURCE if kind == tarfile.REGTYPE else b""
    member.size = len(data)
    with pytest.raises(SubmissionError, match=message):
        locate(course, _tar_with(tmp_path, member, data))
    assert not (tmp_path.parent / "escape.py").exists()


def test_zip_slip_is_refused(tmp_path, course):
    archive = tmp_path / "slip.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("../../slip.py", SOURCE)
    with pytest.raises(SubmissionError, match="points outside the archive"):
        locate(course, archive)


def test_not_an_archive(tmp_path, course):
    bad = tmp_path / "sub.zip"
    bad.write_text("not a zip")
    with pytest.raises(SubmissionError, match="not a readable archive"):
        locate(course, bad)


def test_unknown_file_type(tmp_path, course):
    bad = tmp_path / "sub.rar"
    bad.write_text("?")
    with pytest.raises(SubmissionError, match=r"expected a folder, \.zip, \.tar or \.tar\.gz, found 'sub\.rar'"):
        locate(course, bad)


def test_a_bad_archive_is_graded_as_ungradable_with_the_reason(tmp_path):
    from grader import results
    from tests.conftest import grade_folder

    bad = tmp_path / "carol.zip"
    bad.write_text("garbage")
    result = grade_folder(bad, ["online_softmax"])
    results.validate(result)
    assert result["gradable"] is False and result["score"] == 0
    assert "not a readable archive" in result["format_errors"][0]


def test_an_oversize_file_in_a_folder_is_refused_without_reading_it(tmp_path, course):
    from grader.submission import MAX_FILE_BYTES

    sub = tmp_path / "sub"
    sub.mkdir()
    with open(sub / "online_softmax.py", "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: no time spent writing it
    with pytest.raises(SubmissionError, match=r"'online_softmax.py' in the submission is 16777217 bytes; "
                                              r"expected at most 16 MiB per file; refused"):
        locate(course, sub, ["online_softmax"])


def test_a_folder_where_a_layout_wants_a_file_is_no_match_and_the_next_layout_is_used(tmp_path, course):
    sub = tmp_path / "sub"
    (sub / "exercises" / "online_softmax" / "online_softmax.py").mkdir(parents=True)
    (sub / "online_softmax.py").write_bytes(SOURCE)
    staged = locate(course, sub, ["online_softmax"])
    try:
        assert staged.files["online_softmax"].read_bytes() == SOURCE
    finally:
        staged.cleanup()


def test_a_member_that_appears_twice_is_refused(tmp_path, course):
    archive = tmp_path / "twice.tar"
    with tarfile.open(archive, "w") as tf:
        for data in (SOURCE, b"x = 1\n"):
            info = tarfile.TarInfo("online_softmax.py")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    with pytest.raises(SubmissionError, match="'online_softmax.py' appears more than once"):
        locate(course, archive)


def test_a_truncated_tar_gz_is_not_a_readable_archive(tmp_path, course):
    whole = tmp_path / "whole.tar.gz"
    with tarfile.open(whole, "w:gz") as tf:
        info = tarfile.TarInfo("online_softmax.py")
        info.size = len(SOURCE) * 200
        tf.addfile(info, io.BytesIO(SOURCE * 200))
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(SubmissionError, match="not a readable archive"):
        locate(course, cut)


def test_archive_members_that_are_never_graded_are_checked_but_not_written(tmp_path, course):
    from grader.submission import unpack

    archive = tmp_path / "many.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("hw/online_softmax.py", SOURCE)
        for i in range(50):
            zf.writestr(f"hw/notes/{i}.txt", "x")
        zf.writestr("hw/notes/../../escape.txt", "x")
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(SubmissionError, match="points outside the archive"):
        unpack(archive, dest, {"online_softmax.py"})  # an unwanted member is still checked
    archive.unlink()
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("hw/online_softmax.py", SOURCE)
        for i in range(50):
            zf.writestr(f"hw/notes/{i}.txt", "x")
    dest = tmp_path / "dest2"
    dest.mkdir()
    assert unpack(archive, dest, {"online_softmax.py"}) == dest / "hw"
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*")) == ["hw", "hw/online_softmax.py"]
