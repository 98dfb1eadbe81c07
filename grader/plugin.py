"""The pytest plugin every exercise's tests run under (registered as the `grader` pytest11 entry point).

It provides the fixtures tests use (`student`, `seed`, `rng`, `device`, `score`), skips `cuda` tests
where there is no CUDA device ("not graded: no CUDA device", never a pass), and turns each test's
outcome into a graded event: passed / failed / error / timeout / not_graded, with a message fit to
show the student. Hidden tests' source never appears in those messages.

Events go, one JSON line each, to the file descriptor given by ``--grader-events``; the grader's
runner (a separate, trusted process) reads them and keeps the score. Without that option (a student
running ``pytest exercises/online_softmax`` by hand) the plugin only provides the fixtures.
"""

from __future__ import annotations

import json
import os
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from grader import rehearsal
from grader.course import Course, find_root, load_course

_STATE = pytest.StashKey[dict]()
MAX_MESSAGE = 4000


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("grader")
    group.addoption("--grader-mode", default="local", choices=("local", "sandbox"),
                    help="local: import the student's module in-process; sandbox: run it in a worker")
    group.addoption("--grader-submission", default=None,
                    help="folder holding the student's files, flat (sandbox mode)")
    group.addoption("--grader-events", type=int, default=None, help="file descriptor for graded events")
    group.addoption("--grader-seed", type=int, default=None, help="seed for the hidden tests' inputs")
    group.addoption("--grader-hide", default="", help="os.pathsep-separated folders the worker must not read")
    group.addoption("--grader-no-isolate", action="store_true", help="run workers without namespaces")
    group.addoption("--grader-grade-tag", default=None, help="the grade's tag: its workers' cgroups carry it")
    group.addoption("--grader-user", default="auto",
                    help="as root: 'auto' runs each worker as a uid of its own; or an account's name (shared)")
    group.addoption("--grader-checks", default="", help="comma-separated check ids: run only their tests")
    group.addoption("--grader-prestart", default=None, help="start this exercise's worker before collection")
    group.addoption("--grader-call-timeout", type=float, default=None, help="override course.yaml's call_timeout_s")
    group.addoption("--grader-first-failure", action="store_true",
                    help="stop each check at its first test below full marks (its later tests score zero)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "check(id): the course.yaml check this test earns points for")
    config.addinivalue_line("markers", "cuda: needs a CUDA device; reported as not graded elsewhere")
    fd = config.getoption("--grader-events")
    config.stash[_STATE] = {"events": os.fdopen(fd, "w", buffering=1) if fd is not None else None}
    if fd is not None and sys.platform.startswith("linux"):
        # Graded by the runner: die with it (even if it is SIGKILLed), never grade on for nobody.
        from grader.harness.launch import die_with_parent

        die_with_parent()
    if config.getoption("--grader-mode") == "local" and "TRITON_INTERPRET" not in os.environ:
        # Triton reads this at import time: decide before any test imports it.
        if not _cuda_available():
            os.environ["TRITON_INTERPRET"] = "1"


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        return False


def _course(config: pytest.Config) -> Course | None:
    state = config.stash[_STATE]
    if "course" not in state:
        try:
            state["root"] = find_root(Path(str(config.rootpath)))
            state["course"] = load_course(state["root"])
        except Exception:  # noqa: BLE001 - a plain pytest run outside a course
            state["root"], state["course"] = None, None
    return state["course"]


def exercise_of(path: Path) -> tuple[str | None, str]:
    """(exercise id, visibility) for a test file: exercises/<id>/... is public, grader/hidden/<id>/ hidden."""
    parts = path.resolve().parts
    for i in range(len(parts) - 2, 0, -1):
        if parts[i - 1] == "exercises":
            return parts[i], "public"
        if parts[i - 1] == "hidden" and i >= 2 and parts[i - 2] == "grader":
            return parts[i], "hidden"
    return None, "public"


# --------------------------------------------------------------------------------------------------
# Fixtures


def pytest_sessionstart(session: pytest.Session) -> None:
    prestart = session.config.getoption("--grader-prestart")
    if prestart and session.config.getoption("--grader-mode") == "sandbox":
        student_session = _make_session(session.config)
        session.config.stash[_STATE]["session"] = student_session
        student_session.prestart(prestart)


@pytest.fixture(scope="session")
def student(request: pytest.FixtureRequest):
    """Loads the student's module for an exercise: ``student.load("online_softmax")``."""
    config = request.config
    session = config.stash[_STATE].get("session") or _make_session(config)
    yield session
    state = config.stash[_STATE]
    state["warnings"] = session.warnings()
    state["worker_starts"] = session.worker_starts()
    session.close()


def _make_session(config: pytest.Config):
    from grader.harness.client import Sandbox
    from grader.harness.session import StudentSession

    course = _course(config)
    root = config.stash[_STATE]["root"] or Path.cwd()
    mode = config.getoption("--grader-mode")

    def locate(exercise_id: str) -> Path:
        return _student_file(config, exercise_id)

    limits = course.worker if course else None
    sandbox = Sandbox(
        isolate=not config.getoption("--grader-no-isolate"),
        user=config.getoption("--grader-user"),
        hide=[p for p in config.getoption("--grader-hide").split(os.pathsep) if p],
        course_root=str(root),
        cuda=_cuda_available(),
        grade_tag=config.getoption("--grader-grade-tag"),
        **({} if limits is None else {
            "memory_mb": limits.memory_mb, "cpu_s": limits.cpu_s, "file_size_mb": limits.file_size_mb,
            "processes": limits.processes, "max_result_mb": limits.max_result_mb, "scratch_mb": limits.scratch_mb,
            "uid_first": limits.uid_first, "uid_count": limits.uid_count,
        }),
    )

    def call_timeout(exercise_id: str) -> float:
        return _call_timeout(config, exercise_id)

    def contract(exercise_id: str) -> dict:
        if course is None:
            return {}
        exercise = course.exercise(exercise_id)
        stub = Path(root) / "exercises" / exercise_id / exercise.file  # the course's own copy, never the student's
        return {"mutates": {name: tuple(params) for name, params in exercise.mutates.items()},
                "parameters": parameter_names(stub)}

    def spawns(exercise_id: str) -> bool:
        return bool(course and course.exercise(exercise_id).spawns)

    return StudentSession(mode, locate, sandbox, call_timeout, contract, spawns)


def _student_file(config: pytest.Config, exercise_id: str) -> Path:
    """Where the student's file for `exercise_id` is: the submission's folder, or exercises/<id>/."""
    course = _course(config)
    root = config.stash[_STATE]["root"] or Path.cwd()
    filename = course.exercise(exercise_id).file if course else f"{exercise_id}.py"
    submission = config.getoption("--grader-submission")
    if submission:
        return Path(submission) / filename
    return Path(root) / "exercises" / exercise_id / filename


def _call_timeout(config: pytest.Config, exercise_id: str) -> float:
    """The wall-clock limit of one call into the student's code (course.yaml call_timeout_s, or the override)."""
    override = config.getoption("--grader-call-timeout")
    if override is not None:
        return override
    course = _course(config)
    return course.exercise(exercise_id).call_timeout_s if course else 60.0


def parameter_names(path: Path) -> dict[str, tuple[str, ...]]:
    """{"function": (names...), "Class.method": (names without self...)} from a Python file's AST
    (the course's stub: read as text, never imported)."""
    import ast

    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return {}

    def names(fn: ast.FunctionDef | ast.AsyncFunctionDef, drop_self: bool) -> tuple[str, ...]:
        args = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]
        return tuple(args[1:] if drop_self and args else args)

    out: dict[str, tuple[str, ...]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = names(node, False)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out[f"{node.name}.{item.name}"] = names(item, True)
                    if item.name == "__init__":
                        out[node.name] = names(item, True)
    return out


@pytest.fixture(scope="session")
def seed(request: pytest.FixtureRequest) -> int:
    """The run's seed. Hidden tests derive every input from it; the result records it."""
    value = request.config.getoption("--grader-seed")
    if value is None and os.environ.get("GRADER_SEED", "").isdigit():
        value = int(os.environ["GRADER_SEED"])  # how the runner passes it: a command line is readable by all
    return 0 if value is None else value


@pytest.fixture
def rng(request: pytest.FixtureRequest, seed: int):
    """A torch.Generator seeded from the run's seed and this test's id (reproducible with --seed)."""
    import torch

    return torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(request.node.nodeid.encode())) % 2**63)


@pytest.fixture(scope="session")
def device() -> str:
    return "cuda" if _cuda_available() else "cpu"


class Score:
    """Partial credit and figures for one test (speed checks use it)."""

    def __init__(self, check: Any):
        self.check = check
        self.fraction: float | None = None
        self.message = ""
        self.figures: dict[str, float] = {}

    def credit(self, fraction: float, message: str = "") -> None:
        self.fraction = min(1.0, max(0.0, float(fraction)))
        self.message = message

    def metrics(self, **figures: float) -> None:
        self.figures.update({k: float(v) for k, v in figures.items()})

    def speed(self, achieved: float, message: str = "") -> float:
        """Score an achieved speed metric on the check's course.yaml scale; returns the credit."""
        bar = getattr(self.check, "speed", None)
        if bar is None:
            raise RuntimeError("this test's check has no speed bar in course.yaml")
        fraction = bar.credit(achieved)
        self.metrics(**{bar.metric: achieved, "bar": bar.bar, "floor": bar.floor})
        self.credit(fraction, message or f"{bar.metric} = {achieved:.3g} (full marks at {bar.bar:g}, none at {bar.floor:g})")
        return fraction


@pytest.fixture
def score(request: pytest.FixtureRequest) -> Score:
    item = request.node
    return item.stash.setdefault(_SCORE, Score(_check_of(item)))


_SCORE = pytest.StashKey[Score]()
_OUTCOME = pytest.StashKey[dict]()


def _check_of(item: pytest.Item):
    course = _course(item.config)
    marker = item.get_closest_marker("check")
    exercise_id, _ = exercise_of(Path(str(item.path)))
    if course is None or marker is None or exercise_id is None:
        return None
    try:
        return course.exercise(exercise_id).check(marker.args[0])
    except (KeyError, IndexError):
        return None


# --------------------------------------------------------------------------------------------------
# Collection and outcomes


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    course = _course(config)
    wanted = {c for c in config.getoption("--grader-checks").split(",") if c}
    if wanted:
        keep = [i for i in items if (m := i.get_closest_marker("check")) is not None and m.args and m.args[0] in wanted]
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep
    if rehearsal.only() and rehearsal.active():  # grader gpu-check --dry-run: the CUDA tests alone
        keep = [i for i in items if i.get_closest_marker("cuda") is not None]
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep
    for item in items:
        exercise_id, _ = exercise_of(Path(str(item.path)))
        if exercise_id is None or course is None:
            continue
        marker = item.get_closest_marker("check")
        problem = None
        if marker is None or not marker.args:
            problem = "has no @pytest.mark.check('<id>') marker naming its course.yaml check"
        else:
            try:
                course.exercise(exercise_id).check(marker.args[0])
            except KeyError as exc:
                problem = str(exc).strip("'\"")
        if problem:
            item.add_marker(pytest.mark.grader_misconfigured(problem))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Announce every test that will run, so the runner splits each check's points over all of them:
    a test that never reports (the run stopped, pytest crashed) then scores zero instead of vanishing
    from the denominator."""
    events = session.config.stash[_STATE]["events"]
    if events is None:
        return
    by_exercise: dict[str, list[dict]] = {}
    for item in session.items:
        exercise_id, _ = exercise_of(Path(str(item.path)))
        if exercise_id is None:
            continue
        marker = item.get_closest_marker("check")
        by_exercise.setdefault(exercise_id, []).append({
            "check": marker.args[0] if marker and marker.args else None,
            "test": item.nodeid.split("::", 1)[-1],
            "cuda": item.get_closest_marker("cuda") is not None,
        })
    for exercise_id, tests in by_exercise.items():
        events.write(json.dumps({"event": "collected", "exercise": exercise_id, "tests": tests,
                                 "cuda_available": _cuda_available()}) + "\n")
    events.flush()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.config.getoption("--grader-first-failure"):  # before any fixture is set up: the test does not run
        marker = item.get_closest_marker("check")
        check = marker.args[0] if marker and marker.args else None
        if check in item.config.stash[_STATE].get("lost", set()):
            pytest.fail(f"not run: an earlier test of {check} lost points (--grader-first-failure)", pytrace=False)
    bad = item.get_closest_marker("grader_misconfigured")
    if bad:
        raise RuntimeError(f"grader configuration error: test {item.name} {bad.args[0]}")
    if item.get_closest_marker("cuda") and not _cuda_available() and not rehearsal.active():
        pytest.skip("not graded: no CUDA device")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    state = item.stash.setdefault(_OUTCOME, {"status": "passed", "message": "", "traceback": "", "duration": 0.0})
    state["duration"] += report.duration
    if report.passed or state["status"] != "passed":
        return
    _, visibility = exercise_of(Path(str(item.path)))
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        state.update(status="not_graded", message=reason.removeprefix("Skipped: "))
        return
    state.update(classify(call.excinfo.value if call.excinfo else None, visibility, item.name, report))


def classify(exc: BaseException | None, visibility: str, test_name: str, report: Any = None) -> dict:
    """Map a failed test's exception to a graded status and a message fit for the student."""
    from grader.harness.client import SandboxError, StudentCrash, StudentError, StudentLoadError, StudentTimeout

    if isinstance(exc, StudentLoadError):  # no call ran: the runner scores the whole exercise zero
        return {"status": "error", "message": str(exc), "traceback": exc.student_traceback, "load_failed": True}
    if isinstance(exc, SandboxError):  # the grading machine's failure, not the student's
        return {"status": "error", "message": str(exc), "grader_error": True}
    from grader.harness.deadline import TestDeadline

    if isinstance(exc, (StudentTimeout, TestDeadline)):
        return {"status": "timeout", "message": str(exc)}
    if isinstance(exc, StudentCrash):
        return {"status": "error", "message": str(exc)}
    if isinstance(exc, StudentError):
        return {"status": "error", "message": f"your code raised {exc}", "traceback": exc.student_traceback}
    if isinstance(exc, AssertionError):
        # The test's own message, without pytest's introspection of the assert expression (for a
        # hidden test that would show its source; for a public one it buries the teaching message).
        text = str(exc)
        head = text.split("\nassert ")[0] if "\nassert " in text else text
        if not head or head.startswith("assert "):
            head = f"a check in {test_name} failed" if visibility == "hidden" else text
        return {"status": "failed", "message": _cap(head)}
    if exc is not None and type(exc).__name__ == "Failed":
        return {"status": "failed", "message": _cap(str(exc))}
    if exc is None:
        return {"status": "error", "message": "the test failed without an exception"}
    # Any other exception: in-process mode, the student's own; otherwise a test that could not use the
    # student's result (a wrong type, a missing attribute). Public tests may show their traceback.
    traceback = _cap(str(report.longrepr)) if visibility == "public" and report is not None else ""
    return {"status": "error", "message": _cap(f"{type(exc).__name__}: {exc}"), "traceback": traceback}


def _cap(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 20] + "\n... (cut)"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    from grader.harness.ledger import LEDGER

    start = time.perf_counter()
    LEDGER.begin()
    exercise_id, _ = exercise_of(Path(str(item.path)))
    events = item.config.stash[_STATE]["events"]
    if events is not None and exercise_id is not None:  # the runner shows which test runs (a long one, a hang)
        events.write(json.dumps({"event": "started", "exercise": exercise_id,
                                 "test": item.nodeid.split("::", 1)[-1]}) + "\n")
        events.flush()
    if item.config.getoption("--grader-mode") == "local" and exercise_id is not None:
        # In-process: no worker to kill, so the test itself is stopped after one call's limit (harness/deadline.py)
        from grader.harness.deadline import limited

        with limited(_call_timeout(item.config, exercise_id), _student_file(item.config, exercise_id),
                     Path(str(item.path)), item.name):
            yield
    else:
        yield
    state = item.config.stash[_STATE]
    events = state["events"]
    if events is None:
        return
    exercise_id, visibility = exercise_of(Path(str(item.path)))
    if exercise_id is None:
        return
    outcome = item.stash.get(_OUTCOME, {"status": "error", "message": "the test did not run"})
    if outcome.get("load_failed"):
        state.setdefault("load_failed", {}).setdefault(exercise_id, outcome["message"])
    score = item.stash.get(_SCORE, None)
    fraction = 1.0 if outcome["status"] == "passed" else 0.0
    if score is not None and outcome["status"] == "passed" and score.fraction is not None:
        fraction = score.fraction
    if item.get_closest_marker("cuda") and rehearsal.active():  # ran on the CPU to prove it runs: never scored
        said = outcome.get("message", "")
        outcome = {**outcome, "status": "not_graded", "message": rehearsal.PASSED if outcome["status"] == "passed"
                   else f"rehearsed on the CPU: {outcome['status']}: {said}"}
        fraction = 0.0
    marker = item.get_closest_marker("check")
    if fraction < 1.0 and outcome["status"] != "not_graded" and marker and marker.args:
        item.config.stash[_STATE].setdefault("lost", set()).add(marker.args[0])  # for --grader-first-failure
    message = outcome.get("message", "")
    figures: dict[str, float] = {}
    if score is not None:
        figures = score.figures
        if outcome["status"] == "passed" and score.fraction is not None:
            message = score.message
        if score.fraction is not None and rehearsal.active():
            figures = {**figures, "rehearsal_fraction": score.fraction}  # the scoring path ran; it means nothing here
    event = {
        "event": "test",
        "exercise": exercise_id,
        "visibility": visibility,
        "check": marker.args[0] if marker and marker.args else None,
        "test": item.nodeid.split("::", 1)[-1],
        "status": outcome["status"],
        "fraction": fraction,
        "message": message,
        "traceback": outcome.get("traceback", ""),
        "grader_error": bool(outcome.get("grader_error")),
        "duration": round(time.perf_counter() - start, 4),
        "metrics": figures,
    }
    # A run of some checks only (--grader-checks: `grader grade --check`, the known-wrong proofs) may hold no test
    # where the code answers, so the rule needs the whole suite; a real grade runs it all.
    whole = not item.config.getoption("--grader-checks")
    raised = LEDGER.raised_in_test() if event["status"] == "passed" and whole else []
    if LEDGER.unanswered(raised):
        # It passed on an error the test expected, from code that has returned nothing yet: judged at the end
        # of the session, when every test has had its chance to show that code answering (error_is_an_answer).
        state.setdefault("held", []).append((event, raised))
        return
    events.write(json.dumps(event) + "\n")


def error_is_an_answer(event: dict, raised: list[str]) -> dict:
    """A passing test whose expected errors came from callables that never returned a value in this grade
    scores zero: an exception is the contract's answer only from code that also answers valid calls."""
    from grader.harness.ledger import LEDGER

    silent = LEDGER.unanswered(raised)
    if not silent:
        return event
    names = ", ".join(silent[:4])
    return {**event, "status": "failed", "fraction": 0.0, "metrics": {},
            "message": f"{names} raised the error this test expects, but never returned a value in any test of this "
                       "grade: an error counts as the contract's answer only from code that also answers the calls "
                       "that must succeed (a function that raises on every input rejects the bad input by accident)"}


def pytest_sessionfinish(session: pytest.Session) -> None:
    state = session.config.stash[_STATE]
    events = state.get("events")
    if events is not None:
        for event, raised in state.pop("held", []):
            events.write(json.dumps(error_is_an_answer(event, raised)) + "\n")
        for exercise_id, message in state.get("load_failed", {}).items():
            events.write(json.dumps({"event": "load_failed", "exercise": exercise_id, "message": message}) + "\n")
        events.write(json.dumps({
            "event": "session",
            "warnings": state.get("warnings", []),
            "worker_starts": state.get("worker_starts", 0),
        }) + "\n")
        events.flush()
