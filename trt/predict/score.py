"""How well a prediction matches the engine TensorRT really built from the same ONNX: layer, Q/DQ and Myelin
region counts, and the grouping of compute nodes into layers as pair F1. A real engine may name a node only by
the weight it reads (`layer1.0.conv1.weight + QuantizeLinear_20 + Conv_22`)."""

from __future__ import annotations

import re
from itertools import combinations
from typing import Any

from pipeline.core.graph import QDQ_OPS
from trt.onnx_graph import OnnxGraph
from trt.parsers.common import split_top
from trt.plan import EnginePlan, Layer, without_profile
from trt.predict import predict
from trt.report import build_report

COPY_PREFIX = "Reformatting CopyNode"  # the layers TensorRT adds to change a tensor's format or type


def counts(plan: EnginePlan) -> dict[str, int]:
    """Layers, layers that are not format copies, standalone Q/DQ layers and Myelin regions (profile 0)."""
    layers = [layer for layer in plan.layers if layer.profile == 0]
    return {
        "layers": len(layers),
        "layers_without_copies": sum(not without_profile(layer.name).startswith(COPY_PREFIX) for layer in layers),
        "standalone_qdq": sum(layer.qdq for layer in layers),
        "myelin_regions": sum(1 for region in plan.regions if region.kind == "myelin" and region.profile == 0),
    }


def node_layers(plan: EnginePlan, graph: OnnxGraph) -> dict[str, set[int]]:
    """Each compute node of `graph` the plan names -> the layers (profile 0) holding it; a weight a layer names
    stands for the nodes reading it (through its Q/DQ)."""
    found: dict[str, set[int]] = {}
    for index, layer in enumerate(plan.layers):
        if layer.profile != 0:
            continue
        for name in {*layer.onnx_nodes, *_by_weight(layer, graph)}:
            node = graph.by_name.get(name)
            if node is not None and node.op_type not in QDQ_OPS and node.op_type != "Constant":
                found.setdefault(name, set()).add(index)
    return found


def _by_weight(layer: Layer, graph: OnnxGraph) -> list[str]:
    """The nodes reading the weights a layer's name shows, through the weights' Q/DQ."""
    found = []
    for part in split_top(without_profile(layer.name), " + "):
        frontier = [part.strip()] if part.strip() in graph.initializers else []
        for _ in range(4):
            readers = [r for tensor in frontier for r in graph.consumers(tensor)]
            found += [r.name for r in readers if r.op_type not in QDQ_OPS]
            frontier = [o for r in readers if r.op_type in QDQ_OPS for o in r.output]
    return found


def pair_f1(predicted: dict[str, set[int]], real: dict[str, set[int]]) -> dict[str, Any]:
    """Pairs of the nodes both name: together in one layer in the prediction, in the real engine, in both."""
    nodes = sorted(predicted.keys() & real.keys())
    both = predicted_pairs = real_pairs = 0
    for a, b in combinations(nodes, 2):
        in_predicted, in_real = bool(predicted[a] & predicted[b]), bool(real[a] & real[b])
        predicted_pairs += in_predicted
        real_pairs += in_real
        both += in_predicted and in_real
    precision = both / predicted_pairs if predicted_pairs else 1.0
    recall = both / real_pairs if real_pairs else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"nodes": len(nodes), "pairs_real": real_pairs, "pairs_predicted": predicted_pairs, "pairs_both": both,
            "precision": round(precision, 4), "recall": round(recall, 4), "f1": round(f1, 4)}


def score(predicted: EnginePlan, real: EnginePlan, graph: OnnxGraph) -> dict[str, Any]:
    """The prediction against the real engine, both read against the ONNX `graph` they were built from."""
    build_report(real, graph)  # resolves a names-only engine's ForeignNode ranges against the graph
    ours, theirs = counts(predicted), counts(real)
    figures = {key: {"predicted": ours[key], "real": theirs[key]} for key in ours}
    for key in ("layers", "layers_without_copies"):
        figures[key]["error"] = round((ours[key] - theirs[key]) / max(1, theirs[key]), 4)
    figures["grouping"] = pair_f1(node_layers(predicted, graph), node_layers(real, graph))
    return figures


def agreement(figures: dict[str, Any], tolerance: float = 0.10, min_f1: float = 0.95) -> dict[str, bool]:
    """Which of the targets a score meets: Q/DQ and region counts exact, layers within `tolerance`, pair F1."""
    return {
        "standalone_qdq": figures["standalone_qdq"]["predicted"] == figures["standalone_qdq"]["real"],
        "myelin_regions": figures["myelin_regions"]["predicted"] == figures["myelin_regions"]["real"],
        "layers": abs(figures["layers"]["error"]) <= tolerance,
        "layers_without_copies": abs(figures["layers_without_copies"]["error"]) <= tolerance,
        "grouping": figures["grouping"]["f1"] >= min_f1,
    }


def engine_version(plan: EnginePlan, default: int = 10) -> int:
    """The TensorRT major version a layer information file names in its format (`... (TensorRT 8.x)`), else `default`."""
    found = re.search(r"TensorRT (\d+)", plan.format)
    return int(found[1]) if found else default


def score_engine(model, path: str, real: EnginePlan, rules, max_sequence: int | None = None) -> dict[str, Any]:
    """A build's prediction scored against the engine it built: what the report stage records in the manifest
    and `jobs gather` shows beside the latency."""
    prediction = predict(model, rules, "auto", engine_version(real), max_sequence, path)
    figures = score(prediction.plan, real, prediction.graph)
    return {"verdict": prediction.verdict, **figures, "meets": agreement(figures)}
