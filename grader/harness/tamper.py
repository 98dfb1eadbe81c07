"""The trusted static scan: does a student's file reach for the machinery the grader's probes use?

The forbidden-call guard and the line counter (grader/harness/guard.py, counters.py) run in the process that
runs the student's code, so that code can dismantle them: pop the dispatch mode, switch off the
trace, patch the harness, find the probe objects through frames or the garbage collector. No probe
in that process can prove it was left alone. The grader's own process holds the student's file, so
it reads it here, as text, never importing it, and looks for references to that machinery.

Three rule sets. The default (rules 1-4, 6, 7, 9) guards the probes themselves: the forbidden-call
guard's load (grader.harness.session) uses it. ``structural=True`` adds rule 5 (patching modules and
classes in place), for the structural checks' gate (`assert_untampered` below), whose
figures also come from the course drivers the student's process runs. ``clocks=True`` adds rule 8
(sockets, clocks, waits), for grader.structure.clock, which times the student's calls: a file that
reads a clock fails the timed checks, not the others. Rules 5 and 8 are kept out of the default
because they do not touch the guard, and the sandbox's own hostile tests (a socket that sends half a
reply, a patched torch.allclose) must reach the worker.

The rules, exactly (each finding names its line, what it resolved the reference to, and why):

0. **Imports** (`IMPORTABLE`, `SUBMODULES`): a chain rooted at an imported module must start at one of
   the modules a submission may use: torch, triton, numpy, and the standard library's modules that hold
   data, numbers and text (math, typing, dataclasses, collections, functools, itertools, os, sys, time,
   ...). Of numpy, torch.utils and triton, only the listed submodules (numpy.linalg, numpy.random,
   triton.language, ...); a function or class of the parent is fine. A module re-exported under an
   allowed one is checked as itself (``torch.os`` is os, ``numpy.ctypeslib.ctypes`` is ctypes),
   resolved from the grader's own imports through module namespaces only; a standard module's name
   the walk cannot find at the end of a chain counts as that module. The list replaced a deny-list
   that each round of attacks found a neighbour of (doctest ran hex-encoded source; sqlite3 loads
   native extensions; asyncio starts processes; types.SimpleNamespace(**d), enum's functional API and
   logging's records set attributes named at run time).
1. **Modules and names** (`MODULES`, `NAMES`, matched on whole dotted segments, through import
   aliases and names assigned once from an aliased chain, ``s = sys``, and again from every segment
   that names a standard module re-exported there: ``os.sys.modules``, ``F.torch._C``). A module
   bound by ``import`` may only be the root of an attribute chain, getattr's object with a literal
   name, or the value of such an alias: anywhere else (in a list, an argument, a conditional, a
   ``match`` subject) the chain would be lost, so it is flagged. The dispatch-mode machinery
   (torch.utils._python_dispatch, TorchDispatchMode, torch.overrides, torch.library,
   ``__torch_dispatch__``); tracing (sys.settrace, sys.setprofile, sys.monitoring, a debugger); the
   harness (``grader``, except the course helpers grader.testing and grader.support.<module>;
   sys.modules); frames and the garbage collector (sys._getframe, f_back, gc.get_referrers, all of
   ``inspect``); native code (ctypes, cffi, torch.utils.cpp_extension); code compiled below the probes
   (TorchScript's torch.jit, torch.fx, torch.export, CUDA graphs: a scripted ``x.tolist()`` reads values past
   the read-back watch and the dispatcher); threads, processes; code run later, outside the calls the probes watch (signal handlers,
   weakref finalisers, gc callbacks, audit and exception hooks, atexit); dynamic code (exec, eval,
   compile, __import__, importlib, help, pydoc, pkgutil, unittest.mock, logging.config, runpy,
   unpickling, string.Formatter, typing.get_type_hints and ForwardRef, ``type(name, bases, ns)``,
   types.new_class, dataclasses.make_dataclass, codecs).
2. **Private internals**: a segment starting with one underscore anywhere on a chain rooted at an
   imported module (torch._C, sys._xoptions, warnings._getcategory), except the operator names of
   ``torch.ops.<namespace>.<operator>`` (the guard sees those); and a private attribute read off
   an object the scan cannot resolve (a parameter, an element of a list), unless the file itself
   defines an attribute of that name or it is a named tuple's API (``_fields``, ``_asdict``).
   sys.modules and the import machinery's other state read off such an object (not called, as
   ``model.modules()`` is) count as the harness.
3. **By-name access**: getattr, setattr, delattr and hasattr only as a direct call whose name is a
   string literal (or an expression of literals that folds to one, rule 7), and that literal obeys the
   rules for an attribute (rules 1, 2, 4; a private name counts on any object, ``self`` included,
   unless the file defines it itself and no library has it: any object can be passed as ``self``).
   Every other use is flagged: a computed name (on ``self`` too), the function as a value
   (``g = getattr``, ``map(getattr, ...)``, ``functools.reduce(getattr, ...)``, a default argument),
   ``getattr(*args)``. So are globals(), locals(), vars() and ``__dict__`` (on ``self`` too:
   ``vars(torch.nn.functional)`` through a parameter named ``self`` reached torch._C), operator.attrgetter
   and operator.methodcaller, and the keyword names of a
   ``match`` class pattern (``case object(__globals__=g)``), which are attribute reads.
4. **Special (dunder) names**: an attribute, a bare name, a getattr literal or a string that is a
   dunder name is flagged unless it is in `ALLOWED_DUNDERS` (``__init__``, ``__name__``,
   ``__class__`` read but never assigned, the operator methods, ...). ``__self__``, ``__base__``,
   ``__mro__``, ``__subclasses__``, ``__globals__``, ``__reduce_ex__``, ``__wrapped__``,
   ``__getattribute__``, ``__match_args__`` and every other special name outside the list are where
   the classic escapes start (``().__class__.__base__.__subclasses__()``, ``print.__self__`` for the
   builtins module). Defining ``__del__``, the pickling hooks, ``__class__``, ``__instancecheck__``,
   ``__subclasscheck__`` or ``__getattribute__`` is flagged (code that runs when the worker sends a
   reply or collects garbage, outside the probes, or that lies to isinstance), and so is defining any
   special method outside `DEFINABLE_DUNDERS` (the allowed names and the language's plain protocols):
   numpy's and DLPack's array protocols hand numpy or torch a memory address (a class answering
   ``__array_interface__`` gave numpy.asarray a writable view of any address, the probes' memory
   included), and ``__getattr__`` answers every name, those included; so is a metaclass
   (``metaclass=``, a subclass of ``type``), a subclass of torch.Tensor, and a subclass of a builtin
   container (dict, list, tuple, NamedTuple, set, str, ...) that redefines how it is read (the worker
   reads results by those methods after the call, outside the probes).
5. **Patching in place** (``structural=True``): assigning or deleting an attribute of an imported
   module or of a chain rooted at one (``time.perf_counter = ...``, ``torch.Tensor.sum = ...``,
   ``socket.socket.recv = ...``), of ``type(x)``, of a name assigned (once or more) from such a chain
   or from ``type(x)``, or of a chain through ``__class__``; setattr and delattr on anything but
   ``self`` and ``cls`` (and on those, with a special name). On any other object but ``self``,
   ``cls`` and autograd's ``ctx``: assigning a special attribute (``C.__enter__ = ...``), or an
   attribute named like one of torch's, torch.Tensor's or nn.Module's public ones
   (``[torch.Tensor][0].clone = ...``), except ``data``, ``grad`` and ``requires_grad``. Assigning
   ``__class__`` is flagged by the default rules (rule 4). Opening files, too (the builtin open,
   io.open, os.open/os.read/os.write and friends, pathlib, mmap, shutil, tempfile, linecache):
   ``/proc/self/mem`` lets a process rewrite its own memory, and with it every probe and driver in it.
   The default rules flag a string that names a process's memory (``/proc/self/mem``, ``/dev/mem``).
6. **String annotations** are code to typing.get_type_hints and functools.singledispatch: every
   string inside an annotation is parsed and scanned as an expression.
7. **Strings that name the machinery**: a string constant, or an expression of constants that folds
   to one (concatenation, %, * by a small count, f-strings of constants, ``"".join`` of constants,
   slices such as ``[::-1]``, chr() of an int, bytes literals decoded, ``.format``, ``.replace``,
   ``.upper``/``.lower``), that is a dotted identifier with a segment from rule 1, `STRING_SEGMENTS`
   (``_C``, ``grader``, ``ctypes``) or rule 4.
8. **Clocks and sockets** (``clocks=True``: the grader's clock times the student's code, and the
   worker's round trip over its socket is its baseline): socket; reading a clock or waiting: time,
   datetime, timeit, resource, sched, select, selectors, asyncio, queue, uuid (uuid1 holds a
   timestamp), psutil, os.times, os.stat and friends and every ``st_*time*`` field (a file's times are a clock), the file access of
   rule 5 (``/proc/uptime`` is a clock; clock() scans with both rule sets), torch.profiler,
   torch.utils.benchmark, triton.testing, torch.distributed (a store's wait takes a timeout),
   a CUDA event's elapsed_time, Triton's globaltimer, and the names sleep, perf_counter, monotonic,
   process_time, thread_time, clock_gettime, now, today, timedelta, datetime64, TCPStore, from_file,
   fromfile, loadtxt, memmap, read_text wherever they are read; strings that name /proc or /sys.
9. A file that does not parse, nests deeper than this process can walk, or declares an unusual
   source encoding, fails closed.
10. **Triton kernels hold Triton** (grader/harness/kernels.py): under the CPU interpreter a
   ``@triton.jit`` body runs as host Python that the probes trust as kernel code, so a kernel may hold
   only its parameters and locals, the file's other kernels and constants, triton.language's public
   functions (not inline assembly, tl.core or tl.tensor), a tensor's and dtype's own attributes (never
   ``.handle``), a few builtins (range, min, max, float, int) and plain statements; its defaults are
   constants and its decorators Triton's. A kernel is a module-level def, launched as ``k[grid](...)``;
   ``triton.jit`` anywhere but on a decorator line is flagged. Also under rule 0: a function or class a
   library re-exports from a module outside its own package is checked as that module's
   (``triton.language.extra.module_from_spec`` is importlib's, ``torch.autograd.graph.WeakKeyDictionary``
   is weakref's).

The list is kept narrow enough that honest code never trips it (every file in solutions/ and every
stub scans clean, with every rule set: tests/test_tamper.py). What it proves: the file does not name the
machinery, directly or through a by-name lookup, and has no by-name lookup whose name the scan cannot
read. Not covered (a finding is certain, a clean scan is strong evidence, not proof):

* A by-name channel this list does not know (a library function that resolves a dotted name, a C
  extension that reaches attributes). The list names the standard library's (pydoc.locate,
  pkgutil.resolve_name, importlib, unittest.mock.patch, logging.config, string.Formatter.get_field,
  typing's evaluation of annotations, operator.attrgetter) and torch's private modules.
* Patching a class the scan cannot trace to its module (taken from a container, a call or a
  ``match`` capture) under a name that is neither special nor one of torch's: a method of a Python
  class of the standard library or of a third-party package (``[zipfile.ZipFile][0].write = f``).
  Rule 5 sees chains it can resolve, special names and torch's names.
* A module reached as an attribute of an object the scan cannot resolve and put in a list (a
  submodule imported with ``from torch import utils``: its private and flagged names are still
  caught, its public ones are not).
* Work instead of a clock: a loop of fixed length that pads a call without reading any clock is not
  a clock read; grader/structure.py bounds what a padded call can buy with its round-trip baseline.
* /proc/self/mem under the default rules: a path built at run time and opened from a file checked by
  the forbidden-call guard only (the structural rules flag every open()). The sandboxed worker could
  write its own memory when this was written (measured: a write through /proc/self/mem changed a
  buffer in the worker); a non-dumpable worker (``prctl(PR_SET_DUMPABLE, 0)`` after its last exec)
  cannot open it, which closes this for every rule set.
* Objects the student's code receives from torch or the course's helpers and whose attributes lead
  elsewhere through names that are not special (a torch function's plain attributes).

API: ``scan(source, structural=False, clocks=False) -> list[Finding]`` (source as text, or as bytes
decoded as Python would decode them) and ``scan_file(path, structural=False, clocks=False)``; a
`Finding` prints as "line 12: sys.settrace: your code changes the tracing the grader's probes use". `describe(findings)` joins a
few for a message, and `tampered_message(findings)` is what a guarded call of a flagged file fails
with (as `Tampered`, an AssertionError: a verdict on the file, not an error of the grader).
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path
from typing import Iterable, Sequence

from grader.harness.kernels import KernelRule
from grader.harness.scan_names import (
    _HARNESS_PARTS, _course_helper, _dunder, _Folder, _is_self, _library_private_names, _module_rule, _private,
    _torch_attribute_names, _watched_names,
)
from grader.harness.scan_rules import (
    _ATTRIBUTE_CALLS, _CLOCK_PATHS, _CONTAINERS, _FOLD_LIMIT, _IDENTIFIER, _IMPORT_STATE, _NAMEDTUPLE_API,
    _NAMESPACE_CALLS, _OWN, _OWN_MEMORY, _PYTHON_ENCODINGS, _READ_HOOKS, _TENSOR_BASES, _TENSOR_STORES_OK,
    _UNSAFE_KEYWORDS, _WRAPPERS, ALLOWED_DUNDERS, BUILTINS, BY_NAME, CLASS_HOOK, CLOCK_BUILTINS, CLOCK_NAMES,
    CLOCKS, DEFINABLE_DUNDERS, DUNDER, DYNAMIC, ENCODING, ENVIRONMENT, FILE_BUILTINS, FILES, HARNESS,
    HOOK_DEFINITIONS, LATER, MAX_SOURCE_BYTES, NAMES, NATIVE, PATCHES, PRIVATE, PROTOCOL, STORAGE, STRING_SEGMENTS,
    UNREADABLE, Finding,
)


def standard_encoding(encoding: str) -> bool:
    """Is `encoding` (a source file's coding cookie) one of the plain ones Python sources use?"""
    import codecs

    try:
        name = codecs.lookup(encoding).name
    except LookupError:
        return False
    return name.replace("_", "-") in _PYTHON_ENCODINGS or name in ("iso8859-1", "latin-1")


def scan(source: str | bytes, structural: bool = False, clocks: bool = False) -> list[Finding]:
    """Every reference in `source` that could tamper with the grader's probes, in line order.

    `structural`: also flag patching modules and classes in place (rule 5), for the structural checks'
    gate, whose figures come from the course's drivers. `clocks`: also flag sockets, reading a clock
    and waiting (rule 8), for grader.structure.clock, which times the code. Bytes are decoded as Python decodes a source file (its coding cookie), so the scan reads the
    text the interpreter runs. A file that does not parse gives one finding, so that it fails closed."""
    findings: list[Finding] = []
    if len(source) > MAX_SOURCE_BYTES:
        return [Finding(1, f"a file of {len(source):,} {'bytes' if isinstance(source, bytes) else 'characters'}",
                        f"{UNREADABLE} (it is over the {MAX_SOURCE_BYTES >> 20} MiB the grader reads: keep data out of "
                        "your source file)")]
    if isinstance(source, bytes):
        try:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
            if not standard_encoding(encoding):  # refused before decoding: punycode decodes in quadratic time
                return [Finding(1, f"coding: {encoding}", ENCODING)]
            text = source.decode(encoding)
        except (SyntaxError, LookupError, UnicodeDecodeError) as exc:
            return [Finding(1, type(exc).__name__, f"{UNREADABLE} ({exc})")]
    else:
        text = source
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        line = getattr(exc, "lineno", None) or 1
        return [Finding(line, type(exc).__name__, f"{UNREADABLE} ({getattr(exc, 'msg', exc)})")]
    try:
        scanner = _Scanner(findings, structural, clocks)
        scanner.run(tree)
        KernelRule(tree, scanner.dotted, scanner.flag, scanner.parents).run()  # rule 10
        _environment_writes(tree, scanner)
        findings.extend(_second_def_lines(tree, text))
    except RecursionError:  # nested deeper than this process can walk: fail closed
        findings.append(Finding(1, "RecursionError", f"{UNREADABLE} (it nests too deeply)"))
    return sorted(set(findings))


_ENVIRON_READS = frozenset({"get", "keys", "items", "values", "copy"})


def _environment_writes(tree: ast.AST, scanner: "_Scanner") -> None:
    """os.environ may be read (``os.environ.get(k)``, ``os.environ[k]``, ``k in os.environ``, its keys, items and
    values); any other use can change it (a store, ``update``, ``setdefault``, ``pop``, ``clear``, or the mapping
    handed on as a value), and an environment variable switches a library's behaviour at run time."""
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Name, ast.Attribute)) or scanner.dotted(node) not in ("os.environ", "posix.environ"):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            continue  # the alias's own name, bound here (its uses are checked)
        parent = scanner.parents.get(id(node))
        grand = scanner.parents.get(id(parent)) if parent is not None else None
        if isinstance(parent, ast.Attribute) and parent.attr in _ENVIRON_READS and isinstance(grand, ast.Call) \
                and grand.func is parent:
            continue
        if isinstance(parent, ast.Subscript) and parent.value is node and isinstance(parent.ctx, ast.Load):
            continue
        if isinstance(parent, ast.Compare) and node in parent.comparators and all(
                isinstance(op, (ast.In, ast.NotIn)) for op in parent.ops):
            continue
        if isinstance(parent, ast.Assign) and parent.value is node and len(parent.targets) == 1 \
                and isinstance(parent.targets[0], ast.Name) and scanner.aliases.get(parent.targets[0].id) == "os.environ":
            continue  # an alias the scan resolves: each of its uses is checked as os.environ's
        scanner.flag(node, "os.environ", ENVIRONMENT)


def _second_def_lines(tree: ast.AST, text: str) -> list[Finding]:
    """A jit function whose source holds a second line starting with "def ": Triton's interpreter runs a kernel
    again from the LAST such line of its source (its decorators included), so text this scan reads as a string
    would run as code (red team round 9). The worker refuses such a kernel too; this says so before grading."""
    lines = text.splitlines()
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.decorator_list:
            continue
        if not any("jit" in ast.unparse(d).split("(")[0].rsplit(".", 1)[-1] for d in node.decorator_list):
            continue
        first = min(d.lineno for d in node.decorator_list)
        defs = [first + i for i, line in enumerate(lines[first - 1:node.end_lineno]) if line.strip().startswith("def ")]
        if len(defs) > 1:
            found.append(Finding(defs[-1], f"def {node.name}: a second line starting with 'def ' in a kernel",
                                 f"{DYNAMIC} (Triton's interpreter runs a kernel from the last such line of its source)"))
    return found


def scan_file(path: str | Path, structural: bool = False, clocks: bool = False) -> list[Finding]:
    """`scan` of a file's bytes (decoded as the interpreter would decode them)."""
    return scan(Path(path).read_bytes(), structural=structural, clocks=clocks)


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



class _Scanner(ast.NodeVisitor):
    def __init__(self, findings: list[Finding], structural: bool = False, clocks: bool = False):
        self.findings = findings
        self.structural = structural
        self.clocks = clocks
        self.aliases: dict[str, str] = {}  # local name -> the dotted module path it was imported as
        self.bound: set[str] = set()  # names the file binds itself (its own `compile` is no builtin)
        self.type_names: set[str] = set()  # names assigned from type(x): a class, for rule 5
        self.direct: set[int] = set()  # ids of getattr & co. names that are the function of a direct call
        self.modules: set[str] = set()  # names bound to a module by `import` (or assigned from one)
        self.parents: dict[int, ast.AST] = {}
        self.own_attributes: set[str] = set(_NAMEDTUPLE_API)  # attribute names the file itself defines
        self.fold = _Folder()

    def flag(self, node: ast.AST, what: str, why: str) -> None:
        self.findings.append(Finding(getattr(node, "lineno", 1), what, why))

    def run(self, tree: ast.AST) -> None:
        stores: dict[str, int] = {}
        simple: dict[str, ast.AST] = {}  # name -> the value of its one plain assignment
        values: dict[str, list[ast.AST]] = {}  # name -> every value assigned to it
        for node in ast.walk(tree):  # aliases and bindings first: a function may use a name bound below it
            for child in ast.iter_child_nodes(node):
                self.parents[id(child)] = node
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.aliases[alias.asname] = alias.name
                        self.modules.add(alias.asname)
                    else:
                        root = alias.name.split(".")[0]
                        self.aliases[root] = root
                        self.modules.add(root)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    if alias.name != "*":
                        self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                self.bound.add(node.id)
                stores[node.id] = stores.get(node.id, 0) + 1
            elif isinstance(node, ast.arg):
                self.bound.add(node.arg)
                stores[node.arg] = stores.get(node.arg, 0) + 1
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.bound.add(node.name)
                stores[node.name] = stores.get(node.name, 0) + 1
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                self.own_attributes.add(node.attr)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.own_attributes.add(node.name)
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if len(targets) == 1 and isinstance(targets[0], ast.Name) and node.value is not None:
                    simple[targets[0].id] = node.value
                    values.setdefault(targets[0].id, []).append(node.value)
                for target in targets:  # class-body and module-level names are attributes of the file's own
                    if isinstance(target, ast.Name):
                        self.own_attributes.add(target.id)
        # A name assigned once from an aliased chain is that chain (s = sys; T = torch.Tensor), to a fixpoint.
        changed = True
        while changed:
            changed = False
            for name, value in simple.items():
                if name in self.aliases or stores.get(name) != 1:
                    continue
                path = self.dotted(value)
                if path is not None:
                    self.aliases[name] = path
                    if isinstance(value, ast.Name) and value.id in self.modules:
                        self.modules.add(name)
                    changed = True
                elif self.is_type_call(value):
                    self.type_names.add(name)
        # A name assigned, even once among several, from a chain the scan resolves or from type(x): its
        # attributes are a module's or a class's (rule 5).
        for name, assigned in values.items():
            if name not in self.aliases and any(self.dotted(v) is not None or self.is_type_call(v) for v in assigned):
                self.type_names.add(name)
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

    def is_type_call(self, node: ast.AST) -> bool:
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type"
                and "type" not in self.bound and len(node.args) == 1)

    def rule_for_name(self, name: str) -> str | None:
        """Why an attribute name is flagged on any object (rules 1, 4 and 8)."""
        if name in NAMES:
            return NAMES[name]
        if name.endswith("Storage") and name[:1].isupper():  # torch.FloatStorage and the other typed storages
            return STORAGE
        if self.clocks and name in CLOCK_NAMES:
            return CLOCKS
        if _dunder(name) and name not in ALLOWED_DUNDERS:
            return DUNDER
        return None

    def check_path(self, node: ast.AST, path: str) -> bool:
        """Flag a resolved dotted path by the module table, private segments, or its last name."""
        last = path.rsplit(".", 1)[-1]
        why = _module_rule(path, self.clocks, self.structural) or self.rule_for_name(last)
        if why:
            self.flag(node, path, why)
        return why is not None

    def patch_target(self, node: ast.AST) -> str | None:
        """What an object whose attribute is assigned stands for, when it is a module, a class from one,
        type(x) or a chain through __class__ (rule 5); None for the file's own objects."""
        path = self.dotted(node)
        if path is not None:
            return path
        if self.is_type_call(node):
            return "type(...)"
        if isinstance(node, ast.Name) and node.id in self.type_names:
            return f"{node.id} (= a library object or type(...))"
        chain = node
        while isinstance(chain, ast.Attribute):
            if chain.attr == "__class__":
                return "...__class__"
            chain = chain.value
        return None

    def check_string(self, node: ast.AST, text: str) -> None:
        """Rule 7 (and 8): a string that names the machinery."""
        if len(text) <= 200 and _IDENTIFIER.match(text):
            for part in text.split("."):
                if (part in NAMES or part in STRING_SEGMENTS or (_dunder(part) and part not in ALLOWED_DUNDERS)
                        or (self.clocks and part in CLOCK_NAMES)):
                    self.flag(node, repr(text), f"{DYNAMIC} (a string that names the grader's machinery)")
                    return
        elif len(text) <= 4096 and _OWN_MEMORY.search(text):
            self.flag(node, repr(text[:60]), f"{NATIVE} (a process's memory as a file)")
        elif self.clocks and any(p in text for p in _CLOCK_PATHS) and len(text) <= 4096:
            self.flag(node, repr(text[:60]), f"{CLOCKS} (/proc and /sys hold the system's clocks)")

    def folded(self, node: ast.AST) -> bool:
        """Check an expression of constants as the string it folds to; True when it folded."""
        value = self.fold(node)
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        if isinstance(value, str):
            self.check_string(node, value)
            return True
        return False

    # -- visitors

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.check_path(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module:
            return  # a relative import: a lone student file has no package to import from
        if _course_helper(node.module) and not any(a.name in _HARNESS_PARTS or a.name in NAMES for a in node.names):
            return  # run_simulated & co., imported by name (what they reach is flagged where it is used)
        # the members first (from unittest import mock names unittest.mock), the module when none is flagged
        flagged = [self.check_path(node, f"{node.module}.{a.name}") for a in node.names if a.name != "*"]
        if not any(flagged):
            self.check_path(node, node.module)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        own = isinstance(node.value, ast.Name) and node.value.id in _OWN
        parent = self.parents.get(id(node))
        if node.attr in ("format", "format_map") and not (isinstance(parent, ast.Call) and parent.func is node):
            # map(str.format, [fmt], [obj]) or a bound fmt.format called later: fields the scan never reads
            self.flag(node, f"...{node.attr} used as a value", BY_NAME)
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            target = self.patch_target(node.value) if self.structural else None
            if node.attr == "__class__":
                self.flag(node, "...__class__ = ...", CLASS_HOOK)
            elif not self.structural:
                pass  # patching in place changes what drivers and clocks call: the structural gate's rule 5
            elif target is not None:
                self.flag(node, f"{target}.{node.attr} = ...", PATCHES)
            elif not own and _dunder(node.attr):
                self.flag(node, f"...{node.attr} = ...", PATCHES)
            elif own and node.attr in _watched_names():
                self.flag(node, f"{node.value.id}.{node.attr} = ...",  # type: ignore[attr-defined]  # own: a Name
                          f"{PATCHES} (a method the grader watches; "
                          "anything can be passed as `self`)")
            elif not own and node.attr in _torch_attribute_names() and node.attr not in _TENSOR_STORES_OK:
                self.flag(node, f"...{node.attr} = ...", f"{PATCHES} (torch has an attribute of that name)")
        path = self.dotted(node)
        self.check_wrapper(node, path)
        if path is None and _private(node.attr) and not self.own_private(node.attr):
            if node.attr in self.own_attributes:  # the file's own name, which a library's private one shadows
                self.flag(node, f"...{node.attr}", f"{PRIVATE}: {node.attr} is a name your file defines, but torch, "
                          "Python or the grader has a private attribute of the same name, and the scan cannot tell "
                          f"the two apart; rename yours (for example {node.attr.lstrip('_')}_ or "
                          f"my{node.attr})")
            else:
                self.flag(node, f"...{node.attr}", PRIVATE)
        if (path is None and node.attr in _IMPORT_STATE and isinstance(node.ctx, ast.Load)
                and not isinstance(self.parents.get(id(node)), ast.Call)):
            self.flag(node, f"...{node.attr}", HARNESS)
        if path is not None:
            if self.check_path(node, path):
                return  # one finding per chain, not one more for each of its prefixes
            if node.attr == "__dict__":
                self.flag(node, path, BY_NAME)
                return
        elif node.attr == "__dict__":  # on `self` too: any object can be passed as `self` (f(torch.nn.functional))
            self.flag(node, "...__dict__", BY_NAME)
        else:
            why = self.rule_for_name(node.attr)
            if why:
                self.flag(node, f"...{node.attr}", why)
        self.generic_visit(node)  # the object it is read from may hold more (globals()[k].__dict__)

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Constant):
            return  # a docstring, or any bare constant: a statement that does nothing
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        name = node.id
        if _dunder(name) and name not in ALLOWED_DUNDERS and name not in NAMES:
            self.flag(node, name, DUNDER)
        if name == "__class__" and isinstance(node.ctx, ast.Store):
            self.flag(node, "__class__ = ...", CLASS_HOOK)
        if name in self.modules and isinstance(node.ctx, ast.Load) and not self.module_reference(node):
            self.flag(node, f"{name} (a module) used as a value", BY_NAME)
        if name in self.aliases and isinstance(node.ctx, ast.Load):
            self.check_wrapper(node, self.aliases[name])
        if name in self.bound or name in self.aliases:
            return
        if name in _ATTRIBUTE_CALLS + _NAMESPACE_CALLS and id(node) not in self.direct:
            self.flag(node, f"{name} used as a value" if name in _ATTRIBUTE_CALLS else f"{name}()", BY_NAME)
            return
        why = (BUILTINS.get(name) or NAMES.get(name) or (CLOCKS if self.clocks and name in CLOCK_BUILTINS else None)
               or (FILES if self.structural and name in FILE_BUILTINS else None))
        if why:
            self.flag(node, name, why)

    def check_wrapper(self, node: ast.AST, path: str | None) -> None:
        """functools.wraps and update_wrapper only as a plain call: their `assigned` and `updated` are attribute
        names read and written by name (rule 3)."""
        if path not in _WRAPPERS:
            return
        parent = self.parents.get(id(node))
        plain = (isinstance(parent, ast.Call) and parent.func is node and not parent.keywords
                 and len(parent.args) <= _WRAPPERS[path] and not any(isinstance(a, ast.Starred) for a in parent.args))
        if not plain:
            self.flag(node, f"{path} with its own attribute names, or as a value", BY_NAME)

    def module_reference(self, node: ast.Name) -> bool:
        """A module's name where the scan can follow it: the root of an attribute chain, getattr's object
        with a literal name, or the value of a name assigned once (an alias)."""
        parent = self.parents.get(id(node))
        if isinstance(parent, ast.Attribute) and parent.value is node:
            return True
        if (isinstance(parent, ast.Call) and parent.args and parent.args[0] is node and isinstance(parent.func, ast.Name)
                and parent.func.id in ("getattr", "hasattr") and len(parent.args) >= 2
                and isinstance(self.fold(parent.args[1]), str)):
            return True
        if isinstance(parent, (ast.Assign, ast.AnnAssign)) and parent.value is node:
            targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
            in_class = isinstance(self.parents.get(id(parent)), ast.ClassDef)  # a class attribute: A.m, self.m
            return (len(targets) == 1 and isinstance(targets[0], ast.Name) and targets[0].id in self.aliases
                    and not in_class)
        return False

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id not in self.bound and func.id not in self.aliases:
            if func.id in _ATTRIBUTE_CALLS:
                self.direct.add(id(func))
                args = node.args
                if len(args) >= 2 and not any(isinstance(a, ast.Starred) for a in args[:2]) and not node.keywords:
                    self.check_attribute_call(node, func.id, args[0], args[1])
                else:
                    self.flag(node, f"{func.id} with a computed name", BY_NAME)
            elif func.id == "type" and len(node.args) != 1:
                self.flag(node, "type(name, bases, namespace)", DYNAMIC)
            elif func.id == "super" and (node.args or node.keywords):
                self.flag(node, "super(...) with arguments", DUNDER)  # a named base: torch.Tensor's is TensorBase
        for keyword in node.keywords:
            if keyword.arg in _UNSAFE_KEYWORDS:
                safe = not _UNSAFE_KEYWORDS[keyword.arg]
                if not (isinstance(keyword.value, ast.Constant) and keyword.value.value is safe):
                    self.flag(keyword.value, f"{keyword.arg}=...", f"{DYNAMIC} (unpickling can call any function)")
            elif keyword.arg is None and isinstance(keyword.value, ast.Dict):  # f(**{"allow_pickle": True})
                for key in keyword.value.keys:
                    if key is not None and self.fold(key) in _UNSAFE_KEYWORDS:
                        self.flag(key, f"**{{{self.fold(key)!r}: ...}}", f"{DYNAMIC} (unpickling can call any function)")
        if isinstance(func, ast.Attribute) and func.attr in ("format", "format_map"):
            self.check_format(node, func)
        if (self.dotted(func) in ("torch.load", "torch.serialization.load")
                and any(k.arg is None and not isinstance(k.value, ast.Dict) for k in node.keywords)):
            self.flag(node, f"{self.dotted(func)}(**...)", f"{DYNAMIC} (weights_only could come through **; "
                      "unpickling can call any function)")
        if not self.folded(node):
            self.generic_visit(node)

    def check_format(self, node: ast.Call, func: ast.Attribute) -> None:
        """str.format reads attributes and items by name from its fields ("{0.tb_frame.f_back}".format(tb)): a
        format string the scan cannot read, or a field that reaches into an argument, is a lookup by name."""
        import string

        template = func.value
        if isinstance(template, ast.Name) and template.id == "str" and node.args:
            template = node.args[0]  # str.format(template, ...)
        literal = self.fold(template)
        if not isinstance(literal, str):
            self.flag(node, f"....{func.attr}() of a format string built at run time", BY_NAME)
            return
        fields: list[str] = []
        pending = [literal]
        while pending and len(fields) < 1000:  # a format spec holds fields of its own: "{0:{1.x}}"
            try:
                for _, field, spec, _ in string.Formatter().parse(pending.pop()):
                    fields += [field] if field else []
                    pending += [spec] if spec and "{" in spec else []
            except ValueError:
                break
        reaching = [f for f in fields if "." in f or "[" in f]
        if reaching:
            self.flag(node, f"a format field {reaching[0][:40]!r}", BY_NAME)

    def own_private(self, name: str) -> bool:
        """A private name the file defines itself (``self._free = []``) and no library has."""
        return name in self.own_attributes and name not in _library_private_names()

    def check_attribute_call(self, node: ast.Call, call: str, target: ast.AST, name: ast.AST) -> None:
        """getattr(obj, name) and friends: a literal name is an attribute; a computed one hides it."""
        literal = self.fold(name)
        if not isinstance(literal, str):
            self.flag(node, f"{call} with a computed name", BY_NAME)
            return
        if call in ("setattr", "delattr") and self.structural:
            where = self.patch_target(target)
            if where is not None:
                self.flag(node, f"{call}({where}, {literal!r})", PATCHES)
            elif not _is_self(target) or _dunder(literal) or literal in _watched_names():
                self.flag(node, f"{call}(..., {literal!r})", f"{PATCHES} (setattr and delattr: only on self, and not "
                          "a method the grader watches)")
        base = self.dotted(target)
        if base is not None:
            self.check_path(node, f"{base}.{literal}")
            return
        why = self.rule_for_name(literal)
        if why is None and literal == "__dict__":
            why = BY_NAME
        if why is None and _private(literal) and not self.own_private(literal):
            why = DYNAMIC
        if why:
            self.flag(node, f"{call}(..., {literal!r})", why)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if not self.folded(node):
            self.generic_visit(node)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        if not self.folded(node):
            self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if not self.folded(node):
            self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            self.check_string(node, node.value)

    def visit_MatchClass(self, node: ast.MatchClass) -> None:
        # case C(attr=pattern) reads subject.attr: each keyword is an attribute name (rule 3).
        for attr in node.kwd_attrs:
            why = self.rule_for_name(attr)
            if why is None and (attr == "__dict__" or _private(attr)):
                why = BY_NAME
            if why:
                self.flag(node, f"case ...({attr}=...)", why)
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if node.name in NAMES:  # defining __torch_dispatch__ makes an object the dispatcher calls into
            self.flag(node, node.name, NAMES[node.name])
        elif node.name in HOOK_DEFINITIONS:
            self.flag(node, f"def {node.name}", LATER if node.name in ("__del__",) else CLASS_HOOK)
        elif _dunder(node.name) and node.name not in DEFINABLE_DUNDERS:
            self.flag(node, f"def {node.name}", PROTOCOL)
        self.scan_annotations([a.annotation for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs,
                                                      node.args.vararg, node.args.kwarg) if a is not None]
                              + [node.returns])
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.scan_annotations([node.annotation])
        self.generic_visit(node)

    def scan_annotations(self, annotations: Sequence[ast.AST | None]) -> None:
        """Rule 6: the strings inside an annotation are expressions that typing may evaluate."""
        for annotation in annotations:
            if annotation is None:
                continue
            for inner in ast.walk(annotation):
                if isinstance(inner, ast.Constant) and isinstance(inner.value, str) and len(inner.value) <= _FOLD_LIMIT:
                    try:
                        code = ast.parse(inner.value.strip(), mode="eval")
                    except (SyntaxError, ValueError, RecursionError, MemoryError):
                        continue
                    ast.increment_lineno(code, inner.lineno - 1)
                    self.visit(code)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        bases = [self.dotted(b) or (b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")) for b in node.bases]
        for keyword in node.keywords:
            if keyword.arg == "metaclass":
                self.flag(node, f"class {node.name}(metaclass=...)", CLASS_HOOK)
        for base in bases:
            short = base.rsplit(".", 1)[-1] if base else ""
            if base in _TENSOR_BASES:
                self.flag(node, f"class {node.name}({base})", CLASS_HOOK)
            elif short == "type" or base == "abc.ABCMeta":
                self.flag(node, f"class {node.name}({base})", CLASS_HOOK)
            elif short in _CONTAINERS:
                for item in node.body:
                    names = ([item.name] if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) else
                             [t.id for t in getattr(item, "targets", [getattr(item, "target", None)])
                              if isinstance(t, ast.Name)])
                    for name in names:
                        if name in _READ_HOOKS:
                            self.flag(item, f"class {node.name}({short}).{name}", CLASS_HOOK)
        self.generic_visit(node)


# The gate of the structural checks (grader.structure: `assert_no_clocks`, and the session's `assert_untampered`)

_scanned: dict[tuple[str, int, int, bool], list[Finding]] = {}


def scan_cached(path: str | Path, clocks: bool) -> list[Finding]:
    """`scan_file` with the structural rules (and `clocks`' rule 8), once per version of the file."""
    path = Path(path)
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size, clocks)
    if key not in _scanned:
        _scanned[key] = list(scan_file(path, structural=True, clocks=clocks))
    return _scanned[key]


def scan_source(path: str | Path) -> list[Finding]:
    """The tamper findings (with the structural rules: patching in place) for the student's file, read here
    as bytes, never imported."""
    return scan_cached(path, clocks=False)


def assert_untampered(path: str | Path, figure: str) -> None:
    """Fail when the student's file tampers with what measures `figure` (a worker-side count), or patches
    a module or a class in place (what the course's drivers call)."""
    findings = scan_source(path)
    if findings:
        raise Tampered(
            f"{figure} comes from the process that runs your code, and your file reaches for what measures it "
            f"({describe(findings)}), so it cannot be trusted and the check fails. Remove that code: this "
            "exercise needs none of it"
        )


def scan_sources(sources: Iterable[tuple[str, str | bytes]], structural: bool = False,
                 clocks: bool = False) -> dict[str, list[Finding]]:
    """`scan` of several named sources: name -> findings (for tests and reports)."""
    return {name: scan(source, structural=structural, clocks=clocks) for name, source in sources}
