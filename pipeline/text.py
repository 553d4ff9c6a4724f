"""Text from models and engine files made safe for a terminal."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with control characters (ESC, OSC, BEL, C1, ...) shown as `\\xNN` escapes; newlines and tabs kept."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
