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
