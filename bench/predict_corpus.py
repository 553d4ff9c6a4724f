"""The ONNX models behind the real engines of the fusion corpus (../shared/fusion-corpus/) and the BERT FP16
build log (../shared/fixtures/trt/), rebuilt here from their public recipes (our own code, written from
reading them), for bench/predict_score.py:

- ResNet-18 as NVIDIA's TREx example exported it (tools/experimental/trt-engine-explorer/examples/pytorch/
  resnet/: resnet_example.py, qat_model.py): torchvision's layout, opset 13, the old exporter's node names
  `<Op>_<n>` (numbered over every node, Constants too); `fp32` with BatchNorm folded into the convolutions;
  `qat` (pytorch-quantization's QuantConv2d/QuantLinear: per-tensor Q/DQ on each input, behind two Constants,
  per-channel on each weight, behind three, BatchNorm kept), `qat-residual` (each residual Add's identity input
  quantized too, a TensorQuantizer: four Constants, Q, DQ), `qat-residual-qgap` (and the pool's input).
  The graph is written directly with onnx.helper, in the order the exporter traced the modules; scales are
  one per tensor (two quantizers of one tensor calibrate to one scale).
- The cookbook's MNIST CNN (NVIDIA/trt-samples-for-hackathon-cn, cookbook/00-Data/get-model-part1.py),
  exported by torch's default (dynamo) exporter at opset 18: its names are the engine's (`node_conv2d`).
- Our bert-tiny profile exported with `--exporter torchscript` (`/encoder/layers.0/...`).
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np

RESNET_VARIANTS = ("fp32", "qat", "qat-residual", "qat-residual-qgap")


class ResNetWriter:
    """Writes the nodes of one ResNet-18 export in order, named as the old exporter named them."""

    def __init__(self, quantize: bool):
        self.quantize, self.nodes, self.initializers, self.count = quantize, [], [], 0
        self.rng = np.random.default_rng(0)

    def node(self, op: str, inputs: list[str], **attributes) -> str:
        from onnx import helper

        name = f"{op}_{self.count}"
        self.count += 1
        output = f"onnx::{name}_out" if op != "Constant" else f"{name}_value"
        self.nodes.append(helper.make_node(op, inputs, [output], name=name, **attributes))
        return output

    def constant(self, value: np.ndarray) -> str:
        from onnx import numpy_helper

        return self.node("Constant", [], value=numpy_helper.from_array(value))

    def weight(self, name: str, shape: tuple[int, ...]) -> str:
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array((self.rng.standard_normal(shape) * 0.05).astype(np.float32), name))
        return name

    def fake_quant(self, tensor: str, constants: int = 2) -> str:
        """Q/DQ of an activation, one scale per tensor: what calibrating one tensor twice gives."""
        scale = np.float32(0.01 + (zlib.crc32(tensor.encode()) % 1000) / 1e5)
        values = [self.constant(np.array(scale, np.float32)), self.constant(np.array(0, np.int8))]
        for _ in range(constants - 2):
            self.constant(np.array(0, np.int8))
        return self.node("DequantizeLinear", [self.node("QuantizeLinear", [tensor, *values]), *values])

    def weight_quant(self, weight: str, channels: int) -> str:
        scale, zero = self.constant(np.full(channels, 0.02, np.float32)), self.constant(np.zeros(channels, np.int8))
        self.constant(np.zeros(channels, np.int8))
        return self.node("DequantizeLinear", [self.node("QuantizeLinear", [weight, scale, zero], axis=0), scale, zero], axis=0)

    def conv(self, module: str, x: str, cin: int, cout: int, kernel: int, stride: int, pad: int, bn: str) -> str:
        weight = self.weight(f"{module}.weight", (cout, cin, kernel, kernel))
        attributes = {"kernel_shape": [kernel] * 2, "strides": [stride] * 2, "pads": [pad] * 4}
        if not self.quantize:  # eval export folds BatchNorm into the convolution's weight and bias
            return self.node("Conv", [x, weight, self.weight(f"{module}.bias", (cout,))], **attributes)
        x = self.fake_quant(x)
        out = self.node("Conv", [x, self.weight_quant(weight, cout)], **attributes)
        params = [self.weight(f"{bn}.{p}", (cout,)) for p in ("weight", "bias", "running_mean", "running_var")]
        return self.node("BatchNormalization", [out, *params])

    def block(self, prefix: str, x: str, cin: int, planes: int, stride: int, residual: bool) -> str:
        out = self.node("Relu", [self.conv(f"{prefix}.conv1", x, cin, planes, 3, stride, 1, f"{prefix}.bn1")])
        out = self.conv(f"{prefix}.conv2", out, planes, planes, 3, 1, 1, f"{prefix}.bn2")
        identity = x
        if stride != 1 or cin != planes:
            identity = self.conv(f"{prefix}.downsample.0", x, cin, planes, 1, stride, 0, f"{prefix}.downsample.1")
        if residual:
            identity = self.fake_quant(identity, constants=4)
        return self.node("Relu", [self.node("Add", [out, identity])])


def resnet18(variant: str):
    """ResNet-18 of the TREx example, `variant` one of RESNET_VARIANTS."""
    from onnx import TensorProto, helper

    w = ResNetWriter(quantize=variant != "fp32")
    x = w.node("Relu", [w.conv("conv1", "input.1", 3, 64, 7, 2, 3, "bn1")])
    x = w.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for layer, planes in enumerate((64, 128, 256, 512), 1):
        for index in range(2):
            x = w.block(f"layer{layer}.{index}", x, cin, planes, 2 if layer > 1 and index == 0 else 1, variant != "fp32" and variant != "qat")
            cin = planes
    if variant == "qat-residual-qgap":
        x = w.fake_quant(x, constants=4)
    x = w.node("Flatten", [w.node("GlobalAveragePool", [x])], axis=1)
    if w.quantize:
        x = w.fake_quant(x)
    weight = w.weight("fc.weight", (1000, 512))
    weight = w.weight_quant(weight, 1000) if w.quantize else weight
    out = w.node("Gemm", [x, weight, w.weight("fc.bias", (1000,))], alpha=1.0, beta=1.0, transB=1)
    graph = helper.make_graph(w.nodes, "resnet18", [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, ["batch_size", 3, 224, 224])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["batch_size", 1000])], w.initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="pytorch")


def mnist(folder: Path) -> Path:
    """The cookbook's MNIST CNN, exported as get-model-part1.py exports it (opset 18, torch's default exporter)."""
    import torch
    import torch.nn.functional as F

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = torch.nn.Conv2d(1, 32, (5, 5), padding=(2, 2), bias=True)
            self.conv2 = torch.nn.Conv2d(32, 64, (5, 5), padding=(2, 2), bias=True)
            self.gemm1 = torch.nn.Linear(64 * 7 * 7, 1024, bias=True)
            self.gemm2 = torch.nn.Linear(1024, 10, bias=True)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv1(x)), (2, 2))
            x = F.max_pool2d(F.relu(self.conv2(x)), (2, 2))
            x = x.reshape(-1, 64 * 7 * 7)
            x = F.relu(self.gemm1(x))
            y = self.gemm2(x)
            return y, torch.argmax(F.softmax(y, dim=1), dim=1)

    torch.manual_seed(97)
    path = folder / "mnist.onnx"
    torch.onnx.export(Net().eval(), (torch.randn(1, 1, 28, 28),), str(path), input_names=["x"], output_names=["y", "z"], opset_version=18,
                      dynamic_shapes=({0: torch.export.Dim("nBS", min=1, max=64)},), external_data=False, do_constant_folding=True)
    return path


def bert_tiny(folder: Path) -> Path:
    """Our bert-tiny profile exported with TorchScript names, as the BERT FP16 build log's engine names its nodes."""
    from pipeline.core.profiles import load_profile
    from pipeline.export import export_model

    path = folder / "bert-tiny.torchscript.onnx"
    export_model(load_profile("bert-tiny"), path, exporter="torchscript")
    return path
