"""Minimal ONNX graphs for the prediction's rule tests: a writer that names nodes as exporters do, with
Q/DQ pairs, convolutions and GEMMs in one line each."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from pipeline.core.qdq import CNN_RULES, TRANSFORMER_RULES
from trt.predict import predict

F = TensorProto.FLOAT


class Graph:
    def __init__(self):
        self.nodes, self.initializers, self.inputs, self.count = [], [], [], 0
        self.rng = np.random.default_rng(0)

    def input(self, name: str, shape: list, elem_type: int = F) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def init(self, name: str, value) -> str:
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, name: str, shape: tuple[int, ...]) -> str:
        return self.init(name, (self.rng.standard_normal(shape) * 0.1).astype(np.float32))

    def op(self, op_type: str, inputs: list[str], name: str | None = None, outputs: int = 1, **attributes) -> str:
        name = name or f"{op_type}_{self.count}"
        self.count += 1
        names = [f"{name}_out"] + [f"{name}_out{i}" for i in range(1, outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, name=name, **attributes))
        return names[0]

    def qdq(self, tensor: str, scale: float = 0.05, name: str | None = None) -> str:
        """Q then DQ of an activation (one scale per call)."""
        name = name or tensor
        s, z = self.init(f"{name}_scale", np.float32(scale)), self.init(f"{name}_zero", np.int8(0))
        return self.op("DequantizeLinear", [self.op("QuantizeLinear", [tensor, s, z], f"{name}_Q"), s, z], f"{name}_DQ")

    def qweight(self, name: str, shape: tuple[int, ...]) -> str:
        """A weight quantized per channel at build time (Q/DQ on the float initializer)."""
        s, z = self.init(f"{name}_wscale", np.full(shape[0], 0.02, np.float32)), self.init(f"{name}_wzero", np.zeros(shape[0], np.int8))
        q = self.op("QuantizeLinear", [self.weight(f"{name}.weight", shape), s, z], f"{name}_wQ", axis=0)
        return self.op("DequantizeLinear", [q, s, z], f"{name}_wDQ", axis=0)

    def conv(self, x: str, name: str, channels: int = 8, quantized: bool = False) -> str:
        weight = self.qweight(name, (channels, channels, 3, 3)) if quantized else self.weight(f"{name}.weight", (channels, channels, 3, 3))
        return self.op("Conv", [x, weight], name, pads=[1, 1, 1, 1])

    def matmul(self, x: str, name: str, size: int = 64, out: int | None = None, bias: bool = True, quantized: bool = False) -> str:
        shape = (size, out or size)
        weight = self.weight(f"{name}.weight", shape)
        if quantized:
            s, z = self.init(f"{name}_wscale", np.float32(0.02)), self.init(f"{name}_wzero", np.int8(0))
            weight = self.op("DequantizeLinear", [self.op("QuantizeLinear", [weight, s, z], f"{name}_wQ"), s, z], f"{name}_wDQ")
        y = self.op("MatMul", [x, weight], name)
        return self.op("Add", [y, self.weight(f"{name}.bias", (out or size,))], f"{name}_bias") if bias else y

    def model(self, *outputs: str, opset: int = 17):
        graph = helper.make_graph(self.nodes, "g", self.inputs, [helper.make_tensor_value_info(o, F, None) for o in outputs], self.initializers)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def image(g: Graph, channels: int = 8) -> str:
    return g.input("x", [1, channels, 8, 8])


def tokens(g: Graph, size: int = 64) -> str:
    return g.input("x", [1, 16, size])


def run(model, trt_major: int = 10, precision: str = "auto", rules=None, max_sequence: int | None = None):
    rules = rules or (CNN_RULES if any(n.op_type == "Conv" for n in model.graph.node) else TRANSFORMER_RULES)
    return predict(model, rules, precision, trt_major, max_sequence)


def layer_nodes(prediction) -> list[list[str]]:
    """Each layer's ONNX nodes without Q/DQ and weights, the empty ones left out."""
    qdq = ("Quantize", "Dequantize", "_wQ", "_wDQ", "_Q", "_DQ")
    found = [[n for n in layer.onnx_nodes if not any(mark in n for mark in qdq)] for layer in prediction.layers]
    return [nodes for nodes in found if nodes]


def reasons(prediction, kind: str | None = None) -> set[tuple[str, str]]:
    return {(r.rule, r.node) for r in prediction.reasons if kind is None or r.kind == kind}
