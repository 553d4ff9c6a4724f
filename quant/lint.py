"""Q/DQ lint: placements in any Q/DQ ONNX (INT8, FP8, INT4) that TensorRT's rules say prevent a fusion.

Each rule is an entry of pipeline/core/qdq.py `RULES` (what TensorRT does, its source: "Explicit Quantization"
in NVIDIA's TensorRT developer guide, TensorRT issues 4397, 3861, 4039, 4366; the fix). Which ops fuse into a
GEMM/Conv and which run in float is the placement data of the model family's preset (`PlacementRules`): the
lint, the preset and the engine prediction (trt/predict/) read the same, so each finding is a standalone Q/DQ
layer or a cut Myelin region in `python -m pipeline predict`. An Add feeding a Softmax adds an attention mask
(no residual); a dynamic sequence counts only when its maximum is given, as the build stage does from the profile.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.attention import attention_scores
from pipeline.core.graph import INT4_TYPES
from pipeline.core.qdq import (
    CONV_OPS,
    FUSED_ATTENTION_HEAD_SIZES,
    FUSED_ATTENTION_MAX_SEQUENCE,
    GEMM_OPS,
    PlacementRules,
    QdqGraph,
)
from quant.presets import FAMILY_PRESET, PRESETS, model_family

INT4_CONSUMERS = ("MatMul", "Gemm", "Gather", "Transpose", "Reshape", "Cast")


@dataclass(frozen=True)
class Finding:
    rule: str
    nodes: list[str]
    message: str
    suggestion: str


def family_rules(model) -> PlacementRules:
    """The placement rules of the preset written for the model's family: what the lint checks by default, and what
    the engine prediction (trt/predict/) expects TensorRT to fuse."""
    return PRESETS[FAMILY_PRESET[model_family(model)]].rules


def lint_model(model, max_sequence: int | None = None, rules: PlacementRules | None = None) -> list[Finding]:
    """Findings under `rules` (default: the rules of the preset for the model's family)."""
    rules = rules or family_rules(model)
    graph = QdqGraph.of(model)
    findings: list[Finding] = []
    for check in (_qdq_after_gemm, _residual_skip, _float_region, _weights, _concat_scales, _conv_weight_only, _int4):
        findings += check(graph, rules)
    findings += _attention(graph, model, max_sequence)
    return findings


def lint_file(path: Path, max_sequence: int | None = None) -> list[Finding]:
    from pipeline.core.onnxfile import load_onnx

    return lint_model(load_onnx(path, weights=True), max_sequence)


def _fusion(gemm) -> str:
    return "Conv + BatchNorm + activation (+ residual Add)" if gemm.op_type in CONV_OPS else "GEMM + bias + activation / residual Add"


def _preset_hint(rules: PlacementRules) -> str:
    return next(name for name, p in PRESETS.items() if p.rules is rules and p.fusion_cleanup)


def _qdq_after_gemm(g: QdqGraph, rules: PlacementRules) -> Iterator[Finding]:
    for node in g.nodes:
        if node.op_type not in rules.epilogue_ops:
            continue
        for tensor in node.input:
            pair = g.quantized_activation(tensor)
            if pair is None or g.rejection(rules, pair[0].input[0], node, tensor) is None:
                continue
            gemm = g.gemm_behind(pair[0].input[0], rules.epilogue_ops, single_use=rules.residual_skip)
            q, dq = pair
            yield Finding(
                "qdq-after-gemm", [gemm.name, q.name, dq.name, node.name],
                f"{q.name}/{dq.name} quantize the output of {gemm.op_type} {gemm.name} before {node.op_type} {node.name}, which would fuse into it "
                f"(prevents the {_fusion(gemm)} fusion)",
                f"remove this Q/DQ pair (TensorRT quantizes GEMM/Conv inputs, not outputs; preset {_preset_hint(rules)} does this)",
            )


def _residual_skip(g: QdqGraph, rules: PlacementRules) -> Iterator[Finding]:
    for node, gemms, skip in g.float_skips(rules):
        if skip is None:
            yield Finding(
                "residual-skip-not-quantized", [gemms[0].name, gemms[1].name, node.name],
                f"residual Add {node.name} adds the float outputs of two quantized convolutions {gemms[0].name} and {gemms[1].name}: "
                f"it fuses into neither (prevents the {_fusion(gemms[0])} fusion)",
                f"quantize one of its inputs (a Q/DQ on {node.input[0]}) so the Add fuses into {gemms[1].name}; preset cnn does this",
            )
            continue
        gemm = gemms[0]
        yield Finding(
            "residual-skip-not-quantized", [gemm.name, node.name, skip],
            f"residual Add {node.name} adds the quantized {gemm.op_type} {gemm.name} to an unquantized skip input {skip} "
            f"(prevents the {_fusion(gemm)} fusion)",
            "add a Q/DQ on the skip input (the one its tensor already has for the next layer, if any) so the Add fuses into the "
            f"{gemm.op_type}; preset {_preset_hint(rules)} does this" if rules.residual_skip else
            f"add a Q/DQ on the skip input so the Add fuses into the {gemm.op_type} in INT8",
        )


def _float_region(g: QdqGraph, rules: PlacementRules) -> Iterator[Finding]:
    for node in g.nodes:
        if node.op_type not in rules.float_region_ops:
            continue
        pair = g.quantized_activation(node.input[0])
        if pair:
            q, dq = pair
            yield Finding(
                "qdq-into-float-region", [q.name, dq.name, node.name],
                f"{q.name}/{dq.name} quantize the input of {node.op_type} {node.name}, which runs in float inside the fused region",
                "remove this Q/DQ pair; quantize the GEMM inputs after the region instead",
            )


def _weights(g: QdqGraph, rules: PlacementRules) -> Iterator[Finding]:
    for node in g.nodes:
        if node.op_type not in GEMM_OPS or len(node.input) < 2 or not g.quantized_activation(node.input[0]):
            continue
        weight = node.input[1]
        if g.constant(weight) is not None:
            yield Finding(
                "weight-without-dq", [node.name, weight],
                f"{node.op_type} {node.name} has a quantized input but its weight {weight} reaches it as a float constant",
                "quantize the weight with a DequantizeLinear between the initializer and the layer",
            )


def _concat_scales(g: QdqGraph, rules: PlacementRules) -> Iterator[Finding]:
    for node in g.nodes:
        if node.op_type != "Concat":
            continue
        scales = []
        for tensor in node.input:
            pair = g.dequantized_through(tensor)
            scale = g.constant(pair[1].input[1]) if pair else None
            scales.append(None if scale is None else float(np.asarray(scale).reshape(-1)[0]))
        known = [s for s in scales if s is not None]
        if len(known) >= 2 and not np.allclose(known, known[0], rtol=1e-6):
            yield Finding(
                "concat-unequal-scales", [node.name],
                f"Concat {node.name} joins dequantized inputs with scales {known}: TensorRT requantizes each input "
                "instead of writing the producers' outputs into one buffer (prevents the Concat elimination)",
                "give the inputs one shared scale (the largest; preset cnn does this, as ModelOpt's concat_elimination pass aims to)",
            )


def _conv_weight_only(g: QdqGraph, rules: PlacementRules) -> Iterator[Finding]:
    for node in g.nodes:
        if node.op_type not in CONV_OPS or len(node.input) < 2 or g.op(node.input[1]) != "DequantizeLinear":
            continue
        if g.quantized_activation(node.input[0]) is None:
            yield Finding(
                "conv-weight-only", [node.name, node.input[0]],
                f"{node.op_type} {node.name} has a dequantized weight but a float input {node.input[0]}: TensorRT has no weight-only "
                "convolution, so it runs the Conv in float (prevents the quantized Conv kernel and its fusions)",
                f"add a Q/DQ on input {node.input[0]} (the Conv's activation), or leave its weight in float",
            )


def _int4(g: QdqGraph, rules: PlacementRules) -> Iterator[Finding]:
    import onnx

    for node in g.nodes:
        if node.op_type == "QuantizeLinear" and len(node.input) > 2 and g.initializer_type(node.input[2]) in INT4_TYPES and g.constant(node.input[0]) is None:
            yield Finding(
                "int4-activation", [node.name, node.input[0]],
                f"{node.name} quantizes the computed tensor {node.input[0]} to INT4: TensorRT's INT4 is weight-only (prevents building the engine)",
                "quantize only weights to INT4 (ModelOpt quantize_mode='int4'); use INT8 or FP8 Q/DQ for activations",
            )
        if node.op_type == "DequantizeLinear" and g.initializer_type(node.input[0]) in INT4_TYPES:
            for consumer in g.consumers(node.output[0]):
                if consumer.op_type not in INT4_CONSUMERS:
                    yield Finding(
                        "int4-not-gemm", [node.name, consumer.name],
                        f"INT4 weight {node.input[0]} feeds {consumer.op_type} {consumer.name}: TensorRT's INT4 weight-only "
                        f"quantization is for MatMul/Gemm ({onnx.TensorProto.DataType.Name(g.initializer_type(node.input[0]))} weights elsewhere are not fused)",
                        "quantize this weight to INT8/FP8 with its input, or leave it in float (ModelOpt int4 quantizes MatMul/Gemm only)",
                    )


def _attention(g: QdqGraph, model, max_sequence: int | None) -> Iterator[Finding]:
    for matmul, head, sequence in attention_scores(model, g):
        if not any(g.quantized_activation(i) for i in matmul.input):
            continue
        seq = max_sequence or sequence
        if (head is None or head in FUSED_ATTENTION_HEAD_SIZES) and (seq is None or seq <= FUSED_ATTENTION_MAX_SEQUENCE):
            continue  # an unknown size (a dynamic sequence) is no violation: --max-sequence checks it
        yield Finding(
            "attention-not-fusable", [matmul.name],
            f"attention MatMul {matmul.name} is quantized but fused INT8 attention needs head size in {FUSED_ATTENTION_HEAD_SIZES} and sequence <= {FUSED_ATTENTION_MAX_SEQUENCE} (here head size {head}, sequence {seq})",
            "leave attention in float: ModelOpt disable_mha_qdq=True (preset trt-fusion does this)",
        )


def findings_json(findings: list[Finding]) -> dict[str, Any]:
    from collections import Counter

    return {"count": len(findings), "by_rule": dict(Counter(f.rule for f in findings)), "findings": [asdict(f) for f in findings]}
