"""ONNX shape inference for the rules, without a second copy of the graph.

onnx_ir's ShapeInferencePass serializes the graph for `onnx.shape_inference`, then deserializes the
whole inferred model into a second IR to copy shapes back: on bert-base that second IR is half the
pass's time. Here the inferred value infos are read straight from the proto, graph by graph: the
main graph and every subgraph (If/Loop/Scan bodies) are walked beside their serialized protos,
node by node, so a name reused in two branches is never confused. A value keeps its full type
(a sequence or optional stays one; onnx_ir 1.1's pass turns them into their element tensor, which
onnxruntime then refuses to load). Weights stay out of the proto (an initializer above 1 KiB goes in
as a graph input of its type and shape; small ones, such as Reshape targets, stay constants for
data propagation).
"""

from __future__ import annotations

import logging

import onnx_ir as ir

SMALL_CONSTANT_BYTES = 1024

log = logging.getLogger(__name__)


def infer_shapes(model: ir.Model) -> bool:
    """Annotate `model`'s values, in every graph, with the shapes and types ONNX shape inference
    finds (in place); return whether inference ran. When inference fails the model is left as it
    was, as onnx_ir's pass does."""
    import onnx

    proto = proto_without_weights(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True, data_prop=True)
    except Exception as err:  # noqa: BLE001 - onnx raises InferenceError, ValidationError or RuntimeError; all mean "no shapes"
        reason = " ".join(str(err).split())  # onnx lists one error per line: one line for the user
        log.warning("note: ONNX shape inference rejects this model (%s); the rules see only the shapes the file declares", reason)
        return False
    _annotate(model.graph, inferred.graph)
    return True


def _annotate(graph: ir.Graph, proto) -> None:
    """Copy the inferred types of `proto` (the serialized, inferred `graph`) onto `graph`'s values, then do
    the same for each subgraph."""
    import onnx

    values = {value.name: value for value in graph.inputs}
    for node, node_proto in zip(graph, proto.node, strict=True):
        values.update((value.name, value) for value in node.outputs)
        for attr_proto in node_proto.attribute:
            attr = node.attributes.get(attr_proto.name)
            if attr_proto.type == onnx.AttributeProto.GRAPH:
                _annotate(attr.value, attr_proto.g)
            elif attr_proto.type == onnx.AttributeProto.GRAPHS:
                for subgraph, subgraph_proto in zip(attr.value, attr_proto.graphs, strict=True):
                    _annotate(subgraph, subgraph_proto)
    for info in (*proto.value_info, *proto.output):
        value = values.get(info.name)
        if value is not None:
            _set_type(value, info.type)


def _set_type(value: ir.Value, type_proto) -> None:
    shape = ir.serde.deserialize_type_proto_for_shape(type_proto)
    if shape is not None and value.shape != shape:
        value.shape = shape
    found = ir.serde.deserialize_type_proto_for_type(type_proto)
    if found is None or found.dtype is None:
        return
    if not isinstance(found, ir.TensorType):
        if value.type != found:
            value.type = found  # a sequence or optional: setting only dtype would make it a tensor
    elif value.dtype != found.dtype and (value.type is None or isinstance(value.type, ir.TensorType)):
        value.dtype = found.dtype


def proto_without_weights(model: ir.Model):
    """`model` serialized with its weights as typed graph inputs; `model` itself is restored as it was."""
    graph = model.graph
    initializers = list(graph.initializers.values())
    inputs = list(graph.inputs)
    kept = {id(value) for value in inputs}
    for value in initializers:
        tensor = value.const_value
        if tensor is not None and tensor.nbytes <= SMALL_CONSTANT_BYTES:
            continue
        if tensor is not None:
            value.shape = value.shape or tensor.shape
            value.dtype = value.dtype or tensor.dtype
        graph.initializers.pop(value.name)
        if id(value) not in kept:
            graph.inputs.append(value)
    try:
        return ir.serde.serialize_model(model)
    finally:
        graph.inputs.clear()
        graph.inputs.extend(inputs)
        graph.initializers.clear()
        for value in initializers:
            graph.initializers.add(value)
