"""A predicted engine, as `python -m pipeline predict --format json` writes it (the report JSON with
`predicted: true`): read back into the plan a real engine is read into, so `report` and `diff` take a
prediction as one side."""

from __future__ import annotations

from typing import Any

from trt.parsers.common import LayerInfoParseError
from trt.plan import MAPPING_METADATA, EnginePlan, Layer

FORMAT = "predicted engine (python -m pipeline predict)"
EXPECTED = "the JSON `python -m pipeline predict --format json` writes"


def weight_only_phrase(kind: str, gemms: int) -> str:
    """How a prediction names a weight-only model's weights (its verdict, and the note `report` gives it read back)."""
    each = f"{gemms} GEMMs, each dequantizing its weight" if gemms != 1 else "1 GEMM, dequantizing its weight"
    return f"{kind} weights ({each} inside its kernel)"


def looks_like(data: Any) -> bool:
    return isinstance(data, dict) and data.get("predicted") is True


def parse(source: str, data: dict[str, Any]) -> EnginePlan:
    items = data.get("layers")
    if not isinstance(items, list):
        raise LayerInfoParseError(source, FORMAT, "top level", "no 'layers' list", EXPECTED)
    layers = []
    for index, item in enumerate(items):
        try:
            layers.append(_layer(item))
        except (KeyError, TypeError, ValueError) as err:
            raise LayerInfoParseError(source, FORMAT, f"layers[{index}]", f"{type(err).__name__}: {err}", EXPECTED) from None
    target = data.get("target") or {}
    source_format = (data.get("source") or {}).get("format") or f"prediction (TensorRT {target.get('trt_major', '?')}.x)"
    notes = ["a prediction from the ONNX alone, not an engine TensorRT built"]
    weight_only = target.get("weight_only")
    if weight_only:
        notes.append(f"a weight-only model: {weight_only_phrase(*weight_only)}")
    return EnginePlan(source, str(source_format), "detailed", layers, notes=notes).settle()


def _layer(item: dict[str, Any]) -> Layer:
    nodes = item["onnx_nodes"]
    if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
        raise ValueError("onnx_nodes is not a list of names")
    graph = item.get("myelin_graph")
    return Layer(name=str(item["name"]), type=str(item["type"]), onnx_nodes=list(nodes), mapping=MAPPING_METADATA,
                 precision=item.get("precision"), origin=item.get("origin"), myelin_graph=None if graph is None else int(graph),
                 profile=int(item.get("profile") or 0))
