"""The checks' onnxruntime sessions: `as_written` folds constant subgraphs and changes nothing else (issue 33)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from pipeline.core.verify import OnnxSession, session_options


def fusable(path):
    """One graph with what onnxruntime's basic level rewrites: a written-out LayerNorm, a zero Pad before MaxPool, Conv +
    BatchNormalization + Relu, MatMul + Add, Identity, Dropout, a Cast chain, Div then Mul, an erf GELU, a Reshape
    chain, Expand by ones; and a tied weight transposed for a MatMul, the one constant subgraph (a decoder's output head)."""
    rng = np.random.default_rng(0)
    weights = {"table": rng.standard_normal((16, 8)), "w": rng.standard_normal((8, 8)), "b": rng.standard_normal(8),
               "conv_w": rng.standard_normal((2, 2, 1, 1)), "scale": rng.random(2) + 0.5, "bias": rng.standard_normal(2),
               "mean": rng.standard_normal(2), "var": rng.random(2) + 0.5, "gamma": rng.random(8) + 0.5, "beta": rng.standard_normal(8)}
    scalars = {"two": 2.0, "eps": 1e-5, "half": 0.5, "one": 1.0, "sqrt2": 1.4142135, "divisor": 3.0, "factor": 5.0}
    initializers = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in {**weights, **scalars}.items()]
    initializers += [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in
                     {"pads": [0, 0, 1, 1, 0, 0, 1, 1], "flat": [4, 16], "back": [2, 2, 16], "ones": [1, 1, 1]}.items()]
    n = helper.make_node
    nodes = [
        n("ReduceMean", ["x", "axes_last"], ["mu"], name="ln_mean"), n("Sub", ["x", "mu"], ["d"], name="ln_sub"),
        n("Pow", ["d", "two"], ["sq"], name="ln_pow"), n("ReduceMean", ["sq", "axes_last"], ["var_x"], name="ln_var"),
        n("Add", ["var_x", "eps"], ["var_eps"], name="ln_eps"), n("Sqrt", ["var_eps"], ["std"], name="ln_sqrt"),
        n("Div", ["d", "std"], ["normed"], name="ln_div"), n("Mul", ["normed", "gamma"], ["scaled"], name="ln_mul"),
        n("Add", ["scaled", "beta"], ["ln"], name="ln_add"),
        n("Identity", ["ln"], ["same"], name="identity"), n("Dropout", ["same"], ["kept"], name="dropout"),
        n("MatMul", ["kept", "w"], ["mm"], name="matmul"), n("Add", ["mm", "b"], ["dense"], name="matmul_bias"),
        n("Div", ["dense", "sqrt2"], ["g_div"], name="gelu_div"), n("Erf", ["g_div"], ["g_erf"], name="gelu_erf"),
        n("Add", ["g_erf", "one"], ["g_add"], name="gelu_add"), n("Mul", ["dense", "g_add"], ["g_mul"], name="gelu_mul"),
        n("Mul", ["g_mul", "half"], ["gelu"], name="gelu_half"),
        n("Div", ["gelu", "divisor"], ["divided"], name="div"), n("Mul", ["divided", "factor"], ["multiplied"], name="mul"),
        n("Cast", ["multiplied"], ["as16"], to=TensorProto.FLOAT16, name="cast16"), n("Cast", ["as16"], ["as32"], to=TensorProto.FLOAT, name="cast32"),
        n("Transpose", ["table"], ["table_t"], perm=[1, 0], name="tied_transpose"),
        n("MatMul", ["as32", "table_t"], ["logits"], name="head"),
        n("Reshape", ["logits", "flat"], ["flat_logits"], name="reshape_flat"), n("Reshape", ["flat_logits", "back"], ["reshaped"], name="reshape_back"),
        n("Expand", ["reshaped", "ones"], ["y"], name="expand"),
        n("Pad", ["image", "pads"], ["padded"], name="pad"), n("MaxPool", ["padded"], ["pooled"], kernel_shape=[2, 2], name="maxpool"),
        n("Conv", ["pooled", "conv_w"], ["conv"], name="conv"),
        n("BatchNormalization", ["conv", "scale", "bias", "mean", "var"], ["bn"], name="bn"), n("Relu", ["bn"], ["z"], name="relu"),
    ]
    initializers.append(numpy_helper.from_array(np.array([-1], np.int64), "axes_last"))
    graph = helper.make_graph(nodes, "fusable", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2, 8]),
                                                 helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 2, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2, 16]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 2, 5, 5])], initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), str(path))
    return path


def _as_onnxruntime_runs_it(path, tmp_path):
    options, disabled = session_options(as_written=True)
    options.optimized_model_filepath = str(tmp_path / "as_run.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"], disabled_optimizers=disabled)
    return onnx.load(str(tmp_path / "as_run.onnx"))


def test_a_session_run_once_or_twice_is_not_even_folded():
    options, disabled = session_options(as_written=True, fold_constants=False)
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL and disabled is None


def test_a_check_session_folds_the_constant_transpose_and_changes_no_other_node(tmp_path):
    path = fusable(tmp_path / "m.onnx")
    written = {node.name: node.op_type for node in onnx.load(str(path)).graph.node}
    run = {node.name: node.op_type for node in _as_onnxruntime_runs_it(path, tmp_path).graph.node}
    assert "tied_transpose" not in run, "the transposed tied weight is computed once, not on every run"
    assert run == {name: op for name, op in written.items() if name != "tied_transpose"}


def test_a_check_session_computes_what_the_unoptimized_graph_computes_exactly(tmp_path):
    path = fusable(tmp_path / "m.onnx")
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((2, 2, 8)).astype(np.float32), "image": -rng.random((1, 2, 4, 4)).astype(np.float32)}
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    unoptimized = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, feeds)
    for fold_constants in (True, False):  # False: a session run once or twice, no transformer at all
        checked = OnnxSession(path, as_written=True, fold_constants=fold_constants).run(feeds)
        assert all(np.array_equal(a, b) for a, b in zip(unoptimized, checked, strict=True))
    basic = OnnxSession(path).run(feeds)  # the accuracy checks' level fuses Pad(0) into the -inf-padded MaxPool
    assert not np.array_equal(basic[1], unoptimized[1])


def weight_quantized(path):
    """x -> Q -> DQ -> MatMul with an INT8 weight behind its DequantizeLinear, as ModelOpt writes a quantized GEMM."""
    rng = np.random.default_rng(2)
    weight = numpy_helper.from_array(rng.integers(-127, 128, (8, 4)).astype(np.int8), "w_int8")
    scales = [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in {"w_scale": 0.02, "x_scale": 0.05}.items()]
    zero = numpy_helper.from_array(np.array(0, np.int8), "zero")
    n = helper.make_node
    nodes = [n("QuantizeLinear", ["x", "x_scale", "zero"], ["xq"], name="q_x"), n("DequantizeLinear", ["xq", "x_scale", "zero"], ["xd"], name="dq_x"),
             n("DequantizeLinear", ["w_int8", "w_scale", "zero"], ["w"], name="dq_w"), n("MatMul", ["xd", "w"], ["y"], name="gemm")]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [weight, zero, *scales])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9), str(path))
    return path


def test_an_accuracy_session_dequantizes_the_weights_once_and_computes_what_the_graph_computes(tmp_path):
    """Issue 33: onnxruntime's default keeps a constant weight's DequantizeLinear, so the CPU dequantized every weight
    on every run of a Q/DQ model's checks; the activation's Q/DQ stays (it is what the check measures)."""
    path = weight_quantized(tmp_path / "q.onnx")
    options, disabled = session_options(as_written=False)
    options.optimized_model_filepath = str(tmp_path / "as_run.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"], disabled_optimizers=disabled)
    assert [node.name for node in onnx.load(str(tmp_path / "as_run.onnx")).graph.node] == ["q_x", "dq_x", "gemm"]
    feeds = {"x": np.random.default_rng(3).standard_normal((2, 8)).astype(np.float32)}
    unoptimized = ort.SessionOptions()
    unoptimized.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    expected = ort.InferenceSession(str(path), unoptimized, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_array_equal(OnnxSession(path).run(feeds)[0], expected)
