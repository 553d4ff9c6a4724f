"""One-line layer information (`Name: ..., LayerType: ..., Inputs: [...], ..., Metadata: ...`), as ONELINE,
`trtexec --dumpLayerInfo` and detailed builder logs print it. Fields are found by key with str.find: linear
whatever a line holds, and names may contain commas, brackets and braces."""

from __future__ import annotations

import re

from trt.parsers.common import LayerInfoParseError, assign_nodes
from trt.plan import Layer, normalize_dtype, set_tensors

# a log prefix some writers put before each line: `[07/07/2026-02:11:38] [I] `
_LOG_PREFIX = re.compile(r"(?:\[[^\]\n]{0,64}\] ?){1,4}")
_NAME, _TYPE, _METADATA = "Name: ", ", LayerType: ", "Metadata:"
_TENSOR_START = "{ Name: "
_TENSOR_NAME_END = re.compile(r", (?:Location|Dimensions|Format/Datatype|Format|Datatype|DataType): ")
_TENSOR_TYPE = re.compile(r"(?:Format/Datatype|Datatype|DataType): ([^}]*)}")


def layer_body(line: str) -> str | None:
    """The line from `Name: ` on when it is a one-line layer record, else None."""
    body = line
    if line.startswith("["):
        prefix = _LOG_PREFIX.match(line)
        body = line[prefix.end() :] if prefix else line
    return body if body.startswith(_NAME) and _TYPE in body else None


def layer_from_line(source: str, detected: str, number: int, body: str) -> Layer:
    name, _, rest = body[len(_NAME) :].partition(_TYPE)
    layer_type, _, fields = rest.partition(", ")
    if not name.strip() or not layer_type.strip():
        raise LayerInfoParseError(source, detected, f"line {number}", "a layer line without Name or LayerType", "'Name: <layer>, LayerType: <type>, ...'")
    metadata = None
    cut = _metadata_start(fields)
    if cut is not None:
        metadata = fields[cut + len(_METADATA) :].strip()
        fields = fields[:cut]
    layer = Layer(name=name.strip(), type=layer_type.strip(), tactic=_value(fields, "TacticName") or _value(fields, "TacticValue"), origin=_value(fields, "Origin"))
    set_tensors(layer, _tensors(_list_after(fields, "Inputs: [")), _tensors(_list_after(fields, "Outputs: [")))
    return assign_nodes(layer, metadata)


def _metadata_start(fields: str) -> int | None:
    """Where `Metadata:` starts: the last field, possibly empty (an empty Metadata means no ONNX node)."""
    if fields.startswith(_METADATA):
        return 0
    cut = fields.rfind(", " + _METADATA)
    return cut + 2 if cut != -1 else None


def _value(fields: str, key: str) -> str | None:
    """The value of `, Key: value` (up to the next `, `), when the key is there."""
    marker = f"{key}: "
    start = fields.find(", " + marker)
    if start == -1:
        if not fields.startswith(marker):
            return None
        start = -2
    start += 2 + len(marker)
    end = fields.find(", ", start)
    value = fields[start : end if end != -1 else len(fields)].strip()
    return value or None


def _list_after(fields: str, marker: str) -> str:
    """The tensor list after `Inputs: [` / `Outputs: [`, up to the ` }]` that closes it."""
    start = fields.find(marker)
    if start == -1:
        return ""
    start += len(marker)
    if fields.startswith("]", start):
        return ""
    end = fields.find(" }]", start)
    return fields[start : end + 2 if end != -1 else len(fields)]


def _tensors(text: str) -> list[tuple[str, str | None]]:
    """`{ Name: x, Location: Device, Dimensions: [1,3], Format/Datatype: Half }, { Name: ... }`: names and types."""
    tensors = []
    for piece in text.split(_TENSOR_START)[1:]:
        end = _TENSOR_NAME_END.search(piece)
        dtype = _TENSOR_TYPE.search(piece)
        tensors.append(((piece[: end.start()] if end else piece.rstrip(" },")).strip(), normalize_dtype(dtype[1].strip()) if dtype else None))
    return tensors
