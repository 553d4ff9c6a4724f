"""`polygraphy inspect model X.engine --show layers [attrs ...]` output: `Layer 0 | name [Op: type]`, its tensors
`{x [dtype=float32, shape=(...)]} -> {...}`, then `---- Attributes ----` lines. Polygraphy prints no Metadata
(up to 0.49), so ONNX nodes come from layer names unless a `Metadata = ...` attribute is there."""

from __future__ import annotations

import re

from trt.parsers.common import LayerInfoParseError, assign_nodes, finish, text_lines
from trt.plan import EnginePlan, Layer, normalize_dtype, set_tensors

FORMAT = "polygraphy inspect model --show layers"
_LAYER_HEAD = re.compile(r"[ \t]{0,40}Layer (?P<index>\d{1,9})[ \t]{1,40}\| ")
_TENSOR_END = re.compile(r" ?\[dtype=(?P<dtype>[A-Za-z0-9_]{1,20}), shape=\([-0-9, ]{0,400}\)(?:, Format: [^\]\n]{0,100})?\]")
_ATTRIBUTES = "---- Attributes ----"


def is_polygraphy(text: str) -> bool:
    return any(_LAYER_HEAD.match(line) and " [Op: " in line for line in text_lines(text))


def parse(source: str, text: str) -> EnginePlan:
    blocks, current = [], None
    for number, line in enumerate(text_lines(text), 1):
        head = _LAYER_HEAD.match(line)
        if head and " [Op: " in line:
            current = []
            blocks.append((number, line[head.end() :], current))
        elif current is not None:
            if line.strip() and not line[:1].isspace():
                current = None  # the layer list has ended
            else:
                current.append(line.strip())
    if not blocks:
        raise LayerInfoParseError(source, FORMAT, "whole file", "no 'Layer N | name [Op: type]' lines", "the output of `polygraphy inspect model X.engine --show layers`")
    return finish(EnginePlan(source, FORMAT, "detailed", [_layer(source, *block) for block in blocks]))


def _layer(source: str, number: int, head: str, lines: list[str]) -> Layer:
    """One layer from its head line and the lines below it: tensors, then `---- Attributes ----` `key = value`."""
    name, sep, op = head.rstrip().rpartition(" [Op: ")
    if not sep or not op.endswith("]") or not name.strip():
        raise LayerInfoParseError(source, FORMAT, f"line {number}", "a layer line without ' [Op: <type>]'", "'Layer N | <name> [Op: <type>]'")
    cut = lines.index(_ATTRIBUTES) if _ATTRIBUTES in lines else len(lines)
    attributes = {key.strip(): value.strip() for key, sep, value in (line.partition(" = ") for line in lines[cut + 1 :]) if sep}
    inputs, outputs = _split_io([line for line in lines[:cut] if line])
    origin = attributes.get("Origin")
    layer = Layer(name=name.strip(), type=op[:-1].strip() or "unknown", tactic=attributes.get("Tactic") or None,
                  origin=None if origin in (None, "", "Unknown") else origin)
    set_tensors(layer, _tensors(inputs), _tensors(outputs))
    return assign_nodes(layer, attributes.get("Metadata"))


def _split_io(lines: list[str]) -> tuple[str, str]:
    for index, line in enumerate(lines):
        if line.startswith("-> "):
            return " ".join(lines[:index]), " ".join(lines[index:])[3:]
    return " ".join(lines), ""


def _tensors(text: str) -> list[tuple[str, str | None]]:
    """`{a [dtype=float32, shape=(-1, 10), Format: Float], b [...]}`: each tensor ends at its attributes."""
    tensors, start = [], 0
    for match in _TENSOR_END.finditer(text):
        name = text[start : match.start()].strip().lstrip("{,").strip()
        tensors.append((name, normalize_dtype(match["dtype"])))
        start = match.end()
    return tensors
