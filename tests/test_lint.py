"""Each Q/DQ lint rule on a minimal hand-built Q/DQ graph: it fires where TensorRT's rule is broken, not where it is kept."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from quant.lint import lint_model

F = TensorProto.FLOAT


def qdq(tensor, scale="s"):
    return [helper.make_node("QuantizeLinear", [tensor, scale, "z"], [f"{tensor}_q"], name=f"{tensor}_Q"),
            helper.make_node("DequantizeLinear", [f"{tensor}_q", scale, "z"], [f"{tensor}_dq"], name=f"{tensor}_DQ")]


def weight_dq(name="w"):
    return [helper.make_node("DequantizeLinear", [f"{name}_int8", "ws"], [name], name=f"{name}_DQ")]


def model(nodes, inputs, outputs, extra=(), shapes=None):
    inits = [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.float32(0.07), "s2"), numpy_helper.from_array(np.int8(0), "z"),
             numpy_helper.from_array(np.float32(0.01), "ws"), numpy_helper.from_array(np.ones((8, 8), np.int8), "w_int8"),
             numpy_helper.from_array(np.zeros(8, np.float32), "bias"), numpy_helper.from_array(np.ones((8, 8), np.float32), "wf"), *extra]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F, shapes.get(n, [2, 8]) if shapes else [2, 8]) for n in inputs],
                              [helper.make_tensor_value_info(n, F, None) for n in outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)


def rules(findings):
    return sorted(f.rule for f in findings)


def gemm_block(output_qdq: bool):
    """x -> Q/DQ -> MatMul(w via DQ) -> Add(bias) -> [Q/DQ] -> Add(residual with skip via Q/DQ)."""
    nodes = qdq("x") + weight_dq() + qdq("skip") + [
        helper.make_node("MatMul", ["x_dq", "w"], ["mm"], name="gemm"),
        helper.make_node("Add", ["mm", "bias"], ["biased"], name="bias_add"),
    ]
    if output_qdq:
        nodes += qdq("biased")
    nodes.append(helper.make_node("Add", ["biased_dq" if output_qdq else "biased", "skip_dq"], ["y"], name="residual"))
    return nodes


def test_qdq_after_gemm():
    findings = lint_model(model(gemm_block(output_qdq=True), ["x", "skip"], ["y"]))
    assert rules(findings) == ["qdq-after-gemm"]
    assert findings[0].nodes == ["gemm", "biased_Q", "biased_DQ", "residual"]
    assert lint_model(model(gemm_block(output_qdq=False), ["x", "skip"], ["y"])) == []


def test_residual_skip_not_quantized():
    """Under the CNN rules a float skip input is always a finding; under the transformer rules (the Add runs in float
    inside Myelin) only when the skip tensor already has a Q for another reader, which the Add can share: a new Q/DQ
    would sit on a pre-LN transformer's LayerNorm input, which the same rules keep float (a new user's trt-fusion
    model failed its own lint)."""
    from quant.presets import CNN_RULES

    nodes = [n for n in gemm_block(output_qdq=False) if n.name not in ("skip_Q", "skip_DQ")]
    nodes[-1] = helper.make_node("Add", ["biased", "skip"], ["y"], name="residual")
    assert lint_model(model(nodes, ["x", "skip"], ["y"])) == []
    findings = lint_model(model(nodes, ["x", "skip"], ["y"]), rules=CNN_RULES)
    assert rules(findings) == ["residual-skip-not-quantized"] and findings[0].nodes == ["gemm", "residual", "skip"]
    shared = nodes + qdq("skip") + [helper.make_node("MatMul", ["skip_dq", "w"], ["next"], name="next_gemm")]
    findings = lint_model(model(shared, ["x", "skip"], ["y", "next"]))
    assert rules(findings) == ["residual-skip-not-quantized"] and findings[0].nodes == ["gemm", "residual", "skip"]


def test_an_fp8_skip_q_is_no_residual_finding_under_the_transformer_rules():
    """The skip's Q the Add could share is for an INT8 fusion: an FP8 transformer quantizes its GEMM inputs alone (FP8's
    `auto` is gemm-only, quant/presets.py), so its float skip is no finding; the same graph in INT8 is one."""
    nodes = [n for n in gemm_block(output_qdq=False) if n.name not in ("skip_Q", "skip_DQ")]
    nodes[-1] = helper.make_node("Add", ["biased", "skip"], ["y"], name="residual")
    shared = nodes + qdq("skip") + [helper.make_node("MatMul", ["skip_dq", "w"], ["next"], name="next_gemm")]
    int8 = model(shared, ["x", "skip"], ["y", "next"])
    fp8 = model(shared, ["x", "skip"], ["y", "next"])
    zero = next(t for t in fp8.graph.initializer if t.name == "z")
    zero.CopyFrom(helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [], [0.0]))
    assert rules(lint_model(int8)) == ["residual-skip-not-quantized"]
    assert lint_model(fp8) == []


def test_qdq_into_float_region():
    nodes = qdq("x") + [helper.make_node("LayerNormalization", ["x_dq", "g", "b"], ["y"], name="ln")]
    extra = [numpy_helper.from_array(np.ones(8, np.float32), "g"), numpy_helper.from_array(np.zeros(8, np.float32), "b")]
    assert rules(lint_model(model(nodes, ["x"], ["y"], extra))) == ["qdq-into-float-region"]
    clean = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], name="ln")]
    assert lint_model(model(clean, ["x"], ["y"], extra)) == []


def test_weight_without_dq():
    nodes = qdq("x") + [helper.make_node("MatMul", ["x_dq", "wf"], ["y"], name="gemm")]
    findings = lint_model(model(nodes, ["x"], ["y"]))
    assert rules(findings) == ["weight-without-dq"] and findings[0].nodes == ["gemm", "wf"]
    assert lint_model(model(qdq("x") + weight_dq() + [helper.make_node("MatMul", ["x_dq", "w"], ["y"], name="gemm")], ["x"], ["y"])) == []


def test_concat_unequal_scales():
    nodes = qdq("a") + qdq("b", scale="s2") + [helper.make_node("Concat", ["a_dq", "b_dq"], ["y"], axis=0, name="cat")]
    assert rules(lint_model(model(nodes, ["a", "b"], ["y"]))) == ["concat-unequal-scales"]
    same = qdq("a") + qdq("b") + [helper.make_node("Concat", ["a_dq", "b_dq"], ["y"], axis=0, name="cat")]
    assert lint_model(model(same, ["a", "b"], ["y"])) == []


@pytest.mark.parametrize(("head", "fires"), [(48, True), (64, False)])
def test_attention_not_fusable(head, fires):
    nodes = qdq("q") + qdq("k") + [
        helper.make_node("MatMul", ["q_dq", "k_dq"], ["scores"], name="attn_matmul"),
        helper.make_node("Softmax", ["scores"], ["y"], axis=-1, name="softmax"),
    ]
    shapes = {"q": [1, 4, 16, head], "k": [1, 4, head, 16]}
    found = rules(lint_model(model(nodes, ["q", "k"], ["y"], shapes=shapes)))
    assert found == (["attention-not-fusable"] if fires else [])
    assert rules(lint_model(model(nodes, ["q", "k"], ["y"], shapes={"q": [1, 4, 16, 64], "k": [1, 4, 64, 16]}), max_sequence=1024)) == ["attention-not-fusable"]
