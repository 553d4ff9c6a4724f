"""The ONNX graph as the prediction reads it: the core Q/DQ index (pipeline/core/qdq.py `QdqGraph`) over
named nodes, with what TensorRT folds away at build time, the weights' Q/DQ, the network's inputs and
outputs and their types, and the attention the graph holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from pipeline.core.attention import attention_scores, tensor_shapes
from pipeline.core.graph import FP8_TYPES, QDQ_OPS, QUANTIZED_TYPES, node_name
from pipeline.core.qdq import QdqGraph
from trt.predict.rules import ERASED_OPS, GEMM_OPS, RESHAPE_OPS

FLOAT_TYPES = {1: "FP32", 10: "FP16", 16: "BF16", 11: "FP64"}


@dataclass
class Node:
    """An ONNX node with a name (unnamed nodes get `<op>_<index>`, as the report names them)."""

    name: str
    op_type: str
    input: list[str]
    output: list[str]
    proto: Any = field(repr=False)

    @property
    def attribute(self):
        return self.proto.attribute


class PredictGraph(QdqGraph):
    """The graph, its folded nodes, its weights' Q/DQ, its I/O types, in topological (ONNX) order."""

    def __init__(self, model):
        graph = model.graph
        nodes = [Node(node_name(p, i), p.op_type, list(p.input), list(p.output), p) for i, p in enumerate(graph.node)]
        super().__init__(nodes, {t.name: t for t in graph.initializer}, [o.name for o in graph.output])
        self.model = model
        self.input_types = {v.name: v.type.tensor_type.elem_type for v in graph.input if v.name not in self.initializers}
        self.output_types = {v.name: v.type.tensor_type.elem_type for v in graph.output}
        # [FC: constants fold]; the Q/DQ of weights go into the layer that reads the weight [EQ: quantized weights]
        self.static, constant = self.build_time()
        self.folded = {n.name for n in constant if n.op_type not in QDQ_OPS}
        self.weight_qdq = {n.name for n in constant if n.op_type in QDQ_OPS}
        # Identity/Dropout, and a reshape that writes no network output [FC: no-op erasure]
        self.erased = {n.name for n in self.nodes if n.name not in self.folded
                       and (n.op_type in ERASED_OPS or n.op_type in RESHAPE_OPS and not set(n.output) & set(self.outputs))}

    def computed(self, node: Node) -> list[str]:
        """The inputs of `node` computed at run time (not constants, weights or shapes)."""
        return [t for t in node.input if t and t not in self.static]

    def is_weighted(self, node: Node) -> bool:
        """A GEMM or convolution whose weight (input 1) is known at build time."""
        return node.op_type in ("Conv", "ConvTranspose", *GEMM_OPS) and len(node.input) > 1 and node.input[1] in self.static

    @cached_property
    def shapes(self) -> dict[str, list[int | None]]:
        return tensor_shapes(self.model)

    def attention(self) -> list[tuple[Node, int | None, int | None]]:
        """(score MatMul, head size, sequence) of each attention in the graph."""
        if not any(n.op_type == "Softmax" for n in self.nodes):
            return []
        return attention_scores(self.model, self, self.shapes)

    def weight_only(self) -> tuple[str, int] | None:
        """(the stored type, how many GEMMs) where GEMM weights are dequantized from a quantized type and no activation is
        quantized: weight-only quantization (ModelOpt's INT4 AWQ). TensorRT keeps such a weight in its type and
        dequantizes it inside the GEMM, which computes in the float type of its input."""
        if self.quantized_type() is not None:
            return None
        stored = {n.output[0]: QUANTIZED_TYPES[self.initializers[n.input[0]].data_type] for n in self.nodes
                  if n.name in self.weight_qdq and n.op_type == "DequantizeLinear" and n.input[0] in self.initializers
                  and self.initializers[n.input[0]].data_type in QUANTIZED_TYPES}
        types = [stored[n.input[1]] for n in self.nodes if n.op_type in GEMM_OPS and len(n.input) > 1 and n.input[1] in stored]
        return (max(set(types), key=types.count), len(types)) if types else None

    def float_type(self) -> str:
        """The float precision the model computes in: FP16/BF16 when its weights are, else FP32."""
        types = {t.data_type for t in self.initializers.values() if t.data_type in FLOAT_TYPES}
        casts = {a.i for n in self.nodes if n.op_type == "Cast" for a in n.attribute if a.name == "to"}
        for onnx_type in (10, 16):
            if onnx_type in types or onnx_type in casts:
                return FLOAT_TYPES[onnx_type]
        return "FP32"

    def quantized_type(self) -> str | None:
        """INT8 or FP8 when the graph has activation Q/DQ; None without."""
        found = None
        for node in self.nodes:
            if node.op_type == "QuantizeLinear" and node.name not in self.weight_qdq:
                zero = self.initializers.get(node.input[2]) if len(node.input) > 2 else None
                if zero is not None and zero.data_type in FP8_TYPES:
                    return "FP8"
                found = "INT8"
        return found
