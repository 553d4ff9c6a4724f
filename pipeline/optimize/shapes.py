"""ONNX shape inference for the rules, without a second copy of the graph.

onnx_ir's ShapeInferencePass serializes the graph for `onnx.shape_inference`, then deserializes the
whole inferred model into a second IR to copy shapes back: on bert-base that second IR is half the
pass's time. Here the inferred value infos are read straight from the proto. Weights stay out of
the proto (an initializer above 1 KiB goes in as a graph input of its type and shape; small ones,
such as Reshape targets, stay constants for data propagation). A model with subgraphs (If, Loop,
Scan) takes onnx_ir's pass, which also annotates values inside them.
"""

from __future__ import annotations

import logging

import onnx_ir as ir

SMALL_CONSTANT_BYTES = 1024

log = logging.getLogger(__name__)


def infer_shapes(model: ir.Model) -> None:
    """Annotate `model`'s values with the shapes and types ONNX shape inference finds (in place).
    When inference fails the model is left as it was, as onnx_ir's pass does."""
    import onnx

    if any(attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for node in model.graph for attr in node.attributes.values()):
        from onnx_ir.passes.common import ShapeInferencePass

        ShapeInferencePass()(model)
        return
    proto = _proto_without_weights(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True, data_prop=True)
    except Exception as err:  # noqa: BLE001 - onnx raises InferenceError, ValidationError or RuntimeError; all mean "no shapes"
        reason = " ".join(str(err).split())  # onnx lists one error per line: one line for the user
        log.warning("note: ONNX shape inference rejects this model (%s); the rules see only the shapes the file declares", reason)
        return
    values = {value.name: value for value in model.graph.inputs}
    values.update((value.name, value) for node in model.graph for value in node.outputs)
    for info in (*inferred.graph.value_info, *inferred.graph.output):
        value = values.get(info.name)
        if value is None:
            continue
        shape = ir.serde.deserialize_type_proto_for_shape(info.type)
        if shape is not None and value.shape != shape:
            value.shape = shape
        found = ir.serde.deserialize_type_proto_for_type(info.type)
        if found is not None and found.dtype is not None and value.dtype != found.dtype:
            value.dtype = found.dtype


def _proto_without_weights(model: ir.Model):
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
