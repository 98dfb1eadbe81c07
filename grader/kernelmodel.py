"""The kernel resource model: does a Triton kernel, as the student launched it, fit a real GPU?

On the CPU, Triton's interpreter runs a kernel's body as numpy: a program may hold a tile of any width, and a
kernel that holds a whole row of 2^19 columns in one tile gives the same numbers as one that loops over the row in
tiles of 4096. A GPU cannot hold that tile: a program's tiles live in its threads' registers (at most 255 per
thread, 64K per SM), and what does not fit spills to local memory ("stack"), or fails to compile at all. This
module asks the real toolchain: Triton's compiler and the ``ptxas`` in its wheel compile a kernel for ``sm_90``
with no GPU present, and ``cuobjdump -res-usage`` reads the cubin's registers, stack and shared memory.

How (trusted side; nothing of the student's runs in the grader's process):

1. The worker records each launch (grader.harness.launches: `describe_argument`, `Launch.arguments` and
   `options`; the driver grader.support.kernels:launches returns them): the kernel's name, each argument's
   Triton type (tensor dtypes and alignment, ints by value), the constexprs and num_warps / num_stages.
2. `KernelSource` reads the student's file as text (never importing it) and extracts its module-level
   ``@triton.jit`` kernels and module constants, as the tamper scan's kernel rule (grader/harness/kernels.py,
   rule 10) defines them. That rule guarantees a kernel body holds only Triton (calls of triton.language,
   the file's other kernels, a few builtins) and that module constants are literals, and `resources` refuses a
   file the scan flags: so the module generated from them (the kernels' own text, at the same relative lines,
   under a plain ``@triton.jit``; the file's Triton imports; its constants) runs no host code of the student's
   when imported. Autotune and heuristics decorators are dropped: the launch record holds the values they chose.
3. Each distinct compile (kernel, signature, constexprs, options) runs in a fresh process
   (grader/kernelcompile.py, ``python -I``, no ``TRITON_INTERPRET``, a private Triton cache) with a timeout
   (`COMPILE_TIMEOUT_S`): ptxas takes minutes on a tile far beyond the registers, so a timeout counts as not
   fitting. Before that, a tile far beyond them is refused from the TritonGPU IR in a fraction of a second
   (kernelcompile.FAR_BEYOND: one register tensor of over four times a thread's 255 registers, at the least,
   in each thread), where LLVM and ptxas would take minutes to say the same. Results are cached by (generated source, signature, constexprs, options, Triton version), in memory
   and on disk (`cache_dir`).

What it proves: each launched kernel, with the tiles the launch chose, compiles for sm_90, and its per-thread
state fits the registers (`STACK_LIMIT` bytes of spill at most) and its shared memory the SM (`SHARED_LIMIT`).
What it cannot see: how the kernel uses memory (uncoalesced or repeated reads, a wasteful second pass over the
row, a loop that re-reads what a tile already held), occupancy and speed (the CUDA speed checks measure those),
and a launch the record did not see. The record comes from the worker, the student's process: a test calls
`student.assert_untampered` (the tamper gate) before trusting it, as for every worker-side figure; a forged
record (smaller constexprs than the launch used) is what that gate stands against.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tokenize
from pathlib import Path
from typing import Any, Iterable

TARGET = ("cuda", 90, 32)  # H100-class: sm_90, warps of 32 threads
STACK_LIMIT = 512  # bytes of spilled state per thread: more is a tile that lives in local memory, not registers
SHARED_LIMIT = 232448  # bytes of shared memory a block may have on sm_90 (227 KiB, with the opt-in)
# Per architecture (a `target` other than TARGET: resources(..., target=("cuda", 80, 32))): the opt-in maximum of
# dynamic shared memory per block, sm_80 (A100) 163 KiB, sm_90 (H100, H200) 227 KiB.
SHARED_LIMITS = {80: 166912, 90: SHARED_LIMIT}
COMPILE_TIMEOUT_S = 120.0
MAX_VARIANTS = 16  # distinct compiles modelled per call; a call that launches more is refused, not compiled
MODEL_VERSION = 2  # part of every cache key: bump when the generated module or the child's output changes

_CHILD = Path(__file__).with_name("kernelcompile.py")
_JIT_KEYWORDS = ("do_not_specialize", "do_not_specialize_on_alignment", "noinline", "debug")
_PREFIX = "_kernelmodel_"


@dataclasses.dataclass(frozen=True)
class LaunchResources:
    """One distinct compile of a recorded launch, and what the toolchain found.

    `registers` per thread, `stack` bytes of spill per thread, `shared` bytes of dynamic shared memory (what
    Triton asks at launch; `static_shared` is the cubin's own); `error` when it did not compile (or could not be
    modelled), `timed_out` when the compiler ran past the timeout. `launches` counts the recorded launches that
    share this compile; `seconds` the compile's wall time (0 from the cache)."""

    kernel: str
    constexprs: dict
    num_warps: int
    num_stages: int
    registers: int | None = None
    stack: int | None = None
    shared: int | None = None
    static_shared: int | None = None
    error: str | None = None
    timed_out: bool = False
    overflow: str | None = None  # a tile far beyond the registers, refused before compiling (kernelcompile.FAR_BEYOND)
    not_compiled: bool = False  # an earlier variant of the call did not fit, so this one was not compiled
    launches: int = 1
    seconds: float = 0.0
    cached: bool = False
    arch: int = TARGET[1]  # the compute capability compiled for: 90 is sm_90

    @property
    def threads(self) -> int:
        return self.num_warps * TARGET[2]

    @property
    def shared_limit(self) -> int:
        return SHARED_LIMITS.get(self.arch, SHARED_LIMIT)

    def problems(self) -> list[str]:
        """What does not fit, in words (empty when it fits)."""
        if self.not_compiled:
            return []
        if self.overflow is not None:
            return [self.overflow]
        if self.timed_out:
            return [f"the GPU compiler did not finish within {COMPILE_TIMEOUT_S:.0f} s: ptxas takes that long when a "
                    "program's tiles overflow the registers by far, so the model counts it as not fitting"]
        if self.error is not None:
            return [f"it does not compile for sm_{self.arch}: {self.error}"]
        found = []
        if self.stack is not None and self.stack > STACK_LIMIT:
            found.append(f"each of its {self.threads} threads spills {self.stack:,} bytes of its state to local memory "
                         f"(stack), over the {STACK_LIMIT} bytes allowed ({self.registers} registers per thread)")
        if self.shared is not None and self.shared > self.shared_limit:
            found.append(f"it asks for {self.shared:,} bytes of shared memory, over the {self.shared_limit:,} bytes "
                         f"({self.shared_limit // 1024} KiB) an sm_{self.arch} block may have")
        return found

    def fits(self) -> bool:
        return not self.not_compiled and not self.problems()

    def describe(self) -> str:
        """'one_tile (BLOCK=131072, num_warps=8, num_stages=3)'."""
        shown = ", ".join(f"{k}={v}" for k, v in self.constexprs.items())
        return f"{self.kernel} ({shown + ', ' if shown else ''}num_warps={self.num_warps}, num_stages={self.num_stages})"

    def figures(self) -> str:
        if self.error is not None or self.timed_out or self.overflow is not None or self.registers is None:
            return "no figures (it did not compile)"
        return (f"{self.registers} registers and {self.stack:,} bytes of stack per thread, {self.shared:,} bytes of "
                f"shared memory, {self.threads} threads")


# -- The student's kernels, read as text


class KernelSource:
    """The module-level Triton kernels of a student's file and what they need (Triton imports, module constants),
    as the source of a module that runs none of the student's host code."""

    def __init__(self, text: str, filename: str = "the student's file"):
        from grader.harness import tamper
        from grader.harness.kernels import KernelRule, is_kernel_decorator

        self.filename = filename
        tree = ast.parse(text)
        scanner = tamper._Scanner([], False, False)  # its import aliases and parent map only; findings are dropped
        scanner.run(tree)
        rule = KernelRule(tree, scanner.dotted, lambda *_: None, scanner.parents)
        constants, _ = rule.module_constants()
        lines = re.split(r"\r\n|\r|\n", text)  # Python's own line breaks (splitlines also breaks at \f and \x1c)
        self.kernels: dict[str, ast.FunctionDef] = {}
        self.def_lines: dict[str, int] = {}
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and any(is_kernel_decorator(rule.decorator_path(d))
                                                         for d in node.decorator_list):
                self.kernels[node.name] = node
        future = any(isinstance(n, ast.ImportFrom) and n.module == "__future__"
                     and any(a.name == "annotations" for a in n.names) for n in tree.body)
        out = ["# Generated by grader.kernelmodel: the kernels and module constants of the student's file, no host code.",
               *(["from __future__ import annotations"] if future else []),
               f"import importlib as {_PREFIX}importlib",
               f"import triton as {_PREFIX}triton",
               "",
               f"def {_PREFIX}resolve(path):",
               "    parts = path.split('.')",
               "    for cut in range(len(parts), 0, -1):",
               "        try:",
               f"            value = {_PREFIX}importlib.import_module('.'.join(parts[:cut]))",
               "        except ImportError:",
               "            continue",
               "        for name in parts[cut:]:",
               "            value = getattr(value, name, None)",
               "        return value",
               "    return None",
               ""]
        for name, path in sorted(scanner.aliases.items()):  # the file's names for Triton and its parts
            if (path == "triton" or path.startswith("triton.")) and name.isidentifier() and name not in self.kernels:
                out.append(f"{name} = {_PREFIX}resolve({path!r})")
        assigned = []
        for stmt in tree.body:  # module constants, in the file's order (values are literals: the rule's constants)
            for node in _statements(stmt):
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    names = [t.id for t in targets if isinstance(t, ast.Name) and t.id in constants]
                    if names and len(names) == len(targets):
                        assigned.append(f"{' = '.join(names)} = {ast.unparse(node.value)}")
        out += assigned
        for name, node in self.kernels.items():
            keywords = []
            for dec in node.decorator_list:
                if isinstance(dec, ast.Call) and rule.decorator_path(dec) == "triton.jit":
                    for kw in dec.keywords:
                        if kw.arg in _JIT_KEYWORDS:
                            try:
                                keywords.append(f"{kw.arg}={ast.literal_eval(kw.value)!r}")
                            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                                pass  # not a literal: left out, as Triton's defaults
            out += ["", "", f"@{_PREFIX}triton.jit({', '.join(keywords)})"]
            self.def_lines[name] = node.lineno
            out += lines[node.lineno - 1:node.end_lineno]  # the kernel's own text: errors point at its lines
        self.text = "\n".join(out) + "\n"
        self.digest = hashlib.sha256(self.text.encode()).hexdigest()

    def params(self, kernel: str) -> list[tuple[str, bool]]:
        """(name, annotated) for each parameter of a kernel."""
        args = self.kernels[kernel].args
        return [(a.arg, a.annotation is not None) for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]

    def file_line(self, kernel: str, relative: int) -> int:
        """The line of the student's file at `relative` (1 = the def line) of a kernel."""
        return self.def_lines[kernel] + relative - 1


def _statements(stmt: ast.stmt):
    from grader.harness.kernels import _module_level

    yield from _module_level(stmt)


# -- Compiles, cached


_MEMORY: dict[str, dict] = {}
_LOCK = threading.Lock()


def cache_dir() -> Path | None:
    """Where results are kept between grades: $GRADER_KERNELMODEL_CACHE, or ~/.cache/grader/kernelmodel
    ($XDG_CACHE_HOME respected); "off" for none. The grader's own directory: the worker cannot write there
    (a sandboxed worker runs as another user and sees no home; the tamper gate flags a file that opens files)."""
    setting = os.environ.get("GRADER_KERNELMODEL_CACHE", "")
    if setting == "off":
        return None
    if setting:
        return Path(setting)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "grader" / "kernelmodel"


def _disk_get(key: str) -> dict | None:
    where = cache_dir()
    if where is None:
        return None
    try:
        value = json.loads((where / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _disk_put(key: str, value: dict) -> None:
    where = cache_dir()
    if where is None:
        return
    try:
        where.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=where, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(value, f)
        os.replace(tmp, where / f"{key}.json")
    except OSError:
        pass  # a read-only home: the in-memory cache still serves this grade


def _triton_version() -> str:
    try:
        from importlib.metadata import version

        return version("triton")
    except Exception:  # noqa: BLE001
        return "unknown"


def _normalised(source: KernelSource, kernel: str, arguments: dict) -> dict:
    """The recorded arguments with what cannot change the compile taken out: an un-annotated parameter is never a
    constexpr, so its int value matters only through Triton's specialisation (1, divisible by 16, its width)."""
    plain = {name for name, annotated in source.params(kernel) if not annotated} if kernel in source.kernels else set()
    out = {}
    for name, desc in sorted(arguments.items()):
        if name in plain and isinstance(desc, dict) and desc.get("kind") == "int" and type(desc.get("value")) is int:
            v = desc["value"]
            width = "i32" if -(2**31) <= v < 2**31 else "i64" if -(2**63) <= v < 2**63 else "u64"
            desc = {"kind": "int", "class": "one" if v == 1 else f"{width}{'D' if v % 16 == 0 else ''}"}
        elif name in plain and isinstance(desc, dict) and desc.get("kind") == "float":
            desc = {"kind": "float"}
        out[name] = desc
    return out


def _compile(module_path: str, kernel: str, arguments: dict, options: dict, timeout: float,
             target: tuple = TARGET) -> tuple[dict, float]:
    """One compile in a fresh process: (the child's answer, or {"timed_out": True} / {"error": ...}; seconds)."""
    request = json.dumps({"module": module_path, "kernel": kernel, "arguments": arguments, "options": options,
                          "target": list(target)})
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITON_")}
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kernelmodel-") as scratch:
        env.update(TRITON_CACHE_DIR=os.path.join(scratch, "cache"), TRITON_DEFAULT_FP_FUSION="1",
                   TRITON_HOME=scratch)
        proc = subprocess.Popen([sys.executable, "-I", str(_CHILD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, cwd=scratch, start_new_session=True, text=True)
        try:
            out, err = proc.communicate(request, timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the child and its ptxas
            except ProcessLookupError:
                pass
            proc.communicate()
            return {"timed_out": True}, time.monotonic() - start
    seconds = time.monotonic() - start
    try:
        answer = json.loads(out)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        tail = (err or out or "").strip()[-600:]
        return {"error": f"the compiler process ended with status {proc.returncode} and no answer: {tail}",
                "stage": "crash"}, seconds
    return answer, seconds


def _cleaned_error(source: KernelSource, kernel: str, answer: dict) -> str:
    """The compiler's message, its 'at 4:11:' placed on the student's file's lines, cut to a readable length."""
    text = str(answer.get("error", "")).strip()
    match = re.match(r"at (\d+):(\d+):", text)
    if match and kernel in source.def_lines:
        line = source.file_line(kernel, int(match.group(1)))
        text = f"line {line} of {source.filename}, column {int(match.group(2)) + 1}:" + text[match.end():]
    if len(text) > 1500:
        text = text[:700] + "\n...\n" + text[-700:]
    return text


def _variant(launch: dict) -> tuple[str, dict, dict] | None:
    kernel, arguments, options = launch.get("kernel"), launch.get("arguments"), launch.get("options")
    if not isinstance(kernel, str) or not isinstance(arguments, dict) or not isinstance(options, dict):
        return None
    opts = {k: options[k] for k in ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion")
            if k in options and type(options[k]) in (int, bool)}
    return kernel, arguments, opts


def resources(path: str | Path, launches: Iterable[dict], stop_at_misfit: bool = True,
              timeout: float = COMPILE_TIMEOUT_S, target: tuple = TARGET) -> list[LaunchResources]:
    """Each distinct compile among `launches` (as grader.support.kernels:launches records them) of the kernels
    in the student's file at `path`, in launch order, with the toolchain's figures.

    `stop_at_misfit`: once one variant does not fit, the rest are listed as not compiled (a grade pays for one
    slow compile, not for every launch of a kernel that spills). The file is read here, as text; a file the
    tamper scan flags is not compiled (its kernels may hold more than Triton), and neither is a launch whose
    arguments the worker could not describe. `target` is (backend, compute capability, warp size): TARGET, sm_90,
    for every grade; ("cuda", 80, 32) compiles for sm_80 (tests/test_reference_kernels_compile.py)."""
    from grader.harness import tamper

    path = Path(path)
    raw = path.read_bytes()
    findings = tamper.scan(raw)
    launches = list(launches)
    if findings:
        raise tamper.Tampered(f"the kernel resource model reads your kernels from your file, and the file reaches for "
                              f"what the grader's checks are built on ({tamper.describe(findings)}), so its kernels "
                              "are not compiled and the check fails")
    encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)  # as the scan and the interpreter decode it
    source = KernelSource(raw.decode(encoding), path.name)
    variants: dict[str, tuple[LaunchResources, str, dict, dict]] = {}
    order: list[str] = []
    counts: dict[str, int] = {}
    for launch in launches:
        found = _variant(launch)
        if found is None:
            kernel = str(launch.get("kernel", "kernel"))[:80]
            key = f"undescribed:{kernel}"
            if key not in variants:
                order.append(key)
                variants[key] = (LaunchResources(kernel, {}, 0, 0, error="the launch's arguments were not recorded, "
                                                 "so the model cannot compile it"), "", {}, {})
            counts[key] = counts.get(key, 0) + 1
            continue
        kernel, arguments, options = found
        normal = _normalised(source, kernel, arguments)
        key = hashlib.sha256(json.dumps([MODEL_VERSION, _triton_version(), list(target), source.digest, kernel, normal,
                                         options], sort_keys=True, default=str).encode()).hexdigest()
        counts[key] = counts.get(key, 0) + 1
        if key in variants:
            continue
        order.append(key)
        constexprs = {name: _shown(arguments.get(name)) for name, annotated in
                      (source.params(kernel) if kernel in source.kernels else []) if annotated and name in arguments}
        stub = LaunchResources(kernel, constexprs, int(options.get("num_warps", 4)), int(options.get("num_stages", 3)),
                               arch=int(target[1]))
        variants[key] = (stub, kernel, arguments, options)
    if len(order) > MAX_VARIANTS:
        first = variants[order[0]][0]
        return [dataclasses.replace(first, error=f"the call launched {len(order)} distinct compiles of its kernels "
                                    f"(kernel, argument types, constexprs, num_warps); the model compiles at most "
                                    f"{MAX_VARIANTS} per call. A kernel is compiled once per distinct set of "
                                    "constexprs: keep the tile sizes fixed, not a function of each row")]
    results: list[LaunchResources] = []
    misfit = False
    with tempfile.TemporaryDirectory(prefix="kernelmodel-src-") as tmp:
        module_path = os.path.join(tmp, f"kernels_{source.digest[:12]}.py")
        Path(module_path).write_text(source.text, encoding="utf-8")
        for key in order:
            stub, kernel, arguments, options = variants[key]
            stub = dataclasses.replace(stub, launches=counts[key])
            if stub.error is not None:
                results.append(stub)
                misfit = True
                continue
            if misfit and stop_at_misfit:
                results.append(dataclasses.replace(stub, not_compiled=True))
                continue
            if kernel not in source.kernels:
                results.append(dataclasses.replace(stub, error=f"no module-level @triton.jit function named {kernel!r} "
                                                   f"in {source.filename}: the model compiles the kernels of your file"))
                misfit = True
                continue
            result = _answer(key, source, module_path, kernel, arguments, options, stub, timeout, target)
            results.append(result)
            misfit = misfit or not result.fits()
    return results


def _shown(desc: Any) -> Any:
    if isinstance(desc, dict) and "value" in desc:
        return desc["value"]
    if isinstance(desc, dict) and desc.get("kind") == "none":
        return None
    return desc.get("kind") if isinstance(desc, dict) else desc


def _answer(key: str, source: KernelSource, module_path: str, kernel: str, arguments: dict, options: dict,
            stub: LaunchResources, timeout: float, target: tuple = TARGET) -> LaunchResources:
    with _LOCK:
        answer = _MEMORY.get(key)
    cached = answer is not None
    seconds = 0.0
    if answer is None:
        answer = _disk_get(key)
        cached = answer is not None
    if answer is None:
        answer, seconds = _compile(module_path, kernel, arguments, options, timeout, target)
        if not answer.get("timed_out") and answer.get("stage") != "crash":
            _disk_put(key, answer)  # timeouts and crashes depend on the machine's load: never kept
        with _LOCK:
            _MEMORY[key] = answer
    if answer.get("timed_out"):
        return dataclasses.replace(stub, timed_out=True, seconds=seconds, cached=cached)
    if answer.get("stage") == "registers":
        return dataclasses.replace(stub, overflow=str(answer.get("error")), seconds=seconds, cached=cached)
    if "error" in answer:
        return dataclasses.replace(stub, error=_cleaned_error(source, kernel, answer), seconds=seconds, cached=cached)
    try:
        return dataclasses.replace(stub, registers=int(answer["registers"]), stack=int(answer["stack"]),
                                   shared=int(answer["shared"]), static_shared=int(answer.get("static_shared", 0)),
                                   seconds=seconds, cached=cached)
    except (KeyError, TypeError, ValueError):
        return dataclasses.replace(stub, error=f"the compiler's answer was not understood: {str(answer)[:300]}")


@dataclasses.dataclass
class KernelRun:
    """A call made with its launches recorded, and the resources of each distinct compile
    (`StudentSession.kernel_resources`)."""

    out: Any  # what the call returned
    launches: list[dict]  # grader.support.kernels:launches's record, in launch order
    handed: list[bool]  # for each returned tensor: was its memory handed to a launch
    resources: list[LaunchResources]


# -- The judgement


TILE_LESSON = (
    "A program's tiles live in its threads' registers: a GPU thread has at most 255 of them, and a program at most "
    "1024 threads, so a tile that holds a whole row (or a whole key range) of a long input cannot live there; what "
    "does not fit spills to local memory, an order of magnitude slower, or does not compile. Give the tile a fixed "
    "width (a few thousand elements at most) and loop over the row with it, carrying what the row needs from tile "
    "to tile."
)
INTERPRETER_LESSON = (
    "Under TRITON_INTERPRET=1 a kernel body runs as Python, so code the GPU compiler refuses (a tl.arange or a "
    "tile shape whose bounds are not tl.constexpr, a module global that is not a tl.constexpr, a shape that is not "
    "a power of two) still runs on the CPU; a GPU compiles the kernel and refuses it."
)


def _per_thread(result: LaunchResources) -> str:
    """'BLOCK=131072 elements over 256 threads is 512 a thread, per tile of that width': the widest int
    constexpr against the threads, the arithmetic behind a spill."""
    tiles = [(v, k) for k, v in result.constexprs.items() if type(v) is int and v >= result.threads > 0]
    if not tiles:
        return ""
    width, name = max(tiles)
    return (f"; {name}={width} elements over {result.threads} threads is {width // result.threads} values a thread "
            "for each tile of that width, against at most 255 registers")


def assert_fit(found: list[LaunchResources], what: str, hint: str = "") -> None:
    """Fail, with a message that teaches, unless every compiled launch fits: it compiles for sm_90, spills at most
    STACK_LIMIT bytes per thread and asks at most SHARED_LIMIT bytes of shared memory."""
    if not found:
        raise AssertionError(f"{what}: no Triton launch was recorded, so there is no kernel to judge: launch a "
                             "@triton.jit kernel as kernel[grid](...)")
    for result in found:
        problems = result.problems()
        if not problems:
            continue
        counted = f" ({result.launches} launches of it)" if result.launches > 1 else ""
        tail = f" {hint}" if hint else ""
        if result.error is not None:
            raise AssertionError(
                f"{what}: the kernel {result.describe()}{counted} does not compile for an H100-class GPU (sm_90) with "
                f"Triton's compiler: {result.error}\n{INTERPRETER_LESSON}")
        if result.timed_out:
            raise AssertionError(
                f"{what}: the kernel {result.describe()}{counted}: {problems[0]}{_per_thread(result)}. "
                f"{TILE_LESSON}{tail}")
        raise AssertionError(
            f"{what}: the kernel {result.describe()}{counted}, compiled for an H100-class GPU (sm_90) by Triton's "
            f"compiler and ptxas, does not fit: {'; '.join(problems)}{_per_thread(result)}. {TILE_LESSON}{tail}")
