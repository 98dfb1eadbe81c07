"""A test's message formats what the student's code returned in bounded space: a scan of the test files.

The hidden tests run in the grader's own (trusted) process, and a value a student's call returns can
be anything up to the reply limit (`max_result_mb`, a gigabyte), of any shape. `tensor.tolist()` of
that, or `str()` of the list, builds tens of gigabytes of Python objects in the grader: an out-of-memory
grade, or a host brought down. `list(tensor)` is worse (one tensor object per element), and a student's
object that stays in the worker answers `.shape` with whatever it likes. So a message shows a student's
value through `grader.testing.show(value)`, which reads only the first few elements whatever the size.

The scan reads every exercises/*/test_*.py and grader/hidden/*/test_*.py (and the grader's modules that
build messages for them) and fails on any of these inside text that is being built:

- a call of `.tolist()`, except on an explicit slice with small constant bounds (`x[:4].tolist()`);
- a call of `.numpy()`;
- `list(...)`, `tuple(...)` or `sorted(...)` of anything but a literal, a comprehension, `range(...)`, a
  shape (`x.shape`, `x.shape[:3]`, `x.size()`) or a dict's items (`list(tensor)`,
  `list(getattr(obj, "shape", []))`: use `show(tensor)`, `show(getattr(obj, "shape", None))`), and a
  value unpacked into a literal (`[*tensor]`);
- a name assigned (in the same function, or at module level) from `.tolist()`, `.numpy()` or `list()`,
  formatted whole (`f"{got}"`, `str(got)`); an element of it (`got[b]`) is one row, and allowed.

Text that is being built: an assert's message, the argument of a `raise` or of `pytest.fail` / `skip` /
`xfail`, a `what=`, `hint=`, `msg=` or `message=` keyword argument, every f-string, and the arguments of
`str()`, `repr()`, `format()`, `str.format`, `str.join` and `%` formatting. `show(...)` itself is allowed
(its argument is still scanned: `show(x.tolist())` builds the list first).

Not caught: a comprehension or map() that iterates over a value inside a message (`", ".join(str(v) for
v in tensor)`), and `[:4]` of a value with more than one dimension. Logic that converts a student's value
(`.tolist()`, `tuple(x.shape)`, `list(x)`, outside a message) is not this scan's either: it must come
after a check of the value's type and shape, which the tests do by hand (see the hidden tests'
`assert_fields`, `assert_outputs`, `as_ops`). `tuple(x.shape)` of a student's object that is not a tensor
is one: its `.shape` is whatever the object answers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MESSAGE_MODULES = ["grader/blocks.py", "grader/speed.py"]  # the grader's code that words the tests' messages
SCANNED = sorted([*ROOT.glob("exercises/*/test_*.py"), *ROOT.glob("grader/hidden/*/test_*.py"),
                  *ROOT.glob("grader/hidden/*/oracle.py"), *(ROOT / m for m in MESSAGE_MODULES)])
SMALL_SLICE = 64  # x[:n].tolist() with a constant n up to this is allowed
TEXT_KEYWORDS = {"what", "hint", "msg", "message"}
TEXT_BUILDERS = {"str", "repr", "format"}
FAIL_CALLS = {("pytest", "fail"), ("pytest", "skip"), ("pytest", "xfail")}
COPIES = {"list", "tuple", "sorted"}
UNBOUNDED_SOURCES = {"tolist", "numpy"}


# --------------------------------------------------------------------------------------------------
# The scan


def _constant_int(node: ast.AST | None) -> int | None:
    if node is None:
        return 0
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _constant_int(node.operand)
        return None if inner is None else -inner
    return None


def _small_range(part: ast.AST) -> bool:
    if not (isinstance(part, ast.Slice) and part.step is None and part.upper is not None):
        return False
    lower, upper = _constant_int(part.lower), _constant_int(part.upper)
    return lower is not None and upper is not None and 0 <= lower <= upper and upper - lower <= SMALL_SLICE


def _small_slice(node: ast.AST) -> bool:
    """`x[:4]`, `x[2:10]`, `lse[0, 0, :3]`: an explicit slice with constant, non-negative bounds at most
    SMALL_SLICE apart (other indices constant ints). Bounded on the dimensions it names only: `x[:4]` of a
    [4, 10**8] tensor is not small, so a student's value goes through show() all the same."""
    if not isinstance(node, ast.Subscript):
        return False
    parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    return any(_small_range(p) for p in parts) and all(_small_range(p) or _constant_int(p) is not None for p in parts)


def _is_shape(node: ast.AST) -> bool:
    """`x.shape`, `x.shape[:3]`, `x.size()`: a tensor's shape, a handful of ints once `x` is known to be a
    tensor (a student's object answers `.shape` with anything: `getattr(obj, "shape", ...)` is not one)."""
    if isinstance(node, ast.Subscript):
        node = node.value
    return (isinstance(node, ast.Attribute) and node.attr == "shape") or _method(node) == "size"


def _bounded_copy_argument(node: ast.AST) -> bool:
    """What `list(...)` may copy in a message: a literal, a comprehension, range(...), a tensor's shape, or
    a dict's items, keys or values (the grader's own bookkeeping; a tensor has none)."""
    if isinstance(node, (ast.Constant, ast.List, ast.Tuple, ast.Set, ast.Dict,
                         ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        return not any(isinstance(elt, ast.Starred) for elt in getattr(node, "elts", []))
    return (_builtin(node) == "range" or _is_shape(node) or _method(node) in ("items", "keys", "values"))


def _method(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr
    return None


def _builtin(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id
    return None


def _unbounded_value(node: ast.AST, copies: set[str] = COPIES) -> bool:
    """Whether `node` itself builds a copy of unbounded size: .tolist() (not of a small slice), .numpy(),
    list() / tuple() / sorted() of something not known to be small."""
    method = _method(node)
    if method == "tolist":
        return not _small_slice(node.func.value)
    if method == "numpy":
        return True
    return _builtin(node) in copies and bool(node.args) and not _bounded_copy_argument(node.args[0])


def _problems_in_text(text: ast.AST, tainted: set[str]) -> list[tuple[int, str]]:
    """(line, why) for every unbounded conversion inside an expression that becomes text."""
    found = []
    for node in ast.walk(text):
        method, builtin = _method(node), _builtin(node)
        if method == "tolist" and _unbounded_value(node):
            found.append((node.lineno, f"{ast.unparse(node)}: tolist() of a whole value"))
        elif method == "numpy":
            found.append((node.lineno, f"{ast.unparse(node)}: numpy() of a whole value"))
        elif builtin in COPIES and _unbounded_value(node):
            found.append((node.lineno, f"{ast.unparse(node)}: {builtin}() of a whole value"))
    for node in _formatted_whole(text):
        if isinstance(node, ast.Name) and node.id in tainted:
            found.append((node.lineno, f"{node.id}: a list made by tolist()/numpy()/list(), formatted whole"))
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set)) and any(isinstance(e, ast.Starred) for e in node.elts):
            found.append((node.lineno, f"{ast.unparse(node)}: a whole value unpacked into a literal"))
    return found


def _formatted_whole(text: ast.AST) -> list[ast.AST]:
    """The expressions `text` turns into text as they are: an f-string's {value} (with or without a format
    spec), the arguments of str(), repr(), str.format and str.join, the operands of `%`, and `text` itself;
    not value[i] nor value.attr, nor the arguments of other calls."""
    found = [text]
    for node in ast.walk(text):
        if isinstance(node, ast.FormattedValue):
            found.append(node.value)
        elif isinstance(node, ast.Call) and (_builtin(node) in TEXT_BUILDERS or _method(node) in ("format", "join")):
            found.extend(node.args)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant):
            found.extend(node.right.elts if isinstance(node.right, ast.Tuple) else [node.right])
    return found


def _text_roots(scope: ast.AST) -> list[ast.AST]:
    """The expressions of `scope` (not of nested functions) that become text."""
    roots: list[ast.AST] = []
    for node in _own_nodes(scope):
        if isinstance(node, ast.Assert) and node.msg is not None:
            roots.append(node.msg)
        elif isinstance(node, ast.Raise) and node.exc is not None:
            roots.extend(node.exc.args if isinstance(node.exc, ast.Call) else [node.exc])
        elif isinstance(node, ast.JoinedStr):
            roots.append(node)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant) \
                and isinstance(node.left.value, str):
            roots.append(node.right)
        elif isinstance(node, ast.Call):
            func = node.func
            dotted = (func.value.id, func.attr) if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else None
            if dotted in FAIL_CALLS or _builtin(node) in TEXT_BUILDERS or _method(node) in ("format", "join"):
                roots.extend(node.args)
            roots.extend(kw.value for kw in node.keywords if kw.arg in TEXT_KEYWORDS)
    return roots


def _own_nodes(scope: ast.AST):
    """The nodes of `scope`, not descending into nested function definitions (lambdas are included)."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            stack.extend(ast.iter_child_nodes(node))


def _assigned(target: ast.AST) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for elt in target.elts for n in _assigned(elt)]
    if isinstance(target, ast.Starred):
        return _assigned(target.value)
    return []


def _tainted(scope: ast.AST, inherited: set[str]) -> set[str]:
    """Names `scope` binds to a whole copy (.tolist(), .numpy(), list() of something unbounded; not
    tuple(), which the tests use on ops and entries whose type and length they check); a later plain
    rebinding does not clear them (the scan does not follow control flow)."""
    tainted = set(inherited)
    for node in _own_nodes(scope):
        if isinstance(node, ast.Assign) and _whole_copy(node.value):
            tainted.update(n for t in node.targets for n in _assigned(t))
        elif isinstance(node, ast.AnnAssign) and node.value is not None and _whole_copy(node.value):
            tainted.update(_assigned(node.target))
    return tainted


def _whole_copy(value: ast.AST) -> bool:
    """An unbounded copy (.tolist(), .numpy(), list() of something unknown), or sorted() / list() /
    reversed() of one: `used = sorted(slot.tolist())` holds the whole value as much as the copy does."""
    if _unbounded_value(value, {"list"}):
        return True
    return _builtin(value) in ("sorted", "list", "reversed") and bool(value.args) and _whole_copy(value.args[0])


def unbounded_formatting(source: str) -> list[tuple[int, str]]:
    """(line, what) for every place the source builds text from an unbounded copy of a value."""
    tree = ast.parse(source)
    found: set[tuple[int, str]] = set()

    def visit(scope: ast.AST, inherited: set[str]) -> None:
        tainted = _tainted(scope, inherited)
        for root in _text_roots(scope):
            found.update(_problems_in_text(root, tainted))
        for node in _own_nodes(scope):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                params = {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
                visit(node, tainted - params)

    visit(tree, set())
    return sorted(found)


# --------------------------------------------------------------------------------------------------
# The files


@pytest.mark.parametrize("path", SCANNED, ids=[str(p.relative_to(ROOT)) for p in SCANNED])
def test_messages_format_student_values_in_bounded_space(path: Path):
    found = unbounded_formatting(path.read_text())
    assert not found, "\n".join(f"{path.relative_to(ROOT)}:{line}: {why}" for line, why in found) + (
        "\nA student's call may return up to max_result_mb of any shape; formatting all of it builds gigabytes "
        "in the grader's process. Format it with grader.testing.show(value) (the first elements and a count), "
        "or an explicit small slice x[:4].tolist()."
    )


def test_the_scan_covers_every_test_file():
    exercises = sorted(p.name for p in (ROOT / "exercises").iterdir() if (p / "test_public.py").exists())
    names = {str(p.relative_to(ROOT)) for p in SCANNED}
    missing = [e for e in exercises
               if f"exercises/{e}/test_public.py" not in names or f"grader/hidden/{e}/test_hidden.py" not in names]
    assert exercises and not missing, f"every exercise's public and hidden tests are scanned; missing: {missing}"
    assert all((ROOT / m).exists() for m in MESSAGE_MODULES), MESSAGE_MODULES


@pytest.mark.parametrize("snippet", [
    "assert got == want, f'found {got.tolist()}'",
    "assert ok, 'found ' + str(r.slot.tolist())",
    "raise AssertionError(f'row {b}: {tokens[b].tolist()}')",
    "raise AssertionError('found %s' % (x.tolist(),))",
    "pytest.fail(f'{list(tokens)}')",
    "pytest.fail('found {}'.format(x.numpy()))",
    "assert x, f'shape {list(getattr(buf, \"shape\", []))}'",
    "assert_close(a, b, atol=0, what='w', hint=f'sums {s.tolist()}')",
    "assert_close(a, b, atol=0, what='w', hint='sums ' + repr(s.tolist()))",
    "got = tokens.tolist()\nassert got == want, f'found {got}'",
    "got = tokens.tolist()\nassert got == want, 'found ' + str(got)",
    "def f(r):\n    used = sorted(r.slot.tolist())\n    assert used == [], f'{used}'",
    "text = f'{x[:n].tolist()}'",  # a bound that is not a constant
    "text = f'{x[:1000].tolist()}'",  # a constant, but not a small one
    "text = f'{x[-4:].tolist()}'",  # from the end: the slice's size is not known
    "text = f'{show(x.tolist())}'",  # show() of a list built first
    "text = ', '.join(str(v) for v in x.tolist())",
    "msg = f'{tuple(r.tokens_per_expert)}'",
    "def hint(at):\n    return f'weights {r.combine_weight.tolist()}'",
    "msg = f'{[*tokens]}'",
    "raise AssertionError((*tokens,))",
    "assert ok, f'found {list(getattr(buf, \"shape\", []))}'",
    "assert ok, f'{res.Q[0].tolist()}'",  # a row of any length
    "assert ok, f'{lse[0, 0, 33:].tolist()}'",  # open-ended
])
def test_the_scan_rejects(snippet: str):
    assert unbounded_formatting(snippet), f"the scan should reject:\n{snippet}"


@pytest.mark.parametrize("snippet", [
    "assert got == want, f'found {show(got)}'",
    "assert ok, f'row sums {sums[:4].tolist()}'",
    "assert ok, f'first {x[2:10].tolist()}'",
    "idx = r.expert_index.tolist()\nassert idx == want, 'experts differ'",  # logic, not text
    "got = tokens.tolist()\nassert got[b] == want[b], f'row {b}: found {got[b]}'",  # one row of it
    "assert ok, f'expected {list(range(m))}'",
    "assert ok, f'found {[int(v) for v in picked[:8]]}'",
    "assert ok, f'{sorted([a, b])}'",
    "want = list(range(4))\nassert got == want, f'expected {want}'",
    "assert ok, f'{x}'",  # a tensor's own repr is summarised
    "def f(got):\n    return f'{got}'\ngot = x.tolist()",  # a parameter is not the module's name
    "assert tuple(o.shape) == (2, 3), f'shape {tuple(o.shape)} and {list(q.shape[:3])}'",
    "assert ok, f'{lse[0, 0, :3].tolist()}'",
    "assert ok, f'{sorted(ops.items(), key=lambda kv: -kv[1])}'",
    "op = tuple(row[i])\nassert op == want, f'found {op!r}'",  # tuple() does not taint: ops are checked
    "assert_close(a, b, atol=0, what='lse', hint=lambda index: where((*index, 0)))",  # an index, not text
])
def test_the_scan_accepts(snippet: str):
    assert not unbounded_formatting(snippet), f"the scan should accept:\n{snippet}: {unbounded_formatting(snippet)}"


def test_the_scan_fails_on_a_planted_sample(tmp_path):
    planted = ROOT / "grader/hidden/moe_router/test_hidden.py"
    source = planted.read_text() + (
        "\n\ndef test_planted(sm):\n    r = sm.route(torch.zeros(4, 4), 1, 1.0)\n"
        "    assert r.slot.min() >= -1, f'slots {r.slot.tolist()}'\n"
    )
    new = set(unbounded_formatting(source)) - set(unbounded_formatting(planted.read_text()))
    assert [why for _, why in new] == ["r.slot.tolist(): tolist() of a whole value"], new


# --------------------------------------------------------------------------------------------------
# show() itself


def test_show_reads_a_few_elements_of_a_large_value():
    import tracemalloc

    import torch

    from grader.testing import show

    big = torch.arange(2**24, dtype=torch.float32).reshape(2**12, 2**12).t()  # 64 MB, not contiguous
    tracemalloc.start()
    text = show(big)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 100_000, f"show() of a 64 MB tensor made {peak} bytes of Python objects"
    assert text == ("[0, 4096, 8192, 12288, 16384, 20480, 24576, 28672, 32768, 36864, 40960, 45056, 49152, 53248, "
                    "57344, 61440, ... 16777200 more] (shape [4096, 4096], flattened)"), text


@pytest.mark.parametrize("value,text", [
    ("tensor([[1, 2, 7, -1], [4, 8, -1, -1]])", "[[1, 2, 7, -1], [4, 8, -1, -1]]"),  # small: nested, as tolist()
    ("tensor(2.5)", "2.5"),
    ("tensor([True, False])", "[True, False]"),
    ("zeros(1).expand(10**9)", "[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, ... 999999984 more]"),
    ("zeros(3, 0)", "[[], [], []]"),
    ("Size([2, 3])", "[2, 3]"),
    ("zeros(4, 4).to_sparse()", "a sparse_coo tensor of shape [4, 4], torch.float32"),
    ("empty(2, 3, device='meta')", "a tensor of shape [2, 3], torch.float32, on meta"),
])
def test_show_formats_tensors(value: str, text: str):
    import torch

    from grader.testing import show

    assert show(eval(f"torch.{value}", {"torch": torch})) == text


def test_show_cuts_containers_and_text():
    from grader.testing import show

    assert show(list(range(20)), limit=3) == "[0, 1, 2, ... 17 more]"
    assert show((1, [2, 3])) == "(1, [2, 3])"
    assert show({i: i for i in range(5)}, limit=2) == "{0: 0, 1: 1, ... 3 more}"
    assert show("x" * 1000) == repr("x" * 200) + " ... (1000 characters in all)"
    assert show(None) == "None"
