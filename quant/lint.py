"""Q/DQ lint: placements in any Q/DQ ONNX that TensorRT's rules say prevent a fusion.

Rules ("Explicit Quantization" in NVIDIA's TensorRT developer guide; TensorRT issue 4397):
- qdq-after-gemm: a Q/DQ between a GEMM/Conv (or its bias Add) and the bias Add, activation
  or residual Add that would otherwise fuse into it;
- residual-skip-not-quantized: a residual Add fed by a quantized GEMM whose other (skip)
  input is not quantized, so the Add cannot fuse into the GEMM in INT8 (an Add feeding a
  Softmax adds an attention mask to the scores: no residual);
- qdq-into-float-region: a Q/DQ feeding LayerNormalization or Softmax, whose internals run
  in float inside the fused region;
- attention-not-fusable: Q/DQ on attention MatMuls where fused INT8 attention is impossible
  (head size not in 16/32/64, or sequence > 512; a dynamic sequence counts only when its
  maximum is given, as the build stage does from the profile);
- weight-without-dq: a quantized GEMM/Conv whose weight is a float initializer with no
  DequantizeLinear between it and the layer;
- concat-unequal-scales: a Concat of dequantized inputs with different scales (TensorRT
  must requantize instead of fusing the Concat away).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from quant.presets import (
    ACTIVATION_OPS,
    FLOAT_REGION_OPS,
    FUSED_ATTENTION_HEAD_SIZES,
    FUSED_ATTENTION_MAX_SEQUENCE,
    GEMM_OPS,
    attention_mask_adds,
    attention_shapes,
)

RULES = ("qdq-after-gemm", "residual-skip-not-quantized", "qdq-into-float-region", "attention-not-fusable", "weight-without-dq", "concat-unequal-scales")


@dataclass(frozen=True)
class Finding:
    rule: str
    nodes: list[str]
    message: str
    suggestion: str


class _Graph:
    def __init__(self, model):
        self.model = model
        self.nodes = list(model.graph.node)
        self.producer = {o: n for n in self.nodes for o in n.output}
        self.consumers: dict[str, list] = {}
        for node in self.nodes:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.initializers = {i.name: i for i in model.graph.initializer}

    def op(self, tensor: str) -> str | None:
        node = self.producer.get(tensor)
        return node.op_type if node is not None else None

    def quantized_activation(self, tensor: str):
        """(Q, DQ) when `tensor` is DQ(Q(x)), else None."""
        dq = self.producer.get(tensor)
        if dq is None or dq.op_type != "DequantizeLinear":
            return None
        q = self.producer.get(dq.input[0])
        return (q, dq) if q is not None and q.op_type == "QuantizeLinear" else None

    def gemm_behind(self, tensor: str):
        """The GEMM/Conv whose output `tensor` is, directly or after its bias Add."""
        node = self.producer.get(tensor)
        if node is not None and node.op_type == "Add":
            node = next((self.producer[i] for i in node.input if self.op(i) in GEMM_OPS), None)
        return node if node is not None and node.op_type in GEMM_OPS else None

    def constant(self, tensor: str) -> np.ndarray | None:
        if tensor in self.initializers:
            from onnx import numpy_helper

            return numpy_helper.to_array(self.initializers[tensor])
        node = self.producer.get(tensor)
        if node is not None and node.op_type == "Constant":
            from onnx import numpy_helper

            return numpy_helper.to_array(node.attribute[0].t)
        return None


def lint_model(model, max_sequence: int | None = None) -> list[Finding]:
    graph = _Graph(model)
    findings: list[Finding] = []
    for check in (_qdq_after_gemm, _residual_skip, _float_region, _weights, _concat_scales):
        findings += check(graph)
    findings += _attention(graph, model, max_sequence)
    return findings


def lint_file(path: Path, max_sequence: int | None = None) -> list[Finding]:
    from pipeline.core.onnxfile import load_onnx

    return lint_model(load_onnx(path, weights=True), max_sequence)


def _qdq_after_gemm(g: _Graph) -> list[Finding]:
    out = []
    for node in g.nodes:
        if node.op_type not in ("Add", *ACTIVATION_OPS):
            continue
        for tensor in node.input:
            pair = g.quantized_activation(tensor)
            gemm = g.gemm_behind(pair[0].input[0]) if pair else None
            if gemm is not None:
                q, dq = pair
                out.append(Finding(
                    "qdq-after-gemm", [gemm.name, q.name, dq.name, node.name],
                    f"{q.name}/{dq.name} quantize the output of {gemm.op_type} {gemm.name} before {node.op_type} {node.name}, which would fuse into it",
                    "remove this Q/DQ pair (TensorRT quantizes GEMM inputs, not outputs; preset trt-fusion does this)",
                ))
    return out


def _residual_skip(g: _Graph) -> list[Finding]:
    out = []
    masks = set(attention_mask_adds(g.model))
    for node in g.nodes:
        if node.op_type != "Add" or len(node.input) != 2 or any(g.constant(i) is not None for i in node.input) or node.name in masks:
            continue
        for side in (0, 1):
            gemm_tensor, skip = node.input[side], node.input[1 - side]
            pair = g.quantized_activation(gemm_tensor)
            gemm = g.gemm_behind(pair[0].input[0] if pair else gemm_tensor)
            if gemm is None or g.gemm_behind(skip) is not None:
                continue
            if not any(g.quantized_activation(i) for i in gemm.input):
                continue  # the GEMM itself runs in float
            if g.quantized_activation(skip) is None:
                out.append(Finding(
                    "residual-skip-not-quantized", [gemm.name, node.name, skip],
                    f"residual Add {node.name} adds the quantized {gemm.op_type} {gemm.name} to an unquantized skip input {skip}",
                    "add a Q/DQ on the skip input so the Add fuses into the GEMM in INT8",
                ))
    return out


def _float_region(g: _Graph) -> list[Finding]:
    out = []
    for node in g.nodes:
        if node.op_type not in FLOAT_REGION_OPS:
            continue
        pair = g.quantized_activation(node.input[0])
        if pair:
            q, dq = pair
            out.append(Finding(
                "qdq-into-float-region", [q.name, dq.name, node.name],
                f"{q.name}/{dq.name} quantize the input of {node.op_type} {node.name}, which runs in float inside the fused region",
                "remove this Q/DQ pair; quantize the GEMM inputs after the region instead",
            ))
    return out


def _weights(g: _Graph) -> list[Finding]:
    out = []
    for node in g.nodes:
        if node.op_type not in GEMM_OPS or len(node.input) < 2:
            continue
        if not g.quantized_activation(node.input[0]):
            continue
        weight = node.input[1]
        if g.constant(weight) is not None:
            out.append(Finding(
                "weight-without-dq", [node.name, weight],
                f"{node.op_type} {node.name} has a quantized input but its weight {weight} reaches it as a float constant",
                "quantize the weight with a DequantizeLinear between the initializer and the layer",
            ))
    return out


def _concat_scales(g: _Graph) -> list[Finding]:
    out = []
    for node in g.nodes:
        if node.op_type != "Concat":
            continue
        scales = []
        for tensor in node.input:
            dq = g.producer.get(tensor)
            scale = g.constant(dq.input[1]) if dq is not None and dq.op_type == "DequantizeLinear" else None
            scales.append(None if scale is None else float(np.asarray(scale).reshape(-1)[0]))
        known = [s for s in scales if s is not None]
        if len(known) >= 2 and not np.allclose(known, known[0], rtol=1e-6):
            out.append(Finding(
                "concat-unequal-scales", [node.name],
                f"Concat {node.name} joins dequantized inputs with scales {known}",
                "give the inputs one shared scale (ModelOpt's concat_elimination pass) so TensorRT can drop the Concat",
            ))
    return out


def _attention(g: _Graph, model, max_sequence: int | None) -> list[Finding]:
    out = []
    for name, head, sequence in attention_shapes(model):
        matmul = next(n for n in g.nodes if n.name == name)
        if not any(g.quantized_activation(i) for i in matmul.input):
            continue
        seq = max_sequence or sequence
        if (head is None or head in FUSED_ATTENTION_HEAD_SIZES) and (seq is None or seq <= FUSED_ATTENTION_MAX_SEQUENCE):
            continue  # an unknown size (a dynamic sequence) is no violation: --max-sequence checks it
        out.append(Finding(
            "attention-not-fusable", [name],
            f"attention MatMul {name} is quantized but fused INT8 attention needs head size in {FUSED_ATTENTION_HEAD_SIZES} and sequence <= {FUSED_ATTENTION_MAX_SEQUENCE} (here head size {head}, sequence {seq})",
            "leave attention in float: ModelOpt disable_mha_qdq=True (preset trt-fusion does this)",
        ))
    return out


def findings_json(findings: list[Finding]) -> dict[str, Any]:
    from collections import Counter

    return {"count": len(findings), "by_rule": dict(Counter(f.rule for f in findings)), "findings": [asdict(f) for f in findings]}
