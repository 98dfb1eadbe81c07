"""Rows read in blocks: -inf masks placed at every position against the block boundaries, and
messages that place a wrong value against them.

Online softmax and FlashAttention read a row in blocks (online_normalizer's chunks, online_softmax's
`block_size`, a Triton kernel's tiles). Their masking bugs hide in particular placements of -inf
against the blocks: a block that is all -inf after a finite one, a span that ends inside a block, a
lane of a tile that is masked in the first tile and again later. A few hand-picked masks meet a few
of these; the generators here meet them all, and `explain_row` says where the first wrong value of a
row sits and which placement its row has, so a failure leads to its cause.

Blocks are given as cuts: 0 = c0 <= c1 <= ... <= n, block i (counted from 1 in messages) holding the
columns [c_{i-1}, c_i); empty blocks are allowed. Where the code under test picks its own tile width
(a Triton kernel's BLOCK), pass `cuts=None`: columns are then placed against every power-of-two tile
width from 16 to 4096.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from grader.testing import show

__all__ = [
    "SPAN_KINDS", "Span", "against_tiles", "anchors", "apply_spans", "block_cuts", "describe_column", "describe_spans",
    "every_span", "explain_row", "explain_state", "random_cuts", "random_spans", "spans_of",
]

Span = tuple[int, int]  # the columns [start, stop) of a row that hold -inf
Cuts = Optional[Sequence[int]]
INF = float("inf")
TILE_WIDTHS = [1 << j for j in range(4, 13)]  # the power-of-two tiles a kernel may pick: 16 .. 4096

SPAN_KINDS = ("none", "leading", "trailing", "interior", "whole blocks", "crossing", "whole row", "two spans")


# --------------------------------------------------------------------------------------------------
# Blocks


def block_cuts(n: int, block: int) -> list[int]:
    """The cuts of a row of n columns read `block` columns at a time (the last block may be partial)."""
    return [*range(0, n, block), n] if n else [0]


def random_cuts(n: int, rng: torch.Generator, max_parts: int = 6) -> list[int]:
    """Cuts 0 = c0 <= c1 <= ... <= n at random places, with repeats (empty blocks) allowed."""
    parts = _randint(rng, 1, max_parts + 1)
    return [0, *sorted(_randint(rng, 0, n + 1) for _ in range(parts - 1)), n]


def anchors(n: int, cuts: Cuts) -> list[int]:
    """The places a span should start or stop at: 0, n, every boundary and the columns beside it.
    With cuts=None, the boundaries are the multiples of every power-of-two tile width up to n."""
    points = {0, n}
    bounds = set(cuts) if cuts is not None else {m for w in TILE_WIDTHS for m in range(w, n + 1, w)}
    for b in bounds:
        points.update(p for p in (b - 1, b, b + 1) if 0 <= p <= n)
    return sorted(points)


# --------------------------------------------------------------------------------------------------
# Spans


def every_span(n: int) -> list[Span]:
    """Every span of a row of n columns: each start, each length (n (n + 1) / 2 of them)."""
    return [(a, b) for a in range(n) for b in range(a + 1, n + 1)]


def random_spans(n: int, cuts: Cuts, rng: torch.Generator, kind: str | None = None) -> list[Span]:
    """The -inf spans of one row, of a random kind from SPAN_KINDS (or the one named): their ends lie
    on boundaries or beside them half of the time, anywhere the other half."""
    kind = kind or SPAN_KINDS[_randint(rng, 0, len(SPAN_KINDS))]
    if n == 0 or kind == "none":
        return []
    near = anchors(n, cuts)

    def point(lo: int, hi: int) -> int:  # a place in [lo, hi]: an anchor when one is there, half the time
        inside = [p for p in near if lo <= p <= hi]
        if inside and _randint(rng, 0, 2):
            return inside[_randint(rng, 0, len(inside))]
        return _randint(rng, lo, hi + 1)

    if kind == "leading":
        return [(0, point(1, n))]
    if kind == "trailing":
        return [(point(0, n - 1), n)]
    if kind == "interior":
        if n < 3:
            return [(0, n)]
        a = point(1, n - 2)
        return [(a, point(a + 1, n - 1))]
    if kind == "whole blocks":
        bounds = sorted(set(cuts if cuts is not None else [0, *(m for w in TILE_WIDTHS for m in range(w, n, w)), n]))
        if len(bounds) < 2:
            return [(0, n)]
        i = _randint(rng, 0, len(bounds) - 1)
        j = _randint(rng, i + 1, len(bounds))
        return [(bounds[i], bounds[j])]
    if kind == "crossing":
        inner = [b for b in (cuts if cuts is not None else anchors(n, None)) if 0 < b < n]
        if not inner:
            return [(0, n)]
        b = inner[_randint(rng, 0, len(inner))]
        return [(point(0, b - 1), point(b + 1, n))]
    if kind == "whole row":
        return [(0, n)]
    if kind == "two spans":
        first, second = (random_spans(n, cuts, rng, SPAN_KINDS[_randint(rng, 1, 6)]) for _ in range(2))
        return _union(first + second)
    raise ValueError(f"unknown span kind {kind!r}; expected one of {SPAN_KINDS}")


def apply_spans(x: torch.Tensor, spans_per_row: Sequence[Sequence[Span]]) -> torch.Tensor:
    """A copy of the 2-D `x` with -inf on each row's spans."""
    if x.dim() != 2 or x.shape[0] != len(spans_per_row):
        raise ValueError(f"expected a 2-D x with one list of spans per row, found {tuple(x.shape)} and "
                         f"{len(spans_per_row)} lists")
    out = x.clone()
    for row, spans in enumerate(spans_per_row):
        for a, b in spans:
            out[row, a:b] = -INF
    return out


def spans_of(row: torch.Tensor) -> list[Span]:
    """The maximal runs of -inf in a 1-D row, as spans."""
    masked = (row == -INF).tolist()
    spans, start = [], None
    for col, hole in enumerate([*masked, False]):
        if hole and start is None:
            start = col
        elif not hole and start is not None:
            spans.append((start, col))
            start = None
    return spans


# --------------------------------------------------------------------------------------------------
# Describing a place


def describe_column(col: int, n: int, cuts: Cuts, unit: str = "block") -> str:
    """Where column `col` of a row of n sits: "column 1024 is the first column of block 2 [1024, 2048)"."""
    last = " and the last of the row" if col == n - 1 else ""
    if cuts is None:
        return f"column {col}{' (the last of the row, n = ' + str(n) + ')' if last else ''}, {against_tiles(col)}"
    i = _block_of(col, cuts)
    a, b = cuts[i], cuts[i + 1]
    where = f"{unit} {i + 1} [{a}, {b})"
    if b - a == 1:
        return f"column {col} is the only column of {where}{last}"
    if col == a:
        return f"column {col} is the first column of {where}{last}"
    if col == b - 1:
        return f"column {col} is the last column of {where}{last}"
    return f"column {col} is column {col - a} of {where} (counted from 0){last}"


def describe_spans(spans: Sequence[Span], n: int, cuts: Cuts, unit: str = "block") -> str:
    """The spans of a row of n columns, each placed against the blocks."""
    if not spans:
        return "no -inf"
    return "-inf at " + "; ".join(_describe_span(a, b, n, cuts, unit) for a, b in spans)


def _describe_span(a: int, b: int, n: int, cuts: Cuts, unit: str) -> str:
    cols = f"column {a}" if b - a == 1 else f"columns {a}-{b - 1}"
    if a == 0 and b == n:
        return f"{cols} (the whole row)"
    side = "leading, " if a == 0 else "trailing, " if b == n else ""
    if cuts is None:
        longer = max((w for w in TILE_WIDTHS if w < b - a), default=0)
        length = f"{b - a} long" + (f", more than a tile for BLOCK <= {longer}" if longer else "")
        return f"{cols} ({side}{length}; starts {against_tiles(a)}, ends {against_tiles(b - 1)})"
    first, last = _block_of(a, cuts), _block_of(b - 1, cuts)
    starts_whole, ends_whole = a == cuts[first], b == cuts[last + 1]
    if starts_whole and ends_whole:
        blocks = f"{unit} {first + 1}" if first == last else f"{unit}s {first + 1}-{last + 1}"
        return f"{cols} ({side}all of {blocks})"
    if first == last:
        return f"{cols} ({side}inside {unit} {first + 1} [{cuts[first]}, {cuts[first + 1]}))"
    into = [str(c) for c in cuts[first + 1:last + 1] if a < c < b]
    crossing = f"the boundary at column {into[0]}" if len(into) == 1 else f"the boundaries at columns {', '.join(into)}"
    return (f"{cols} ({side}from {'the start' if starts_whole else 'inside'} of {unit} {first + 1} "
            f"[{cuts[first]}, {cuts[first + 1]}) to {'the end' if ends_whole else 'inside'} of {unit} {last + 1} "
            f"[{cuts[last]}, {cuts[last + 1]}), crossing {crossing})")


def against_tiles(index: int, item: str = "column", block: str = "BLOCK") -> str:
    """Where `index` (a column, a row, a key) sits against every power-of-two tile width from 16 to
    4096: "at a multiple of 64 (a tile's first column for a power-of-two BLOCK <= 64)"."""
    if index == 0:
        return f"the first {item}"
    starts = max((w for w in TILE_WIDTHS if index % w == 0), default=0)
    ends = max((w for w in TILE_WIDTHS if (index + 1) % w == 0), default=0)
    if starts:
        return f"at a multiple of {starts} (a tile's first {item} for a power-of-two {block} <= {starts})"
    if ends:
        return f"one before a multiple of {ends} (a tile's last {item} for a power-of-two {block} <= {ends})"
    return f"inside a tile for every power-of-two {block} >= 16"


def _block_of(col: int, cuts: Sequence[int]) -> int:
    """The index of the non-empty block that holds `col`."""
    for i in range(len(cuts) - 1):
        if cuts[i] <= col < cuts[i + 1]:
            return i
    raise ValueError(f"column {col} lies outside the cuts {show(cuts)}")


# --------------------------------------------------------------------------------------------------
# Explaining a wrong row


def explain_row(x: torch.Tensor, got: torch.Tensor, want: torch.Tensor, bad: torch.Tensor, cuts: Cuts,
                unit: str = "block") -> str:
    """Why one row of a softmax came out wrong: its first wrong column placed against the blocks, the
    pattern of its wrong columns, the usual cause of that pattern, and the row's -inf spans.

    `x` is the row's input, `got` and `want` its output and the oracle's, `bad` where they differ
    (grader.testing.mismatches); all of one length n (a caller checks the student's `got` against the
    expected shape first: nothing here is bounded by anything else)."""
    if not x.numel() == got.numel() == want.numel() == bad.numel():
        raise ValueError(f"explain_row takes rows of one length, found {show(x.shape)}, {show(got.shape)}, "
                         f"{show(want.shape)} and {show(bad.shape)}")
    x, got, want = (t.detach().cpu().double().flatten() for t in (x, got, want))
    bad = bad.detach().cpu().flatten().bool()
    n = x.numel()
    if not bool(bad.any()):
        return ""
    cols = bad.nonzero().flatten().tolist()
    first = cols[0]
    masked = x == -INF
    spans = describe_spans(spans_of(x), n, cuts, unit)
    place = describe_column(first, n, cuts, unit)
    found = f"found {float(got[first]):.6g}, expected {float(want[first]):.6g}"

    if bool(masked.all()):
        why = (f"the row holds only -inf, so its softmax is all zeros; {found} at column {first}. NaN there comes from "
               "exp(-inf - (-inf)) or 0 / 0: subtract 0 when the max is still -inf, and use 1/l = 0 when l = 0")
        return f"{why}."
    tail = cuts[-2] if cuts is not None and len(cuts) >= 3 and cuts[-1] - cuts[-2] < cuts[1] - cuts[0] else None
    if tail is not None and bool(bad[tail:].all()) and not bool(masked[tail:].all()):
        why = (f"every column of the last, partial {unit} [{tail}, {n}) is wrong (found {float(got[tail]):.6g}, expected "
               f"{float(want[tail]):.6g} at column {tail}){' and the others are off a little' if cols[0] < tail else ''}"
               f": check that the last, partial {unit} is included, in pass 1 (its columns count in l) and in pass 2 "
               "(it is written)")
    elif bool(got.isnan().all()) and not bool(masked.any()):
        why = ("every column is NaN, and the row holds no -inf, so no exp(-inf - (-inf)) made it: this row was never "
               "written (memory from torch.empty reads NaN under the kernel rule): check that the grid launches a program "
               "for every row (rows, not rows - 1) and that each program stores its whole row")
    elif bool(got.isnan().any()):
        nan_col = int(got.isnan().nonzero()[0])
        why = (f"NaN from {describe_column(nan_col, n, cuts, unit)}. NaN comes from exp(-inf - (-inf)): a running max "
               f"(of the row, a {unit} or a lane) that is still -inf when another -inf arrives. Guard it in every "
               f"{unit}, the first and the last included: subtract 0 while the max is -inf")
    elif cols == [n - 1]:
        why = (f"only the last column of the row is wrong: {place}; {found}. Usually an off-by-one in the load or "
               "store mask (offs < n_cols - 1 drops the last column; the mask is offs < n_cols)")
    elif bool((got[~masked] == 0).all()):
        why = (f"the whole row came out 0 though it holds finite values ({found} at column {first}): its normaliser l "
               "came out 0, inf or NaN, and 1/l was then taken as 0. A NaN l usually comes from exp(-inf - (-inf)) in a "
               f"{unit} or lane that saw only -inf: subtract 0 while the max is -inf, in every {unit}")
    elif bool(masked[bad].all()):
        why = (f"{place}, which holds -inf, so its probability is exactly 0; {found}. The -inf must reach the exp "
               "(load masked columns as -inf, not 0) and every column must be written from its own input")
    elif _same_factor(got, want, masked) is not None and len(cols) == int((~masked).sum()):
        factor = _same_factor(got, want, masked)
        assert factor is not None  # the condition above
        too = ("too large: something extra went into the sum (a column read twice or from outside the row, a masked "
               "column counted as exp(0), a sum not rescaled by exp(m_old - m_new) when the max grew)"
               if factor < 1 else
               f"too small: columns are missing from the sum (a {unit} skipped in pass 1, or a mask that drops columns)")
        why = (f"every column is off by the same factor, found / expected = {factor:.6g}: the values are right relative "
               f"to each other, so the row's normaliser l is {too}")
    elif cols == list(range(first, n)) and first > 0:
        why = (f"every column from {first} to the end is wrong and none before it: {place}; {found}. The loop over "
               f"{unit}s stops early or starts the later {unit}s at the wrong offset")
    elif abs(float(got[~masked].sum()) - 1) > 1e-2:
        why = (f"{place}; {found}. The row's outputs sum to {float(got[~masked].sum()):.6g}, not 1, and not by one "
               f"factor: the max and sum of pass 1 do not cover the columns that pass 2 writes (a {unit} left out of "
               f"pass 1, or an -inf {unit} that stopped it early), or pass 2 subtracts another max")
    else:
        edge = _at_an_edge(first, cuts)
        why = f"{place}; {found}" + (
            f". It is at a {unit} boundary: look for an off-by-one in the {unit}'s offsets or its load or store mask"
            if edge else "")
    return f"{why}. The row: {spans}."


def worst_in_the_tail(got: torch.Tensor, want: torch.Tensor, cuts: Cuts, unit: str = "block") -> str:
    """A sentence when the largest error of a [rows, n] result lies in the last, partial block of `cuts` (the
    block a loop over whole blocks leaves out), else "". NaN counts as the largest error."""
    if cuts is None or len(cuts) < 3 or cuts[-1] - cuts[-2] >= cuts[1] - cuts[0] or got.shape != want.shape:
        return ""
    err = (got.detach().cpu().double() - want.detach().cpu().double()).abs().nan_to_num(nan=float("inf"))
    err = err.reshape(-1, err.shape[-1])
    if not bool((err > 0).any()):
        return ""
    column = int(err.max(dim=0).values.argmax())
    if column < cuts[-2]:
        return ""
    return (f" The largest error is in the last, partial {unit} [{cuts[-2]}, {cuts[-1]}): check that it is included, "
            f"in pass 1 (its columns count in l) and in pass 2 (it is written).")


def explain_state(x: torch.Tensor, got: float, want: float, cuts: Cuts, unit: str = "chunk", name: str = "l") -> str:
    """Why one row's online-normaliser state came out wrong (`name` "m" or "l", `got` against `want`):
    where the row's max is and where it rises from chunk to chunk, and where its -inf spans sit
    against the chunks."""
    x = x.detach().cpu().double().flatten()
    n = x.numel()
    spans = spans_of(x)
    if name == "m":
        where = "the row holds only -inf, so m = -inf" if not bool((x > -INF).any()) else (
            f"the row max is in {unit} {_block_of(int(x.argmax()), cuts) + 1} [{cuts[_block_of(int(x.argmax()), cuts)]}, "
            f"{cuts[_block_of(int(x.argmax()), cuts) + 1]})" if cuts is not None else "")
        missed = (f"; found {got:.6g}, less than the max: that {unit} was not counted. Every {unit} counts, the ones "
                  f"after a {unit} of only -inf too" if got < want else "")
        return f"{describe_spans(spans, n, cuts, unit)}; {where}{missed}."
    if math.isnan(got):
        ratio = (f"l is NaN, expected {want:.6g}: NaN comes from exp(-inf - (-inf)), a max that is still -inf "
                 "subtracted from another -inf; subtract 0 while the max is -inf")
    elif want > 0 and math.isfinite(got):
        ratio = f"l is {got / want:.6g} times the expected value"
    else:
        ratio = f"l is {got:.6g}, expected {want:.6g}"
    if not spans:
        return f"{ratio}. The row has no -inf; {max_rises(x, cuts, unit)}"
    return (f"{ratio}. The row: {describe_spans(spans, n, cuts, unit)}. A {unit} that holds only -inf has the state "
            f"(-inf, 0): merging it changes nothing, and the {unit}s after it still count; a {unit} that begins with "
            "-inf may still hold finite values, and its max is the largest of them.")


def max_rises(x: torch.Tensor, cuts: Cuts, unit: str = "chunk") -> str:
    """A sentence on where the running max of the row `x` rises from one chunk to a later one."""
    if cuts is None:
        return ""
    running, rises = -INF, []
    for i in range(len(cuts) - 1):
        a, b = cuts[i], cuts[i + 1]
        if b > a:
            top = float(x[a:b].max())
            if top > running:
                if running > -INF:
                    rises.append((i, running, top))
                running = top
    if not rises:
        return f"its max is in the first {unit} that holds values, so no rescale happens: check the sum itself."
    i, old, new = rises[0]
    return (f"its max rises from {old:.4g} to {new:.4g} at {unit} {i + 1} [{cuts[i]}, {cuts[i + 1]}): the sum taken "
            f"before that {unit} was measured against {old:.4g} and must be multiplied by exp({old:.4g} - {new:.4g}) = "
            f"{math.exp(old - new):.4g} before the {unit} is added. Did you rescale the running sum when the max grew?")


def _same_factor(got: torch.Tensor, want: torch.Tensor, masked: torch.Tensor) -> float | None:
    """got / want where the row is not masked, when it is one number for every column (else None)."""
    keep = ~masked & (want > 1e-300) & torch.isfinite(got)
    if int(keep.sum()) < 2 or int(keep.sum()) < int((~masked).sum()):
        return None
    ratio = got[keep] / want[keep]
    lo, hi = float(ratio.min()), float(ratio.max())
    return (lo + hi) / 2 if lo > 0 and hi / lo - 1 < 1e-3 and abs(lo - 1) > 1e-3 else None


def _at_an_edge(col: int, cuts: Cuts) -> bool:
    """Whether `col` starts or ends a block (a tile of 16 or more when cuts=None); never when the blocks
    are so narrow that every column does."""
    if cuts is None:
        return col > 0 and any(col % w in (0, w - 1) for w in TILE_WIDTHS)
    widths = [b - a for a, b in zip(cuts, cuts[1:]) if b > a]
    return min(widths) > 2 and any(col in (c, c - 1) for c in cuts[1:-1])


def _union(spans: list[Span]) -> list[Span]:
    """Overlapping or touching spans merged, sorted."""
    merged: list[list[int]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _randint(rng: torch.Generator, lo: int, hi: int) -> int:
    """A uniform int in [lo, hi) from `rng`."""
    return int(torch.randint(lo, hi, (1,), generator=rng))
