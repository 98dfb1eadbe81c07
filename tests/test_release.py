"""The student release: complete enough to work on its own, and leaking nothing."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grader.course import load_course
from grader.release import INSTRUCTOR_GRADER, LeakError, build_release, leak_check


# One test process for the module: the release below is built once per process (tens of seconds), not once per
# worker that happens to run one of these tests.
pytestmark = pytest.mark.xdist_group("release")


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
    assert not any((release / "grader" / doc).exists() for doc in ("AUTHORING.md", "CHECKS.md", "SLURM.md", "export/README.md"))
    assert "<!-- instructor" not in "".join(p.read_text() for p in release.glob("exercises/*/README.md"))


def _in_release(release: Path) -> dict[str, str]:
    """The environment a command runs in to use the release's own grader package (PYTHONPATH wins over the
    project's editable install), outside any virtual environment, pytest worker or make of the caller, with the
    system's programs only on PATH (as on a student's fresh machine: no pytest or python of some other environment)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "MAKEFLAGS", "MAKELEVEL", "MFLAGS")
           and not k.startswith("PYTEST_")}
    return {**env, "PYTHONPATH": str(release), "COLUMNS": "160", "PATH": "/usr/bin:/bin"}


IMPORT_EVERY_MODULE = """
import importlib, pathlib, sys
root = pathlib.Path.cwd()
failed = []
for path in sorted((root / "grader").rglob("*.py")):
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] == "__main__":
        continue  # runs the command line: `python -m grader --help` below
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    try:
        module = importlib.import_module(name)
        assert pathlib.Path(module.__file__).is_relative_to(root), f"imported from {module.__file__}"
    except BaseException as exc:
        failed.append(f"{name}: {type(exc).__name__}: {exc}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def test_the_release_holds_no_instructor_module_and_every_module_it_holds_imports(release, tmp_path):
    """The grader's instructor-only parts (batch, Slurm, the container backends, the exports, gpu-check, the release
    itself, the benchmarks) are not in a student's copy, and nothing it holds needs them: every module imports
    there, and the student's commands run."""
    for rel in INSTRUCTOR_GRADER:
        assert not (release / "grader" / rel).exists(), f"grader/{rel} is instructor-only"
    for kept in ("harness/worker.py", "support/timing.py", "structure.py", "testing.py", "plugin.py", "doctor.py",
                 "schemas/result.schema.json"):
        assert (release / "grader" / kept).is_file(), f"grader/{kept} is what the student's make check runs"
    lab = tmp_path / "lab"
    shutil.copytree(release, lab, ignore=shutil.ignore_patterns(".venv"))
    env = _in_release(lab)
    run = subprocess.run([sys.executable, "-c", IMPORT_EVERY_MODULE], cwd=lab, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, f"modules of the release that do not import there:\n{run.stdout}{run.stderr[-3000:]}"
    for args, shows in ((["--help"], "{doctor,check,hint,progress,interview,notebook}"), (["check", "--help"], "--verbose"),
                        (["hint", "online_softmax"], "hint 1/"), (["progress"], "hints seen"),
                        (["progress", "gptq"], "hidden tests"), (["doctor"], "torch")):
        done = subprocess.run([sys.executable, "-m", "grader", *args], cwd=lab, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0 and shows in done.stdout, f"grader {' '.join(args)}: {done.stdout}{done.stderr}"


def test_the_release_offers_the_students_commands_only(release):
    run = subprocess.run([sys.executable, "-m", "grader", "--help"], cwd=release, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(release)}, timeout=120)
    offered = set(re.search(r"\{([\w,-]+)\}", run.stdout).group(1).split(","))
    assert offered == {"check", "hint", "progress", "interview", "doctor", "notebook"}, run.stdout


def test_the_student_setup_says_what_it_costs_and_shows_its_progress(release):
    """A first `make check` installs torch: the README says how long it takes and how to pick a CPU build
    (TORCH=), and the install shows pip's progress instead of minutes of silence."""
    readme, makefile = (release / "README.md").read_text(), (release / "Makefile").read_text()
    assert "TORCH=" in readme and "two minutes" in readme and "CPU build" in readme, readme[:1500]
    install = next(line for line in makefile.splitlines() if '"$(TORCH)"' in line)
    assert "--quiet" not in install and "--progress-bar on" in install, install


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
    assert "The contract" in start.stdout, "the round prints its task: the README's contract"
    assert "## " not in start.stdout and "```" not in start.stdout and "`online_softmax(" not in start.stdout, (
        f"the contract is rendered for a terminal, not printed as raw markdown: {start.stdout}")
    practice = work / "practice" / "online_softmax"
    assert (practice / "online_softmax.py").read_text() == (root / "exercises/online_softmax/online_softmax.py").read_text(), (
        "an interview round starts from the pristine stub, not from the student's solved exercises/ file")
    check = grader("interview", "check")
    assert "0/18 public tests pass" in check.stdout, check.stdout + check.stderr
    assert ("NOT WRITTEN YET online_softmax: online_normalizer, merge_states, online_softmax, softmax_triton "
            "(18 tests wait on them)") in check.stdout, (
        "interview-check says which tests fail and why: for a fresh round, the functions not written yet, grouped as "
        f"make check groups them (not a FAILED line per test repeating the stub's NotImplementedError): {check.stdout}")
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


# In the docs, a command is a line of a ```bash (sh, shell, console) block, or a code span that begins like one.
SHELL_BLOCK = re.compile(r"```(bash|sh|shell|console)?[^\n]*\n(.*?)```", re.S)
COMMAND_START = re.compile(r"^(?:(?:make|pytest)(?:\s|$)|python3? -m \S|\.venv/bin/\S)")
# Commands the test does not run: they make .venv from the network, and the test's .venv is the project's own.
SETS_UP_THE_VENV = re.compile(r"-m venv\b|pip install")
# A make variable that only the setting up of .venv reads: with .venv made, `make check TORCH=...` is `make check`.
SETUP_ONLY = re.compile(r" TORCH=\S+")


def _commands_in(text: str) -> list[str]:
    """The shell commands a README names, in order: each line of a shell code block, and each code span (it may
    wrap onto the next line) that starts like a command. HTML comments, which a reader does not see, are left out."""
    parts = SHELL_BLOCK.split(re.sub(r"<!--.*?-->", "", text, flags=re.S))  # prose, language, block, prose, ...
    commands = []
    for i in range(0, len(parts), 3):
        spans = (" ".join(s.split()) for s in re.findall(r"`([^`]+)`", parts[i]) if "\n\n" not in s)
        commands += [s for s in spans if COMMAND_START.match(s)]
        if i + 2 < len(parts) and parts[i + 1]:
            lines = (line.strip() for line in parts[i + 2].splitlines())
            commands += [line for line in lines if line and not line.startswith("#")]
    return commands


def _makefile_commands(text: str) -> list[str]:
    """What the Makefile's comments tell the reader to type: code spans, and `make TARGET VAR=value [VAR=value]`."""
    comments = "\n".join(line.split("#", 1)[1] for line in text.splitlines() if "#" in line)
    named = [s for s in re.findall(r"`([^`]+)`", comments) if COMMAND_START.match(s)]
    return named + re.findall(r"(?<!`)\bmake [a-z][\w-]*(?: (?:[A-Z]+=[^\s;)\]]+|\[[^\]]*\]))*", comments)


def _as_typed(command: str, lab: Path) -> str:
    """A command as a student types it: `# comment` dropped, `<id>` filled in (online_softmax; in practice/<id>,
    the running interview round's folder), the first of `a|b|c`, an optional `[...]` included."""
    command = re.sub(r"\s+#.*$", "", command)
    if "practice/<id>" in command:
        progress = lab / ".progress.json"
        state = json.loads(progress.read_text()).get("interview") if progress.exists() else None
        assert state, f"{command!r} is named before any `make interview` started a round"
        command = command.replace("practice/<id>", state["folder"])
    command = re.sub(r"<(?:id|exercise id)>", "online_softmax", command)
    command = re.sub(r"(?<==)([\w.-]+)(?:\|[\w.-]+)+", r"\1", command)
    return re.sub(r"\[([^\]]*)\]", r"\1", command)


BROKEN = re.compile(r"No such file|not found|No module named|No rule to make target|Traceback \(most recent")


@pytest.mark.slow  # about 1-2 minutes: every command of the release's docs, each a process that imports torch
def test_every_command_the_release_names_works_as_written(release, tmp_path):
    """Each command the release's README.md, exercises/*/README.md and Makefile name, run in a copy of the release,
    in the order a student reads them (README.md, the exercises in course order, the Makefile): none may fail for a
    missing file, module, target or program, nor with a usage error. Failing tests are fine: the stubs are unsolved,
    so pytest's exit status 1 (and make's `Error 1` from it) counts as a working command.

    For speed the copy does not install its own .venv (`make check` would, from the network): .venv is a symlink to
    the project's, and PYTHONPATH points at the copy, so the commands run the release's grader package (the sandboxed
    worker, started with `python -I`, imports the project's identical grader/harness instead). pyproject.toml is
    dated back so that make takes .venv as up to date and never reinstalls the shared one; the commands that would
    make a venv (`python3 -m venv`, `pip install`) are not run, and `TORCH=` (read only by that setup) is not run
    again beside the same command without it."""
    if not (Path(sys.prefix) / "bin" / "grader").is_file():
        pytest.fail(f"expected the project's tests to run in its virtual environment (make test), found {sys.prefix}")
    lab = tmp_path / "lab"
    shutil.copytree(release, lab, ignore=shutil.ignore_patterns(".venv", ".progress.json", ".hints.json", "practice"))
    (lab / ".venv").symlink_to(Path(sys.prefix))
    os.utime(lab / "pyproject.toml", (0, 0))
    env = _in_release(lab)
    assert subprocess.run(["make", "-q", "setup"], cwd=lab, env=env, capture_output=True).returncode == 0, (
        "make would reinstall .venv (the project's own): the test must not run")

    docs = [lab / "README.md", *(lab / "exercises" / e.id / "README.md" for e in load_course(lab).exercises)]
    named = [(doc.relative_to(lab), c) for doc in docs for c in _commands_in(doc.read_text())]
    named += [(Path("Makefile"), c) for c in _makefile_commands((lab / "Makefile").read_text())]
    assert any(c.startswith(".venv/bin/pytest") for _, c in named) and any("interview" in c for _, c in named), named
    ran, broken, took = set(), [], {}
    for doc, command in named:
        if SETS_UP_THE_VENV.search(command):
            continue
        typed = _as_typed(command, lab)
        if SETUP_ONLY.sub("", typed) in ran:
            continue
        ran.add(SETUP_ONLY.sub("", typed))
        start = time.monotonic()
        done = subprocess.run(["bash", "-c", typed], cwd=lab, env=env, capture_output=True, text=True, timeout=300)
        took[typed] = time.monotonic() - start
        out = done.stdout + done.stderr
        recipe = re.findall(r"^make: \*\*\* \[[^\]]*\] Error (\d+)$", out, re.M)
        status = int(recipe[-1]) if done.returncode == 2 and recipe else done.returncode
        if status not in (0, 1) or BROKEN.search(out):
            broken.append(f"{doc}: {command!r} ran as {typed!r}: exit {done.returncode} (status {status})\n"
                          + out[-1500:])
    print("\n".join(f"{t:6.1f} s  {c}" for c, t in took.items()))
    assert not broken, "commands the release names that do not work there:\n\n" + "\n\n".join(broken)
    assert len(ran) >= 10, f"expected the docs to name at least 10 commands, found {sorted(ran)}"


def test_bare_pytest_collects_every_public_test_in_the_release(release):
    """A student who types `pytest` (or `pytest exercises`) gets the public tests, not "import file mismatch":
    each exercise's test_public.py shares one basename, so the release collects them by path."""
    for args in ([], ["exercises"]):
        run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                             cwd=release, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0 and "error" not in run.stdout.lower(), (
            f"bare pytest {' '.join(args)} in the release: exit {run.returncode}\n{run.stdout[-2000:]}{run.stderr[-1000:]}")
        collected = {line.split("::")[0] for line in run.stdout.splitlines() if "::" in line}
        assert collected == {f"exercises/{e}/test_public.py" for e in os.listdir(release / "exercises")}, collected
        assert "testpaths" not in run.stderr, run.stderr
