"""Diff two engines of one model (typically FP16 vs INT8) region by region.

A region is a Myelin graph or a standalone layer (trt.plan.Region). Each ONNX node maps to the SET
of regions holding it. For every compute region of A, the compute regions of B its nodes land in:
one B region holding all of them means the region survived (alone, or merged with others in B); two
or more mean B splits it, and the cuts are reported with the Q/DQ pairs sitting on them (from B's
ONNX when given, else the Q/DQ names in B's layers). Q/DQ nodes, nodes TensorRT made up, and nodes
one engine folded away (present in only one of them) never make a split. The same function run with
A and B swapped gives the merges, so the diff is symmetric: diff(A, B).splits == diff(B, A).merges.

Names-only TensorRT 8.x regions (`{ForeignNode[first...last]}`) without an ONNX file are placed by
their ends in B's layer order (marked approximate). When the engines name their nodes differently
(separate exports), compute regions are aligned by order and type instead, clearly marked.
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from typing import Any

from pipeline.core.graph import QDQ_OPS
from trt.fusion_map import diff_map
from trt.onnx_graph import OnnxGraph
from trt.parsers.common import split_top
from trt.plan import MAPPING_RANGE, EnginePlan, Region, looks_qdq, paused_gc
from trt.report import build_report

MIN_SHARED = 0.5  # below this share of common node names, align regions by order and type instead
MIN_NAMES = 10  # fewer known node names on one side: say so instead of blaming separate exports
FIX_INT8 = "fix: `python -m pipeline lint-qdq` on the INT8 ONNX names each placement; rebuild with `--preset trt-fusion`"


def build_diff(plan_a: EnginePlan, plan_b: EnginePlan, graph_a: OnnxGraph | None = None, graph_b: OnnxGraph | None = None, depth: int = 2) -> dict[str, Any]:
    report_a, report_b = build_report(plan_a, graph_a, depth), build_report(plan_b, graph_b, depth)
    side_a, side_b = _Side(plan_a, graph_a), _Side(plan_b, graph_b)
    common = side_a.where.keys() & side_b.where.keys()
    share = len(common) / max(1, min(len(side_a.where), len(side_b.where)))
    join = "onnx-names" if common and share >= MIN_SHARED else "order-and-type"
    identical = _signature(plan_a) == _signature(plan_b)
    diff: dict[str, Any] = {
        "a": report_a["source"] | {"precision": report_a["summary"]["precision"], "verdict": report_a["verdict"]},
        "b": report_b["source"] | {"precision": report_b["summary"]["precision"], "verdict": report_b["verdict"]},
        "join": join,
        "identical": identical,
        "shared_node_names": {"common": len(common), "only_a": len(side_a.where.keys() - common), "only_b": len(side_b.where.keys() - common), "share": round(share, 4)},
        "totals": _totals(report_a, report_b),
        "regions": _region_rows(side_a, side_b, common) if join == "onnx-names" else [],
        "splits": _splits(side_a, side_b, common) if join == "onnx-names" else [],
        "merges": _splits(side_b, side_a, common) if join == "onnx-names" else [],
        "aligned": _aligned(side_a, side_b) if join == "order-and-type" else [],
        "modules": _modules(report_a["modules"], report_b["modules"]),
        "qdq_layers": {"a": report_a["breakdown"]["qdq_layers"], "b": report_b["breakdown"]["qdq_layers"]},
        "profiles": {"a": plan_a.profiles, "b": plan_b.profiles},
    }
    diff["verdict"] = _verdict(diff)
    diff["findings"] = _findings(diff)
    cut_nodes = {c["to_node"]: f"{c['quantize']} -> {c['dequantize']}" for s in diff["splits"] for c in s["cuts"] if c["quantize"] and c["to_node"]}
    placed = tuple({n: s["a_region"]["index"] for s in diff[key] if s["approximate"] for b in s["b_regions"] for n in b["nodes"]} for key in ("splits", "merges"))
    diff["fusion_map"] = diff_map(plan_a, plan_b, graph_a, graph_b, join == "onnx-names", cut_nodes, placed)
    return diff


class _Side:
    """One engine's compute regions of profile 0 and where each ONNX node runs in them."""

    def __init__(self, plan: EnginePlan, graph: OnnxGraph | None):
        self.plan, self.graph = plan, graph
        self.regions = [r for r in plan.regions if r.profile == 0 and r.compute]
        self.nodes: dict[int, set[str]] = {}
        self.where: dict[str, set[int]] = {}
        for region in self.regions:
            names = {n for n in region.onnx_nodes if not self.is_qdq(n)}
            self.nodes[region.index] = names
            for name in names:
                self.where.setdefault(name, set()).add(region.index)
        self.by_index = {r.index: r for r in self.regions}
        self._anchors: dict[str, int] | None = None

    def is_qdq(self, name: str) -> bool:
        node = self.graph.by_name.get(name) if self.graph else None
        return node.op_type in QDQ_OPS if node else looks_qdq(name)

    def anchor(self, name: str) -> int | None:
        """The first region holding `name` as an ONNX node, a layer name, or a part of one."""
        if self._anchors is None:
            self._anchors = {}
            for region in self.plan.regions:
                if region.profile != 0:
                    continue
                for layer in region.layers:
                    inner = layer.base_name.removeprefix("{ForeignNode[").removesuffix("]}")
                    parts = [p.strip() for half in inner.split("...") for p in split_top(half, " + ")]
                    for key in [*layer.onnx_nodes, layer.base_name, *parts]:
                        self._anchors.setdefault(key, region.index)
        return self._anchors.get(name)


def _signature(plan: EnginePlan) -> list[tuple]:
    return [(layer.name, layer.type, layer.precision, tuple(layer.onnx_nodes)) for layer in plan.layers]


def _region_summary(region: Region) -> dict[str, Any]:
    return {"index": region.index, "name": region.name, "kind": region.kind, "type": region.type, "layers": len(region.layers),
            "precision": region.precision, "time_ms": region.time_ms}


# ---------------------------------------------------------------- joined by ONNX node names


def _landing(side_a: _Side, region: Region, side_b: _Side, common: set[str]) -> tuple[list[int], dict[int, set[str]], bool]:
    """The B regions A's region lands in (regions holding only nodes another landing region also holds
    are left out), each with the shared nodes it holds, and whether the landing was approximate."""
    nodes = side_a.nodes[region.index] & common
    hits: dict[int, set[str]] = {}
    for name in nodes:
        for index in side_b.where[name]:
            hits.setdefault(index, set()).add(name)
    kept = [b for b in sorted(hits) if not any(other != b and hits[b] <= hits[other] and (hits[b] != hits[other] or other < b) for other in _holders(hits, b, side_b))]
    approximate = False
    if side_a.graph is None and region.layers[0].mapping == MAPPING_RANGE and region.layers[0].foreign_range and len(kept) <= 1:
        span = _span(region, side_b)
        if span is not None and len(span) > 1:
            kept, approximate = span, True
            for index in span:  # A names too few of its nodes: each piece stands for all of its own
                hits[index] = side_b.nodes[index] | hits.get(index, set())
    return kept, hits, approximate


def _holders(hits: dict[int, set[str]], b: int, side_b: _Side) -> set[int]:
    """B regions that could hold all of hits[b]: those holding its first node (checked without a full pairwise scan)."""
    first = next(iter(hits[b]))
    return side_b.where[first] & hits.keys()


def _span(region: Region, side_b: _Side) -> list[int] | None:
    """A names-only ForeignNode region of A placed by its two ends in B's layer order."""
    first, last = region.layers[0].foreign_range
    start, stop = side_b.anchor(first), side_b.anchor(last)
    if start is None or stop is None:
        return None
    low, high = sorted((start, stop))
    return [r.index for r in side_b.regions if low <= r.index <= high]


def _region_rows(side_a: _Side, side_b: _Side, common: set[str]) -> list[dict[str, Any]]:
    """Per compute region of A: where it runs in B and at which precision."""
    rows = []
    for region in side_a.regions:
        if not side_a.nodes[region.index]:
            continue
        kept, hits, approximate = _landing(side_a, region, side_b, common)
        shared = side_a.nodes[region.index] & common
        if not kept:
            status = "not named in B"
        elif len(kept) > 1:
            status = "split"
        elif hits[kept[0]] != side_b.nodes[kept[0]] & common:
            status = "merged"  # B runs it inside a larger region
        else:
            status = "same"
        b_regions = [side_b.by_index[i] for i in kept]
        precisions_b = sorted({r.precision for r in b_regions} - {None})
        changed = region.precision is not None and precisions_b and precisions_b != [region.precision]
        rows.append({
            "a": _region_summary(region), "b": [_region_summary(r) | {"nodes": len(hits[r.index])} for r in b_regions],
            "nodes": len(shared), "status": status, "approximate": approximate,
            "precision_change": f"{region.precision} -> {'/'.join(precisions_b)}" if changed else None,
        })
    return rows


def _splits(side_a: _Side, side_b: _Side, common: set[str]) -> list[dict[str, Any]]:
    """Compute regions of A whose shared nodes land in two or more compute regions of B, with the cuts."""
    splits = []
    for region in side_a.regions:
        if not side_a.nodes[region.index] & common and region.layers[0].mapping != MAPPING_RANGE:
            continue
        kept, hits, approximate = _landing(side_a, region, side_b, common)
        if len(kept) < 2:
            continue
        pieces = [side_b.by_index[i] for i in kept]
        cuts, source = _cuts(side_a.nodes[region.index] & common, kept, hits, side_b)
        splits.append({
            "a_region": _region_summary(region),
            "nodes": len(side_a.nodes[region.index] & common),
            "b_regions": [_region_summary(p) | {"nodes": sorted(hits[p.index])} for p in pieces],
            "b_myelin_regions": sum(p.kind == "myelin" for p in pieces),
            "cuts": cuts,
            "qdq_pairs": len({(c["quantize"], c["dequantize"]) for c in cuts if c["quantize"]}),
            "qdq_source": source,
            "approximate": approximate,
        })
    return splits


def _cuts(nodes: set[str], kept: list[int], hits: dict[int, set[str]], side_b: _Side) -> tuple[list[dict[str, Any]], str]:
    """Edges between nodes of the split group that B runs in different regions, each with the Q/DQ pair on it.

    With B's ONNX: follow each node's outputs, directly or through QuantizeLinear -> DequantizeLinear,
    to a consumer in the group. Without it: the Q/DQ nodes named in the B regions' layers.
    """
    home = {}
    for index in kept:
        for name in hits[index]:
            home.setdefault(name, index)
    graph = side_b.graph
    if graph is None:
        qdq = [n for index in kept for n in side_b.by_index[index].onnx_nodes if looks_qdq(n)]
        quantize = [n for n in dict.fromkeys(qdq) if "Dequant" not in n]
        return [{"from_region": None, "to_region": None, "from_node": None, "to_node": None, "quantize": q, "dequantize": None} for q in quantize], "B's layer names"
    cuts = []
    for name in sorted(nodes & home.keys()):
        node = graph.by_name.get(name)
        for tensor in node.output if node else []:
            for consumer in graph.consumers(tensor):
                targets = [(consumer.name, None, None)]
                if consumer.op_type == "QuantizeLinear":
                    targets = [(c.name, consumer.name, dq.name) for out in consumer.output for dq in graph.consumers(out) if dq.op_type == "DequantizeLinear"
                               for dq_out in dq.output for c in graph.consumers(dq_out)]
                for target, q, dq in targets:
                    if target in home and home[target] != home[name]:
                        cuts.append({"from_region": home[name], "to_region": home[target], "from_node": name, "to_node": target, "quantize": q, "dequantize": dq})
    return cuts, "B's ONNX"


# ---------------------------------------------------------------- node names differ


_KERNEL_FAMILY = re.compile(r"^(?:Cask|Cudnn|Cuda|Tiled|Cublas|Cutlass)")


def _kind(region: Region) -> str:
    """The operation a region runs, without the kernel library: CaskConvolution / CudnnConvolution -> Convolution."""
    return _KERNEL_FAMILY.sub("", region.type)


def _aligned(side_a: _Side, side_b: _Side) -> list[dict[str, Any]]:
    """Pair compute regions of A and B by order and kind (used when node names do not join).
    Standalone Q/DQ layers have no counterpart in a float engine: they are listed, not paired."""
    a = [r for r in side_a.regions if not r.qdq]
    b = [r for r in side_b.regions if not r.qdq]
    matcher = difflib.SequenceMatcher(a=[_kind(r) for r in a], b=[_kind(r) for r in b], autojunk=False)
    rows = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        pairs = list(zip(a[i1:i2], b[j1:j2])) if tag in ("equal", "replace") else []
        rows += [_pair(x, y) for x, y in pairs]
        rows += [_pair(x, None) for x in a[i1 + len(pairs) : i2]]
        rows += [_pair(None, y) for y in b[j1 + len(pairs) : j2]]
    return rows


def _pair(a: Region | None, b: Region | None) -> dict[str, Any]:
    changed = a is not None and b is not None and a.precision and b.precision and a.precision != b.precision
    return {"a": _region_summary(a) if a else None, "b": _region_summary(b) if b else None,
            "precision_change": f"{a.precision} -> {b.precision}" if changed else None}


# ---------------------------------------------------------------- totals and words


def _totals(report_a: dict[str, Any], report_b: dict[str, Any]) -> dict[str, Any]:
    rows = {}
    for key in ("layers", "regions", "myelin_layers", "myelin_graphs", "total_time_ms"):
        a, b = report_a["summary"][key], report_b["summary"][key]
        rows[key] = {"a": a, "b": b, "delta": None if a is None or b is None else round(b - a, 6)}
    a, b = len(report_a["breakdown"]["qdq_layers"]), len(report_b["breakdown"]["qdq_layers"])
    rows["qdq_layers"] = {"a": a, "b": b, "delta": b - a}
    rows["precisions"] = {"a": report_a["breakdown"]["precisions"], "b": report_b["breakdown"]["precisions"]}
    return rows


def _modules(rows_a: list[dict[str, Any]], rows_b: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_a, by_b = {r["module"]: r for r in rows_a}, {r["module"]: r for r in rows_b}
    out = []
    for name in dict.fromkeys([*by_a, *by_b]):
        a, b = by_a.get(name, {}), by_b.get(name, {})
        ta, tb = a.get("time_ms"), b.get("time_ms")
        out.append({
            "module": name,
            "layers_a": a.get("layers", 0), "layers_b": b.get("layers", 0), "layers_delta": b.get("layers", 0) - a.get("layers", 0),
            "myelin_a": a.get("myelin_kernels", 0), "myelin_b": b.get("myelin_kernels", 0),
            "time_a_ms": ta, "time_b_ms": tb, "time_delta_ms": None if ta is None or tb is None else round(tb - ta, 6),
        })
    return out


def _label(diff: dict[str, Any], side: str) -> str:
    precision = diff[side]["precision"]
    return f"{side.upper()} ({precision})" if precision != "unknown" else side.upper()


def _verdict(diff: dict[str, Any]) -> str:
    """One sentence: what changed between A and B and, for Q/DQ cuts, the fix."""
    if diff["identical"]:
        return "identical: A and B run the same layers in the same regions"
    a, b = _label(diff, "a"), _label(diff, "b")
    if diff["join"] == "order-and-type":
        changed = [r for r in diff["aligned"] if r["precision_change"]]
        kinds = Counter(r["precision_change"] for r in changed).most_common(1)
        return (f"{_speed(diff, a, b)}; {_kept_precision(diff, b)}{len(diff['qdq_layers']['b'])} standalone Q/DQ layer{'s' if len(diff['qdq_layers']['b']) != 1 else ''} in {b}. "
                f"How: the engines share too few ONNX node names to join, so {len(diff['aligned'])} compute regions were aligned by order and type; "
                f"{len(changed)} changed precision" + (f" (mostly {kinds[0][0]})" if kinds else "")
                + f", and {b} has {diff['totals']['layers']['b']} layers where {a} has {diff['totals']['layers']['a']}")
    for splits, whole, pieces, side in ((diff["splits"], a, b, "b"), (diff["merges"], b, a, "a")):
        if splits:
            biggest = max(splits, key=lambda s: s["nodes"])
            region = biggest["a_region"]
            what = f"{whole}'s {'Myelin region' if region['kind'] == 'myelin' else 'layer'} {_short(region['name'])}"
            text = f"{pieces}: {what} is cut into {len(biggest['b_regions'])} regions"
            if biggest["b_myelin_regions"]:
                text += f" ({biggest['b_myelin_regions']} Myelin)"
            if biggest["qdq_pairs"]:
                text += f" at {biggest['qdq_pairs']} Q/DQ pair{'s' if biggest['qdq_pairs'] != 1 else ''}"
            if len(splits) > 1:
                text += f"; {len(splits)} regions of {whole} are cut in all"
            if diff[side]["precision"] == "INT8" and any(s["qdq_pairs"] for s in splits):
                text += f"; {FIX_INT8}"
            return text + (" (approximate: placed by the ForeignNode's ends)" if biggest["approximate"] else "")
    changed = [r for r in diff["regions"] if r["precision_change"]]
    if changed:
        kinds = Counter(r["precision_change"] for r in changed).most_common()
        return f"{b} keeps {a}'s regions; {len(changed)} of them changed precision (" + ", ".join(f"{k}: {n}" for k, n in kinds) + ")"
    return f"{b} runs {a}'s regions unchanged (layer count {diff['totals']['layers']['a']} -> {diff['totals']['layers']['b']})"


def _speed(diff: dict[str, Any], a: str, b: str) -> str:
    """B's total layer time against A's, when both engines' per-layer timings were given."""
    time_a, time_b = diff["totals"]["total_time_ms"]["a"], diff["totals"]["total_time_ms"]["b"]
    if not time_a or not time_b:
        return f"{b} has {diff['totals']['layers']['b']} layers where {a} has {diff['totals']['layers']['a']} (no layer times: give --timing-a/--timing-b to compare speed)"
    ratio = time_b / time_a
    faster = "faster" if ratio < 1 else "slower" if ratio > 1 else "as fast"
    return f"{b} is {faster}: {time_b:.3g} ms of layer time where {a} takes {time_a:.3g} ms ({ratio:.2f}x)"


def _kept_precision(diff: dict[str, Any], b: str) -> str:
    """For a quantized B: how many of its aligned compute regions still run in a float precision."""
    if diff["b"]["precision"] != "INT8":
        return ""
    regions = [r["b"] for r in diff["aligned"] if r["b"]]
    kept = Counter(r["precision"] for r in regions if r["precision"] and r["precision"] != "INT8")
    if not kept:
        return f"all {len(regions)} compute regions of {b} run INT8; "
    where = next(iter(kept)) if len(kept) == 1 else "float (" + ", ".join(f"{p} {n}" for p, n in kept.most_common()) + ")"
    return f"{sum(kept.values())} of {len(regions)} compute regions stayed in {where}; "


def _short(name: str, limit: int = 80) -> str:
    return f"`{name}`" if len(name) <= limit else f"`{name[: limit - 3]}...`"


def _findings(diff: dict[str, Any]) -> list[str]:
    if diff["identical"]:
        return ["identical: the two files describe the same layers, regions and precisions"]
    totals, findings = diff["totals"], []
    a, b = _label(diff, "a"), _label(diff, "b")
    if diff["join"] == "order-and-type":
        share = diff["shared_node_names"]
        few = min(share["common"] + share["only_a"], share["common"] + share["only_b"])
        if few < MIN_NAMES:
            side = "A" if share["common"] + share["only_a"] == few else "B"
            findings.append(
                f"{side}'s layers name only {few} ONNX node{'s' if few != 1 else ''} (layer names only, or ForeignNode ranges): too few to join the engines "
                "by node; pass the ONNX files (--onnx-a, --onnx-b) to resolve the ranges, or rebuild with detailed profiling verbosity; "
                "compute regions are aligned by order and type instead"
            )
        else:
            findings.append(
                f"the two engines name their ONNX nodes differently (only {share['common']} names in common, {share['share']:.0%}): "
                "they were exported separately, so nodes cannot be joined by name; compute regions are aligned by order and type instead"
            )
    if max(diff["profiles"].values()) > 1:
        findings.append(f"optimization profiles: A {diff['profiles']['a']}, B {diff['profiles']['b']}; the diff compares profile 0")
    for key, whole, pieces in (("splits", a, b), ("merges", b, a)):
        for split in diff[key][:3]:
            cut = f" at {split['qdq_pairs']} Q/DQ pairs ({split['qdq_source']})" if split["qdq_pairs"] else ""
            findings.append(
                f"{whole}'s {split['a_region']['name'][:100]!r} ({split['nodes']} ONNX node{'s' if split['nodes'] != 1 else ''}) runs in {pieces} as {len(split['b_regions'])} regions"
                f" ({split['b_myelin_regions']} Myelin){cut}" + (" [approximate]" if split["approximate"] else "")
            )
        if len(diff[key]) > 3:
            findings.append(f"... and {len(diff[key]) - 3} more regions of {whole} cut in {pieces}")
    changed = Counter(r["precision_change"] for r in diff["regions"] + diff["aligned"] if r["precision_change"])
    if changed:
        findings.append("precision changes by region: " + ", ".join(f"{k} x{n}" for k, n in changed.most_common()))
    layers = totals["layers"]
    if layers["delta"]:
        findings.append(f"{b} has {layers['b']} layers where {a} has {layers['a']} ({layers['delta']:+d})")
    graphs = totals["myelin_graphs"]
    if graphs["b"] != graphs["a"]:
        findings.append(f"Myelin graphs: {a} {graphs['a']}, {b} {graphs['b']}")
    qdq = totals["qdq_layers"]
    if qdq["a"] or qdq["b"]:
        findings.append(f"standalone Q/DQ layers: {a} {qdq['a']}, {b} {qdq['b']}")
    time = totals["total_time_ms"]
    if time["delta"] is not None:
        findings.append(f"total layer time: {a} {time['a']:.3f} ms, {b} {time['b']:.3f} ms ({time['delta']:+.3f} ms)")
    return findings


def diff_from_files(a, b, onnx_a=None, onnx_b=None, timing_a=None, timing_b=None, depth: int = 2, build_a: int | None = None, build_b: int | None = None) -> dict[str, Any]:
    from trt.report import load_plan

    graphs = [None, None]
    if onnx_a or onnx_b:
        from trt.onnx_graph import load_onnx_graph

        graphs = [load_onnx_graph(p) if p else None for p in (onnx_a, onnx_b)]
    with paused_gc():
        plan_a, _ = load_plan(a, timing_a, build=build_a)
        plan_b, _ = load_plan(b, timing_b, build=build_b)
        return build_diff(plan_a, plan_b, graphs[0], graphs[1], depth)
