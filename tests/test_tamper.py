"""The trusted static scan (grader/harness/tamper.py): it flags what can dismantle the probes, and
honest code never trips it."""

from __future__ import annotations

import textwrap

import pytest

from grader.harness import tamper
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
    "settrace through a variable": ("import sys\ns = sys\ns.settrace(None)\n", "...settrace"),
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
    "setattr on a module": ("import torch\nsetattr(torch, n, 1)\n", "setattr with a computed name"),
    "__builtins__": ("__builtins__['exec']\n", "__builtins__"),
    "a module's __dict__": ("import torch\ntorch.__dict__['softmax']\n", "torch.__dict__"),
    "vars of a module": ("import torch\nvars(torch)\n", "vars(...)"),
    "unpickling": ("import pickle\npickle.loads(b'')\n", "pickle"),
    "torch.load without weights_only": ("import torch\ntorch.load('f', weights_only=False)\n", "weights_only=..."),
    "a string naming torch._C": ("import operator, torch\noperator.attrgetter('_C')(torch)\n", "operator.attrgetter"),
    "a string naming the harness": ("x = 'grader.harness.probes'\n", "'grader.harness.probes'"),
    "a module's __getattr__": ("import torch\ntorch.__getattr__(name)\n", "torch.__getattr__"),
}


@pytest.mark.parametrize("case", FLAGGED, ids=list(FLAGGED))
def test_tampering_is_flagged(case):
    source, expected = FLAGGED[case]
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
    "getattr on self": "class A:\n    def f(self, name):\n        return getattr(self, name)\n",
    "getattr with a constant": "import torch\ngetattr(torch, 'float16')\n",
    "its own variable named compile": "def f(compile=False):\n    return compile\n",
    "torch.load safely": "import torch\ntorch.load('f')\ntorch.load('f', weights_only=True)\n",
    "a course helper by name": "from grader.support.ring_allreduce import run_simulated\nrun_simulated(print, [])\n",
    "gc.collect": "import gc\ngc.collect()\n",
    "sys.exit and sys.stderr": "import sys\nprint('x', file=sys.stderr)\n",
    "messages that mention the grader": "msg = 'the grader checks this; see grader/AUTHORING.md'\n",
    "dataclasses and typing": "from dataclasses import dataclass, field\nfrom typing import NamedTuple\n",
    "math and itertools": "import math, itertools, collections, heapq, functools\n",
    "self.__dict__": "class A:\n    def f(self):\n        return self.__dict__\n",
    "a class with __getattr__": "class A:\n    def __getattr__(self, name):\n        return 1\n",
}


@pytest.mark.parametrize("case", HONEST, ids=list(HONEST))
def test_honest_code_is_not_flagged(case):
    assert tamper.scan(HONEST[case]) == [], f"{case}: {tamper.describe(tamper.scan(HONEST[case]))}"


def test_a_finding_reads_as_line_what_why():
    (finding,) = tamper.scan("import torch\n\n\nimport sys\nsys.settrace(None)\n")
    assert finding.line == 5
    assert str(finding) == "line 5: sys.settrace: your code changes the tracing the grader's probes use"


def test_bytes_are_read_as_python_reads_them():
    # In UTF-7, "+AHM-" is "s": a reader that assumes UTF-8 sees no sys.settrace here; Python does.
    source = b"# -*- coding: utf-7 -*-\nimport sys\n+AHM-ys.settrace(None)\n"
    found = [f.what for f in tamper.scan(source)]
    assert "coding: utf-7" in found and "sys.settrace" in found, found


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
