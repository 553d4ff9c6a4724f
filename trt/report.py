"""The fusion report (`build_report`, typed in trt/views.py): which ONNX nodes run in which engine layer and
region (Myelin graphs in particular), rolled up to the torch modules they came from, with a one-sentence
verdict and findings a user can act on."""

from __future__ import annotations

from collections import Counter, defaultdict
from functools import cache
from typing import Any

from pipeline.core.graph import DATA_MOVEMENT_OPS, QDQ_OPS
from pipeline.core.scopes import scope_of_name
from trt.fusion_map import report_map
from trt.onnx_graph import OnnxGraph, load_onnx_graph
from trt.parsers import merge_timing, parse_layer_info, parse_timing
from trt.plan import MAPPING_RANGE, EnginePlan, Region, paused_gc
from trt.views import Breakdown, Coverage, ModuleRow, Report, Source, Summary

ROOT = "(root)"
UNMAPPED = "(no ONNX node)"


def build_report(plan: EnginePlan, graph: OnnxGraph | None = None, depth: int = 2, unmatched_timing: list[str] | None = None) -> Report:
    if graph is not None:
        _resolve_ranges(plan, graph)
    referenced = list(dict.fromkeys(n for layer in plan.layers for n in layer.onnx_nodes))
    timed = [layer for layer in plan.layers if layer.time_ms is not None]
    per_profile = myelin_graphs_per_profile(plan)
    summary = Summary(
        layers=len(plan.layers),
        myelin_layers=sum(layer.myelin for layer in plan.layers),
        myelin_graphs=per_profile[0],
        metadata_onnx_nodes=len(referenced),
        resolved_onnx_nodes=sum(n in graph.by_name for n in referenced) if graph else None,
        unresolved_onnx_nodes=[n for n in referenced if n not in graph.by_name] if graph else [],
        timed_layers=len(timed),
        total_time_ms=round(sum(layer.time_ms for layer in timed), 6) if timed else None,
        profiles=plan.profiles,
        myelin_graphs_per_profile=per_profile,
        regions=len(plan.regions),
        precision=engine_precision(plan),
    )
    source = Source(plan.source, plan.format, plan.verbosity, graph.path if graph else None, plan.io_tensors, plan.build, plan.builds)
    return Report(plan, source, verdict(plan), summary, _breakdown(plan), _coverage(graph, set(referenced)) if graph else None,
                  rollup(plan, graph, depth), depth, _findings(plan, summary, graph, unmatched_timing or []), report_map(plan, graph))


# ---------------------------------------------------------------- model-level facts


def myelin_graphs_per_profile(plan: EnginePlan) -> list[int]:
    """Myelin graphs in each optimization profile (profiles are copies of one network)."""
    counts = Counter(region.profile for region in plan.regions if region.kind == "myelin")
    return [counts.get(p, 0) for p in range(plan.profiles)]


def engine_precision(plan: EnginePlan) -> str:
    """INT8 when any layer runs INT8, or quantizes where no layer runs FP8 or FP4 (a names-only log shows Q/DQ layers,
    not their types); else the lowest precision seen; "unknown" without types."""
    found = {layer.precision for layer in plan.layers}
    if "INT8" in found or (any(layer.qdq for layer in plan.layers) and not found & {"FP8", "FP4"}):
        return "INT8"
    return next((precision for precision in ("FP4", "FP8", "FP16", "BF16", "FP32") if precision in found), "unknown")


def verdict(plan: EnginePlan) -> str:
    """One sentence: how the network runs (profile 0 when there are several; they are copies), then its caveats."""
    regions = [r for r in plan.regions if r.profile == 0]
    compute = [r for r in regions if r.compute]
    myelin = [r for r in compute if r.kind == "myelin"]
    others = [r for r in compute if r.kind != "myelin"]
    qdq = [r for r in others if r.qdq]
    copies = sum(1 for r in regions if not r.compute)
    precision = engine_precision(plan)
    head = f"{precision} engine: " if precision != "unknown" else ""
    if len(myelin) == 1 and not others:
        text = f"the whole network runs as 1 Myelin region{_kernels(myelin[0])}"
    elif myelin and not others:
        text = f"the network runs as {len(myelin)} Myelin regions{_kernel_list(myelin)} and no other compute layer"
    elif myelin:
        text = f"the network runs as {len(myelin)} Myelin region{_s(myelin)}{_kernel_list(myelin)} and {len(others)} other layer{_s(others)}"
    elif others:
        text = f"the network runs as {len(others)} layer{_s(others)}, none of them in Myelin"
    else:
        text = "the engine has no compute layer"
    if qdq:
        text += f", {len(qdq)} of them standalone Q/DQ layer{_s(qdq)}"
    if copies:
        text += f" (plus {copies} reformat/copy layer{'s' if copies != 1 else ''})"
    if plan.profiles > 1:
        text += f", in each of its {plan.profiles} optimization profiles"
    listed = [r for r in myelin if r.layers[0].type == "Myelin"]
    if listed:
        text += (f"; {'its Myelin region is' if len(myelin) == 1 else 'each Myelin region is'} listed as one ForeignNode layer, "
                 "not its kernels (TensorRT 8.x, or layer names only)")
    return head + text


def _kernels(region: Region) -> str:
    return "" if region.layers[0].type == "Myelin" else f" of {len(region.layers)} kernel{_s(region.layers)}"


def _kernel_list(regions: list[Region]) -> str:
    if all(r.layers[0].type == "Myelin" for r in regions):
        return ""
    sizes = [str(len(r.layers)) for r in regions]
    shown = ", ".join(sizes[:6]) + (", ..." if len(sizes) > 6 else "")
    return f" ({shown} kernel{'' if sizes == ['1'] else 's'})"


def _s(items) -> str:
    return "" if len(items) == 1 else "s"


# ---------------------------------------------------------------- ONNX graph


def _resolve_ranges(plan: EnginePlan, graph: OnnxGraph) -> None:
    """`{ForeignNode[first...last]}` -> the ONNX nodes between them in topological order (approximate),
    without the nodes other layers name explicitly."""
    named_elsewhere = {n for layer in plan.layers if layer.mapping != MAPPING_RANGE for n in layer.onnx_nodes}
    changed = False
    for layer in plan.layers:
        if layer.mapping != MAPPING_RANGE or not layer.foreign_range:
            continue
        # TensorRT sometimes names a region by a tensor: its producer's position
        first, last = (graph.position.get(name, graph.producers.get(name)) for name in layer.foreign_range)
        if first is None and last is None:
            plan.notes.append(f"neither end of {layer.name!r} is in {graph.path}: its ONNX nodes are only the ones its name shows")
            continue
        for end, found in zip(layer.foreign_range, (first, last)):
            if found is None:
                plan.notes.append(f"{end!r} (an end of {layer.name!r}) is not in {graph.path}: the range runs to the graph's boundary instead")
        start, stop = sorted((0 if first is None else first, len(graph.nodes) - 1 if last is None else last))
        spanned = [n.name for n in graph.nodes[start : stop + 1] if n.op_type != "Constant" and n.name not in named_elsewhere]
        layer.onnx_nodes = list(dict.fromkeys(layer.onnx_nodes + spanned))
        changed = True
    if changed:
        plan.settle()


def _breakdown(plan: EnginePlan) -> Breakdown:
    kernels = Counter(layer.myelin_graph for layer in plan.layers if layer.myelin)
    return Breakdown(
        layer_types=dict(Counter(layer.type for layer in plan.layers).most_common()),
        precisions=dict(Counter(layer.precision or "unknown" for layer in plan.layers).most_common()),
        myelin_kernels_per_graph={str(g): n for g, n in sorted(kernels.items())},
        qdq_layers=[layer.name for layer in plan.layers if layer.qdq],
    )


def _coverage(graph: OnnxGraph, referenced: set[str]) -> Coverage:
    """ONNX nodes that appear in no layer, split by why that is expected or not."""
    folded = graph.constant_like()
    groups: dict[str, list[str]] = {"folded_constants_and_shapes": [], "data_movement": [], "qdq": [], "compute": []}
    for node in (n for n in graph.nodes if n.name not in referenced):
        why = ("folded_constants_and_shapes" if node.name in folded else "qdq" if node.op_type in QDQ_OPS
               else "data_movement" if node.op_type in DATA_MOVEMENT_OPS else "compute")
        groups[why].append(node.name)
    return Coverage(len(graph.nodes), sum(1 for n in graph.nodes if n.name in referenced), groups)


def rollup(plan: EnginePlan, graph: OnnxGraph | None, depth: int) -> list[ModuleRow]:
    """Per torch module (scope truncated to `depth`): ONNX nodes, engine layers, Myelin kernels, time. A layer counts
    in every module it has nodes of; its time is shared among them by node count."""
    rows: dict[str, dict[str, Any]] = defaultdict(lambda: {"onnx_nodes": 0, "layers": 0, "myelin_kernels": 0, "time_ms": None, "precisions": Counter()})

    @cache
    def module_for(name: str) -> str:
        node = graph.by_name.get(name) if graph else None
        scope = node.scope if node is not None and node.scope else scope_of_name(name)
        return "/".join(scope[:depth]) or ROOT

    for layer in plan.layers:
        nodes = layer.onnx_nodes
        modules = Counter(map(module_for, nodes)) if nodes else {UNMAPPED: 1}
        total = len(nodes) or 1
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
        rows[module_for(name)]["onnx_nodes"] += 1
    return [ModuleRow(module, row["onnx_nodes"], row["layers"], row["myelin_kernels"], round(row["time_ms"], 6) if row["time_ms"] is not None else None,
                      dict(row["precisions"])) for module, row in rows.items()]


def _findings(plan: EnginePlan, summary: Summary, graph: OnnxGraph | None, unmatched_timing: list[str]) -> list[str]:
    findings = list(plan.notes)
    regions = [r for r in plan.regions if r.profile == 0 and r.compute]
    myelin = [r for r in regions if r.kind == "myelin"]
    outside = [r for r in regions if r.kind != "myelin"]
    int8 = summary.precision == "INT8"
    if len(myelin) > 1 or (myelin and outside):
        types = ", ".join(f"{t} {n}" for t, n in Counter(r.type for r in outside if r.type != "unknown").most_common(4))
        advice = (
            "`python -m pipeline diff` against the FP16 engine lists the Q/DQ nodes at each cut, and `python -m pipeline lint-qdq` "
            "names the placements TensorRT's rules reject"
            if int8 else
            "these layers hold ONNX ops Myelin did not take (their types and nodes are in the layer table)"
        )
        findings.append(
            f"{len(myelin)} Myelin region{_s(myelin)} and {len(outside)} other compute layer{_s(outside)}" + (f" ({types})" if types else "")
            + f": each boundary is a separate launch and a memory round trip; {advice}"
        )
    if plan.profiles > 1:
        findings.append(
            f"the engine has {plan.profiles} optimization profiles, each with its own copy of the layers "
            f"(Myelin graphs per profile: {', '.join(map(str, summary.myelin_graphs_per_profile))}); the verdict and the diff read profile 0"
        )
    qdq = [layer for layer in plan.layers if layer.qdq]
    if qdq:
        findings.append(
            f"{len(qdq)} layer{_s(qdq)} only quantize{'s' if len(qdq) == 1 else ''}/dequantize{'s' if len(qdq) == 1 else ''} (e.g. {qdq[0].name!r}): each is its own kernel and memory pass. "
            "Expected for the network input; elsewhere TensorRT could not fuse the Q/DQ into a neighbouring "
            "GEMM/Conv: `python -m pipeline lint-qdq` names the placements TensorRT's rules reject"
        )
    if graph is not None and summary.unresolved_onnx_nodes:
        count, total = len(summary.unresolved_onnx_nodes), summary.metadata_onnx_nodes
        findings.append(
            f"{count} of {total} ONNX node names in the engine are not in {graph.path} "
            f"(e.g. {summary.unresolved_onnx_nodes[0]!r}): pass the ONNX file the engine was built from{_exporter_hint(summary, graph)}"
        )
    if unmatched_timing:
        findings.append(f"{len(unmatched_timing)} timing entries match no layer (e.g. {unmatched_timing[0]!r}): is the profile from this engine?")
    return findings


def _exporter_hint(summary: Summary, graph: OnnxGraph) -> str:
    """When the engine's names are TorchScript's (`/encoder/layers.3/MatMul`) and the file's are not (the dynamo
    exporter's `node_MatMul_12`): the model was exported by the other exporter."""
    def torchscript_share(names) -> float:
        names = list(names)
        return sum(name.startswith("/") for name in names) / max(1, len(names))

    if torchscript_share(summary.unresolved_onnx_nodes) > 0.5 and torchscript_share(graph.by_name) < 0.1:
        return ("; the engine's names are the TorchScript exporter's and this file's are not: export with `--exporter torchscript` "
                "(python -m pipeline export --exporter torchscript -o model.onnx, or [export] exporter in the profile)")
    return ""


def load_plan(layer_info, timing=None, input_format: str = "auto", build: int | None = None) -> tuple[EnginePlan, list[str]]:
    """Parse a layer-information file and merge a trtexec profile into it; return the timing names matching no layer."""
    plan = parse_layer_info(layer_info, input_format, build)
    return plan, merge_timing(plan, parse_timing(timing)) if timing else []


def report_from_files(layer_info, onnx=None, timing=None, input_format: str = "auto", depth: int = 2, build: int | None = None) -> Report:
    """Parse a layer-information file (+ optional ONNX model and trtexec profile) into a report."""
    graph = load_onnx_graph(onnx) if onnx else None
    with paused_gc():
        plan, unmatched = load_plan(layer_info, timing, input_format, build)
        return build_report(plan, graph, depth, unmatched)
