"""Make student text inert: safe to print on a terminal and to hand to any renderer.

A message or traceback can hold anything a student's code raised or printed. On a terminal, escape
sequences clear the screen, move the cursor (and so draw a fake score row), set the window title or
write hyperlinks; elsewhere control characters break files and bidi overrides show text in an order
other than the one stored. `inert` removes all of that and keeps the rest, lines and tabs included.
It is not an escaper for any markup: rich markup is avoided by printing `rich.text.Text` (or with
``markup=False``), HTML is escaped by the feedback page, and so on. Apply it where student text
enters a result and again in every renderer.
"""

from __future__ import annotations

import re
from typing import Any

# Escape sequences (ECMA-48), 7-bit and 8-bit forms:
#   CSI  ESC [ or 0x9B, parameters 0x30-0x3F, intermediates 0x20-0x2F, one final byte 0x40-0x7E;
#   OSC, DCS, SOS, PM, APC  ESC ] P X ^ _ or 0x9D 0x90 0x98 0x9E 0x9F, a payload, then ST (ESC \ or 0x9C)
#        or, for OSC, BEL; an unterminated one is removed to the end of its line;
#   any other  ESC and one byte 0x20-0x7E (ESC c resets the terminal, ESC 7 / ESC 8 move the cursor).
_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?"
    r"|(?:\x1b[\]PX^_]|[\x9d\x90\x98\x9e\x9f])[^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[\x20-\x7e]?"
)
# What is left that a terminal or a viewer would act on: C0 controls but tab and newline, DEL, C1
# controls, bidi embeddings, overrides and isolates, and lone surrogates (no encoder writes those).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_LINE_SEPARATORS = re.compile("\r\n|[\r\u2028\u2029]")
CUT = "\n... ({} more characters cut)"


def inert(text: Any, limit: int | None = None) -> str:
    """`text` as a string with no escape sequence and no control character but newline and tab.

    Sequences go whole (an OSC or DCS payload up to its terminator, or to the end of its line when it
    has none); carriage returns and Unicode line separators become newlines, so a CR cannot rewind a
    line to overwrite it. With `limit`, at most that many characters are kept and a last line says
    how many were cut. The work is bounded by the limit, not by the length of `text`.
    """
    text = text if isinstance(text, str) else str(text)
    length = len(text)
    if limit is not None:
        text = text[: 4 * limit + 64]  # stripping only ever shortens: this is enough to fill `limit`
    if not (text.isascii() and text.isprintable()):
        text = _SEQUENCE.sub("", text)
        text = _LINE_SEPARATORS.sub("\n", text)
        text = _CONTROL.sub("", text)
    if limit is not None and (len(text) > limit or length > 4 * limit + 64):
        return text[:limit] + CUT.format(max(length - limit, 1))
    return text


def inert_all(value: Any) -> Any:
    """Every string in a JSON-like value (dict keys too) made inert; other values as they are."""
    if isinstance(value, str):
        return inert(value)
    if isinstance(value, dict):
        return {inert(k) if isinstance(k, str) else k: inert_all(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [inert_all(v) for v in value]
    return value
