"""Helpers for the course's tests (public and hidden): inputs that enforce a contract, tolerances.

Import from here in test files; this module ships with the student release.

Every tensor comparison in a test goes through `assert_close` (within a tolerance) or `assert_equal`
(exactly). Both are NaN- and inf-aware: `err.max() > tol` is False when `err` holds a NaN, so a
hand-rolled comparison passes exactly the values that are most wrong. Here a NaN or an inf where
the expected value is finite always fails, with a message that counts them and names the first.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, Union

import numpy as np
import torch

from grader.harness.wire import OnceIterable

__all__ = ["OnceIterable", "assert_close", "assert_equal", "is_close", "mismatches"]

Hint = Union[str, Callable[[tuple[int, ...]], str]]  # a hint, or one built from the first bad index


Tolerance = Union[float, torch.Tensor]  # a number, or one per element (broadcast to expected's shape)


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
    message, first = _differences(got, want, verbs, bad)
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


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _with_hint(message: str, hint: Hint, index: tuple[int, ...] | None = None) -> str:
    """The message, then the hint; a callable hint is built from `index` (and left out without one)."""
    if callable(hint):
        hint = hint(index) if index is not None else ""
    return f"{message}. {hint}" if hint else message
