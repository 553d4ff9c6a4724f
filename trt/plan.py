"""One typed model of an engine's layers, whatever TensorRT file it came from."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MYELIN_KERNEL = re.compile(r"_myl(?P<graph>\d+)_(?P<kernel>\d+)$")
PROFILE_SUFFIX = re.compile(r" \[profile (?P<index>\d+)\]$")

# How a layer's ONNX nodes were found, from most to least exact.
MAPPING_METADATA = "metadata"  # `[ONNX Layer: ...]` entries written by TensorRT (detailed verbosity)
MAPPING_NAME = "name"  # split from the layer name `a + b + c` (no Metadata: TensorRT 8.x, names only)
MAPPING_RANGE = "range"  # `{ForeignNode[first...last]}` resolved over the ONNX topological order


@dataclass
class Tensor:
    name: str
    dims: list[int] | None = None
    dtype: str | None = None  # normalized: FP32, FP16, BF16, INT8, FP8, INT32, INT64, BOOL, ...
    format: str | None = None  # TensorRT's format string, when given


@dataclass
class Layer:
    name: str
    type: str
    onnx_nodes: list[str] = field(default_factory=list)
    mapping: str | None = None
    inputs: list[Tensor] = field(default_factory=list)
    outputs: list[Tensor] = field(default_factory=list)
    tactic: str | None = None
    origin: str | None = None  # "REFORMAT" or "QDQ" for reformat layers (TensorRT 8.x)
    myelin_graph: int | None = None
    foreign_range: tuple[str, str] | None = None  # first and last node of a `{ForeignNode[...]}`
    profile: int = 0
    time_ms: float | None = None

    @property
    def myelin(self) -> bool:
        return self.myelin_graph is not None

    @property
    def base_name(self) -> str:
        """The name without the ` [profile N]` suffix TensorRT adds from the second profile on."""
        return PROFILE_SUFFIX.sub("", self.name)

    @property
    def precision(self) -> str | None:
        """The lowest floating/quantized precision among the layer's tensors, else its first output's type."""
        types = [t.dtype for t in self.inputs + self.outputs if t.dtype]
        for rank in _PRECISION_RANK:
            if rank in types:
                return rank
        return self.outputs[0].dtype if self.outputs and self.outputs[0].dtype else (types[0] if types else None)


_PRECISION_RANK = ("FP4", "INT4", "FP8", "INT8", "FP16", "BF16", "FP32")


@dataclass
class EnginePlan:
    source: str
    format: str  # e.g. "inspector-json (TensorRT 10.x)", "builder-log (detailed)"
    verbosity: str  # "detailed" or "layer_names_only"
    layers: list[Layer]
    io_tensors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


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
