"""The student release: complete enough to work on its own, and leaking nothing."""

import os
import re
import shutil
import subprocess
import sys

import pytest

from grader.course import load_course
from grader.release import LeakError, build_release, leak_check


@pytest.fixture(scope="module")
def release(root, tmp_path_factory):
    out = tmp_path_factory.mktemp("release") / "lab"
    build_release(root, out)
    return out


def test_release_holds_what_students_need_and_nothing_else(release, course):
    assert not (release / "solutions").exists()
    assert not (release / "grader" / "hidden").exists()
    assert not (release / "tests").exists()
    for ex in course.exercises:
        for name in ("README.md", ex.file, "test_public.py"):
            assert (release / "exercises" / ex.id / name).is_file(), f"missing exercises/{ex.id}/{name}"
    assert "make check" in (release / "README.md").read_text()
    assert "interview" in (release / "Makefile").read_text()


def test_released_course_yaml_keeps_the_rubric_and_drops_instructor_sections(release, course):
    released = load_course(release)
    assert [e.id for e in released.exercises] == [e.id for e in course.exercises]
    for mine, theirs in zip(course.exercises, released.exercises):
        assert [(c.id, c.points) for c in theirs.checks] == [(c.id, c.points) for c in mine.checks], (
            f"{mine.id}: the student's rubric must match the one they are graded with"
        )
        assert theirs.parts == mine.parts and theirs.hints == mine.hints
    text = (release / "course.yaml").read_text()
    for section in ("container:", "export:"):
        assert not any(line.startswith(section) for line in text.splitlines()), f"{section} is instructor-only"


def test_leak_check_passes_on_the_release(release, root):
    assert leak_check(release, root) == []


def test_a_copied_solution_function_is_caught_even_renamed(release, root, tmp_path):
    leaky = tmp_path / "leaky"
    shutil.copytree(release, leaky)
    source = (root / "solutions/online_softmax/online_softmax.py").read_text()
    renamed = source.replace("m_a", "first_max").replace("l_b", "second_sum").replace("shift", "offset")
    (leaky / "exercises" / "online_softmax" / "notes.py").write_text(renamed)
    leaks = [str(l) for l in leak_check(leaky, root)]
    assert any("has the body of merge_states" in l for l in leaks), leaks


def test_copied_hidden_tests_and_names_are_caught(release, root, tmp_path):
    leaky = tmp_path / "leaky"
    shutil.copytree(release, leaky)
    shutil.copy(root / "grader/hidden/online_softmax/test_hidden.py", leaky / "exercises" / "hidden_copy.py")
    (leaky / "README.md").write_text("see test_long_fp16_rows_accumulate_in_fp32")
    leaks = [str(l) for l in leak_check(leaky, root)]
    assert any("is a copy of grader/hidden/online_softmax/test_hidden.py" in l for l in leaks), leaks
    assert any("README.md: names the hidden test test_long_fp16_rows_accumulate_in_fp32" in l for l in leaks), leaks


def test_a_seed_a_hidden_test_fixes_is_caught(tmp_path):
    course_root, release = tmp_path / "course", tmp_path / "release"
    (course_root / "grader" / "hidden" / "ex").mkdir(parents=True)
    (course_root / "grader" / "hidden" / "ex" / "test_hidden.py").write_text(
        "import torch\n\ndef test_x():\n    torch.manual_seed(987654)\n    make(seed=24680)\n    torch.manual_seed(42)\n")
    (course_root / "exercises" / "ex").mkdir(parents=True)
    (course_root / "exercises" / "ex" / "ex.py").write_text("def f():\n    return 24680\n")  # public: not a secret
    (course_root / "solutions").mkdir()
    (release / "exercises" / "ex").mkdir(parents=True)
    (release / "exercises" / "ex" / "notes.md").write_text("inputs: manual_seed(987654), 24680 and 42\n")
    leaks = [str(l) for l in leak_check(release, course_root)]
    assert leaks == ["exercises/ex/notes.md: holds the seed 987654 that a hidden test fixes (its inputs could be rebuilt)"], leaks


def test_release_refuses_to_write_when_something_would_leak(root, tmp_path, monkeypatch):
    import grader.release as release_module

    monkeypatch.setattr(release_module, "leak_check", lambda staging, course_root: [release_module.Leak("x.py", "a leak")])
    out = tmp_path / "refused"
    with pytest.raises(LeakError, match="x.py: a leak"):
        build_release(root, out)
    assert not out.exists(), "a refused release must write nothing"


def test_teaching_assistant_copy_is_marked(root, tmp_path):
    out = tmp_path / "ta"
    build_release(root, out, with_solutions=True)
    assert (out / "solutions" / "online_softmax" / "online_softmax.py").is_file()
    assert "teaching-assistant copy" in (out / "README.md").read_text()
    assert (out / "TEACHING_ASSISTANT_COPY").is_file()


def _commands_named(text: str) -> set[str]:
    """`make X`, `grader X` and `python -m M` as a README's code spans and code-block lines begin with them."""
    lines = [line for block in re.findall(r"```.*?```", text, re.S) for line in block.splitlines()[1:]]
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    command = re.compile(r"^\s*(?:\$ )?((?:make|grader) [a-z][\w-]*|python -m [\w.]+)")
    return {m.group(1) for item in (*lines, *spans) if (m := command.match(item))}


def test_every_command_the_release_names_is_in_the_release(release):
    """A student's copy names only what it holds: make targets of its Makefile, the grader's student commands
    (the instructor's grade, batch, export, release, ... are not offered there), modules it ships."""
    from grader.cli import STUDENT_COMMANDS

    targets = set(re.findall(r"^([a-z][\w-]*):", (release / "Makefile").read_text(), re.M))
    missing = []
    for doc in [release / "README.md", *release.glob("exercises/*/README.md"), *release.glob("grader/**/*.md")]:
        for command in sorted(_commands_named(doc.read_text())):
            kind, name = command.rsplit(" ", 1)
            there = (name in targets if kind == "make" else name in STUDENT_COMMANDS if kind == "grader"
                     else name == "pytest" or (release / (name.replace(".", "/") + ".py")).is_file()
                     or (release / name.replace(".", "/") / "__init__.py").is_file())
            if not there:
                missing.append(f"{doc.relative_to(release)}: {command}")
    assert not missing, "the release names commands it does not hold:\n" + "\n".join(missing)
    assert not any((release / "grader" / doc).exists() for doc in ("AUTHORING.md", "SLURM.md", "export/README.md"))
    assert "<!-- instructor" not in "".join(p.read_text() for p in release.glob("exercises/*/README.md"))


def test_the_release_offers_the_students_commands_only(release):
    run = subprocess.run([sys.executable, "-m", "grader", "--help"], cwd=release, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(release)}, timeout=120)
    offered = set(re.search(r"\{([\w,-]+)\}", run.stdout).group(1).split(","))
    assert offered == {"check", "hint", "progress", "interview", "doctor"}, run.stdout


def test_release_make_check_works_in_a_fresh_virtual_environment(release):
    """The real thing: `make check` in the release creates its own venv and reports the stubs at zero."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["COLUMNS"] = "160"
    run = subprocess.run(["make", "check", "EX=online_softmax", "TORCH=torch==2.13.0"], cwd=release, env=env,
                         capture_output=True, text=True, timeout=1200)
    assert run.returncode == 2, ("the stub fails its public tests, so `make check` fails (make's exit 2): "
                                 + run.stdout[-3000:] + run.stderr[-3000:])
    assert (release / ".venv" / "bin" / "grader").exists()
    assert "0/18" in run.stdout and "start here" in run.stdout, run.stdout[-2000:]
    for command in (["make", "hint", "EX=online_softmax"], ["make", "progress"], [".venv/bin/grader", "doctor"]):
        done = subprocess.run(command, cwd=release, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and done.stdout.strip(), f"{' '.join(command)}: {done.stdout[-1500:]}{done.stderr[-1500:]}"


def test_interview_round(root, tmp_path):
    work = tmp_path / "lab"
    build_release(root, work)

    def grader(*args):
        return subprocess.run([sys.executable, "-m", "grader", *args], cwd=work, capture_output=True, text=True,
                              env={**os.environ, "COLUMNS": "160"}, timeout=600)

    # the student has solved online_softmax in exercises/: the round must still start from the stub
    shutil.copy2(root / "solutions/online_softmax/online_softmax.py", work / "exercises/online_softmax/online_softmax.py")
    start = grader("interview", "start", "--exercise", "online_softmax")
    assert start.returncode == 0, start.stderr
    assert "online_softmax" in start.stdout and "time box 45 minutes" in start.stdout
    assert "## The contract" in start.stdout, "the round prints its task: the README's contract"
    practice = work / "practice" / "online_softmax"
    assert (practice / "online_softmax.py").read_text() == (root / "exercises/online_softmax/online_softmax.py").read_text(), (
        "an interview round starts from the pristine stub, not from the student's solved exercises/ file")
    check = grader("interview", "check")
    assert "0/18 public tests pass" in check.stdout, check.stdout + check.stderr
    assert "FAILED online_softmax, check " in check.stdout, "interview-check says which tests fail and why"
    tested = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", str(practice)],
                            cwd=work, capture_output=True, text=True, timeout=600)
    assert tested.returncode == 1 and "NotImplementedError" in tested.stdout, (
        "`pytest practice/<id>` tests the practice copy (a stub), not the solved exercises/ file: "
        + tested.stdout[-2000:])
    done = grader("interview", "done")
    assert "recorded" in done.stdout
    progress = grader("progress")
    assert "interview" in progress.stdout and "0/18 public tests" in progress.stdout
    assert grader("interview", "check").returncode == 2, "no round is running after `done`"

    part = grader("interview", "start", "--exercise", "gptq/quantizer")
    assert part.returncode == 0, part.stderr
    assert "gptq/quantizer" in part.stdout and "time box 30 minutes" in part.stdout, part.stdout
    assert (work / "practice" / "gptq" / "gptq.py").is_file()
    check = grader("interview", "check")
    assert "gptq/quantizer: 0/3 public tests pass" in check.stdout, check.stdout + check.stderr
    unknown = grader("interview", "start", "--exercise", "gptq/nope")
    assert unknown.returncode == 2 and "has no part 'nope'" in unknown.stderr, unknown.stdout + unknown.stderr
