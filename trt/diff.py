"""Diff two engines of one model (typically FP16 vs INT8) region by region (matched in trt/diff_regions.py):
splits, merges, precision changes, totals and per-module deltas, then the verdict and findings in words.
The diff is symmetric: diff(A, B).splits == diff(B, A).merges."""

from __future__ import annotations

from collections import Counter

from trt import diff_regions
from trt.fusion_map import diff_map
from trt.onnx_graph import OnnxGraph, load_onnx_graph
from trt.plan import EnginePlan, paused_gc
from trt.report import build_report, load_plan
from trt.views import Diff, ModuleDelta, ModuleRow, Report, SharedNames, Total

MIN_SHARED = 0.5  # below this share of common node names, align regions by order and type instead
MIN_NAMES = 10  # fewer known node names on one side: say so instead of blaming separate exports
FIX_INT8 = "fix: `python -m pipeline lint-qdq` on the INT8 ONNX names each placement; rebuild with `--preset trt-fusion`"


def build_diff(plan_a: EnginePlan, plan_b: EnginePlan, graph_a: OnnxGraph | None = None, graph_b: OnnxGraph | None = None, depth: int = 2) -> Diff:
    report_a, report_b = build_report(plan_a, graph_a, depth), build_report(plan_b, graph_b, depth)
    side_a, side_b = diff_regions.Side(plan_a, graph_a), diff_regions.Side(plan_b, graph_b)
    common = side_a.where.keys() & side_b.where.keys()
    share = len(common) / max(1, min(len(side_a.where), len(side_b.where)))
    joined = bool(common) and share >= MIN_SHARED
    diff = Diff(
        report_a, report_b, "onnx-names" if joined else "order-and-type", _signature(plan_a) == _signature(plan_b),
        SharedNames(len(common), len(side_a.where.keys() - common), len(side_b.where.keys() - common), round(share, 4)),
        _totals(report_a, report_b),
        regions=diff_regions.region_rows(side_a, side_b, common) if joined else [],
        splits=diff_regions.splits(side_a, side_b, common) if joined else [],
        merges=diff_regions.splits(side_b, side_a, common) if joined else [],
        aligned=[] if joined else diff_regions.aligned(side_a, side_b),
        modules=_modules(report_a.modules, report_b.modules),
    )
    diff.verdict, diff.findings = _verdict(diff), _findings(diff)
    cut_nodes = {c.to_node: f"{c.quantize} -> {c.dequantize}" for s in diff.splits for c in s.cuts if c.quantize and c.to_node}
    placed = tuple({n: s.a_region.index for s in splits if s.approximate for p in s.pieces for n in p.nodes} for splits in (diff.splits, diff.merges))
    diff.fusion_map = diff_map(plan_a, plan_b, graph_a, graph_b, joined, cut_nodes, placed)
    return diff


def _signature(plan: EnginePlan) -> list[tuple]:
    return [(layer.name, layer.type, layer.precision, tuple(layer.onnx_nodes)) for layer in plan.layers]


# ---------------------------------------------------------------- totals and words


def _totals(report_a: Report, report_b: Report) -> dict[str, Total]:
    rows = {}
    for key in ("layers", "regions", "myelin_layers", "myelin_graphs", "total_time_ms"):
        a, b = getattr(report_a.summary, key), getattr(report_b.summary, key)
        rows[key] = Total(a, b, None if a is None or b is None else round(b - a, 6))
    a, b = len(report_a.breakdown.qdq_layers), len(report_b.breakdown.qdq_layers)
    rows["qdq_layers"] = Total(a, b, b - a)
    return rows


def _modules(rows_a: list[ModuleRow], rows_b: list[ModuleRow]) -> list[ModuleDelta]:
    by_a, by_b = {r.module: r for r in rows_a}, {r.module: r for r in rows_b}
    out = []
    for name in dict.fromkeys([*by_a, *by_b]):
        a, b = by_a.get(name, ModuleRow(name, 0, 0, 0, None, {})), by_b.get(name, ModuleRow(name, 0, 0, 0, None, {}))
        delta = None if a.time_ms is None or b.time_ms is None else round(b.time_ms - a.time_ms, 6)
        out.append(ModuleDelta(name, a.layers, b.layers, b.layers - a.layers, a.myelin_kernels, b.myelin_kernels, a.time_ms, b.time_ms, delta))
    return out


def _label(report: Report, side: str) -> str:
    """"A (FP16)": the side and its engine's precision."""
    precision = report.summary.precision
    return f"{side} ({precision})" if precision != "unknown" else side


def _verdict(diff: Diff) -> str:
    """One sentence: what changed between A and B and, for Q/DQ cuts, the fix."""
    if diff.identical:
        return "identical: A and B run the same layers in the same regions"
    a, b = _label(diff.a, "A"), _label(diff.b, "B")
    layers = diff.totals["layers"]
    if diff.join == "order-and-type":
        changed = [r for r in diff.aligned if r.precision_change]
        kinds = Counter(r.precision_change for r in changed).most_common(1)
        qdq = len(diff.b.breakdown.qdq_layers)
        return (f"{_speed(diff, a, b)}; {_kept_precision(diff, b)}{qdq} standalone Q/DQ layer{'s' if qdq != 1 else ''} in {b}. "
                f"How: the engines share too few ONNX node names to join, so {len(diff.aligned)} compute regions were aligned by order and type; "
                f"{len(changed)} changed precision" + (f" (mostly {kinds[0][0]})" if kinds else "")
                + f", and {b} has {layers.b} layers where {a} has {layers.a}")
    for splits, whole, pieces, cut in ((diff.splits, a, b, diff.b), (diff.merges, b, a, diff.a)):
        if splits:
            biggest = max(splits, key=lambda s: s.nodes)
            region = biggest.a_region
            what = f"{whole}'s {'Myelin region' if region.kind == 'myelin' else 'layer'} {_short(region.name)}"
            text = f"{pieces}: {what} is cut into {len(biggest.pieces)} regions"
            if biggest.myelin_pieces:
                text += f" ({biggest.myelin_pieces} Myelin)"
            if biggest.qdq_pairs:
                text += f" at {biggest.qdq_pairs} Q/DQ pair{'s' if biggest.qdq_pairs != 1 else ''}"
            if len(splits) > 1:
                text += f"; {len(splits)} regions of {whole} are cut in all"
            if cut.summary.precision == "INT8" and any(s.qdq_pairs for s in splits):
                text += f"; {FIX_INT8}"
            return text + (" (approximate: placed by the ForeignNode's ends)" if biggest.approximate else "")
    changed = [r for r in diff.regions if r.precision_change]
    if changed:
        kinds = Counter(r.precision_change for r in changed).most_common()
        return f"{b} keeps {a}'s regions; {len(changed)} of them changed precision (" + ", ".join(f"{k}: {n}" for k, n in kinds) + ")"
    return f"{b} runs {a}'s regions unchanged (layer count {layers.a} -> {layers.b})"


def _speed(diff: Diff, a: str, b: str) -> str:
    """B's total layer time against A's, when both engines' per-layer timings were given."""
    time, layers = diff.totals["total_time_ms"], diff.totals["layers"]
    if not time.a or not time.b:
        return f"{b} has {layers.b} layers where {a} has {layers.a} (no layer times: give --timing-a/--timing-b to compare speed)"
    ratio = time.b / time.a
    faster = "faster" if ratio < 1 else "slower" if ratio > 1 else "as fast"
    return f"{b} is {faster}: {time.b:.3g} ms of layer time where {a} takes {time.a:.3g} ms ({ratio:.2f}x)"


def _kept_precision(diff: Diff, b: str) -> str:
    """For a quantized B: how many of its aligned compute regions still run in a float precision."""
    if diff.b.summary.precision != "INT8":
        return ""
    regions = [r.b for r in diff.aligned if r.b]
    kept = Counter(r.precision for r in regions if r.precision and r.precision != "INT8")
    if not kept:
        return f"all {len(regions)} compute regions of {b} run INT8; "
    where = next(iter(kept)) if len(kept) == 1 else "float (" + ", ".join(f"{p} {n}" for p, n in kept.most_common()) + ")"
    return f"{sum(kept.values())} of {len(regions)} compute regions stayed in {where}; "


def _short(name: str, limit: int = 80) -> str:
    return f"`{name}`" if len(name) <= limit else f"`{name[: limit - 3]}...`"


def _findings(diff: Diff) -> list[str]:
    if diff.identical:
        return ["identical: the two files describe the same layers, regions and precisions"]
    findings = []
    a, b = _label(diff.a, "A"), _label(diff.b, "B")
    if diff.join == "order-and-type":
        findings.append(_why_aligned(diff.shared))
    profiles = (diff.a.plan.profiles, diff.b.plan.profiles)
    if max(profiles) > 1:
        findings.append(f"optimization profiles: A {profiles[0]}, B {profiles[1]}; the diff compares profile 0")
    for splits, whole, pieces, onnx in ((diff.splits, a, b, "--onnx-a"), (diff.merges, b, a, "--onnx-b")):
        for split in splits[:3]:
            cut = f" at {split.qdq_pairs} Q/DQ pairs ({split.qdq_source})" if split.qdq_pairs else ""
            # a names-only range names its two ends, not the nodes between them: no count to give
            nodes = (f"a names-only range: its ONNX nodes are known with {onnx}" if split.approximate
                     else f"{split.nodes} ONNX node{'s' if split.nodes != 1 else ''} both engines name")
            findings.append(f"{whole}'s {split.a_region.name[:100]!r} ({nodes}) runs in {pieces} as {len(split.pieces)} regions"
                            f" ({split.myelin_pieces} Myelin){cut}" + (" [approximate]" if split.approximate else ""))
        if len(splits) > 3:
            findings.append(f"... and {len(splits) - 3} more regions of {whole} cut in {pieces}")
    changed = Counter(r.precision_change for r in [*diff.regions, *diff.aligned] if r.precision_change)
    if changed:
        findings.append("precision changes by region: " + ", ".join(f"{k} x{n}" for k, n in changed.most_common()))
    totals = diff.totals
    if totals["layers"].delta:
        findings.append(f"{b} has {totals['layers'].b} layers where {a} has {totals['layers'].a} ({totals['layers'].delta:+d})")
    if totals["myelin_graphs"].b != totals["myelin_graphs"].a:
        findings.append(f"Myelin graphs: {a} {totals['myelin_graphs'].a}, {b} {totals['myelin_graphs'].b}")
    if totals["qdq_layers"].a or totals["qdq_layers"].b:
        findings.append(f"standalone Q/DQ layers: {a} {totals['qdq_layers'].a}, {b} {totals['qdq_layers'].b}")
    time = totals["total_time_ms"]
    if time.delta is not None:
        findings.append(f"total layer time: {a} {time.a:.3f} ms, {b} {time.b:.3f} ms ({time.delta:+.3f} ms)")
    return findings


def _why_aligned(share: SharedNames) -> str:
    """Why the regions were aligned by order and type: one side names too few nodes, or the names differ."""
    few = min(share.common + share.only_a, share.common + share.only_b)
    if few < MIN_NAMES:
        side = "A" if share.common + share.only_a == few else "B"
        return (f"{side}'s layers name only {few} ONNX node{'s' if few != 1 else ''} (layer names only, or ForeignNode ranges): too few to join the engines "
                "by node; pass the ONNX files (--onnx-a, --onnx-b) to resolve the ranges, or rebuild with detailed profiling verbosity; "
                "compute regions are aligned by order and type instead")
    return (f"the two engines name their ONNX nodes differently (only {share.common} names in common, {share.share:.0%}): "
            "they were exported separately, so nodes cannot be joined by name; compute regions are aligned by order and type instead")


def diff_from_files(a, b, onnx_a=None, onnx_b=None, timing_a=None, timing_b=None, depth: int = 2, build_a: int | None = None, build_b: int | None = None) -> Diff:
    graphs = [load_onnx_graph(p) if p else None for p in (onnx_a, onnx_b)]
    with paused_gc():
        plan_a, _ = load_plan(a, timing_a, build=build_a)
        plan_b, _ = load_plan(b, timing_b, build=build_b)
        return build_diff(plan_a, plan_b, graphs[0], graphs[1], depth)
