"""Helpers for the course's tests (public and hidden): inputs that enforce a contract, tolerances.

Import from here in test files; this module ships with the student release.

Every tensor comparison in a test goes through `assert_close` (within a tolerance) or `assert_equal`
(exactly). Both are NaN- and inf-aware: `err.max() > tol` is False when `err` holds a NaN, so a
hand-rolled comparison passes exactly the values that are most wrong. Here a NaN or an inf where
the expected value is finite always fails, with a message that counts them and names the first.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Sequence
from typing import Any, Callable, Union

import numpy as np
import torch

from grader.harness.wire import OnceIterable

__all__ = ["OnceIterable", "assert_close", "assert_equal", "assert_equal_up_to_ties", "generator", "is_close",
           "mismatches", "must_accept", "near_midpoint", "public_seed", "show"]

Hint = Union[str, Callable[[tuple[int, ...]], str]]  # a hint, or one built from the first bad index


Tolerance = Union[float, torch.Tensor]  # a number, or one per element (broadcast to expected's shape)


def public_seed(k: int) -> int:
    """The seed a public test draws its inputs from: `k` itself under ``make check``, and `k` mixed with the
    grade's secret seed when the grader runs the test. A submission can read a public test's inputs in its file;
    with fixed seeds it computed their answers with torch.softmax at import, where no guard runs, and looked them
    up by shape (red team round 10: the public Triton points for a host softmax). Graded, the inputs are new."""
    run = os.environ.get("GRADER_SEED", "")
    return k if not run.isdigit() or int(run) == 0 else (int(run) * 1_000_003 + k) % 2**63


def generator(k: int) -> torch.Generator:
    """A torch.Generator for a public test's inputs, seeded with `public_seed(k)`."""
    return torch.Generator().manual_seed(public_seed(k))


def assert_close(
    actual: Any, expected: Any, *, atol: Tolerance, rtol: float = 0.0, what: str, hint: Hint = ""
) -> None:
    """Fail unless `actual` matches `expected` elementwise: |actual - expected| <= atol + rtol * |expected|.

    `actual` must be a tensor (any device, any real dtype), a numpy array or a real number (a 0-d
    value), with the shape of `expected` (a tensor, array, number or nested list). Values are
    compared in float64. Where `expected` is finite, `actual` must be finite; where it is +inf or
    -inf, `actual` must be the same infinity; where it is NaN, `actual` must be NaN (so `expected`
    should come from an oracle: check a student-derived one is finite first). `atol` may be a tensor
    that broadcasts to `expected`'s shape: a tolerance per element.

    `what` names the value for the message ("o for causal attention"); `hint` is appended to it, to
    say what the usual mistake is. A hint that depends on where the values differ can be a function
    of the first bad index (a tuple of ints), called only when the check fails.
    """
    got, want = _as_tensors(actual, expected, what, hint)
    atol_t = _tolerance(atol, "atol", want.shape)
    _tolerance(rtol, "rtol", want.shape)
    problem = _special_values(got, want) or _outside_tolerance(got, want, atol_t, float(rtol))
    if problem:
        message, first = problem
        raise AssertionError(_with_hint(f"{what}: {message}", hint, _unravel(first, got.shape)))


def assert_equal(actual: Any, expected: Any, *, what: str, hint: Hint = "") -> None:
    """Fail unless `actual` equals `expected` exactly, elementwise, with the rules of `assert_close`.

    Integer and boolean tensors are compared as integers (no rounding through float64); anything
    else as float64, where NaN must meet NaN and an infinity the same infinity.
    """
    got, want = _as_tensors(actual, expected, what, hint)
    if _is_integral(got) and _is_integral(want):
        got, want = got.to(torch.int64), want.to(torch.int64)
        problem = _differences(got, want, ("differs", "differ"), got.ne(want))
    else:
        zero = torch.zeros(want.shape, dtype=torch.float64)
        problem = _special_values(got, want) or _outside_tolerance(got, want, zero, 0.0)
    if problem:
        message, first = problem
        raise AssertionError(_with_hint(f"{what}: {message}", hint, _unravel(first, got.shape)))


def mismatches(actual: Any, expected: Any, *, atol: Tolerance, rtol: float = 0.0) -> torch.Tensor:
    """A boolean CPU tensor of `expected`'s shape, True where `assert_close` would reject the value
    (NaN or inf where a finite value is expected, a different infinity, or off by more than the
    tolerance). For a test that counts or locates the bad entries itself ("at most one row may
    differ"). Raises AssertionError, as `assert_close` does, when `actual` has the wrong type or shape."""
    got, want = _as_tensors(actual, expected, "value", "")
    atol_t = _tolerance(atol, "atol", want.shape)
    _tolerance(rtol, "rtol", want.shape)
    got, want = got.to(torch.float64), want.to(torch.float64)
    return _nonfinite_mask(got, want)[0] | _tolerance_mask(got, want, atol_t, float(rtol))[0]


def is_close(actual: Any, expected: Any, *, atol: Tolerance, rtol: float = 0.0) -> bool:
    """Whether `assert_close` would pass: for a test that must tell two answers apart ("is this the
    top-left causal mask?") before it asserts the right one. A NaN is close to nothing finite."""
    try:
        assert_close(actual, expected, atol=atol, rtol=rtol, what="value")
    except AssertionError:
        return False
    return True


# --------------------------------------------------------------------------------------------------
# Rounded values: "equal up to rounding ties"


def near_midpoint(values: Any, *, tol: Tolerance) -> torch.Tensor:
    """A boolean CPU tensor of `values`' shape: True where a value lies within `tol` of a midpoint
    k + 1/2 between two integers, so that rounding it is a tie up to that much arithmetic noise.

    `values` are in grid units (x / scale), as the oracle computed them in its own arithmetic; `tol`
    is how far an equally correct computation may stray from them (a few ulps of the arithmetic the
    contract allows), a number or one per element. A NaN or inf is never near a midpoint. The oracle
    records these places; `assert_equal_up_to_ties` accepts differences only there.
    """
    v = torch.as_tensor(np.asarray(values) if isinstance(values, np.ndarray) else values).detach().cpu().double()
    tol_t = _tolerance(tol, "tol", v.shape)
    distance = (v - torch.floor(v) - 0.5).abs()
    return torch.isfinite(v) & (distance <= tol_t)


def assert_equal_up_to_ties(
    actual: Any,
    expected: Any,
    *,
    ties: Any | None,
    atol: Tolerance,
    rtol: float = 0.0,
    what: str,
    order: Sequence[int] | None = None,
    path: bool = True,
    tie_atol: Tolerance | None = None,
    hint: Hint = "",
) -> torch.Tensor:
    """Fail unless rounded values `actual` equal an oracle's `expected` [rows, cols] (within atol +
    rtol * |expected|), except where the oracle itself sat on a rounding tie.

    The rule. `ties` (bool, `expected`'s shape, or None for none) marks where the oracle's OWN
    computation sat on a tie: a value within a few ulps of a grid midpoint, or a grid fit from such a
    value, so that arithmetic that differs from the oracle's only in its last bits may round the
    other way and still be right. Nothing else is a tie: a difference where the oracle shows none
    fails, however few rows it touches.

    - `path=True` (each row is a path, its elements processed in `order`, the columns' indices in
      processing order, natural order by default): a rounding decision feeds the later elements of
      its row (GPTQ's error feedback; a group's grid fit from updated values), so once a tie breaks
      the other way the rest of that row legitimately follows another path. A row is accepted if it
      matches exactly at every position before its first recorded tie; from that tie on it may
      differ. A difference before the row's first tie, or in a row with no tie, fails.
    - `path=False`: every element stands alone; a difference is accepted only at a tie itself.

    A NaN or inf where `expected` is finite is never a tie. `tie_atol`, if given, bounds the
    difference at a tie element itself (the other side of a tie is one grid step away). The message
    names the first refused row and column (its position in processing order), both values, and the
    oracle's first tie in that row, if any; `hint` is appended (a function of the index [row, column]
    is called with it). Returns a bool tensor of `expected`'s shape, True where a difference was
    accepted (`accepted.any(1)`: the rows that followed another path), for the caller to skip them in
    checks that depend on the path (a loss, the grids fit after the tie).
    """
    got, want = _as_tensors(actual, expected, what, hint)
    if want.dim() != 2:
        raise ValueError(f"assert_equal_up_to_ties compares [rows, cols] values, got shape {_shape(want.shape)}")
    rows, cols = want.shape
    tie = torch.zeros(want.shape, dtype=torch.bool) if ties is None else _to_cpu(torch.as_tensor(ties)).bool()
    if tie.shape != want.shape:
        raise ValueError(f"ties must have the shape of expected, {_shape(want.shape)}, got {_shape(tie.shape)}")
    cols_order = list(range(cols)) if order is None else [int(j) for j in order]
    if sorted(cols_order) != list(range(cols)):
        raise ValueError(f"order must be a permutation of the {cols} columns, got {cols_order}")
    got64, want64 = got.to(torch.float64), want.to(torch.float64)
    bad = mismatches(got64, want64, atol=atol, rtol=rtol)
    special = _nonfinite_mask(got64, want64)[0]  # NaN or inf on either side, unmatched: never a tie
    if path:
        position = torch.empty(cols, dtype=torch.int64)
        position[torch.tensor(cols_order, dtype=torch.int64)] = torch.arange(cols)
        at = position.expand(rows, cols)  # each element's position along its row's path
        never = torch.full((rows, 1), cols, dtype=torch.int64)
        first_tie = torch.where(tie, at, never).amin(1, keepdim=True) if cols else never
        accepted = bad & (at >= first_tie) & ~special
        first_bad = torch.where(bad, at, never).amin(1, keepdim=True) if cols else never
        at_tie = accepted & (at == first_bad) & tie  # where the row first differs, when that is its tie
    else:
        accepted = bad & tie & ~special
        at_tie = accepted
    if tie_atol is not None:
        jumped = at_tie & mismatches(got64, want64, atol=tie_atol)
        accepted &= ~(jumped.any(1, keepdim=True) if path else jumped)
    refused = bad & ~accepted
    if refused.any():
        raise AssertionError(_refusal(got64, want64, refused, tie, cols_order, path, tie_atol, what, hint))
    return accepted


def _refusal(got, want, refused, tie, order, path, tie_atol, what, hint) -> str:
    """The message for the first refused row (path) or element: where, both values, the oracle's ties."""
    rows, cols = want.shape
    bad_rows = [int(r) for r in torch.nonzero(refused.any(1)).flatten()]
    r = bad_rows[0]
    if path:
        k = next(k for k, j in enumerate(order) if refused[r, j])
        j = order[k]
        where = f"Row {r}, column {j}" + (f" (position {k} in the processing order)" if order != list(range(cols)) else "")
        head = f"{len(bad_rows)} of {rows} rows differ, and not because of a rounding tie of the oracle's"
        first_tie = next((k2 for k2, j2 in enumerate(order) if tie[r, j2]), None)
    else:
        j = int(torch.nonzero(refused[r]).flatten()[0])
        where = f"[{r}, {j}]"
        head = f"{int(refused.sum())} of {want.numel()} values differ, and not because of a rounding tie of the oracle's"
        k, first_tie = 0, (0 if tie[r, j] else None)
    if not bool(torch.isfinite(got[r, j]) & torch.isfinite(want[r, j])):
        context = "a NaN or inf is never a rounding tie"
    elif first_tie is None:
        context = f"the oracle's computation has no rounding tie {'in this row' if path else 'there'}"
    elif first_tie > k:
        context = (f"the oracle's first rounding tie in this row is later, at column {order[first_tie]}: "
                   "a difference before the tie is not one")
    else:
        allowed = float(torch.as_tensor(tie_atol, dtype=torch.float64).broadcast_to(want.shape)[r, j])
        context = f"the oracle sat on a tie there, but the other side of a tie is at most {allowed:.4g} away"
    message = (f"{what}: {head}. {where}: found {_value(got, r * cols + j)}, expected {_value(want, r * cols + j)}; "
               f"{context}")
    return _with_hint(message, hint, (r, j))


# --------------------------------------------------------------------------------------------------
# The rules


def _tolerance(value: Tolerance, name: str, shape: torch.Size) -> torch.Tensor:
    """The tolerance as a float64 tensor of `shape`; a NaN, negative or infinite one is the test's bug."""
    tol = torch.as_tensor(value.detach().cpu() if isinstance(value, torch.Tensor) else value, dtype=torch.float64)
    if not bool(((tol >= 0) & (tol < float("inf"))).all()):  # also rejects NaN
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
    return torch.broadcast_to(tol, shape)


def _as_tensors(actual: Any, expected: Any, what: str, hint: Hint) -> tuple[torch.Tensor, torch.Tensor]:
    """Both values as CPU tensors (actual's dtype kept for now), after checking actual's type and shape."""
    want = _to_cpu(expected if isinstance(expected, (torch.Tensor, np.ndarray)) else torch.as_tensor(expected))
    if isinstance(actual, numbers.Real) and not isinstance(actual, np.ndarray):
        actual = torch.tensor(actual)  # a Python or numpy scalar: a 0-d value
    if not isinstance(actual, (torch.Tensor, np.ndarray)):
        wanted = "a number (or a 0-d tensor)" if want.dim() == 0 else f"a tensor of shape {_shape(want.shape)}"
        raise AssertionError(_with_hint(f"{what}: expected {wanted}, found {type(actual).__name__} {_short(actual)}", hint))
    got = _to_cpu(actual)
    if got.shape != want.shape:
        raise AssertionError(_with_hint(
            f"{what}: shape is {_shape(got.shape)}, expected {_shape(want.shape)}", hint
        ))
    return got, want


def _to_cpu(value: torch.Tensor | np.ndarray) -> torch.Tensor:
    tensor = torch.as_tensor(np.asarray(value)) if isinstance(value, np.ndarray) else value
    tensor = tensor.detach()
    if tensor.layout != torch.strided:
        tensor = tensor.to_dense()
    if tensor.is_complex():
        raise TypeError("assert_close compares real values; got a complex tensor")
    return tensor.cpu()


def _is_integral(tensor: torch.Tensor) -> bool:
    return tensor.dtype == torch.bool or not tensor.is_floating_point()


def _nonfinite_mask(got: torch.Tensor, want: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(bad, unexpected): where the special-value rules fail; `unexpected` marks NaN or inf in `got`
    where `want` is finite (the rest of `bad`: where `want` is NaN or inf and `got` does not match it)."""
    finite = torch.isfinite(want)
    unexpected = finite & ~torch.isfinite(got)
    mismatched = ~finite & ~(got.eq(want) | (want.isnan() & got.isnan()))
    return unexpected | mismatched, unexpected


def _tolerance_mask(got: torch.Tensor, want: torch.Tensor, atol: torch.Tensor, rtol: float):
    """(bad, err): where both are finite and |got - want| > atol + rtol * |want|, and that error (0 elsewhere)."""
    both = torch.isfinite(want) & torch.isfinite(got)
    zero = torch.zeros((), dtype=torch.float64)
    err = torch.where(both, (got - want).abs(), zero)
    return err > atol + rtol * torch.where(both, want.abs(), zero), err


def _special_values(got: torch.Tensor, want: torch.Tensor) -> tuple[str, int] | None:
    """A message for the first rule on NaN and inf that `got` breaks, and the flat index it names; or None."""
    got, want = got.to(torch.float64), want.to(torch.float64)
    bad, unexpected = _nonfinite_mask(got, want)
    if unexpected.any():
        nan, inf = int((unexpected & got.isnan()).sum()), int((unexpected & got.isinf()).sum())
        kind = "NaN" if not inf else "infinite" if not nan else f"NaN or infinite ({nan} NaN, {inf} inf)"
        first = _first(unexpected)
        return (
            f"{_count(nan + inf, got.numel())} {kind} where a finite value is expected{_first_at(first, got.shape)}: "
            f"found {_value(got, first)}, expected {_value(want, first)}"
        ), first
    if bad.any():
        first = _first(bad)
        return (
            f"{_count(int(bad.sum()), got.numel())} wrong where the expected value is NaN or infinite"
            f"{_first_at(first, got.shape)}: found {_value(got, first)}, expected {_value(want, first)}"
        ), first
    return None


def _outside_tolerance(got: torch.Tensor, want: torch.Tensor, atol: torch.Tensor, rtol: float) -> tuple[str, int] | None:
    """A message for the finite values of `got` that are off by more than atol + rtol * |want|, or None."""
    got, want = got.to(torch.float64), want.to(torch.float64)
    bad, err = _tolerance_mask(got, want, atol, rtol)
    if not bad.any():
        return None
    if not bool(atol.any()) and rtol == 0.0:
        return _differences(got, want, ("differs", "differ"), bad)
    uniform = atol.numel() == 0 or bool((atol == atol.flatten()[0]).all())
    if uniform:
        allowed = f"{float(atol.flatten()[0]) if atol.numel() else 0.0:.3g}" + (f" + {rtol:.3g} * |expected|" if rtol else "")
        verbs = (f"is off by more than {allowed}", f"are off by more than {allowed}")
    else:
        verbs = ("is off by more than its tolerance", "are off by more than their tolerance")
    found = _differences(got, want, verbs, bad)
    assert found is not None  # bad.any(), above
    message, first = found
    if not uniform:
        message += f" (tolerance there {float(atol.flatten()[first]):.3g}" + (f" + {rtol:.3g} * |expected|)" if rtol else ")")
    if got.numel() > 1:
        worst = int(err.flatten().argmax())
        message += f"; the largest error is {float(err.flatten()[worst]):.3g}, at {_index(worst, got.shape)}"
    return message, first


def _differences(got: torch.Tensor, want: torch.Tensor, verbs: tuple[str, str], bad: torch.Tensor) -> tuple[str, int] | None:
    """"3 of 40 values differ, first at [2]: found 4, expected 5" (verbs: singular, plural) and the
    first index, flat; or None."""
    if not bad.any():
        return None
    n, first = int(bad.sum()), _first(bad)
    subject = "the value" if got.numel() == 1 else f"{n} of {got.numel()} values"
    return (
        f"{subject} {verbs[n != 1]}{_first_at(first, got.shape)}: "
        f"found {_value(got, first)}, expected {_value(want, first)}"
    ), first


# --------------------------------------------------------------------------------------------------
# Formatting


def _first(mask: torch.Tensor) -> int:
    """The flat index of the first True in `mask` (row-major order)."""
    return int(mask.flatten().to(torch.uint8).argmax())


def _first_at(flat: int, shape: torch.Size) -> str:
    return f", first at {_index(flat, shape)}" if len(shape) else ""


def _unravel(flat: int, shape: torch.Size) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        flat, i = divmod(flat, size)
        index.append(i)
    return tuple(reversed(index))


def _index(flat: int, shape: torch.Size) -> str:
    return "[" + ", ".join(str(i) for i in _unravel(flat, shape)) + "]"


def _value(tensor: torch.Tensor, flat: int) -> str:
    value = tensor.flatten()[flat].item()
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _count(n: int, total: int) -> str:
    if total == 1:
        return "the value is"
    return f"{n} of {total} values " + ("is" if n == 1 else "are")


def _shape(shape: torch.Size) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def must_accept(label: str, call: Callable[[], Any]) -> None:
    """A function that raises on everything passes every rejection test: a rejection earns its points only
    from a function that, in the same test, accepts a valid input (`call`, described by `label`)."""
    import pytest

    try:
        call()
    except Exception as exc:  # noqa: BLE001 - any failure here means the rejection that follows proves nothing
        pytest.fail(f"{label} is valid and raised {type(exc).__name__}: {str(exc)[:200]}. A rejection counts only "
                    "from a function that accepts valid input")


def valid_call(label: str, call: Callable[[], Any], why: str = "") -> Any:
    """`call()`'s value. When the student's code raises on this input, which the contract accepts, the test fails
    saying so (`label`: the input; `why`: what the contract answers for it), not with the bare exception, which
    often blames the wrong thing (a ValueError for "no chunks" raised on chunks of width 0). The grading machine's
    own failures (the sandbox, a timeout, a crash) pass through untouched."""
    import pytest

    from grader.harness.client import SandboxError, StudentCrash, StudentError, StudentTimeout

    try:
        return call()
    except (SandboxError, StudentCrash, StudentTimeout):
        raise
    except Exception as exc:  # noqa: BLE001 - the student's exception, in either mode
        raised = str(exc) if isinstance(exc, StudentError) else f"{type(exc).__name__}: {exc}"
        pytest.fail(f"{label} is valid input, and your code raised {raised[:300]}" + (f". {why}" if why else ""))


def show(value: Any, limit: int = 16, _depth: int = 0) -> str:
    """`value` for a message, in bounded space: at most `limit` elements, then how many were left out.

    A test formats what the student's code returned, and that can be anything up to the reply limit
    (a gigabyte). ``tensor.tolist()`` of that builds tens of gigabytes of Python objects in the
    grader's own process; this reads only the first `limit` elements, whatever the size or layout
    (a transposed or expanded view is not copied whole). Nested lists and tuples are cut the same
    way, element by element; a dict or set shows its first `limit` items, a string its first 200
    characters, a shape (torch.Size) as ``[2, 3]``. Anything else is its repr, cut to 200 characters.
    Containers nested deeper than three levels show as ``[...]`` (16 per level would be 16**depth elements).
    """
    if _depth > 3 and isinstance(value, (list, tuple, dict, set, frozenset)):
        return "[...]" if isinstance(value, list) else "(...)" if isinstance(value, tuple) else "{...}"
    inner = _depth + 1
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value) if value.dtype != object else list(value.reshape(-1)[:limit])
    if isinstance(value, torch.Tensor):
        return _show_tensor(value, limit)
    if isinstance(value, torch.Size):
        return _shape(value)
    if isinstance(value, (list, tuple)):
        head = [show(v, limit, inner) for v in value[:limit]]
        more = f", ... {len(value) - limit} more" if len(value) > limit else ""
        open_, close = ("[", "]") if isinstance(value, list) else ("(", ")")
        return open_ + ", ".join(head) + more + close
    if isinstance(value, dict):
        items = [f"{show(k, limit, inner)}: {show(v, limit, inner)}" for k, v in _take(value.items(), limit)]
        return "{" + ", ".join(items) + (f", ... {len(value) - limit} more" if len(value) > limit else "") + "}"
    if isinstance(value, (set, frozenset)):
        items = [show(v, limit, inner) for v in _take(value, limit)]
        return "{" + ", ".join(items) + (f", ... {len(value) - limit} more" if len(value) > limit else "") + "}"
    if isinstance(value, (str, bytes)):
        text = repr(value[:200])
        return text + (f" ... ({len(value)} characters in all)" if len(value) > 200 else "")
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _take(items: Any, n: int) -> list:
    out: list = []
    for item in items:
        if len(out) == n:
            break
        out.append(item)
    return out


def _show_tensor(value: torch.Tensor, limit: int) -> str:
    try:
        if value.layout != torch.strided:
            return f"a {str(value.layout).split('.')[-1]} tensor of shape {_shape(value.shape)}, {value.dtype}"
        if value.numel() <= limit:  # small: all of it, nested as tolist() would give it
            return _nested(value.detach().to("cpu").tolist())
        flat = _head(value.detach(), limit).to("cpu")
        items = [_scalar(v) for v in flat.tolist()]
    except (RuntimeError, NotImplementedError, TypeError):  # a meta tensor, a dtype .item() cannot read
        return f"a tensor of shape {_shape(value.shape)}, {value.dtype}, on {value.device}"
    text = "[" + ", ".join(items) + (f", ... {value.numel() - limit} more" if value.numel() > limit else "") + "]"
    return text if value.dim() <= 1 else f"{text} (shape {_shape(value.shape)}, flattened)"


def _nested(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_nested(v) for v in value) + "]"
    return _scalar(value)


def _head(t: torch.Tensor, limit: int) -> torch.Tensor:
    """The first `limit` elements of `t` in row-major order, 1-D, without copying more than about 2 * limit
    of them (reshape(-1) of a non-contiguous view would copy it whole)."""
    while t.dim() > 1:
        inner = math.prod(t.shape[1:])
        if inner == 0 or t.shape[0] == 0:
            return t.reshape(-1)[:0]
        rows = min(t.shape[0], -(-limit // inner))
        if rows > 1:
            return t[:rows].reshape(-1)[:limit]  # rows * inner < limit + inner <= 2 * limit elements
        t = t[0]
    return t.reshape(-1)[:limit]


def _scalar(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else repr(value)


def _short(value: Any) -> str:
    text = show(value, 4)  # bounded whatever the value: repr of a list of 4000 shared strings took gigabytes
    return text if len(text) <= 60 else text[:57] + "..."


def _with_hint(message: str, hint: Hint, index: tuple[int, ...] | None = None) -> str:
    """The message, then the hint; a callable hint is built from `index` (and left out without one)."""
    if callable(hint):
        hint = hint(index) if index is not None else ""
    return f"{message}. {hint}" if hint else message
