"""Per-layer times from `trtexec --exportProfile`. trtexec writes names without JSON escaping, so a name holding
a quote or a backslash makes the file invalid JSON: such a file is read one `{ "name" : ... }` record per line."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, NamedTuple

from trt.parsers.common import LayerInfoParseError, json_problem, loads_json, read_text, text_lines
from trt.plan import PROFILE_SUFFIX, EnginePlan

FORMAT = "trtexec --exportProfile JSON"
EXPECTED = 'a list [{"count": N}, {"name", "timeMs", "averageMs", ...}, ...] (trtexec --exportProfile)'


class TimingRecord(NamedTuple):
    name: str
    average_ms: float
    total_ms: float | None
    median_ms: float | None
    percentage: float | None


def parse_timing(path: Path | str) -> list[TimingRecord]:
    """Per-layer times; names are read verbatim even when the file is not valid JSON."""
    path = Path(path)
    source = str(path)
    text = read_text(path, "trtexec --exportProfile timing")
    try:
        data = loads_json(text)
    except json.JSONDecodeError:
        return _records_from_lines(source, text)
    except (ValueError, RecursionError) as err:
        raise LayerInfoParseError(source, FORMAT, "whole file", json_problem(err), EXPECTED) from err
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise LayerInfoParseError(source, "JSON", "top level", f"got {type(data).__name__}", EXPECTED)
    records = []
    for index, record in enumerate(data):
        name = record.get("name")
        if name is None:
            continue
        if type(name) is not str:
            raise LayerInfoParseError(source, FORMAT, f"record {index}.name", f"a {type(name).__name__}", "a layer name string")
        values = (record.get("averageMs"), record.get("timeMs"), record.get("medianMs"), record.get("percentage"))
        if not _finite_floats(*values):
            values = [_number(source, f"record {index}", key, value, optional=key != "averageMs") for key, value in zip(("averageMs", "timeMs", "medianMs", "percentage"), values)]
        records.append(TimingRecord(name, *values))
    return records


def _finite_floats(a: Any, b: Any, c: Any, d: Any) -> bool:
    """The common case, checked in one call: four finite floats (x - x is nan for inf and nan)."""
    return type(a) is float and type(b) is float and type(c) is float and type(d) is float and a - a == 0 and b - b == 0 and c - c == 0 and d - d == 0


def _number(source: str, where: str, key: str, value: Any, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LayerInfoParseError(source, FORMAT, f"{where}.{key}", "missing or not a number", f"{key} as a number for every named record")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond a double
        number = math.inf
    if not math.isfinite(number):
        if optional:
            return None  # trtexec prints nan/inf percentages when the total time is 0
        raise LayerInfoParseError(source, FORMAT, f"{where}.{key}", "a number out of range (infinite or NaN)", "finite times in milliseconds")
    return number


_NUMBER = r"-?(?:nan|inf|\d{1,30}(?:\.\d{0,30})?(?:[eE][-+]?\d{1,4})?)"
_FIELD = re.compile(rf'\s*"(?P<key>timeMs|averageMs|medianMs|percentage)"\s{{0,8}}:\s{{0,8}}(?P<value>{_NUMBER})\s{{0,8}}(?:,|\}})')
_NAME_OPEN = re.compile(r'"name"\s{0,8}:\s{0,8}"')
_NAME_CLOSE = re.compile(r'"\s{0,8},\s{0,8}"timeMs"')


def _records_from_lines(source: str, text: str) -> list[TimingRecord]:
    records = []
    for number, line in enumerate(text_lines(text), 1):
        opened = _NAME_OPEN.search(line)
        if not opened:
            continue
        closes = list(_NAME_CLOSE.finditer(line, opened.end()))  # the name is verbatim up to the last `", "timeMs"`
        fields, position = {}, closes[-1].end() - len('"timeMs"') if closes else len(line)
        while (field := _FIELD.match(line, position)) is not None:
            fields[field["key"]] = field["value"]
            position = field.end()
        if "averageMs" not in fields:
            raise LayerInfoParseError(source, f"{FORMAT} (unescaped names)", f"line {number}", "a record without timeMs/averageMs", '{ "name" : ..., "timeMs" : ..., "averageMs" : ... } on one line')
        where = f"line {number}"
        records.append(TimingRecord(line[opened.end() : closes[-1].start()], _number(source, where, "averageMs", float(fields["averageMs"])), *(
            _number(source, where, key, float(fields[key]) if key in fields else None, optional=True) for key in ("timeMs", "medianMs", "percentage"))))
    if not records:
        raise LayerInfoParseError(source, "text", "whole file", "no timing records", FORMAT)
    return records


def merge_timing(plan: EnginePlan, records: list[TimingRecord]) -> list[str]:
    """Set each layer's time_ms (average per inference); return the timing names that match no layer."""
    by_name = {layer.name: layer for layer in reversed(plan.layers)}  # a name's first layer
    unmatched = []
    for record in records:
        layer = by_name.get(record.name) or by_name.get(PROFILE_SUFFIX.sub("", record.name))
        if layer is None:
            unmatched.append(record.name)
        else:
            layer.time_ms = (layer.time_ms or 0.0) + record.average_ms
    return unmatched
