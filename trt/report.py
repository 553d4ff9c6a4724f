"""The fusion report: which ONNX nodes run in which engine layer (Myelin kernels in particular),
rolled up to the torch modules they came from, with findings a user can act on.

`build_report(plan, graph)` returns a plain dict whose keys are fixed by DESIGN.md
(`source`, `layers`, `summary`), plus `breakdown`, `coverage`, `modules` and `findings`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from trt.onnx_graph import DATA_MOVEMENT_OPS, QDQ_OPS, OnnxGraph, scope_of_name
from trt.plan import MAPPING_RANGE, EnginePlan, Layer

ROOT = "(root)"
UNMAPPED = "(no ONNX node)"


def build_report(plan: EnginePlan, graph: OnnxGraph | None = None, depth: int = 2, unmatched_timing: list[str] | None = None) -> dict[str, Any]:
    if graph is not None:
        _resolve_ranges(plan, graph)
    referenced = list(dict.fromkeys(n for layer in plan.layers for n in layer.onnx_nodes))
    timed = [layer for layer in plan.layers if layer.time_ms is not None]
    resolved = [n for n in referenced if n in graph.by_name] if graph else None
    summary = {
        "layers": len(plan.layers),
        "myelin_layers": sum(layer.myelin for layer in plan.layers),
        "myelin_graphs": len({layer.myelin_graph for layer in plan.layers if layer.myelin}),
        "metadata_onnx_nodes": len(referenced),
        "resolved_onnx_nodes": len(resolved) if resolved is not None else None,
        "unresolved_onnx_nodes": [n for n in referenced if n not in graph.by_name] if graph else [],
        "timed_layers": len(timed),
        "total_time_ms": round(sum(layer.time_ms for layer in timed), 6) if timed else None,
    }
    return {
        "source": {
            "layer_info": plan.source,
            "format": plan.format,
            "verbosity": plan.verbosity,
            "onnx": graph.path if graph else None,
            "io_tensors": plan.io_tensors,
        },
        "layers": [_layer_json(layer) for layer in plan.layers],
        "summary": summary,
        "breakdown": _breakdown(plan),
        "coverage": _coverage(graph, set(referenced)) if graph else None,
        "modules": rollup(plan, graph, depth),
        "module_depth": depth,
        "findings": _findings(plan, summary, graph, unmatched_timing or []),
    }


def _layer_json(layer: Layer) -> dict[str, Any]:
    return {
        "name": layer.name,
        "type": layer.type,
        "myelin": layer.myelin,
        "myelin_graph": layer.myelin_graph,
        "onnx_nodes": layer.onnx_nodes,
        "precision": layer.precision,
        "time_ms": layer.time_ms,
        "mapping": layer.mapping,
        "origin": layer.origin,
        "tactic": layer.tactic,
        "profile": layer.profile,
    }


def _resolve_ranges(plan: EnginePlan, graph: OnnxGraph) -> None:
    """`{ForeignNode[first...last]}` -> the ONNX nodes between them in topological order (approximate)."""
    for layer in plan.layers:
        if layer.mapping != MAPPING_RANGE or not layer.foreign_range or layer.onnx_nodes:
            continue
        first, last = (_position(graph, name) for name in layer.foreign_range)
        if first is None and last is None:
            plan.notes.append(f"neither end of {layer.name!r} is in {graph.path}: its ONNX nodes are unknown")
            continue
        for end, found in zip(layer.foreign_range, (first, last)):
            if found is None:
                plan.notes.append(f"{end!r} (an end of {layer.name!r}) is not in {graph.path}: the range runs to the graph's boundary instead")
        start, stop = sorted((0 if first is None else first, len(graph.nodes) - 1 if last is None else last))
        layer.onnx_nodes = [n.name for n in graph.nodes[start : stop + 1] if n.op_type != "Constant"]


def _position(graph: OnnxGraph, name: str) -> int | None:
    if name in graph.position:
        return graph.position[name]
    producer = graph.producer.get(name)  # TensorRT sometimes names a region by a tensor
    return graph.position[producer.name] if producer else None


def _breakdown(plan: EnginePlan) -> dict[str, Any]:
    kernels = Counter(layer.myelin_graph for layer in plan.layers if layer.myelin)
    return {
        "layer_types": dict(Counter(layer.type for layer in plan.layers).most_common()),
        "precisions": dict(Counter(layer.precision or "unknown" for layer in plan.layers).most_common()),
        "myelin_kernels_per_graph": {str(g): n for g, n in sorted(kernels.items())},
        "qdq_layers": [layer.name for layer in plan.layers if _is_qdq_layer(layer)],
    }


def _is_qdq_layer(layer: Layer) -> bool:
    """A layer that only quantizes or dequantizes (TensorRT 8.x `Origin: QDQ`, or Q/DQ-only Metadata)."""
    if layer.origin == "QDQ":
        return True
    return bool(layer.onnx_nodes) and all(_looks_qdq(n) for n in layer.onnx_nodes)


def _looks_qdq(name: str) -> bool:
    return "QuantizeLinear" in name or "DequantizeLinear" in name


def _coverage(graph: OnnxGraph, referenced: set[str]) -> dict[str, Any]:
    """ONNX nodes that appear in no layer, split by why that is expected or not."""
    folded = graph.constant_like()
    groups: dict[str, list[str]] = {"folded_constants_and_shapes": [], "data_movement": [], "qdq": [], "compute": []}
    for node in graph.nodes:
        if node.name in referenced:
            continue
        if node.name in folded:
            groups["folded_constants_and_shapes"].append(node.name)
        elif node.op_type in QDQ_OPS:
            groups["qdq"].append(node.name)
        elif node.op_type in DATA_MOVEMENT_OPS:
            groups["data_movement"].append(node.name)
        else:
            groups["compute"].append(node.name)
    return {
        "onnx_nodes": len(graph.nodes),
        "in_layers": sum(1 for n in graph.nodes if n.name in referenced),
        "not_in_layers": {key: {"count": len(names), "nodes": names} for key, names in groups.items()},
    }


def module_of(name: str, graph: OnnxGraph | None, depth: int) -> str:
    node = graph.by_name.get(name) if graph else None
    scope = node.scope if node is not None and node.scope else scope_of_name(name)
    return "/".join(scope[:depth]) or ROOT


def rollup(plan: EnginePlan, graph: OnnxGraph | None, depth: int) -> list[dict[str, Any]]:
    """Per torch module (scope truncated to `depth`): ONNX nodes, engine layers, Myelin kernels, time.

    A layer counts in every module it has nodes of; its time is shared among them by node count.
    """
    rows: dict[str, dict[str, Any]] = defaultdict(lambda: {"onnx_nodes": 0, "layers": 0, "myelin_kernels": 0, "time_ms": None, "precisions": Counter()})
    for layer in plan.layers:
        modules = Counter(module_of(n, graph, depth) for n in layer.onnx_nodes) or Counter({UNMAPPED: 1})
        total = sum(modules.values())
        for module, count in modules.items():
            row = rows[module]
            row["layers"] += 1
            row["myelin_kernels"] += layer.myelin
            row["precisions"][layer.precision or "unknown"] += 1
            if layer.time_ms is not None:
                row["time_ms"] = (row["time_ms"] or 0.0) + layer.time_ms * count / total
    folded = graph.constant_like() if graph else set()
    names = [n.name for n in graph.nodes if n.name not in folded] if graph else {n for layer in plan.layers for n in layer.onnx_nodes}
    for name in names:
        rows[module_of(name, graph, depth)]["onnx_nodes"] += 1
    return [
        {"module": module, **{k: v for k, v in row.items() if k != "precisions"}, "precisions": dict(row["precisions"]),
         "time_ms": round(row["time_ms"], 6) if row["time_ms"] is not None else None}
        for module, row in rows.items()
    ]


def _findings(plan: EnginePlan, summary: dict[str, Any], graph: OnnxGraph | None, unmatched_timing: list[str]) -> list[str]:
    findings = list(plan.notes)
    graphs = summary["myelin_graphs"]
    outside = [layer for layer in plan.layers if not layer.myelin and layer.type not in ("Reformat", "NoOp")]
    if graphs > 1:
        findings.append(
            f"the network runs as {graphs} Myelin graphs with {len(outside)} non-Myelin layers between/around them: "
            "each boundary is a separate launch and a memory round-trip; `python -m pipeline diff` against the FP16 "
            "engine lists the Q/DQ nodes at each cut"
        )
    qdq = [layer for layer in plan.layers if _is_qdq_layer(layer)]
    if qdq:
        findings.append(
            f"{len(qdq)} layers only quantize/dequantize (e.g. {qdq[0].name!r}): each is its own kernel and memory pass. "
            "Expected for the network input; elsewhere it means TensorRT could not fuse the Q/DQ into a neighbouring "
            "GEMM/Conv: `python -m pipeline lint-qdq` names the placements TensorRT's rules reject"
        )
    if graph is not None and summary["unresolved_onnx_nodes"]:
        count, total = len(summary["unresolved_onnx_nodes"]), summary["metadata_onnx_nodes"]
        findings.append(
            f"{count} of {total} ONNX node names in the engine are not in {graph.path} "
            f"(e.g. {summary['unresolved_onnx_nodes'][0]!r}): pass the ONNX file the engine was built from"
        )
    if unmatched_timing:
        findings.append(f"{len(unmatched_timing)} timing entries match no layer (e.g. {unmatched_timing[0]!r}): is the profile from this engine?")
    return findings


def report_from_files(layer_info, onnx=None, timing=None, input_format: str = "auto", depth: int = 2) -> dict[str, Any]:
    """Parse a layer-information file (+ optional ONNX model and trtexec profile) into a report."""
    from trt.onnx_graph import load_onnx_graph
    from trt.parsers import merge_timing, parse_layer_info, parse_timing

    plan = parse_layer_info(layer_info, input_format)
    unmatched = merge_timing(plan, parse_timing(timing)) if timing else []
    return build_report(plan, load_onnx_graph(onnx) if onnx else None, depth, unmatched)
