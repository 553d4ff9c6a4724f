"""pipeline/core/irwriter.py: a model written a weight at a time reads back as the model `ir.to_proto` makes, for every
kind of weight onnx_ir holds, and a weight in memory is written without a copy of it in Python."""

from __future__ import annotations

import tracemalloc

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import torch
from onnx_ir.tensor_adapters import TorchTensor

from pipeline.core.irwriter import write_model


def _model(initializers: dict[str, ir.TensorProtocol]) -> ir.Model:
    """`y = x + sum of every initializer` (each broadcast to x's [1] shape after a ReduceSum), holding `initializers`."""
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1]))
    nodes, total = [], x
    for name, tensor in initializers.items():
        weight = ir.Value(name=name, const_value=tensor, type=ir.TensorType(tensor.dtype), shape=tensor.shape)
        reduced = ir.node("ReduceSum", [weight], attributes={"keepdims": 0})
        as_float = ir.node("Cast", [reduced.outputs[0]], attributes={"to": ir.DataType.FLOAT})
        added = ir.node("Add", [total, as_float.outputs[0]])
        nodes += [reduced, as_float, added]
        total = added.outputs[0]
    total.name = "y"
    graph = ir.Graph([x], [total], nodes=nodes, initializers=[n for node in nodes[::3] for n in node.inputs], opset_imports={"": 21})
    return ir.Model(graph, ir_version=10)


def test_every_kind_of_weight_reads_back_as_to_proto_writes_it(tmp_path):
    stored = ir.serde.TensorProtoTensor(onnx.numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "stored"))
    weights = {
        "stored": stored,  # read from a file: its proto, serialized as it is
        "array": ir.tensor(np.linspace(-1, 1, 10, dtype=np.float32)),
        "torch": TorchTensor(torch.arange(12, dtype=torch.float32).reshape(3, 4)),
        "bf16": TorchTensor(torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16)),
        "int4": ir.tensor(np.array([1, -2, 3, 7, -8], dtype=ml_dtypes.int4)),  # 5 values in 3 bytes
        "scalar": ir.tensor(np.float32(2.5)),
        "empty": ir.tensor(np.zeros((0, 4), np.float32)),
        "folded": ir.LazyTensor(lambda: ir.tensor(np.full((2, 2), 4.0, np.float32)), dtype=ir.DataType.FLOAT, shape=ir.Shape([2, 2])),
    }
    model = _model(weights)
    write_model(model, tmp_path / "m.onnx")
    written, expected = onnx.load(str(tmp_path / "m.onnx")), ir.to_proto(model)
    assert list(written.graph.initializer) == list(expected.graph.initializer)
    assert list(written.graph.node) == list(expected.graph.node)
    assert [t.name for t in written.graph.initializer] == list(weights)


def test_the_weights_written_run_as_the_model_holds_them(tmp_path):
    import onnxruntime as ort

    weights = {"a": TorchTensor(torch.randn(7, 5)), "b": ir.tensor(np.random.default_rng(0).normal(size=(3,)).astype(np.float32))}
    write_model(_model(weights), tmp_path / "m.onnx")
    x = np.array([0.5], np.float32)
    (y,) = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.allclose(y, x + weights["a"].numpy().sum() + weights["b"].numpy().sum(), atol=1e-5)


def test_a_weight_in_memory_is_written_without_a_python_copy_of_it(tmp_path):
    """The exporter's parameters: ir.save and the old writer made a bytes copy of each (tobytes), then protobuf copied it
    again; a 64 MB weight now allocates next to nothing on Python's heap while it is written."""
    weight = torch.ones(16 * 1024 * 1024)  # 64 MB
    model = _model({"w": TorchTensor(weight)})
    tracemalloc.start()
    try:
        write_model(model, tmp_path / "m.onnx")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, f"{peak / 2**20:.1f} MB traced while writing a 64 MB weight"
    assert (tmp_path / "m.onnx").stat().st_size > weight.numel() * 4
