"""The optimize stage's shape inference bridge (pipeline/optimize/shapes.py) against onnx_ir's ShapeInferencePass."""

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from conftest import run_cli
from onnx import TensorProto, helper
from onnx_ir.passes.common import ShapeInferencePass

from pipeline.core.profiles import load_profile
from pipeline.export import export_model
from pipeline.optimize.shapes import infer_shapes


def annotations(model: ir.Model) -> dict[str, tuple]:
    return {value.name: (value.shape, value.dtype) for node in ir.traversal.RecursiveGraphIterator(model.graph) for value in node.outputs}


@pytest.fixture(scope="module")
def bert_tiny_dynamo(tmp_path_factory):
    path = tmp_path_factory.mktemp("dynamo") / "model.onnx"
    export_model(load_profile("bert-tiny"), path)
    return path


@pytest.mark.parametrize("export", ["bert_tiny_dynamo", "bert_tiny_torchscript"])
def test_same_shapes_as_onnx_ir_pass_and_the_model_is_otherwise_unchanged(export, request):
    path = request.getfixturevalue(export)
    theirs, ours = ir.load(path), ir.load(path)
    weights = {name: value.const_value for name, value in ours.graph.initializers.items()}
    inputs = [value.name for value in ours.graph.inputs]
    ShapeInferencePass()(theirs)
    infer_shapes(ours)
    expected, got = annotations(theirs), annotations(ours)
    assert got == expected
    assert sum(shape is not None for shape, _ in got.values()) > len(got) * 0.9, "inference ran: nearly every value has a shape"
    assert [value.name for value in ours.graph.inputs] == inputs, "weights went back from inputs to initializers"
    assert {name: value.const_value for name, value in ours.graph.initializers.items()} == weights
    assert list(ours.graph.initializers) == list(weights), "initializer order kept (the written file keeps it)"


def _if_model() -> onnx.ModelProto:
    """x -> If(cond){ Relu(x) * 2 } else { Neg(x) }: values inside the branches have no declared shapes."""
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "two_c"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    otherwise = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["two_c"], value=two), helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=otherwise)],
        "g", [helper.make_tensor_value_info("cond", TensorProto.BOOL, []), helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def test_a_model_with_subgraphs_gets_their_values_annotated_too():
    model = ir.serde.deserialize_model(_if_model())
    infer_shapes(model)
    shapes = annotations(model)
    assert shapes["r"] == (ir.Shape([3, 4]), ir.DataType.FLOAT) and shapes["e"] == (ir.Shape([3, 4]), ir.DataType.FLOAT)


def _rejected_model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3])], [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.ones((4, 5), np.float32), "w")])  # 3 != 4: strict inference fails
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def test_a_model_inference_rejects_is_left_as_it_was():
    model = ir.serde.deserialize_model(_rejected_model())
    before = annotations(model)
    infer_shapes(model)
    assert annotations(model) == before and before["y"] == (None, None)
    assert list(model.graph.initializers) == ["w"] and [v.name for v in model.graph.inputs] == ["a"]


def test_the_cli_says_in_one_line_that_inference_rejected_the_model(tmp_path):
    source = tmp_path / "rejected.onnx"
    onnx.save(_rejected_model(), source)
    before = source.read_bytes()
    result = run_cli("optimize", str(source), "-o", str(tmp_path / "out.onnx"))
    assert result.returncode == 0, result.stderr  # the rules still run, on the declared shapes
    assert result.stderr.count("\n") == 1 and "shape inference rejects this model" in result.stderr
    assert "Incompatible dimensions" in result.stderr and "Traceback" not in result.stderr
    assert source.read_bytes() == before
