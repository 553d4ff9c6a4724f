"""What the prediction is made of before it becomes an engine plan: groups of ONNX nodes that run as one
layer (or one Myelin kernel), and the reasons it gives for a standalone Q/DQ layer, a layer left in float
or a Myelin region's boundary."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False)  # compared and hashed by identity: a group is one layer
class Group:
    """ONNX nodes that run as one engine layer, or as one kernel of a Myelin region."""

    kind: str  # conv, fc, pool, resize, scale, pointwise, shuffle, qdq, matmul, softmax, norm, reduce, other; myelin (8.x); kernel (10.x)
    nodes: list[str]  # the ONNX nodes it holds, in graph order
    anchor: str  # the node it is named after
    output: str | None = None  # the tensor the next layer reads
    residual: str | None = None  # a convolution's residual Add: the tensor it adds
    int8_in: bool = False  # reads a quantized activation (its DQ absorbed)
    int8_out: bool = False  # writes a quantized output (a Q absorbed)
    type: str | None = None  # a Myelin kernel's type: gemm, kgen, fusion
    label: str | None = None  # a Myelin kernel's name stem
    extra: list[str] = field(default_factory=list)  # nodes it shares with another kernel (a GEMM's bias applied in a reduction)


@dataclass
class Reason:
    """Why the prediction has a layer it would rather not, or where a Myelin region ends."""

    kind: str  # "standalone" (Q/DQ), "float" (in float or unfused), "cut" or "boundary" (of a Myelin region), "copy" (format)
    rule: str
    node: str  # the ONNX node that caused it
    layer: str | None = None  # the predicted layer it is about
    region: int | None = None  # the Myelin region it cuts or bounds
