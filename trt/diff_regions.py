"""Where the compute regions of one engine run in another's: the B regions holding an A region's ONNX nodes
(one: it survived, or was merged; several: B splits it, cut at the Q/DQ pairs found there). Q/DQ nodes and nodes
only one engine names never make a split. Names-only 8.x ForeignNode ranges are placed by their ends (approximate);
engines whose node names differ are aligned by order and kind instead."""

from __future__ import annotations

import difflib
import re
from functools import cached_property

from pipeline.core.graph import QDQ_OPS
from trt.onnx_graph import OnnxGraph
from trt.parsers.common import split_top
from trt.plan import MAPPING_RANGE, EnginePlan, Region, looks_qdq
from trt.views import AlignedPair, Cut, Piece, RegionRow, Split


class Side:
    """One engine's compute regions of profile 0 and where each ONNX node runs in them."""

    def __init__(self, plan: EnginePlan, graph: OnnxGraph | None):
        self.plan, self.graph = plan, graph
        self.regions = [r for r in plan.regions if r.profile == 0 and r.compute]
        self.nodes = {region.index: {n for n in region.onnx_nodes if not self.is_qdq(n)} for region in self.regions}
        self.where: dict[str, set[int]] = {}
        for index, names in self.nodes.items():
            for name in names:
                self.where.setdefault(name, set()).add(index)
        self.by_index = {r.index: r for r in self.regions}

    def is_qdq(self, name: str) -> bool:
        node = self.graph.by_name.get(name) if self.graph else None
        return node.op_type in QDQ_OPS if node else looks_qdq(name)

    @cached_property
    def anchors(self) -> dict[str, int]:
        """The first region holding each ONNX node, layer name, or part of one."""
        anchors: dict[str, int] = {}
        for region in self.plan.regions:
            if region.profile != 0:
                continue
            for layer in region.layers:
                inner = layer.base_name.removeprefix("{ForeignNode[").removesuffix("]}")
                parts = [p.strip() for half in inner.split("...") for p in split_top(half, " + ")]
                for key in [*layer.onnx_nodes, layer.base_name, *parts]:
                    anchors.setdefault(key, region.index)
        return anchors


# ---------------------------------------------------------------- joined by ONNX node names


def _landing(side_a: Side, region: Region, side_b: Side, common: set[str]) -> tuple[list[Piece], bool]:
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
    return [Piece(side_b.by_index[i], sorted(hits[i])) for i in kept], approximate


def _holders(hits: dict[int, set[str]], b: int, side_b: Side) -> set[int]:
    """B regions that could hold all of hits[b]: those holding its first node (checked without a full pairwise scan)."""
    first = next(iter(hits[b]))
    return side_b.where[first] & hits.keys()


def _span(region: Region, side_b: Side) -> list[int] | None:
    """A names-only ForeignNode region of A placed by its two ends in B's layer order."""
    first, last = region.layers[0].foreign_range
    start, stop = side_b.anchors.get(first), side_b.anchors.get(last)
    if start is None or stop is None:
        return None
    low, high = sorted((start, stop))
    return [r.index for r in side_b.regions if low <= r.index <= high]


def region_rows(side_a: Side, side_b: Side, common: set[str]) -> list[RegionRow]:
    """Per compute region of A: where it runs in B and at which precision."""
    rows = []
    for region in side_a.regions:
        if not side_a.nodes[region.index]:
            continue
        pieces, approximate = _landing(side_a, region, side_b, common)
        if not pieces:
            status = "not named in B"
        elif len(pieces) > 1:
            status = "split"
        elif set(pieces[0].nodes) != side_b.nodes[pieces[0].region.index] & common:
            status = "merged"  # B runs it inside a larger region
        else:
            status = "same"
        precisions_b = sorted({p.region.precision for p in pieces} - {None})
        changed = region.precision is not None and precisions_b and precisions_b != [region.precision]
        rows.append(RegionRow(region, pieces, len(side_a.nodes[region.index] & common), status, approximate,
                              f"{region.precision} -> {'/'.join(precisions_b)}" if changed else None))
    return rows


def splits(side_a: Side, side_b: Side, common: set[str]) -> list[Split]:
    """Compute regions of A whose shared nodes land in two or more compute regions of B, with the cuts."""
    found = []
    for region in side_a.regions:
        if not side_a.nodes[region.index] & common and region.layers[0].mapping != MAPPING_RANGE:
            continue
        pieces, approximate = _landing(side_a, region, side_b, common)
        if len(pieces) < 2:
            continue
        shared = side_a.nodes[region.index] & common
        cuts, source = _cuts(shared, pieces, side_b)
        found.append(Split(region, len(shared), pieces, cuts, source, approximate))
    return found


def _cuts(nodes: set[str], pieces: list[Piece], side_b: Side) -> tuple[list[Cut], str]:
    """Edges between nodes of the split group that B runs in different regions, each with the Q/DQ pair on it:
    from B's ONNX (outputs followed, directly or through Q -> DQ), else the Q/DQ nodes B's layers name."""
    home = {name: piece.region.index for piece in reversed(pieces) for name in piece.nodes}  # a node's first piece
    graph = side_b.graph
    if graph is None:
        qdq = [n for piece in pieces for n in piece.region.onnx_nodes if looks_qdq(n)]
        return [Cut(None, None, None, None, q, None) for q in dict.fromkeys(qdq) if "Dequant" not in q], "B's layer names"
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
                        cuts.append(Cut(home[name], home[target], name, target, q, dq))
    return cuts, "B's ONNX"


# ---------------------------------------------------------------- node names differ


_KERNEL_FAMILY = re.compile(r"^(?:Cask|Cudnn|Cuda|Tiled|Cublas|Cutlass)")


def _kind(region: Region) -> str:
    """The operation a region runs, without the kernel library: CaskConvolution / CudnnConvolution -> Convolution."""
    return _KERNEL_FAMILY.sub("", region.type)


def aligned(side_a: Side, side_b: Side) -> list[AlignedPair]:
    """Pair compute regions of A and B by order and kind (used when node names do not join).
    Standalone Q/DQ layers have no counterpart in a float engine: they are listed, not paired."""
    a = [r for r in side_a.regions if not r.qdq]
    b = [r for r in side_b.regions if not r.qdq]
    matcher = difflib.SequenceMatcher(a=[_kind(r) for r in a], b=[_kind(r) for r in b], autojunk=False)
    rows = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        pairs = list(zip(a[i1:i2], b[j1:j2])) if tag in ("equal", "replace") else []
        rows += [AlignedPair(x, y) for x, y in pairs]
        rows += [AlignedPair(x, None) for x in a[i1 + len(pairs) : i2]]
        rows += [AlignedPair(None, y) for y in b[j1 + len(pairs) : j2]]
    return rows
