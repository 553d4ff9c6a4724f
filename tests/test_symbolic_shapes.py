"""onnxruntime's symbolic shape inference, which ModelOpt and our memory estimate call, saved the partial model of a
graph it could not infer completely as sym_shape_infer_temp.onnx and a <uuid1>.data (mode 0600) in the current folder:
the stray files CI clones and sweep folders kept finding. pipeline/core/symbolic_shapes.py keeps it from writing."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("onnxruntime")


def matmul_then(op: str, domain: str = ""):
    """x [n, 64] @ w [64, 32], then `op` (an op of a custom domain: no shape inference knows its output)."""
    weight = numpy_helper.from_array(np.ones((64, 32), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="matmul"), helper.make_node(op, ["h"], ["y"], name="last", domain=domain)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weight])
    opsets = [helper.make_opsetid("", 17), *([helper.make_opsetid(domain, 1)] if domain else [])]
    return helper.make_model(graph, opset_imports=opsets)


def test_an_incomplete_inference_raises_as_onnxruntime_does_and_writes_nothing(tmp_path, monkeypatch):
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    from pipeline.core.symbolic_shapes import without_stray_files

    monkeypatch.chdir(tmp_path)
    without_stray_files()
    with pytest.raises(Exception, match="Incomplete symbolic shape inference"):
        SymbolicShapeInference.infer_shapes(matmul_then("Foo", "custom"), auto_merge=True)
    assert list(tmp_path.iterdir()) == []


def test_a_complete_inference_gives_onnxruntimes_shapes(tmp_path, monkeypatch):
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    from pipeline.core.symbolic_shapes import without_stray_files

    without_stray_files()
    inferred = SymbolicShapeInference.infer_shapes(matmul_then("Relu"), auto_merge=True)
    shapes = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in (*inferred.graph.value_info, *inferred.graph.output)}
    assert shapes == {"h": ["n", 32], "y": ["n", 32]}


def test_the_memory_estimate_and_modelopts_calls_leave_the_current_folder_as_it_was(tmp_path, monkeypatch):
    import onnx
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    from pipeline.core.memory import peak_activation_bytes
    from pipeline.core.symbolic_shapes import infer_shapes
    from quant import before_modelopt

    path = tmp_path / "model.onnx"
    onnx.save(matmul_then("Foo", "custom"), str(path))
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    assert peak_activation_bytes(path, {"x": [8, 64]}) == 8 * 32 * 4  # h; y's size is unknown
    assert list(work.iterdir()) == []
    before_modelopt()
    assert SymbolicShapeInference.infer_shapes is infer_shapes
