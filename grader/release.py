"""`grader release OUT_DIR`: write the student repository, and prove it leaks nothing.

The release holds what a student needs to work and to run `make check`: the exercises (stubs,
READMEs, public tests), course.yaml without its instructor-only sections, the part of the grader package
that the student's commands use (INSTRUCTOR_GRADER lists what it leaves out), a student README and
Makefile, and pyproject.toml. It never holds solutions/, grader/hidden/, the project's tests or the
known-wrong submissions.

The leak check runs on the finished tree before it is moved into place (a failed check writes
nothing) and again in the project's tests:

* no file whose bytes equal a file under solutions/ or grader/hidden/;
* no function body from a solution, compared as ASTs with every name erased, so renaming variables
  does not hide a copy (a helper the stub gives complete, with the same body, is allowed);
* no hidden test's function name and no distinctive string literal (24+ characters) from a hidden
  test, unless the course's public material uses the same name or text itself (a public and a
  hidden test may share a helpful message);
* no seed a hidden test fixes (`manual_seed(1234)`, `seed=1234`; four digits or more), which would
  let a student rebuild its inputs. The per-run seeds the grader draws are never written to disk
  by the release: they live in results, which are not copied.
"""

from __future__ import annotations

import ast
import hashlib
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

STUDENT_MAKEFILE = """\
# Your lab: `make check` runs the public tests on your exercises/ and shows your progress.
PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || command -v python3)
VENV   ?= .venv
TORCH  ?= torch
BIN    := $(VENV)/bin
EX     ?=
LEVEL  ?=
MINUTES ?=

.PHONY: setup check hint progress notebook interview interview-check interview-done

$(BIN)/grader: pyproject.toml
\t@echo "setting up $(VENV): torch, triton and the grader (once; about two minutes on a fast connection)"
\t$(PYTHON) -m venv $(VENV)
\t$(BIN)/python -m pip install --quiet --upgrade pip
\t$(BIN)/python -m pip install --progress-bar on "$(TORCH)" -e .
\t@touch $@

setup: $(BIN)/grader

check: setup            ## public tests on your exercises/ (EX=<id> for one; V=1: every failure in full)
\t$(BIN)/grader check $(EX) $(if $(V),--verbose) $(if $(CALL_TIMEOUT),--call-timeout $(CALL_TIMEOUT))

hint: setup             ## the next hint: make hint EX=online_softmax
\t@test -n "$(EX)" || (echo "usage: make hint EX=<exercise id>" && exit 2)
\t$(BIN)/grader hint $(EX)

progress: setup         ## what you have passed, tried and been hinted (EX=<id>: every check it is graded on)
\t$(BIN)/grader progress $(EX)

notebook: setup         ## a starter notebook to hand in: make notebook EX=online_softmax [FORCE=1]
\t@test -n "$(EX)" || (echo "usage: make notebook EX=<exercise id> [FORCE=1]" && exit 2)
\t@$(BIN)/python -c "import nbformat" 2>/dev/null || $(BIN)/python -m pip install --quiet "nbformat>=5.7"
\t$(BIN)/grader notebook $(EX) $(if $(FORCE),--force)

interview: setup        ## a timed practice round: make interview LEVEL=medium MINUTES=45 [EX=gptq/quantizer]
\t$(BIN)/grader interview start $(if $(LEVEL),--level $(LEVEL)) $(if $(MINUTES),--minutes $(MINUTES)) $(if $(EX),--exercise $(EX))

interview-check: setup
\t$(BIN)/grader interview check

interview-done: setup
\t$(BIN)/grader interview done
"""

STUDENT_README = """\
# LLM efficiency lab{marker}

Exercises on making large language models efficient. Each folder under `exercises/` has a
README that teaches the technique and states the contract, a stub to fill in, and public tests.

```bash
make check                    # set up .venv, run the public tests on your exercises/, show your progress
make check EX=online_softmax  # one exercise
make hint EX=online_softmax   # the next hint, gentle to explicit
make progress                 # what you have passed, tried and been hinted
make progress EX=moe_router   # every check an exercise is graded on, hidden ones included, with points
make interview LEVEL=medium   # a timed practice round from a fresh stub (see below)
make notebook EX=online_softmax  # exercises/<id>/<id>.ipynb: work in Jupyter or Colab, hand in the notebook
```

A notebook `<id>.ipynb` is graded like `<id>.py` (a `.py` beside it wins): its code cells in order,
except cells tagged `scratch` or starting `# scratch`; no `!` or `%` lines outside those.

The first `make check` sets up `.venv` (torch, triton and the grader; about two minutes, once).
`TORCH=` picks the torch requirement (`make check TORCH=torch==2.13.0`); on a machine without a GPU,
a CPU build of torch is a much smaller download: `python3 -m venv .venv && .venv/bin/pip install torch
--index-url https://download.pytorch.org/whl/cpu` before the first `make check` keeps it.

Start with `exercises/online_softmax/README.md`. No GPU is needed: Triton kernels run under Triton's
interpreter, and checks that need CUDA say so. Your instructor grades with more tests than these
(hidden ones, with other inputs and speed checks on a GPU); passing the public tests is the start.

An endless loop does not freeze `make check`: a test that runs past the exercise's limit for one call
is stopped, fails with the function and line it was in, and the run goes on; a test that runs quiet
for 15 s is named while it runs, and Ctrl-C ends the run with the table of what finished.

## Practice plan

{plan}
"""


# course.yaml sections that only the instructor's grading uses: the container the grader runs in,
# and how scores map onto Gradescope, PrairieLearn and due dates.
INSTRUCTOR_ONLY = ("container", "export")

STUDENT_COURSE_HEADER = """\
# The course's rubric: every exercise and check with its points, hidden checks included, so you know
# how you are graded (the hidden checks' tests are not in this copy). `make check` reads this file.
# Written by `grader release`; the instructor's copy also says how grading runs and where scores go.

"""


def student_course_yaml(course_root: Path) -> str:
    """course.yaml as the student sees it: the rubric without the instructor-only sections."""
    import yaml

    data = yaml.safe_load((course_root / "course.yaml").read_text())
    for key in INSTRUCTOR_ONLY:
        data.pop(key, None)
    return STUDENT_COURSE_HEADER + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=110)


@dataclass
class Leak:
    path: str
    what: str

    def __str__(self) -> str:
        return f"{self.path}: {self.what}"


class LeakError(RuntimeError):
    def __init__(self, leaks: list[Leak]):
        self.leaks = leaks
        super().__init__("the release would leak instructor material:\n" + "\n".join(f"  {l}" for l in leaks))


# --------------------------------------------------------------------------------------------------
# The leak check


class _EraseNames(ast.NodeTransformer):
    """Erase identifiers, so that renaming variables or arguments does not change the dump."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.copy_location(ast.Name(id="_", ctx=node.ctx), node)

    def visit_arg(self, node: ast.arg) -> ast.AST:
        return ast.copy_location(ast.arg(arg="_", annotation=None), node)

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        return node


def _body_fingerprints(source: str) -> dict[str, str]:
    """Function name -> a fingerprint of its body (docstring dropped, names erased)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    prints = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = list(node.body)
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
                body = body[1:]  # the docstring
            if sum(1 for _ in ast.walk(ast.Module(body=body, type_ignores=[]))) < 12:
                continue  # too small to be a leak (a one-line return)
            erased = _EraseNames().visit(ast.Module(body=[ast.fix_missing_locations(b) for b in body], type_ignores=[]))
            prints[node.name] = hashlib.sha256(ast.dump(erased, annotate_fields=False).encode()).hexdigest()
    return prints


SEED_CALLS = {"manual_seed", "seed", "Random", "default_rng", "RandomState", "Generator"}


def _seed_of(node: ast.AST) -> int | None:
    """The integer seed a call like `torch.manual_seed(1234)` or `f(..., seed=1234)` fixes, if any."""
    if not isinstance(node, ast.Call):
        return None
    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
    candidates = [k.value for k in node.keywords if k.arg == "seed"]
    if name in SEED_CALLS:
        candidates += node.args[:1]
    for value in candidates:
        if isinstance(value, ast.Constant) and type(value.value) is int:
            return value.value
    return None


def _hidden_markers(hidden_root: Path) -> tuple[set[str], set[str], set[int]]:
    """Hidden test function names, their distinctive string literals, and the seeds they fix."""
    names, literals, seeds = set(), set(), set()
    for path in hidden_root.rglob("*.py"):
        try:
            tree = ast.parse(path.read_text())
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                names.add(node.name)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value.strip()
                if len(text) >= 24 and " " in text and "\n" not in text:
                    literals.add(text)
            seed = _seed_of(node)
            if seed is not None and abs(seed) >= 1000:  # 0, 1, 42: every test file has those; they tell nothing
                seeds.add(seed)
    return names, literals, seeds


def leak_check(release: Path, course_root: Path) -> list[Leak]:
    leaks: list[Leak] = []
    secret_files = [p for folder in ("solutions", "grader/hidden") for p in (course_root / folder).rglob("*") if p.is_file()]
    secret_hashes = {hashlib.sha256(p.read_bytes()).hexdigest(): p for p in secret_files}
    solution_prints: dict[str, tuple[str, Path]] = {}
    for path in (course_root / "solutions").rglob("*.py"):
        for name, fp in _body_fingerprints(path.read_text()).items():
            solution_prints[fp] = (name, path)
    names, literals, seeds = _hidden_markers(course_root / "grader" / "hidden")
    # A name or message the course also uses in its public material is not a secret (a public and a
    # hidden test may share a helpful message); what remains can only have come from the hidden tests.
    public_text = "\n".join(
        p.read_text(errors="replace") for folder in ("exercises", "grader") for p in (course_root / folder).rglob("*.py")
        if "hidden" not in p.relative_to(course_root).parts
    )
    # Test names are identifiers: a name occurs as a whole word (regex \bname\b) exactly when it is one of the
    # text's maximal runs of word characters, so one set of words per text replaces a search per name.
    names -= set(re.findall(r"\w+", public_text))
    literals = {lit for lit in literals if lit not in public_text}
    seeds = {s for s in seeds if not re.search(rf"(?<![\w.]){s}(?![\w.])", public_text)}

    for path in sorted(p for p in release.rglob("*") if p.is_file()):
        rel = str(path.relative_to(release))
        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if digest in secret_hashes and data.strip():
            leaks.append(Leak(rel, f"is a copy of {secret_hashes[digest].relative_to(course_root)}"))
            continue
        if rel.startswith(("solutions", "grader/hidden", "tests")):
            leaks.append(Leak(rel, "lies in a folder that must not be released"))
        if path.suffix not in (".py", ".md", ".yaml", ".txt", ".toml", "") and path.name != "Makefile":
            continue
        text = data.decode("utf-8", "replace")
        if path.suffix == ".py":
            given = _given_complete(rel, course_root)
            for name, fp in _body_fingerprints(text).items():
                if fp in solution_prints and fp not in given:
                    sol_name, sol_path = solution_prints[fp]
                    leaks.append(Leak(rel, f"function {name} has the body of {sol_name} in {sol_path.relative_to(course_root)}"))
        for name in sorted(names & set(re.findall(r"\w+", text))):
            leaks.append(Leak(rel, f"names the hidden test {name}"))
        for literal in literals:
            if literal in text:
                leaks.append(Leak(rel, f"quotes a hidden test's literal {literal[:40]!r}"))
        for seed in seeds:
            if re.search(rf"(?<![\w.]){seed}(?![\w.])", text):
                leaks.append(Leak(rel, f"holds the seed {seed} that a hidden test fixes (its inputs could be rebuilt)"))
    return leaks


def _given_complete(rel: str, course_root: Path) -> set[str]:
    """Fingerprints of the functions the course's own stub ships complete (allowed in the release, in exercises/
    and in the pristine copy of the stubs, .pristine/<id>/<file>)."""
    if rel.startswith(".pristine/"):
        rel = "exercises/" + rel.removeprefix(".pristine/")
    source = course_root / rel
    if not rel.startswith("exercises/") or not source.is_file():
        return set()
    return set(_body_fingerprints(source.read_text()).values())


# --------------------------------------------------------------------------------------------------
# Writing the release


# The parts of grader/ that a student's copy does not hold, as paths under grader/: the hidden tests; what only
# they and `make bench` read (the benchmarks, the speed cases); grading at scale (batch, Slurm, the local and
# container backends, their process-tree helpers) and the exports to gradebooks, with their schemas; the GPU
# check; the release itself; the scaffold of a new exercise (grader new); the authoring and cluster guides. A
# student's copy runs check, hint, progress, interview and doctor (grader/cli.py, STUDENT_COMMANDS), which import
# none of these: the instructor's commands import them when they run. tests/test_release.py imports every module a release holds, in the release.
INSTRUCTOR_GRADER = (
    "hidden", "bench", "cases", "scale", "export", "gpucheck.py", "release.py", "proctree.py",
    "schemas/gradescope_results.schema.json", "schemas/prairielearn_results.schema.json",
    "AUTHORING.md", "CHECKS.md", "SLURM.md", "derived.py", "scaffold.py",
)
# In an exercise README, the paragraphs between these markers are for the instructor (seed sweeps, benchmarks
# against the reference solution): the release leaves them out.
INSTRUCTOR_BLOCK = re.compile(r"\n?<!-- instructor[^>]*-->.*?<!-- /instructor -->\n?", re.S)


# The markers around the blocks `grader sync` writes (grader/derived.py: the tables, and grader/selfstudy.py's
# hints): the student has no `grader sync`, so the release leaves them out.
SYNC_MARKER = re.compile(r"^<!-- (?:generated by grader sync: |end generated: |hints: |/hints)[^\n]*-->\n", re.M)


def student_readme(text: str) -> str:
    """An exercise README as the release ships it: without its instructor-only paragraphs or grader sync's markers."""
    return re.sub(r"\n{3,}", "\n\n", SYNC_MARKER.sub("", INSTRUCTOR_BLOCK.sub("\n", text)))


def _copy_tree(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> None:
    """Copy src to dst, but for caches and the paths in `skip` (relative to src: a file, or a folder and all below it)."""
    skipped = [Path(s).parts for s in skip]
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if any(part in ("__pycache__", ".pytest_cache") for part in rel.parts) or any(
                rel.parts[:len(s)] == s for s in skipped):
            continue
        target = dst / rel
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif path.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)


PROJECT_TESTPATHS = 'testpaths = ["tests"]'
# The student's copy has no tests/; its tests are exercises/<id>/test_public.py, one basename in many folders,
# which pytest's default import mode refuses ("import file mismatch"): bare `pytest` collects them by path.
STUDENT_TESTPATHS = 'testpaths = ["exercises"]\naddopts = ["--import-mode=importlib"]'


def student_pyproject(text: str) -> str:
    """The course's pyproject.toml as the student's copy needs it: bare `pytest` runs the public tests."""
    if PROJECT_TESTPATHS not in text:
        raise ValueError(f"pyproject.toml: expected the line {PROJECT_TESTPATHS!r} in [tool.pytest.ini_options], "
                         "found none; the release rewrites it so that bare pytest runs the public tests")
    return text.replace(PROJECT_TESTPATHS, STUDENT_TESTPATHS, 1)


def practice_plan(course) -> str:
    """The release README's table of practice rounds: each exercise whole, then its parts."""
    from grader.selfstudy import ROUNDS_HEADER, round_row, rounds

    rows = [*ROUNDS_HEADER, *(round_row(r) for r in rounds(course))]
    return "\n".join(rows) + (
        "\n\n`make interview LEVEL=easy|medium|hard MINUTES=45` picks a round that fits (or name one: "
        "`EX=gptq/quantizer`), copies the stub as handed out (from `.pristine/`, even after you solved the exercise) "
        "into `practice/<id>/`, prints the contract and starts the clock; `.venv/bin/pytest practice/<id>` tests that "
        "copy; `make interview-check` runs the round's public tests on it, says which fail and shows the time used; "
        "`make interview-done` records the round in `.progress.json` (not while the file does not compile or import: "
        "both commands name the line and exit 1). Starting a round again keeps your earlier practice file as "
        "`practice/<id>/<file>.<date>-<time>.bak`."
    )


def build_release(course_root: Path, out: Path, with_solutions: bool = False) -> list[Leak]:
    """Write the student repository to `out`. Refuses (writing nothing) if the leak check fails."""
    from grader.course import load_course
    from grader.selfstudy import PRISTINE

    course = load_course(course_root)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"expected an empty or new folder for the release, found {out} with files in it")
    staging = Path(tempfile.mkdtemp(prefix="release-", dir=out.parent if out.parent.exists() else None))
    try:
        _copy_tree(course_root / "exercises", staging / "exercises")
        for readme in (staging / "exercises").glob("*/README.md"):
            readme.write_text(student_readme(readme.read_text()))
        for exercise in course.exercises:  # the stubs as handed out: an interview round starts from these
            kept = staging / PRISTINE / exercise.id / exercise.file
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(course_root / "exercises" / exercise.id / exercise.file, kept)
        _copy_tree(course_root / "grader", staging / "grader", skip=INSTRUCTOR_GRADER)
        (staging / "grader" / "RELEASE").write_text("A student's copy of the course: grader offers the student's "
                                                    "commands only (grader/cli.py, STUDENT_COMMANDS).\n")
        (staging / "course.yaml").write_text(student_course_yaml(course_root))
        (staging / "pyproject.toml").write_text(student_pyproject((course_root / "pyproject.toml").read_text()))
        (staging / "Makefile").write_text(STUDENT_MAKEFILE)
        marker = " (teaching-assistant copy: contains the solutions)" if with_solutions else ""
        (staging / "README.md").write_text(STUDENT_README.format(marker=marker, plan=practice_plan(course)))
        (staging / ".gitignore").write_text(".venv/\n__pycache__/\n*.egg-info/\n.pytest_cache/\n.hints.json\n.progress.json\n"
                                            "practice/\n")
        leaks = [] if with_solutions else leak_check(staging, course_root)
        if leaks:
            raise LeakError(leaks)
        if with_solutions:
            _copy_tree(course_root / "solutions", staging / "solutions")
            (staging / "TEACHING_ASSISTANT_COPY").write_text("This copy contains the reference solutions. Do not hand it to students.\n")
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.exists():
            out.rmdir()
        shutil.move(str(staging), str(out))
        return leaks
    finally:
        shutil.rmtree(staging, ignore_errors=True)
