"""The trusted scan's tables: what a student's file may not reach, and why each finding says so.

`Finding` (one flagged reference), the reasons (`TRACING`, `DISPATCH`, ...), and the rules' tables: the modules a
submission may import (`IMPORTABLE`, `SUBMODULES`), the modules and names flagged wherever they appear (`MODULES`,
`NAMES`, `BUILTINS`, `STRING_SEGMENTS`), the special names a file may read or define (`ALLOWED_DUNDERS`,
`DEFINABLE_DUNDERS`, `HOOK_DEFINITIONS`), clocks and files (rules 8 and 5), and `MAX_SOURCE_BYTES`.
grader/harness/tamper.py documents the rules and applies them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


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
                  "listed in grader.harness.scan_rules.SUBMODULES); a module the grader does not know may run code "
                  "it is handed, or reach below the probes, and no exercise needs one")
PROTOCOL = ("your class defines a special method outside the list a class may define (grader.harness.scan_rules."
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
