"""The docker backend, for real: docker/Dockerfile built FROM a CPU base made here (tests/docker_base.py,
since no image can be pulled), then the reference, the stub and hostile submissions each graded in
their own container, in a batch. Graded on online_softmax's public checks with short limits.

Needs a Docker engine: where none answers, the session tries .ci/docker-up (root, Debian's docker.io)
once, and skips with its reason only if that fails too."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from rich.console import Console

from grader import exitcodes
from grader.options import GradeOptions
from grader.scale import batch
from grader.scale.batch import BatchOptions, run_batch
from grader.scale.container import LABEL, ContainerBackend
from tests import docker_base
from tests.conftest import COURSE, ROOT, checks_of, left_running
from tests.test_isolation import corrupt_zip


pytestmark = pytest.mark.xdist_group("docker")

IMAGE = "llm-efficiency-lab-grader:test"
EXERCISE = "online_softmax"
REFERENCE = (ROOT / "solutions" / EXERCISE / f"{EXERCISE}.py").read_text()
STUB = (ROOT / "exercises" / EXERCISE / f"{EXERCISE}.py").read_text()
HOSTILE = ROOT / "tests" / "hostile"
IN_IMAGE = "/opt/course"
ORPHAN = "4343"  # the orphan's `sleep` (test_hostile.py uses 4242, test_batch.py 4271)


def docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


@pytest.fixture(scope="session")
def engine() -> None:
    if docker_answers():
        return
    up = subprocess.run([str(ROOT / ".ci" / "docker-up")], capture_output=True, text=True)
    if up.returncode != 0 or not docker_answers():
        pytest.skip(f"no Docker engine could start here: {(up.stderr or up.stdout).strip()[-300:]}")


def build_command() -> tuple[list[str], dict[str, str]]:
    """A `docker build` that uses BuildKit where it can (the legacy builder copies every layer on vfs)."""
    if subprocess.run(["docker", "buildx", "version"], capture_output=True).returncode == 0:
        return ["docker", "build"], {}
    if Path("/usr/bin/docker").exists():  # Debian's docker.io client has BuildKit built in
        return ["/usr/bin/docker", "build"], {"DOCKER_BUILDKIT": "1"}
    return ["docker", "build"], {"DOCKER_BUILDKIT": "0"}


@pytest.fixture(scope="session")
def image(engine) -> str:
    try:
        base = docker_base.build(ROOT)
    except docker_base.BaseImageError as exc:
        if "expected this environment on Python" in str(exc) or "debootstrap" in str(exc).split(":")[0]:
            pytest.skip(f"cannot make the CPU test base here: {exc}")
        raise
    cmd, env = build_command()
    # C_COMPILER=none: this CPU-only image runs Triton's interpreter only, and the build has no Debian mirror
    proc = subprocess.run([*cmd, "--network", "host", "-q", "-f", "docker/Dockerfile", "--build-arg",
                           f"BASE_IMAGE={base}", "--build-arg", "C_COMPILER=none", "-t", IMAGE, "."], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=1200)
    assert proc.returncode == 0, f"docker build failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return IMAGE


def in_image(image: str, *args: str, user: str = "root") -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "run", "--rm", "--network", "none", "--user", user, "--entrypoint", "python3",
                           image, *args], capture_output=True, text=True, timeout=300)


def test_the_student_user_cannot_read_the_hidden_checks_or_the_solutions(image):
    probe = ("import os, sys\n"
             "for rel in sys.argv[1:]:\n"
             "    try:\n"
             "        open(os.path.join('/opt/course', rel)).read(1)\n"
             "        print('READ', rel)\n"
             "    except PermissionError:\n"
             "        print('refused', rel)\n")
    private = ["grader/hidden/online_softmax/test_hidden.py", "solutions/online_softmax/online_softmax.py"]
    public = ["exercises/online_softmax/test_public.py", "grader/harness/worker.py", "course.yaml"]
    proc = in_image(image, "-c", probe, *private, *public, user="student")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:5] == [f"refused {p}" for p in private] + [f"READ {p}" for p in public], \
        "the hidden checks and solutions must be closed to `student`; what the worker needs must be open"
    owners = in_image(image, "-c", "import os; print(*(oct(os.stat(p).st_mode & 0o777) + ' ' + str(os.stat(p).st_uid) "
                                   "for p in ('/opt/course/grader/hidden', '/opt/course/solutions')))")
    assert owners.stdout.split() == ["0o700", "10001", "0o700", "10001"], "owned by `grader` (10001), mode 0700"


def test_the_image_holds_only_what_grading_needs_and_says_what_it_runs(image):
    listing = in_image(image, "-c", "import os; print(sorted(os.listdir('/opt/course')))").stdout
    for absent in ("tests", ".git", ".venv", ".ci"):
        assert f"'{absent}'" not in listing, f"{absent}/ must stay out of the image (.dockerignore): {listing}"
    config = json.loads(subprocess.run(["docker", "image", "inspect", image], capture_output=True, text=True).stdout)[0]
    assert config["Config"]["Healthcheck"]["Test"][-1] == "doctor"
    assert config["Config"]["Entrypoint"] == ["python3", "-m", "grader.scale.container"]
    doctor = subprocess.run(["docker", "run", "--rm", "--network", "none", image, "doctor", "--json"],
                            capture_output=True, text=True, timeout=300)
    report = json.loads(doctor.stdout)
    assert report["torch"] and report["triton"] and report["in_container"] and report["student_user"], report


def test_grade_one_submission_in_a_container_from_the_command_line(image, tmp_path):
    sub = tmp_path / "alice"
    sub.mkdir()
    (sub / f"{EXERCISE}.py").write_text(REFERENCE)
    out = tmp_path / "alice.json"
    proc = subprocess.run([sys.executable, "-m", "grader", "grade", str(sub), "--backend", "docker", "--image", image,
                           "--exercise", EXERCISE, "--tests", "public", "--memory", "4096",
                           "--out", str(out), "--summary"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    public = {cid: c for cid, c in checks_of(result, EXERCISE).items() if c["visibility"] == "public"}
    assert result["state"] == "complete" and all(c["status"] == "passed" for c in public.values()), public
    assert result["score"] == sum(c["max_points"] for c in public.values()) == 22
    digest = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", image], capture_output=True,
                            text=True).stdout.strip()
    assert result["image"] == {"runtime": "docker", "name": image, "digest": digest}, "the result names its image"
    assert result["warnings"] == [], "in the container the sandbox warnings of a bare machine must not appear"


def test_a_cpu_limit_beyond_the_machine_means_all_of_it(image):
    # course.yaml sizes the container for a grading server; docker refuses --cpus beyond the host's.
    assert ContainerBackend(ROOT, "docker", image, cpus=10_000).limits.cpus == float(os.cpu_count())


def hostile(name: str, replace: dict[str, str] | None = None) -> str:
    source = (HOSTILE / f"{name}.py").read_text()
    for old, new in (replace or {}).items():
        assert old in source, f"{name}.py no longer contains {old!r}"
        source = source.replace(old, new)
    return source


SUBMISSIONS = {
    "reference": REFERENCE,
    "stub": STUB,
    "reads_hidden": hostile("reads_hidden", {'os.environ.get("COURSE_ROOT", "/work/main")': repr(IN_IMAGE)}),
    "reads_course": hostile("reads_course", {'os.environ.get("COURSE_ROOT", "/work/main")': repr(IN_IMAGE)}),
    "log_symlink_crash": hostile("log_symlink_crash", {'os.environ.get("COURSE_ROOT", "/work/main")': repr(IN_IMAGE)}),
    "network": hostile("network"),
    "outlives_grade": hostile("outlives_grade", {'"4242"': f'"{ORPHAN}"'}),
    "memory_bomb": hostile("memory_bomb"),
    "fork_bomb": hostile("fork_bomb"),
    "fills_tmp": hostile("fills_tmp"),
    "huge_stdout": hostile("huge_stdout"),
    "exit_at_import": hostile("exit_at_import"),
    "os_exit_at_import": hostile("exit_at_import", {"import sys\n\nsys.exit(0)": "import os\n\nos._exit(0)"}),
}


MALFORMED = {"bad_archive": "bad_archive.tgz", "bad_zip": "bad_zip.zip", "bad_notebook": f"{EXERCISE}.ipynb"}


def backend(image: str) -> ContainerBackend:
    return ContainerBackend(ROOT, "docker", image, memory_mb=3072, cpus=1, pids=256, tmpfs_mb=1024)


# Two public checks (5 points each) are enough to see each attack end; fewer checks, fewer worker
# restarts and per-call timeouts, and a faster file.
BATCH_CHECKS = ["normalizer_public", "softmax_public"]


def grade_options(**overrides) -> GradeOptions:
    return GradeOptions(**{"exercises": [EXERCISE], "seed": 7, "tests": "public", "checks": BATCH_CHECKS,
                           "call_timeout_s": 12, "time_limit_s": 150, **overrides})


@pytest.fixture(scope="module")
def graded(image, tmp_path_factory):
    base = tmp_path_factory.mktemp("docker-batch")
    subs, out = base / "submissions", base / "results"
    for sub_id, source in SUBMISSIONS.items():
        (subs / sub_id).mkdir(parents=True)
        (subs / sub_id / f"{EXERCISE}.py").write_text(source)
    # Malformed in three ways, read inside the container: each costs its own student alone (tests/test_isolation.py).
    (subs / "bad_archive.tgz").write_bytes(b"\x1f\x8b not really gzip")
    (subs / "bad_zip.zip").write_bytes(corrupt_zip(zipfile.ZIP_DEFLATED))
    (subs / "bad_notebook").mkdir()
    (subs / "bad_notebook" / f"{EXERCISE}.ipynb").write_text('{"cells": [{"cell_type": "code", "source": ')
    docker = backend(image)
    report = run_batch(COURSE, ROOT, BatchOptions(subs, out, jobs=2, grade=grade_options()), backend=docker,
                       console=Console(file=io.StringIO(), width=200))
    leftovers = docker.leftovers()
    orphans = subprocess.run(["pgrep", "-f", f"sleep {ORPHAN}"], capture_output=True, text=True).stdout.split() \
        if shutil.which("pgrep") else []
    return {"report": report, "out": out, "backend": docker, "leftovers": leftovers, "orphans": orphans}


def result_of(graded, sub_id: str) -> dict:
    return json.loads((graded["out"] / f"{sub_id}.json").read_text())


def messages(result: dict) -> str:
    return "\n".join(t["message"] for c in checks_of(result, EXERCISE).values() for t in c["tests"])


def test_every_submission_gets_an_honest_result_and_the_batch_goes_on(graded):
    report = graded["report"]
    assert report.internal_errors == [], f"the grader failed on {report.internal_errors}"
    assert sorted(report.graded) == sorted([*SUBMISSIONS, *MALFORMED])
    reference = result_of(graded, "reference")
    assert reference["score"] == 10 and reference["gradable_max_score"] == 10, checks_of(reference, EXERCISE)
    assert reference["image"]["digest"] == graded["backend"].digest
    for sub_id in SUBMISSIONS:
        if sub_id == "reference":
            continue
        result = result_of(graded, sub_id)
        assert result["state"] == "complete" and result["gradable"], f"{sub_id}: the grade must finish"
        assert result["score"] == 0, f"{sub_id} earned points it did not deserve: {checks_of(result, EXERCISE)}"
    for sub_id, named in MALFORMED.items():
        bad = result_of(graded, sub_id)
        assert bad["state"] == "complete" and bad["gradable"] is False, bad
        assert named in bad["format_errors"][0], f"{sub_id}: the reason must name {named!r}: {bad['format_errors']}"
    summary = json.loads((graded["out"] / "summary.json").read_text())
    assert [s["id"] for s in summary["not_gradable"]] == sorted(MALFORMED)
    assert batch.batch_status(report) == exitcodes.NEEDS_ATTENTION, "students to chase: the batch exits 3"


def test_no_container_or_process_outlives_the_batch(graded):
    assert graded["leftovers"] == [], "grading containers were left behind"
    listed = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={LABEL}={graded['backend'].batch_label}"],
                            capture_output=True, text=True).stdout.split()
    assert listed == []
    for pid in graded["orphans"]:
        subprocess.run(["kill", "-9", pid])
    assert graded["orphans"] == [], "a process a submission started outlived its container"
    assert left_running() == []


def test_hidden_checks_and_solutions_are_unreadable_in_the_container(graded):
    text = messages(result_of(graded, "reads_hidden"))
    assert "READ " not in text, f"the worker read grader files: {text[:400]}"
    assert "cannot read grader/hidden/online_softmax/test_hidden.py: Permission denied" in text, text[:400]
    assert "cannot read solutions/online_softmax/online_softmax.py: Permission denied" in text, text[:400]


def test_nothing_private_of_the_course_or_the_grader_is_reachable_in_the_container(graded):
    text = messages(result_of(graded, "reads_course"))
    found = [part.strip() for part in text.split("|") if part.strip().startswith("READ")]
    # The container holds only the course's public files besides the private ones closed by modes.
    assert all(part.startswith("READ course.yaml") for part in found), f"the worker read: {found}"
    assert "cannot read solutions/online_softmax/online_softmax.py: Permission denied" in text, text[:400]
    assert "uid 0" not in text and "euid 0 " not in text, "the worker ran as root in the container"


def test_a_crash_through_a_symlinked_log_leaks_nothing_in_the_container(graded):
    text = messages(result_of(graded, "log_symlink_crash"))
    assert "exited with code 3" in text and "planted" in text, text[:400]
    assert "root:" not in text and REFERENCE.splitlines()[0] not in text, "the crash message leaked a file"


def test_the_network_is_unreachable_from_the_container(graded):
    text = messages(result_of(graded, "network"))
    assert "CONNECTED" not in text and "blocked" in text, text[:400]


def test_resource_bombs_cost_their_own_points_only(graded):
    fills = messages(result_of(graded, "fills_tmp"))
    assert "before No space left on device" in fills or "before File too large" in fills, fills[:400]
    for sub_id in ("memory_bomb", "fork_bomb", "huge_stdout"):
        result = result_of(graded, sub_id)
        statuses = {c["status"] for cid, c in checks_of(result, EXERCISE).items() if cid in BATCH_CHECKS}
        assert statuses <= {"failed", "error", "timeout"} and result["score"] == 0, (sub_id, statuses)


def test_a_grade_past_its_budget_is_stopped_and_keeps_the_checks_it_finished(image, tmp_path):
    # normalizer and merge are the reference's; online_softmax hangs (no per-call limit catches it
    # here), so only the budget enforced from outside can end the grade.
    hangs = REFERENCE + "\n\nimport time\n\n\ndef online_softmax(x, block_size=1024):\n    time.sleep(3600)\n"
    subs, out = tmp_path / "submissions", tmp_path / "results"
    (subs / "hangs").mkdir(parents=True)
    (subs / "hangs" / f"{EXERCISE}.py").write_text(hangs)
    docker = backend(image)
    report = run_batch(COURSE, ROOT, BatchOptions(subs, out, jobs=1, job_timeout_s=75,
                                                  grade=grade_options(call_timeout_s=600, time_limit_s=600)),
                       backend=docker, console=Console(file=io.StringIO(), width=200))
    assert report.internal_errors == [], "a submission that hangs is graded, not an internal error"
    result = json.loads((out / "hangs.json").read_text())
    checks = checks_of(result, EXERCISE)
    assert result["state"] == "complete"
    assert checks["normalizer_public"]["status"] == "passed" and checks["normalizer_public"]["points"] > 0, \
        "the checks finished before the budget ran out keep their points"
    assert checks["softmax_public"]["status"] == "timeout"
    assert "time budget of 75 s ran out" in checks["softmax_public"]["message"]
    assert docker.leftovers() == [], "the stopped container must be removed"


# ---------------------------------------------------------------------------------------------
# The command lines, without an engine


def test_the_docker_command_carries_every_limit_and_pins_one_gpu(tmp_path):
    from grader.scale.container import ContainerLimits, docker_command

    limits = ContainerLimits(memory_mb=2048, cpus=1.5, pids=64, tmpfs_mb=512, shm_mb=256)
    archive = tmp_path / "alice.zip"
    archive.write_bytes(b"PK")
    cmd = docker_command("img:1", archive, tmp_path / "scratch", "grade-alice", "b1", limits, gpu="3")
    text = " ".join(cmd)
    for flag in ("--rm", "--init", "--network none", "--read-only", "--pids-limit 64", "--memory 2048m",
                 "--memory-swap 2048m", "--cpus 1.5", "--shm-size 256m", "--cap-drop ALL",
                 "--security-opt no-new-privileges", "--gpus device=3", "size=512m", f"--label {LABEL}=b1"):
        assert flag in text, f"the docker command lacks {flag!r}: {text}"
    assert f"{archive}:/submission/alice.zip:ro" in cmd, "an archive is mounted read-only under /submission"
    assert cmd[-5:] == ["img:1", "grade", "--source", "/submission/alice.zip", "--watch-stdin"]
    assert "--interactive" in cmd, "the container ends itself when the process holding its stdin dies"
    caps = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--cap-add"]
    assert sorted(caps) == ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID"]
    folder = docker_command("img:1", tmp_path, tmp_path / "scratch", "n", "b1", limits, gpu=None)
    assert f"{tmp_path}:/submission:ro" in folder and not any(a.startswith("--gpus") for a in folder)


def test_the_apptainer_command_keeps_the_host_out(tmp_path):
    from grader.scale.container import apptainer_command

    cmd = apptainer_command("/shared/course.sif", tmp_path, tmp_path / "scratch", gpu="1")
    for flag in ("--fakeroot", "--containall", "--cleanenv", "--no-home", "--network", "--nv"):
        assert flag in cmd, f"the apptainer command lacks {flag}: {cmd}"
    assert cmd[cmd.index("--network") + 1] == "none"


def test_container_flags_without_a_container_and_a_missing_image_are_clear_errors(tmp_path):
    def grader(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "grader", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=120, env={**os.environ, "COLUMNS": "200"})

    local = grader("grade", str(ROOT / "solutions"), "--image", "img:1")
    assert local.returncode == 2 and "--image applies to --backend docker or apptainer" in local.stderr
    sif = grader("batch", str(tmp_path), "--out", str(tmp_path / "out"), "--backend", "apptainer",
                 "--image", str(tmp_path / "missing.sif"))
    assert sif.returncode == 2 and "expected an Apptainer image file (.sif)" in sif.stderr, sif.stderr
    zero = grader("grade", str(ROOT / "solutions"), "--backend", "docker", "--cpus", "0")
    assert zero.returncode == 2 and "expected --cpus greater than 0, found 0" in zero.stderr, zero.stderr


KILLED_DOCKER_BATCH = """
import io, sys
from pathlib import Path
from rich.console import Console
from grader.scale.batch import BatchOptions, run_batch
from tests.conftest import COURSE, ROOT
from tests.test_docker import backend, grade_options
run_batch(COURSE, ROOT, BatchOptions(Path(sys.argv[1]), Path(sys.argv[2]), jobs=1,
                                     grade=grade_options(call_timeout_s=600, time_limit_s=600)),
          backend=backend(sys.argv[3]), console=Console(file=io.StringIO()))
"""


def test_a_killed_batch_takes_its_container_with_it(image, tmp_path):
    # SIGKILL gives the backend no chance to remove the container, which belongs to the Docker
    # daemon; the container must notice (its stdin closes) and end by itself.
    subs, out = tmp_path / "submissions", tmp_path / "results"
    (subs / "sigkilled").mkdir(parents=True)
    (subs / "sigkilled" / f"{EXERCISE}.py").write_text(
        REFERENCE + "\n\nimport time\n\n\ndef online_normalizer(chunks):\n    time.sleep(3600)\n")

    def containers() -> list[str]:
        return subprocess.run(["docker", "ps", "-aq", "--filter", "name=grade-sigkilled-"], capture_output=True,
                              text=True).stdout.split()

    proc = subprocess.Popen([sys.executable, "-c", KILLED_DOCKER_BATCH, str(subs), str(out), image], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not containers() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
        assert containers(), "the grade's container did not start within 120 s"
        time.sleep(10)  # the grader inside is under way, its worker asleep in online_normalizer
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 60
        while containers() and time.monotonic() < deadline:
            time.sleep(0.5)
        left = containers()
    finally:
        if proc.poll() is None:
            proc.kill()
    for name in left:
        subprocess.run(["docker", "rm", "--force", name], capture_output=True)
    assert left == [], "the container outlived the SIGKILLed batch by more than 60 s"
