"""A Constant written with a scalar attribute (the dynamo exporter's `value_float`, e.g. ReLU6's bounds 0 and 6)
feeding a node AutoCast converts to FP16: ModelOpt 0.47 removes the Cast it inserted after the Constant but
converts only a tensor `value`, so MobileNetV2's Clip took an FP16 input and FP32 bounds and onnxruntime refused
the model (issue 38). The fp16 stage hands AutoCast the constants as tensors."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.core.onnxfile import constants_as_tensors
from pipeline.core.verify import run_onnx

pytest.importorskip("modelopt")

LOW, HIGH = 0.0, 6.0


def relu6_model(path):
    """y = Clip(x * w, 0, 6) with the bounds as value_float Constants, as the dynamo exporter writes hardtanh."""
    weight = numpy_helper.from_array(np.random.default_rng(1).uniform(0.5, 2.0, (4, 64)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Constant", [], ["low"], value_float=LOW, name="low"),
        helper.make_node("Constant", [], ["high"], value_float=HIGH, name="high"),
        helper.make_node("Mul", ["x", "w"], ["scaled"], name="mul"),
        helper.make_node("Clip", ["scaled", "low", "high"], ["y"], name="relu6"),
    ]
    graph = helper.make_graph(nodes, "relu6", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(path))
    return path


def feeds():
    return {"x": np.random.default_rng(0).uniform(-8, 8, (4, 64)).astype(np.float32)}


def test_constants_as_tensors_computes_the_same_values(tmp_path):
    model = onnx.load(str(relu6_model(tmp_path / "a.onnx")))
    assert constants_as_tensors(model) == 2
    assert [a.name for n in model.graph.node if n.op_type == "Constant" for a in n.attribute] == ["value", "value"]
    onnx.save(model, str(tmp_path / "b.onnx"))
    before, after = run_onnx(tmp_path / "a.onnx", feeds()), run_onnx(tmp_path / "b.onnx", feeds())
    assert np.array_equal(before[0], after[0])


def test_fp16_of_a_clip_with_value_float_bounds_loads_and_matches_fp32(tmp_path):
    from quant.fp16 import convert_fp16

    source = relu6_model(tmp_path / "model.onnx")
    result = convert_fp16(source, tmp_path / "model.fp16.onnx", [], [], [feeds()])
    assert result.checked_shapes == [{"x": [4, 64]}]  # onnxruntime loaded and ran it (it refused it before)
    converted = onnx.load(str(tmp_path / "model.fp16.onnx"))
    clip = next(n for n in converted.graph.node if n.op_type == "Clip")
    types = {v.name: v.type.tensor_type.elem_type for v in converted.graph.value_info}
    constants = {n.output[0]: n.attribute[0].t.data_type for n in converted.graph.node if n.op_type == "Constant"}
    assert [types.get(name) or constants.get(name) for name in clip.input] == [TensorProto.FLOAT16] * 3  # the bounds in the input's type
    assert not list(source.parent.glob(".*.work.*"))  # the work folder AutoCast read is gone
    [reference], [fp16] = run_onnx(source, feeds()), run_onnx(tmp_path / "model.fp16.onnx", feeds())
    assert fp16.dtype == np.float32 and fp16.min() == LOW and fp16.max() == HIGH  # the bounds are exact in FP16
    assert (fp16[reference == HIGH] == HIGH).all() and (fp16[reference == LOW] == LOW).all()
    np.testing.assert_allclose(fp16, reference, rtol=3 * 2.0**-11, atol=0)  # x, w and x * w each rounded to FP16 once


def scatter_add_model(path):
    """Two ScatterND adds (a mixture of experts' token scatter) between Muls AutoCast converts: onnxruntime's CPU
    provider has no FP16 ScatterND with reduction="add"."""
    weight = numpy_helper.from_array(np.random.default_rng(2).uniform(0.5, 2.0, (6, 8)).astype(np.float32), "w")
    indices = numpy_helper.from_array(np.array([[1], [3], [1]], np.int64), "rows")
    nodes = [helper.make_node("Mul", ["x", "w"], ["scaled"], name="mul"),
             helper.make_node("Slice", ["scaled", "start", "end", "axis0"], ["updates"], name="take"),
             helper.make_node("ScatterND", ["scaled", "rows", "updates"], ["once"], reduction="add", name="scatter_1"),
             helper.make_node("ScatterND", ["once", "rows", "updates"], ["twice"], reduction="add", name="scatter_2"),
             helper.make_node("Mul", ["twice", "w"], ["y"], name="out")]
    constants = [numpy_helper.from_array(np.array([v], np.int64), n) for n, v in (("start", 0), ("end", 3), ("axis0", 0))]
    graph = helper.make_graph(nodes, "scatter", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 8])], [weight, indices, *constants])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def test_fp16_keeps_in_fp32_the_nodes_onnxruntime_has_no_fp16_kernel_for_and_those_like_them(tmp_path):
    """JetMoE's FP16 stage failed: "MLFloat16 data type is not supported with ScatterND opset 16 when reduction is 'add'"."""
    from quant.fp16 import convert_fp16

    source = scatter_add_model(tmp_path / "model.onnx")
    x = {"x": np.random.default_rng(0).uniform(-2, 2, (6, 8)).astype(np.float32)}
    result = convert_fp16(source, tmp_path / "model.fp16.onnx", [], [], [x])
    assert sorted(result.kept_without_kernel) == ["scatter_1", "scatter_2"]  # the second with the first: one rerun
    converted = onnx.load(str(tmp_path / "model.fp16.onnx"))
    types = {v.name: v.type.tensor_type.elem_type for v in (*converted.graph.value_info, *converted.graph.output)}
    assert types["once"] == types["twice"] == TensorProto.FLOAT
    [reference], [fp16] = run_onnx(source, x), run_onnx(tmp_path / "model.fp16.onnx", x)
    np.testing.assert_allclose(fp16, reference, rtol=2e-3, atol=2e-3)


def test_autocast_reference_run_failing_on_its_random_inputs_is_a_failed_stage_naming_the_fix(tmp_path):
    """`quantize --fp16` without --profile on JetMoE's decoder: AutoCast ran it on random inputs, onnxruntime refused them
    (an index past its table) and the error surfaced as an internal error."""
    from pipeline.core.errors import StageFailed
    from quant.fp16 import convert_fp16

    weight = numpy_helper.from_array(np.random.default_rng(3).standard_normal((4, 64)).astype(np.float32), "w")
    nodes = [helper.make_node("Mul", ["x", "w"], ["scaled"], name="mul"),
             helper.make_node("Reshape", ["scaled", "shape"], ["y"], name="reshape")]  # [0, 0] keeps the shape; AutoCast's random 0/1 do not
    graph = helper.make_graph(nodes, "reshape", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64]),
                                                 helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weight])
    source = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(source))
    with pytest.raises(StageFailed, match=r"^fp16: ModelOpt AutoCast's FP32 reference run of .* failed \(.*\); it ran the model on random inputs.*pass --profile$"):
        convert_fp16(source, tmp_path / "model.fp16.onnx", [], [], [{"x": np.ones((4, 64), np.float32), "shape": np.zeros(2, np.int64)}])
    assert not (tmp_path / "model.fp16.onnx").exists()


def test_autocast_is_given_the_weights_in_a_data_file_and_the_file_itself_when_they_already_are(tmp_path, monkeypatch):
    """Issue 33: AutoCast loads a data file's weights only after its sanitizer and type inference, which copy the whole
    proto several times (a 0.47 GB decoder's AutoCast: 7.1 GB peak given the inline file, 6.4 GB given a data file)."""
    from pipeline.core.onnxfile import EXTERNAL_DATA_ENV, external_tensors, save_onnx
    from quant.fp16 import _autocast_input

    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [weight])
    inline = tmp_path / "inline.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(inline))
    with _autocast_input(inline, tmp_path / "out.onnx") as given:
        assert given != inline and [t[0] for t in external_tensors(onnx.load(str(given), load_external_data=False))] == ["w"]
        assert numpy_helper.to_array(onnx.load(str(given)).graph.initializer[0]).tolist() == numpy_helper.to_array(weight).tolist()
    assert not given.exists(), "the work copy is removed"
    monkeypatch.setenv(EXTERNAL_DATA_ENV, "0")
    save_onnx(onnx.load(str(inline)), tmp_path / "external.onnx")
    with _autocast_input(tmp_path / "external.onnx", tmp_path / "out.onnx") as given:
        assert given == tmp_path / "external.onnx"
