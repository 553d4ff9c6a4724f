"""Write an onnx_ir model to one .onnx file with each weight copied at most once; past the external-data
threshold (pipeline/core/onnxfile.py), with its weights in `<name>.data` beside it (`ir.save`, which
streams them).

`ir.to_proto` copies every initializer into a new proto and `SerializeToString` copies it
again. Protobuf messages may be written field by field, so the model is written as: the
model without its graph, then the graph field (7) whose body is the graph without
initializers followed by one `initializer` field (5) per tensor. A stored weight's proto is
serialized straight into the file; a weight in memory (the exporter's torch parameters) is
its header, then its `raw_data` field (9) written from its memory with no copy. Deferred
tensors (large constant folds) are computed on a worker thread while earlier ones are written.
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


def _data_bytes(tensor) -> int:
    return math.ceil(int(tensor.size) * tensor.dtype.itemsize)  # itemsize is 0.5 for 4-bit types


def _header(value: ir.Value) -> bytes:
    tensor = value.const_value
    return onnx.TensorProto(name=value.name, data_type=tensor.dtype.value, dims=list(tensor.shape.numpy())).SerializeToString()


def _size(value: ir.Value) -> int:
    """Serialized size of the tensor, computed without serializing it."""
    if isinstance(value.const_value, ir.TensorProtoTensor):
        return _tensor_proto(value).ByteSize()
    data = _data_bytes(value.const_value)
    return len(_header(value)) + len(_field(RAW_DATA_FIELD, data)) + data


def _in_memory(value: ir.Value) -> bool:
    """A weight held as an array (the exporter's torch parameters, a folded constant) or in a data file: written from
    where it is (`tofile`) after its header, never copied whole into a proto."""
    return not isinstance(value.const_value, (ir.TensorProtoTensor, ir.LazyTensor))


def _tensor_bytes(value: ir.Value) -> bytes | None:
    """The serialized proto of a stored or deferred weight (computed on the worker); None for one written from memory."""
    tensor = value.const_value
    if _in_memory(value):
        return None
    if isinstance(tensor, ir.TensorProtoTensor):
        return _tensor_proto(value).SerializeToString()
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
            f.write(_field(GRAPH_INITIALIZER_FIELD, size))
            start = f.tell()
            if body is None:
                f.write(_header(value))
                f.write(_field(RAW_DATA_FIELD, _data_bytes(value.const_value)))
                value.const_value.tofile(f)
            else:
                f.write(body)
            if f.tell() - start != size:
                raise RuntimeError(f"initializer {value.name}: wrote {f.tell() - start} bytes, expected {size}")
