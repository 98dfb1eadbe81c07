"""course.yaml: the single source of the rubric, validated on load.

Every exercise, check, point value, time limit, speed bar and hint lives in course.yaml. This module
loads it into pydantic models and turns any mistake into one error that names the path and what was
expected, for example::

    course.yaml: exercises[2].points: expected a positive number, found 'ten'
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

COURSE_FILE = "course.yaml"
IDENT = r"^[a-z][a-z0-9_]*$"


class CourseError(ValueError):
    """course.yaml is missing or does not describe a valid course."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SpeedBar(_Model):
    """Partial credit on a speed check: full marks at `bar`, none below `floor`, linear between.

    `metric` names what the check measures (a fraction of a measured ceiling, or a ratio to a library
    baseline); the check reports the achieved value and the grader scores it on this scale.
    """

    metric: str
    bar: float = Field(gt=0)
    floor: float = Field(ge=0)

    @model_validator(mode="after")
    def _floor_below_bar(self) -> "SpeedBar":
        if self.floor > self.bar:
            raise ValueError(f"floor ({self.floor}) must not exceed bar ({self.bar})")
        return self

    def credit(self, achieved: float) -> float:
        """Fraction of the check's points earned for an achieved value of the metric."""
        if achieved != achieved:  # NaN: nothing was achieved
            return 0.0
        if achieved >= self.bar:
            return 1.0
        if achieved <= self.floor:
            return 0.0
        return (achieved - self.floor) / (self.bar - self.floor)


class Check(_Model):
    """One line of the rubric: a group of tests that earns `points` together.

    Tests name their check with ``@pytest.mark.check("<id>")``. A check's points are split evenly
    over its tests (a parametrized sweep earns partial credit), except that a speed check scores
    each test on its `speed` scale.
    """

    id: str = Field(pattern=IDENT)
    title: str
    points: float = Field(gt=0)
    visibility: Literal["public", "hidden"] = "hidden"
    cuda: bool = False
    speed: SpeedBar | None = None


class Hint(_Model):
    """One hint, gentle to explicit in the exercise's order. `checks` names the checks it helps with: `make hint`
    shows first the next hint for a check the last `make check` failed. In course.yaml a hint is its text, or
    ``{text: ..., checks: [...]}``; the README's Hints section is rendered from these (grader/selfstudy.py)."""

    text: str
    checks: list[str] = Field(default_factory=list)


class Part(_Model):
    """A piece of an exercise small enough for one timed practice round (`make interview`).

    The round hands out the whole stub; the part's public checks are its task: `make interview-check`
    counts only their tests.
    """

    id: str = Field(pattern=IDENT)
    title: str = Field(description="what to write, in a line: the functions and what they do")
    checks: list[str] = Field(min_length=1, description="ids of the exercise's public checks that make the task")
    difficulty: Literal["easy", "medium", "hard"]
    minutes: int = Field(gt=0, description="expected minutes, for interview practice")


class Exercise(_Model):
    id: str = Field(pattern=IDENT)
    title: str
    file: str = Field(pattern=r"^[A-Za-z0-9_]+\.py$")
    points: float = Field(gt=0)
    budget: str = Field(description="the budget the technique buys back: memory, compute or bandwidth")
    difficulty: Literal["easy", "medium", "hard"]
    minutes: int = Field(gt=0, description="expected minutes, for interview practice")
    time_limit_s: float = Field(gt=0, description="wall-clock limit for grading the whole exercise")
    call_timeout_s: float = Field(gt=0, description="wall-clock limit for one call into student code")
    memory_mb: int | None = Field(None, gt=0, description="the memory a whole grade of this exercise needs at its "
                                                           "peak (grader, tests, worker) with a CPU build of torch, "
                                                           "measured; a machine that allows less does not grade it")
    memory_mb_cuda_torch: int | None = Field(
        None, gt=0, description="the same peak with a CUDA build of torch (host memory; each process that imports "
                                "it costs about twice the CPU build's), measured; falls back to memory_mb")
    checks: list[Check] = Field(min_length=1)
    hints: list[Hint] = Field(default_factory=list)
    parts: list[Part] = Field(default_factory=list, description="smaller practice rounds within the exercise")
    spawns: bool = Field(False, description="the course's drivers start threads or processes beside the student's "
                                             "code (a ring's ranks): the worker then allows them (no lock)")
    mutates: dict[str, list[str]] = Field(
        default_factory=dict,
        description="functions whose contract lets them change tensor arguments in place: "
                    "'function' or 'Class.method' -> parameter names; any other change to an argument fails the call",
    )

    @model_validator(mode="before")
    @classmethod
    def _hint_texts(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("hints"), list):
            data = {**data, "hints": [{"text": h} if isinstance(h, str) else h for h in data["hints"]]}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "Exercise":
        ids = [c.id for c in self.checks]
        unknown_hint_checks = sorted({c for h in self.hints for c in h.checks} - set(ids))
        if unknown_hint_checks:
            raise ValueError(f"hints name checks this exercise does not have: {unknown_hint_checks}")
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"check ids must be unique, found {dupes} more than once")
        part_ids = [p.id for p in self.parts]
        dupes = sorted({i for i in part_ids if part_ids.count(i) > 1})
        if dupes:
            raise ValueError(f"part ids must be unique, found {dupes} more than once")
        public = self.public_cpu_checks
        for part in self.parts:
            unknown = [c for c in part.checks if c not in public]
            if unknown:
                raise ValueError(
                    f"part {part.id!r}: expected checks among this exercise's public CPU checks {public}, "
                    f"found {unknown}"
                )
        total = sum(c.points for c in self.checks)
        if abs(total - self.points) > 1e-9:
            raise ValueError(
                f"points ({self.points:g}) must equal the sum of its checks' points, found {total:g}"
            )
        return self

    def memory_needed(self, cuda_torch: bool) -> int | None:
        """The measured peak of a whole grade for this build of torch (python -m grader.bench.memory)."""
        return (self.memory_mb_cuda_torch or self.memory_mb) if cuda_torch else self.memory_mb

    @property
    def public_cpu_checks(self) -> list[str]:
        """The checks a student can pass on a laptop: public and not CUDA-only (practice rounds use these)."""
        return [c.id for c in self.checks if c.visibility == "public" and not c.cuda]

    def part(self, part_id: str) -> Part:
        for p in self.parts:
            if p.id == part_id:
                return p
        raise KeyError(f"exercise {self.id!r} has no part {part_id!r}; known: {[p.id for p in self.parts]}")

    def check(self, check_id: str) -> Check:
        for c in self.checks:
            if c.id == check_id:
                return c
        raise KeyError(f"exercise {self.id!r} has no check {check_id!r}; known: {[c.id for c in self.checks]}")


class WorkerLimits(_Model):
    """Resource limits for the sandboxed worker that runs student code."""

    memory_mb: int = Field(default=8192, gt=0)
    cpu_s: int = Field(default=900, gt=0)
    file_size_mb: int = Field(default=256, gt=0)
    processes: int = Field(default=256, gt=0)
    max_result_mb: int = Field(default=256, gt=0, description="the largest reply one call may send back; the grader "
                               "holds at most twice this for a reply (its bytes, then its tensors)")
    scratch_mb: int = Field(default=1024, gt=0, description="the worker's private tmpfs (its /tmp and the view's root)")
    uid_first: int = Field(default=1_900_000_000, gt=0,
                           description="first uid of the range leased one per grade (as root)")
    uid_count: int = Field(default=1000, gt=0, description="how many uids the range holds: grades that can run at once")


class ContainerLimits(_Model):
    """The per-submission container of `--backend docker|apptainer` (grader/scale/container.py); the
    command line's --image, --memory, --cpus, ... override each one."""

    image: str = Field(default="llm-efficiency-lab-grader:latest", min_length=1)
    memory_mb: int = Field(default=16384, gt=0)  # --memory, with --memory-swap equal to it: no swap
    cpus: float = Field(default=4.0, gt=0)
    pids: int = Field(default=1024, gt=0)  # --pids-limit: every process and thread in the container
    tmpfs_mb: int = Field(default=4096, gt=0)  # /tmp, the only writable place besides /results
    shm_mb: int = Field(default=1024, gt=0)  # /dev/shm (torch.multiprocessing, gloo)
    budget_s: float | None = Field(default=None, gt=0)  # wall clock per submission; default: time limits + slack


GradescopeVisibility = Literal["hidden", "after_due_date", "after_published", "visible"]


class VisibilityMap(_Model):
    """Gradescope visibility of a check, by its course.yaml visibility."""

    public: GradescopeVisibility = "visible"
    hidden: GradescopeVisibility = "after_published"


class GradescopeSettings(_Model):
    visibility: VisibilityMap = VisibilityMap()
    stdout_visibility: GradescopeVisibility = "hidden"
    leaderboard: bool = False
    count_ungraded_cuda: bool = False


class PrairieLearnSettings(_Model):
    count_ungraded_cuda: bool = False


class ExportSettings(_Model):
    """The optional `export:` mapping: how results map onto Gradescope, PrairieLearn and gradebooks
    (documented in grader/export/README.md)."""

    due: dt.datetime | None = None
    gradescope: GradescopeSettings = GradescopeSettings()
    prairielearn: PrairieLearnSettings = PrairieLearnSettings()


class Course(_Model):
    course: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")
    title: str
    version: str
    worker: WorkerLimits = WorkerLimits()
    container: ContainerLimits = ContainerLimits()
    export: ExportSettings = ExportSettings()
    exercises: list[Exercise] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_ids(self) -> "Course":
        ids = [e.id for e in self.exercises]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"exercise ids must be unique, found {dupes} more than once")
        return self

    def exercise(self, exercise_id: str) -> Exercise:
        for e in self.exercises:
            if e.id == exercise_id:
                return e
        raise KeyError(
            f"no exercise {exercise_id!r} in {COURSE_FILE}; expected one of {[e.id for e in self.exercises]}"
        )

    @property
    def total_points(self) -> float:
        return sum(e.points for e in self.exercises)


def _describe(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _format_error(err: Mapping[str, Any], source: str) -> str:
    path = ""
    for part in err["loc"]:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    kind, msg = err["type"], err["msg"]
    found = _describe(err.get("input"))
    if kind in ("greater_than", "greater_than_equal") and not isinstance(err.get("input"), (int, float)):
        expected = "a positive number"
    elif kind in ("greater_than", "greater_than_equal"):
        expected = f"a number {'>' if kind == 'greater_than' else '>='} {err['ctx'].get('gt', err['ctx'].get('ge')):g}"
    elif kind in ("float_parsing", "float_type", "int_parsing", "int_type"):
        expected = "a positive number" if "points" in path or "_s" in path else "a number"
    elif kind == "missing":
        return f"{source}: {path}: missing (this field is required)"
    elif kind == "extra_forbidden":
        return f"{source}: {path}: unknown field (check its spelling)"
    elif kind == "string_pattern_mismatch":
        expected = f"a name matching {err['ctx']['pattern']}"
    elif kind == "literal_error":
        expected = f"one of {err['ctx']['expected']}"
    else:
        text = msg.removeprefix("Value error, ") if msg else kind
        return f"{source}: {path or '(top level)'}: {text}"
    return f"{source}: {path}: expected {expected}, found {found}"


def parse_course(data: object, source: str = COURSE_FILE) -> Course:
    if not isinstance(data, dict):
        raise CourseError(f"{source}: expected a mapping at the top level, found {type(data).__name__}")
    try:
        return Course.model_validate(data)
    except ValidationError as exc:
        lines = [_format_error(e, source) for e in exc.errors(include_url=False)]
        raise CourseError("\n".join(lines)) from None


def find_root(start: Path | None = None) -> Path:
    """The course root: the nearest folder at or above `start` that holds course.yaml."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / COURSE_FILE).is_file():
            return folder
    packaged = Path(__file__).resolve().parent.parent
    if (packaged / COURSE_FILE).is_file():
        return packaged
    raise CourseError(f"no {COURSE_FILE} found in {here} or any folder above it")


def load_course(root: Path | None = None) -> Course:
    path = (root or find_root()) / COURSE_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CourseError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CourseError(f"{path.name}: not valid YAML: {exc}") from None
    return parse_course(data, path.name)


def json_schema() -> dict:
    """The JSON Schema of course.yaml (shipped as grader/schemas/course.schema.json)."""
    return Course.model_json_schema()

