"""One student's bad material fails that student, never the class.

Every step that handles many students (staging, fingerprinting and resume, the batch, a Slurm task,
`grader grade`, the summary) turns whatever one student's material raises, of any type, into that
student's outcome: "not gradable" with the reason, or an error of the grade when the grading machine
itself failed. The faults are injected (tests/faults.py: a reader raises `Unforeseen`, a type nothing in
the grader names), beside real malformed archives, notebooks and result files. The exports have their
own (tests/test_export_isolation.py)."""

from __future__ import annotations

import bz2
import errno
import io
import json
import lzma
import signal
import tarfile
import zipfile
import zlib
from pathlib import Path

import pytest
from rich.console import Console

from grader import exitcodes, results, runner
from grader.cli import main as grader_main
from grader.options import GradeOptions
from grader.scale import batch, discover, resume, slurm, summary
from grader.scale.batch import BatchOptions, run_batch
from grader.scale.local import LocalBackend
from grader.submission import StagingFault, SubmissionError, locate, student_material
from tests import faults
from tests.conftest import COURSE, ROOT, checks_of
from tests.faults import FAULTY, Unforeseen
from tests.known_wrong import load_mutants

EXERCISE = "online_softmax"
REFERENCE = (ROOT / "solutions" / EXERCISE / f"{EXERCISE}.py").read_text()
STUB = (ROOT / "exercises" / EXERCISE / f"{EXERCISE}.py").read_text()
CHECKS = ["normalizer_public", "merge_public"]


def fast_options(**overrides) -> GradeOptions:
    return GradeOptions(**{"exercises": [EXERCISE], "seed": 4321, "tests": "public", "checks": CHECKS,
                           "call_timeout_s": 20, "time_limit_s": 120, **overrides})


def folder_submission(parent: Path, name: str, source: str = REFERENCE) -> Path:
    (parent / name).mkdir(parents=True)
    (parent / name / f"{EXERCISE}.py").write_text(source)
    return parent / name


# ---------------------------------------------------------------------------------------------
# Staging: whatever a reader raises is the material's


def test_an_exception_nothing_names_in_a_reader_makes_the_submission_not_gradable(tmp_path, monkeypatch):
    faults.install(monkeypatch.setattr)
    sub = folder_submission(tmp_path, FAULTY)
    with pytest.raises(SubmissionError) as caught:
        locate(COURSE, sub, [EXERCISE])
    message = str(caught.value)
    assert "Unforeseen" in message and "cannot be read" in message, (
        f"an exception of a type nobody listed must become 'not gradable' with its name, found: {message}")
    other = folder_submission(tmp_path, "alice")  # the patch is for mallory only: alice reads as ever
    staged = locate(COURSE, other, [EXERCISE])
    assert staged.files[EXERCISE].read_text() == REFERENCE
    staged.cleanup()


@pytest.mark.parametrize("reader, archive", [("_unpack_zip", "sub.zip"), ("_unpack_tar", "sub.tar.gz"),
                                             ("build_module", "nb")])
def test_every_reader_of_student_material_is_behind_the_same_net(tmp_path, monkeypatch, reader, archive):
    import grader.submission as submission

    def raise_unforeseen(*_args, **_kwargs):
        raise Unforeseen(f"{reader} met something nobody planned for")

    monkeypatch.setattr(submission, reader, raise_unforeseen)
    if archive == "nb":
        path = tmp_path / "nb"
        path.mkdir()
        (path / f"{EXERCISE}.ipynb").write_text(json.dumps({"cells": [], "nbformat": 4, "nbformat_minor": 5}))
    elif archive.endswith(".zip"):
        path = tmp_path / archive
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr(f"{EXERCISE}.py", REFERENCE)
    else:
        path = tmp_path / archive
        with tarfile.open(path, "w:gz") as tf:
            add_member(tf, f"{EXERCISE}.py", REFERENCE.encode())
    with pytest.raises(SubmissionError, match="Unforeseen"):
        locate(COURSE, path, [EXERCISE])


@pytest.mark.parametrize("fault", [OSError(errno.ENOSPC, "No space left on device"), MemoryError(),
                                   OSError(errno.EMFILE, "Too many open files")], ids=["disk-full", "memory", "fds"])
def test_the_machine_failing_while_it_reads_is_the_graders_fault_not_the_students(tmp_path, monkeypatch, fault):
    import grader.submission as submission

    def fail(*_args, **_kwargs):
        raise fault

    monkeypatch.setattr(submission, "_read_candidate", fail)
    with pytest.raises(StagingFault):
        locate(COURSE, folder_submission(tmp_path, "alice"), [EXERCISE])


def test_the_net_lets_an_interrupt_through():
    with pytest.raises(KeyboardInterrupt):
        with student_material("anything"):
            raise KeyboardInterrupt


def add_member(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


def corrupt_zip(method: int) -> bytes:
    """A one-member zip written with `method`, its compressed stream then damaged in the middle."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=method) as zf:
        zf.writestr(f"{EXERCISE}.py", REFERENCE * 4)
    data = bytearray(buffer.getvalue())
    start = 30 + len(f"{EXERCISE}.py")  # the local header, then the stream
    for i in range(start + 12, start + 60):
        data[i] ^= 0x5A
    return bytes(data)


def corrupt_tar_gz() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tf:
        add_member(tf, f"{EXERCISE}.py", (REFERENCE * 4).encode())
    raw = bytearray(buffer.getvalue())
    for i in range(40, 120):
        raw[i] ^= 0xA5
    return bytes(raw)


# Every compression method zipfile knows, each with a corrupt stream (a CRC mismatch, zlib.error, OSError from
# bz2, lzma.LZMAError: four libraries, four exception types), and tar's.
MALFORMED_ARCHIVES = {
    "zip-stored": ("sub.zip", lambda: corrupt_zip(zipfile.ZIP_STORED)),
    "zip-deflated": ("sub.zip", lambda: corrupt_zip(zipfile.ZIP_DEFLATED)),
    "zip-bzip2": ("sub.zip", lambda: corrupt_zip(zipfile.ZIP_BZIP2)),
    "zip-lzma": ("sub.zip", lambda: corrupt_zip(zipfile.ZIP_LZMA)),
    "tar-gz": ("sub.tar.gz", corrupt_tar_gz),
    "tar-header": ("sub.tar", lambda: b"x" * 100 + b"\0" * 412),
    "gzip-of-nothing": ("sub.tgz", lambda: zlib.compress(b"")),
    "bz2-named-tgz": ("sub.tgz", lambda: bz2.compress(b"not a tar")),
    "xz-named-zip": ("sub.zip", lambda: lzma.compress(b"PK\x03\x04")),
}


@pytest.mark.parametrize("kind", MALFORMED_ARCHIVES)
def test_a_corrupt_archive_of_any_kind_is_not_gradable_with_the_reason(tmp_path, kind):
    name, make = MALFORMED_ARCHIVES[kind]
    path = tmp_path / name
    path.write_bytes(make())
    with pytest.raises(SubmissionError) as caught:
        locate(COURSE, path, [EXERCISE])
    assert name in str(caught.value), f"the reason must name the archive, found: {caught.value}"


MALFORMED_NOTEBOOKS = {
    "truncated": b'{"cells": [',
    "a list": b"[]",
    "cells not a list": b'{"cells": 5, "nbformat": 4}',
    "source a number": b'{"cells": [{"cell_type": "code", "source": 7}], "nbformat": 4}',
    "nested 100k deep": b"[" * 100_000 + b"]" * 100_000,
    "utf-16": '{"cells": []}'.encode("utf-16"),
    "lone surrogate": b'{"cells": [{"cell_type": "code", "source": ["x = \\"\\ud800\\""]}], "nbformat": 4}',
    "huge number": b'{"cells": [], "nbformat": 1e999999}',
    "NaN": b'{"cells": NaN}',
    "empty": b"",
    "NUL bytes": b"\0" * 64,
}


@pytest.mark.parametrize("kind", MALFORMED_NOTEBOOKS)
def test_an_invalid_notebook_of_any_kind_is_not_gradable_with_the_reason(tmp_path, kind):
    folder = tmp_path / "sub"
    folder.mkdir()
    (folder / f"{EXERCISE}.ipynb").write_bytes(MALFORMED_NOTEBOOKS[kind])
    with pytest.raises(SubmissionError) as caught:
        locate(COURSE, folder, [EXERCISE])
    assert f"{EXERCISE}.ipynb" in str(caught.value), f"the reason must name the notebook, found: {caught.value}"


# ---------------------------------------------------------------------------------------------
# Fingerprinting and resume


def test_fingerprinting_never_raises_whatever_staging_does(tmp_path, monkeypatch):
    entry = discover.Entry(FAULTY, folder_submission(tmp_path, FAULTY))

    def bug(*_args, **_kwargs):
        raise Unforeseen("a bug in staging")

    monkeypatch.setattr(discover, "locate", bug)
    assert discover.content_fingerprint(COURSE, entry, [EXERCISE]) == (None, None), (
        "a submission that cannot be fingerprinted is graded, and the grade says why")


@pytest.mark.parametrize("garbage", [
    {"state": "complete", "submission": "not an object"},
    {"state": "complete", "submission": {"id": "ann", "sha256": 3}, "exercises": 5},
    {"state": "complete", "submission": {"id": "ann", "sha256": "x"}, "suite_sha256": [], "exercises": [7]},
    {"schema": results.SCHEMA_ID, "state": None},
], ids=["submission-a-string", "exercises-a-number", "exercises-of-numbers", "state-null"])
def test_resume_regrades_a_result_file_no_grade_wrote(garbage):
    why = resume.staleness(garbage, "ann", "x", "suite", [EXERCISE], None, None, None)
    assert why is not None and "not a valid result" in why, why


def test_the_summary_counts_an_unreadable_result_and_summarises_the_rest(tmp_path):
    good = results.new_result(COURSE, "ann", "abc", "suite", 1, "sandbox", [COURSE.exercise(EXERCISE)])
    results.finish(good)
    results.write_atomic(tmp_path / "ann.json", good)
    (tmp_path / "bob.json").write_text(json.dumps({"state": "complete", "score": "lots", "exercises": "none"}))
    made = summary.summarize(COURSE, tmp_path, ["ann", "bob"], [EXERCISE])
    assert made["graded"] == 1 and [s["id"] for s in made["no_result"]] == ["bob"], made
    summary.print_summary(made, Console(file=io.StringIO()))
    assert summary.one_line("bob", json.loads((tmp_path / "bob.json").read_text()), None).startswith("bob: no result")


# ---------------------------------------------------------------------------------------------
# One submission: `grader grade`


def test_grade_turns_a_readers_unforeseen_exception_into_not_gradable_and_exits_3(tmp_path, monkeypatch, capsys):
    faults.install(monkeypatch.setattr)
    sub, out = folder_submission(tmp_path, FAULTY), tmp_path / "result.json"
    code = grader_main(["grade", str(sub), "--exercise", EXERCISE, "--out", str(out), "--summary"])
    result = json.loads(out.read_text())
    assert result["state"] == "complete" and result["gradable"] is False and result["score"] == 0
    assert result["failure"]["by"] == "submission" and "Unforeseen" in result["failure"]["reason"]
    assert code == exitcodes.NEEDS_ATTENTION, capsys.readouterr()


def test_grade_blames_the_grader_for_a_bug_in_staging_and_exits_1(tmp_path, monkeypatch, capsys):
    def bug(*_args, **_kwargs):
        raise Unforeseen("a bug in the grader's staging")

    monkeypatch.setattr(runner, "locate", bug)
    out = tmp_path / "result.json"
    code = grader_main(["grade", str(folder_submission(tmp_path, "alice")), "--exercise", EXERCISE,
                        "--out", str(out), "--summary"])
    result = json.loads(out.read_text())
    assert result["state"] == "error" and result["failure"]["by"] == "grader", result["failure"]
    assert result["format_errors"][0].startswith(results.INTERNAL_ERROR) and "Unforeseen" in result["format_errors"][0]
    assert code == exitcodes.GRADER_FAILED, capsys.readouterr()


# ---------------------------------------------------------------------------------------------
# A Slurm array task


def test_a_slurm_task_whose_grade_raises_writes_a_result_without_reading_the_submission_again(tmp_path, monkeypatch):
    sub, out = folder_submission(tmp_path / "subs", FAULTY), tmp_path / "results"
    out.mkdir()
    manifest = {"root": str(ROOT), "results": str(out), "runtime": "local", "image": None,
                "options": fast_options().to_json(), "jobs": [],
                "tasks": [{"index": 0, "id": FAULTY, "path": str(sub)}]}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    staged = []

    def grade_raises(*_args, **_kwargs):
        raise Unforeseen("the task's grade met something nobody planned for")

    monkeypatch.setattr(batch, "grade_submission", grade_raises)
    monkeypatch.setattr(discover, "locate", lambda *a, **k: staged.append(a) or locate(*a, **k))
    monkeypatch.setattr("grader.runner.locate", lambda *a, **k: staged.append(a) or locate(*a, **k))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    try:
        code = slurm.run_task(tmp_path / "manifest.json", 0)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    result = json.loads((out / f"{FAULTY}.json").read_text())
    assert code == 1 and result["state"] == "running" and result["failure"]["by"] == "grader"
    assert "Unforeseen" in result["failure"]["reason"], result["failure"]
    assert staged == [], "the task's fallback must not stage the submission again: what failed may be in it"


# ---------------------------------------------------------------------------------------------
# The batch: 20 submissions, 5 malformed in different ways


def sources() -> list[str]:
    """What the good submissions hold: the reference, the stub and three known-wrong ones."""
    return [REFERENCE, STUB] + [m.apply(REFERENCE) for m in load_mutants(EXERCISE)[:3]]


def good_submissions(folder: Path) -> dict[str, int]:
    """Fifteen gradable submissions, each in its own folder: student -> which of `sources()` it holds."""
    made = {}
    for i in range(15):
        folder_submission(folder, f"student{i:02d}", sources()[i % len(sources())])
        made[f"student{i:02d}"] = i % len(sources())
    return made


def malformed_submissions(folder: Path) -> list[str]:
    """Five submissions malformed in five ways: a corrupt zip, a corrupt tar.gz, a notebook that is not
    JSON, a tar whose member climbs out, and a folder whose reader raises an exception nobody names."""
    (folder / "zip_bad.zip").write_bytes(corrupt_zip(zipfile.ZIP_DEFLATED))
    (folder / "tgz_bad.tar.gz").write_bytes(corrupt_tar_gz())
    (folder / "nb_bad").mkdir()
    (folder / "nb_bad" / f"{EXERCISE}.ipynb").write_text('{"cells": [{"cell_type": "code", "source": ')
    with tarfile.open(folder / "climbs.tar", "w") as tf:
        add_member(tf, f"../{EXERCISE}.py", REFERENCE.encode())
    folder_submission(folder, FAULTY)
    return ["climbs", FAULTY, "nb_bad", "tgz_bad", "zip_bad"]


def grades(out: Path, ids) -> dict[str, tuple]:
    def graded(sub_id):
        result = json.loads((out / f"{sub_id}.json").read_text())
        checks = checks_of(result, EXERCISE)
        return (result["state"], result["score"], result["submission"]["sha256"],
                {c: (checks[c]["status"], checks[c]["points"]) for c in sorted(checks)})
    return {sub_id: graded(sub_id) for sub_id in ids}


def test_a_batch_grades_fifteen_submissions_as_it_would_without_the_five_malformed_beside_them(tmp_path, monkeypatch):
    faults.install(monkeypatch.setattr)  # the batch's pre-scan meets the fault here, the grade in faults.serve
    quiet = Console(file=io.StringIO(), width=200)
    mixed, clean = tmp_path / "mixed", tmp_path / "clean"
    good = good_submissions(mixed)
    bad = malformed_submissions(mixed)
    for n, source in enumerate(sources()):  # each content graded once, alone: with a fixed seed, its grade
        folder_submission(clean, f"source{n}", source)

    with_bad = run_batch(COURSE, ROOT, BatchOptions(mixed, tmp_path / "out-mixed", jobs=2, grade=fast_options()),
                         backend=LocalBackend(ROOT, faults.SERVE), console=quiet)
    alone = run_batch(COURSE, ROOT, BatchOptions(clean, tmp_path / "out-clean", jobs=2, grade=fast_options()),
                      console=quiet)

    assert with_bad.internal_errors == [] and sorted(with_bad.graded) == sorted([*good, *bad])
    alone_grades = grades(tmp_path / "out-clean", [f"source{n}" for n in range(len(sources()))])
    assert grades(tmp_path / "out-mixed", good) == {s: alone_grades[f"source{n}"] for s, n in good.items()}, (
        "the fifteen good submissions must be graded exactly as their contents are graded alone")
    assert len({g[1] for g in alone_grades.values()}) > 1, "the sources must differ in score, or the comparison proves little"
    made = with_bad.summary
    assert sorted(s["id"] for s in made["not_gradable"]) == bad, made["not_gradable"]
    reasons = {s["id"]: s["reason"] for s in made["not_gradable"]}
    assert "Unforeseen" in reasons[FAULTY] and "zip_bad.zip" in reasons["zip_bad"], reasons
    assert f"{EXERCISE}.ipynb" in reasons["nb_bad"] and "climbs.tar" in reasons["climbs"], reasons
    assert batch.batch_status(with_bad) == exitcodes.NEEDS_ATTENTION
    assert batch.batch_status(alone) == exitcodes.DONE

    again = run_batch(COURSE, ROOT, BatchOptions(mixed, tmp_path / "out-mixed", jobs=2, grade=fast_options()),
                      backend=LocalBackend(ROOT, faults.SERVE), console=quiet)
    assert again.graded == [], f"a rerun must regrade nothing, found {again.graded} ({again.why})"
    assert batch.batch_status(again) == exitcodes.NEEDS_ATTENTION, "the rerun still names the students to chase"


@pytest.mark.parametrize("outer", ["folder", "zip"])
def test_an_archive_inside_the_submission_is_named_when_nothing_else_is_found(tmp_path, outer):
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as zf:
        zf.writestr(f"{EXERCISE}.py", REFERENCE)
    if outer == "folder":
        source = tmp_path / "sub"
        source.mkdir()
        (source / "homework.zip").write_bytes(inner.getvalue())
    else:
        source = tmp_path / "sub.zip"
        with zipfile.ZipFile(source, "w") as zf:
            zf.writestr("sub/homework.zip", inner.getvalue())
    result = runner.grade(COURSE, ROOT, source, None, fast_options())
    assert result["gradable"] is False and "no file to grade" in result["failure"]["reason"], result["failure"]
    assert "homework.zip" in result["failure"]["reason"] and "never unpacked" in result["failure"]["reason"], (
        f"the student must learn that the archive inside was not opened: {result['failure']['reason']}")
