"""The data behind the HTML fusion map: ONNX nodes in order (the graph's without what TensorRT folds, else
as the layers name them), each with the engine region it runs in; Q/DQ nodes are markers, not cells."""

from __future__ import annotations

from typing import Any

from pipeline.core.graph import QDQ_OPS
from trt.onnx_graph import OnnxGraph
from trt.plan import EnginePlan, looks_qdq


def node_regions(plan: EnginePlan) -> dict[str, int]:
    """ONNX node -> the first compute region of profile 0 holding it."""
    where: dict[str, int] = {}
    for region in plan.regions:
        if region.profile == 0 and region.compute:
            for name in region.onnx_nodes:
                where.setdefault(name, region.index)
    return where


def standalone_qdq(plan: EnginePlan) -> set[str]:
    """Q/DQ nodes TensorRT runs as layers of their own (not fused into a GEMM or a convolution)."""
    return {n for region in plan.regions if region.profile == 0 and region.qdq for n in region.onnx_nodes}


def node_order(plans: list[EnginePlan], graph: OnnxGraph | None, marked: set[str]) -> tuple[str, list[str], list[tuple[int, str]]]:
    """("onnx" | "layers", non-Q/DQ nodes in order, [(position, Q/DQ node)] for the Q/DQ nodes in `marked`)."""
    nodes, markers = [], []
    if graph is not None:
        folded = graph.constant_like()
        for node in graph.nodes:
            if node.op_type in QDQ_OPS:
                if node.name in marked:
                    markers.append((len(nodes), node.name))
            elif node.name not in folded:
                nodes.append(node.name)
        return "onnx", nodes, markers
    for name in dict.fromkeys(n for plan in plans for layer in plan.layers if not layer.profile for n in layer.onnx_nodes):
        if not looks_qdq(name):
            nodes.append(name)
        elif name in marked:
            markers.append((len(nodes), name))
    return "layers", nodes, markers


def report_map(plan: EnginePlan, graph: OnnxGraph | None) -> dict[str, Any]:
    """Markers: the Q/DQ nodes that run as standalone layers."""
    order, nodes, markers = node_order([plan], graph, standalone_qdq(plan))
    where = node_regions(plan)
    return {"order": order, "nodes": nodes, "region": [where.get(n) for n in nodes], "qdq": [[p, n] for p, n in markers]}


def diff_map(plan_a: EnginePlan, plan_b: EnginePlan, graph_a: OnnxGraph | None, graph_b: OnnxGraph | None, joined: bool, cut_nodes: dict[str, str],
             placed: tuple[dict[str, int], dict[str, int]]) -> dict[str, Any]:
    """Both engines over one node order when their node names join, else each over its own (`b_nodes` for B).
    Markers: the Q/DQ pairs at B's cuts (`cut_nodes`, from B's ONNX), else B's standalone Q/DQ layers; `placed`:
    per side, the nodes an approximate split placed in a region."""
    marked = set() if graph_b is not None else standalone_qdq(plan_b)
    if joined:
        order, nodes, markers = node_order([plan_a, plan_b], graph_b or graph_a, marked)
        b_nodes = nodes
    else:
        order, nodes, _ = node_order([plan_a], graph_a, set())
        _, b_nodes, markers = node_order([plan_b], graph_b, marked)
    where_a, where_b = placed[0] | node_regions(plan_a), placed[1] | node_regions(plan_b)
    if graph_b is not None:
        qdq = [[i, cut_nodes[n]] for i, n in enumerate(b_nodes) if n in cut_nodes]
    else:
        qdq = [[p, n] for p, n in markers]
    a, b = [where_a.get(n) for n in nodes], [where_b.get(n) for n in b_nodes]
    found = {"order": order, "nodes": nodes, "a": a, "b": b, "qdq": qdq, "a_regions": _region_info(plan_a, a), "b_regions": _region_info(plan_b, b)}
    return found if joined else found | {"b_nodes": b_nodes}


def _region_info(plan: EnginePlan, used: list[int | None]) -> dict[str, dict[str, Any]]:
    """Name, kind and precision of the regions a strip shows (keys are region indices as strings, as JSON keeps them)."""
    info = {}
    for index in dict.fromkeys(i for i in used if i is not None):
        region = plan.regions[index]
        info[str(index)] = {"name": region.name, "kind": region.kind, "type": region.type, "precision": region.precision,
                            "layers": len(region.layers), "qdq": region.qdq}
    return info
