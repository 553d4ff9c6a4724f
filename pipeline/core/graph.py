"""A read-only index of an ONNX graph (a ModelProto's, or any nodes with `name`, `op_type`, `input`, `output`): its nodes
in order, who makes and who reads each tensor, its initializers and outputs, and the op families the checks name. It is
not updated when the graph is edited: an editor (the presets' Q/DQ clean-up) builds a new one for its next pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
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
