"""Text from models and engine files made safe for a terminal."""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL and C1 as \xNN; the line and paragraph separators and the bidi
# marks and overrides (which reorder what a terminal shows) as \uNNNN
_ESCAPES = {c: f"\\x{c:02x}" for c in [*range(0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0)]}
_ESCAPES.update({c: f"\\u{c:04x}" for c in (0x200E, 0x200F, 0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A))})
_ONE_LINE_ESCAPES = {**_ESCAPES, 0x09: "\\x09", 0x0A: "\\x0a"}


def printable(text: str, one_line: bool = False) -> str:
    """`text` with control characters (ESC, OSC's BEL, C1, ...) and bidi overrides written as escapes;
    newlines and tabs kept, unless `one_line` (a name in a table or a title)."""
    return text.translate(_ONE_LINE_ESCAPES if one_line else _ESCAPES)


_JSON_UNESCAPED_CONTROL = re.compile(r"[\x7f-\x9f]")


def printable_json(text: str) -> str:
    """JSON text with DEL and C1 characters (which JSON leaves raw) as `\\u00NN` escapes: still
    valid JSON, safe on a terminal. Pure-ASCII JSON without DEL is returned without a scan."""
    if text.isascii() and "\x7f" not in text:
        return text
    return _JSON_UNESCAPED_CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


_NAME_SEPARATORS = re.compile(r"([/_.])")


def html_breakable(text: object):
    """`text` escaped for HTML (a markupsafe Markup) with a line-break opportunity (<wbr>) after each "/", "_" and
    ".": a long name (`/encoder/layers.5/Add_1`) wraps between its parts and at spaces, never inside a word."""
    from markupsafe import Markup, escape

    return Markup(_NAME_SEPARATORS.sub(r"\1<wbr>", str(escape(text))))  # no entity escape() writes holds / _ or .
