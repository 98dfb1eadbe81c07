"""``grader gpu-check``: everything CUDA, proved and calibrated in one bounded run.

A GPU may be lent for minutes at a time. This command spends them in order of what matters, inside a budget
(``--budget-s``, 480 s by default), and writes one JSON file and one table:

1. ``doctor``: the GPU, driver, CUDA, torch and Triton it grades with.
2. The reference solutions with every check, the CUDA ones included: each speed test's achieved fraction
   against its bar and floor (course.yaml), the margin, and a suggested bar where the margin is thin or wide;
   each CUDA correctness test's outcome; the figures the tests record (GB/s, TFLOP/s, the ceilings, clocks);
   the peak GPU memory in use while each exercise grades (nvidia-smi, sampled every 0.1 s).
3. The stubs, on the CUDA checks only: they must score nothing there.
4. The known-wrong submissions whose expected losses include a CUDA check (tests/known_wrong, in the course
   repository): each must lose them.
5. Every kernel the references launch, compiled for ``sm_90`` and ``sm_80`` at the launch's tiles and warps:
   registers, spill (at most 64 bytes a thread) and shared memory from the cubin, as CI checks them.
6. Every ``grader.bench.<id>`` on its reference, each bounded by a timeout.
7. One grade of the reference online_softmax through ``--backend docker --gpus 0``, where docker and the
   course image are both here: the container's GPU path, its speed check graded.

A step that no longer fits the budget is skipped and named. The exit status is 1 when any step of the
grader's own crashed, timed out or raised (a grader error in a test, a reference that fails a CUDA test, a
bench that exits non-zero), with the message that names it; 0 otherwise. It never writes course.yaml: a
suggested bar is for the instructor to read next to the roofline reasoning beside each bar.

``--dry-run`` is the rehearsal (grader/rehearsal.py) on a machine without CUDA: the same steps, the CUDA
tests on the CPU with tiny shapes, never scored; a rehearsed test that does not run through is the finding.
The project's tests run it (tests/test_rehearsal.py), so the command itself has run before a GPU meets it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from grader.course import Course

DEFAULT_BUDGET_S = 480.0
BENCH_TIMEOUT_S = 90.0
MARGIN_LOW, MARGIN_HIGH = 1.25, 3.0  # a reference this close to its bar (or this far above it) gets a suggestion


@dataclass
class Report:
    dry_run: bool
    budget_s: float
    started: float = field(default_factory=time.monotonic)
    steps: dict[str, Any] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    results: dict[str, dict] = field(default_factory=dict)  # the grades' canonical results (not in the JSON)

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def as_dict(self) -> dict:
        return {"dry_run": self.dry_run, "budget_s": self.budget_s, "elapsed_s": round(time.monotonic() - self.started, 1),
                "steps": self.steps, "skipped": self.skipped, "problems": self.problems, "ok": not self.problems}


def cuda_exercises(course: Course) -> list[str]:
    return [e.id for e in course.exercises if any(c.cuda for c in e.checks)]


def _copy_exercises(root: Path, source: str, ids: list[str], dest: Path) -> Path:
    for exercise_id in ids:
        shutil.copytree(root / source / exercise_id, dest / exercise_id,
                        ignore=shutil.ignore_patterns("test_*", "README.md", "__pycache__", "conftest.py"))
    return dest


def _grade(course: Course, root: Path, folder: Path, ids: list[str], time_limit_s: float,
           checks: list[str] | None = None, on_update: Callable[[dict], None] | None = None) -> dict:
    from grader.options import GradeOptions
    from grader.runner import grade

    opts = GradeOptions(exercises=ids, seed=20261201, time_limit_s=max(30.0, time_limit_s), checks=checks)
    return grade(course, root, folder, None, opts, on_update=on_update)


def device_memory_used_mib() -> float | None:
    """Memory in use on the GPU the grade runs on, every process's (nvidia-smi), in MiB; None where it cannot
    be read. The grade's workers are other processes, so the grader's own torch counters would see none of it."""
    index = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    try:
        run = subprocess.run(["nvidia-smi", f"--id={index}", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10)
        return float(run.stdout.split()[0]) if run.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def host_memory_used_mib() -> float | None:
    """The rehearsal's stand-in for `device_memory_used_mib`: the host's memory in use (/proc/meminfo)."""
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        return (int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])) / 1024
    except (OSError, KeyError, ValueError):
        return None


class PeakMemory:
    """The peak memory in use while each exercise grades, above what was in use before the grade started,
    sampled every `interval_s` from `read` in a thread; `on_update` (the grade's callback) says which exercise
    is running, and each change of exercise is read too (an exercise that grades in less than the interval, as
    a warm one may, has a reading). A peak is a sample's, so a spike shorter than the interval can be missed."""

    def __init__(self, read: Callable[[], float | None], interval_s: float = 0.1):
        import threading

        self.read, self.interval_s = read, interval_s
        self.current: str | None = None
        self.baseline: float | None = None
        self.peaks: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="gpu-check peak memory", daemon=True)

    def on_update(self, result: dict) -> None:
        running = next((e["id"] for e in result.get("exercises", []) if e.get("status") == "running"), None)
        if running != self.current:  # a reading at each change too: an exercise shorter than the interval has one
            self._record(self.current)
            self._record(running)
        self.current = running

    def _record(self, exercise: str | None) -> None:
        used = self.read() if exercise is not None else None
        if used is not None and exercise is not None:
            self.peaks[exercise] = max(self.peaks.get(exercise, used), used)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._record(self.current)

    def __enter__(self) -> "PeakMemory":
        self.baseline = self.read()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def above_baseline_mib(self) -> dict[str, float]:
        base = self.baseline or 0.0
        return {ex: round(max(peak - base, 0.0), 1) for ex, peak in self.peaks.items()}


def _tests(result: dict, course: Course) -> list[dict]:
    """One row per test: exercise, check, whether the check is a CUDA or speed one, status, message, figures."""
    rows = []
    for ex in result.get("exercises", []):
        spec = {c.id: c for c in course.exercise(ex["id"]).checks}
        for check in ex["checks"]:
            c = spec.get(check["id"])
            for test in check["tests"]:
                rows.append({"exercise": ex["id"], "check": check["id"], "cuda": bool(c and c.cuda),
                             "speed": bool(c and c.speed), "bar": c.speed.bar if c and c.speed else None,
                             "floor": c.speed.floor if c and c.speed else None,
                             "metric": c.speed.metric if c and c.speed else None, "test": test["name"],
                             "status": test["status"], "message": test["message"][:400],
                             "grader_error": bool(test.get("grader_error")), "metrics": test.get("metrics", {})})
    return rows


def _speed_row(row: dict) -> dict:
    """The margin of a speed test against its bar, and a bar to consider when it is thin or wide."""
    scored = row["metrics"].get(row["metric"])  # what score.speed scored, under the check's metric name
    out = {**row, "achieved": scored}
    if isinstance(scored, (int, float)) and row["bar"]:
        margin = scored / row["bar"]
        out["margin"] = round(margin, 3)
        if margin < MARGIN_LOW or margin > MARGIN_HIGH:
            out["suggested_bar"] = float(f"{scored / 1.5:.2g}")  # the reference at 1.5x the bar
    return out


def _outcome(row: dict, dry_run: bool) -> str:
    if dry_run:
        return "ran" if row["message"] == "rehearsed on the CPU: passed" else "broken"
    return "passed" if row["status"] == "passed" else row["status"]


def step_doctor(report: Report) -> None:
    from grader.doctor import doctor

    report.steps["doctor"] = doctor()


def step_reference(report: Report, course: Course, root: Path, work: Path) -> None:
    ids = cuda_exercises(course) if report.dry_run else [e.id for e in course.exercises]
    with PeakMemory(host_memory_used_mib if report.dry_run else device_memory_used_mib) as memory:
        result = _grade(course, root, _copy_exercises(root, "solutions", ids, work / "reference"), ids,
                        report.left() / 2, on_update=memory.on_update)
    report.results["reference"] = result
    rows = _tests(result, course)
    cuda_rows = [r for r in rows if r["cuda"] or r["message"].startswith("rehearsed on the CPU")]
    for row in cuda_rows:
        row["outcome"] = _outcome(row, report.dry_run)
        if row["outcome"] not in ("passed", "ran"):
            report.problems.append(f"reference {row['exercise']}/{row['test']}: {row['message'][:200]}")
    for row in rows:
        if row["grader_error"]:
            report.problems.append(f"grader error in {row['exercise']}/{row['test']}: {row['message'][:200]}")
    report.steps["reference"] = {
        "score": result.get("score"), "gradable_max_score": result.get("gradable_max_score"),
        "speed": [_speed_row(r) for r in cuda_rows if r["speed"]],
        "cuda_correctness": [r for r in cuda_rows if not r["speed"]],
        "device": result.get("device"),
        # the rehearsal's stand-in is the host's memory, beside whatever else runs there: not a GPU figure
        "peak_memory_mib": {"what": "host memory in use (the rehearsal's stand-in)" if report.dry_run
                            else "GPU memory in use (nvidia-smi), above what was in use before the grade",
                            "per_exercise": memory.above_baseline_mib()},
    }


def step_stubs(report: Report, course: Course, root: Path, work: Path) -> None:
    ids = cuda_exercises(course)
    checks = [c.id for e in course.exercises if e.id in ids for c in e.checks if c.cuda]
    result = _grade(course, root, _copy_exercises(root, "exercises", ids, work / "stubs"), ids, report.left() / 2,
                    checks=checks)
    report.results["stubs"] = result
    earned = [(ex["id"], c["id"], c["points"]) for ex in result["exercises"] for c in ex["checks"]
              if c["id"] in checks and c["points"] > 0]
    for exercise_id, check, points in earned:
        report.problems.append(f"the stub of {exercise_id} earned {points} on {check}: a stub must score nothing")
    report.steps["stubs"] = {"cuda_points": sum(p for _, _, p in earned), "score": result.get("score")}


def step_known_wrong(report: Report, course: Course, root: Path, work: Path,
                     exercises: list[str] | None = None) -> None:
    try:
        sys.path.insert(0, str(root))
        from tests.known_wrong import load_mutants, write_mutant
    except ImportError:
        report.skipped.append("known-wrong submissions (tests/known_wrong is not here: the course repository has it)")
        return
    finally:
        if sys.path and sys.path[0] == str(root):
            sys.path.pop(0)
    rows = []
    for exercise in course.exercises:
        cuda = {c.id for c in exercise.checks if c.cuda}
        if exercises is not None and exercise.id not in exercises:
            continue
        for mutant in load_mutants(exercise.id) if cuda else []:
            expected = sorted(set(mutant.loses) & cuda)
            if not expected:
                continue
            if report.left() < 60:
                report.skipped.append(f"known-wrong {exercise.id}/{mutant.name} (budget)")
                continue
            folder = write_mutant(root, exercise, mutant, work / "known_wrong" / f"{exercise.id}-{mutant.name}")
            result = _grade(course, root, folder, [exercise.id],
                            min(report.left() / 2, exercise.time_limit_s), checks=expected)
            checks = {c["id"]: c for ex in result["exercises"] for c in ex["checks"]}
            kept = [c for c in expected if checks.get(c, {}).get("points", 0) >= checks.get(c, {}).get("max_points", 1)]
            rows.append({"exercise": exercise.id, "mutant": mutant.name, "expected_losses": expected,
                         "points": {c: checks.get(c, {}).get("points") for c in expected}, "kept": kept})
            if kept and not report.dry_run:
                report.problems.append(f"known-wrong {exercise.id}/{mutant.name} kept full marks on {kept}")
    report.steps["known_wrong"] = rows


def step_benches(report: Report, course: Course, root: Path, timeout_s: float = BENCH_TIMEOUT_S,
                 exercises: list[str] | None = None) -> None:
    rows = []
    for exercise in course.exercises:
        if exercises is not None and exercise.id not in exercises:
            continue
        module = f"grader.bench.{exercise.id}"
        if not (root / "grader" / "bench" / f"{exercise.id}.py").is_file():
            continue
        bound = min(timeout_s, report.left() - 5)
        if bound < 10:
            report.skipped.append(f"bench {exercise.id} (budget)")
            continue
        start = time.monotonic()
        path = root / "solutions" / exercise.id / exercise.file
        try:
            proc = subprocess.run([sys.executable, "-m", module, str(path)], cwd=root, capture_output=True, text=True,
                                  timeout=bound, env=dict(os.environ, TRITON_INTERPRET=os.environ.get("TRITON_INTERPRET", "")))
            outcome = "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
            tail = (proc.stdout + proc.stderr)[-1500:]
        except subprocess.TimeoutExpired:
            outcome, tail = "bounded", f"stopped at its {bound:.0f} s bound"
        rows.append({"exercise": exercise.id, "outcome": outcome, "seconds": round(time.monotonic() - start, 1),
                     "tail": tail})
        if outcome.startswith("exit"):
            report.problems.append(f"bench {exercise.id} failed ({outcome}): {tail[-300:]}")
    report.steps["benches"] = rows


STACK_BOUND = 64  # bytes of spill per thread a reference kernel may have (tests/test_reference_kernels_compile.py)


def step_kernels(report: Report, course: Course, root: Path, work: Path) -> None:
    """Every kernel the references launch, compiled for sm_90 and sm_80 at the launch's own tiles and warps
    (grader/bench/kernel_resources.py): registers, spill and shared memory, from the cubin. It needs no GPU, so
    the dry run does it too; on a GPU it says, beside the timings, what each kernel costs on chip."""
    from grader.bench import kernel_resources

    found = kernel_resources.launches()
    measured = kernel_resources.measure(found)
    rows = []
    for launch in found:
        for arch in kernel_resources.ARCHS:
            r = measured[(launch.id(), arch)]
            rows.append({"exercise": launch.exercise, "kernel": launch.kernel, "arch": f"sm_{arch}",
                         "dtype": launch.dtype, "config": launch.config, "registers": r.registers, "stack": r.stack,
                         "shared": r.shared, "error": (r.error or "")[:300] or None})
            if r.registers is None:
                report.problems.append(f"kernels: {launch.kernel} ({launch.config}, {launch.dtype}) does not compile "
                                       f"for sm_{arch}: {(r.error or 'no answer')[:300]}")
            elif (r.stack or 0) > STACK_BOUND:
                report.problems.append(f"kernels: {launch.kernel} ({launch.config}, {launch.dtype}) spills {r.stack} "
                                       f"bytes a thread on sm_{arch}, over the {STACK_BOUND} allowed: shrink its tiles")
    report.steps["kernels"] = rows


def step_docker(report: Report, course: Course, root: Path, work: Path) -> None:
    """One grade through ``--backend docker --gpus 0``: the image's GPU path, where an image and a GPU are both here."""
    image = getattr(getattr(course, "container", None), "image", None)
    if shutil.which("docker") is None or not image:
        report.skipped.append("docker (no docker here, or course.yaml names no image)")
        return
    if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode != 0:
        report.skipped.append(f"docker (the image {image} is not built here: make image)")
        return
    if report.dry_run:
        report.skipped.append("docker (a dry run has no GPU to hand the container)")
        return
    subs = work / "docker-submissions"
    _copy_exercises(root, "solutions", ["online_softmax"], subs / "reference")
    out = work / "docker-results"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "grader", "batch", str(subs), "--out", str(out), "--backend", "docker",
                           "--gpus", "0", "--exercise", "online_softmax", "--seed", "20261201"], cwd=root,
                          capture_output=True, text=True, timeout=max(60.0, report.left() - 10))
    result_path = out / "reference.json"
    result = json.loads(result_path.read_text()) if result_path.is_file() else {}
    checks = {c["id"]: c for ex in result.get("exercises", []) for c in ex["checks"]}
    row = {"score": result.get("score"), "state": result.get("state"), "seconds": round(time.monotonic() - started, 1),
           "triton_speed": checks.get("triton_speed", {}).get("status"), "exit": proc.returncode}
    report.steps["docker"] = row
    if proc.returncode != 0 or result.get("state") != "complete" or row["triton_speed"] == "not_graded":
        report.problems.append(f"docker: the reference online_softmax through --backend docker --gpus 0: {row}; "
                               f"{(proc.stdout + proc.stderr)[-300:]}")


STEPS: list[tuple[str, float, Callable[..., None]]] = [  # (name, the least budget it needs, step), in priority order
    ("doctor", 5, lambda r, c, root, work: step_doctor(r)),
    ("reference", 60, step_reference),
    ("stubs", 30, step_stubs),
    ("known_wrong", 60, step_known_wrong),
    ("kernels", 60, step_kernels),
    ("benches", 30, lambda r, c, root, work: step_benches(r, c, root)),
    ("docker", 120, step_docker),
]


def run(course: Course, root: Path, out: Path | None, budget_s: float = DEFAULT_BUDGET_S, dry_run: bool = False,
        only: list[str] | None = None) -> Report:
    import torch

    if not dry_run and not torch.cuda.is_available():
        raise RuntimeError("grader gpu-check needs a CUDA device; without one, run it as the CPU rehearsal: "
                           "grader gpu-check --dry-run")
    report = Report(dry_run=dry_run, budget_s=budget_s)
    previous = os.environ.get("GRADER_REHEARSAL")
    if dry_run:
        os.environ["GRADER_REHEARSAL"] = "only"
        os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        with tempfile.TemporaryDirectory(prefix="grader-gpu-check-") as tmp:
            for name, least, step in STEPS:
                if only and name not in only:
                    continue
                if report.left() < least:
                    report.skipped.append(f"{name} (needs about {least:.0f} s, {max(report.left(), 0):.0f} s left)")
                    continue
                try:
                    step(report, course, root, Path(tmp))
                except Exception as exc:  # the grader's own code: name it, go on with the next step
                    import traceback

                    where = traceback.extract_tb(exc.__traceback__)[-1]
                    report.problems.append(f"{name} crashed: {type(exc).__name__}: {exc} "
                                           f"({where.filename}:{where.lineno})")
    finally:
        if previous is None:
            os.environ.pop("GRADER_REHEARSAL", None)
        else:
            os.environ["GRADER_REHEARSAL"] = previous
    if out is not None:
        out.write_text(json.dumps(report.as_dict(), indent=1, default=str) + "\n")
    return report


def print_report(report: Report, console: Any) -> None:
    from rich.table import Table

    from grader.text import inert

    data = report.as_dict()
    title = "GPU check" + (" (dry run: the CPU rehearsal, nothing here is a GPU figure)" if report.dry_run else "")
    table = Table(title=title, show_lines=False)
    for column in ("exercise", "test", "outcome", "figure", "bar", "floor", "margin", "suggested bar"):
        table.add_column(column, overflow="fold", min_width=8 if column in ("exercise", "test") else None)
    reference = data["steps"].get("reference", {})
    for row in reference.get("speed", []):
        figure = row.get("achieved")
        calibrated = not report.dry_run  # a rehearsal's figures are the CPU's: no margin, no suggestion
        table.add_row(inert(row["exercise"]), inert(row["test"]), _outcome(row, report.dry_run),
                      f"{figure:.3g}" if isinstance(figure, float) else "-", str(row["bar"]), str(row["floor"]),
                      str(row.get("margin", "-")) if calibrated else "-",
                      str(row.get("suggested_bar", "")) if calibrated else "")
    for row in reference.get("cuda_correctness", []):
        table.add_row(inert(row["exercise"]), inert(row["test"]), row["outcome"], "", "", "", "", "")
    console.print(table)
    memory = reference.get("peak_memory_mib")
    if memory:
        console.print(f"peak memory per exercise, MiB ({memory['what']}): "
                      + ", ".join(f"{inert(ex)} {mib:g}" for ex, mib in memory["per_exercise"].items()))
    stubs = data["steps"].get("stubs")
    if stubs is not None:
        console.print(f"stubs on the CUDA checks: {stubs['cuda_points']} points (must be 0)")
    for row in data["steps"].get("known_wrong", []):
        console.print(f"known-wrong {inert(row['exercise'])}/{inert(row['mutant'])}: {row['points']}"
                      + (f" [red]kept {row['kept']}[/]" if row["kept"] and not report.dry_run else ""))
    for row in data["steps"].get("kernels", []):
        figures = (f"{row['registers']} registers, {row['stack']} B stack, {row['shared']:,} B shared"
                   if row["registers"] is not None else "did not compile")
        console.print(f"kernel {inert(row['kernel'])} {row['arch']} {row['dtype']} ({inert(row['config'])}): {figures}")
    for row in data["steps"].get("benches", []):
        console.print(f"bench {inert(row['exercise'])}: {row['outcome']} in {row['seconds']} s")
    for skipped in data["skipped"]:
        console.print(f"[yellow]skipped[/]: {inert(skipped)}")
    for problem in data["problems"]:
        console.print(f"[red]problem[/]: {inert(problem)}")
    console.print(f"{'ok' if data['ok'] else 'FAILED'} in {data['elapsed_s']} s of a {report.budget_s:.0f} s budget")
