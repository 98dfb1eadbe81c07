"""An error is never an answer (issue "Right verdicts II", item 5).

A test that expects an exception passes only when the graded call itself raised it, with the contract's
type, after the module loaded, and from code that also answers the calls that must succeed:

* a file that raises while it is imported scores zero on every check (whatever it raised: an import-time
  ``raise ValueError`` once earned every test that expects a ValueError), and so does a file that is not
  Python source (binary, an undecodable encoding);
* a function that raises on every input earns none of the tests that expect its error.
"""

from __future__ import annotations

import builtins
from pathlib import Path

import pytest

from grader.harness.client import CallOptions, Sandbox, StudentLoadError
from grader.harness.ledger import CallLedger
from grader.harness.session import StudentSession
from grader.runner import syntax_error
from tests.conftest import ROOT, checks_of, grade_folder

EXERCISE = "online_softmax"
FILE = "online_softmax.py"
# Every builtin exception a file can raise while it is imported (the warnings too: `raise UserWarning`).
BUILTIN_EXCEPTIONS = sorted(
    name for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException) and not name.startswith("_")
    and name not in ("BaseExceptionGroup", "ExceptionGroup")  # need a list of exceptions to be made
)


def raising(name: str) -> str:
    exc = getattr(builtins, name)
    if issubclass(exc, UnicodeError) and exc is not UnicodeError:
        # these need their codec's five arguments
        args = {"UnicodeDecodeError": "'utf-8', b'x', 0, 1, 'bad'", "UnicodeEncodeError": "'utf-8', 'x', 0, 1, 'bad'",
                "UnicodeTranslateError": "'x', 0, 1, 'bad'"}[name]
        return f"raise {name}({args})\n"
    return f"raise {name}('raised at import')\n"


def hand_in(tmp_path: Path, source: str | bytes, name: str = "sub") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / FILE).write_bytes(source if isinstance(source, bytes) else source.encode())
    return folder


def all_zero(result: dict, why: str) -> None:
    ex = next(e for e in result["exercises"] if e["id"] == EXERCISE)
    earned = {cid: c["points"] for cid, c in checks_of(result, EXERCISE).items() if c["points"]}
    assert not earned, f"{why}: a file that never loaded earned points on {earned}"
    assert ex["score"] == 0
    return ex


@pytest.mark.parametrize("name", BUILTIN_EXCEPTIONS)
def test_an_import_that_raises_any_builtin_exception_is_a_load_failure_in_process(tmp_path, name):
    # In-process (make check): the fixture's load raises StudentLoadError, a subclass of no builtin, so no
    # `pytest.raises(<that builtin>)` around a call can take it for the call's answer.
    path = hand_in(tmp_path, raising(name)) / FILE
    session = StudentSession("local", lambda _id: path)
    with pytest.raises(StudentLoadError) as info:
        session.load(EXERCISE)
    exc = getattr(builtins, name)
    if exc not in (BaseException, Exception):  # these two match everything: no test expects them
        assert not isinstance(info.value, exc), f"a load failure must not pass for a {name}"
    assert exc.__name__ in str(info.value) and "did not load" in str(info.value)  # IOError's name is OSError
    assert "line 1" in info.value.student_traceback, info.value.student_traceback


@pytest.mark.parametrize("name", ["ValueError", "KeyError", "RuntimeError", "SystemExit", "KeyboardInterrupt",
                                  "NotImplementedError", "AssertionError", "ImportError"])
def test_an_import_that_raises_is_a_load_failure_in_the_sandbox(tmp_path, name):
    path = hand_in(tmp_path, raising(name)) / FILE
    session = StudentSession("sandbox", lambda _id: path, Sandbox(isolate=False, user=None))
    try:
        sm = session.load(EXERCISE)
        with pytest.raises(StudentLoadError) as info:
            sm.online_softmax
        assert not isinstance(info.value, getattr(builtins, name))
        assert "did not load" in str(info.value) and name in str(info.value)
    finally:
        session.close()


def test_a_file_that_raises_the_contracts_error_at_import_scores_zero_everywhere(tmp_path):
    result = grade_folder(hand_in(tmp_path, 'raise ValueError("nope")\n'), [EXERCISE])
    ex = all_zero(result, "raise ValueError at import")
    assert ex["status"] == "ungradable", ex["status"]
    assert "did not load" in ex["message"] and "ValueError: nope" in ex["message"], ex["message"]
    tests = [t for c in ex["checks"] for t in c["tests"] if t["status"] != "not_graded"]
    assert tests and all("did not load" in t["message"] for t in tests), [t["message"] for t in tests][:3]


@pytest.mark.parametrize("kind,source", [
    ("binary", bytes(range(256)) * 12),
    ("utf-16", "def online_softmax(x, block_size=1024):\n    raise ValueError\n".encode("utf-16")),
    ("an unknown coding line", b"# -*- coding: klingon -*-\ndef online_softmax(x):\n    raise ValueError\n"),
    ("latin-1 without a coding line", b'"""caf\xe9"""\ndef online_softmax(x):\n    raise ValueError\n'),
    ("null bytes", b"def online_softmax(x):\n    raise ValueError\n\x00\n"),
])
def test_a_file_that_is_not_python_source_scores_zero_with_the_reason(tmp_path, kind, source):
    folder = hand_in(tmp_path, source)
    reason = syntax_error(folder / FILE)
    assert reason and ("not Python source" in reason or "does not compile" in reason), f"{kind}: {reason}"
    result = grade_folder(folder, [EXERCISE], checks=["softmax", "normalizer"])
    ex = all_zero(result, kind)
    assert ex["status"] == "ungradable" and ex["message"] == reason, (ex["status"], ex["message"])
    if not result["device"].get("gpu"):  # the CUDA checks read as a run would report them here: not graded
        speed = checks_of(result, EXERCISE)["triton_speed"]
        assert speed["status"] == "not_graded", speed
        assert result["gradable_max_score"] == 90, result["gradable_max_score"]


def test_a_large_binary_file_is_refused_before_it_is_parsed(tmp_path):
    # Too large to parse in the grader (parsing costs ~500 bytes a byte), but decoding is linear: refused whole.
    folder = hand_in(tmp_path, b"x = 1\n" + bytes(range(256)) * 1100)
    reason = syntax_error(folder / FILE)
    assert reason is not None and "is not Python source" in reason and "byte 134" in reason, reason
    ex = all_zero(grade_folder(folder, [EXERCISE], checks=["softmax"]), "a large binary file")
    assert ex["status"] == "ungradable" and ex["message"] == reason, ex["message"]


def test_a_large_file_that_fails_at_import_scores_zero(tmp_path):
    # Valid text past the parse limit goes to the worker: there it raises, a load failure.
    body = "".join(f"CONSTANT_{i} = {i}\n" for i in range(20000)) + "raise KeyError('late')\n"
    folder = hand_in(tmp_path, body)
    assert len(body) > 256 << 10 and syntax_error(folder / FILE) is None
    ex = all_zero(grade_folder(folder, [EXERCISE], checks=["softmax"]), "a large file that raises")
    assert ex["status"] == "ungradable" and "did not load" in ex["message"] and "KeyError" in ex["message"]


ALWAYS_RAISES = '''
def online_normalizer(chunks):
    raise ValueError("no")

def merge_states(m_a, l_a, m_b, l_b):
    raise ValueError("no")

def online_softmax(x, block_size=1024):
    raise ValueError("no")

def softmax_triton(x):
    raise ValueError("no")
'''


def test_a_function_that_raises_on_every_input_earns_no_error_test(tmp_path):
    result = grade_folder(hand_in(tmp_path, ALWAYS_RAISES), [EXERCISE])
    checks = checks_of(result, EXERCISE)
    error_tests = [t for cid in ("normalizer_public", "normalizer", "softmax") for t in checks[cid]["tests"]
                   if "rejects" in t["name"] or "needs_a_chunk" in t["name"]]
    assert len(error_tests) == 3, [t["name"] for t in error_tests]
    for test in error_tests:
        assert test["fraction"] == 0 and test["status"] == "failed", test
        assert "never returned a value" in test["message"], test["message"]
    assert sum(c["points"] for c in checks.values()) == 0


def test_a_run_of_some_checks_judges_no_error_by_the_ledger(tmp_path):
    # A run of the error checks alone may hold no call that answers: the rule needs the whole suite.
    result = grade_folder(ROOT / "solutions", [EXERCISE], checks=["normalizer_public", "softmax"])
    checks = checks_of(result, EXERCISE)
    for cid in ("normalizer_public", "softmax"):
        assert checks[cid]["points"] == checks[cid]["max_points"], checks[cid]["message"]


def test_the_ledger_vouches_for_an_error_only_from_code_that_answered():
    ledger = CallLedger()
    ledger.begin()
    ledger.record("f", raised=True)
    ledger.record("g", raised=True)
    ledger.record("g", raised=True)
    ledger.record("", raised=True)  # a round trip to no function of the student's: not recorded
    assert ledger.raised_in_test() == ["f", "g"]
    assert ledger.unanswered(ledger.raised_in_test()) == ["f", "g"]
    ledger.record("g", raised=False)  # g answers a later call: its errors count from now on
    assert ledger.unanswered(["f", "g"]) == ["f"]
    ledger.begin()
    assert ledger.raised_in_test() == []


def test_call_options_are_untouched_by_the_ledger():
    # The ledger is bookkeeping beside the proxies: it adds nothing to what a call sends.
    assert CallOptions().forbid == ()
