"""Each rewrite rule on a minimal hand-built ONNX graph: it fires (or says why not), and the
optimized graph computes the same outputs on onnxruntime CPU for random inputs."""

import math

import numpy as np
import onnx
import pytest
from conftest import run_cli
from onnx import TensorProto, helper, numpy_helper

from pipeline.core.errors import InputError
from pipeline.core.verify import run_onnx
from pipeline.optimize import optimize_file

F = TensorProto.FLOAT


def save_model(tmp_path, nodes, inputs, outputs, initializers=(), opset=20, name="g.onnx"):
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(np.asarray(v), k) for k, v in initializers])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    model = onnx.shape_inference.infer_shapes(model)
    onnx.checker.check_model(model)
    path = tmp_path / name
    onnx.save(model, path)
    return path


def optimize_and_compare(tmp_path, path, feeds, **kwargs):
    """Optimize `path`; return (optimized model, ops, max |difference| on onnxruntime)."""
    out = tmp_path / "opt.onnx"
    result = optimize_file(path, out, **kwargs)
    model = onnx.load(out)
    onnx.checker.check_model(model)
    diff = max(float(np.max(np.abs(a.astype(np.float64) - b))) for a, b in zip(run_onnx(path, feeds), run_onnx(out, feeds), strict=True))
    return model, [n.op_type for n in model.graph.node], diff, result


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def stats_of(result, rule):
    return next(r for r in result.rules if r["rule"] == rule)


# ---------------------------------------------------------------- constant folding


def test_fold_constants_folds_a_constant_chain(tmp_path):
    nodes = [
        helper.make_node("Add", ["a", "b"], ["ab"]),
        helper.make_node("Mul", ["ab", "c"], ["abc"]),
        helper.make_node("Add", ["x", "abc"], ["y"]),
    ]
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, [2, 3])],
                      [("a", rand(3, seed=1)), ("b", rand(3, seed=2)), ("c", rand(3, seed=3))])
    model, ops, diff, result = optimize_and_compare(tmp_path, path, {"x": rand(2, 3)})
    assert ops == ["Add"] and diff == 0.0
    assert stats_of(result, "fold-constants")["applied"] == 2


def test_fold_constants_folds_the_exp_of_a_weight(tmp_path):
    """CLIP's `logit_scale.exp()`: an Exp of an initializer, on which ModelOpt's INT8 quantization fails (IndexError in
    its check for an Exp after a Clip); folded, the Mul it feeds takes a constant."""
    nodes = [helper.make_node("Exp", ["scale"], ["e"]), helper.make_node("Mul", ["x", "e"], ["y"])]
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, [2, 3])],
                      [("scale", np.float32(2.6592))])
    model, ops, diff, result = optimize_and_compare(tmp_path, path, {"x": rand(2, 3)})
    assert ops == ["Mul"] and diff <= 1e-5 and stats_of(result, "fold-constants")["applied"] == 1


def test_fold_constants_never_duplicates_a_shared_large_weight(tmp_path):
    weight = rand(300, 300)
    nodes = [
        helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "wt"], ["y1"]),
        helper.make_node("MatMul", ["x", "w"], ["y2"]),
    ]
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("x", F, [2, 300])],
                      [helper.make_tensor_value_info("y1", F, [2, 300]), helper.make_tensor_value_info("y2", F, [2, 300])], [("w", weight)])
    model, ops, diff, result = optimize_and_compare(tmp_path, path, {"x": rand(2, 300)})
    assert "Transpose" in ops and len(model.graph.initializer) == 1 and diff == 0.0
    assert "folding would duplicate a large constant used elsewhere" in stats_of(result, "fold-constants")["why_not"]


def test_fold_constants_keeps_weight_dequantize(tmp_path):
    """TensorRT needs DequantizeLinear between a weight and its layer: never fold it into a float weight."""
    nodes = [
        helper.make_node("DequantizeLinear", ["wq", "scale", "zero"], ["w"]),
        helper.make_node("MatMul", ["x", "w"], ["y"]),
    ]
    wq = np.random.default_rng(0).integers(-127, 127, (4, 4)).astype(np.int8)
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("x", F, [2, 4])], [helper.make_tensor_value_info("y", F, [2, 4])],
                      [("wq", wq), ("scale", np.float32(0.02)), ("zero", np.int8(0))])
    model, ops, diff, result = optimize_and_compare(tmp_path, path, {"x": rand(2, 4)})
    assert ops == ["DequantizeLinear", "MatMul"] and diff == 0.0
    assert "DequantizeLinear is never folded" in stats_of(result, "fold-constants")["why_not"]


def test_static_shape_chain_folds_to_a_constant(tmp_path):
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["d0"], axis=0),
        helper.make_node("Unsqueeze", ["d0", "ax"], ["u0"]),
        helper.make_node("Concat", ["u0", "rest"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("x", F, [2, 3, 4])], [helper.make_tensor_value_info("y", F, [2, 12])],
                      [("i0", np.int64(0)), ("ax", np.array([0], np.int64)), ("rest", np.array([12], np.int64))])
    model, ops, diff, result = optimize_and_compare(tmp_path, path, {"x": rand(2, 3, 4)})
    assert ops == ["Reshape"] and diff == 0.0
    assert stats_of(result, "fold-static-shape")["applied"] == 1


def test_dynamic_reshape_copies_input_dims_with_zero(tmp_path):
    """Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), Unsqueeze(Gather(Shape(x), 1)), [4, 2])) with dynamic dims."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["d0"], axis=0),
        helper.make_node("Gather", ["s", "i1"], ["d1"], axis=0),
        helper.make_node("Unsqueeze", ["d0", "ax"], ["u0"]),
        helper.make_node("Unsqueeze", ["d1", "ax"], ["u1"]),
        helper.make_node("Concat", ["u0", "u1", "rest"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("x", F, ["b", "s", 8])], [helper.make_tensor_value_info("y", F, ["b", "s", 4, 2])],
                      [("i0", np.int64(0)), ("i1", np.int64(1)), ("ax", np.array([0], np.int64)), ("rest", np.array([4, 2], np.int64))])
    for batch, seq in ((1, 5), (3, 2)):
        model, ops, diff, result = optimize_and_compare(tmp_path, path, {"x": rand(batch, seq, 8)})
        assert ops == ["Reshape"] and diff == 0.0
    assert numpy_helper.to_array(model.graph.initializer[0]).tolist() == [0, 0, 4, 2]


def test_dynamic_reshape_keeps_a_piece_from_another_dim(tmp_path):
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i1"], ["d1"], axis=0),
        helper.make_node("Unsqueeze", ["d1", "ax"], ["u1"]),
        helper.make_node("Concat", ["u1", "rest"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("x", F, ["b", "s", 8])], [helper.make_tensor_value_info("y", F, None)],
                      [("i1", np.int64(1)), ("ax", np.array([0], np.int64)), ("rest", np.array([-1], np.int64))])
    model, ops, diff, result = optimize_and_compare(tmp_path, path, {"x": rand(1, 4, 8)})
    assert "Shape" in ops and diff == 0.0
    assert "a shape piece does not copy the data's dim at the same position" in stats_of(result, "reshape-copy-input-dims")["why_not"]


# ---------------------------------------------------------------- no-op removal


@pytest.mark.parametrize(
    ("node", "rule"),
    [
        (helper.make_node("Identity", ["h"], ["n"]), "remove-identity"),
        (helper.make_node("Cast", ["h"], ["n"], to=F), "remove-same-type-cast"),
        (helper.make_node("Dropout", ["h"], ["n"]), "remove-dropout"),
        (helper.make_node("Transpose", ["h"], ["n"], perm=[0, 1]), "remove-identity-transpose"),
    ],
)
def test_noop_nodes_are_removed(tmp_path, node, rule):
    nodes = [helper.make_node("Relu", ["x"], ["h"]), node, helper.make_node("Sigmoid", ["n"], ["y"])]
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, [2, 3])])
    model, ops, diff, result = optimize_and_compare(tmp_path, path, {"x": rand(2, 3)})
    assert ops == ["Relu", "Sigmoid"] and diff == 0.0 and stats_of(result, rule)["applied"] == 1


def test_noop_removal_keeps_the_graph_output_name(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Identity", ["h"], ["y"])]
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("x", F, [2])], [helper.make_tensor_value_info("y", F, [2])])
    model, ops, diff, _ = optimize_and_compare(tmp_path, path, {"x": rand(2)})
    assert ops == ["Relu"] and [o.name for o in model.graph.output] == ["y"] and model.graph.node[0].output == ["y"]


def test_cast_to_another_type_stays(tmp_path):
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16), helper.make_node("Cast", ["h"], ["y"], to=F)]
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("x", F, [3])], [helper.make_tensor_value_info("y", F, [3])])
    _, ops, diff, result = optimize_and_compare(tmp_path, path, {"x": rand(3)})
    assert ops == ["Cast", "Cast"] and diff == 0.0
    assert stats_of(result, "remove-same-type-cast")["why_not"] == {"casts to another type": 2}


def test_castlike_becomes_a_cast_to_the_type_it_names(tmp_path):
    """CastLike(x, like) -> Cast(x, to=dtype(like)); to x's own type it then disappears as a no-op."""
    H = TensorProto.FLOAT16
    nodes = [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("CastLike", ["h", "half"], ["c"], name="to_half"),
             helper.make_node("CastLike", ["c", "x"], ["back"], name="to_float"), helper.make_node("CastLike", ["back", "x"], ["y"], name="same")]
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("x", F, [2, 3]), helper.make_tensor_value_info("half", H, [1])],
                      [helper.make_tensor_value_info("y", F, [2, 3])])
    model, ops, diff, result = optimize_and_compare(tmp_path, path, {"x": rand(2, 3), "half": np.zeros(1, np.float16)})
    assert ops == ["Relu", "Cast", "Cast"] and diff == 0.0
    assert [a.i for n in model.graph.node if n.op_type == "Cast" for a in n.attribute] == [H, F]
    assert [n.name for n in model.graph.node if n.op_type == "Cast"] == ["to_half", "to_float"]
    assert stats_of(result, "castlike-to-cast")["applied"] == 3 and stats_of(result, "remove-same-type-cast")["applied"] == 1

def test_same_shape_reshape_is_removed(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Reshape", ["h", "shape"], ["r"]), helper.make_node("Sigmoid", ["r"], ["y"])]
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("x", F, [2, 6])], [helper.make_tensor_value_info("y", F, [2, 6])],
                      [("shape", np.array([2, -1], np.int64))])
    _, ops, diff, result = optimize_and_compare(tmp_path, path, {"x": rand(2, 6)})
    assert ops == ["Relu", "Sigmoid"] and diff == 0.0 and stats_of(result, "remove-same-shape-reshape")["applied"] == 1


def test_an_identity_transpose_before_a_gemm_is_removed_so_onnxruntime_can_run_the_graph(tmp_path):
    """SAM3-Lite's text model as the dynamo exporter writes it: Transpose(perm=[0, 1]) -> Gemm(transB=1). onnxruntime's
    GemmTransposeFusion folds the Transpose in as if it swapped the axes and the session fails at every shape."""
    import onnxruntime as ort

    nodes = [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Transpose", ["h"], ["t"], perm=[0, 1]),
             helper.make_node("Gemm", ["t", "w"], ["y"], transB=1)]
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("x", F, ["batch", 8])], [helper.make_tensor_value_info("y", F, ["batch", 16])],
                      [("w", rand(16, 8, seed=1))])
    with pytest.raises(Exception, match="GemmTransposeFusion"):
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": rand(3, 8)})
    out = tmp_path / "opt.onnx"
    optimize_file(path, out)
    assert [n.op_type for n in onnx.load(out).graph.node] == ["Relu", "Gemm"]
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": rand(3, 8)})[0]
    np.testing.assert_allclose(got, np.maximum(rand(3, 8), 0) @ rand(16, 8, seed=1).T, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("second", "expected"), [([0, 2, 1], ["Relu", "Sigmoid"]), ([2, 0, 1], ["Relu", "Transpose", "Sigmoid"])])
def test_transpose_pairs_cancel_or_merge(tmp_path, second, expected):
    nodes = [
        helper.make_node("Relu", ["x"], ["h"]),
        helper.make_node("Transpose", ["h"], ["t1"], perm=[0, 2, 1]),
        helper.make_node("Transpose", ["t1"], ["t2"], perm=second),
        helper.make_node("Sigmoid", ["t2"], ["y"]),
    ]
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("x", F, [2, 3, 4])], [helper.make_tensor_value_info("y", F, None)])
    _, ops, diff, _ = optimize_and_compare(tmp_path, path, {"x": rand(2, 3, 4)})
    assert ops == expected and diff == 0.0


def test_expand_that_broadcasting_does_is_removed(tmp_path):
    nodes = [
        helper.make_node("Expand", ["b", "shape"], ["be"]),
        helper.make_node("Add", ["x", "be"], ["y"]),
    ]
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("x", F, [2, 3, 4]), helper.make_tensor_value_info("b", F, [4])],
                      [helper.make_tensor_value_info("y", F, [2, 3, 4])], [("shape", np.array([2, 3, 4], np.int64))])
    _, ops, diff, result = optimize_and_compare(tmp_path, path, {"x": rand(2, 3, 4), "b": rand(4, seed=5)})
    assert ops == ["Add"] and diff == 0.0 and stats_of(result, "remove-noop-expand")["applied"] == 1


# ---------------------------------------------------------------- fusions


def layernorm_nodes(eps_name="eps", square="Pow"):
    square_node = helper.make_node("Pow", ["d", "two"], ["sq"]) if square == "Pow" else helper.make_node("Mul", ["d", "d"], ["sq"])
    return [
        helper.make_node("ReduceMean", ["x", "axes"], ["mean"], keepdims=1),
        helper.make_node("Sub", ["x", "mean"], ["d"]),
        square_node,
        helper.make_node("ReduceMean", ["sq", "axes"], ["var"], keepdims=1),
        helper.make_node("Add", ["var", eps_name], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["std"]),
        helper.make_node("Div", ["d", "std"], ["n"]),
        helper.make_node("Mul", ["n", "gamma"], ["g"]),
        helper.make_node("Add", ["g", "beta"], ["y"]),
    ]


@pytest.mark.parametrize("square", ["Pow", "Mul"])
@pytest.mark.parametrize("eps", [1e-12, 1e-5])
def test_layernorm_is_fused_with_its_exact_epsilon(tmp_path, square, eps):
    inits = [("axes", np.array([-1], np.int64)), ("two", np.float32(2.0)), ("eps", np.float32(eps)),
             ("gamma", rand(16, seed=1)), ("beta", rand(16, seed=2))]
    path = save_model(tmp_path, layernorm_nodes(square=square), [helper.make_tensor_value_info("x", F, [2, 5, 16])],
                      [helper.make_tensor_value_info("y", F, [2, 5, 16])], inits, opset=18)
    model, ops, diff, _ = optimize_and_compare(tmp_path, path, {"x": rand(2, 5, 16) * 3 + 1})
    assert ops == ["LayerNormalization"] and diff <= 1e-5
    (epsilon,) = [a.f for a in model.graph.node[0].attribute if a.name == "epsilon"]
    assert epsilon == np.float32(eps) and epsilon > 0


def test_layernorm_is_left_alone_below_opset_17(tmp_path):
    inits = [("two", np.float32(2.0)), ("eps", np.float32(1e-12)), ("gamma", rand(16)), ("beta", rand(16))]
    nodes = [n for n in layernorm_nodes()]
    for n in nodes:
        if n.op_type == "ReduceMean":
            del n.input[1]
            n.attribute.append(helper.make_attribute("axes", [-1]))
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("x", F, [2, 16])], [helper.make_tensor_value_info("y", F, [2, 16])], inits, opset=13)
    _, ops, diff, result = optimize_and_compare(tmp_path, path, {"x": rand(2, 16)})
    assert "LayerNormalization" not in ops and diff == 0.0
    assert stats_of(result, "fuse-layernorm")["why_not"] == {"needs opset >= 17, model has 13": 1}


def test_layernorm_not_fused_when_an_inner_value_is_reused(tmp_path):
    inits = [("axes", np.array([-1], np.int64)), ("two", np.float32(2.0)), ("eps", np.float32(1e-12)), ("gamma", rand(16)), ("beta", rand(16))]
    nodes = layernorm_nodes() + [helper.make_node("Relu", ["var"], ["leak"])]
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("x", F, [2, 16])],
                      [helper.make_tensor_value_info("y", F, [2, 16]), helper.make_tensor_value_info("leak", F, [2, 1])], inits, opset=18)
    _, ops, diff, result = optimize_and_compare(tmp_path, path, {"x": rand(2, 16)})
    assert "LayerNormalization" not in ops and diff == 0.0
    assert "an intermediate value is used outside the pattern" in stats_of(result, "fuse-layernorm")["why_not"]


def gelu_erf_nodes(order):
    if order == "x*0.5*(1+erf)":
        return [helper.make_node("Div", ["x", "sqrt2"], ["xd"]), helper.make_node("Erf", ["xd"], ["e"]), helper.make_node("Add", ["e", "one"], ["p"]),
                helper.make_node("Mul", ["x", "half"], ["xh"]), helper.make_node("Mul", ["xh", "p"], ["y"])]
    return [helper.make_node("Mul", ["x", "inv_sqrt2"], ["xd"]), helper.make_node("Erf", ["xd"], ["e"]), helper.make_node("Add", ["one", "e"], ["p"]),
            helper.make_node("Mul", ["x", "p"], ["xp"]), helper.make_node("Mul", ["half", "xp"], ["y"])]


GELU_CONSTANTS = [("sqrt2", np.float32(math.sqrt(2))), ("inv_sqrt2", np.float32(1 / math.sqrt(2))), ("one", np.float32(1.0)), ("half", np.float32(0.5))]


@pytest.mark.parametrize("order", ["x*0.5*(1+erf)", "0.5*(x*(1+erf))"])
def test_erf_gelu_is_fused(tmp_path, order):
    nodes = gelu_erf_nodes(order)
    used = {i for n in nodes for i in n.input}
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("x", F, [4, 8])], [helper.make_tensor_value_info("y", F, [4, 8])],
                      [c for c in GELU_CONSTANTS if c[0] in used])
    model, ops, diff, _ = optimize_and_compare(tmp_path, path, {"x": rand(4, 8) * 3})
    assert ops == ["Gelu"] and not model.graph.node[0].attribute and diff <= 1e-5


def test_tanh_gelu_is_fused(tmp_path):
    nodes = [
        helper.make_node("Pow", ["x", "three"], ["x3"]), helper.make_node("Mul", ["cubic", "x3"], ["cx3"]),
        helper.make_node("Add", ["x", "cx3"], ["inner"]), helper.make_node("Mul", ["k", "inner"], ["arg"]),
        helper.make_node("Tanh", ["arg"], ["t"]), helper.make_node("Add", ["one", "t"], ["p"]),
        helper.make_node("Mul", ["half", "x"], ["hx"]), helper.make_node("Mul", ["hx", "p"], ["y"]),
    ]
    inits = [("three", np.float32(3)), ("cubic", np.float32(0.044715)), ("k", np.float32(math.sqrt(2 / math.pi))), ("one", np.float32(1)), ("half", np.float32(0.5))]
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("x", F, [4, 8])], [helper.make_tensor_value_info("y", F, [4, 8])], inits)
    model, ops, diff, _ = optimize_and_compare(tmp_path, path, {"x": rand(4, 8) * 3})
    assert ops == ["Gelu"] and helper.get_attribute_value(model.graph.node[0].attribute[0]) == b"tanh" and diff <= 1e-5


def test_gelu_is_left_alone_below_opset_20(tmp_path):
    nodes = gelu_erf_nodes("x*0.5*(1+erf)")
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("x", F, [4, 8])], [helper.make_tensor_value_info("y", F, [4, 8])],
                      [c for c in GELU_CONSTANTS if c[0] in {"sqrt2", "one", "half"}], opset=18)
    _, ops, diff, _ = optimize_and_compare(tmp_path, path, {"x": rand(4, 8)})
    assert "Gelu" not in ops and diff == 0.0


def test_gelu_with_a_wrong_constant_is_not_fused(tmp_path):
    nodes = gelu_erf_nodes("x*0.5*(1+erf)")
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("x", F, [4, 8])], [helper.make_tensor_value_info("y", F, [4, 8])],
                      [("sqrt2", np.float32(1.5)), ("one", np.float32(1.0)), ("half", np.float32(0.5))])
    _, ops, diff, _ = optimize_and_compare(tmp_path, path, {"x": rand(4, 8)})
    assert "Gelu" not in ops and diff == 0.0


# ---------------------------------------------------------------- attention scale


def attention_nodes(q_from_dq=False, k_from_dq=False):
    nodes = []
    q, k = "q", "kt"
    if q_from_dq:
        nodes += [helper.make_node("QuantizeLinear", ["q", "s", "z"], ["qq"]), helper.make_node("DequantizeLinear", ["qq", "s", "z"], ["qd"])]
        q = "qd"
    if k_from_dq:
        nodes += [helper.make_node("QuantizeLinear", ["kt", "s", "z"], ["kq"]), helper.make_node("DequantizeLinear", ["kq", "s", "z"], ["kd"])]
        k = "kd"
    return nodes + [
        helper.make_node("MatMul", [q, k], ["scores"], name="/attn/MatMul"),
        helper.make_node("Div", ["scores", "scale"], ["scaled"], name="/attn/Div"),
        helper.make_node("Add", ["scaled", "mask"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["y"], axis=-1),
    ]


def attention_model(tmp_path, **kwargs):
    inputs = [helper.make_tensor_value_info(n, F, s) for n, s in (("q", [2, 4, 6, 8]), ("kt", [2, 4, 8, 6]), ("mask", [2, 1, 1, 6]))]
    inits = [("scale", np.float32(8.0)), ("s", np.float32(0.05)), ("z", np.int8(0))]
    return save_model(tmp_path, attention_nodes(**kwargs), inputs, [helper.make_tensor_value_info("y", F, [2, 4, 6, 6])], inits)


def attention_feeds():
    return {"q": rand(2, 4, 6, 8, seed=1), "kt": rand(2, 4, 8, 6, seed=2), "mask": np.where(rand(2, 1, 1, 6, seed=3) > 0, 0, -1e4).astype(np.float32)}


def test_attention_scale_moves_before_the_first_matmul(tmp_path):
    model, ops, diff, _ = optimize_and_compare(tmp_path, attention_model(tmp_path), attention_feeds())
    assert ops == ["Div", "MatMul", "Add", "Softmax"] and diff <= 1e-6
    div, matmul = model.graph.node[0], model.graph.node[1]
    assert div.name == "/attn/Div" and list(div.input) == ["q", "scale"] and matmul.input[0] == div.output[0]


def test_attention_scale_goes_to_k_when_q_is_dequantized(tmp_path):
    model, ops, diff, _ = optimize_and_compare(tmp_path, attention_model(tmp_path, q_from_dq=True), attention_feeds())
    matmul = next(n for n in model.graph.node if n.op_type == "MatMul")
    div = next(n for n in model.graph.node if n.op_type == "Div")
    assert matmul.input[0] == "qd" and matmul.input[1] == div.output[0] and diff <= 1e-6


def test_attention_scale_never_goes_between_dq_and_matmul(tmp_path):
    model, ops, diff, result = optimize_and_compare(tmp_path, attention_model(tmp_path, q_from_dq=True, k_from_dq=True), attention_feeds())
    assert ops[-4:] == ["MatMul", "Div", "Add", "Softmax"] and diff == 0.0
    assert any("both MatMul inputs come from DequantizeLinear" in r for r in stats_of(result, "scale-before-attention-matmul")["why_not"])


def test_a_scaled_matmul_that_is_not_attention_stays(tmp_path):
    nodes = [helper.make_node("MatMul", ["a", "b"], ["m"]), helper.make_node("Div", ["m", "scale"], ["y"])]
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("a", F, [2, 3]), helper.make_tensor_value_info("b", F, [3, 4])],
                      [helper.make_tensor_value_info("y", F, [2, 4])], [("scale", np.float32(8.0))])
    _, ops, diff, result = optimize_and_compare(tmp_path, path, {"a": rand(2, 3), "b": rand(3, 4)})
    assert ops == ["MatMul", "Div"] and diff == 0.0
    assert "the scaled scores do not reach a Softmax (not attention)" in stats_of(result, "scale-before-attention-matmul")["why_not"]


# ---------------------------------------------------------------- selection


def test_rules_can_be_selected_and_skipped(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Identity", ["h"], ["y"])]
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("x", F, [2])], [helper.make_tensor_value_info("y", F, [2])])
    _, ops, _, _ = optimize_and_compare(tmp_path, path, {"x": rand(2)}, skip=["remove-identity"])
    assert ops == ["Relu", "Identity"]
    with pytest.raises(InputError, match="unknown rule nope; rules are: fold-constants"):
        optimize_file(path, tmp_path / "o.onnx", only=["nope"])


# ---------------------------------------------------------------- sequences


@pytest.mark.parametrize(("split", "indices"), [(np.int64(4), [0, 1, -1]), (np.array([4, 4, 4], np.int64), [2, 0])])
def test_split_to_sequence_becomes_split(tmp_path, split, indices):
    """GPT-2's dynamo export: SequenceAt(SplitToSequence(x, 64, axis=2), 0/1/2); a scalar or 1-D split, negative indices."""
    nodes = [helper.make_node("SplitToSequence", ["x", "split"], ["seq"], axis=1)]
    nodes += [helper.make_node("SequenceAt", ["seq", f"i{k}"], [f"part{k}"]) for k in range(len(indices))]
    nodes += [helper.make_node("Relu", [f"part{k}"], [f"y{k}"]) for k in range(len(indices))]
    outputs = [helper.make_tensor_value_info(f"y{k}", F, None) for k in range(len(indices))]
    constants = [("split", split), *[(f"i{k}", np.int64(i)) for k, i in enumerate(indices)]]
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("x", F, [2, 12])], outputs, constants)
    model, ops, diff, result = optimize_and_compare(tmp_path, path, {"x": rand(2, 12)})
    assert sorted(ops) == ["Relu"] * len(indices) + ["Split"] and diff == 0.0
    assert stats_of(result, "split-to-sequence-as-split")["applied"] == 1


@pytest.mark.parametrize("indices", [[0, 2, 1], [1, -1]])
def test_split_to_sequence_with_computed_lengths_becomes_slices(tmp_path, indices):
    """A mixture of experts' dynamo export (JetMoE): the tokens each expert takes, split by lengths the router computes;
    AutoCast's reference run failed on the sequence (Polygraphy: "dtype is unsupported for objects of type: list")."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Gather", ["shape", "zero"], ["rows"], axis=0),
             helper.make_node("Sub", ["rows", "five"], ["rest"]), helper.make_node("Concat", ["two", "three", "rest"], ["split"], axis=0),
             helper.make_node("SplitToSequence", ["x", "split"], ["seq"], axis=0)]
    nodes += [helper.make_node("SequenceAt", ["seq", f"i{k}"], [f"part{k}"]) for k in range(len(indices))]
    nodes += [helper.make_node("Relu", [f"part{k}"], [f"y{k}"]) for k in range(len(indices))]
    outputs = [helper.make_tensor_value_info(f"y{k}", F, None) for k in range(len(indices))]
    constants = [("zero", np.array([0], np.int64)), ("two", np.array([2], np.int64)), ("three", np.array([3], np.int64)),
                 ("five", np.array([5], np.int64)), *[(f"i{k}", np.int64(i)) for k, i in enumerate(indices)]]
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("x", F, ["rows", 4])], outputs, constants)
    result = optimize_file(path, tmp_path / "opt.onnx")
    assert not {"SplitToSequence", "SequenceAt"} & {n.op_type for n in onnx.load(tmp_path / "opt.onnx").graph.node}
    assert stats_of(result, "split-to-sequence-as-slices")["applied"] == 1
    for rows in (9, 5, 12):  # onnxruntime's own run of the sequence reuses one part's buffer for another: numpy is the reference
        x = rand(rows, 4, seed=rows)
        parts = np.split(x, [2, 5])
        expected = [np.maximum(parts[i], 0) for i in indices]
        assert all(np.array_equal(a, b) for a, b in zip(run_onnx(tmp_path / "opt.onnx", {"x": x}), expected, strict=True))


def test_split_to_sequence_read_otherwise_is_kept(tmp_path):
    nodes = [helper.make_node("SplitToSequence", ["x", "split"], ["seq"], axis=1), helper.make_node("SequenceLength", ["seq"], ["y"])]
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("x", F, [2, 12])], [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
                      [("split", np.int64(4))])
    model, ops, diff, result = optimize_and_compare(tmp_path, path, {"x": rand(2, 12)})
    assert ops == ["SplitToSequence", "SequenceLength"]
    assert "the sequence is used by something other than SequenceAt" in stats_of(result, "split-to-sequence-as-split")["why_not"]


def test_rules_are_selected_by_name(tmp_path):
    """`--rules fuse-gelu` once rejected every name (operator precedence in select_rules)."""
    from pipeline.optimize import select_rules
    from pipeline.optimize.rules import RULE_NAMES

    assert [r.name for r in select_rules(["fuse-gelu"])] == ["fuse-gelu"]
    assert [r.name for r in select_rules(None, ["fuse-gelu"])] == [n for n in RULE_NAMES if n != "fuse-gelu"]
    with pytest.raises(InputError, match="unknown rule fuse-gleu; rules are: "):
        select_rules(["fuse-gleu"])
    with pytest.raises(InputError, match="unknown rule nope"):
        select_rules(None, ["nope"])


def test_optimize_command_lists_and_selects_rules(tmp_path):
    from pipeline.optimize.rules import RULE_NAMES

    listed = run_cli("optimize", "--list-rules")
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == RULE_NAMES
    assert all(" -> " in line for line in listed.stdout.splitlines()[1:]), "each rule states its rewrite"
    nodes = [helper.make_node("Mul", ["x", "half"], ["xh"]), helper.make_node("Div", ["x", "sqrt2"], ["xs"]), helper.make_node("Erf", ["xs"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["xh", "e1"], ["y"])]
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, [2, 3])],
                      [("half", np.float32(0.5)), ("sqrt2", np.float32(math.sqrt(2))), ("one", np.float32(1.0))])
    only_gelu = run_cli("optimize", str(path), "-o", str(tmp_path / "o.onnx"), "--rules", "fuse-gelu")
    assert only_gelu.returncode == 0, only_gelu.stderr
    assert [n.op_type for n in onnx.load(tmp_path / "o.onnx").graph.node] == ["Gelu"]
    typo = run_cli("optimize", str(path), "-o", str(tmp_path / "o.onnx"), "--rules", "fuse-gleu")
    assert typo.returncode == 2 and "unknown rule fuse-gleu" in typo.stderr


# ---------------------------------------------------------------- lookups


def range_gather_model(tmp_path, start=0, delta=1, dtype=TensorProto.INT64, extra_use=False):
    """data[Range(start, n, delta)] along axis 0, n a graph input (a position embedding's lookup)."""
    nodes = [helper.make_node("Constant", [], ["start"], value=helper.make_tensor("s", dtype, [], [start])),
             helper.make_node("Constant", [], ["delta"], value=helper.make_tensor("d", dtype, [], [delta])),
             helper.make_node("Range", ["start", "n", "delta"], ["positions"]),
             helper.make_node("Gather", ["table", "positions"], ["y"], axis=0)]
    outputs = [helper.make_tensor_value_info("y", F, None)]
    if extra_use:
        nodes.append(helper.make_node("Cast", ["positions"], ["positions_float"], to=F))
        outputs.append(helper.make_tensor_value_info("positions_float", F, None))
    return save_model(tmp_path, nodes, [helper.make_tensor_value_info("n", dtype, [])], outputs, [("table", rand(16, 4))])


@pytest.mark.parametrize(("start", "delta", "dtype"), [(0, 1, TensorProto.INT64), (2, 3, TensorProto.INT64), (1, 1, TensorProto.INT32)])
def test_gather_of_a_range_becomes_a_slice(tmp_path, start, delta, dtype):
    path = range_gather_model(tmp_path, start, delta, dtype)
    numpy_type = np.int64 if dtype == TensorProto.INT64 else np.int32
    for n in (7, 16):
        model, ops, diff, result = optimize_and_compare(tmp_path, path, {"n": np.array(n, numpy_type)})
        assert "Gather" not in ops and "Range" not in ops and "Slice" in ops
        assert diff == 0.0
    assert stats_of(result, "gather-of-range-as-slice")["applied"] == 1


def test_gather_of_a_range_from_a_caches_length_becomes_a_slice(tmp_path):
    """A decoder's positions, arange(past, past + seq) with past the cache's length (a Shape): ModelOpt AutoCast's
    reference run of a user's decoder failed in onnxruntime on it ("... producing output: arange")."""
    nodes = [helper.make_node("Shape", ["past"], ["past_shape"]),
             helper.make_node("Gather", ["past_shape", "two"], ["past_length"], axis=0),
             helper.make_node("Add", ["past_length", "seq"], ["end"]),
             helper.make_node("Range", ["past_length", "end", "one"], ["positions"]),
             helper.make_node("Gather", ["table", "positions"], ["y"], axis=0)]
    constants = [("table", rand(16, 4)), ("two", np.array(2, np.int64)), ("one", np.array(1, np.int64))]
    path = save_model(tmp_path, nodes, [helper.make_tensor_value_info("past", F, [1, 2, "past_seq", 4]),
                                        helper.make_tensor_value_info("seq", TensorProto.INT64, [])],
                      [helper.make_tensor_value_info("y", F, None)], constants)
    for past, seq in ((0, 5), (7, 1), (3, 13)):
        _, ops, diff, result = optimize_and_compare(tmp_path, path, {"past": rand(1, 2, past, 4), "seq": np.array(seq, np.int64)})
        assert "Range" not in ops and "Slice" in ops and diff == 0.0
    assert stats_of(result, "gather-of-range-as-slice")["applied"] == 1


def test_gather_of_a_range_counting_from_the_end_or_read_elsewhere_stays(tmp_path):
    _, ops, diff, result = optimize_and_compare(tmp_path, range_gather_model(tmp_path, start=-3), {"n": np.array(-1, np.int64)})
    assert "Gather" in ops and diff == 0.0
    assert "the Range counts down or from a start that may be negative (a Gather index counts from the end)" in stats_of(result, "gather-of-range-as-slice")["why_not"]
    _, ops, _, result = optimize_and_compare(tmp_path, range_gather_model(tmp_path, extra_use=True), {"n": np.array(5, np.int64)})
    assert "Gather" in ops and "the Range's indices are used by other nodes or are a graph output" in stats_of(result, "gather-of-range-as-slice")["why_not"]
