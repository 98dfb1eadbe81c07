"""The trusted static scan (grader/harness/tamper.py): it flags what can dismantle the probes, and
honest code never trips it."""

from __future__ import annotations

import re
import textwrap

import pytest

from grader.harness import scan_rules, tamper
from grader.harness.session import StudentSession, TamperedModule
from tests.conftest import COURSE, ROOT
from tests.known_wrong import load_mutants

# Known-wrong submissions whose point is to tamper (the scan must flag them, and only them).
TAMPERING_MUTANTS = {("online_softmax", "softmax_with_dispatch_modes_popped")}


def whats(source: str) -> list[str]:
    return [f.what for f in tamper.scan(textwrap.dedent(source))]


HONEST_FILES = sorted([*ROOT.glob("solutions/*/*.py"), *(ROOT / "exercises" / e.id / e.file for e in COURSE.exercises)])


@pytest.mark.parametrize("path", HONEST_FILES, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_solutions_and_stubs_scan_clean(path):
    assert tamper.scan_file(path) == [], f"honest code must never trip the scan: {tamper.describe(tamper.scan_file(path))}"


def test_known_wrong_submissions_scan_clean_unless_they_tamper():
    for exercise in COURSE.exercises:
        source = (ROOT / "solutions" / exercise.id / exercise.file).read_text()
        for mutant in load_mutants(exercise.id):
            findings = tamper.scan(mutant.apply(source))
            if (exercise.id, mutant.name) in TAMPERING_MUTANTS:
                assert findings, f"{exercise.id}/{mutant.name} tampers and the scan must say so"
            else:
                assert not findings, f"{exercise.id}/{mutant.name} is an honest bug, flagged: {tamper.describe(findings)}"


FLAGGED = {
    # the dispatch-mode machinery
    "pop the mode": ("from torch.utils._python_dispatch import _pop_mode\n", "torch.utils._python_dispatch"),
    "disable the modes": ("import torch.utils._python_dispatch as d\nd._disable_current_modes()\n",
                          "torch.utils._python_dispatch"),
    "torch._C": ("import torch\ntorch._C._pop_torch_dispatch_stack()\n", "torch._C._pop_torch_dispatch_stack"),
    "an own dispatch mode": ("class M(object):\n    def __torch_dispatch__(self, *a): pass\n", "__torch_dispatch__"),
    "a function mode": ("from torch.overrides import TorchFunctionMode\n", "torch.overrides"),
    "no_dispatch": ("from torch.utils._mode_utils import no_dispatch\n", "torch.utils._mode_utils"),
    "redispatch": ("import torch\ntorch.ops.aten._softmax.default.redispatch\n",
                   "torch.ops.aten._softmax.default.redispatch"),
    "torch.library": ("import torch\n@torch.library.custom_op('a::b', mutates_args=())\ndef f(x): return x\n",
                      "torch.library.custom_op"),
    # tracing
    "sys.settrace": ("import sys\nsys.settrace(None)\n", "sys.settrace"),
    "settrace through a variable": ("import sys\ns = sys\ns.settrace(None)\n", "sys.settrace"),
    "settrace through an unknown object": ("def f(s):\n    s.settrace(None)\n", "...settrace"),
    "from sys import settrace": ("from sys import settrace as st\n", "sys.settrace"),
    "getattr with the name": ("import sys\ngetattr(sys, 'settrace')(None)\n", "sys.settrace"),
    "threading.settrace": ("import threading\nthreading.settrace(None)\n", "threading"),
    "sys.monitoring": ("import sys\nsys.monitoring.use_tool_id(1, 'x')\n", "sys.monitoring"),
    "a debugger": ("breakpoint()\n", "breakpoint"),
    # the harness
    "import grader": ("import grader.harness.probes\n", "grader.harness.probes"),
    "from the harness": ("from grader.harness import probes\n", "grader.harness"),
    "sys.modules": ("import sys\nsys.modules['x']\n", "sys.modules"),
    "a course helper's globals": ("from grader.support.ring_allreduce import run_simulated\nrun_simulated.__globals__\n",
                                  "grader.support.ring_allreduce.run_simulated.__globals__"),
    # frames and the garbage collector
    "sys._getframe": ("import sys\nsys._getframe(1)\n", "sys._getframe"),
    "f_back": ("def f(frame):\n    return frame.f_back\n", "...f_back"),
    "tb_frame": ("try:\n    pass\nexcept Exception as e:\n    e.__traceback__.tb_frame\n", "...tb_frame"),
    "gc.get_referrers": ("import gc\ngc.get_referrers(1)\n", "gc.get_referrers"),
    "inspect.currentframe": ("import inspect\ninspect.currentframe()\n", "inspect.currentframe"),
    "__subclasses__": ("object.__subclasses__()\n", "...__subclasses__"),
    # native code, threads, processes
    "ctypes": ("import ctypes\n", "ctypes"),
    "cpp_extension": ("from torch.utils.cpp_extension import load_inline\n", "torch.utils.cpp_extension"),
    "a thread": ("import threading\nthreading.Thread(target=print).start()\n", "threading"),
    "_thread": ("import _thread\n", "_thread"),
    "a subprocess": ("import subprocess\n", "subprocess"),
    "os.execv": ("import os\nos.execv('python', [])\n", "os.execv"),
    "multiprocessing": ("import torch.multiprocessing as mp\n", "torch.multiprocessing"),
    # dynamic code
    "exec": ("exec('import sys')\n", "exec"),
    "eval": ("eval('1')\n", "eval"),
    "compile": ("compile('1', 'f', 'eval')\n", "compile"),
    "__import__": ("__import__('sys')\n", "__import__"),
    "importlib": ("import importlib\n", "importlib"),
    "a computed getattr": ("import torch\nname = 'soft' + 'max'\ngetattr(torch, name)\n", "getattr with a computed name"),
    "__builtins__": ("__builtins__['exec']\n", "__builtins__"),
    "a module's __dict__": ("import torch\ntorch.__dict__['softmax']\n", "torch.__dict__"),
    "vars of a module": ("import torch\nvars(torch)\n", "vars()"),
    "unpickling": ("import pickle\npickle.loads(b'')\n", "pickle"),
    "torch.load without weights_only": ("import torch\ntorch.load('f', weights_only=False)\n", "weights_only=..."),
    "a string naming torch._C": ("import operator, torch\noperator.attrgetter('_C')(torch)\n", "operator.attrgetter"),
    "a string naming the harness": ("x = 'grader.harness.probes'\n", "'grader.harness.probes'"),
    "a module's __getattr__": ("import torch\ntorch.__getattr__(name)\n", "torch.__getattr__"),
    # rule 3: by-name access only as a direct call with a literal name
    "getattr on self with a computed name": ("class A:\n    def f(self, name):\n        return getattr(self, name)\n",
                                             "getattr with a computed name"),
    "getattr as a value": ("import functools, sys\nfunctools.reduce(getattr, [n], sys)\n", "getattr used as a value"),
    "getattr mapped": ("import sys\nlist(map(getattr, [sys], names))\n", "getattr used as a value"),
    "getattr rebound": ("g = getattr\n", "getattr used as a value"),
    "getattr as a default argument": ("def f(x, g=getattr):\n    return g(x, 'y')\n", "getattr used as a value"),
    "getattr with unpacked arguments": ("import sys\ngetattr(*pair)\n", "getattr with a computed name"),
    "hasattr with a computed name": ("def f(x, n):\n    return hasattr(x, n)\n", "hasattr with a computed name"),
    "setattr on self with a computed name": ("class A:\n    def f(self, n):\n        setattr(self, n, 1)\n",
                                             "setattr with a computed name"),
    "getattr with a folded name": ("import sys\ngetattr(sys, 'set' + 'trace')(None)\n", "sys.settrace"),
    "getattr with a reversed name": ("import sys\ngetattr(sys, 'ecarttes'[::-1])\n", "sys.settrace"),
    "getattr of a special name": ("def f(fn):\n    return getattr(fn, '__self__')\n", "getattr(..., '__self__')"),
    "globals()": ("globals()['x']\n", "globals()"),
    "locals()": ("def f():\n    return locals()\n", "locals()"),
    "vars()": ("def f():\n    return vars()\n", "vars()"),
    "vars of an object": ("def f(x):\n    return vars(x)\n", "vars()"),
    # the red team's takeover of the worker's request loop (round 5): a frame's locals through a format field, a
    # pickle through numpy with allow_pickle passed in **, raw reads and writes through posix
    "a format field reaching into its argument": ("def f(tb):\n    return '{0.tb_frame}'.format(tb)\n",
                                                  "a format field '0.tb_frame'"),
    "a format field inside a format spec": ("def f(a, b):\n    return '{0:{1.x}}'.format(a, b)\n", "a format field '1.x'"),
    "an item by a format field": ("def f(d):\n    return '{0[key]}'.format(d)\n", "a format field '0[key]'"),
    "a format string built at run time": ("def f(t, x):\n    return ('{' + t + '}').format(x)\n", "....format()"),
    "format_map": ("def f(m):\n    return '{a.b}'.format_map(m)\n", "a format field 'a.b'"),
    "str.format of a template": ("def f(x):\n    return str.format('{0.y}', x)\n", "a format field '0.y'"),
    "allow_pickle through **": ("import numpy as np\nnp.save\ndef f(p):\n    return g(p, **{'allow_pickle': True})\n",
                                "**{'allow_pickle': ...}"),
    "numpy.load": ("import numpy as np\nnp.load('x')\n", "numpy.load"),
    "doctest": ("import doctest\n", "doctest"),
    "timeit, whatever the rules": ("import timeit\ntimeit.timeit('1')\n", "timeit"),
    "yaml": ("import yaml\nyaml.unsafe_load('x')\n", "yaml"),
    "str.format as a value": ("def f(fmt, obj):\n    return list(map(str.format, [fmt], [obj]))\n", "...format used as a value"),
    "a bound format called later": ("def f(fmt, obj):\n    g = fmt.format\n    return g(obj)\n", "...format used as a value"),
    "logging's {-style Formatter": ("import logging\nlogging.Formatter('{args}', style='{')\n", "logging.Formatter"),
    "torch.load with keywords from a mapping": ("import torch\ndef f(p, kw):\n    return torch.load(p, **kw)\n",
                                                "torch.load(**...)"),
    # a storage of the student's own, and a tensor over it: bytes in and out with no operator
    "a storage made by hand": ("import torch\nst = torch.UntypedStorage(64)\n", "torch.UntypedStorage"),
    "a tensor rebound to a storage": ("def f(t, st):\n    return t.set_(st)\n", "...set_"),
    "a typed storage": ("import torch\ns = torch.FloatStorage(4)\n", "torch.FloatStorage"),
    "a storage's own file routes": ("def f(st, sink):\n    st._write_file(sink, False, False, 1)\n", "..._write_file"),
    "a storage's private route defined as the file's own": (
        "class D:\n    def _set_from_file(self):\n        pass\ndef f(st, b):\n    st._set_from_file(b, None, False, 1)\n",
        "..._set_from_file"),
    # anything can be passed as `self`: f(torch.nn.functional) read the module's namespace, f(torch) torch._C
    "vars(self)": ("class A:\n    def f(self):\n        return vars(self)\n", "vars()"),
    "self.__dict__": ("def f(self):\n    return self.__dict__\n", "...__dict__"),
    "getattr(self, '__dict__')": ("def f(self):\n    return getattr(self, '__dict__')\n", "getattr(..., '__dict__')"),
    "a private name of torch's C core on self": ("class A:\n    def __init__(self):\n        self._C = 0\n"
                                                 "def f(self):\n    return self._C\n", "..._C"),
    "a private name of sys on self": ("def f(self):\n    return self._getframe(0)\n", "..._getframe"),

    "type(x).__dict__": ("def f(x):\n    return type(x).__dict__\n", "...__dict__"),
    "object.__getattribute__": ("import sys\nobject.__getattribute__(sys, n)\n", "...__getattribute__"),
    "operator.methodcaller": ("import operator\noperator.methodcaller(n)\n", "operator.methodcaller"),
    "inspect, whatever is used": ("import inspect\ninspect.signature(print)\n", "inspect"),
    "inspect.getmembers": ("from inspect import getmembers\n", "inspect"),
    "a match class pattern's attribute": ("def f(fn):\n    match fn:\n        case object(__globals__=g):\n"
                                          "            return g\n", "case ...(__globals__=...)"),
    "__match_args__": ("class C:\n    __match_args__ = ('a',)\n", "__match_args__"),
    "string.Formatter": ("import string\nstring.Formatter().get_field('0.x', (1,), {})\n", "string.Formatter"),
    "get_field on any object": ("def f(fmt):\n    return fmt.get_field('0.x', (1,), {})\n", "...get_field"),
    "typing.get_type_hints": ("from typing import get_type_hints\n", "typing.get_type_hints"),
    "pydoc.locate": ("import pydoc\npydoc.locate('sys')\n", "pydoc"),
    "pkgutil.resolve_name": ("import pkgutil\npkgutil.resolve_name('sys:path')\n", "pkgutil"),
    "unittest.mock": ("from unittest import mock\n", "unittest.mock"),
    "help": ("help('modules')\n", "help"),
    "type with three arguments": ("C = type('C', (), {})\n", "type(name, bases, namespace)"),
    # rule 4: special names
    "print.__self__": ("print.__self__\n", "...__self__"),
    "__class__.__base__": ("().__class__.__base__\n", "...__base__"),
    "__mro__": ("def f(x):\n    return type(x).__mro__\n", "...__mro__"),
    "__reduce_ex__": ("def f(x):\n    return x.__reduce_ex__(2)\n", "...__reduce_ex__"),
    "__wrapped__": ("def f(g):\n    return g.__wrapped__\n", "...__wrapped__"),
    "__spec__": ("x = __spec__\n", "__spec__"),
    "a finaliser": ("class A:\n    def __del__(self):\n        pass\n", "def __del__"),
    "a pickling hook": ("class A:\n    def __reduce__(self):\n        return (print, ())\n", "def __reduce__"),
    "a lie to isinstance": ("class A:\n    @property\n    def __class__(self):\n        return int\n",
                            "def __class__"),
    "__class__ assigned": ("def f(x, C):\n    x.__class__ = C\n", "...__class__ = ..."),
    "a metaclass": ("class M(type):\n    pass\n", "class M(type)"),
    "metaclass=": ("class A(metaclass=abc.ABCMeta):\n    pass\n", "class A(metaclass=...)"),
    "a tensor subclass": ("import torch\nclass T(torch.Tensor):\n    pass\n", "class T(torch.Tensor)"),
    "a dict subclass read lazily": ("class D(dict):\n    def items(self):\n        return []\n", "class D(dict).items"),
    "a NamedTuple that redefines iteration": ("from typing import NamedTuple\nclass R(NamedTuple):\n    a: int\n"
                                              "    def __iter__(self):\n        return iter(())\n",
                                              "class R(NamedTuple).__iter__"),
    # rule 2: private internals of any module
    "a private helper of the standard library": ("import warnings\nwarnings._getcategory('x')\n",
                                                 "warnings._getcategory"),
    "a private module": ("import _io\n", "_io"),
    # rule 5: patching in place
    "setattr with a computed name on a module": ("import torch\nsetattr(torch, n, 1)\n", "setattr with a computed name"),
    "a patched driver's clock": ("import grader.support.paged_kv as d\nd.time = None\n", "grader.support.paged_kv"),
    # rule 1: the worker's socket, code that runs later
    "signal": ("import signal\nsignal.alarm(1)\n", "signal"),
    "weakref.finalize": ("import weakref\nweakref.finalize(object(), print)\n", "weakref"),
    "gc.callbacks": ("import gc\ngc.callbacks.append(print)\n", "gc.callbacks"),
    "sys.addaudithook": ("import sys\nsys.addaudithook(print)\n", "sys.addaudithook"),
    # rule 6: string annotations are code
    "a string annotation": ("def f(x: \"__import__('sys')\"):\n    pass\n", "__import__"),
    "a string inside an annotation": ("from typing import List\ndef f(x: List['eval(1)']):\n    pass\n", "eval"),
    "a string annotation of a variable": ("x: \"sys.settrace\" = 1\n", "...settrace"),
    # rule 7: strings built from constants
    "a concatenated string": ("x = '_get' + 'frame'\n", "'_getframe'"),
    "an f-string of constants": ("x = f\"{'__glo'}bals__\"\n", "'__globals__'"),
    "a joined string": ("x = '.'.join(['grader', 'harness'])\n", "'grader.harness'"),
    "a string spelled in chr()": ("x = chr(95) + chr(67)\n", "'_C'"),
    "chr() codes joined": ("x = ''.join(map(chr, [95, 67]))\n", "'_C'"),
    "a bytes literal decoded": ("x = b'settrace'.decode()\n", "'settrace'"),
    "bytes from codes, decoded": ("x = bytes([95, 67]).decode('ascii')\n", "'_C'"),
    "a string reversed": ("x = ''.join(reversed('ecarttes'))\n", "'settrace'"),
    "a string with % formatting": ("x = '__%s__' % 'self'\n", "'__self__'"),
    "a special name as a string": ("x = '__subclasses__'\n", "'__subclasses__'"),
    "codecs": ("import codecs\ncodecs.decode('frggenpr', 'rot13')\n", "codecs"),
    # modules the dotted paths cannot follow
    "a module in a list": ("import torch\n[torch][0]._C\n", "torch (a module) used as a value"),
    "a module passed to a function": ("import sys\nf(sys)\n", "sys (a module) used as a value"),
    "a module chosen by a conditional": ("import torch, numpy\nm = torch if c else numpy\n", "torch (a module) used as a value"),
    "a module as a match subject": ("import torch\nmatch torch:\n    case _:\n        pass\n",
                                    "torch (a module) used as a value"),
    "sys re-exported by os": ("import os\nos.sys.modules\n", "os.sys.modules"),
    "torch._C re-exported by torch.nn.functional": ("import torch.nn.functional as F\nF.torch._C\n", "torch.nn.functional.torch._C"),
    "sys.modules off a parameter": ("def f(s):\n    return s.modules['x']\n", "...modules"),
    "a private attribute off an object the scan cannot resolve": ("def f(m):\n    return m._python_dispatch\n",
                                                                  "..._python_dispatch"),
    "__annotations__": ("def f(g):\n    g.__annotations__ = {}\n", "...__annotations__"),
    "cpp_extension off any object": ("def f(u):\n    return u.cpp_extension\n", "...cpp_extension"),
    "a module kept as a class attribute": ("import torch\nclass A:\n    m = torch\n", "torch (a module) used as a value"),
    "/proc/self/mem": ("path = '/proc/' + 'self/mem'\n", "'/proc/self/mem'"),
    "/dev/mem": ("path = '/dev/mem'\n", "'/dev/mem'"),
    # the unpatchable base class: the kernel rule patches Tensor.tolist, not TensorBase.tolist
    "super with a named base": ("import torch\ndef f(t):\n    return super(torch.Tensor, t).tolist()\n",
                                "super(...) with arguments"),
    "a base by mro()": ("import torch\ndef f(t):\n    return torch.Tensor.mro()[1].numpy(t)\n", "torch.Tensor.mro"),
    "Triton's runtime": ("from triton.runtime import driver\n", "triton.runtime"),
    "Triton's launch hooks": ("import triton\ntriton.knobs.runtime.launch_enter_hook = print\n", "triton.knobs"),
    "Triton's compiled kernels": ("from triton.compiler import CompiledKernel\n", "triton.compiler"),
    # numpy's array protocols hand it an address: a class answering __array_interface__ (by a def, or by a
    # __getattr__ that answers every name) gave numpy.asarray a writable view of any memory in the process
    "a def of numpy's array interface": ("class A:\n    @property\n    def __array_interface__(self):\n"
                                         "        return {}\n", "def __array_interface__"),
    "a __getattr__, which answers every name": ("class A:\n    def __getattr__(self, name):\n        return 1\n",
                                                "def __getattr__"),
    "a module-level __getattr__": ("def __getattr__(name):\n    return 1\n", "def __getattr__"),
    "DLPack's protocol": ("class A:\n    def __dlpack__(self, stream=None):\n        pass\n", "def __dlpack__"),
    "functools.wraps with its own names": ("import functools\nfunctools.wraps(f, assigned=[n])\n", "functools.wraps"),
    "functools.update_wrapper handed to partial": (
        "import functools\nfunctools.partial(functools.update_wrapper, assigned=[n])\n", "functools.update_wrapper"),
    "torch.utils.swap_tensors": ("import torch\ntorch.utils.swap_tensors(a, b)\n", "torch.utils.swap_tensors"),
    "torch.distributed.rpc": ("import torch.distributed.rpc\n", "torch.distributed.rpc"),
    "a second def line in a kernel": ('import triton\n@triton.jit\ndef k(x):\n    s = """\ndef k(x):\n    pass\n"""\n',
                                      "def k: a second line starting with 'def '"),
    "an async generator hook": ("import sys\nsys.set_asyncgen_hooks(finalizer=print)\n", "sys.set_asyncgen_hooks"),
    "a fork hook": ("import os\nos.register_at_fork(after_in_child=print)\n", "os.register_at_fork"),
    # a module file the student writes at run time and imports through sys.path is code the scan never read
    "sys.path": ("import sys\nsys.path.insert(0, '/tmp')\n", "sys.path"),
    "sys.path by from-import": ("from sys import path\npath.append('x')\n", "sys.path"),
    # round 11: TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD set at import, then torch.load of a hand-made pickle exec'd code
    # the scan never read (the operator guard popped, the kernel rule's read-back watch passed by)
    "torch.load": ("import torch\nx = torch.load('f.pt')\n", "torch.load"),
    "torch.serialization": ("from torch.serialization import load\n", "torch.serialization"),
    "an environment variable set": ("import os\nos.environ['TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD'] = '1'\n", "os.environ"),
    "the environment updated": ("import os\nos.environ.update(a='1')\n", "os.environ"),
    "the environment through an alias": ("import os\ne = os.environ\ne['A'] = '1'\n", "os.environ"),
    "the environment handed on": ("import os\ndef f(d):\n    d['A'] = '1'\nf(os.environ)\n", "os.environ"),
    "the environment through a rebound name": ("import os\ne = {}\ne = os.environ\ne['A'] = '1'\n", "os.environ"),
    "os.putenv": ("import os\nos.putenv('A', '1')\n", "os.putenv"),
    "the collector's threshold": ("import gc\ngc.set_threshold(1, 10, 10)\n", "gc.set_threshold"),
    "a warnings callback": ("import warnings\nwarnings.showwarning = print\n", "warnings.showwarning"),
    "numpy's error callback": ("import numpy as np\nnp.seterrcall(print)\n", "numpy.seterrcall"),
    "an object collective (it unpickles)": ("import torch.distributed as dist\ndist.recv_object_list(o, 0)\n",
                                           "torch.distributed.recv_object_list"),
}


# Rule 0: only the modules on scan_rules.IMPORTABLE, and of numpy, torch.utils and triton only the listed submodules.
# Each of these reached past the probes, or would have, from a module the deny-list did not name.
OUTSIDE_THE_LIST = {
    "doctest (ran hex-encoded source the scan never read)": ("import doctest\n", "doctest"),
    "asyncio (starts threads and processes)": ("import asyncio\n", "asyncio"),
    "sqlite3 (loads native extensions)": ("import sqlite3\n", "sqlite3"),
    "a from-import names the module's member": ("from asyncio import create_subprocess_exec\n",
                                                 "asyncio.create_subprocess_exec"),
    "types (SimpleNamespace(**d) sets attributes named at run time)": ("import types\ntypes.SimpleNamespace(**d)\n",
                                                                        "types"),
    "enum (its functional API names a class's attributes at run time)": ("import enum\n", "enum"),
    "logging (a record's extra sets attributes by name)": ("import logging\nlogging.makeLogRecord(d)\n", "logging"),
    "shutil": ("import shutil\n", "shutil"),
    "resource": ("import resource\n", "resource"),
    "queue": ("import queue\n", "queue"),
    "uuid": ("import uuid\n", "uuid"),
    "the file's own module by name": ("import online_softmax\n", "online_softmax"),
    "numpy.testing.runstring (exec)": ("import numpy as np\nnp.testing.runstring('x = 1', {})\n", "numpy.testing"),
    "numpy.lib.stride_tricks.as_strided (a view of any address)": (
        "from numpy.lib.stride_tricks import as_strided\n", "numpy.lib"),
    "numpy.ctypeslib (loads native libraries)": ("import numpy\nnumpy.ctypeslib.load_library\n", "numpy.ctypeslib"),
    "numpy.f2py, not loaded in the grader": ("import numpy.f2py\n", "numpy.f2py"),
    "torch.utils.data (worker processes)": ("import torch\ntorch.utils.data.DataLoader\n", "torch.utils.data"),
    "a standard module re-exported under an allowed one": ("import typing\ntyping.types.SimpleNamespace\n",
                                                           "typing.types"),
    "a module re-exported under numpy": ("import numpy as np\nnp.ctypeslib.ctypes\n", "numpy.ctypeslib"),
}


@pytest.mark.parametrize("case", [*FLAGGED, *OUTSIDE_THE_LIST], ids=[*FLAGGED, *OUTSIDE_THE_LIST])
def test_tampering_is_flagged(case):
    source, expected = FLAGGED.get(case) or OUTSIDE_THE_LIST[case]
    found = whats(source)
    assert any(what.startswith(expected) for what in found), (
        f"expected a finding for {expected!r} in {source!r}, found {found}"
    )


HONEST = {
    "softmax by hand": "import torch\ndef f(x):\n    m = x.amax(-1, keepdim=True)\n    return (x - m).exp()\n",
    "triton": "import triton\nimport triton.language as tl\n@triton.jit\ndef k(x_ptr, BLOCK: tl.constexpr):\n    pass\n",
    "re.compile and model.eval": "import re\nre.compile('a')\ndef f(model):\n    model.eval()\n",
    "torch.compile": "import torch\nf = torch.compile(lambda x: x + 1)\n",
    "an operator through torch.ops (the guard's business)": "import torch\ntorch.ops.aten._softmax.default\n",
    "getattr on self with a literal name": "class A:\n    def f(self):\n        return getattr(self, 'x', None)\n",
    "hasattr with a literal name": "def f(r):\n    return hasattr(r, 'slot')\n",
    "type(x).__name__ and super().__init__": ("class A(Exception):\n    def __init__(self, x):\n"
                                              "        super().__init__(type(x).__name__)\n"),
    "operator methods and __class__ read": ("class V:\n    def __add__(self, o):\n        return self.__class__()\n"
                                            "    def __len__(self):\n        return 0\n"),
    "if __name__ == '__main__'": "if __name__ == '__main__':\n    print(__file__)\n",
    "__all__ and __slots__": "__all__ = ['f']\nclass A:\n    __slots__ = ('x',)\n",
    "a NamedTuple with fields": "from typing import NamedTuple\nclass R(NamedTuple):\n    a: int\n    b: 'int' = 0\n",
    "a dict subclass without read hooks": "class D(dict):\n    def total(self):\n        return sum(self.values())\n",
    "attributes of the file's own objects": "def f(seq, ctx):\n    seq.last_hash = 1\n    ctx.causal = True\n",
    "an autograd Function": ("import torch\nclass F(torch.autograd.Function):\n    @staticmethod\n"
                             "    def forward(ctx, x):\n        return x\n"),
    "a match on a NamedTuple's fields": "def f(r):\n    match r:\n        case R(slot=s):\n            return s\n",
    "os.environ": ("import os\nflag = os.environ.get('TRITON_INTERPRET') == '1'\nn = os.environ['HOME']\n"
                   "on = 'CUDA_VISIBLE_DEVICES' in os.environ\nkeys = sorted(os.environ.keys())\nE = os.environ\n"
                   "home = E.get('HOME')\n"),
    "strings built from harmless pieces": "x = 'row ' + 'col'\ny = ', '.join(['a', 'b'])\nz = f\"{'a'}b\"[::-1]\n",
    "a docstring naming the machinery": '"""Do not call sys.settrace or read /proc/uptime."""\n',
    "import time without the clock rules": "import time\n",
    "copy and contextlib": "import copy, contextlib\ncopy.deepcopy([1])\n",
    "a class from a module in a tuple": "import torch\ndef f(x):\n    return isinstance(x, (torch.Tensor, list))\n",
    "a module aliased once": "import torch\nF = torch.nn.functional\nF.relu\n",
    "getattr on a module with a literal": "import torch\ndt = getattr(torch, 'float16')\n",
    "tensor attributes honest code sets": "def f(p, x):\n    p.grad = None\n    x.requires_grad = True\n    p.data = x\n",
    "ctx attributes named like torch's": "def forward(ctx, q):\n    ctx.shape = q.shape\n    ctx.dtype = q.dtype\n",
    "the file's own private attributes": ("class S:\n    def __init__(self):\n        self._free = []\n"
                                          "def n(s):\n    return len(s._free)\n"),
    "a NamedTuple's API": "def f(r):\n    return r._fields, r._asdict(), r._replace(a=1)\n",
    "torch.trace, torch.select and torch.signal": ("import torch\ntorch.trace(x)\ntorch.select(x, 0, 1)\n"
                                                  "torch.signal.windows.hann(4)\n"),
    "nn.Module.modules()": "def f(model):\n    return list(model.modules())\n",
    "getattr with a constant": "import torch\ngetattr(torch, 'float16')\n",
    "its own variable named compile": "def f(compile=False):\n    return compile\n",
    "str.format with plain fields": "def f(a, b):\n    return '{} {:.3f} {name}'.format(a, b, name=1)\n",
    "a course helper by name": "from grader.support.ring_allreduce import run_simulated\nrun_simulated(print, [])\n",
    "gc.collect": "import gc\ngc.collect()\n",
    "sys.exit and sys.stderr": "import sys\nprint('x', file=sys.stderr)\n",
    "messages that mention the grader": "msg = 'the grader checks this; see grader/AUTHORING.md'\n",
    "dataclasses and typing": "from dataclasses import dataclass, field\nfrom typing import NamedTuple\n",
    "math and itertools": "import math, itertools, collections, heapq, functools\n",
    "a plain functools.wraps": ("import functools\ndef deco(f):\n    @functools.wraps(f)\n    def g(*a):\n"
                                "        return f(*a)\n    return g\n"),
    "a library's own submodules named like standard modules": ("import torch\nimport numpy as np\n"
                                                               "x: torch.types.Number = 1\nnp.random.default_rng(0)\n"),
    "os.path": "import os\nos.path.join('a', 'b')\n",
}


@pytest.mark.parametrize("case", HONEST, ids=list(HONEST))
def test_honest_code_is_not_flagged(case):
    assert tamper.scan(HONEST[case]) == [], f"{case}: {tamper.describe(tamper.scan(HONEST[case]))}"
    if "time" not in case:
        findings = tamper.scan(HONEST[case], structural=True, clocks=True)
        assert findings == [], f"{case}, with every rule: {tamper.describe(findings)}"


def test_a_finding_reads_as_line_what_why():
    (finding,) = tamper.scan("import torch\n\n\nimport sys\nsys.settrace(None)\n")
    assert finding.line == 5
    assert str(finding) == "line 5: sys.settrace: your code changes the tracing the grader's probes use"


def test_an_own_private_name_that_a_library_shares_says_to_rename_it():
    """A method of the file's own named like a private attribute of the grader's probes (`_own`) cannot be told
    from a reach into them, and is flagged; the message says the name is the student's and how to rename it (a
    helper's reference scored zero with "your code uses a module's private internals" and nothing more)."""
    source = textwrap.dedent("""
        class Shards:
            def _own(self, full):
                return full[:1]

            def init(self, full):
                self.master = self._own(full)
    """)
    (finding,) = tamper.scan(source)
    assert "_own is a name your file defines" in str(finding) and "rename yours" in str(finding), str(finding)
    assert tamper.scan(source.replace("_own", "_own_piece")) == [], "a private name no library has is the file's own"


def test_bytes_are_read_as_python_reads_them():
    # In UTF-7, "+AHM-" is "s": a reader that assumes UTF-8 sees no sys.settrace here; Python does. A coding other
    # than the plain ones is refused before anything is decoded (punycode decodes in quadratic time).
    source = b"# -*- coding: utf-7 -*-\nimport sys\n+AHM-ys.settrace(None)\n"
    found = [f.what for f in tamper.scan(source)]
    assert found == ["coding: utf-7"], found
    latin = "# -*- coding: latin-1 -*-\nimport sys\nsys.settrace(None)  # \xe9\n".encode("latin-1")
    assert "sys.settrace" in [f.what for f in tamper.scan(latin)]


def test_a_file_that_does_not_parse_fails_closed():
    (finding,) = tamper.scan("def f(:\n    pass\n")
    assert finding.what == "SyntaxError" and "cannot parse" in finding.why


def test_a_guarded_load_of_a_tampering_file_fails_every_use(tmp_path):
    path = tmp_path / "mod.py"
    path.write_text("import sys\n\n\ndef f(x):\n    sys.settrace(None)\n    return x\n")
    session = StudentSession("local", lambda _id: path)
    guarded = session.load("mod", forbid=["torch.softmax"])
    assert isinstance(guarded, TamperedModule)
    with pytest.raises(tamper.Tampered) as caught:
        guarded.f(1)
    message = str(caught.value)
    assert message.startswith("line 5: sys.settrace: your code changes the tracing the grader's probes use; "
                              "the forbidden-call and structural checks cannot be trusted, so they fail"), message
    assert isinstance(caught.value, AssertionError), "a verdict on the file: the test fails, the grader did not err"
    assert session.load("mod").f(1) == 1, "without forbid the module loads as usual (nothing to guard)"


def test_a_guarded_load_of_an_honest_file_is_the_module(tmp_path):
    path = tmp_path / "mod.py"
    path.write_text("def f(x):\n    return x + 1\n")
    session = StudentSession("local", lambda _id: path)
    assert session.load("mod", forbid=["torch.softmax"]).f(1) == 2


# --------------------------------------------------------------------------------------------------
# Rule 5 (patching in place) for the structural gate, rule 8 (sockets, clocks, waits) for the clock


STRUCTURAL = {
    "posix.write (os.write by its own name)": ("import posix\nposix.write(1, b'x')\n", "posix.write"),
    "a watched read-back stored on self": ("def f(self, g):\n    self.tolist = g\n", "self.tolist = ..."),
    "a watched read-back set on self": ("class A:\n    def f(self, g):\n        setattr(self, 'numpy', g)\n",
                                        "setattr(..., 'numpy')"),
    "setattr of a literal name on a module": ("import math\nsetattr(math, 'pi', 3)\n", "setattr(math, 'pi')"),
    "a module function replaced": ("import time\ntime.perf_counter = lambda: 0.0\n", "time.perf_counter = ..."),
    "a torch method replaced": ("import torch\ntorch.Tensor.sum = None\n", "torch.Tensor.sum = ..."),
    "a class bound to a name, then patched": ("import torch\nT = torch.Tensor\nT.sum = None\n",
                                               "torch.Tensor.sum = ..."),
    "type(x) patched": ("def f(x):\n    type(x).sum = None\n", "type(...).sum = ..."),
    "a name bound to type(x), patched": ("def f(x):\n    T = type(x)\n    T.sum = None\n", "T (= a library object or type(...)).sum = ..."),
    "del of a module attribute": ("import math\ndel math.pi\n", "math.pi = ..."),
    "a special attribute set on another object": ("def f(C):\n    C.__enter__ = None\n", "...__enter__ = ..."),
    "a torch method's name set on an unresolved object": ("def f(T):\n    T.clone = None\n", "...clone = ..."),
    "a name bound twice, once to a library class": ("import torch\nT = None\nT = torch.Tensor\nT.sum = None\n",
                                                     "T (= a library object or type(...)).sum = ..."),
    "setattr on another object": ("def f(x):\n    setattr(x, 'y', 1)\n", "setattr(..., 'y')"),
    "setattr of a special name on self": ("class A:\n    def f(self):\n        setattr(self, '__call__', 1)\n",
                                          "setattr(..., '__call__')"),
    "open": ("open('f')\n", "open"),
    "pathlib": ("from pathlib import Path\n", "pathlib"),
    "os.write": ("import os\nos.write(fd, b'')\n", "os.write"),
}
CLOCKED = {
    "socket": ("import socket\n", "socket"),
    "time.sleep": ("import time\ntime.sleep(0.01)\n", "time"),
    "from time import perf_counter": ("from time import perf_counter\n", "time"),
    "a busy wait on monotonic through a name": ("def f(clock):\n    return clock.monotonic()\n", "...monotonic"),
    "datetime.now": ("import datetime\ndatetime.datetime.now()\n", "datetime"),
    "os.times": ("import os\nos.times()\n", "os.times"),
    "select with a timeout": ("import select\nselect.select([], [], [], 0.01)\n", "select"),
    "a file's mtime": ("def f(st):\n    return st.st_mtime_ns\n", "...st_mtime_ns"),
    "os.stat": ("import os\nos.stat('.')\n", "os.stat"),
    "/proc/uptime": ("x = '/proc/' + 'uptime'\n", "'/proc/uptime'"),
    "a CUDA event's elapsed_time": ("def f(a, b):\n    return a.elapsed_time(b)\n", "...elapsed_time"),
    "torch.profiler": ("import torch\ntorch.profiler.profile()\n", "torch.profiler"),
    "triton.testing": ("import triton.testing\n", "triton.testing"),
}


@pytest.mark.parametrize("case", STRUCTURAL, ids=list(STRUCTURAL))
def test_patching_is_flagged_with_the_structural_rules_only(case):
    source, expected = STRUCTURAL[case]
    found = [f.what for f in tamper.scan(source, structural=True)]
    assert any(what.startswith(expected) for what in found), f"expected {expected!r} in {source!r}, found {found}"
    assert not any(what.startswith(expected) for what in whats(source)), (
        f"{case}: no tampering with the forbidden-call guard, found {whats(source)} without the structural rules"
    )


@pytest.mark.parametrize("case", CLOCKED, ids=list(CLOCKED))
def test_sockets_clocks_and_waits_are_flagged_with_the_clock_rules_only(case):
    source, expected = CLOCKED[case]
    found = [f.what for f in tamper.scan(source, structural=True, clocks=True)]
    assert any(what.startswith(expected) for what in found), f"expected {expected!r} in {source!r}, found {found}"
    without = [f.what for f in tamper.scan(source, structural=True)]
    assert not any(what.startswith(expected) for what in without), (
        f"{case}: a clock read fails the timed checks only, found {without} with the structural rules alone"
    )


@pytest.mark.parametrize("path", HONEST_FILES, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_solutions_and_stubs_scan_clean_with_every_rule(path):
    findings = tamper.scan_file(path, structural=True, clocks=True)
    assert findings == [], f"honest code must never trip the structural gate or the clock: {tamper.describe(findings)}"


class FilesOnly:
    """A session as grader.structure.assert_no_clocks sees it: the student's files it loaded."""

    mode = "local"

    def __init__(self, *files):
        self.files = list(files)

    def student_files(self):
        return self.files


def test_the_gates_use_their_rules(tmp_path):
    from grader import structure

    timed = tmp_path / "timed.py"
    timed.write_text("import time\n\n\ndef f(x):\n    time.sleep(0.01)\n    return x\n")
    patched = tmp_path / "patched.py"
    patched.write_text("import torch\n\ntorch.Tensor.sum = None\n")
    assert tamper.scan_file(timed) == [] and tamper.scan_file(patched) == [], "the guard's scan leaves both alone"
    tamper.assert_untampered(timed, "the count of big writes")  # a figure no clock measures: time is fine
    with pytest.raises(tamper.Tampered, match="line 3: torch.Tensor.sum = ...: your code changes"):
        tamper.assert_untampered(patched, "the count of lines")
    with pytest.raises(tamper.Tampered, match="the grader's own clock times your calls.*line 1: time: your code reads a "
                                              "clock or waits"):
        structure.assert_no_clocks(FilesOnly(timed))
    structure.assert_no_clocks(FilesOnly())


# --------------------------------------------------------------------------------------------------
# The hostile files: each evaded the scan before its rules were tightened


HOSTILE_TAMPER = sorted((ROOT / "tests" / "hostile" / "tamper").glob("*.py"))


@pytest.mark.parametrize("path", HOSTILE_TAMPER, ids=lambda p: p.stem)
def test_hostile_files_are_flagged(path):
    source = path.read_text()
    expected = re.search(r"^# expect: (.+)$", source, re.M)
    assert expected, f"{path.name} must say which finding it expects (a '# expect: ...' line)"
    structural, clocks = "\n# structural\n" in source, "\n# clocks\n" in source
    found = [f.what for f in tamper.scan(source, structural=structural, clocks=clocks)]
    rules = " (structural rules)" * structural + " (clock rules)" * clocks
    assert any(what.startswith(expected.group(1)) for what in found), (
        f"{path.name}: expected a finding for {expected.group(1)!r}{rules}, found {found}"
    )


def test_there_are_hostile_files():
    assert len(HOSTILE_TAMPER) >= 20, f"expected the hostile files in tests/hostile/tamper, found {len(HOSTILE_TAMPER)}"


# --------------------------------------------------------------------------------------------------
# Folding strings never builds a huge one


def test_folding_is_bounded():
    found = tamper.scan("x = 'a' * 10**12\ny = ('ab' * 100000)[::-1]\nz = 'settrace' * 1\n")
    assert [f.what for f in found] == ["'settrace'"], found


def test_a_long_chain_of_concatenations_scans_quickly():
    import time

    source = "x = " + " + ".join(f"v{i}" for i in range(3000)) + "\n"
    start = time.perf_counter()
    tamper.scan(source)
    assert time.perf_counter() - start < 5.0, "a 3000-term concatenation took more than 5 s to scan"


def test_a_file_too_large_to_parse_safely_fails_closed():
    """Parsing costs the grader ~500 bytes per source byte: a 16 MiB list literal took 8 GB. Over the cap
    the file is not parsed at all, and every guarded use fails."""
    source = "x = [" + "0," * (scan_rules.MAX_SOURCE_BYTES // 2) + "]\n"
    findings = tamper.scan(source)
    assert len(findings) == 1 and "over the 1 MiB" in findings[0].why, findings
    assert tamper.scan(source.encode())[0].what.endswith("bytes")


def test_an_exotic_coding_is_refused_before_it_is_decoded(tmp_path):
    """`# coding: punycode` made the grader decode 256 KiB in quadratic time (5.7 s in the grade's own process,
    ~70 s per scan at 1 MiB) before refusing it; the scan and the runner's syntax pre-check now read the cookie first."""
    import time

    from grader.runner import syntax_error

    source = b"# coding: punycode\n" + b"abc-" * (60 << 10)  # what the cookie says decides, not what follows
    start = time.monotonic()
    assert [f.what for f in tamper.scan(source)] == ["coding: punycode"]
    path = tmp_path / "online_softmax.py"
    path.write_bytes(source)
    assert syntax_error(path) is None, "an exotic coding is left to the worker, which pays for decoding it"
    assert time.monotonic() - start < 1.0


# Rule 10 (grader/harness/kernels.py): a @triton.jit function holds Triton and nothing else. Under the CPU
# interpreter a kernel's body is host Python that the probes trust as kernel code; each case is a way a body, a
# default or a decorator ran the student's Python there (red team rounds 7-9), or a neighbour of one.
KERNEL_PRELUDE = "import numpy as np\nimport triton\nimport triton.language as tl\n"
KERNEL_BODIES = {
    "numpy on a tile": ("@triton.jit\ndef k(x_ptr):\n    x = tl.load(x_ptr)\n    y = np.exp(x)\n", "k: numpy.exp"),
    "a tensor's raw handle": ("@triton.jit\ndef k(x_ptr):\n    d = tl.load(x_ptr).handle\n", "k: .handle"),
    "a Python function of the file": ("def helper(a):\n    return a\n@triton.jit\ndef k(x):\n    helper(x)\n",
                                      "k: helper(...)"),
    "a default that runs code": ("@triton.jit\ndef k(x, B=np.exp(1)):\n    pass\n", "k: np.exp(1)"),
    "an annotation that is not Triton's": ("@triton.jit\ndef k(x: np.ndarray):\n    pass\n", "k: np.ndarray"),
    "a lambda": ("@triton.jit\ndef k(x):\n    f = lambda a: a\n", "k: lambda"),
    "a nested def": ("@triton.jit\ndef k(x):\n    def g():\n        pass\n", "k: functiondef"),
    "a store into an attribute": ("@triton.jit\ndef k(x):\n    x.handle = 1\n", "k: x.handle"),
    "a with block": ("@triton.jit\ndef k(x):\n    with x:\n        pass\n", "k: with"),
    "an f-string": ("@triton.jit\ndef k(x):\n    s = f'{x}'\n", "k: joinedstr"),
    "calling a parameter": ("@triton.jit\ndef k(f, x):\n    f(x)\n", "k: f(...)"),
    "inline assembly": ("@triton.jit\ndef k(x):\n    tl.inline_asm_elementwise('', '', [x], tl.int32, True, 1)\n",
                        "k: triton.language.inline_asm_elementwise"),
    "tl.core": ("@triton.jit\ndef k(x):\n    tl.core.tensor(x, tl.int32)\n", "k: triton.language.core.tensor"),
    "importlib through tl.extra": ("@triton.jit\ndef k(x):\n    tl.extra.module_from_spec(x)\n",
                                   "k: triton.language.extra.module_from_spec"),
    "a module value that is not a constant": ("T = np.arange(4)\n@triton.jit\ndef k(x):\n    y = x + T\n", "k: T"),
    "a constant rebound through global": ("B = 4\ndef f():\n    global B\n    B = np\n@triton.jit\ndef k(x):\n"
                                          "    y = x + B\n", "k: B"),
    "a builtin the file redefines": ("def range(*a):\n    return a\n@triton.jit\ndef k(x):\n    for i in range(4):\n"
                                     "        pass\n", "k: range(...)"),
    "a kernel made at run time": ("def f(x):\n    pass\nk = triton.jit(f)\n", "triton.jit"),
    "a kernel defined in a function": ("def make():\n    @triton.jit\n    def k(x):\n        pass\n    return k\n",
                                       "def k"),
    "a decorator of the student's on a kernel": ("def deco(f):\n    return f\n@deco\n@triton.jit\ndef k(x):\n"
                                                 "    pass\n", "@deco"),
    "a kernel's launch machinery": ("@triton.jit\ndef k(x):\n    pass\nk.add_pre_run_hook(print)\n", "k"),
    "a kernel handed around": ("@triton.jit\ndef k(x):\n    pass\nrun = [k]\n", "k"),
    # round 10: a grid function (host code the interpreter runs inside the launch) loaded each row, ran numpy on
    # the tile's raw array and stored it: full marks with a kernel that did nothing
    "tl.load in a grid function": ("def grid(a):\n    v = tl.load(a['x'])\n    return (1,)\n", "triton.language.load"),
    "a tile's raw array": ("def f(v):\n    return v.handle.data\n", "...handle"),
    "a language function taken as a value": ("from triton.language import store\nS = [store]\n",
                                             "triton.language.store"),
}


@pytest.mark.parametrize("case", KERNEL_BODIES, ids=list(KERNEL_BODIES))
def test_a_kernel_holds_only_triton(case):
    source, expected = KERNEL_BODIES[case]
    found = whats(KERNEL_PRELUDE + source)
    assert any(what.startswith(expected) for what in found), (
        f"{case}: expected a finding for {expected!r}, found {found}. A kernel's body runs as host Python under "
        "the CPU interpreter, so anything but Triton there is code the probes would trust as kernel code."
    )


HONEST_KERNELS = {
    "autotune and heuristics over jit": (
        "@triton.autotune(configs=[triton.Config({'B': 16}, num_warps=4)], key=['n'])\n"
        "@triton.heuristics({'EVEN': lambda args: args['n'] % 16 == 0})\n@triton.jit\n"
        "def k(x_ptr, n, B: tl.constexpr, EVEN: tl.constexpr):\n    offs = tl.arange(0, B)\n"
        "    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)\n    tl.store(x_ptr + offs, x * 2, mask=offs < n)\n"
        "def launch(x, n):\n    k[(1,)](x, n)\n"),
    "libdevice, tl.math and a combine kernel": (
        "@triton.jit\ndef add(a, b):\n    return a + b\n@triton.jit\n"
        "def k(x_ptr, B: tl.constexpr):\n    x = tl.load(x_ptr + tl.arange(0, B)).to(tl.float32)\n"
        "    y = tl.extra.cuda.libdevice.erf(x) + tl.math.exp2(x)\n    s = tl.reduce(y, 0, add)\n"
        "    tl.store(x_ptr, s.to(x_ptr.dtype.element_ty))\n"),
    "tl's types and constexpr on the host": (
        "DTYPES = {'fp16': tl.float16, 'bf16': tl.bfloat16}\nBLOCK = tl.constexpr(64)\n"
        "def grid(meta):\n    return (triton.cdiv(meta['n'], meta['BLOCK']),)\n"
        "def pick(x) -> tl.dtype:\n    return DTYPES['fp16']\n"),
    "module constants, loops and a from-import": (
        "from triton.language import load\nLOG2E = 1.4426950408889634\nBLOCK = tl.constexpr(64)\n@triton.jit\n"
        "def k(x_ptr, n, DEBUG: tl.constexpr = False):\n    \"\"\"A docstring.\"\"\"\n    acc = 0.0\n"
        "    for i in tl.range(0, n, BLOCK):\n        acc += tl.sum(load(x_ptr + i + tl.arange(0, BLOCK)) * LOG2E)\n"
        "    if DEBUG:\n        tl.device_print('acc', acc)\n    i = 0\n    while i < 2:\n        i += 1\n"
        "    tl.static_assert(BLOCK >= 16)\n    lo, hi = min(0, n), max(1, n)\n    x = tl.zeros([BLOCK], tl.float32)[:, None]\n"
        "    return acc\n"),
}


@pytest.mark.parametrize("case", HONEST_KERNELS, ids=list(HONEST_KERNELS))
def test_honest_kernels_are_not_flagged(case):
    findings = tamper.scan(KERNEL_PRELUDE + HONEST_KERNELS[case], structural=True, clocks=True)
    assert findings == [], f"{case}: {tamper.describe(findings)}"
