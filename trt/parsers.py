"""Parsers for every form of TensorRT layer information, and for trtexec's per-layer profile.

Inputs (format auto-detected; `parse_layer_info(path, input_format="json"|"log")` forces one):
- inspector JSON / `trtexec --exportLayerInfo`: TensorRT 8.x (one `Myelin` `{ForeignNode[...]}`
  layer), 10.x (Myelin kernels `..._myl<g>_<k>`, Metadata joined by \\x1e / \\x1f), 11.x
  (`I/O Tensors`, split `Format` / `Datatype` keys); detailed (layer objects) or
  LAYER_NAMES_ONLY (`Layers` is a list of strings);
- the builder / trtexec verbose log: `Name: ..., LayerType: ..., Metadata: ...` lines
  (detailed) or `Layer(Type): name, Tactic: ..., in -> out` lines (layer names only);
- `trtexec --exportProfile` JSON, whose names trtexec writes without JSON escaping.
Every failure is a `LayerInfoParseError`: the format detected, where it broke, what was expected.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import InputError
from trt.plan import (
    MAPPING_METADATA,
    MAPPING_NAME,
    MAPPING_RANGE,
    MYELIN_KERNEL,
    PROFILE_SUFFIX,
    EnginePlan,
    Layer,
    Tensor,
    normalize_dtype,
)

REBUILD_DETAILED = (
    "rebuild with detailed profiling verbosity: `python -m pipeline build --verbosity detailed`, "
    "`trtexec --profilingVerbosity=detailed`, or `config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED`"
)


_JSON_START = re.compile(r'\s*(\{|\[\s*[\[{"\]]|\[[ \t]*(\n|$))')


class LayerInfoParseError(InputError):
    def __init__(self, source: str, detected: str, where: str, problem: str, expected: str):
        super().__init__(f"{source}: {detected}: {where}: {problem}; expected {expected}")


@dataclass(frozen=True)
class TimingRecord:
    name: str
    average_ms: float
    total_ms: float | None
    median_ms: float | None
    percentage: float | None


# ---------------------------------------------------------------- layer information


def parse_layer_info(path: Path | str, input_format: str = "auto") -> EnginePlan:
    path = Path(path)
    text = _read_text(path, "layer information")
    if input_format not in ("auto", "json", "log"):
        raise InputError(f"--input-format {input_format!r}: use auto, json or log")
    source = str(path)
    if input_format == "log":
        return _parse_log(source, text)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        # a log line may start with "[timestamp]": JSON only when forced or when nothing else fits
        if input_format == "json" or (_JSON_START.match(text) and not (_DETAILED_LINE.search(text) or _NAMES_LINE.search(text))):
            raise LayerInfoParseError(source, "JSON", f"line {err.lineno} column {err.colno}", err.msg, "inspector JSON as written by trtexec --exportLayerInfo") from err
        return _parse_log(source, text)
    return _parse_json(source, data)


def _read_text(path: Path, what: str) -> str:
    from pipeline.fileio import require_file

    data = require_file(path, f"{what} file", f"pass the {what} file TensorRT or trtexec wrote").read_bytes()
    if not data.strip():
        raise LayerInfoParseError(str(path), "empty file", "byte 0", "the file is empty", f"TensorRT {what}")
    if b"\x00" in data[:65536]:
        raise LayerInfoParseError(str(path), "binary file", f"byte {data.index(0)}", "a NUL byte", f"TensorRT {what} as text (an .engine file is not accepted: export its layer information)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise LayerInfoParseError(str(path), "binary file", f"byte {err.start}", "not UTF-8 text", f"TensorRT {what} as text") from err


def _parse_json(source: str, data: Any) -> EnginePlan:
    if isinstance(data, list) and data and isinstance(data[0], dict) and "count" in data[0]:
        raise LayerInfoParseError(source, "trtexec profile JSON", "top level", "this is per-layer timing, not layer information", "it passed with --timing, and the --exportLayerInfo file as LAYERINFO")
    if not isinstance(data, dict) or not isinstance(data.get("Layers"), list):
        got = type(data).__name__ if not isinstance(data, dict) else f"an object with keys {sorted(data)[:5]}"
        raise LayerInfoParseError(source, "JSON", "top level", f"got {got}", "an object with a 'Layers' list (inspector JSON)")
    raw_layers = data["Layers"]
    version = "11.x" if "I/O Tensors" in data else "8.x-10.x"
    io_tensors = _io_tensor_names(source, data)
    if all(isinstance(item, str) for item in raw_layers):
        layers = [_layer_from_name(name) for name in raw_layers]
        plan = EnginePlan(source, f"inspector JSON, layer names only (TensorRT {version})", "layer_names_only", layers, io_tensors)
    else:
        layers = [_layer_from_object(source, i, item) for i, item in enumerate(raw_layers)]
        if any(_has_split_keys(layer) for layer in raw_layers):
            version = "11.x"
        elif any(layer.myelin_graph is not None and MYELIN_KERNEL.search(layer.base_name) for layer in layers):
            version = "10.x"
        elif any(layer.type == "Myelin" for layer in layers) or not any("Metadata" in item for item in raw_layers):
            version = "8.x"
        plan = EnginePlan(source, f"inspector JSON, detailed (TensorRT {version})", "detailed", layers, io_tensors)
    return _finish(plan)


def _io_tensor_names(source: str, data: dict[str, Any]) -> list[str]:
    if "I/O Tensors" in data:
        tensors = data["I/O Tensors"]
        if not isinstance(tensors, list) or not all(isinstance(t, dict) and isinstance(t.get("Name"), str) for t in tensors):
            raise LayerInfoParseError(source, "inspector JSON (TensorRT 11.x)", "'I/O Tensors'", "not a list of objects with a Name", "the 11.x I/O Tensors schema")
        return [t["Name"] for t in tensors]
    bindings = data.get("Bindings", [])
    return [b for b in bindings if isinstance(b, str)] if isinstance(bindings, list) else []


def _has_split_keys(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    tensors = [t for key in ("Inputs", "Outputs") for t in item.get(key) or [] if isinstance(t, dict)]
    return any("Datatype" in t or "DataType" in t for t in tensors)


def _layer_from_object(source: str, index: int, item: Any) -> Layer:
    where = f"Layers[{index}]"
    if isinstance(item, str):
        raise LayerInfoParseError(source, "inspector JSON", where, "a string among layer objects", "all layers as objects (detailed) or all as strings (names only)")
    if not isinstance(item, dict):
        raise LayerInfoParseError(source, "inspector JSON", where, f"a {type(item).__name__}", "a layer object")
    name, layer_type = item.get("Name"), item.get("LayerType")
    if not isinstance(name, str) or not name:
        raise LayerInfoParseError(source, "inspector JSON", f"{where}.Name", f"got {name!r}", "a non-empty layer name")
    if not isinstance(layer_type, str) or not layer_type:
        raise LayerInfoParseError(source, "inspector JSON", f"{where}.LayerType", f"got {layer_type!r}", "a layer type string such as 'kgen' or 'CaskConvolution'")
    layer = Layer(name=name, type=layer_type, tactic=_str_or_none(item.get("TacticName") or item.get("TacticValue")), origin=_str_or_none(item.get("Origin")))
    for key, target in (("Inputs", layer.inputs), ("Outputs", layer.outputs)):
        tensors = item.get(key) or []
        if not isinstance(tensors, list):
            raise LayerInfoParseError(source, "inspector JSON", f"{where}.{key}", f"a {type(tensors).__name__}", "a list of tensor objects")
        target.extend(_tensor_from_object(t) for t in tensors if isinstance(t, dict))
    metadata = item.get("Metadata")
    if metadata is not None and not isinstance(metadata, str):
        raise LayerInfoParseError(source, "inspector JSON", f"{where}.Metadata", f"a {type(metadata).__name__}", "a string of [ONNX Layer: ...] entries")
    _assign_nodes(layer, metadata)
    return layer


def _tensor_from_object(item: dict[str, Any]) -> Tensor:
    fmt = item.get("Format/Datatype") or item.get("Format")
    dtype = item.get("Datatype") or item.get("DataType") or item.get("Format/Datatype")
    dims = item.get("Dimensions")
    return Tensor(str(item.get("Name", "")), dims if isinstance(dims, list) else None, normalize_dtype(str(dtype)) if dtype else None, str(fmt) if fmt else None)


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


# ---------------------------------------------------------------- builder / trtexec logs

_DETAILED_LINE = re.compile(r"Name: .*?, LayerType: ")
_NAMES_LINE = re.compile(r"Layer\((?P<type>[^)]*)\): (?P<rest>.*)$", re.MULTILINE)
_KEY_AT = re.compile(r", (?=[A-Za-z][A-Za-z/ ]{0,40}: )")


def _parse_log(source: str, text: str) -> EnginePlan:
    lines = text.splitlines()
    detailed = [(n, m.start()) for n, line in enumerate(lines, 1) if (m := _DETAILED_LINE.search(line))]
    if detailed:
        layers = [_layer_from_log_line(source, number, lines[number - 1][start:]) for number, start in detailed]
        return _finish(EnginePlan(source, "builder log, detailed", "detailed", layers))
    names = [(n, m) for n, line in enumerate(lines, 1) if (m := _NAMES_LINE.search(line))]
    if names:
        layers = [_layer_from_names_line(source, number, match) for number, match in names]
        return _finish(EnginePlan(source, "builder log, layer names only", "layer_names_only", layers))
    raise LayerInfoParseError(
        source, "text", f"lines 1-{len(lines)}", "no TensorRT layer lines found",
        "inspector JSON, or a verbose builder log with 'Name: ..., LayerType: ...' (detailed) or 'Layer(Type): ...' (layer names only) lines",
    )


def _split_fields(text: str) -> dict[str, str]:
    """`Key: value, Key: value` at bracket depth 0 (values may hold brackets, braces and commas)."""
    fields, depth, start = {}, 0, 0
    i = 0
    while i < len(text):
        char = text[i]
        if char in "[{(":
            depth += 1
        elif char in "]})":
            depth = max(0, depth - 1)
        elif depth == 0 and text.startswith(", ", i) and _KEY_AT.match(text, i):
            _store(fields, text[start:i])
            start = i + 2
            i += 1
        i += 1
    _store(fields, text[start:])
    return fields


def _store(fields: dict[str, str], part: str) -> None:
    key, sep, value = part.partition(": ")
    if sep:
        fields[key.strip()] = value.strip()


def _layer_from_log_line(source: str, number: int, text: str) -> Layer:
    fields = _split_fields(text)
    if not fields.get("Name") or not fields.get("LayerType"):
        raise LayerInfoParseError(source, "builder log, detailed", f"line {number}", "a layer line without Name or LayerType", "'Name: <layer>, LayerType: <type>, ...'")
    layer = Layer(name=fields["Name"], type=fields["LayerType"], tactic=fields.get("TacticName") or fields.get("TacticValue"), origin=fields.get("Origin"))
    layer.inputs = _log_tensors(fields.get("Inputs", ""))
    layer.outputs = _log_tensors(fields.get("Outputs", ""))
    _assign_nodes(layer, fields.get("Metadata"))
    return layer


def _log_tensors(text: str) -> list[Tensor]:
    tensors = []
    for block in re.findall(r"\{([^{}]*)\}", text):
        fields = _split_fields(block.strip())
        dims = [int(d) for d in re.findall(r"-?\d+", fields.get("Dimensions", ""))] or None
        dtype = fields.get("Datatype") or fields.get("DataType") or fields.get("Format/Datatype")
        tensors.append(Tensor(fields.get("Name", ""), dims, normalize_dtype(dtype), fields.get("Format/Datatype") or fields.get("Format")))
    return tensors


def _layer_from_names_line(source: str, number: int, match: re.Match) -> Layer:
    rest = match["rest"]
    name, sep, io = rest.partition(", Tactic: ")
    if not sep:
        raise LayerInfoParseError(source, "builder log, layer names only", f"line {number}", "no ', Tactic: ' after the layer name", "'Layer(Type): <name>, Tactic: <value>, <inputs> -> <outputs>'")
    layer = _layer_from_name(name.strip())
    layer.type = match["type"] or layer.type
    tactic, _, tensors = io.partition(", ")
    layer.tactic = tactic.strip()
    inputs, _, outputs = tensors.partition(" -> ")
    layer.inputs, layer.outputs = _names_tensors(inputs), _names_tensors(outputs)
    if layer.type == "Myelin" and layer.myelin_graph is None:
        layer.myelin_graph = -1  # numbered in _finish
    return layer


def _names_tensors(text: str) -> list[Tensor]:
    found = re.findall(r"(.+?) \(([A-Za-z0-9]+)\[([^\]]*)\]\)(?:, |$)", text.strip())
    return [Tensor(name, [int(d) for d in re.findall(r"-?\d+", dims)] or None, normalize_dtype(dtype)) for name, dtype, dims in found]


# ---------------------------------------------------------------- ONNX nodes of a layer

_ONNX_ENTRY = re.compile(r"\[ONNX Layer: (.*?)\](?=\[ONNX Layer: |[\x1e\x1f]|\s*$)", re.DOTALL)
_FOREIGN = re.compile(r"^\{ForeignNode\[(?P<inner>.*)\]\}$")
_REFORMAT = re.compile(r"^Reformatting CopyNode for (Input|Output) Tensor \d+ to ")
_TRT_INTERNAL = re.compile(r"^\(Unnamed Layer\* \d+\)|^\[trainStation\d+\]$|\[DevicetoShapeHostCopy\]$")
_INITIALIZER = re.compile(r"\.(weight|bias|running_mean|running_var)$")


def _assign_nodes(layer: Layer, metadata: str | None) -> None:
    """ONNX nodes from Metadata when TensorRT wrote it, else from the layer's name."""
    kernel = MYELIN_KERNEL.search(layer.base_name)
    if kernel:
        layer.myelin_graph = int(kernel["graph"])
    elif layer.type == "Myelin":
        layer.myelin_graph = -1  # a TensorRT 8.x region: numbered in _finish
    if metadata is not None:
        layer.onnx_nodes = _unique(_ONNX_ENTRY.findall(metadata.strip()))
        layer.mapping = MAPPING_METADATA
        _foreign_range(layer)
    else:
        named = _layer_from_name(layer.name)
        layer.onnx_nodes, layer.mapping, layer.foreign_range = named.onnx_nodes, named.mapping, named.foreign_range


def _layer_from_name(name: str) -> Layer:
    """A layer known only by name: `a + b`, `{ForeignNode[a...b]}`, `PWN(a, b)`, reformats."""
    layer = Layer(name=name, type="unknown")
    base = PROFILE_SUFFIX.sub("", name)
    if _REFORMAT.match(base):
        layer.type = "Reformat"
        return layer
    if _foreign_range(layer):
        layer.type, layer.myelin_graph, layer.mapping = "Myelin", -1, MAPPING_RANGE
        return layer
    layer.onnx_nodes = _unique(n for part in _split_top(base, " + ") for n in _names_in(part))
    layer.mapping = MAPPING_NAME
    return layer


def _foreign_range(layer: Layer) -> bool:
    match = _FOREIGN.match(layer.base_name)
    if not match or "..." not in match["inner"]:
        return False
    first, _, last = match["inner"].partition("...")
    layer.foreign_range = (first.split(" + ")[0].strip(), last.split(" + ")[-1].strip())
    return True


def _names_in(part: str) -> list[str]:
    part = part.strip()
    if part.startswith("PWN(") and part.endswith(")"):
        return [n for inner in _split_top(part[4:-1], ", ") for n in _names_in(inner)]
    if not part or _TRT_INTERNAL.search(part) or _INITIALIZER.search(part):
        return []
    return [re.sub(r"_clone_\d+$", "", part)]


def _split_top(text: str, separator: str) -> list[str]:
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        if text[i] in "([{":
            depth += 1
        elif text[i] in ")]}":
            depth -= 1
        elif depth == 0 and text.startswith(separator, i):
            parts.append(text[start:i])
            start = i + len(separator)
            i += len(separator) - 1
        i += 1
    parts.append(text[start:])
    return parts


def _unique(names) -> list[str]:
    return list(dict.fromkeys(n.strip() for n in names if n.strip()))


def _finish(plan: EnginePlan) -> EnginePlan:
    """Check names are unique, number TensorRT 8.x / names-only Myelin regions, note what is missing."""
    seen: dict[str, int] = {}
    for index, layer in enumerate(plan.layers):
        if layer.name in seen:
            raise LayerInfoParseError(
                plan.source, plan.format, f"layers {seen[layer.name]} and {index}", f"duplicate layer name {layer.name!r}",
                "unique layer names in one engine (several engines or profiles concatenated into one file?)",
            )
        seen[layer.name] = index
        profile = PROFILE_SUFFIX.search(layer.name)
        layer.profile = int(profile["index"]) if profile else 0
    regions = iter(range(len(plan.layers)))
    for layer in plan.layers:
        if layer.myelin_graph == -1:
            layer.myelin_graph = next(regions)
    if plan.verbosity == "layer_names_only":
        plan.notes.append(
            "built with LAYER_NAMES_ONLY profiling verbosity: layers carry no [ONNX Layer] Metadata, so ONNX nodes are "
            f"approximated from names and ForeignNode ranges (marked 'name'/'range'); for the exact per-node mapping {REBUILD_DETAILED}"
        )
    elif not any(layer.mapping == MAPPING_METADATA for layer in plan.layers):
        plan.notes.append("no layer has Metadata (TensorRT 8.x): ONNX nodes are approximated from layer names (marked 'name')")
    return plan


# ---------------------------------------------------------------- trtexec --exportProfile

_NUMBER = r"-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?"
_PROFILE_RECORD = re.compile(
    rf'"name"\s*:\s*"(?P<name>.*)"\s*,\s*"timeMs"\s*:\s*(?P<total>{_NUMBER})\s*,\s*"averageMs"\s*:\s*(?P<average>{_NUMBER})'
    rf'(?:\s*,\s*"medianMs"\s*:\s*(?P<median>{_NUMBER}))?(?:\s*,\s*"percentage"\s*:\s*(?P<percentage>{_NUMBER}))?\s*\}}'
)


def parse_timing(path: Path | str) -> list[TimingRecord]:
    """Per-layer times from `trtexec --exportProfile`; names are read verbatim even when not valid JSON."""
    path = Path(path)
    text = _read_text(path, "trtexec --exportProfile timing")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
    if data is not None:
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise LayerInfoParseError(str(path), "JSON", "top level", f"got {type(data).__name__}", "a list [{\"count\": N}, {\"name\", \"timeMs\", \"averageMs\", ...}, ...] (trtexec --exportProfile)")
        records = [r for r in data if "name" in r]
        try:
            return [TimingRecord(str(r["name"]), float(r["averageMs"]), _float(r.get("timeMs")), _float(r.get("medianMs")), _float(r.get("percentage"))) for r in records]
        except (KeyError, TypeError, ValueError) as err:
            raise LayerInfoParseError(str(path), "trtexec profile JSON", "a layer record", f"missing or non-numeric {err}", "averageMs for every named record") from err
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if '"name"' not in line:
            continue
        match = _PROFILE_RECORD.search(line)
        if not match:
            raise LayerInfoParseError(str(path), "trtexec profile JSON (unescaped names)", f"line {number}", "a record without timeMs/averageMs", '{ "name" : ..., "timeMs" : ..., "averageMs" : ... } on one line')
        records.append(TimingRecord(match["name"], float(match["average"]), float(match["total"]), _float(match["median"]), _float(match["percentage"])))
    if not records:
        raise LayerInfoParseError(str(path), "text", "whole file", "no timing records", "trtexec --exportProfile JSON")
    return records


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def merge_timing(plan: EnginePlan, records: list[TimingRecord]) -> list[str]:
    """Set each layer's time_ms (average per inference); return the timing names that match no layer."""
    by_name = {layer.name: layer for layer in plan.layers}
    unmatched = []
    for record in records:
        layer = by_name.get(record.name) or by_name.get(PROFILE_SUFFIX.sub("", record.name))
        if layer is None:
            unmatched.append(record.name)
        else:
            layer.time_ms = (layer.time_ms or 0.0) + record.average_ms
    return unmatched
