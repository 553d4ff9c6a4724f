"""Q/DQ lint for CNNs, FP8 and INT4: each rule fires on a graph built to break it, and finds nothing
on real models quantized with the matching preset (HF ResNet and ConvNeXt, a YOLO-style neck)."""

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from pipeline.core.profiles import load_profile
from pipeline.core.quiet import captured
from pipeline.export import export_model
from pipeline.optimize import optimize_file
from quant.int8 import quantize_int8
from quant.lint import lint_model
from quant.presets import CNN_RULES, model_family

F = TensorProto.FLOAT
CONVNEXT = """
name = "convnext-tiny-test"
[model]
task = "base"
seed = 0
[model.hf_config]
model_type = "convnext"
num_channels = 3
hidden_sizes = [16, 32]
depths = [1, 1]
num_stages = 2
patch_size = 4
[dims.batch]
min = 1
opt = 2
max = 4
[[inputs]]
name = "pixel_values"
dtype = "float32"
shape = ["batch", 3, 32, 32]
[export]
exporter = "dynamo"
opset = 20
"""


def rules(findings):
    return sorted(f.rule for f in findings)


def qdq(tensor, scale="s", zero="z"):
    return [helper.make_node("QuantizeLinear", [tensor, scale, zero], [f"{tensor}_q"], name=f"{tensor}_Q"),
            helper.make_node("DequantizeLinear", [f"{tensor}_q", scale, zero], [f"{tensor}_dq"], name=f"{tensor}_DQ")]


def conv_bn(name, x):
    """x -> Conv(weight via DQ) -> BatchNormalization: the Conv block TensorRT fuses."""
    return [helper.make_node("DequantizeLinear", ["w_int8", "ws"], [f"{name}_w"], name=f"{name}_wDQ"),
            helper.make_node("Conv", [x, f"{name}_w"], [f"{name}_out"], name=name, pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", [f"{name}_out", "g", "b", "m", "v"], [f"{name}_bn"], name=f"{name}_bn")]


def cnn_model(nodes, inputs=("x", "skip"), outputs=("y",)):
    inits = [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.int8(0), "z"),
             numpy_helper.from_array(np.float32(0.01), "ws"), numpy_helper.from_array(np.ones((4, 4, 3, 3), np.int8), "w_int8"),
             *(numpy_helper.from_array(np.full(4, v, np.float32), n) for n, v in (("g", 1), ("b", 0), ("m", 0), ("v", 1)))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F, [1, 4, 8, 8]) for n in inputs],
                              [helper.make_tensor_value_info(n, F, None) for n in outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_qdq_between_conv_batchnorm_and_residual_add():
    nodes = qdq("x") + conv_bn("conv", "x_dq") + qdq("conv_bn") + qdq("skip") + [helper.make_node("Add", ["conv_bn_dq", "skip_dq"], ["y"], name="res")]
    findings = lint_model(cnn_model(nodes))
    assert rules(findings) == ["qdq-after-gemm"] and findings[0].nodes == ["conv", "conv_bn_Q", "conv_bn_DQ", "res"]
    assert "Conv + BatchNorm" in findings[0].message
    fixed = qdq("x") + conv_bn("conv", "x_dq") + qdq("skip") + [helper.make_node("Add", ["conv_bn", "skip_dq"], ["y"], name="res")]
    assert lint_model(cnn_model(fixed)) == []


def test_qdq_between_conv_and_batchnorm():
    nodes = qdq("x") + conv_bn("conv", "x_dq")
    nodes[4] = helper.make_node("BatchNormalization", ["conv_out_dq", "g", "b", "m", "v"], ["y"], name="conv_bn")
    nodes[4:4] = qdq("conv_out")
    assert rules(lint_model(cnn_model(nodes, inputs=("x",)))) == ["qdq-after-gemm"]


def test_two_conv_residual_needs_one_quantized_input():
    both_float = qdq("x") + conv_bn("a", "x_dq") + conv_bn("b", "x_dq") + [helper.make_node("Add", ["a_bn", "b_bn"], ["y"], name="res")]
    findings = lint_model(cnn_model(both_float, inputs=("x",)))
    assert rules(findings) == ["residual-skip-not-quantized"] and findings[0].nodes == ["a", "b", "res"]
    one = qdq("x") + conv_bn("a", "x_dq") + conv_bn("b", "x_dq") + qdq("a_bn") + [helper.make_node("Add", ["a_bn_dq", "b_bn"], ["y"], name="res")]
    assert lint_model(cnn_model(one, inputs=("x",))) == []


def test_conv_weight_only():
    nodes = conv_bn("conv", "x")
    findings = lint_model(cnn_model(nodes, inputs=("x",), outputs=("conv_bn",)))
    assert rules(findings) == ["conv-weight-only"] and findings[0].nodes == ["conv", "x"]


def test_int4_activation_and_int4_weight_on_conv():
    int4_zero = numpy_helper.from_array(np.zeros((), dtype=np.int8), "z4")
    int4_zero.data_type = TensorProto.INT4
    w4 = helper.make_tensor("w4", TensorProto.INT4, [4, 4, 3, 3], np.ones(144, np.int8).tolist())
    nodes = qdq("x", zero="z4") + [helper.make_node("DequantizeLinear", ["w4", "ws"], ["w"], name="w4_DQ"),
                                   helper.make_node("Conv", ["x_dq", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])]
    model = cnn_model(nodes, inputs=("x",))
    model.graph.initializer.extend([int4_zero, w4])
    findings = lint_model(model)
    assert rules(findings) == ["int4-activation", "int4-not-gemm"]
    assert [f.nodes for f in findings if f.rule == "int4-not-gemm"] == [["w4_DQ", "conv"]]


def test_fp8_qdq_through_transpose_into_layernorm():
    """ModelOpt's FP8 attention places Q -> Transpose -> DQ: the lint sees through the Transpose."""
    zero = numpy_helper.from_array(np.zeros((), np.float32), "z8")
    zero.data_type, zero.raw_data = TensorProto.FLOAT8E4M3FN, b"\x00"
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z8"], ["xq"], name="x_Q"),
             helper.make_node("Transpose", ["xq"], ["xt"], name="t", perm=[0, 1, 3, 2]),
             helper.make_node("DequantizeLinear", ["xt", "s", "z8"], ["x_dq"], name="x_DQ"),
             helper.make_node("LayerNormalization", ["x_dq", "g", "b"], ["y"], name="ln")]
    model = cnn_model(nodes, inputs=("x",))
    model.graph.initializer.append(zero)
    assert [(f.rule, f.nodes) for f in lint_model(model)] == [("qdq-into-float-region", ["x_Q", "x_DQ", "ln"])]


# ---- real models, quantized with ModelOpt's placement and with the CNN preset ----

class ResidualNeck(nn.Module):
    """YOLO-style: Conv+BN+SiLU stem, a residual bottleneck, a stride-2 branch brought back by nearest
    Upsample and concatenated with the residual output, then a 1x1 Conv head."""

    def __init__(self):
        super().__init__()

        def cbs(i, o, k=3, s=1):
            return nn.Sequential(nn.Conv2d(i, o, k, s, k // 2, bias=False), nn.BatchNorm2d(o), nn.SiLU())

        self.stem, self.b1, self.down, self.fuse = cbs(3, 16, 3, 2), cbs(16, 16), cbs(16, 32, 3, 2), cbs(48, 16, 1)
        self.b2 = nn.Sequential(nn.Conv2d(16, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16))
        self.up, self.head = nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(16, 8, 1)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(self.b2(self.b1(x)) + x)
        return self.head(self.fuse(torch.cat([self.up(self.down(x)), x], dim=1)))


def _quantize(source: Path, preset: str, name: str, calibration) -> onnx.ModelProto:
    target = source.with_name(f"{name}.{preset}.onnx")
    with captured():
        quantize_int8(source, target, calibration, 1, preset, "fp32", "max")
    return onnx.load(str(target))


@pytest.fixture(scope="module")
def cnns(tmp_path_factory):
    """{name: (optimized FP32 path, calibration)} for HF ResNet, HF ConvNeXt and the neck."""
    folder = tmp_path_factory.mktemp("cnn")
    images = {"pixel_values": np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype(np.float32)}
    found = {}
    for name, profile in (("resnet", load_profile("hf-resnet-tiny")), ("convnext", load_profile(str(_write(folder, CONVNEXT))))):
        export_model(profile, folder / f"{name}.onnx")
        optimize_file(folder / f"{name}.onnx", folder / f"{name}.opt.onnx")
        found[name] = (folder / f"{name}.opt.onnx", images)
    torch.manual_seed(0)
    with captured():
        torch.onnx.export(ResidualNeck().eval(), (torch.randn(1, 3, 32, 32),), str(folder / "neck.onnx"), input_names=["x"], dynamo=False, opset_version=17)
    found["neck"] = (folder / "neck.onnx", {"x": images["pixel_values"]})
    return found


def _write(folder: Path, text: str) -> Path:
    (folder / "convnext.toml").write_text(text, encoding="utf-8")
    return folder / "convnext.toml"


@pytest.mark.parametrize("name", ["resnet", "convnext", "neck"])
def test_cnn_preset_leaves_nothing_to_lint(cnns, name):
    source, calibration = cnns[name]
    assert model_family(onnx.load(str(source), load_external_data=False)) == "cnn"
    assert lint_model(_quantize(source, "cnn", name, calibration)) == []


def test_modelopt_placement_on_resnet_breaks_the_residual_fusion_where_castlikes_remain(cnns):
    """The dynamo export of HF ResNet holds CastLike + Expand chains; optimized without castlike-to-cast
    they stay, and ModelOpt then quantizes the Conv side of the first residual Add and leaves the skip
    float: both rules fire. With every rule (the stage's optimize) ModelOpt's own placement is clean."""
    source, calibration = cnns["resnet"]
    with_castlikes = source.with_name("resnet.castlikes.opt.onnx")
    optimize_file(source.with_name("resnet.onnx"), with_castlikes, skip=["castlike-to-cast"])
    assert any(n.op_type == "CastLike" for n in onnx.load(str(with_castlikes)).graph.node)
    findings = lint_model(_quantize(with_castlikes, "modelopt", "resnet-castlikes", calibration))
    assert rules(findings) == ["qdq-after-gemm", "residual-skip-not-quantized"]
    assert {f.nodes[-1] for f in findings if f.rule == "qdq-after-gemm"} == {f.nodes[1] for f in findings if f.rule == "residual-skip-not-quantized"}
    assert lint_model(_quantize(source, "modelopt", "resnet", calibration)) == []


def test_misplaced_residual_add_and_unshared_concat_scales_on_the_neck(cnns):
    """The neck quantized with the CNN preset, then broken by hand: the residual Add reads its skip in
    float again, and one Concat input gets its own scale. The lint names both; the preset's file is clean."""
    source, calibration = cnns["neck"]
    model = _quantize(source, "cnn", "neck", calibration)
    add = next(n for n in model.graph.node if n.op_type == "Add" and any("DequantizeLinear" in i for i in n.input))
    skip = next(i for i in add.input if "DequantizeLinear" in i)
    q = next(n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == skip)
    add.input[list(add.input).index(skip)] = next(n.input[0] for n in model.graph.node if n.output[0] == q.input[0])
    concat = next(n for n in model.graph.node if n.op_type == "Concat")
    dq = next(n for n in model.graph.node if n.output[0] in concat.input and n.op_type == "DequantizeLinear")
    model.graph.initializer.append(numpy_helper.from_array(np.float32(0.5), "another_scale"))
    dq.input[1] = "another_scale"
    assert rules(lint_model(model)) == ["concat-unequal-scales", "residual-skip-not-quantized"]


def test_cnn_rules_are_the_lints_rules_for_a_cnn(cnns):
    """The lint reads the preset's data: CNN rules make BatchNormalization part of a Conv's fusion."""
    assert "BatchNormalization" in CNN_RULES.epilogue_ops
