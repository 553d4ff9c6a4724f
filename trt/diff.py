"""Diff two engines of one model (typically FP16 vs INT8): which fused groups of A are split in B,
and which Q/DQ nodes sit at each cut.

ONNX nodes are joined by name, Q/DQ nodes set aside. When the two engines name their nodes
differently (another export), the diff says so and falls back to module scopes and to an
alignment of the compute layers by order and type, clearly marked.
"""

from __future__ import annotations

import difflib
from typing import Any

from trt.onnx_graph import QDQ_OPS, OnnxGraph
from trt.plan import EnginePlan, Layer
from trt.report import build_report

MIN_SHARED = 0.5  # below this share of common node names, join by module scope instead
NON_COMPUTE_TYPES = {"Reformat", "NoOp", "MyelinReformat", "unknown"}


def build_diff(plan_a: EnginePlan, plan_b: EnginePlan, graph_a: OnnxGraph | None = None, graph_b: OnnxGraph | None = None, depth: int = 2) -> dict[str, Any]:
    report_a, report_b = build_report(plan_a, graph_a, depth), build_report(plan_b, graph_b, depth)
    where_a, where_b = _node_layers(plan_a, graph_a), _node_layers(plan_b, graph_b)
    common = where_a.keys() & where_b.keys()
    shared = len(common) / max(1, min(len(where_a), len(where_b)))
    join = "onnx-names" if shared >= MIN_SHARED and common else "module-scope"
    diff: dict[str, Any] = {
        "a": report_a["source"],
        "b": report_b["source"],
        "join": join,
        "shared_node_names": {"common": len(common), "only_a": len(where_a.keys() - common), "only_b": len(where_b.keys() - common), "share": round(shared, 4)},
        "totals": _totals(report_a, report_b),
        "splits": _splits(plan_a, plan_b, where_b, common, graph_b) if join == "onnx-names" else [],
        "modules": _modules(report_a["modules"], report_b["modules"]),
        "aligned_layers": _aligned(plan_a, plan_b) if join == "module-scope" else [],
        "qdq_layers": {"a": report_a["breakdown"]["qdq_layers"], "b": report_b["breakdown"]["qdq_layers"]},
    }
    diff["findings"] = _findings(diff)
    return diff


def _node_layers(plan: EnginePlan, graph: OnnxGraph | None) -> dict[str, int]:
    """ONNX node -> index of the first layer holding it, Q/DQ nodes left out."""
    where: dict[str, int] = {}
    for index, layer in enumerate(plan.layers):
        for name in layer.onnx_nodes:
            if not _is_qdq(name, graph):
                where.setdefault(name, index)
    return where


def _is_qdq(name: str, graph: OnnxGraph | None) -> bool:
    node = graph.by_name.get(name) if graph else None
    return node.op_type in QDQ_OPS if node else ("QuantizeLinear" in name or "DequantizeLinear" in name)


def _splits(plan_a: EnginePlan, plan_b: EnginePlan, where_b: dict[str, int], common: set[str], graph_b: OnnxGraph | None) -> list[dict[str, Any]]:
    splits = []
    for layer in plan_a.layers:
        group = [n for n in layer.onnx_nodes if n in common]
        b_indices = sorted({where_b[n] for n in group})
        if len(b_indices) < 2:
            continue
        b_layers = [plan_b.layers[i] for i in b_indices]
        splits.append({
            "a_layer": layer.name,
            "a_type": layer.type,
            "a_myelin": layer.myelin,
            "a_time_ms": layer.time_ms,
            "nodes": len(group),
            "b_layers": [
                {"name": b.name, "type": b.type, "myelin": b.myelin, "precision": b.precision, "time_ms": b.time_ms,
                 "nodes": [n for n in group if where_b[n] == i]}
                for i, b in zip(b_indices, b_layers)
            ],
            "qdq_at_cut": _qdq_at_cut(group, where_b, b_layers, graph_b),
        })
    return splits


def _qdq_at_cut(group: list[str], where_b: dict[str, int], b_layers: list[Layer], graph: OnnxGraph | None) -> list[str]:
    """Q/DQ nodes between two nodes of the group that B runs in different layers.

    With B's ONNX: follow each node's outputs through QuantizeLinear -> DequantizeLinear to a
    consumer in the group. Without it: the Q/DQ nodes named in the B layers' Metadata.
    """
    if graph is None:
        return list(dict.fromkeys(n for b in b_layers for n in b.onnx_nodes if "QuantizeLinear" in n or "DequantizeLinear" in n))
    members = set(group)
    cuts = []
    for name in group:
        node = graph.by_name.get(name)
        for tensor in node.outputs if node else []:
            for q in graph.consumers.get(tensor, []):
                if q.op_type != "QuantizeLinear":
                    continue
                for dq in (c for out in q.outputs for c in graph.consumers.get(out, []) if c.op_type == "DequantizeLinear"):
                    targets = [c.name for out in dq.outputs for c in graph.consumers.get(out, []) if c.name in members]
                    if any(where_b[t] != where_b[name] for t in targets):
                        cuts += [q.name, dq.name]
    return list(dict.fromkeys(cuts))


def _totals(report_a: dict[str, Any], report_b: dict[str, Any]) -> dict[str, Any]:
    rows = {}
    for key in ("layers", "myelin_layers", "myelin_graphs", "total_time_ms"):
        a, b = report_a["summary"][key], report_b["summary"][key]
        rows[key] = {"a": a, "b": b, "delta": None if a is None or b is None else round(b - a, 6)}
    a, b = len(report_a["breakdown"]["qdq_layers"]), len(report_b["breakdown"]["qdq_layers"])
    rows["qdq_layers"] = {"a": a, "b": b, "delta": b - a}
    rows["precisions"] = {"a": report_a["breakdown"]["precisions"], "b": report_b["breakdown"]["precisions"]}
    return rows


def _modules(rows_a: list[dict[str, Any]], rows_b: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_a, by_b = {r["module"]: r for r in rows_a}, {r["module"]: r for r in rows_b}
    names = list(dict.fromkeys([*by_a, *by_b]))
    out = []
    for name in names:
        a, b = by_a.get(name, {}), by_b.get(name, {})
        ta, tb = a.get("time_ms"), b.get("time_ms")
        out.append({
            "module": name,
            "layers_a": a.get("layers", 0), "layers_b": b.get("layers", 0), "layers_delta": b.get("layers", 0) - a.get("layers", 0),
            "myelin_a": a.get("myelin_kernels", 0), "myelin_b": b.get("myelin_kernels", 0),
            "time_a_ms": ta, "time_b_ms": tb, "time_delta_ms": None if ta is None or tb is None else round(tb - ta, 6),
        })
    return out


def _aligned(plan_a: EnginePlan, plan_b: EnginePlan) -> list[dict[str, Any]]:
    """Pair compute layers of A and B by order and type (used when node names do not join)."""
    compute_a = [l for l in plan_a.layers if l.type not in NON_COMPUTE_TYPES and l.origin != "QDQ"]
    compute_b = [l for l in plan_b.layers if l.type not in NON_COMPUTE_TYPES and l.origin != "QDQ"]
    matcher = difflib.SequenceMatcher(a=[l.type for l in compute_a], b=[l.type for l in compute_b], autojunk=False)
    rows = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        pairs = list(zip(compute_a[i1:i2], compute_b[j1:j2])) if tag in ("equal", "replace") else []
        for a, b in pairs:
            rows.append(_pair(a, b))
        for a in compute_a[i1 + len(pairs) : i2]:
            rows.append(_pair(a, None))
        for b in compute_b[j1 + len(pairs) : j2]:
            rows.append(_pair(None, b))
    return rows


def _pair(a: Layer | None, b: Layer | None) -> dict[str, Any]:
    return {
        "a": a.name if a else None, "b": b.name if b else None,
        "type_a": a.type if a else None, "type_b": b.type if b else None,
        "precision_a": a.precision if a else None, "precision_b": b.precision if b else None,
        "time_a_ms": a.time_ms if a else None, "time_b_ms": b.time_ms if b else None,
    }


def _findings(diff: dict[str, Any]) -> list[str]:
    totals, findings = diff["totals"], []
    if diff["join"] == "module-scope":
        share = diff["shared_node_names"]
        findings.append(
            f"the two engines name their ONNX nodes differently (only {share['common']} names in common, {share['share']:.0%}): "
            "they were exported separately, so nodes cannot be joined by name; modules are compared by scope and "
            "compute layers are aligned by order and type instead"
        )
    layers = totals["layers"]
    if layers["delta"]:
        findings.append(f"B has {layers['b']} layers where A has {layers['a']} ({layers['delta']:+d})")
    graphs = totals["myelin_graphs"]
    if graphs["b"] > graphs["a"]:
        findings.append(f"B's Myelin region is cut into {graphs['b']} graphs (A: {graphs['a']})")
    if diff["splits"]:
        cuts = [q for s in diff["splits"] for q in s["qdq_at_cut"]]
        findings.append(
            f"{len(diff['splits'])} layers of A are split across several layers in B"
            + (f"; {len(set(cuts))} Q/DQ nodes sit at the cuts (e.g. {cuts[0]!r})" if cuts else "")
            + ": `python -m pipeline lint-qdq` on B's ONNX says which placements break TensorRT's fusions"
        )
    qdq = totals["qdq_layers"]
    if qdq["b"]:
        findings.append(f"B runs {qdq['b']} standalone Q/DQ layers (A: {qdq['a']})")
    time = totals["total_time_ms"]
    if time["delta"] is not None:
        findings.append(f"total layer time: A {time['a']:.3f} ms, B {time['b']:.3f} ms ({time['delta']:+.3f} ms)")
    return findings


def diff_from_files(a, b, onnx_a=None, onnx_b=None, timing_a=None, timing_b=None, depth: int = 2) -> dict[str, Any]:
    from trt.onnx_graph import load_onnx_graph
    from trt.parsers import merge_timing, parse_layer_info, parse_timing

    plans = []
    for layer_info, timing in ((a, timing_a), (b, timing_b)):
        plan = parse_layer_info(layer_info)
        if timing:
            merge_timing(plan, parse_timing(timing))
        plans.append(plan)
    graphs = [load_onnx_graph(p) if p else None for p in (onnx_a, onnx_b)]
    return build_diff(plans[0], plans[1], graphs[0], graphs[1], depth)
