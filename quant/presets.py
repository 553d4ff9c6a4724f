"""INT8 placement presets: where Q/DQ go, and why.

- `modelopt`: ModelOpt's default placement, unchanged. On BERT it quantizes both inputs of
  every residual Add (also the GEMM-output side), which TensorRT's rules say blocks the
  GEMM + bias + residual fusion; it is the placement behind "INT8 BERT splits into dozens of
  layers" (TensorRT issue 4397, Model-Optimizer issue 159).
- `trt-fusion` (default): the placement TensorRT's "Explicit Quantization" rules ask for.
  Quantize the inputs of weighted ops (MatMul/Gemm/Conv) and the residual *skip* input of an
  Add, never a GEMM/Conv output before its bias, activation or residual Add (so they fuse
  into the GEMM), never the input of LayerNormalization or Softmax (their internals run in
  float inside the fused region); attention MatMuls get Q/DQ only when fused INT8 attention
  is possible (head size 16/32/64 and sequence <= 512, "Explicit Quantization" / "Fused
  Attention"), else `disable_mha_qdq`. The attention-mask Add before Softmax is never
  quantized: it runs inside the fused attention, and a Hugging Face mask holds the float
  minimum (or -inf) where tokens are padding, which no INT8 scale can represent (ModelOpt's
  entropy calibration fails on it: "Too many bins for data range").
- `gemm-only`: only MatMul/Gemm inputs (ModelOpt `op_types_to_quantize`), attention as in
  trt-fusion: the smallest placement, for when accuracy matters more than speed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FUSED_ATTENTION_HEAD_SIZES = (16, 32, 64)
FUSED_ATTENTION_MAX_SEQUENCE = 512
GEMM_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose")
ACTIVATION_OPS = ("Relu", "Gelu", "Sigmoid", "Tanh", "Erf", "LeakyRelu", "Clip", "HardSigmoid", "Softplus")
FLOAT_REGION_OPS = ("LayerNormalization", "Softmax")


@dataclass(frozen=True)
class Preset:
    name: str
    summary: str
    op_types_to_quantize: list[str] | None
    fusion_cleanup: bool  # drop the Q/DQ that TensorRT's fusion rules reject
    attention: str  # "modelopt" (ModelOpt decides) or "auto" (only where fused INT8 attention is possible)


PRESETS = {
    "trt-fusion": Preset("trt-fusion", "TensorRT's fusion rules: GEMM inputs and residual skip inputs; attention only if fusable", None, True, "auto"),
    "modelopt": Preset("modelopt", "ModelOpt's default placement, unchanged", None, False, "modelopt"),
    "gemm-only": Preset("gemm-only", "only MatMul/Gemm inputs; attention only if fusable", ["MatMul", "Gemm"], True, "auto"),
}
DEFAULT_PRESET = "trt-fusion"


@dataclass
class PresetPlan:
    op_types_to_quantize: list[str] | None
    disable_mha_qdq: bool
    notes: list[str] = field(default_factory=list)
    nodes_to_exclude: list[str] = field(default_factory=list)  # exact node names


def attention_mask_adds(model) -> list[str]:
    """Names of the Adds that add a mask to attention scores: their output feeds a Softmax
    (not residuals: the "skip" side is a mask of 0 and large negative values)."""
    consumers: dict[str, list] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    return [n.name for n in model.graph.node
            if n.op_type == "Add" and any(c.op_type == "Softmax" for c in consumers.get(n.output[0], []))]


def attention_shapes(model) -> list[tuple[str, int | None, int | None]]:
    """(MatMul name, head size, sequence length) of each attention score MatMul (its output reaches a Softmax)."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(_without_weights(model), strict_mode=False)
    shapes = {v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
              for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}
    producer = {o: n for n in model.graph.node for o in n.output}
    found = []
    for softmax in (n for n in model.graph.node if n.op_type == "Softmax"):
        node = producer.get(softmax.input[0])
        while node is not None and node.op_type in ("Add", "Where", "Div", "Mul", "Sub"):
            node = producer.get(node.input[0])
        if node is None or node.op_type != "MatMul":
            continue
        query = shapes.get(node.input[0]) or []
        scores = shapes.get(node.output[0]) or []
        found.append((node.name, query[-1] if query else None, scores[-1] if scores else None))
    return found


WEIGHT_ELEMENTS = 1024  # larger initializers are weights: shape inference needs their shape, not their values


def _without_weights(model):
    """A copy of `model` whose large initializers keep their type and shape but not their data:
    shape inference then costs milliseconds instead of serializing every weight."""
    import math

    import onnx

    light = onnx.ModelProto()
    light.CopyFrom(model)
    for tensor in light.graph.initializer:
        if math.prod(tensor.dims) > WEIGHT_ELEMENTS:
            for data in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
                tensor.ClearField(data)
    return light


def attention_state(model) -> str:
    """Whether the attention MatMuls (score and context) of a Q/DQ model are "int8", "float" or "mixed"."""
    producer = {o: n for n in model.graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    def quantized(tensor: str) -> bool:
        node = producer.get(tensor)
        return node is not None and node.op_type == "DequantizeLinear"

    states = set()
    for name, _, _ in attention_shapes(model):
        scores = next(n for n in model.graph.node if n.name == name)
        states.add(all(quantized(i) for i in scores.input) or (any(quantized(i) for i in scores.input) and "mixed"))
        softmax = next((n for n in model.graph.node if n.op_type == "Softmax" and _reaches(scores, n, consumers)), None)
        for context in _matmuls_after(softmax, consumers) if softmax else []:
            states.add(all(quantized(i) for i in context.input) or (any(quantized(i) for i in context.input) and "mixed"))
    if "mixed" in states or (True in states and False in states):
        return "mixed"
    return "int8" if states == {True} else "float"


def _reaches(start, target, consumers: dict, hops: int = 4) -> bool:
    frontier = [start]
    for _ in range(hops):
        frontier = [c for n in frontier for o in n.output for c in consumers.get(o, [])]
        if target in frontier:
            return True
    return False


def _matmuls_after(softmax, consumers: dict, hops: int = 3) -> list:
    found, frontier = [], [softmax]
    for _ in range(hops):
        frontier = [c for n in frontier for o in n.output for c in consumers.get(o, [])]
        found += [n for n in frontier if n.op_type == "MatMul"]
        frontier = [n for n in frontier if n.op_type in ("QuantizeLinear", "DequantizeLinear", "Cast")]
    return found


def plan_preset(preset: Preset, model, max_sequence: int | None) -> PresetPlan:
    """ModelOpt arguments for a preset; decides attention quantization from the model's shapes."""
    if preset.attention == "modelopt":
        return PresetPlan(preset.op_types_to_quantize, False, ["attention Q/DQ as ModelOpt places them"])
    masks = attention_mask_adds(model)
    plan = _attention_plan(preset, model, max_sequence)
    plan.nodes_to_exclude = masks
    if masks:
        plan.notes.append(f"{len(masks)} attention-mask Add(s) before Softmax left in float")
    return plan


def _attention_plan(preset: Preset, model, max_sequence: int | None) -> PresetPlan:
    attention = attention_shapes(model)
    if not attention:
        return PresetPlan(preset.op_types_to_quantize, False, ["no attention found"])
    heads = {h for _, h, _ in attention}
    sequence = max_sequence or max((s for _, _, s in attention if s), default=None)
    fusable = heads <= set(FUSED_ATTENTION_HEAD_SIZES) and sequence is not None and sequence <= FUSED_ATTENTION_MAX_SEQUENCE
    reason = f"head size {sorted(h for h in heads if h) or 'unknown'}, sequence <= {sequence if sequence else 'unknown'}"
    if fusable:
        return PresetPlan(preset.op_types_to_quantize, False, [f"attention may be quantized: fused INT8 attention is possible ({reason})"])
    return PresetPlan(preset.op_types_to_quantize, True, [f"attention left in float (disable_mha_qdq): fused INT8 attention needs head size in {FUSED_ATTENTION_HEAD_SIZES} and sequence <= {FUSED_ATTENTION_MAX_SEQUENCE} ({reason})"])


def apply_preset(preset: Preset, model) -> list[str]:
    """Edit ModelOpt's Q/DQ graph in place; return the names of the Q/DQ nodes removed.

    A consumer reads the float tensor instead of DQ(Q(x)) when TensorRT's rules reject the Q/DQ
    on that edge, or when the preset quantizes only some op types and the consumer is another
    (ModelOpt shares one Q/DQ between the QKV GEMMs and the residual Add)."""
    if not preset.fusion_cleanup:
        return []
    producer = {o: n for n in model.graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    removed: list[str] = []
    for dq in [n for n in model.graph.node if n.op_type == "DequantizeLinear"]:
        q = producer.get(dq.input[0])
        if q is None or q.op_type != "QuantizeLinear":
            continue  # a weight's DQ: TensorRT needs it
        source = q.input[0]
        for consumer in list(consumers.get(dq.output[0], [])):
            other_type = preset.op_types_to_quantize is not None and consumer.op_type not in preset.op_types_to_quantize
            if other_type or _rejected(source, consumer, producer):
                consumer.input[list(consumer.input).index(dq.output[0])] = source
                consumers[dq.output[0]].remove(consumer)
        if not consumers.get(dq.output[0]) and dq.output[0] not in {o.name for o in model.graph.output}:
            if not [c for c in consumers.get(q.output[0], []) if c is not dq]:
                model.graph.node.remove(dq)
                model.graph.node.remove(q)
                removed += [q.name, dq.name]
    return removed


def _rejected(source: str, consumer, producer: dict) -> bool:
    """TensorRT's rules reject a Q/DQ on this edge: a GEMM's output before its bias Add,
    activation or residual Add, or the input of a float region (LayerNorm, Softmax)."""
    if consumer.op_type in FLOAT_REGION_OPS:
        return True
    return consumer.op_type in ("Add", *ACTIVATION_OPS) and _from_gemm(source, producer)


def _from_gemm(tensor: str, producer: dict) -> bool:
    """The tensor is a GEMM/Conv output, possibly after its bias Add."""
    node = producer.get(tensor)
    if node is not None and node.op_type == "Add":
        node = next((producer.get(i) for i in node.input if producer.get(i) is not None and producer.get(i).op_type in GEMM_OPS), None)
    return node is not None and node.op_type in GEMM_OPS
