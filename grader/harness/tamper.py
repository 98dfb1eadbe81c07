"""The trusted static scan: does a student's file reach for the machinery the grader's probes use?

The forbidden-call guard and the line counter (grader/harness/probes.py) run in the process that
runs the student's code, so that code can dismantle them: pop the dispatch mode, switch off the
trace, patch the harness, find the probe objects through frames or the garbage collector. No probe
in that process can prove it was left alone. The grader's own process holds the student's file, so
it reads it here, as text, never importing it, and looks for references to that machinery.

Three rule sets. The default (rules 1-4, 6, 7, 9) guards the probes themselves: the forbidden-call
guard's load (grader.harness.session) uses it. ``structural=True`` adds rule 5 (patching modules and
classes in place), for the structural checks' gate (grader.structure.assert_untampered), whose
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
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from grader.harness.kernels import KernelRule


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
NESTED = ("your code makes nested tensors, whose pieces' shapes carry a tensor's values to Python where the grader "
          "does not count them; no exercise needs them")
SAVED_TENSORS = ("your code hooks autograd's saved tensors or every module's calls, which hides from the grader what "
                 "the backward pass keeps alive")
PRIVATE = "your code uses a module's private internals, which can reach past the grader's checks"
KERNELS = "your code registers operator kernels, which run where the forbidden-call guard cannot see"
HARNESS = "your code reaches the grader's own code"
SOCKET = "your code reaches sockets, and the worker that runs your code talks to the grader over one, which the grader's clock times"
INTROSPECTION = "your code inspects frames or the garbage collector, which can find and change the grader's probes"
NATIVE = "your code loads native code, which can change anything in the process"
THREADS = "your code starts threads of its own, which the grader's probes do not watch"
STORAGE = ("your code handles tensor storages or rebinds a tensor to other memory, whose bytes move without an "
           "operator the grader's probes see (no exercise needs them: work on tensors)")
PROCESSES = "your code runs code in another process, where the grader's probes are not installed"
LATER = "your code arranges for code of its own to run later, outside the calls the grader's probes watch"
DYNAMIC = "your code builds code or names at run time, which hides what it reaches from the grader's checks"
BY_NAME = "your code looks attributes up by a name the grader cannot read, which hides what it reaches"
DUNDER = "your code reads a special attribute, the way to the interpreter's internals (globals, builtins, frames)"
PATCHES = "your code changes a module's or a class's attributes in place, which changes what the grader's probes and drivers call"
CLASS_HOOK = "your class runs code of its own where the worker reads results or checks types, outside the probes"
CLOCKS = "your code reads a clock or waits, and the grader's clock times your code"
ENCODING = "your file declares an unusual source encoding, which can show a reader different text than Python runs"
UNREADABLE = "the grader cannot parse your file, so it cannot check it"
COMPILED = ("your code compiles torch code (TorchScript, FX, export, CUDA graphs), which runs below "
            "the grader's probes: its reads of tensor values and its loops reach neither the read-back watch, the "
            "operator guard nor the line count")
NOT_IMPORTABLE = ("your code uses a module outside the list a submission may use (torch, triton, numpy and the "
                  "standard library's plain-data modules, and of numpy, torch.utils and triton only the submodules "
                  "listed in grader.harness.tamper.SUBMODULES); a module the grader does not know may run code it is "
                  "handed, or reach below the probes, and no exercise needs one")
PROTOCOL = ("your class defines a special method outside the list a class may define (grader.harness.tamper."
            "DEFINABLE_DUNDERS): numpy, torch and the interpreter call such methods from their own code, and some "
            "hand them raw memory (__array_interface__ gives numpy an address to read and write)")
ENVIRONMENT = ("your code changes the process's environment variables, which switch the libraries' behaviour at run "
               "time (one made torch.load unpickle any object, and that ran code the grader never read)")
RAW_HANDLE = ("your code reads a value's .handle: under the CPU interpreter a Triton tensor's handle is the raw "
              "numpy array behind it, and numpy on it computes outside any kernel")
LAUNCHER = ("your code reaches Triton's launch machinery (runtime, compiler, backends, knobs), where the kernel rule "
            "is suspended while a launch runs")

# The modules a submission may import (rule 0): the libraries the exercises are written in, and the standard
# library's modules that hold data, numbers and text without a route to running code they are handed. Everything
# else is refused whole, so a module nobody thought of (doctest ran hex-encoded source, sqlite3 loads native
# extensions, asyncio starts processes) is a finding, not a gap. Their dangerous corners are still flagged below.
# Left out on purpose: types (SimpleNamespace(**d) sets attributes named at run time), enum (its functional API
# does the same for a class), logging (a record's `extra`), and anything that runs code, starts work elsewhere,
# or loads native code.
IMPORTABLE = frozenset({
    "torch", "triton", "numpy",
    "__future__", "abc", "array", "bisect", "cmath", "collections", "contextlib", "copy", "dataclasses",
    "datetime", "decimal", "fractions", "functools", "gc", "heapq", "io", "itertools", "json", "math", "numbers",
    "operator", "os", "posixpath", "pathlib", "pprint", "random", "re", "select", "socket", "statistics",
    "string", "struct", "sys", "textwrap", "time", "traceback", "typing", "warnings",
})
# functools' wrappers copy attributes by the names in their `assigned` and `updated` arguments: only the plain
# call, with functools' own lists, is allowed (positional arguments at most).
_WRAPPERS = {"functools.update_wrapper": 2, "functools.wraps": 1}

# Inside the importable libraries, the submodules a chain may pass through, where a library's public surface
# has corners that run code or reach raw memory: numpy.testing.runstring executes a string, numpy.ctypeslib
# loads native libraries, numpy.lib.stride_tricks.as_strided makes views of any address in the process (the
# probes' memory too), torch.utils.data runs workers in processes. A function or class of the parent is fine.
SUBMODULES: dict[str, frozenset[str]] = {
    "numpy": frozenset({"linalg", "random", "fft", "typing", "dtypes", "exceptions", "emath"}),
    "torch.utils": frozenset({"checkpoint", "hooks"}),
    "triton": frozenset({"language", "testing"}),
}

# Modules (and everything under them), matched on whole dotted segments.
MODULES: dict[str, str] = {
    "grader": HARNESS,
    "ctypes": NATIVE, "_ctypes": NATIVE, "cffi": NATIVE, "torch.utils.cpp_extension": NATIVE,
    "torch.utils._python_dispatch": DISPATCH, "torch.overrides": DISPATCH, "torch.utils._mode_utils": DISPATCH,
    "torch.library": KERNELS, "torch._library": KERNELS, "torch.ops.load_library": KERNELS,
    "torch.ops.import_module": KERNELS,
    # nested tensors: the pieces' shapes come from a tensor of sizes or offsets read in C++, a channel from tensor
    # values to Python numbers that no read-back route sees (red team round 19); no exercise needs them
    "torch.nested": NESTED, "torch.jagged": NESTED,
    # the census of saved activations (pipeline_1f1b) hooks autograd's packing of saved tensors; a hook of the
    # student's own, innermost, hid every real activation from it (red team round 18: 10/10 from an executor
    # that ignored the schedule)
    **{f"torch.autograd.graph.{name}": SAVED_TENSORS for name in (
        "saved_tensors_hooks", "disable_saved_tensors_hooks", "save_on_cpu", "register_multi_grad_hook",
        "allow_mutation_on_saved_tensors")},
    **{f"{module}.{name}": SAVED_TENSORS for module in ("torch.nn.modules.module", "torch.nn.modules")
       for name in ("register_module_forward_pre_hook", "register_module_forward_hook",
                    "register_module_full_backward_pre_hook", "register_module_full_backward_hook",
                    "register_module_backward_hook")},
    # reads its tensor of indices in C++, where neither the guard nor the counters see it (torch.tensor_split and
    # Tensor.tensor_split are watched: grader/harness/host_reads.py, HOST_READS)
    "torch.ops.aten.tensor_split": "your code calls tensor_split through torch.ops, which reads a tensor's values on "
                                   "the host out of the grader's sight: call torch.tensor_split or Tensor.tensor_split",
    "sys.settrace": TRACING, "sys.setprofile": TRACING, "sys.gettrace": TRACING, "sys.getprofile": TRACING,
    "sys.monitoring": TRACING, "sys.call_tracing": TRACING, "sys.breakpointhook": TRACING,
    "pdb": TRACING, "bdb": TRACING, "trace": TRACING, "cProfile": TRACING, "profile": TRACING,
    "sys._getframe": INTROSPECTION, "sys._current_frames": INTROSPECTION, "sys._getframemodulename": INTROSPECTION,
    "sys.modules": HARNESS, "sys.path": HARNESS, "sys.meta_path": HARNESS, "sys.path_hooks": HARNESS, "sys.path_importer_cache": HARNESS,
    "gc.get_referrers": INTROSPECTION, "gc.get_referents": INTROSPECTION, "gc.get_objects": INTROSPECTION,
    "gc.garbage": INTROSPECTION,
    # when the cyclic collector runs decides when a finaliser (a generator's finally) runs: round 12 set the
    # threshold to 1 to run one just after a guarded call; gc.collect stays allowed
    "gc.set_threshold": LATER, "gc.disable": LATER, "gc.enable": LATER, "gc.freeze": LATER, "gc.unfreeze": LATER,
    "gc.set_debug": LATER,
    "inspect": INTROSPECTION,
    "traceback.walk_stack": INTROSPECTION, "traceback.walk_tb": INTROSPECTION,
    "threading": THREADS, "_thread": THREADS, "concurrent": THREADS,
    "multiprocessing": PROCESSES, "torch.multiprocessing": PROCESSES, "subprocess": PROCESSES, "pty": PROCESSES,
    "os.system": PROCESSES, "os.popen": PROCESSES, "os.fork": PROCESSES, "os.forkpty": PROCESSES,
    "signal": LATER, "_signal": LATER, "weakref": LATER, "_weakref": LATER, "gc.callbacks": LATER,
    "atexit": LATER, "faulthandler": LATER, "sys.addaudithook": LATER, "sys.excepthook": LATER,
    "sys.unraisablehook": LATER, "sys.displayhook": LATER, "sys.set_asyncgen_hooks": LATER,
    "os.register_at_fork": LATER, "sys.setdlopenflags": NATIVE, "sys.activate_stack_trampoline": NATIVE,
    "sys.remote_exec": DYNAMIC,
    "importlib": DYNAMIC, "imp": DYNAMIC, "runpy": DYNAMIC, "builtins": DYNAMIC, "code": DYNAMIC, "codeop": DYNAMIC,
    "pickle": DYNAMIC, "_pickle": DYNAMIC, "cPickle": DYNAMIC, "marshal": DYNAMIC, "shelve": DYNAMIC,
    "copyreg": DYNAMIC, "dill": DYNAMIC, "cloudpickle": DYNAMIC, "site": DYNAMIC, "zipimport": DYNAMIC,
    "pydoc": DYNAMIC, "pkgutil": DYNAMIC, "unittest.mock": DYNAMIC, "mock": DYNAMIC, "logging.config": DYNAMIC,
    "string.Formatter": DYNAMIC, "_string": DYNAMIC, "codecs": DYNAMIC, "annotationlib": DYNAMIC,
    "typing.get_type_hints": DYNAMIC, "typing.ForwardRef": DYNAMIC, "typing_extensions.get_type_hints": DYNAMIC,
    "types.FunctionType": DYNAMIC, "types.CodeType": DYNAMIC, "types.LambdaType": DYNAMIC,
    "types.new_class": DYNAMIC, "dataclasses.make_dataclass": DYNAMIC,
    "operator.attrgetter": BY_NAME, "operator.methodcaller": BY_NAME,
    "torch.package": DYNAMIC, "torch.hub": DYNAMIC, "torch.onnx": COMPILED,
    "torch.distributed.rpc": PROCESSES, "torch.distributed.elastic": PROCESSES,
    "torch.distributed.launch": PROCESSES, "torch.distributed.run": PROCESSES,
    # loading arrays and tensors from bytes: numpy.load falls back to pickle (allow_pickle can come through
    # **kwargs, where no keyword is written out); no exercise loads files
    "numpy.load": DYNAMIC, "torch.load": DYNAMIC, "torch.serialization": DYNAMIC, "os.putenv": ENVIRONMENT,
    "os.unsetenv": ENVIRONMENT, "os.environb": ENVIRONMENT, "numpy.lib.format": DYNAMIC, "numpy.lib.npyio": DYNAMIC, "numpy.lib._npyio_impl": DYNAMIC,
    "numpy.lib._format_impl": DYNAMIC,
    # modules that run Python source they are handed (doctest ran code the scan never read, hex-encoded, its lines
    # counted for <doctest>: online_softmax 90 with the dispatch modes switched off), or build objects by name
    "doctest": DYNAMIC, "timeit": DYNAMIC, "torch.utils.benchmark": DYNAMIC, "sympy": DYNAMIC, "jinja2": DYNAMIC,
    "mako": DYNAMIC,
    "yaml": DYNAMIC, "IPython": DYNAMIC, "numba": NATIVE, "cython": NATIVE, "Cython": NATIVE,
    "triton.runtime": LAUNCHER, "triton.compiler": LAUNCHER, "triton.backends": LAUNCHER, "triton.knobs": LAUNCHER,
    # torch.compile is not here: the worker runs it eagerly (TORCHDYNAMO_DISABLE), seen like any Python code.
    "torch.jit": COMPILED, "torch.fx": COMPILED, "torch.export": COMPILED, "torch._export": COMPILED,
    "torch.cuda.graph": COMPILED, "torch.cuda.graphs": COMPILED, "torch.cuda.CUDAGraph": COMPILED,
    "torch.cuda.make_graphed_callables": COMPILED, "torch.ScriptModule": COMPILED, "torch.ScriptFunction": COMPILED,
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
    "getattr_static": BY_NAME, "getmembers": BY_NAME, "get_field": BY_NAME, "formatter_field_name_split": BY_NAME,
    "get_type_hints": DYNAMIC, "ForwardRef": DYNAMIC, "make_dataclass": DYNAMIC, "new_class": DYNAMIC,
    "addaudithook": LATER, "cpp_extension": NATIVE, "load_inline": NATIVE,
    "__builtins__": DYNAMIC, "__import__": DYNAMIC, "__getattribute__": DYNAMIC, "__loader__": DYNAMIC,
    "_start_new_thread": THREADS, "start_new_thread": THREADS, "_start_joinable_thread": THREADS,
    # a class's bases reached by method: the way around a patched method to the unpatched base (TensorBase)
    "mro": DUNDER, "TensorBase": TORCH_PRIVATE,
    # logging's "{"-style formatting reads attributes by the names in its format string, as str.format does
    "Formatter": BY_NAME, "StrFormatStyle": BY_NAME,
    # A storage made at import, and a tensor over it (set_), was a channel: copy a result in, read its bytes out
    # with torch.save or the storage's own methods, no operator dispatched (flash_attention 76/76 from host numpy).
    "UntypedStorage": STORAGE, "TypedStorage": STORAGE, "StorageBase": STORAGE, "set_": STORAGE,
    "share_memory_": STORAGE, "from_file": STORAGE, "_write_file": STORAGE, "_set_from_file": STORAGE,
    "untyped_storage": STORAGE, "swap_tensors": STORAGE,
    # torch.distributed's object collectives pickle what they send and unpickle what they receive: a rank that
    # sends crafted bytes runs code in its peer that no scan read
    # callbacks the libraries call later, wherever an error or a warning happens, the worker's own work included
    "showwarning": LATER, "formatwarning": LATER, "seterrcall": LATER, "geterrcall": LATER,
    "broadcast_object_list": DYNAMIC, "all_gather_object": DYNAMIC, "gather_object": DYNAMIC,
    "scatter_object_list": DYNAMIC, "send_object_list": DYNAMIC, "recv_object_list": DYNAMIC,
    # Under the CPU interpreter a Triton value's handle holds its raw numpy array: numpy on it computes outside any
    # kernel (a grid function's numpy softmax on .handle.data scored full marks, red team round 10).
    "handle": RAW_HANDLE,
}
BUILTINS: dict[str, str] = {"exec": DYNAMIC, "eval": DYNAMIC, "compile": DYNAMIC, "__import__": DYNAMIC,
                            "help": DYNAMIC}
# By-name access builtins: only a direct call with a literal name (rule 3).
_ATTRIBUTE_CALLS = ("getattr", "setattr", "delattr", "hasattr")
_NAMESPACE_CALLS = ("globals", "locals", "vars")

# Special names honest code reads, writes or defines (rule 4). `__class__` is read-only here.
ALLOWED_DUNDERS = frozenset({
    "__init__", "__name__", "__qualname__", "__doc__", "__module__", "__file__", "__version__", "__all__",
    "__slots__", "__debug__", "__class__", "__main__", "__future__", "__post_init__",
    "__len__", "__iter__", "__next__", "__contains__", "__getitem__", "__setitem__", "__delitem__",
    "__enter__", "__exit__", "__call__", "__repr__", "__str__", "__format__", "__bool__", "__hash__",
    "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__index__", "__int__", "__float__",
    "__neg__", "__pos__", "__abs__", "__invert__", "__round__",
    *(f"__{prefix}{op}__" for op in ("add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "pow",
                                     "and", "or", "xor", "lshift", "rshift") for prefix in ("", "r", "i")),
})
# Special methods a class may define (rule 4): the allowed ones, and the language's other plain protocols. Any other
# definition is flagged: numpy's and torch's protocols (__array_interface__, __array_struct__, __dlpack__,
# __cuda_array_interface__, __array_function__, ...) are called from C with the class's answers taken as memory
# addresses or as the implementation of an operator. So is __getattr__, which answers every name, those included
# (a __getattr__ returning {'data': (address, False), ...} gave numpy.asarray a writable view of any address).
DEFINABLE_DUNDERS = ALLOWED_DUNDERS | frozenset({
    "__new__", "__setattr__", "__delattr__", "__init_subclass__", "__set_name__", "__get__",
    "__set__", "__delete__", "__missing__", "__reversed__", "__length_hint__", "__copy__", "__deepcopy__",
    "__sizeof__", "__dir__", "__class_getitem__", "__divmod__", "__rdivmod__", "__complex__", "__trunc__",
    "__floor__", "__ceil__", "__bytes__", "__fspath__", "__await__", "__aiter__", "__anext__", "__aenter__",
    "__aexit__",
})
# Special methods whose definition is flagged (rule 4): they run outside the call, or fool isinstance.
HOOK_DEFINITIONS = frozenset({
    "__del__", "__reduce__", "__reduce_ex__", "__getstate__", "__setstate__", "__getnewargs__",
    "__getnewargs_ex__", "__class__", "__instancecheck__", "__subclasscheck__", "__getattribute__",
})
# A builtin container's subclass may not redefine how the worker reads it back (rule 4).
_CONTAINERS = frozenset({"dict", "list", "tuple", "set", "frozenset", "str", "bytes", "int", "float", "complex",
                         "bool", "NamedTuple", "OrderedDict", "defaultdict", "deque", "Counter", "namedtuple"})
_READ_HOOKS = frozenset({
    "__iter__", "__getitem__", "__len__", "__contains__", "__bool__", "__index__", "__int__", "__float__",
    "__eq__", "__hash__", "__str__", "__repr__", "__format__", "items", "keys", "values", "get", "_fields",
    "_asdict", "__getattr__", "__reversed__", "__copy__", "__deepcopy__", "tolist", "item",
})
_TENSOR_BASES = frozenset({"torch.Tensor", "torch.nn.Parameter", "torch.nn.parameter.Parameter"})
# A module re-exported under another (torch.sys, os.sys, torch.x.time): the chain is checked again from there.
_REROOT = frozenset({m.split(".")[0] for m in MODULES} - {"trace", "profile", "code", "grader", "mock"})
_OWN_SUBMODULES = frozenset({"torch.signal"})
_PUBLIC_UNDERSCORED = frozenset({"os._exit"})  # documented public names that start with an underscore  # a library's own module named like a standard one: no re-export
# Names an unresolved object's attribute may not be read by unless called (sys.modules through a parameter).
_IMPORT_STATE = frozenset({"modules", "meta_path", "path_hooks", "path_importer_cache"})
# Objects whose attributes honest code sets (autograd's ctx), and tensor attributes honest code sets.
_OWN = ("self", "cls", "ctx")
_TENSOR_STORES_OK = frozenset({"data", "grad", "requires_grad"})
_NAMEDTUPLE_API = frozenset({"_fields", "_asdict", "_replace", "_make", "_field_defaults"})

# Segments that flag a string constant naming them ("_C", "grader.harness.probes"): the name a
# dynamic lookup would use. Every name in NAMES, and every special name outside ALLOWED_DUNDERS, counts too.
STRING_SEGMENTS = frozenset({
    "grader", "ctypes", "_ctypes", "cffi", "_C", "_python_dispatch", "_mode_utils", "_library", "cpp_extension",
    "_thread", "overrides", "_dynamo", "_subclasses", "_ops", "builtins", "importlib", "inspect",
})

# Rule 8, with clocks=True: modules and names that read a clock or wait.
CLOCK_MODULES = frozenset({
    "time", "datetime", "_datetime", "timeit", "resource", "sched", "select", "selectors", "asyncio", "queue",
    "_queue", "uuid", "psutil", "torch.distributed",
    "os.times", "os.getloadavg", "os.wait3", "os.wait4", "os.stat", "os.fstat", "os.lstat", "os.scandir",
    "os.path.getmtime", "os.path.getatime", "os.path.getctime", "os.path.getsize",
    "torch.profiler", "torch.autograd.profiler", "torch.utils.benchmark", "triton.testing",
})
CLOCK_NAMES = frozenset({
    "sleep", "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "process_time", "process_time_ns",
    "thread_time", "thread_time_ns", "time_ns", "clock_gettime", "clock_gettime_ns", "get_clock_info",
    "elapsed_time", "st_mtime", "st_mtime_ns", "st_atime", "st_atime_ns", "st_ctime", "st_ctime_ns",
    "st_birthtime", "getmtime", "getatime", "getctime", "getrusage", "utcnow", "do_bench", "setitimer",
    "getitimer", "sigtimedwait", "sigwait", "sigwaitinfo", "now", "today", "timedelta", "datetime64",
    "timedelta64", "TCPStore", "FileStore", "HashStore", "from_file", "fromfile", "loadtxt", "genfromtxt",
    "memmap", "read_text", "read_bytes", "globaltimer",
})
CLOCK_BUILTINS: frozenset[str] = frozenset()
# Rule 5's file access (structural=True): /proc/self/mem rewrites the process's own memory, /proc holds clocks.
FILES = "your code opens files, and /proc/self/mem lets a process rewrite its own memory (and the probes in it)"
FILE_MODULES = frozenset({"io.open", "io.FileIO", "_io", "os.open", "os.fdopen", "os.read", "os.pread", "os.readv",
                          "os.preadv", "os.write", "os.pwrite", "os.writev", "os.pwritev", "os.sendfile",
                          "os.copy_file_range", "os.splice", "pathlib", "mmap", "shutil", "fileinput",
                          "linecache", "tempfile"})
FILE_BUILTINS = frozenset({"open"})
_OWN_MEMORY = re.compile(r"/proc/[^/\s]+/(task/[^/\s]+/)?mem\b|/dev/k?mem\b|/dev/port\b")
CLOCK_TABLE: dict[str, str] = {**{m: CLOCKS for m in CLOCK_MODULES}, "socket": SOCKET, "_socket": SOCKET,
                                      "socketserver": SOCKET}
_CLOCK_ROOTS = frozenset({m.split(".")[0] for m in (*CLOCK_TABLE, *FILE_MODULES)} - {"select", "torch"})
_CLOCK_PATHS = ("/proc", "/sys/", "/dev/rtc", "/dev/hpet")

_SELF = ("self", "cls")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_PYTHON_ENCODINGS = ("utf-8", "utf-8-sig", "ascii", "us-ascii", "latin-1", "iso-8859-1")
_UNSAFE_KEYWORDS = {"weights_only": False, "allow_pickle": True}  # torch.load, numpy.load: unpickling
_FOLD_LIMIT = 10_000  # characters: a folded string longer than this is not folded (nor built here)
# Parsing costs the grader's own process about 500 bytes of memory per source byte (a 16 MiB file of one
# long list literal took 8 GB): a file over this is not parsed, and fails closed.
MAX_SOURCE_BYTES = 1 << 20


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


# -- The scanner ------------------------------------------------------------------------------------


def _dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _private(name: str) -> bool:
    return name.startswith("_") and not _dunder(name)


def _module_rule(path: str, clocks: bool, structural: bool = False) -> str | None:
    """Why a dotted path is flagged: the module table, the os process family, clocks, private segments,
    and the same again from every segment that names a module re-exported there (torch.sys.modules).
    `posix` and `nt` are os's own implementation: their names are os's (posix.write is os.write)."""
    parts = path.split(".")
    if parts[0] in ("posix", "nt"):
        parts[0] = "os"
        path = ".".join(parts)
    for start in range(1, len(parts)):
        parent = ".".join(parts[:start])
        if parent in SUBMODULES and parts[start] not in SUBMODULES[parent] and _module_or_unknown(parts[:start + 1]):
            return NOT_IMPORTABLE
        if ".".join(parts[:start + 1]) in _OWN_SUBMODULES or _own_module(parts[:start + 1]):
            continue
        if parts[start] in _REROOT or ((clocks or structural) and parts[start] in _CLOCK_ROOTS):
            why = _module_rule(".".join(parts[start:]), clocks, structural)
            if why:
                return why
        foreign = _reexported(parts[:start + 1])
        if foreign is not None:  # numpy.ctypeslib.ctypes, torch.os.system: the chain goes on from that module
            why = _module_rule(".".join([foreign, *parts[start + 1:]]), clocks, structural)
            if why:
                return why
    for end in range(1, len(parts) + 1):
        prefix = ".".join(parts[:end])
        why = (MODULES.get(prefix) or (CLOCK_TABLE.get(prefix) if clocks else None)
               or (FILES if structural and prefix in FILE_MODULES else None))
        if why:
            return why
    if _OS_PROCESS.match(path):
        return PROCESSES
    if parts[0] == "torch":
        # torch.ops.<namespace>.<operator> names an operator (the guard sees those); after it, and
        # everywhere else under torch, a private segment is internals. The nested and jagged operators are not
        # the guard's: they build tensors whose pieces' shapes are another tensor's values, read in C++
        # (torch.ops.aten._nested_view_from_buffer: red team round 19, moe_router and speculative 9/9).
        if parts[1:2] == ["ops"] and len(parts) > 3 and ("nested" in parts[3] or "jagged" in parts[3]):
            return NESTED
        first_free = 4 if parts[1:2] == ["ops"] else 1
        if any(_private(p) for p in parts[first_free:]):
            return TORCH_PRIVATE
    elif any(_private(p) for p in parts) and path not in _PUBLIC_UNDERSCORED:
        return PRIVATE
    if parts[0] not in IMPORTABLE:
        return NOT_IMPORTABLE
    return None


_MISSING = object()


def _walk(parts: list[str]) -> object:
    """The object a chain of public names stands for in the grader's own imports, or _MISSING. Through module
    namespaces only: no module's ``__getattr__`` runs, and nothing is imported beyond an importable root."""
    import importlib
    import sys
    from types import ModuleType

    if parts[0] not in IMPORTABLE or any(_private(p) or _dunder(p) for p in parts):
        return _MISSING
    try:
        obj: object = sys.modules.get(parts[0]) or importlib.import_module(parts[0])
    except Exception:  # pragma: no cover - every importable root is installed with the grader
        return _MISSING
    for name in parts[1:]:
        if not isinstance(obj, ModuleType):
            return _MISSING  # a class or a function: the scan follows modules only
        found = vars(obj).get(name, _MISSING)
        obj = sys.modules.get(f"{obj.__name__}.{name}", _MISSING) if found is _MISSING else found
        if obj is _MISSING:
            return _MISSING
    return obj


def _own_module(parts: list[str]) -> bool:
    """True when the chain is a library's own submodule of that name (torch.types, torch.signal), not a module
    re-exported there."""
    from types import ModuleType

    found = _walk(parts)
    return isinstance(found, ModuleType) and found.__name__ == ".".join(parts)


def _module_or_unknown(parts: list[str]) -> bool:
    """True unless the chain is known to be a plain attribute (a function, a class, a constant) of its module:
    a submodule, or a name not loaded here (a lazy submodule), is treated as a module."""
    from types import ModuleType

    found = _walk(parts)
    return found is _MISSING or isinstance(found, ModuleType)


def _reexported(parts: list[str]) -> str | None:
    """The real name of the module a chain of public names leads to, when that module is not the chain's own
    (``torch.os`` is os, ``numpy.ctypeslib.ctypes`` is ctypes, ``os.path`` is posixpath); None when the chain
    is the module it names, or is no module. A standard module's name that the walk cannot find at the end of
    the chain (a lazy submodule not loaded here) counts as that module: a chain is never let through for being
    unknown."""
    import sys
    from types import ModuleType

    found = _walk(parts)
    if found is _MISSING:
        parent = _walk(parts[:-1]) if len(parts) > 1 else _MISSING
        name = parts[-1]
        if isinstance(parent, ModuleType) and name in sys.stdlib_module_names and name not in IMPORTABLE:
            return name
        return None
    if isinstance(found, ModuleType):
        return found.__name__ if found.__name__ != ".".join(parts) else None
    return _foreign_object(found, parts)


def _foreign_object(found: object, parts: list[str]) -> str | None:
    """The real name of a function or class a library re-exports from a module outside its own package
    (``torch.cuda.amp.common.find_spec`` is importlib's, ``torch.autograd.graph.WeakKeyDictionary`` is weakref's,
    ``triton.language.extra.module_from_spec`` is importlib's), so the rules of that module apply to it; None for
    a library's own objects and for the builtins a chain may name anyway."""
    if not (callable(found) or isinstance(found, type)):
        return None
    module, name = getattr(found, "__module__", None), getattr(found, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(name, str):
        return None
    root = module.split(".")[0]
    if root in ("posix", "nt"):  # os's own implementation (see _module_rule)
        root = "os"
    if root.lstrip("_") == parts[0] or root == parts[0]:
        return None
    if root == "builtins":  # int, dict, module: plain types; exec, eval and the like keep their own rules
        return f"builtins.{name}" if name in BUILTINS or name in _ATTRIBUTE_CALLS + _NAMESPACE_CALLS else None
    if root.startswith("_frozen_importlib"):
        module = "importlib"
    return f"{module}.{name}"


# The course's helper modules a student may import by name, to try their code as its README shows
# (from grader.support.ring_allreduce import run_simulated); every other reference to grader is flagged.
_HARNESS_PARTS = frozenset({"harness", "probes", "session", "worker", "client", "launch", "wire", "tamper", "plugin",
                            "integrity", "opfamilies", "kernel_rule", "launches", "host_reads", "interpreter_bound",
                            "guard", "counters"})


def _course_helper(module: str) -> bool:
    parts = module.split(".")
    return module == "grader.testing" or (len(parts) == 3 and parts[:2] == ["grader", "support"])


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in _SELF


def _bounded(text: str | bytes) -> str | bytes | None:
    return text if len(text) <= _FOLD_LIMIT else None


_TORCH_NAMES: list[frozenset[str]] = []


_LIBRARY_PRIVATE: list[frozenset[str]] = []
# Private names that lead past the probes, whatever object they are read from: torch's C core and its dispatcher,
# the operator namespaces, frames, threads. A file may still name its own private attributes anything else.
_DANGEROUS_PRIVATE = frozenset({
    "_C", "_VF", "_TensorBase", "_ops", "_dynamo", "_subclasses", "_python_dispatch", "_mode_utils", "_library",
    "_dispatch", "_functorch", "_higher_order_ops", "_prims", "_decomp", "_inductor", "_export", "_compile",
    "_guards", "_jit_internal", "_disabled_torch_function_impl", "_thread", "_getframe", "_current_frames",
    "_sys", "_os", "_ctypes", "_posixsubprocess", "_imp",
})


def _library_private_names() -> frozenset[str]:
    """Private names a file may not use even for its own attributes: `_DANGEROUS_PRIVATE`, and every private
    name of torch's C module, sys, threading and the grader's probes. Any object can be passed as ``self``
    (``f(torch)`` with ``def f(self): return self._C``), so a file's own private names are allowed only
    where they cannot be these."""
    if not _LIBRARY_PRIVATE:
        import sys
        import threading

        sources: list = [sys, threading]
        try:
            import importlib

            import torch

            from grader.harness.integrity import PROBE_MODULES

            sources += [torch._C, *map(importlib.import_module, PROBE_MODULES), torch.Tensor, torch.UntypedStorage,
                        torch.TypedStorage, torch.nn.Module]
        except ImportError:  # pragma: no cover - the grader always has torch
            pass
        _LIBRARY_PRIVATE.append(_DANGEROUS_PRIVATE | frozenset(n for src in sources for n in dir(src) if _private(n)))
    return _LIBRARY_PRIVATE[0]


def _watched_names() -> frozenset[str]:
    """The attribute names of the read-back routes the probes watch (host_reads.HOST_READS: numpy, tolist, ...)."""
    from grader.harness.host_reads import HOST_READS

    return frozenset(dotted.rsplit(".", 1)[-1] for dotted in HOST_READS)


def _torch_attribute_names() -> frozenset[str]:
    """The public attribute names of torch, torch.Tensor and torch.nn.Module in the grader's own torch:
    an attribute of that name set on an object the scan cannot resolve patches torch (rule 5)."""
    if not _TORCH_NAMES:
        try:
            import torch

            names = {n for source in (torch, torch.Tensor, torch.nn.Module) for n in dir(source) if not n.startswith("_")}
        except ImportError:  # pragma: no cover - the grader always has torch
            names = set()
        _TORCH_NAMES.append(frozenset(names))
    return _TORCH_NAMES[0]


def _small_int(node: ast.AST) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int and -_FOLD_LIMIT <= node.value <= _FOLD_LIMIT:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _small_int(node.operand)
        return None if value is None else -value
    return None


class _Folder:
    """Folds expressions made only of constants into the string (or bytes) they evaluate to (rule 7).

    Never evaluates anything: each supported form is computed here, bounded in size. None when the
    expression is not one of those forms."""

    def __init__(self) -> None:
        self.cache: dict[int, str | bytes | None] = {}

    def __call__(self, node: ast.AST) -> str | bytes | None:
        key = id(node)
        if key not in self.cache:
            self.cache[key] = None  # a cycle is impossible in an AST; this also bounds re-entry
            try:
                self.cache[key] = self.fold(node)
            except (ValueError, TypeError, IndexError, UnicodeError, OverflowError):
                self.cache[key] = None
        return self.cache[key]

    def seq(self, node: ast.AST) -> list | None:
        """A list, tuple or string of constants, element by element."""
        if isinstance(node, (ast.List, ast.Tuple)):
            items = [self(e) for e in node.elts]
            if all(isinstance(i, str) for i in items):
                return items
            ints = [_small_int(e) for e in node.elts]
            return ints if all(i is not None for i in ints) else None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("reversed", "list",
                                                                                                "tuple") and len(node.args) == 1:
            inner = self.seq(node.args[0])
            return None if inner is None else (inner[::-1] if node.func.id == "reversed" else inner)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "map"
                and len(node.args) == 2 and isinstance(node.args[0], ast.Name) and node.args[0].id == "chr"):
            codes = self.seq(node.args[1])
            return None if codes is None or not all(isinstance(c, int) for c in codes) else [chr(c) for c in codes]
        text = self(node)
        return list(text) if isinstance(text, str) else None

    def fold(self, node: ast.AST) -> str | bytes | None:
        if isinstance(node, ast.Constant):
            return node.value if isinstance(node.value, (str, bytes)) else None
        if isinstance(node, ast.JoinedStr):
            parts = []
            for value in node.values:
                part = self(value.value) if isinstance(value, ast.FormattedValue) else self(value)
                if not isinstance(part, str):
                    return None
                parts.append(part)
            return _bounded("".join(parts))
        if isinstance(node, ast.BinOp):
            left = self(node.left)
            if isinstance(node.op, ast.Add):
                right = self(node.right)
                if isinstance(left, str) and isinstance(right, str) or isinstance(left, bytes) and isinstance(right, bytes):
                    return _bounded(left + right)  # type: ignore[operator]  # both str or both bytes
            elif isinstance(node.op, ast.Mult):
                count = _small_int(node.right)
                if left is not None and count is not None and len(left) * max(count, 0) <= _FOLD_LIMIT:
                    return left * count
            elif isinstance(node.op, ast.Mod) and isinstance(left, str):
                right = self(node.right)
                if isinstance(right, str):
                    return _bounded(left % right)
                if isinstance(node.right, ast.Tuple):
                    items = [self(e) for e in node.right.elts]
                    if all(isinstance(i, str) for i in items):
                        return _bounded(left % tuple(items))
            return None
        if isinstance(node, ast.Subscript):
            base = self(node.value)
            if base is None:
                return None
            if isinstance(node.slice, ast.Slice):
                bounds = []
                for end in (node.slice.lower, node.slice.upper, node.slice.step):
                    bound = None if end is None else _small_int(end)
                    if end is not None and bound is None:
                        return None
                    bounds.append(bound)
                return base[slice(*bounds)]
            index = _small_int(node.slice)
            return None if index is None or isinstance(base, bytes) else base[index]
        if isinstance(node, ast.Call):
            return self.fold_call(node)
        return None

    def fold_call(self, node: ast.Call) -> str | bytes | None:
        func, args = node.func, node.args
        if node.keywords and not (isinstance(func, ast.Attribute) and func.attr in ("decode", "encode")):
            return None
        if isinstance(func, ast.Name):
            if func.id == "chr" and len(args) == 1:
                code = _small_int(args[0]) if not isinstance(args[0], ast.BinOp) else self.int_expr(args[0])
                return None if code is None or not 0 <= code < 0x110000 else chr(code)
            if func.id == "str" and len(args) == 1:
                return self(args[0]) if isinstance(self(args[0]), str) else None
            if func.id in ("bytes", "bytearray") and len(args) == 1:
                codes = self.seq(args[0])
                return bytes(codes) if codes is not None and all(isinstance(c, int) for c in codes) else None
            return None
        if not isinstance(func, ast.Attribute):
            return None
        if func.attr == "fromhex" and isinstance(func.value, ast.Name) and func.value.id == "bytes" and len(args) == 1:
            text = self(args[0])
            return bytes.fromhex(text) if isinstance(text, str) else None
        base = self(func.value)
        if base is None:
            return None
        if func.attr == "join" and len(args) == 1:
            items = self.seq(args[0])
            if items is not None and all(isinstance(i, type(base)) for i in items):
                return _bounded(base.join(items))
            return None
        if func.attr == "decode" and isinstance(base, bytes):
            encoding = self(args[0]) if args else "utf-8"
            for keyword in node.keywords:
                if keyword.arg == "encoding":
                    encoding = self(keyword.value)
            return base.decode(encoding) if isinstance(encoding, str) and encoding.lower() in _PYTHON_ENCODINGS else None
        if func.attr in ("upper", "lower", "strip", "lstrip", "rstrip", "title", "capitalize", "swapcase") and not args:
            return getattr(base, func.attr)()
        if func.attr == "replace" and len(args) == 2:
            old, new = self(args[0]), self(args[1])
            if type(old) is type(base) and type(new) is type(base):
                return _bounded(base.replace(old, new))  # type: ignore[arg-type]  # all three str or all bytes
            return None
        if func.attr == "format" and isinstance(base, str) and "{" in base and "." not in base and "[" not in base:
            items = [self(a) for a in args]
            return _bounded(base.format(*items)) if all(isinstance(i, str) for i in items) else None
        return None

    def int_expr(self, node: ast.AST) -> int | None:
        """Small integer arithmetic for chr(): chr(100 + 15)."""
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            left, right = self.int_expr(node.left), self.int_expr(node.right)
            if left is None or right is None:
                return None
            return left + right if isinstance(node.op, ast.Add) else left - right
        return _small_int(node)


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


def scan_sources(sources: Iterable[tuple[str, str | bytes]], structural: bool = False,
                 clocks: bool = False) -> dict[str, list[Finding]]:
    """`scan` of several named sources: name -> findings (for tests and reports)."""
    return {name: scan(source, structural=structural, clocks=clocks) for name, source in sources}
