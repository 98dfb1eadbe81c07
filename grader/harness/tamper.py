"""The trusted static scan: does a student's file reach for the machinery the grader's probes use?

The forbidden-call guard and the line counter (grader/harness/probes.py) run in the process that
runs the student's code, so that code can dismantle them: pop the dispatch mode, switch off the
trace, patch the harness, find the probe objects through frames or the garbage collector. No probe
in that process can prove it was left alone. The grader's own process holds the student's file, so
it reads it here, as text, never importing it, and looks for references to that machinery:

* the dispatch-mode machinery (torch.utils._python_dispatch, TorchDispatchMode, torch._C and the
  other private torch modules, torch.overrides, torch.library, ``__torch_dispatch__``);
* tracing (sys.settrace, sys.setprofile, sys.monitoring, threading.settrace, a debugger);
* the harness (any import of, or name for, ``grader``; sys.modules, where it is loaded);
* frames and the garbage collector (sys._getframe, f_back, f_globals, tb_frame, gc.get_referrers,
  inspect.currentframe, ``__subclasses__``, ``__globals__``);
* native code (ctypes, cffi, torch.utils.cpp_extension);
* code where the probes are not installed (threads the student starts, new processes);
* dynamic code that could hide any of the above (exec, eval, compile, __import__, importlib,
  unpickling, getattr/setattr/delattr with a name computed at run time, ``__builtins__``,
  ``__dict__`` and ``vars`` of a module, strings that name any of the above).

The list is a deny-list of names, kept narrow enough that honest code never trips it (every file in
solutions/ and every stub scans clean: tests/test_tamper.py). It proves that the file does not name
the machinery, directly or through the dynamic constructs it flags. It cannot prove what an
obfuscated program does at run time by means this list does not name; grader/AUTHORING.md says so.

API: ``scan(source) -> list[Finding]`` (source as text, or as bytes decoded as Python would decode
them) and ``scan_file(path)``; a `Finding` prints as "line 12: sys.settrace: your code changes the
tracing the grader's probes use". `describe(findings)` joins a few for a message, and
`tampered_message(findings)` is what a guarded call of a flagged file fails with (as `Tampered`, an
AssertionError: a verdict on the file, not an error of the grader).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence


@dataclass(frozen=True, order=True)
class Finding:
    """One reference in the student's file to machinery that can tamper with the grader's probes."""

    line: int
    what: str  # the reference as the scan resolved it: "sys.settrace", "torch.utils._python_dispatch"
    why: str  # what it can do to the probes, in the student's terms

    def __str__(self) -> str:
        return f"line {self.line}: {self.what}: {self.why}"


# -- Why each kind of reference is flagged ----------------------------------------------------------

TRACING = "your code changes the tracing the grader's probes use"
DISPATCH = "your code reaches torch's dispatch-mode machinery, which the forbidden-call guard is built on"
TORCH_PRIVATE = "your code uses torch's private internals, which can switch off the grader's probes"
KERNELS = "your code registers operator kernels, which run where the forbidden-call guard cannot see"
HARNESS = "your code reaches the grader's own code"
INTROSPECTION = "your code inspects frames or the garbage collector, which can find and change the grader's probes"
NATIVE = "your code loads native code, which can change anything in the process"
THREADS = "your code starts threads of its own, which the grader's probes do not watch"
PROCESSES = "your code runs code in another process, where the grader's probes are not installed"
DYNAMIC = "your code builds code or names at run time, which hides what it reaches from the grader's checks"
ENCODING = "your file declares an unusual source encoding, which can show a reader different text than Python runs"
UNREADABLE = "the grader cannot parse your file, so it cannot check it"

# Modules (and everything under them), matched on whole dotted segments.
MODULES: dict[str, str] = {
    "grader": HARNESS,
    "ctypes": NATIVE, "_ctypes": NATIVE, "cffi": NATIVE, "torch.utils.cpp_extension": NATIVE,
    "torch.utils._python_dispatch": DISPATCH, "torch.overrides": DISPATCH, "torch.utils._mode_utils": DISPATCH,
    "torch.library": KERNELS, "torch._library": KERNELS, "torch.ops.load_library": KERNELS,
    "torch.ops.import_module": KERNELS,
    "sys.settrace": TRACING, "sys.setprofile": TRACING, "sys.gettrace": TRACING, "sys.getprofile": TRACING,
    "sys.monitoring": TRACING, "sys.call_tracing": TRACING, "sys.breakpointhook": TRACING,
    "pdb": TRACING, "bdb": TRACING, "trace": TRACING, "cProfile": TRACING, "profile": TRACING,
    "sys._getframe": INTROSPECTION, "sys._current_frames": INTROSPECTION, "sys._getframemodulename": INTROSPECTION,
    "sys.modules": HARNESS, "sys.meta_path": HARNESS, "sys.path_hooks": HARNESS, "sys.path_importer_cache": HARNESS,
    "gc.get_referrers": INTROSPECTION, "gc.get_referents": INTROSPECTION, "gc.get_objects": INTROSPECTION,
    "inspect.currentframe": INTROSPECTION, "inspect.stack": INTROSPECTION, "inspect.trace": INTROSPECTION,
    "inspect.getouterframes": INTROSPECTION, "inspect.getinnerframes": INTROSPECTION,
    "traceback.walk_stack": INTROSPECTION, "traceback.walk_tb": INTROSPECTION,
    "threading": THREADS, "_thread": THREADS, "concurrent": THREADS,
    "multiprocessing": PROCESSES, "torch.multiprocessing": PROCESSES, "subprocess": PROCESSES, "pty": PROCESSES,
    "os.system": PROCESSES, "os.popen": PROCESSES, "os.fork": PROCESSES, "os.forkpty": PROCESSES,
    "importlib": DYNAMIC, "imp": DYNAMIC, "runpy": DYNAMIC, "builtins": DYNAMIC, "code": DYNAMIC, "codeop": DYNAMIC,
    "pickle": DYNAMIC, "_pickle": DYNAMIC, "cPickle": DYNAMIC, "marshal": DYNAMIC, "shelve": DYNAMIC,
    "copyreg": DYNAMIC, "dill": DYNAMIC, "cloudpickle": DYNAMIC,
    "types.FunctionType": DYNAMIC, "types.CodeType": DYNAMIC, "types.LambdaType": DYNAMIC,
    "operator.attrgetter": DYNAMIC, "operator.methodcaller": DYNAMIC,
}
# os.exec*, os.spawn*, os.posix_spawn*: a family of names each.
_OS_PROCESS = re.compile(r"^os\.(exec|spawn|posix_spawn)\w*$")

# Attribute (or bare) names flagged wherever they appear, whatever object they are read from.
NAMES: dict[str, str] = {
    "settrace": TRACING, "setprofile": TRACING, "gettrace": TRACING, "getprofile": TRACING,
    "settrace_all_threads": TRACING, "setprofile_all_threads": TRACING, "f_trace": TRACING,
    "f_trace_lines": TRACING, "f_trace_opcodes": TRACING, "monitoring": TRACING, "breakpoint": TRACING,
    "set_trace": TRACING,
    "TorchDispatchMode": DISPATCH, "TorchFunctionMode": DISPATCH, "__torch_dispatch__": DISPATCH,
    "__torch_function__": DISPATCH, "_pop_mode": DISPATCH, "_push_mode": DISPATCH, "_disable_current_modes": DISPATCH,
    "_pop_mode_temporarily": DISPATCH, "no_dispatch": DISPATCH, "redispatch": DISPATCH, "DispatchKeySet": DISPATCH,
    "DispatchKey": DISPATCH, "py_impl": KERNELS, "py_kernels": KERNELS, "python_key_table": KERNELS,
    "functorch_table": KERNELS, "custom_op": KERNELS, "register_kernel": KERNELS, "load_library": KERNELS,
    "_getframe": INTROSPECTION, "_current_frames": INTROSPECTION, "f_back": INTROSPECTION,
    "f_globals": INTROSPECTION, "f_locals": INTROSPECTION, "f_builtins": INTROSPECTION, "tb_frame": INTROSPECTION,
    "gi_frame": INTROSPECTION, "cr_frame": INTROSPECTION, "ag_frame": INTROSPECTION,
    "get_referrers": INTROSPECTION, "get_referents": INTROSPECTION, "get_objects": INTROSPECTION,
    "currentframe": INTROSPECTION, "__subclasses__": INTROSPECTION, "__globals__": INTROSPECTION,
    "__closure__": INTROSPECTION, "__code__": INTROSPECTION, "__traceback__": INTROSPECTION,
    "__builtins__": DYNAMIC, "__import__": DYNAMIC, "__getattribute__": DYNAMIC, "__loader__": DYNAMIC,
    "_start_new_thread": THREADS, "start_new_thread": THREADS, "_start_joinable_thread": THREADS,
}
# Names flagged when read as an attribute (x.__getattr__(name) reaches what `x.name` would), but not
# when a class defines them, as honest classes do.
ATTRIBUTES_ONLY: dict[str, str] = {"__getattr__": DYNAMIC}
BUILTINS: dict[str, str] = {"exec": DYNAMIC, "eval": DYNAMIC, "compile": DYNAMIC, "__import__": DYNAMIC}
# Segments that flag a string constant naming them ("_C", "grader.harness.probes"): the name a
# dynamic lookup would use. Every name in NAMES counts too.
STRING_SEGMENTS = frozenset({
    "grader", "ctypes", "_ctypes", "cffi", "_C", "_python_dispatch", "_mode_utils", "_library", "cpp_extension",
    "_thread", "overrides", "_dynamo", "_subclasses", "_ops",
})
_ATTRIBUTE_CALLS = ("getattr", "setattr", "delattr")
_SELF = ("self", "cls")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_PYTHON_ENCODINGS = ("utf-8", "utf-8-sig", "ascii", "us-ascii", "latin-1", "iso-8859-1")
_UNSAFE_KEYWORDS = {"weights_only": False, "allow_pickle": True}  # torch.load, numpy.load: unpickling


def scan(source: str | bytes) -> list[Finding]:
    """Every reference in `source` that could tamper with the grader's probes, in line order.

    Bytes are decoded as Python decodes a source file (its coding cookie), so the scan reads the
    text the interpreter runs. A file that does not parse gives one finding, so that it fails closed."""
    findings: list[Finding] = []
    if isinstance(source, bytes):
        try:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
            text = source.decode(encoding)
        except (SyntaxError, LookupError, UnicodeDecodeError) as exc:
            return [Finding(1, type(exc).__name__, f"{UNREADABLE} ({exc})")]
        if encoding.lower().replace("_", "-") not in _PYTHON_ENCODINGS:
            findings.append(Finding(1, f"coding: {encoding}", ENCODING))
    else:
        text = source
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        line = getattr(exc, "lineno", None) or 1
        return [Finding(line, type(exc).__name__, f"{UNREADABLE} ({getattr(exc, 'msg', exc)})")]
    try:
        _Scanner(findings).run(tree)
    except RecursionError:  # nested deeper than this process can walk: fail closed
        findings.append(Finding(1, "RecursionError", f"{UNREADABLE} (it nests too deeply)"))
    return sorted(set(findings))


def scan_file(path: str | Path) -> list[Finding]:
    """`scan` of a file's bytes (decoded as the interpreter would decode them)."""
    return scan(Path(path).read_bytes())


class Tampered(AssertionError):
    """A check that runs beside the student's code cannot be trusted: their file reaches for its machinery."""


def tampered_message(findings: Sequence[Finding]) -> str:
    """What a guarded call of a flagged file fails with (local and sandboxed modes alike)."""
    return (
        f"{describe(findings)}; the forbidden-call and structural checks cannot be trusted, so they fail. They run "
        "in the process that runs your code, and your file reaches for what they are built on. Remove that code: "
        "this exercise needs none of it."
    )


def describe(findings: Sequence[Finding], limit: int = 3) -> str:
    """A few findings joined for a message: "line 3: ...; line 9: ... (and 2 more)"."""
    shown = "; ".join(str(f) for f in findings[:limit])
    return shown + (f" (and {len(findings) - limit} more)" if len(findings) > limit else "")


# -- The scanner ------------------------------------------------------------------------------------


def _module_rule(path: str) -> str | None:
    """Why a dotted path is flagged, by the module table, the os process family or torch's privates."""
    parts = path.split(".")
    for end in range(1, len(parts) + 1):
        why = MODULES.get(".".join(parts[:end]))
        if why:
            return why
    if _OS_PROCESS.match(path):
        return PROCESSES
    if parts[0] == "torch":
        # torch.ops.<namespace>.<operator> names an operator (the guard sees those); after it, and
        # everywhere else under torch, a private segment is internals.
        first_free = 4 if parts[1:2] == ["ops"] else 1
        if any(p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in parts[first_free:]):
            return TORCH_PRIVATE
    return None


# The course's helper modules a student may import by name, to try their code as its README shows
# (from grader.support.ring_allreduce import run_simulated); every other reference to grader is flagged.
_HARNESS_PARTS = frozenset({"harness", "probes", "session", "worker", "client", "launch", "wire", "tamper", "plugin"})


def _course_helper(module: str) -> bool:
    parts = module.split(".")
    return module == "grader.testing" or (len(parts) == 3 and parts[:2] == ["grader", "support"])


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in _SELF


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class _Scanner(ast.NodeVisitor):
    def __init__(self, findings: list[Finding]):
        self.findings = findings
        self.aliases: dict[str, str] = {}  # local name -> the dotted module path it was imported as
        self.bound: set[str] = set()  # names the file binds itself (its own `compile` is no builtin)

    def flag(self, node: ast.AST, what: str, why: str) -> None:
        self.findings.append(Finding(getattr(node, "lineno", 1), what, why))

    def run(self, tree: ast.AST) -> None:
        for node in ast.walk(tree):  # aliases and bindings first: a function may use a name bound below it
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.aliases[alias.asname] = alias.name
                    else:
                        root = alias.name.split(".")[0]
                        self.aliases[root] = root
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    if alias.name != "*":
                        self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                self.bound.add(node.id)
            elif isinstance(node, ast.arg):
                self.bound.add(node.arg)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.bound.add(node.name)
        self.bound -= set(self.aliases)
        self.visit(tree)

    # -- what a name or an attribute chain stands for

    def dotted(self, node: ast.AST) -> str | None:
        """'torch.utils._python_dispatch' for that attribute chain, through import aliases."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def check_path(self, node: ast.AST, path: str) -> bool:
        """Flag a resolved dotted path by the module table, torch's privates, or its last name."""
        last = path.rsplit(".", 1)[-1]
        why = _module_rule(path) or NAMES.get(last) or ATTRIBUTES_ONLY.get(last)
        if why:
            self.flag(node, path, why)
        return why is not None

    # -- visitors

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.check_path(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module:
            return  # a relative import: a lone student file has no package to import from
        if _course_helper(node.module) and not any(a.name in _HARNESS_PARTS or a.name in NAMES for a in node.names):
            return  # run_simulated & co., imported by name (what they reach is flagged where it is used)
        if not self.check_path(node, node.module):
            for alias in node.names:
                if alias.name != "*":
                    self.check_path(node, f"{node.module}.{alias.name}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        path = self.dotted(node)
        if path is not None:
            if self.check_path(node, path):
                return  # one finding per chain, not one more for each of its prefixes
            if node.attr == "__dict__":
                self.flag(node, path, DYNAMIC)
                return
        elif node.attr in NAMES or node.attr in ATTRIBUTES_ONLY:
            self.flag(node, f"...{node.attr}", NAMES.get(node.attr) or ATTRIBUTES_ONLY[node.attr])
            return
        elif node.attr == "__dict__" and not _is_self(node.value):
            self.flag(node, "...__dict__", DYNAMIC)
            return
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in self.bound or node.id in self.aliases:
            return
        why = BUILTINS.get(node.id) or NAMES.get(node.id)
        if why:
            self.flag(node, node.id, why)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id not in self.bound and func.id not in self.aliases:
            if func.id in _ATTRIBUTE_CALLS and len(node.args) >= 2:
                self.check_attribute_call(node, func.id, node.args[0], node.args[1])
            elif func.id == "vars" and node.args and not _is_self(node.args[0]):
                self.flag(node, "vars(...)", DYNAMIC)
        for keyword in node.keywords:
            if keyword.arg in _UNSAFE_KEYWORDS:
                safe = not _UNSAFE_KEYWORDS[keyword.arg]
                if not (isinstance(keyword.value, ast.Constant) and keyword.value.value is safe):
                    self.flag(keyword.value, f"{keyword.arg}=...", f"{DYNAMIC} (unpickling can call any function)")
        self.generic_visit(node)

    def check_attribute_call(self, node: ast.Call, call: str, target: ast.AST, name: ast.AST) -> None:
        """getattr(obj, name) and friends: a constant name is an attribute; a computed one hides it."""
        if isinstance(name, ast.Constant) and isinstance(name.value, str):
            base = self.dotted(target)
            if base is not None:
                self.check_path(node, f"{base}.{name.value}")
            elif name.value in NAMES or (_private(name.value) and not _is_self(target)):
                self.flag(node, f"{call}(..., {name.value!r})", NAMES.get(name.value, DYNAMIC))
        elif not _is_self(target):
            self.flag(node, f"{call} with a computed name", DYNAMIC)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if node.name in NAMES:  # defining __torch_dispatch__ makes an object the dispatcher calls into
            self.flag(node, node.name, NAMES[node.name])
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Constant(self, node: ast.Constant) -> None:
        text = node.value
        if isinstance(text, str) and len(text) <= 200 and _IDENTIFIER.match(text):
            if any(part in NAMES or part in STRING_SEGMENTS for part in text.split(".")):
                self.flag(node, repr(text), f"{DYNAMIC} (a string that names the grader's machinery)")


def scan_sources(sources: Iterable[tuple[str, str | bytes]]) -> dict[str, list[Finding]]:
    """`scan` of several named sources: name -> findings (for tests and reports)."""
    return {name: scan(source) for name, source in sources}
