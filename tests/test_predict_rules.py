"""Each rule of the prediction on the smallest graph that shows it (trt/predict/rules.py and the Q/DQ rules
it shares with the lint, pipeline/core/qdq.py); the last test checks no rule is without one."""

import numpy as np
import pytest
from predict_graphs import Graph, image, layer_nodes, reasons, run, tokens

from pipeline.core.qdq import RULES
from trt.predict.rules import FUSION_RULES

TESTED: set[str] = set()


def covers(*rule_ids: str):
    TESTED.update(rule_ids)
    return lambda test: test


# ---------------------------------------------------------------- fusions outside Myelin


@covers("constant-folding", "erase-no-op")
def test_constants_fold_and_no_ops_are_erased():
    g = Graph()
    x = image(g)
    scale = g.op("Mul", [g.init("a", np.float32(2.0)), g.init("b", np.float32(3.0))], "folded_mul")
    y = g.op("Identity", [g.op("Relu", [g.conv(x, "conv")], "relu")], "identity")
    out = g.op("Mul", [g.op("Flatten", [y], "flatten"), scale], "scale")
    prediction = run(g.model(out), trt_major=8)
    assert layer_nodes(prediction) == [["conv", "relu", "scale"]]  # the Flatten between relu and scale is erased: the scale fuses too
    assert not any("folded_mul" in layer.onnx_nodes or "identity" in layer.onnx_nodes for layer in prediction.layers)


@covers("conv-epilogue")
def test_a_convolution_takes_batchnorm_activation_and_a_pointwise_swish():
    g = Graph()
    x = image(g)
    c = g.conv(x, "conv")
    bn = g.op("BatchNormalization", [c, *(g.weight(f"bn.{p}", (8,)) for p in ("w", "b", "m")), g.init("bn.v", np.ones(8, np.float32))], "bn")
    silu = g.op("Mul", [bn, g.op("Sigmoid", [bn], "sigmoid")], "silu")
    prediction = run(g.model(silu), trt_major=8)
    assert layer_nodes(prediction) == [["conv", "bn", "sigmoid", "silu"]]


@covers("conv-residual-add")
def test_a_residual_add_goes_to_the_later_convolution_or_to_the_one_whose_output_is_not_quantized():
    g = Graph()
    x = image(g)
    first = g.conv(x, "conv_a")
    second = g.conv(x, "conv_b")
    out = g.op("Relu", [g.op("Add", [first, second], "add")], "relu")
    assert ["conv_b", "add", "relu"] in layer_nodes(run(g.model(out), trt_major=8))

    g = Graph()
    x = g.qdq(image(g), name="input")
    first = g.conv(x, "conv_a", quantized=True)
    second = g.qdq(g.conv(x, "conv_b", quantized=True), name="skip")  # the quantized side is the residual
    out = g.op("Relu", [g.op("Add", [first, second], "add")], "relu")
    assert ["conv_a", "add", "relu"] in layer_nodes(run(g.model(g.qdq(out, name="out")), trt_major=8))


@covers("conv-pool-int8")
def test_an_int8_convolution_takes_the_max_pooling_after_it():
    g = Graph()
    x = g.qdq(image(g), name="input")
    pooled = g.op("MaxPool", [g.op("Relu", [g.conv(x, "conv", quantized=True)], "relu")], "pool", kernel_shape=[2, 2], strides=[2, 2])
    out = g.conv(g.qdq(pooled, name="pooled"), "conv2", quantized=True)
    assert ["conv", "relu", "pool"] in layer_nodes(run(g.model(out), trt_major=8))
    g = Graph()
    pooled = g.op("MaxPool", [g.op("Relu", [g.conv(image(g), "conv")], "relu")], "pool", kernel_shape=[2, 2], strides=[2, 2])
    assert layer_nodes(run(g.model(pooled), trt_major=8)) == [["conv", "relu"], ["pool"]]  # in float they stay apart


@covers("reduce-as-pooling")
def test_a_mean_over_height_and_width_is_a_pooling_layer_outside_myelin():
    g = Graph()
    out = g.op("ReduceMean", [g.op("Relu", [g.conv(image(g), "conv")], "relu")], "mean", axes=[2, 3], keepdims=1)
    layers = run(g.model(out)).layers
    assert [(layer.type, layer.onnx_nodes) for layer in layers] == [("CaskConvolution", ["conv", "relu"]), ("CaskPooling", ["mean"])]
    g = Graph()
    out = g.op("ReduceMean", [tokens(g)], "mean", axes=[2], keepdims=1)  # a reduction over features stays a Myelin kernel
    assert run(g.model(out)).layers[0].myelin


@covers("fc-as-convolution")
def test_trt8_runs_a_gemm_as_a_convolution_with_a_shuffle_after_it():
    g = Graph()
    x = g.op("Flatten", [g.op("GlobalAveragePool", [g.conv(image(g), "conv")], "gap")], "flatten")
    out = g.op("Gemm", [x, g.weight("fc.weight", (4, 8)), g.weight("fc.bias", (4,))], "fc", transB=1)
    layers = [layer for layer in run(g.model(out), trt_major=8).layers if layer.origin != "REFORMAT"]  # copies: fc-format-copy
    assert [(layer.type, layer.name) for layer in layers[-2:]] == [("CaskConvolution", "fc"), ("NoOp", "reshape_after_fc")]
    assert not any(layer.myelin for layer in layers)
    assert run(g.model(out), trt_major=10).layers[-1].myelin  # 10.x: the GEMM runs in Myelin


def fc_head(g: Graph, quantized: bool = False) -> str:
    """Convolution, global average pooling, Flatten and a Gemm: an image network's head."""
    x = g.qdq(image(g), name="input") if quantized else image(g)
    pooled = g.op("Flatten", [g.op("GlobalAveragePool", [g.conv(x, "conv", quantized=quantized)], "gap")], "flatten")
    if quantized:
        return g.op("Gemm", [g.qdq(pooled, name="pooled"), g.qweight("fc", (4, 8)), g.weight("fc.bias", (4,))], "fc", transB=1)
    return g.op("Gemm", [pooled, g.weight("fc.weight", (4, 8)), g.weight("fc.bias", (4,))], "fc", transB=1)


@covers("fc-format-copy")
def test_trt8_copies_a_float_fc_output_to_linear_before_its_shuffle():
    copy = "Reformatting CopyNode for Input Tensor 0 to reshape_after_fc"
    g = Graph()
    out = fc_head(g)
    fp32 = run(g.model(out), trt_major=8)
    assert [(layer.type, layer.name) for layer in fp32.layers[-3:]] == [("CaskConvolution", "fc"), ("NoOp", copy), ("NoOp", "reshape_after_fc")]
    assert ("fc-format-copy", "fc") in reasons(fp32, "copy") and any("[fc-format-copy]" in line for line in fp32.findings)
    fp16 = [layer.name for layer in run(g.model(out), trt_major=8, precision="fp16").layers]
    assert fp16[-3:] == [copy, "reshape_after_fc", "Reformatting CopyNode for Output Tensor 0 to reshape_after_fc"]  # the FP32 output's last
    g = Graph()
    int8 = run(g.model(fc_head(g, quantized=True)), trt_major=8).layers
    assert int8[-2].onnx_nodes[-1] == "fc" and int8[-2].precision == "INT8" and int8[-1].name == "reshape_after_fc"  # INT8: no copy
    g = Graph()
    out = g.op("Gemm", [g.input("x", [1, 8]), g.weight("fc.weight", (4, 8)), g.weight("fc.bias", (4,))], "fc", transB=1)
    assert [layer.name for layer in run(g.model(out), trt_major=8).layers] == ["fc", "reshape_after_fc"]  # nothing vectorized before it


@covers("pointwise-fusion", "shuffle-layer")
def test_pointwise_ops_no_layer_takes_run_as_one_pointwise_layer_and_a_transpose_as_a_shuffle():
    g = Graph()
    x = image(g)
    act = g.op("Tanh", [g.op("Mul", [g.op("Sigmoid", [x], "sigmoid"), x], "mul")], "tanh")
    out = g.op("Transpose", [act], "transpose", perm=[0, 2, 3, 1])
    layers = run(g.model(out), trt_major=8).layers
    assert [(layer.type, layer.onnx_nodes) for layer in layers] == [("PointWise", ["sigmoid", "mul", "tanh"]), ("Shuffle", ["transpose"])]


@covers("io-reformat")
def test_a_weakly_typed_fp16_build_converts_fp32_inputs_and_outputs():
    g = Graph()
    out = g.op("Relu", [g.conv(image(g), "conv")], "relu")
    weak = run(g.model(out), trt_major=8, precision="fp16").layers
    assert [layer.name for layer in weak] == ["Reformatting CopyNode for Input Tensor 0 to conv + relu", "conv + relu",
                                              "Reformatting CopyNode for Output Tensor 0 to conv + relu"]
    assert [layer.name for layer in run(g.model(out), trt_major=8).layers] == ["conv + relu"]  # strongly typed FP32: none


# ---------------------------------------------------------------- Myelin regions


@covers("myelin-scope")
def test_trt10_runs_gemms_in_myelin_and_convolutions_outside():
    g = Graph()
    x = g.op("Flatten", [g.op("GlobalAveragePool", [g.op("Relu", [g.conv(image(g), "conv")], "relu")], "gap")], "flatten")
    out = g.op("Softmax", [g.matmul(x, "fc", size=8, out=4)], "softmax")
    prediction = run(g.model(out))
    assert prediction.myelin_regions == 1 and [layer.myelin for layer in prediction.layers].count(False) == 2
    assert ("myelin-scope", "gap") in reasons(prediction, "boundary")


def attention(g: Graph, x: str, layer: str, head: int = 64) -> str:
    """One encoder layer: QKV, attention, output GEMM, residual Add and LayerNormalization (one head of `head`)."""
    q, k, v = (g.matmul(x, f"{layer}.{n}", size=head) for n in "qkv")
    scores = g.op("Div", [g.op("MatMul", [q, g.op("Transpose", [k], f"{layer}.kt", perm=[0, 2, 1])], f"{layer}.scores"),
                          g.init(f"{layer}.sqrt", np.float32(8.0))], f"{layer}.scale")
    probs = g.op("Softmax", [scores], f"{layer}.softmax", axis=-1)
    context = g.op("MatMul", [probs, v], f"{layer}.context")
    residual = g.op("Add", [g.matmul(context, f"{layer}.out", size=head), x], f"{layer}.residual")
    return g.op("LayerNormalization", [residual, g.weight(f"{layer}.ln.w", (head,)), g.weight(f"{layer}.ln.b", (head,))], f"{layer}.ln", axis=-1)


@covers("myelin-offload-8x")
def test_trt8_gives_myelin_a_network_with_attention_and_nothing_of_one_without():
    g = Graph()
    out = attention(g, tokens(g), "l0")
    layers = run(g.model(out), trt_major=8).layers
    assert len(layers) == 1 and layers[0].type == "Myelin" and layers[0].name == "{ForeignNode[l0.q...l0.ln]}"
    g = Graph()
    out = g.op("LayerNormalization", [g.matmul(tokens(g), "fc"), g.weight("w", (64,)), g.weight("b", (64,))], "ln", axis=-1)
    assert not any(layer.myelin for layer in run(g.model(out), trt_major=8).layers)


@covers("kernel-attention", "kernel-gemm-horizontal", "kernel-gemm-epilogue", "kernel-reduction-prologue")
def test_trt10_cuts_an_encoder_layer_into_its_kernels():
    g = Graph()
    out = attention(g, tokens(g), "l0")
    kernels = layer_nodes(run(g.model(out)))
    assert kernels == [["l0.q", "l0.q_bias", "l0.k", "l0.k_bias", "l0.v", "l0.v_bias", "l0.kt"],
                       ["l0.scores", "l0.scale", "l0.softmax", "l0.context"], ["l0.out", "l0.out_bias"], ["l0.residual", "l0.ln"]]


def test_a_gemm_epilogue_takes_its_activation_and_is_a_fusion_kernel():
    g = Graph()
    h = g.op("Gelu", [g.matmul(tokens(g), "fc1")], "gelu")
    out = g.matmul(h, "fc2")
    layers = run(g.model(out)).layers
    assert [(layer.type, [n for n in layer.onnx_nodes]) for layer in layers] == [("fusion", ["fc1", "fc1_bias", "gelu"]), ("gemm", ["fc2", "fc2_bias"])]


@covers("kernel-softmax", "kernel-index-cast")
def test_a_softmax_outside_attention_runs_in_two_passes_the_second_with_its_argmax_then_a_cast():
    g = Graph()
    logits = g.op("Gemm", [g.input("x", [1, 32]), g.weight("w", (32, 10)), g.weight("b", (10,))], "linear")
    out = g.op("ArgMax", [g.op("Softmax", [logits], "softmax", axis=1)], "argmax", axis=1)
    kernels = [layer.onnx_nodes for layer in run(g.model(logits, out)).layers]
    assert kernels == [["linear"], ["softmax", "linear"], ["softmax", "argmax"], []]  # the Gemm's bias is added in the softmax's first pass


def test_a_softmax_read_through_data_movement_that_splits_and_joins_again_finds_its_argmax_once():
    """Readers are looked for through data movement once per node: each Concat(t, t) doubles the paths to the ArgMax,
    and walking every path found it 2^12 times here (bailing_hybrid's graph never finished predicting)."""
    g = Graph()
    probabilities = g.op("Softmax", [g.op("Gemm", [g.input("x", [1, 32]), g.weight("w", (32, 10)), g.weight("b", (10,))], "linear")], "softmax", axis=1)
    for i in range(12):
        probabilities = g.op("Concat", [probabilities, probabilities], f"twice_{i}", axis=1)
    out = g.op("ArgMax", [probabilities], "argmax", axis=1)
    kernels = layer_nodes(run(g.model(out)))
    assert any("softmax" in kernel and "argmax" in kernel for kernel in kernels)


@covers("kernel-pointwise")
def test_pointwise_ops_no_anchor_takes_run_as_one_kernel():
    g = Graph()
    mask = g.op("Mul", [g.op("Cast", [g.op("Not", [g.input("m", [1, 1, 16], 9)], "not")], "cast", to=1), g.init("big", np.float32(-1e4))], "mask")
    x = tokens(g)
    out = g.op("Softmax", [g.op("Add", [g.matmul(x, "fc"), mask], "masked")], "softmax", axis=-1)
    kernels = layer_nodes(run(g.model(out)))
    assert ["not", "cast", "mask"] in kernels


@covers("myelin-convex", "qdq-after-gemm")
def test_a_qdq_between_a_gemm_and_its_residual_add_runs_standalone_and_cuts_the_region():
    g = Graph()
    x = tokens(g)
    y = g.qdq(g.matmul(g.qdq(x, name="in"), "fc", quantized=True), name="fc_out")
    out = g.op("LayerNormalization", [g.op("Add", [y, x], "residual"), g.weight("w", (64,)), g.weight("b", (64,))], "ln", axis=-1)
    prediction = run(g.model(out))
    assert prediction.myelin_regions == 2 and prediction.breakdown.qdq_layers == ["in_Q", "fc_out_DQ"]  # and the input's Q
    assert ("qdq-after-gemm", "residual") in reasons(prediction, "standalone") and ("qdq-after-gemm", "residual") in reasons(prediction, "cut")


# ---------------------------------------------------------------- Q/DQ


def quantized_cnn(residual_quantized: bool, output_quantized: bool) -> Graph:
    g = Graph()
    x = g.op("Relu", [g.conv(g.qdq(image(g), name="input"), "stem", quantized=True)], "stem_relu")
    branch = g.op("Relu", [g.conv(g.qdq(x, name="x"), "conv1", quantized=True)], "relu1")
    skip = g.qdq(x, name="x") if residual_quantized else x
    block = g.op("Relu", [g.op("Add", [g.conv(g.qdq(branch, name="b"), "conv2", quantized=True), skip], "add")], "relu2")
    if output_quantized:
        block = g.qdq(block, name="block")
    g.output = g.op("GlobalAveragePool", [block], "gap")
    return g


@covers("qdq-network-input", "residual-skip-not-quantized", "q-beside-float-reader")
def test_qat_without_residual_quantization_leaves_the_qs_beside_a_float_reader_standalone():
    g = quantized_cnn(residual_quantized=False, output_quantized=False)
    prediction = run(g.model(g.output), trt_major=8)
    assert prediction.breakdown.qdq_layers == ["input_Q", "x_Q"]
    assert reasons(prediction, "standalone") == {("qdq-network-input", "x"), ("residual-skip-not-quantized", "add")}
    g = Graph()
    y = g.op("Relu", [g.conv(image(g), "conv")], "relu")
    out = g.op("Add", [g.conv(g.qdq(y, name="y"), "conv2", quantized=True), g.op("Sigmoid", [y], "sigmoid")], "add")
    assert ("q-beside-float-reader", "sigmoid") in reasons(run(g.model(out), trt_major=8), "standalone")


@covers("residual-dq-float-output", "q-after-float-op")
def test_a_quantized_residual_into_a_float_output_block_and_a_q_after_a_float_pooling_run_standalone():
    g = quantized_cnn(residual_quantized=True, output_quantized=False)
    pooled = g.op("Flatten", [g.output], "flatten")
    out = g.op("Gemm", [g.qdq(pooled, name="pooled"), g.weight("fc.weight", (4, 8))], "fc", transB=1)
    prediction = run(g.model(out), trt_major=8)
    assert prediction.breakdown.qdq_layers == ["input_Q", "x_DQ", "pooled_Q"]
    assert reasons(prediction, "standalone") == {("qdq-network-input", "x"), ("residual-dq-float-output", "gap"), ("q-after-float-op", "gap")}
    g = quantized_cnn(residual_quantized=True, output_quantized=True)
    assert run(g.model(g.output), trt_major=8).breakdown.qdq_layers == ["input_Q", "block_DQ"]  # the pooling reads a DQ and writes float


@covers("qdq-into-float-region")
def test_a_dq_feeding_a_layernormalization_runs_standalone():
    g = Graph()
    x = g.qdq(g.matmul(tokens(g), "fc"), name="fc_out")
    out = g.op("LayerNormalization", [x, g.weight("w", (64,)), g.weight("b", (64,))], "ln", axis=-1)
    assert reasons(run(g.model(out)), "standalone") == {("qdq-into-float-region", "ln")}


def test_an_fp8_engine_whose_qdq_runs_standalone_is_an_fp8_engine():
    """A standalone Q/DQ made the whole engine "INT8" (any Q/DQ layer meant INT8): diff named an FP8 build's prediction INT8."""
    from onnx import TensorProto, helper

    g = Graph()
    g.initializers.append(helper.make_tensor("zero", TensorProto.FLOAT8E4M3FN, [], [0]))

    def fp8(tensor: str, name: str, scale: str) -> str:
        return g.op("DequantizeLinear", [g.op("QuantizeLinear", [tensor, scale, "zero"], f"{name}_Q"), scale, "zero"], f"{name}_DQ")

    weight = fp8(g.weight("fc.weight", (64, 64)), "fc_w", g.init("w_scale", np.float32(0.02)))
    gemm = g.op("MatMul", [fp8(tokens(g), "x", g.init("x_scale", np.float32(0.05))), weight], "fc")
    out = g.op("LayerNormalization", [fp8(gemm, "fc_out", g.init("y_scale", np.float32(0.05))), g.weight("w", (64,)), g.weight("b", (64,))],
               "ln", axis=-1)
    prediction = run(g.model(out, opset=19))
    assert ("qdq-into-float-region", "ln") in reasons(prediction, "standalone") and prediction.summary.precision == "FP8"


@covers("attention-not-fusable")
def test_quantized_attention_needs_a_head_size_fused_int8_attention_takes():
    def model(head: int):
        g = Graph()
        x = tokens(g, head)
        q, k = g.qdq(g.matmul(x, "q", size=head), name="q"), g.qdq(g.matmul(x, "k", size=head), name="k")
        scores = g.op("MatMul", [q, g.op("Transpose", [k], "kt", perm=[0, 2, 1])], "scores")
        return g.model(g.op("Softmax", [scores], "softmax", axis=-1))

    assert not reasons(run(model(64)), "standalone")
    assert reasons(run(model(128)), "standalone") == {("attention-not-fusable", "scores")}


@covers("qdq-not-absorbed")
def test_a_dq_no_neighbour_takes_runs_standalone():
    g = Graph()
    relu = g.op("Relu", [g.conv(g.qdq(image(g), name="input"), "conv", quantized=True)], "relu")
    out = g.op("Exp", [g.qdq(relu, name="relu")], "exp")
    prediction = run(g.model(out), trt_major=8)
    assert reasons(prediction, "standalone") == {("qdq-network-input", "x"), ("qdq-not-absorbed", "exp")}
    assert prediction.breakdown.qdq_layers == ["input_Q", "relu_DQ"]  # the Q after the INT8 convolution fuses into it


@covers("weight-without-dq", "conv-weight-only", "concat-unequal-scales")
def test_layers_left_in_float_by_their_weights_or_their_scales():
    g = Graph()
    x = image(g)
    weight_only = g.conv(x, "weight_only", quantized=True)
    float_weight = g.conv(g.qdq(x, name="x"), "float_weight")
    out = g.op("Concat", [g.qdq(weight_only, 0.1, "a"), g.qdq(float_weight, 0.2, "b")], "concat", axis=1)
    found = reasons(run(g.model(out), trt_major=8))
    assert {("conv-weight-only", "weight_only"), ("weight-without-dq", "float_weight"), ("concat-unequal-scales", "concat")} <= found


@covers("int4-activation", "int4-not-gemm")
def test_int4_is_weight_only_and_for_gemms():
    from onnx import TensorProto, numpy_helper

    g = Graph()
    x = tokens(g)
    four = numpy_helper.from_array(np.zeros(1, np.int8), "zero4")
    four.data_type, four.raw_data = TensorProto.INT4, b"\x00"
    g.initializers.append(four)
    q = g.op("QuantizeLinear", [x, g.init("s4", np.float32(0.1)), "zero4"], "act_q4")
    weight4 = numpy_helper.from_array(np.zeros(1, np.int8), "w4")
    weight4.data_type, weight4.raw_data = TensorProto.INT4, b"\x00"
    g.initializers.append(weight4)
    w = g.op("DequantizeLinear", ["w4", g.init("ws4", np.float32(0.1))], "w_dq4")
    out = g.op("Add", [g.op("DequantizeLinear", [q, "s4", "zero4"], "act_dq4"), w], "add")
    found = reasons(run(g.model(out), rules=None))
    assert {("int4-activation", "act_q4"), ("int4-not-gemm", "add")} <= found


def test_identical_qs_on_one_tensor_are_one():
    g = Graph()
    x = image(g)
    a, b = g.conv(g.qdq(x, name="x1"), "a", quantized=True), g.conv(g.qdq(x, name="x2"), "b", quantized=True)
    prediction = run(g.model(a, b), trt_major=8)
    assert prediction.breakdown.qdq_layers == ["x1_Q"] and [layer.onnx_nodes for layer in prediction.layers][0] == ["x1_Q", "x2_Q"]


def test_every_rule_has_a_minimal_graph_test():
    assert set(RULES) | set(FUSION_RULES) == TESTED


@pytest.mark.parametrize("rule_id", sorted(set(RULES) | set(FUSION_RULES)))
def test_every_rule_names_its_behaviour_source_and_fix(rule_id):
    from trt.predict.rules import rule

    found = rule(rule_id)
    assert found.behaviour and found.source and found.fix


def test_the_docs_name_every_rule():
    from conftest import REPO

    text = (REPO / "docs" / "predict.md").read_text()
    assert [rule_id for rule_id in sorted(set(RULES) | set(FUSION_RULES)) if f"`{rule_id}`" not in text] == []


def test_a_weight_only_model_is_predicted_in_its_float_type_with_its_quantized_weights_named():
    """ModelOpt's INT4 AWQ model: each MatMul weight an INT4 initializer behind a block DequantizeLinear, no activation
    quantized. It was predicted a plain FP32 engine; TensorRT keeps those weights in INT4 (weight-only quantization)."""
    from onnx import TensorProto, helper

    g = Graph()
    x = tokens(g)
    g.initializers.append(helper.make_tensor("fc.weight_i4", TensorProto.INT4, (64, 64), g.rng.integers(-8, 8, 64 * 64)))
    weight = g.op("DequantizeLinear", ["fc.weight_i4", g.init("fc.scale", np.full((1, 64), 0.01, np.float32))], "fc_wDQ", axis=0, block_size=64)
    prediction = run(g.model(g.op("MatMul", [x, weight], "fc"), opset=21))
    assert prediction.target.weight_only == ("INT4", 1)
    assert prediction.verdict.startswith("predicted FP32 engine with INT4 weights (1 GEMM, dequantizing its weight inside its kernel): ")
    import json

    from trt.parsers.prediction import parse
    from trt.render import render

    read_back = parse("p.json", json.loads(render(prediction, "json")))  # what `report predicted.json` reads: it says so too
    assert "a weight-only model: INT4 weights (1 GEMM, dequantizing its weight inside its kernel)" in read_back.notes
    g = Graph()  # activations quantized too: an INT8 engine, not a weight-only one
    prediction = run(g.model(g.matmul(g.qdq(tokens(g)), "fc", bias=False, quantized=True)))
    assert prediction.target.weight_only is None and prediction.verdict.startswith("predicted INT8 engine: ")
