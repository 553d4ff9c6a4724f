"""What the report and the diff conclude, as typed objects: the renderers (trt/render/) read them, and
`to_json()` writes the JSON whose keys DESIGN.md fixes (`source`, `layers`, `summary`) with the rest.
Each has one `verdict`, the line every format opens with. trt/report.py and trt/diff.py build them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from trt.plan import Build, EnginePlan, Layer, Region


@dataclass
class Source:
    layer_info: str
    format: str
    verbosity: str
    onnx: str | None
    io_tensors: list[str]
    build: int | None  # the listing read, when the file holds several
    builds: list[Build]


@dataclass
class Summary:
    """DESIGN.md's summary keys, then the report's own."""

    layers: int
    myelin_layers: int
    myelin_graphs: int  # in profile 0 (each profile is a copy of the network)
    metadata_onnx_nodes: int
    resolved_onnx_nodes: int | None  # None without the ONNX file
    unresolved_onnx_nodes: list[str]
    timed_layers: int
    total_time_ms: float | None
    profiles: int
    myelin_graphs_per_profile: list[int]
    regions: int
    precision: str  # the engine's: INT8 when anything quantizes, else its lowest float precision, or "unknown"


@dataclass
class Breakdown:
    layer_types: dict[str, int]
    precisions: dict[str, int]
    myelin_kernels_per_graph: dict[str, int]
    qdq_layers: list[str]  # layers that only quantize or dequantize


@dataclass
class Coverage:
    """The ONNX nodes in no engine layer, by why (folded constants and shapes, data movement, Q/DQ, compute)."""

    onnx_nodes: int
    in_layers: int
    not_in_layers: dict[str, list[str]]


@dataclass
class ModuleRow:
    """A torch module (its scope cut at the report's depth): its ONNX nodes, the layers holding them, their time."""

    module: str
    onnx_nodes: int
    layers: int
    myelin_kernels: int
    time_ms: float | None
    precisions: dict[str, int]


@dataclass
class Report:
    plan: EnginePlan  # its layers and regions are the report's
    source: Source
    verdict: str
    summary: Summary
    breakdown: Breakdown
    coverage: Coverage | None  # None without the ONNX file
    modules: list[ModuleRow]
    module_depth: int
    findings: list[str]
    fusion_map: dict[str, Any]  # the HTML strip's data (trt/fusion_map.py), JSON as it is

    @property
    def layers(self) -> list[Layer]:
        return self.plan.layers

    @property
    def regions(self) -> list[Region]:
        return self.plan.regions

    def to_json(self) -> dict[str, Any]:
        coverage = self.coverage and {"onnx_nodes": self.coverage.onnx_nodes, "in_layers": self.coverage.in_layers,
                                      "not_in_layers": {k: {"count": len(v), "nodes": v} for k, v in self.coverage.not_in_layers.items()}}
        return {
            "source": asdict(self.source), "verdict": self.verdict, "layers": [layer_json(layer) for layer in self.layers],
            "regions": [region_json(region) for region in self.regions], "summary": asdict(self.summary), "breakdown": asdict(self.breakdown),
            "coverage": coverage, "modules": [asdict(m) for m in self.modules], "module_depth": self.module_depth, "findings": self.findings,
            "fusion_map": self.fusion_map,
        }


def layer_json(layer: Layer) -> dict[str, Any]:
    return {"name": layer.name, "type": layer.type, "myelin": layer.myelin, "myelin_graph": layer.myelin_graph, "onnx_nodes": layer.onnx_nodes,
            "precision": layer.precision, "time_ms": layer.time_ms, "mapping": layer.mapping, "origin": layer.origin, "tactic": layer.tactic,
            "profile": layer.profile, "region": layer.region}


def region_json(region: Region) -> dict[str, Any]:
    return {"index": region.index, "kind": region.kind, "name": region.name, "type": region.type, "profile": region.profile,
            "myelin_graph": region.myelin_graph, "compute": region.compute, "qdq": region.qdq, "layers": region.indices,
            "onnx_node_count": len(region.onnx_nodes), "precision": region.precision, "time_ms": region.time_ms}


# ---------------------------------------------------------------- the diff


@dataclass
class Piece:
    """A region of the other engine and the nodes of the compared region it holds."""

    region: Region
    nodes: list[str]


@dataclass
class RegionRow:
    """Where one compute region of A runs in B."""

    a: Region
    b: list[Piece]
    nodes: int  # A's region's nodes that B names too
    status: str  # "same", "merged" (B runs it inside a larger region), "split" or "not named in B"
    approximate: bool  # a names-only region placed by its ends
    precision_change: str | None  # e.g. "FP16 -> INT8"


@dataclass
class Cut:
    """An edge between two pieces of a split region, with the Q/DQ pair on it (None: not known)."""

    from_region: int | None
    to_region: int | None
    from_node: str | None
    to_node: str | None
    quantize: str | None
    dequantize: str | None


@dataclass
class Split:
    """A compute region of one engine that the other runs as several pieces, and the edges cut."""

    a_region: Region
    nodes: int  # its nodes both engines name
    pieces: list[Piece]
    cuts: list[Cut]
    qdq_source: str  # where the Q/DQ pairs at the cuts were found: "B's ONNX" or "B's layer names"
    approximate: bool  # a names-only region placed by its ends

    @property
    def myelin_pieces(self) -> int:
        return sum(p.region.kind == "myelin" for p in self.pieces)

    @property
    def qdq_pairs(self) -> int:
        return len({(c.quantize, c.dequantize) for c in self.cuts if c.quantize})


@dataclass
class AlignedPair:
    """Compute regions of A and B paired by order and kind (when node names do not join); None: one side only."""

    a: Region | None
    b: Region | None

    @property
    def precision_change(self) -> str | None:
        changed = self.a is not None and self.b is not None and self.a.precision and self.b.precision and self.a.precision != self.b.precision
        return f"{self.a.precision} -> {self.b.precision}" if changed else None


@dataclass
class Total:
    a: int | float | None
    b: int | float | None
    delta: int | float | None


@dataclass
class ModuleDelta:
    module: str
    layers_a: int
    layers_b: int
    layers_delta: int
    myelin_a: int
    myelin_b: int
    time_a_ms: float | None
    time_b_ms: float | None
    time_delta_ms: float | None


@dataclass
class SharedNames:
    common: int
    only_a: int
    only_b: int
    share: float  # common over the smaller side's names


@dataclass
class Diff:
    a: Report
    b: Report
    join: str  # "onnx-names", or "order-and-type" when the engines share too few node names
    identical: bool
    shared: SharedNames
    totals: dict[str, Total]  # layers, regions, myelin_layers, myelin_graphs, total_time_ms, qdq_layers
    regions: list[RegionRow]
    splits: list[Split]  # regions of A that B cuts
    merges: list[Split]  # regions of B that A cuts (the splits of B against A)
    aligned: list[AlignedPair]
    modules: list[ModuleDelta]
    fusion_map: dict[str, Any] = field(default_factory=dict)
    verdict: str = ""
    findings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        def side(report: Report) -> dict[str, Any]:
            return asdict(report.source) | {"precision": report.summary.precision, "verdict": report.verdict}

        totals = {key: asdict(total) for key, total in self.totals.items()} | {
            "precisions": {"a": self.a.breakdown.precisions, "b": self.b.breakdown.precisions}}
        return {
            "a": side(self.a), "b": side(self.b), "join": self.join, "identical": self.identical, "shared_node_names": asdict(self.shared),
            "totals": totals, "regions": [_row_json(row) for row in self.regions], "splits": [_split_json(s) for s in self.splits],
            "merges": [_split_json(s) for s in self.merges],
            "aligned": [{"a": region_summary(p.a), "b": region_summary(p.b), "precision_change": p.precision_change} for p in self.aligned],
            "modules": [asdict(m) for m in self.modules], "qdq_layers": {"a": self.a.breakdown.qdq_layers, "b": self.b.breakdown.qdq_layers},
            "profiles": {"a": self.a.plan.profiles, "b": self.b.plan.profiles}, "verdict": self.verdict, "findings": self.findings,
            "fusion_map": self.fusion_map,
        }


def region_summary(region: Region | None) -> dict[str, Any] | None:
    if region is None:
        return None
    return {"index": region.index, "name": region.name, "kind": region.kind, "type": region.type, "layers": len(region.layers),
            "precision": region.precision, "time_ms": region.time_ms}


def _row_json(row: RegionRow) -> dict[str, Any]:
    return {"a": region_summary(row.a), "b": [region_summary(p.region) | {"nodes": len(p.nodes)} for p in row.b], "nodes": row.nodes,
            "status": row.status, "approximate": row.approximate, "precision_change": row.precision_change}


def _split_json(split: Split) -> dict[str, Any]:
    return {"a_region": region_summary(split.a_region), "nodes": split.nodes, "b_regions": [region_summary(p.region) | {"nodes": p.nodes} for p in split.pieces],
            "b_myelin_regions": split.myelin_pieces, "cuts": [asdict(c) for c in split.cuts], "qdq_pairs": split.qdq_pairs,
            "qdq_source": split.qdq_source, "approximate": split.approximate}
