"""A read-only index of an ONNX graph (a ModelProto's, or any nodes with `name`, `op_type`, `input`, `output`): its nodes
in order, who makes and who reads each tensor, its initializers and outputs, and the op families the checks name. It is
not updated when the graph is edited: an editor (the presets' Q/DQ clean-up) builds a new one for its next pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cached_property
from types import MappingProxyType
from typing import Any

QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
# the types quantized tensors are stored in (onnx.TensorProto numbers): what a Q/DQ's zero point or a quantized weight holds
INT4_TYPES = (21, 22)  # UINT4, INT4
FP8_TYPES = (17, 18, 19, 20)  # FLOAT8E4M3FN ... FLOAT8E5M2FNUZ
QUANTIZED_TYPES = {2: "UINT8", 3: "INT8", **dict.fromkeys(FP8_TYPES, "FP8"), **dict(zip(INT4_TYPES, ("UINT4", "INT4"))), 23: "FP4"}
SHAPE_OPS = frozenset({"Shape", "Size"})
# rearrange the elements of one tensor, values unchanged: a DQ commutes through them (TensorRT moves it
# after them), and ModelOpt's FP8 attention splits a Q/DQ pair by one (Q -> Transpose -> DQ)
LAYOUT_OPS = frozenset({"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze"})
# compute nothing: the layout ops and the ops that copy, select, join, split, cast or pass values on
# (what the report counts as data movement)
DATA_MOVEMENT_OPS = LAYOUT_OPS | {"Identity", "Expand", "Slice", "Concat", "Split", "Gather", "Cast", "Dropout"}


class GraphIndex:
    """Who makes and who reads each tensor (a node reading it twice is listed twice); the empty name is no tensor."""

    def __init__(self, nodes: Iterable[Any], initializers: Mapping[str, Any] = MappingProxyType({}), outputs: Iterable[str] = ()):
        self.nodes = tuple(nodes)
        self.initializers = MappingProxyType(dict(initializers))
        self.outputs = tuple(outputs)
        producers = {tensor: position for position, node in enumerate(self.nodes) for tensor in node.output if tensor}
        readers: dict[str, list[int]] = {}
        for position, node in enumerate(self.nodes):
            for tensor in filter(None, node.input):
                readers.setdefault(tensor, []).append(position)
        self.producers = MappingProxyType(producers)  # tensor -> position of the node that makes it
        self.readers = MappingProxyType({tensor: tuple(positions) for tensor, positions in readers.items()})  # tensor -> positions reading it

    @classmethod
    def of(cls, model: Any) -> GraphIndex:
        """The index of a ModelProto's main graph."""
        graph = model.graph
        return cls(graph.node, {tensor.name: tensor for tensor in graph.initializer}, [output.name for output in graph.output])

    def producer(self, tensor: str) -> Any | None:
        """The node that makes `tensor` (None for graph inputs, initializers and unknown names)."""
        position = self.producers.get(tensor)
        return None if position is None else self.nodes[position]

    def consumers(self, tensor: str) -> tuple[Any, ...]:
        """The nodes that read `tensor`, in graph order."""
        return tuple(self.nodes[position] for position in self.readers.get(tensor, ()))

    def op(self, tensor: str) -> str | None:
        """The op type of the node that makes `tensor`."""
        node = self.producer(tensor)
        return node.op_type if node is not None else None

    def constant(self, tensor: str):
        """The value of an initializer or of a Constant node's output (a numpy array), else None."""
        from onnx import numpy_helper

        if tensor in self.initializers:
            return numpy_helper.to_array(self.initializers[tensor])
        node = self.producer(tensor)
        if node is not None and node.op_type == "Constant":
            return numpy_helper.to_array(node.attribute[0].t)
        return None

    def initializer_type(self, tensor: str) -> int | None:
        """The onnx.TensorProto data type of an initializer."""
        initializer = self.initializers.get(tensor)
        return initializer.data_type if initializer is not None else None

    @cached_property
    def by_name(self) -> dict[str, Any]:
        """Each node by its name (for nodes named as `node_name` names them, unnamed ones included)."""
        return {node.name: node for node in self.nodes}

    @cached_property
    def position(self) -> dict[str, int]:
        """Each node's position in graph order, by its name."""
        return {node.name: position for position, node in enumerate(self.nodes)}

    def build_time(self) -> tuple[set[str], list[Any]]:
        """The tensors known at build time and the nodes TensorRT folds into constants: Constant and shape ops,
        and anything computed only from initializers and what they fold to."""
        static = set(self.initializers)
        folded = []
        for node in self.nodes:
            inputs = [t for t in node.input if t]
            if node.op_type == "Constant" or node.op_type in SHAPE_OPS or (inputs and all(t in static for t in inputs)):
                folded.append(node)
                static.update(node.output)
        return static, folded


def node_name(node: Any, position: int) -> str:
    """A node's name; an unnamed one is `<op>_<position>`, as the report and the prediction name it."""
    return node.name or f"{node.op_type}_{position}"


def static_dims(value: Any) -> list[int | None]:
    """A ValueInfoProto's dims: each fixed size, None where the dim is symbolic or unknown."""
    return [d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim]
