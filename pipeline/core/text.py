"""Text from models and engine files made safe for a terminal."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with control characters (ESC, OSC, BEL, C1, ...) shown as `\\xNN` escapes; newlines and tabs kept."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


_JSON_UNESCAPED_CONTROL = re.compile(r"[\x7f-\x9f]")


def printable_json(text: str) -> str:
    """JSON text with DEL and C1 characters (which JSON leaves raw) as `\\u00NN` escapes: still
    valid JSON, safe on a terminal. Pure-ASCII JSON without DEL is returned without a scan."""
    if text.isascii() and "\x7f" not in text:
        return text
    return _JSON_UNESCAPED_CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
