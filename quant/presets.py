"""INT8 placement presets: where Q/DQ go, and why.

- `modelopt`: ModelOpt's default placement, unchanged. On BERT it quantizes both inputs of
  every residual Add (also the GEMM-output side), which TensorRT's rules say blocks the
  GEMM + bias + residual fusion; it is the placement behind "INT8 BERT splits into dozens of
  layers" (TensorRT issue 4397, Model-Optimizer issue 159).
- `trt-fusion` (default): the placement TensorRT's "Explicit Quantization" rules ask for.
  Quantize the inputs of weighted ops (MatMul/Gemm/Conv) and the residual *skip* input of an
  Add, never a GEMM/Conv output before its bias, activation or residual Add (so they fuse
  into the GEMM), never the input of LayerNormalization, Softmax or a written-out RMSNorm's
  nodes (their internals run in float inside the fused region; EmbeddingGemma's quantized x^2
  and 1/sqrt(mean) took its INT8 output to cosine 0.970); attention MatMuls get Q/DQ only when fused INT8 attention
  is possible (head size 16/32/64 and sequence <= 512, "Explicit Quantization" / "Fused
  Attention"), else `disable_mha_qdq`. The attention-mask Add before Softmax is never
  quantized: it runs inside the fused attention, and a Hugging Face mask holds the float
  minimum (or -inf) where tokens are padding, which no INT8 scale can represent (ModelOpt's
  entropy calibration fails on it: "Too many bins for data range").
- `gemm-only`: only MatMul/Gemm inputs (ModelOpt `op_types_to_quantize`), attention as in
  trt-fusion: the smallest placement, for when accuracy matters more than speed.
- `cnn`: TensorRT's "Explicit Quantization" rules for convolutional networks: quantize the
  inputs of Conv/ConvTranspose (depthwise ones too) and MatMul; no Q/DQ between a Conv and its
  BatchNormalization, activation or residual Add (they fuse into the Conv); the residual Add
  reads a quantized skip input, so it fuses into the Conv of the other input (where both
  inputs are Conv outputs, exactly one is quantized); the inputs of a Concat share one scale,
  so TensorRT can drop the Concat instead of requantizing.
- `decoder`: only the inputs of the weight GEMMs (MatMul/Gemm), as TensorRT-LLM's INT8 and FP8
  GEMMs do, and in higher precision the parts of a decoder that lose tokens when quantized: the
  lm_head GEMM (its logits feed sampling), norms (also RMSNorm written out as Pow/ReduceMean/
  Sqrt/Reciprocal/Mul: its per-row factor spans orders of magnitude) and Softmax, the KV cache
  inputs and outputs (`past_key_values.*` / `present.*`), and the attention MatMuls, which read
  the whole cache: one per-tensor scale for keys and values calibrated on some caches rounds
  another cache's values to zero (TensorRT-LLM likewise keeps attention in FP16 unless the KV
  cache is FP8). On the corpus' with-past Llama, Qwen2 and Phi-3 greedy tokens then agree with
  FP32 on 100% (the transformer rules with every Mul/Add input quantized: 59-91%).
- `auto` (the default): the preset of the model's family, read from the graph (`FAMILY_PRESET`).

FP8 under the transformer rules (trt-fusion, gemm-only, decoder): a Q/DQ is read only by the weighted layers
(MatMul/Gemm/Conv), never by a residual Add. The skip Q/DQ of trt-fusion is there so the Add fuses into an INT8 GEMM
("Explicit Quantization", figures 6 and 7, written for INT8); FP8 recipes quantize the inputs and weights of the
weighted layers, never a residual Add (ModelOpt's PyTorch FP8 config: its Linear and Conv layers; TensorRT-LLM's FP8
GEMMs). E4M3 rounds a value by up to 1/16 of itself at any magnitude, and the residual stream, which every layer adds
to, is where that adds up: bert-tiny's FP8 model read cosine_centered 0.973 with the skips quantized, 0.992 without
(weights stored in FP8; 0.969 and 0.990 behind Q/DQ pairs; INT8: 0.993 and 0.999); on the tiny Hugging Face BERT,
DistilBERT and RoBERTa, FP8's error was 280x, 370x and 1.6x what it is without them (a pre-LN ViT quantizes no
skip: the same model either way).

The lint and the engine prediction (trt/predict/) read the presets' `PlacementRules` (pipeline/core/qdq.py), so
they never disagree with a preset; what they recognize in a graph is in quant/patterns.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pipeline.core.errors import InputError
from pipeline.core.graph import GraphIndex
from pipeline.core.qdq import (
    CNN_RULES,
    CONV_OPS,
    DECODER_RULES,
    FUSED_ATTENTION_HEAD_SIZES,
    FUSED_ATTENTION_MAX_SEQUENCE,
    GEMM_OPS,
    TRANSFORMER_RULES,
    PlacementRules,
    QdqGraph,
    mask_adds,
)
from quant.patterns import attention_matmuls, attention_shapes, builds_causal_mask, reads_token_ids, rms_norm_nodes, router_gemms


@dataclass(frozen=True)
class Preset:
    name: str
    summary: str
    op_types_to_quantize: list[str] | None
    fusion_cleanup: bool  # drop the Q/DQ that TensorRT's fusion rules reject
    attention: str  # "modelopt" (ModelOpt decides) or "auto" (only where fused INT8 attention is possible)
    family: str | None = None  # the model family it is written for (None: any)
    rules: PlacementRules = TRANSFORMER_RULES


PRESETS = {
    "trt-fusion": Preset("trt-fusion", "TensorRT's fusion rules: GEMM inputs and residual skip inputs; attention only if fusable", None, True, "auto"),
    "modelopt": Preset("modelopt", "ModelOpt's default placement, unchanged", None, False, "modelopt"),
    "gemm-only": Preset("gemm-only", "only MatMul/Gemm inputs; attention only if fusable", ["MatMul", "Gemm"], True, "auto"),
    "cnn": Preset("cnn", "TensorRT's CNN rules: Conv/MatMul inputs, residual skip inputs, Conv+BN+activation unbroken, shared Concat scales",
                  None, True, "auto", family="cnn", rules=CNN_RULES),
    "decoder": Preset("decoder", "GEMM inputs only; lm_head, norms, attention MatMuls and KV cache I/O kept in higher precision",
                      ["MatMul", "Gemm"], True, "auto", family="decoder", rules=DECODER_RULES),
}
FAMILY_PRESET = {"encoder": "trt-fusion", "decoder": "decoder", "cnn": "cnn"}
FAMILY_EVIDENCE = {"decoder": "KV cache inputs/outputs or a causal mask", "cnn": "convolutions, no attention",
                   "encoder": "attention or plain GEMMs, no convolution-only body"}
PRESET_NAMES = ("auto", *PRESETS)  # "auto": the preset of the model's family
KV_CACHE_NAME = re.compile(r"past|present|cache", re.IGNORECASE)


def model_family(model) -> str:
    """"decoder" (KV cache inputs/outputs, or a causal mask: Trilu or positions compared), "encoder" (attention: a MatMul
    reaching a Softmax), "cnn" (convolutions and no attention, reading no token ids); a graph with none of these (an
    MLP) counts as an encoder: the transformer rules are the GEMM rules. A state-space language model (Mamba: a
    Conv1d and a scan of MatMuls, no attention) is no CNN: under the CNN rules FalconMamba's INT8 read cosine 0.971,
    under the transformer rules 0.998."""
    names = [v.name for v in [*model.graph.input, *model.graph.output]]
    ops = {n.op_type for n in model.graph.node}
    if any(KV_CACHE_NAME.search(name) for name in names) or "Trilu" in ops or builds_causal_mask(model):
        return "decoder"
    if ops & set(CONV_OPS) and not attention_shapes(model) and not reads_token_ids(model):
        return "cnn"
    return "encoder"


def resolve_preset(name: str, model) -> Preset:
    """The preset called `name`; "auto" is the one written for the model's family."""
    if name == "auto":
        return PRESETS[FAMILY_PRESET[model_family(model)]]
    if name not in PRESETS:
        raise InputError(f"--preset {name!r}: use one of {', '.join(PRESET_NAMES)}")
    return PRESETS[name]


@dataclass
class PresetPlan:
    op_types_to_quantize: list[str] | None
    disable_mha_qdq: bool
    notes: list[str] = field(default_factory=list)
    nodes_to_exclude: list[str] = field(default_factory=list)  # exact node names


def plan_preset(preset: Preset, model, max_sequence: int | None) -> PresetPlan:
    """ModelOpt arguments for a preset; decides attention quantization from the model's shapes."""
    if preset.attention == "modelopt":
        return PresetPlan(preset.op_types_to_quantize, False, ["attention Q/DQ as ModelOpt places them"])
    family = model_family(model)
    if preset.family is not None and preset.family != family:  # a preset written for another family: name the one that fits
        raise InputError(f"--preset {preset.name} is written for {preset.family} models, but this model is {'an' if family[0] in 'aeiou' else 'a'} {family} "
                         f"({FAMILY_EVIDENCE[family]}): use --preset {FAMILY_PRESET[family]}")
    masks = mask_adds(GraphIndex.of(model))
    # a preset keeping the attention MatMuls in float says so below, not whether they could be quantized
    plan = PresetPlan(preset.op_types_to_quantize, False) if "attention" in preset.rules.keep_float else _attention_plan(preset, model, max_sequence)
    plan.nodes_to_exclude = masks
    if masks:
        plan.notes.append(f"{len(masks)} attention-mask Add(s) before Softmax left in float")
    kept = kept_float(preset.rules, model)
    for part, names in kept.items():
        plan.nodes_to_exclude += names
        plan.notes.append(f"{part} left in higher precision: {len(names)} node(s)")
    return plan


def kept_float(rules: PlacementRules, model) -> dict[str, list[str]]:
    """The nodes a preset leaves unquantized, by part (`rules.keep_float`): the lm_head GEMM (the last GEMM before
    the logits output), the nodes that read a KV cache input or write a KV cache output, the attention MatMuls, the
    nodes of a written-out RMSNorm, and the GEMMs a mixture of experts routes by."""
    kept: dict[str, list[str]] = {}
    graph = GraphIndex.of(model)
    if "lm_head" in rules.keep_float:
        heads = []
        for output in graph.outputs:
            node = graph.producer(output)
            while node is not None and node.op_type not in ("MatMul", "Gemm") and node.input:
                node = graph.producer(node.input[0])
            if node is not None and node.op_type in ("MatMul", "Gemm") and not KV_CACHE_NAME.search(output):
                heads.append(node.name)
        kept["lm_head"] = sorted(set(heads))
    if "kv_cache" in rules.keep_float:
        cache_in = {i.name for i in model.graph.input if KV_CACHE_NAME.search(i.name)}
        cache_out = {o for o in graph.outputs if KV_CACHE_NAME.search(o)}
        kept["kv_cache"] = [n.name for n in graph.nodes if set(n.input) & cache_in or set(n.output) & cache_out]
    if "attention" in rules.keep_float:
        kept["attention MatMuls (they read the KV cache)"] = attention_matmuls(model)
    if "rms_norm" in rules.keep_float:
        kept["RMSNorm nodes (written out, not RMSNormalization)"] = rms_norm_nodes(model)
    if "router" in rules.keep_float:
        kept["mixture-of-experts routers (a TopK picks from their scores)"] = router_gemms(model)
    return {part: names for part, names in kept.items() if names}


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


def apply_preset(preset: Preset, model, kept: frozenset[str] = frozenset()) -> list[str]:
    """Edit ModelOpt's Q/DQ graph in place; return the names of the Q/DQ nodes removed.

    A consumer reads the float tensor instead of DQ(Q(x)) when the preset's rules reject the Q/DQ
    on that edge, when the preset quantizes only some op types and the consumer is another
    (ModelOpt shares one Q/DQ between the QKV GEMMs and the residual Add), or when it is one of the
    nodes `kept` in higher precision (a router reads the Q/DQ its experts' GEMMs share), or, in FP8 under the
    transformer rules, when it is not a weighted layer (a residual Add: see the module's note). With the CNN rules a
    residual Add's skip input is moved onto the Q/DQ its tensor already has (for the next Conv),
    and a Concat's quantized inputs get one scale."""
    if not preset.fusion_cleanup:
        return []
    rules = preset.rules
    if rules.residual_skip:
        _quantize_residual_skips(model)
    # indexed after the residual edits (a Q/DQ they left unread is found unread here) and not after the
    # edits below: each DQ's readers are decided on the graph as ModelOpt (and the residual pass) left it
    graph = QdqGraph.of(model)
    outputs = set(graph.outputs)
    removed: list[str] = []
    for dq in [n for n in graph.nodes if n.op_type == "DequantizeLinear"]:
        pair = graph.quantized_activation(dq.output[0])
        if pair is None:
            continue  # a weight's DQ: TensorRT needs it
        q = pair[0]
        moves = graph.moves_between(q, dq)
        readers = list(graph.consumers(dq.output[0]))
        weighted_only = not rules.residual_skip and not graph.int8_quantize(q)  # FP8 under the transformer rules
        rejected = [c for c in readers if (preset.op_types_to_quantize is not None and c.op_type not in preset.op_types_to_quantize)
                    or (weighted_only and c.op_type not in GEMM_OPS)
                    or c.name in kept or graph.rejection(rules, q.input[0], c, dq.output[0]) is not None]
        if moves:  # Q -> Transpose/Reshape -> DQ (FP8): only a whole pair goes, the data movement stays, in float
            if rejected != readers or dq.output[0] in outputs or not graph.single_path(q, dq):
                continue
            moves[0].input[list(moves[0].input).index(q.output[0])] = q.input[0]
            source = moves[-1].output[0]
        else:
            source = q.input[0]
        for consumer in rejected:
            consumer.input[list(consumer.input).index(dq.output[0])] = source
        if len(rejected) == len(readers) and dq.output[0] not in outputs:  # the DQ is read no more
            if moves or not [c for c in graph.consumers(q.output[0]) if c is not dq]:
                model.graph.node.remove(dq)
                model.graph.node.remove(q)
                removed += [q.name, dq.name]
    if rules.share_concat_scales:
        share_concat_scales(model)
    return removed


def _quantize_residual_skips(model) -> None:
    """Each residual Add of a Conv output and an unquantized skip reads the skip through the Q/DQ
    that tensor already has; of two quantized Conv outputs, the first is read in float."""
    graph = QdqGraph.of(model)
    epilogue = CNN_RULES.epilogue_ops
    for add, gemms, floats in list(graph.residual_adds(epilogue)):
        pairs = [graph.quantized_activation(i) for i in add.input]
        if all(gemms):
            if all(pairs):
                add.input[0] = floats[0]
            continue
        skip = 1 if gemms[0] is not None else 0
        if pairs[skip] is None and (shared := graph.dq_of(add.input[skip])) is not None:
            add.input[skip] = shared


def share_concat_scales(model) -> None:
    """Give the Q/DQ pairs feeding each Concat (all inputs quantized, per-tensor scales) the largest
    of their scales, so TensorRT can drop the Concat."""
    import numpy as np
    from onnx import numpy_helper

    graph = QdqGraph.of(model)
    initializers = dict(graph.initializers)  # and the shared scales made here (a DQ may feed two Concats)
    for concat in (n for n in graph.nodes if n.op_type == "Concat"):
        pairs = [graph.dequantized_through(i) for i in concat.input]
        if not pairs or not all(pairs):
            continue
        scales = [initializers.get(dq.input[1]) for _, dq in pairs]
        if any(s is None or len(s.dims) for s in scales):
            continue
        values = [numpy_helper.to_array(s) for s in scales]
        if len({float(v) for v in values}) == 1:
            continue
        shared = numpy_helper.from_array(np.asarray(max(values, key=float), dtype=values[0].dtype), f"{concat.name}_shared_scale")
        model.graph.initializer.append(shared)
        initializers[shared.name] = shared
        for q, dq in pairs:
            q.input[1] = dq.input[1] = shared.name
