"""Per-layer JSON objects (`inspector.get_layer_information(i, JSON)` for every layer), each starting on a line
whose first non-blank character is `{`, between separator lines such as `--- Layer 0 ---`."""

from __future__ import annotations

import json
import re

from trt.parsers.common import LayerInfoParseError, finish, json_problem
from trt.parsers.inspector_json import BadLayer, layer_from_object
from trt.plan import EnginePlan

FORMAT = "per-layer JSON objects (get_layer_information)"
_DECODER = json.JSONDecoder()


def object_starts(text: str) -> list[tuple[int, int]]:
    """(offset, line number) of each line that starts, after blanks, with `{`."""
    starts, offset = [], 0
    for number, line in enumerate(text.split("\n"), 1):
        stripped = line.lstrip(" \t\r")
        if stripped.startswith("{"):
            starts.append((offset + len(line) - len(stripped), number))
        offset += len(line) + 1
    return starts


def looks_like(text: str) -> bool:
    """An object whose first key is "Name" starts a line, after a separator line or before another object."""
    first = _LINE_OBJECT.search(text)
    if first is None or not text[first.end() : first.end() + 40].lstrip().startswith('"Name"'):
        return False
    return first.start() > 0 or _LINE_OBJECT.search(text, first.end()) is not None


_LINE_OBJECT = re.compile(r"^[ \t\r]{0,64}\{", re.MULTILINE)


def parse(source: str, text: str) -> EnginePlan:
    layers, end = [], 0
    for start, line in object_starts(text):
        if start < end:
            continue  # a line inside the object just read
        try:
            item, end = _DECODER.raw_decode(text, start)
        except json.JSONDecodeError as err:
            raise LayerInfoParseError(source, FORMAT, f"line {err.lineno} column {err.colno}", err.msg, "one JSON object per layer between separator lines") from err
        except (ValueError, RecursionError) as err:
            raise LayerInfoParseError(source, FORMAT, f"the object at line {line}", json_problem(err), "one JSON object per layer between separator lines") from err
        try:
            layers.append(layer_from_object(item))
        except BadLayer as bad:
            raise bad.error(source, FORMAT, f"object {len(layers) + 1} (line {line})") from None
    if not layers:
        raise LayerInfoParseError(source, FORMAT, "whole file", "no JSON objects", "one JSON object per layer between separator lines")
    return finish(EnginePlan(source, FORMAT, "detailed", layers))
