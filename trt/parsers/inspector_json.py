"""Inspector JSON, as `IEngineInspector.get_engine_information(JSON)` and `trtexec --exportLayerInfo` write it.

TensorRT 8.x (one `Myelin` `{ForeignNode[...]}` layer per region, often no Metadata), 10.x (Myelin
kernels `..._myl<g>_<k>`, Metadata joined by \\x1e / \\x1f) and 11.x (`I/O Tensors`, split `Format` /
`Datatype` keys); detailed (layer objects) or LAYER_NAMES_ONLY (`Layers` is a list of strings).
"""

from __future__ import annotations

from typing import Any

from trt.parsers.common import LayerInfoParseError, assign_nodes, finish
from trt.plan import MYELIN_KERNEL, EnginePlan, Layer, lowest_precision, normalize_dtype, profile_of

FORMAT = "inspector JSON"
_SAMPLE = 64


def parse(source: str, data: Any) -> EnginePlan:
    if isinstance(data, list) and data and isinstance(data[0], dict) and "count" in data[0]:
        raise LayerInfoParseError(source, "trtexec profile JSON", "top level", "this is per-layer timing, not layer information",
                                  "the --exportLayerInfo file as LAYERINFO; pass this file with --timing")
    if not isinstance(data, dict) or not isinstance(data.get("Layers"), list):
        got = type(data).__name__ if not isinstance(data, dict) else f"an object with keys {sorted(map(str, data))[:5]}"
        raise LayerInfoParseError(source, "JSON", "top level", f"got {got}", "an object with a 'Layers' list (inspector JSON)")
    raw_layers = data["Layers"]
    io_tensors = _io_tensor_names(source, data)
    if all(isinstance(item, str) for item in raw_layers):
        layers = [assign_nodes(Layer(name=name, type="unknown"), None) for name in raw_layers]
        version = "11.x" if "I/O Tensors" in data else "8.x-10.x"
        return finish(EnginePlan(source, f"{FORMAT}, layer names only (TensorRT {version})", "layer_names_only", layers, io_tensors))
    layers: list[Layer] = []
    try:
        for item in raw_layers:
            layers.append(layer_from_object(item))
    except BadLayer as bad:
        raise bad.error(source, FORMAT, f"Layers[{len(layers)}]") from None
    return finish(EnginePlan(source, f"{FORMAT}, detailed (TensorRT {_version(data, raw_layers, layers)})", "detailed", layers, io_tensors))


def _version(data: dict[str, Any], raw_layers: list[Any], layers: list[Layer]) -> str:
    """Told by the schema, which is the same for every layer of a file: the first ones are enough."""
    raw_layers = raw_layers[:_SAMPLE]
    if "I/O Tensors" in data or any(_has_split_keys(item) for item in raw_layers):
        return "11.x"
    if any(layer.myelin_graph is not None and MYELIN_KERNEL.search(layer.base_name) for layer in layers):
        return "10.x"
    if any(layer.type == "Myelin" for layer in layers) or not any(isinstance(item, dict) and "Metadata" in item for item in raw_layers):
        return "8.x"
    return "8.x-10.x"


def _io_tensor_names(source: str, data: dict[str, Any]) -> list[str]:
    if "I/O Tensors" in data:
        tensors = data["I/O Tensors"]
        if not isinstance(tensors, list) or not all(isinstance(t, dict) and isinstance(t.get("Name"), str) for t in tensors):
            raise LayerInfoParseError(source, f"{FORMAT} (TensorRT 11.x)", "'I/O Tensors'", "not a list of objects with a Name", "the 11.x I/O Tensors schema")
        return [t["Name"] for t in tensors]
    bindings = data.get("Bindings", [])
    return [b for b in bindings if isinstance(b, str)] if isinstance(bindings, list) else []


def _has_split_keys(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    tensors = [t for key in ("Inputs", "Outputs") if isinstance(item.get(key), list) for t in item[key] if isinstance(t, dict)]
    return any("Datatype" in t or "DataType" in t for t in tensors)


class BadLayer(Exception):
    """A layer object that does not fit the schema; the caller adds where it is."""

    def __init__(self, key: str, problem: str, expected: str):
        super().__init__(problem)
        self.key, self.problem, self.expected = key, problem, expected

    def error(self, source: str, detected: str, where: str) -> LayerInfoParseError:
        return LayerInfoParseError(source, detected, where + self.key, self.problem, self.expected)


def layer_from_object(item: Any) -> Layer:
    """One detailed layer object (also what get_layer_information(i, JSON) returns)."""
    if type(item) is not dict:
        raise BadLayer("", "a string among layer objects" if isinstance(item, str) else f"a {type(item).__name__}",
                       "all layers as objects (detailed) or all as strings (names only)")
    name, layer_type = item.get("Name"), item.get("LayerType")
    if type(name) is not str or not name:
        raise BadLayer(".Name", f"got {_short(name)}", "a non-empty layer name")
    if type(layer_type) is not str or not layer_type:
        raise BadLayer(".LayerType", f"got {_short(layer_type)}", "a layer type string such as 'kgen' or 'CaskConvolution'")
    tactic, origin = item.get("TacticName") or item.get("TacticValue"), item.get("Origin")
    layer = Layer(name=name, type=layer_type, tactic=_str_or_none(tactic), origin=_str_or_none(origin))
    types, first_output, profile = [], None, 0
    for key in ("Inputs", "Outputs"):
        tensors = item.get(key) or []
        if type(tensors) is not list:
            raise BadLayer(f".{key}", f"a {type(tensors).__name__}", "a list of tensor objects")
        for position, tensor in enumerate(tensors):
            if type(tensor) is not dict:
                continue
            dtype = tensor.get("Format/Datatype") or tensor.get("Datatype") or tensor.get("DataType")
            dtype = normalize_dtype(dtype) if type(dtype) is str else None
            if dtype:
                types.append(dtype)
                if key == "Outputs" and position == 0:
                    first_output = dtype
            tensor_name = tensor.get("Name")
            if type(tensor_name) is str and " [profile " in tensor_name:
                profile = max(profile, profile_of(tensor_name) or 0)
    layer.precision, layer.tensor_profile = lowest_precision(types, first_output), profile
    metadata = item.get("Metadata")
    if metadata is not None and type(metadata) is not str:
        raise BadLayer(".Metadata", f"a {type(metadata).__name__}", "a string of [ONNX Layer: ...] entries")
    return assign_nodes(layer, metadata)


def _str_or_none(value: Any) -> str | None:
    return str(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None


def _short(value: Any) -> str:
    """A value for an error message, without repr() of input-sized (or deeply nested) structures."""
    if value is None or isinstance(value, (bool, int, float, str)):
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."
    return f"a {type(value).__name__}"
