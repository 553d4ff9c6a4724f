"""What the report needs from an ONNX file: node names, order, types, edges and module scopes (from
pipeline/core/scopes.py); weights are never loaded."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pipeline.core.errors import InputError
from pipeline.core.graph import GraphIndex, node_name
from pipeline.core.scopes import inline_functions_proto, node_scope


@dataclass
class Node:
    name: str
    op_type: str
    input: list[str]
    output: list[str]
    scope: tuple[str, ...]


class OnnxGraph(GraphIndex):
    """The core index (pipeline/core/graph.py) over the nodes as the report names them, each with its
    module scope, looked up by name. Initializers are known by name only: the report reads no value,
    and holding their protos would keep the whole model in memory."""

    def __init__(self, path: str, nodes: list[Node], initializers: Mapping[str, Any] = MappingProxyType({})):
        super().__init__(nodes, initializers)
        self.path = path

    def constant_like(self) -> set[str]:
        """Nodes TensorRT folds at build time: constants and anything computed only from constants or shapes."""
        return {node.name for node in self.build_time()[1]}


def load_onnx_graph(path: Path | str) -> OnnxGraph:
    import onnx

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such ONNX file; pass the model the engine was built from with --onnx")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as err:  # protobuf's DecodeError and friends
        raise InputError(f"{path}: not a readable ONNX model ({type(err).__name__}); pass the .onnx the engine was built from") from err
    return graph_of_model(inline_functions_proto(model), str(path))  # TensorRT's parser inlines local functions: so do we


def graph_of_model(model, path: str) -> OnnxGraph:
    """The report's graph of a ModelProto whose local functions are inlined (`path`: the file it names)."""
    nodes = []
    for index, proto in enumerate(model.graph.node):
        name = node_name(proto, index)
        metadata = {p.key: p.value for p in proto.metadata_props}
        nodes.append(Node(name, proto.op_type, list(proto.input), list(proto.output), node_scope(name, metadata)))
    return OnnxGraph(path, nodes, dict.fromkeys(init.name for init in model.graph.initializer))
