"""Write an onnx_ir model to one .onnx file with each weight copied once; past the external-data
threshold (pipeline/core/onnxfile.py), with its weights in `<name>.data` beside it (`ir.save`, which
streams them).

`ir.to_proto` copies every initializer into a new proto and `SerializeToString` copies it
again. Protobuf messages may be written field by field, so the model is written as: the
model without its graph, then the graph field (7) whose body is the graph without
initializers followed by one `initializer` field (5) per tensor, each serialized straight
into the file. Deferred tensors (large constant folds) are computed on a worker thread
while earlier ones are written.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import onnx
import onnx_ir as ir

MODEL_GRAPH_FIELD = 7
GRAPH_INITIALIZER_FIELD = 5
LENGTH_DELIMITED = 2


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload_length: int) -> bytes:
    return _varint(number << 3 | LENGTH_DELIMITED) + _varint(payload_length)


RAW_DATA_FIELD = 9


def _tensor_proto(value: ir.Value) -> onnx.TensorProto:
    """The stored proto of an untouched weight (no copy unless it was renamed)."""
    proto = value.const_value.raw
    if proto.name != value.name:
        proto = onnx.TensorProto()
        proto.CopyFrom(value.const_value.raw)
        proto.name = value.name
    return proto


def _size(value: ir.Value) -> int:
    """Serialized size of the tensor, computed without serializing it."""
    tensor = value.const_value
    if isinstance(tensor, ir.TensorProtoTensor):
        return _tensor_proto(value).ByteSize()
    header = onnx.TensorProto(name=value.name, data_type=tensor.dtype.value, dims=list(tensor.shape.numpy()))
    data = math.ceil(int(tensor.size) * tensor.dtype.itemsize)  # itemsize is 0.5 for 4-bit types
    return header.ByteSize() + len(_field(RAW_DATA_FIELD, data)) + data


def _tensor_bytes(value: ir.Value) -> bytes:
    tensor = value.const_value
    if isinstance(tensor, ir.TensorProtoTensor):
        return _tensor_proto(value).SerializeToString()
    if isinstance(tensor, ir.ExternalTensor):  # read from the source's data file, written inline
        header = onnx.TensorProto(name=value.name, data_type=tensor.dtype.value, dims=list(tensor.shape.numpy()), raw_data=tensor.tobytes())
        return header.SerializeToString()
    proto = ir.serde.serialize_tensor(tensor)
    proto.name = value.name
    return proto.SerializeToString()


def write_model(model: ir.Model, path: Path) -> None:
    from pipeline.core.fileio import external_data_file
    from pipeline.core.onnxfile import SMALLEST_EXTERNAL_TENSOR, external_data_threshold, ir_weight_bytes

    if ir_weight_bytes(model) > external_data_threshold():
        ir.save(model, path, external_data=external_data_file(path).name, size_threshold_bytes=SMALLEST_EXTERNAL_TENSOR)
        return
    _write_inline(model, path)


def _write_inline(model: ir.Model, path: Path) -> None:
    initializers = list(model.graph.initializers.values())
    saved = dict(model.graph.initializers)
    model.graph.initializers.clear()
    try:
        skeleton = ir.to_proto(model)
    finally:
        for name, value in saved.items():
            model.graph.initializers[name] = value
    graph = skeleton.graph
    skeleton.ClearField("graph")
    head, graph_head = skeleton.SerializeToString(), graph.SerializeToString()
    sizes = [_size(v) for v in initializers]
    graph_length = len(graph_head) + sum(len(_field(GRAPH_INITIALIZER_FIELD, n)) + n for n in sizes)
    with open(path, "wb") as f, ThreadPoolExecutor(max_workers=1) as worker:
        f.write(head)
        f.write(_field(MODEL_GRAPH_FIELD, graph_length))
        f.write(graph_head)
        # the worker serializes (and computes deferred folds) ahead while this thread writes
        for value, size, body in zip(initializers, sizes, worker.map(_tensor_bytes, initializers), strict=True):
            if len(body) != size:
                raise RuntimeError(f"initializer {value.name}: serialized {len(body)} bytes, expected {size}")
            f.write(_field(GRAPH_INITIALIZER_FIELD, size))
            f.write(body)
