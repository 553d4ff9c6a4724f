"""One typed model of an engine's layers, whatever TensorRT file it came from, and its regions: what runs as one
unit, a Myelin graph (its kernels `..._myl<g>_<k>` in one profile, or an 8.x `{ForeignNode[...]}`) or a layer."""

from __future__ import annotations

import contextlib
import gc
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache

# bounded digit runs: a name with a 5,000-digit "graph number" is not a Myelin kernel
MYELIN_KERNEL = re.compile(r"_myl(?P<graph>\d{1,9})_(?P<kernel>\d{1,9})$")
# ` [profile N]` ends the name, or sits before the Myelin suffix: `node_linear [profile 1]_myl11_2`
PROFILE_SUFFIX = re.compile(r" \[profile (?P<index>\d{1,6})\](?=_myl\d{1,9}_\d{1,9}$|$)")

# How a layer's ONNX nodes were found, from most to least exact.
MAPPING_METADATA = "metadata"  # `[ONNX Layer: ...]` entries written by TensorRT (detailed verbosity)
MAPPING_NAME = "name"  # split from the layer name `a + b + c` (no Metadata: TensorRT 8.x, names only)
MAPPING_RANGE = "range"  # `{ForeignNode[first...last]}`: the names it shows, or the range over the ONNX order

# Layers that only move or re-lay data between regions; they never make a region "split".
NON_COMPUTE_TYPES = frozenset({"Reformat", "NoOp", "MyelinReformat"})
# Q/DQ node names: ONNX (QuantizeLinear / DequantizeLinear), tf2onnx (QuantLinearNode__N), TensorFlow
QDQ_NAME = re.compile(r"QuantizeLinear|DequantizeLinear|QuantLinearNode|DequantLinearNode|QuantizeAndDequantize")
PRECISION_RANK = ("FP4", "INT4", "FP8", "INT8", "FP16", "BF16", "FP32")


@dataclass(slots=True)
class Layer:
    name: str
    type: str
    onnx_nodes: list[str] = field(default_factory=list)
    mapping: str | None = None
    precision: str | None = None  # the lowest floating/quantized precision among its tensors (set_tensors)
    tensor_profile: int = 0  # the highest ` [profile N]` in its tensors' names (Myelin kernels carry it only there)
    tactic: str | None = None
    origin: str | None = None  # "REFORMAT" or "QDQ" for reformat layers (TensorRT 8.x)
    myelin_graph: int | None = None
    foreign_range: tuple[str, str] | None = None  # first and last name of a `{ForeignNode[first...last]}`
    profile: int = 0
    time_ms: float | None = None
    # set by EnginePlan.settle() once the layers are read:
    region: int | None = None  # index into EnginePlan.regions
    qdq: bool = False  # it only quantizes or dequantizes

    @property
    def myelin(self) -> bool:
        return self.myelin_graph is not None

    @property
    def base_name(self) -> str:
        """The name without the ` [profile N]` TensorRT adds from the second profile on."""
        return without_profile(self.name)

    @property
    def compute(self) -> bool:
        """False for layers that only copy or re-lay data (reformats, no-ops); a Q/DQ reformat computes."""
        return self.myelin_graph is not None or self.origin == "QDQ" or (self.type not in NON_COMPUTE_TYPES and self.origin != "REFORMAT")


def set_tensors(layer: Layer, inputs: list[tuple[str, str | None]], outputs: list[tuple[str, str | None]]) -> None:
    """What the report needs from a layer's (name, normalized type) tensors: its precision (the lowest
    floating/quantized type among them, else its first output's type) and the profile their names carry."""
    types = [dtype for _, dtype in inputs + outputs if dtype]
    layer.precision = lowest_precision(types, outputs[0][1] if outputs else None)
    layer.tensor_profile = max((p for name, _ in inputs + outputs if (p := profile_of(name)) is not None), default=0)


def lowest_precision(types: list[str], first_output: str | None) -> str | None:
    for rank in PRECISION_RANK:
        if rank in types:
            return rank
    return first_output or (types[0] if types else None)


@dataclass(slots=True)
class Region:
    """A Myelin graph (kind "myelin") or one standalone layer (kind "layer"); built by EnginePlan.settle()."""

    index: int
    kind: str
    profile: int
    layers: list[Layer]
    myelin_graph: int | None = None
    indices: list[int] = field(default_factory=list)  # the layers' positions in EnginePlan.layers
    onnx_nodes: list[str] = field(default_factory=list)
    precision: str | None = None
    compute: bool = True  # False when every layer only copies data
    qdq: bool = False  # a standalone Q/DQ layer

    @property
    def name(self) -> str:
        if self.kind == "layer" or self.layers[0].type == "Myelin":  # a layer, or a TensorRT 8.x {ForeignNode[...]} region
            return self.layers[0].name
        return f"Myelin graph {self.myelin_graph}" + (f" [profile {self.profile}]" if self.profile else "")

    @property
    def type(self) -> str:
        return "Myelin" if self.kind == "myelin" else self.layers[0].type

    @property
    def time_ms(self) -> float | None:
        times = [layer.time_ms for layer in self.layers if layer.time_ms is not None]
        return sum(times) if times else None

    def settle(self) -> None:
        if len(self.layers) == 1:
            layer = self.layers[0]
            self.onnx_nodes, self.precision, self.compute, self.qdq = layer.onnx_nodes, layer.precision, layer.compute, self.kind == "layer" and layer.qdq
            return
        self.onnx_nodes = list(dict.fromkeys(n for layer in self.layers for n in layer.onnx_nodes))
        found = {layer.precision for layer in self.layers} - {None}
        self.precision = next((rank for rank in PRECISION_RANK if rank in found), min(found) if found else None)
        self.compute = any(layer.compute for layer in self.layers)
        self.qdq = False


@dataclass
class Build:
    """One layer listing in a file that holds several (a log with several builds)."""

    number: int  # 1-based, as `--build N` takes it
    first_line: int
    last_line: int
    layers: int
    format: str
    same_as: int | None = None  # number of an earlier listing with the same layers


@dataclass
class EnginePlan:
    source: str
    format: str  # e.g. "inspector JSON, detailed (TensorRT 10.x)", "verbose builder log, layer names only"
    verbosity: str  # "detailed" or "layer_names_only"
    layers: list[Layer]
    io_tensors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    builds: list[Build] = field(default_factory=list)  # filled when the file holds several listings
    build: int | None = None  # the listing these layers come from
    regions: list[Region] = field(default_factory=list)

    @property
    def profiles(self) -> int:
        return 1 + max((layer.profile for layer in self.layers), default=0)

    def settle(self) -> EnginePlan:
        """Per-layer Q/DQ facts, then the regions: one per (profile, Myelin graph), one per
        other layer, in layer order. Called when the layers are read, and again if their nodes change."""
        for layer in self.layers:  # TensorRT 8.x `Origin: QDQ`, or all its ONNX nodes are Q/DQ nodes
            layer.qdq = layer.origin == "QDQ" or (bool(layer.onnx_nodes) and all(looks_qdq(n) for n in layer.onnx_nodes))
        self.regions = []
        by_graph: dict[tuple[int, int], Region] = {}
        for index, layer in enumerate(self.layers):
            if layer.myelin:
                key = (layer.profile, layer.myelin_graph)
                region = by_graph.get(key)
                if region is None:
                    region = by_graph[key] = Region(len(self.regions), "myelin", layer.profile, [], layer.myelin_graph)
                    self.regions.append(region)
                region.layers.append(layer)
            else:
                region = Region(len(self.regions), "layer", layer.profile, [layer])
                self.regions.append(region)
            region.indices.append(index)
            layer.region = region.index
        for region in self.regions:
            region.settle()
        return self


def looks_qdq(name: str) -> bool:
    """A Q/DQ node, told by its name (without the ONNX graph)."""
    return "Quant" in name and QDQ_NAME.search(name) is not None


def without_profile(name: str) -> str:
    return PROFILE_SUFFIX.sub("", name) if " [profile " in name else name


def profile_of(name: str) -> int | None:
    """N of a ` [profile N]` in the name, else None."""
    match = PROFILE_SUFFIX.search(name) if " [profile " in name else None
    return int(match["index"]) if match else None


@lru_cache(maxsize=512)
def normalize_dtype(text: str | None) -> str | None:
    """Map TensorRT's type and format strings to one short name."""
    if not text:
        return None
    t = text.lower()
    for needle, name in _DTYPE_NEEDLES:
        if needle in t:
            return name
    return text.strip()


_DTYPE_NEEDLES = (
    ("bfloat16", "BF16"), ("bf16", "BF16"), ("fp8", "FP8"), ("e4m3", "FP8"), ("fp4", "FP4"), ("e2m1", "FP4"),
    ("uint8", "UINT8"), ("int8", "INT8"), ("int4", "INT4"), ("half", "FP16"), ("fp16", "FP16"), ("float16", "FP16"),
    ("int64", "INT64"), ("int32", "INT32"), ("bool", "BOOL"), ("fp32", "FP32"), ("float", "FP32"),
)


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pause Python's cycle collector while reading a file into many small acyclic objects (on a 40,000-layer
    engine its collections cost more than the parsing); on success freeze them (gc.freeze) so it never scans them."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        gc.freeze()
    finally:
        if enabled:
            gc.enable()
