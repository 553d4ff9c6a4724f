"""What the report needs from an ONNX file: node names, order, types, edges and module scopes.

Weights are never loaded (external data stays on disk). Module scopes come from the
dynamo exporter's `pkg.torch.onnx.name_scopes` metadata, else from TorchScript-style names
(`/encoder/layers.3/mha/attn/MatMul` -> encoder / layers.3 / mha / attn).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.errors import InputError
from pipeline.core.scopes import inline_functions_proto, node_scope

QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
SHAPE_OPS = frozenset({"Shape", "Size"})
DATA_MOVEMENT_OPS = frozenset(
    {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Expand", "Slice", "Concat", "Split", "Gather", "Cast", "Dropout"}
)


@dataclass
class Node:
    name: str
    op_type: str
    inputs: list[str]
    outputs: list[str]
    scope: tuple[str, ...]


@dataclass
class OnnxGraph:
    path: str
    nodes: list[Node]  # topological order, as ONNX requires
    initializers: set[str]
    by_name: dict[str, Node] = field(default_factory=dict)
    producer: dict[str, Node] = field(default_factory=dict)
    consumers: dict[str, list[Node]] = field(default_factory=dict)
    position: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for index, node in enumerate(self.nodes):
            self.by_name[node.name] = node
            self.position[node.name] = index
            for tensor in node.outputs:
                self.producer[tensor] = node
            for tensor in node.inputs:
                self.consumers.setdefault(tensor, []).append(node)

    def constant_like(self) -> set[str]:
        """Nodes TensorRT folds at build time: constants and anything computed only from constants or shapes."""
        static = set(self.initializers)
        folded = set()
        for node in self.nodes:
            inputs = [t for t in node.inputs if t]
            if node.op_type in ("Constant", *SHAPE_OPS) or (inputs and all(t in static for t in inputs)):
                folded.add(node.name)
                static.update(node.outputs)
        return folded


def load_onnx_graph(path: Path | str) -> OnnxGraph:
    import onnx

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such ONNX file; pass the model the engine was built from with --onnx")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as err:  # protobuf's DecodeError and friends
        raise InputError(f"{path}: not a readable ONNX model ({type(err).__name__}); pass the .onnx the engine was built from") from err
    model = inline_functions_proto(model)  # TensorRT's parser inlines local functions: so do we
    nodes = []
    for index, proto in enumerate(model.graph.node):
        name = proto.name or f"{proto.op_type}_{index}"
        metadata = {p.key: p.value for p in proto.metadata_props}
        nodes.append(Node(name, proto.op_type, list(proto.input), list(proto.output), node_scope(name, metadata)))
    return OnnxGraph(str(path), nodes, {init.name for init in model.graph.initializer})
