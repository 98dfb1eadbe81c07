"""Tensor comparisons are NaN-aware: grader.testing's helpers, and a scan that keeps the tests on them.

`err.max() > tol` is False when `err` holds a NaN, so a hand-rolled tolerance check passes exactly the
values that are most wrong. The public and hidden tests compare tensors with `grader.testing.assert_close`
(or `assert_equal`, or `torch.testing.assert_close`, whose default `equal_nan=False` is kept). The scan
below reads every exercises/*/test_public.py and grader/hidden/*/test_hidden.py and fails on:

1. an ordering comparison (<, <=, >, >=) one of whose sides is a measured error:
   - a call of `.abs()`, `.max()`, `.amax()`, `.min()`, `.amin()` or `.norm()`;
   - the builtins `abs`, `max`, `min` of a measured error or of a tensor value brought to Python
     (`float(...)`, `.item()`); `max(p - s - 1, m)` of plain numbers is not one;
   - a name assigned from a measured error (in the same function, an enclosing one, or at module
     level; a parameter of the same name shadows it);
   - a measured error seen through arithmetic, indexing, `float()` or a conversion method (`.item()`,
     `.double()`, `.float()`, `.cpu()`, `.detach()`, `.to()`, `.flatten()`, `.reshape()`, `.view()`).
   Anything else stops it, `int()` and `len()` in particular: a count or an index cannot be NaN, and
   `int()` of a NaN raises;
2. a call of `torch.allclose`, `torch.isclose`, `numpy.allclose` or `numpy.isclose` (NaN-safe but
   mute: the helper says what differs and where);
3. any call with `equal_nan=True`.

A line may opt out with a trailing `# compare: not a tolerance (<why>)` comment. It is for the rare
comparison of a max that decides nothing (a hint's wording, a test's own set-up); the scan also
counts these comments, and there may be only a few.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from grader.testing import assert_close, assert_equal, is_close, mismatches

ROOT = Path(__file__).resolve().parents[1]
TEST_FILES = sorted([*ROOT.glob("exercises/*/test_public.py"), *ROOT.glob("grader/hidden/*/test_hidden.py"),
                     *ROOT.glob("grader/hidden/*/oracle.py")])
OPT_OUT = "# compare: not a tolerance"
MAX_OPT_OUTS = 4
NAN, INF = float("nan"), float("inf")

ERROR_METHODS = {"abs", "max", "amax", "min", "amin", "norm"}
ERROR_BUILTINS = {"abs", "max", "min"}
PASS_THROUGH = {"item", "double", "float", "cpu", "detach", "to", "flatten", "reshape", "view"}
CLOSE_CALLS = {("torch", "allclose"), ("torch", "isclose"), ("np", "allclose"), ("np", "isclose"),
               ("numpy", "allclose"), ("numpy", "isclose")}
ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


# --------------------------------------------------------------------------------------------------
# The scan


def _is_error_call(node: ast.AST, tainted: set[str]) -> bool:
    """A tensor reduction (`.abs()`, `.max()`, ...), or builtin abs/max/min of a measured error or of a
    tensor value brought to Python (`float(...)`, `.item()`); builtin max/min of plain numbers is not."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr in ERROR_METHODS:
        return True
    if not (isinstance(func, ast.Name) and func.id in ERROR_BUILTINS):
        return False
    args = [a.elt if isinstance(a, (ast.GeneratorExp, ast.ListComp)) else a for a in node.args]
    return any(_measures_error(a, tainted) or _holds_tensor_value(a) for a in args)


def _holds_tensor_value(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Call) and (
            (isinstance(n.func, ast.Name) and n.func.id == "float")
            or (isinstance(n.func, ast.Attribute) and n.func.attr == "item")
        )
        for n in ast.walk(node)
    )


def _measures_error(node: ast.AST, tainted: set[str]) -> bool:
    """Whether `node` is a measured error: an error-like reduction, a name holding one, or one of
    those seen through arithmetic, indexing and conversions (float(), .item(), .double(), ...).
    int() and len() stop it: a count or an index cannot be NaN."""
    if _is_error_call(node, tainted):
        return True
    if isinstance(node, ast.Name):
        return node.id in tainted
    if isinstance(node, (ast.Subscript, ast.UnaryOp)):
        return _measures_error(node.value if isinstance(node, ast.Subscript) else node.operand, tainted)
    if isinstance(node, ast.BinOp):
        return _measures_error(node.left, tainted) or _measures_error(node.right, tainted)
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name) and func.id == "float":
            return any(_measures_error(arg, tainted) for arg in node.args)
        if isinstance(func, ast.Attribute) and func.attr in PASS_THROUGH:
            return _measures_error(func.value, tainted)
    return False


def _assigned_names(target: ast.AST) -> list[str]:
    """The names an assignment binds (`a`, `a, (b, *c)`), not those inside `d[i] = ...`."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for elt in target.elts for name in _assigned_names(elt)]
    if isinstance(target, ast.Starred):
        return _assigned_names(target.value)
    return []


def _tainted_names(scope: ast.AST, inherited: set[str]) -> set[str]:
    """Names assigned, anywhere in `scope` (not in nested functions), from an error-like expression."""
    tainted = set(inherited)
    nodes = [n for n in _own_nodes(scope) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))]
    changed = True
    while changed:  # to a fixed point: err = ...max(); worst = err[b]
        changed = False
        for node in nodes:
            if node.value is None or not _measures_error(node.value, tainted):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for name in (n for t in targets for n in _assigned_names(t)):
                if name not in tainted:
                    tainted.add(name)
                    changed = True
    return tainted


def _own_nodes(scope: ast.AST):
    """The nodes of `scope`, not descending into nested function definitions."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def _dotted(func: ast.AST) -> tuple[str, str] | None:
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return func.value.id, func.attr
    return None


def hand_rolled_comparisons(source: str) -> list[tuple[int, str, str]]:
    """(line, expression, what is wrong) for every comparison the rules above reject."""
    tree = ast.parse(source)
    lines = source.splitlines()
    found: list[tuple[int, str, str]] = []

    def visit(scope: ast.AST, inherited: set[str]) -> None:
        tainted = _tainted_names(scope, inherited)
        for node in _own_nodes(scope):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                params = {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
                visit(node, tainted - params)  # a parameter shadows the outer name
            elif isinstance(node, ast.Compare) and any(isinstance(op, ORDERING) for op in node.ops):
                if any(_measures_error(side, tainted) for side in [node.left, *node.comparators]):
                    found.append((node.lineno, ast.unparse(node), "an error compared by hand"))
            elif isinstance(node, ast.Call):
                if _dotted(node.func) in CLOSE_CALLS:
                    found.append((node.lineno, ast.unparse(node), f"{'.'.join(_dotted(node.func))} says nothing of where"))
                for kw in node.keywords:
                    if kw.arg == "equal_nan" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                        found.append((node.lineno, ast.unparse(node), "equal_nan lets a NaN match a NaN"))

    visit(tree, set())
    return sorted({f for f in found if OPT_OUT not in lines[f[0] - 1]})


def opt_outs(source: str) -> int:
    return sum(OPT_OUT in line for line in source.splitlines())


@pytest.mark.parametrize("path", TEST_FILES, ids=[str(p.relative_to(ROOT)) for p in TEST_FILES])
def test_no_hand_rolled_tensor_comparisons(path: Path):
    source = path.read_text()
    found = hand_rolled_comparisons(source)
    assert not found, "\n".join(
        f"{path.relative_to(ROOT)}:{line}: {why}: {expr}" for line, expr, why in found
    ) + (
        "\nA NaN makes `err.max() > tol` False, so the most wrong values pass. Compare with "
        "grader.testing.assert_close(actual, expected, atol=..., rtol=..., what=..., hint=...) or "
        "grader.testing.assert_equal (see grader/AUTHORING.md)."
    )


def test_the_scan_covers_every_exercise():
    exercises = {p.name for p in (ROOT / "exercises").iterdir() if (p / "test_public.py").exists()}
    assert len(TEST_FILES) == 3 * len(exercises) and exercises, (
        f"expected a public and a hidden test file and an oracle for each of {sorted(exercises)}, found "
        f"{[str(p.relative_to(ROOT)) for p in TEST_FILES]}"
    )


def test_opt_outs_are_rare():
    counts = {str(p.relative_to(ROOT)): opt_outs(p.read_text()) for p in TEST_FILES}
    assert sum(counts.values()) <= MAX_OPT_OUTS, (
        f"{sum(counts.values())} lines opt out of the comparison scan with {OPT_OUT!r} (at most {MAX_OPT_OUTS}): "
        f"{ {k: v for k, v in counts.items() if v} }; compare with grader.testing.assert_close instead"
    )


@pytest.mark.parametrize("snippet", [
    "assert err.max() < tol",
    "if (a - b).abs().max() > 1e-5:\n    raise AssertionError('x')",
    "assert float((a - b).abs().amax()) <= tol",
    "assert (a - b).abs().max().item() <= tol",
    "err = (a - b).abs()\nif (err > atol).any():\n    raise AssertionError('x')",
    "err = float((a - b).abs().max())\nworst = err\nassert worst < 1e-5",
    "def f():\n    err = x.amax(-1)\n    def g():\n        return err[0] > 1\n    return g",
    "assert abs(float(loss) - 1.0) < 1e-5",
    "assert max(float(e.abs().max()) for e in errors) <= tol",
    "assert max(float(a), float(b)) <= tol",
    "assert torch.allclose(a, b)",
    "ok = numpy.isclose(a, b).all()",
    "torch.testing.assert_close(a, b, equal_nan=True)",
])
def test_the_scan_rejects(snippet: str):
    assert hand_rolled_comparisons(snippet), f"the scan should reject:\n{snippet}"


@pytest.mark.parametrize("snippet", [
    "assert int(slot.max()) < capacity",
    "assert len(used) <= capacity",
    "assert_close(a, b, atol=1e-5, what='o')",
    "torch.testing.assert_close(a, b, equal_nan=False)",
    "assert torch.equal(a, b)",
    "w = min(p - s - 1, m)\nwhile f < w:\n    f += 1",  # builtin min of plain numbers
    "assert abs(successes - n * prob) <= half",  # counts, not tensor values
    "table[i, c] = x.max()\nassert c > 0",  # `c` is not what the assignment binds
    "assert err.max() == 0",
    "tol = 2 * float((low - ref).abs().max())\nassert_close(got, ref, atol=tol, what='o')",
    f"assert (a - b).abs().max() < 5  {OPT_OUT} (chooses a hint)",
    "def f(err):\n    return err > 1\nerr = x.max()",  # a parameter is not the module's `err`
])
def test_the_scan_accepts(snippet: str):
    assert not hand_rolled_comparisons(snippet), f"the scan should accept:\n{snippet}: {hand_rolled_comparisons(snippet)}"


# --------------------------------------------------------------------------------------------------
# The helpers themselves


def failure(fn, *args, **kwargs) -> str:
    with pytest.raises(AssertionError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_close_values_pass():
    want = torch.rand(4, 30, dtype=torch.float64)
    assert_close(want.float(), want, atol=1e-6, what="p")
    assert_close(want * (1 + 1e-6), want, atol=0.0, rtol=2e-6, what="p")


def test_nan_where_a_finite_value_is_expected_fails_with_count_and_first_index():
    want = torch.rand(4, 30)
    got = want.clone()
    got[2, 17] = got[3, 1] = got[3, 29] = NAN
    message = failure(assert_close, got, want, atol=1.0, what="softmax of x", hint="subtract the max first")
    assert message.startswith("softmax of x: 3 of 120 values are NaN where a finite value is expected, first at [2, 17]"), message
    assert message.endswith("subtract the max first"), message


@pytest.mark.parametrize("bad", [INF, -INF])
def test_an_infinity_where_a_finite_value_is_expected_fails(bad: float):
    got = torch.zeros(5)
    got[3] = bad
    message = failure(assert_close, got, torch.zeros(5), atol=1e9, what="l")
    assert "1 of 5 values is infinite where a finite value is expected, first at [3]" in message, message
    assert f"found {bad}" in message, message


def test_nan_and_inf_together_are_both_counted():
    got = torch.tensor([0.0, NAN, INF, -INF])
    message = failure(assert_close, got, torch.zeros(4), atol=1.0, what="y")
    assert "3 of 4 values are NaN or infinite (1 NaN, 2 inf)" in message and "first at [1]" in message, message


def test_expected_infinities_must_be_met_by_the_same_infinity():
    want = torch.tensor([-INF, 1.0, INF])
    assert_close(torch.tensor([-INF, 1.0, INF]), want, atol=0.0, what="m")
    for got in ([INF, 1.0, INF], [0.0, 1.0, INF], [NAN, 1.0, INF], [-1e300, 1.0, INF]):
        message = failure(assert_close, torch.tensor(got, dtype=torch.float64), want, atol=1e300, what="m")
        assert "where the expected value is NaN or infinite, first at [0]" in message and "expected -inf" in message, message


def test_expected_nan_must_be_met_by_nan():
    want = torch.tensor([NAN, 2.0])
    assert_close(torch.tensor([NAN, 2.0]), want, atol=0.0, what="x")
    assert "first at [0]: found 0, expected nan" in failure(assert_close, torch.tensor([0.0, 2.0]), want, atol=1.0, what="x")


def test_mismatches_report_count_first_index_values_and_largest_error():
    want = torch.zeros(3, 4, dtype=torch.float64)
    got = want.clone()
    got[0, 2], got[2, 1] = 0.1, -0.5
    message = failure(assert_close, got, want, atol=0.05, what="o", hint="check the mask")
    assert message == (
        "o: 2 of 12 values are off by more than 0.05, first at [0, 2]: found 0.1, expected 0; "
        "the largest error is 0.5, at [2, 1]. check the mask"
    ), message


def test_the_tolerance_is_atol_plus_rtol_times_the_expected_magnitude():
    want = torch.tensor([100.0, 1.0])
    assert_close(torch.tensor([100.5, 1.0]), want, atol=0.0, rtol=0.01, what="x")
    message = failure(assert_close, torch.tensor([100.0, 1.5]), want, atol=0.1, rtol=0.01, what="x")
    assert "1 of 2 values is off by more than 0.1 + 0.01 * |expected|, first at [1]" in message, message


def test_shape_mismatch_names_both_shapes():
    message = failure(assert_close, torch.zeros(2, 3), torch.zeros(3, 2), atol=1.0, what="buffer")
    assert message == "buffer: shape is [2, 3], expected [3, 2]", message
    assert "shape is [6], expected [2, 3]" in failure(assert_equal, torch.zeros(6), torch.zeros(2, 3), what="b")


def test_a_value_that_is_not_a_tensor_fails_clearly():
    message = failure(assert_close, [0.0, 1.0], torch.zeros(2), atol=1.0, what="p", hint="return a tensor")
    assert message.startswith("p: expected a tensor of shape [2], found list [0.0, 1.0]"), message
    assert message.endswith("return a tensor"), message
    assert failure(assert_close, None, 0.0, atol=1.0, what="loss") == (
        "loss: expected a number (or a 0-d tensor), found NoneType None"
    )


def test_python_numbers_compare_as_scalars():
    assert_close(1.0 + 1e-9, 1.0, atol=1e-6, what="aux_loss")
    assert_close(torch.tensor(2.0), 2, atol=0.0, what="z")
    assert "the value is NaN where a finite value is expected: found nan, expected 1" in failure(
        assert_close, NAN, 1.0, atol=1.0, what="loss")
    assert failure(assert_close, torch.tensor(1.5), 1.0, atol=0.1, what="loss") == (
        "loss: the value is off by more than 0.1: found 1.5, expected 1"
    )


def test_empty_tensors_are_close():
    assert_close(torch.empty(0, 3), torch.empty(0, 3, dtype=torch.float64), atol=0.0, what="o")
    assert_equal(torch.empty(0, dtype=torch.long), torch.empty(0), what="slot")
    assert "shape is [0, 3], expected [0, 4]" in failure(assert_close, torch.empty(0, 3), torch.empty(0, 4), atol=0.0, what="o")


def test_integer_dtypes():
    assert_close(torch.tensor([1, 2, 3]), torch.tensor([1.0, 2.0, 3.4]), atol=0.5, what="counts")
    message = failure(assert_equal, torch.tensor([[0, 1], [2, 3]]), torch.tensor([[0, 1], [2, 4]]), what="slot")
    assert message == "slot: 1 of 4 values differs, first at [1, 1]: found 3, expected 4", message
    big = 2**53 + 1  # float64 cannot tell it from 2**53: integers compare as integers
    assert "found 9007199254740993, expected 9007199254740992" in failure(
        assert_equal, torch.tensor([big]), torch.tensor([2**53]), what="id")
    assert_equal(torch.tensor([True, False]), torch.tensor([1, 0]), what="kept")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs(dtype):
    want = torch.linspace(-2, 2, 17, dtype=torch.float64) + 0.01  # not on the low-precision grid
    got = want.to(dtype)
    assert_close(got, want, atol=2e-2, what="x")
    assert "off by more than 1e-06" in failure(assert_close, got, want, atol=1e-6, what="x")
    got[5] = NAN
    assert "NaN where a finite value is expected, first at [5]" in failure(assert_close, got, want, atol=1.0, what="x")


def test_numpy_arrays_and_other_devices():
    want = np.arange(6.0).reshape(2, 3)
    assert_close(np.arange(6.0).reshape(2, 3) + 1e-9, want, atol=1e-6, what="a")
    assert_close(torch.arange(6.0).reshape(2, 3), torch.from_numpy(want), atol=0.0, what="a")
    bad = want.copy()
    bad[1, 1] = np.nan
    assert "first at [1, 1]" in failure(assert_close, bad, want, atol=1.0, what="a")
    if torch.cuda.is_available():
        assert_close(torch.from_numpy(want).cuda(), want, atol=0.0, what="a")
        assert "first at [1, 1]" in failure(assert_close, torch.from_numpy(bad).cuda(), want, atol=1.0, what="a")


def test_requires_grad_and_sparse_inputs():
    want = torch.eye(3)
    assert_close(want.clone().requires_grad_(True), want, atol=0.0, what="w")
    assert_close(want.to_sparse(), want, atol=0.0, what="w")


def test_exact_equality_is_nan_aware():
    want = torch.tensor([1.0, -INF, 2.5])
    assert_equal(torch.tensor([1.0, -INF, 2.5]), want, what="m")
    assert "1 of 3 values differs, first at [2]: found 2.50001" in failure(
        assert_equal, torch.tensor([1.0, -INF, 2.50001], dtype=torch.float64), want, what="m")
    assert "NaN where a finite value is expected, first at [0]" in failure(
        assert_equal, torch.tensor([NAN, -INF, 2.5]), want, what="m")
    assert "found inf, expected -inf" in failure(assert_equal, torch.tensor([1.0, INF, 2.5]), want, what="m")


@pytest.mark.parametrize("atol,rtol", [(NAN, 0.0), (-1.0, 0.0), (INF, 0.0), (0.0, NAN)])
def test_a_broken_tolerance_is_the_test_s_bug(atol: float, rtol: float):
    with pytest.raises(ValueError, match="must be finite and >= 0"):
        assert_close(torch.zeros(1), torch.zeros(1), atol=atol, rtol=rtol, what="x")


def test_a_nan_cannot_hide_in_the_largest_error():
    # The failure the helper exists for: every hand-rolled max-based check passes this.
    want = torch.zeros(1000, dtype=torch.float64)
    got = want.clone()
    got[::7] = NAN
    err = (got - want).abs()
    assert not bool(err.max() > 1e-6) and not bool((err > 1e-6).any()) and math.isnan(float(err.max()))
    assert "143 of 1000 values are NaN" in failure(assert_close, got, want, atol=1e-6, what="x")


def test_a_hint_can_depend_on_where_the_values_differ():
    want = torch.zeros(3, 2)
    got = want.clone()
    got[2, 1] = NAN
    calls = []

    def hint(at: tuple[int, ...]) -> str:
        calls.append(at)
        return f"token {at[0]} was dropped: its weight must be 0"

    assert_close(want, want, atol=0.0, what="w", hint=hint)
    assert not calls, "a callable hint is built only when the check fails"
    assert failure(assert_close, got, want, atol=0.0, what="w", hint=hint).endswith(". token 2 was dropped: its weight must be 0")
    assert failure(assert_equal, got[:1], want, what="w", hint=hint) == "w: shape is [1, 2], expected [3, 2]"
    assert calls == [(2, 1)]


def test_is_close_answers_what_assert_close_would_decide():
    want = torch.tensor([1.0, -INF])
    assert is_close(torch.tensor([1.0 + 1e-7, -INF]), want, atol=1e-6)
    assert not is_close(torch.tensor([1.1, -INF]), want, atol=1e-6)
    assert not is_close(torch.tensor([NAN, -INF]), want, atol=1e9), "a NaN is close to nothing finite"
    assert not is_close(torch.tensor([1.0, 0.0]), want, atol=1e9)
    assert not is_close(torch.tensor([1.0]), want, atol=1e9), "a different shape is not close"
    assert not is_close("1.0", want, atol=1e9)


def test_a_tolerance_per_element():
    want = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    step = torch.tensor([[0.1], [1.0]])  # one per row, broadcast
    assert_close(want + torch.tensor([[0.05, -0.05], [0.9, 0.0]]), want, atol=step, what="Q")
    message = failure(assert_close, want + torch.tensor([[0.2, 0.0], [0.0, 0.0]]), want, atol=step, what="Q")
    assert message == (
        "Q: 1 of 4 values is off by more than its tolerance, first at [0, 0]: found 1.2, expected 1 "
        "(tolerance there 0.1); the largest error is 0.2, at [0, 0]"
    ), message
    with pytest.raises(ValueError, match="atol must be finite"):
        assert_close(want, want, atol=torch.tensor([0.1, NAN]), what="Q")


def test_mismatches_marks_what_assert_close_rejects():
    want = torch.tensor([[0.0, 1.0, -INF], [2.0, 3.0, 4.0]])
    got = torch.tensor([[0.0, 1.5, -INF], [NAN, 3.0, INF]])
    assert mismatches(got, want, atol=0.1).tolist() == [[False, True, False], [True, False, True]]
    assert mismatches(got, want, atol=1.0).tolist() == [[False, False, False], [True, False, True]]
    assert not mismatches(want, want, atol=0.0).any()
    with pytest.raises(AssertionError, match=r"shape is \[3\], expected \[2, 3\]"):
        mismatches(torch.zeros(3), want, atol=0.0)
