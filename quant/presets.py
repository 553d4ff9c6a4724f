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

Each preset names the model family it is written for (`Preset.family`); the lint reads the same
data (`PlacementRules`), so what a preset places and what the lint accepts never disagree.
What they recognize in a graph (attention, masks, RMSNorm) is in quant/patterns.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pipeline.core.errors import InputError
from pipeline.core.graph import LAYOUT_OPS, GraphIndex
from quant.patterns import attention_mask_adds, attention_matmuls, attention_shapes, builds_causal_mask, mask_adds, rms_norm_nodes

FUSED_ATTENTION_HEAD_SIZES = (16, 32, 64)
FUSED_ATTENTION_MAX_SEQUENCE = 512
GEMM_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose")
CONV_OPS = ("Conv", "ConvTranspose")
ACTIVATION_OPS = ("Relu", "Gelu", "Sigmoid", "Tanh", "Erf", "LeakyRelu", "Clip", "HardSigmoid", "Softplus", "HardSwish", "Mish", "Elu", "Selu", "PRelu")
FLOAT_REGION_OPS = ("LayerNormalization", "Softmax")
# Ops that fuse into the GEMM/Conv before them ("Explicit Quantization": Conv + BatchNorm + activation,
# GEMM + bias): a GEMM's output read through any chain of these is still "the GEMM's output"
EPILOGUE_OPS = ("BatchNormalization", *ACTIVATION_OPS)
# Ops a DQ commutes with (TensorRT moves the DQ after them): a Concat input read through them is still quantized
COMMUTING_OPS = ("Resize", "MaxPool", *LAYOUT_OPS)

@dataclass(frozen=True)
class PlacementRules:
    """TensorRT's placement rules a preset applies and the lint checks (the one source of both)."""

    epilogue_ops: tuple[str, ...]  # fuse into the GEMM/Conv before them: no Q/DQ in between
    float_region_ops: tuple[str, ...]  # run in float inside a fused region: no Q/DQ on their input
    residual_skip: bool  # quantize the skip input of a residual Add (moved onto an existing Q/DQ of that tensor)
    share_concat_scales: bool  # the quantized inputs of a Concat get one scale (the largest)
    keep_float: tuple[str, ...] = ()  # decoder parts left in higher precision: "lm_head", "kv_cache", "attention", "rms_norm"


TRANSFORMER_RULES = PlacementRules(("Add", *ACTIVATION_OPS), FLOAT_REGION_OPS, residual_skip=False, share_concat_scales=False)
CNN_RULES = PlacementRules(("Add", *EPILOGUE_OPS), FLOAT_REGION_OPS, residual_skip=True, share_concat_scales=True)
DECODER_RULES = PlacementRules(("Add", *ACTIVATION_OPS), FLOAT_REGION_OPS, residual_skip=False, share_concat_scales=False,
                               keep_float=("lm_head", "kv_cache", "attention", "rms_norm"))


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
PRESET_NAMES = ("auto", *PRESETS)  # "auto": the preset of the model's family
KV_CACHE_NAME = re.compile(r"past|present|cache", re.IGNORECASE)


def model_family(model) -> str:
    """"decoder" (KV cache inputs/outputs, or a causal mask: Trilu or positions compared), "encoder" (attention: a MatMul
    reaching a Softmax), "cnn" (convolutions and no attention); a graph with none of these (an MLP)
    counts as an encoder: the transformer rules are the GEMM rules."""
    names = [v.name for v in [*model.graph.input, *model.graph.output]]
    ops = {n.op_type for n in model.graph.node}
    if any(KV_CACHE_NAME.search(name) for name in names) or "Trilu" in ops or builds_causal_mask(model):
        return "decoder"
    if ops & set(CONV_OPS) and not attention_shapes(model):
        return "cnn"
    return "encoder"


def resolve_preset(name: str, model) -> Preset:
    """The preset called `name`; "auto" is the one written for the model's family."""
    if name == "auto":
        return PRESETS[FAMILY_PRESET[model_family(model)]]
    if name not in PRESETS:
        raise InputError(f"--preset {name!r}: use one of {', '.join(PRESET_NAMES)}")
    return PRESETS[name]


def check_family(preset: Preset, model) -> None:
    """A preset written for another family than the model's is one line naming the preset that fits."""
    family = model_family(model)
    if preset.family is not None and preset.family != family:
        raise InputError(f"--preset {preset.name} is written for {preset.family} models, but this model is a {family} "
                         f"({_family_evidence(family)}): use --preset {FAMILY_PRESET[family]}")


def _family_evidence(family: str) -> str:
    return {"decoder": "KV cache inputs/outputs or a causal mask", "cnn": "convolutions, no attention",
            "encoder": "attention or plain GEMMs, no convolution-only body"}[family]


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
    check_family(preset, model)
    masks = attention_mask_adds(model)
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
    """The nodes a decoder preset leaves unquantized, by part: the lm_head GEMM (the last GEMM
    before the logits output) and the nodes that read a KV cache input or write a KV cache output."""
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


def apply_preset(preset: Preset, model) -> list[str]:
    """Edit ModelOpt's Q/DQ graph in place; return the names of the Q/DQ nodes removed.

    A consumer reads the float tensor instead of DQ(Q(x)) when the preset's rules reject the Q/DQ
    on that edge, or when the preset quantizes only some op types and the consumer is another
    (ModelOpt shares one Q/DQ between the QKV GEMMs and the residual Add). With the CNN rules a
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
        rejected = [c for c in readers if (preset.op_types_to_quantize is not None and c.op_type not in preset.op_types_to_quantize)
                    or graph.rejected(rules, q.input[0], c, dq.output[0])]
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


class QdqGraph(GraphIndex):
    """The questions the presets and the lint ask of a Q/DQ graph, on its index (`QdqGraph.of(model)`)."""

    def quantized_activation(self, tensor: str):
        """(Q, DQ) when `tensor` is DQ(Q(x)), also with data movement between them (ModelOpt's FP8
        MHA places Q -> Transpose -> DQ); else None. A DQ of a constant (a weight) is not an activation."""
        dq = self.producer(tensor)
        if dq is None or dq.op_type != "DequantizeLinear":
            return None
        q = self.producer(dq.input[0])
        while q is not None and q.op_type in LAYOUT_OPS:
            q = self.producer(q.input[0])
        return (q, dq) if q is not None and q.op_type == "QuantizeLinear" else None

    def moves_between(self, q, dq) -> list:
        """The data movement nodes from `q` to `dq` (Q -> Transpose -> DQ), in graph order; [] when DQ reads Q."""
        moves, node = [], self.producer(dq.input[0])
        while node is not None and node is not q:
            moves.insert(0, node)
            node = self.producer(node.input[0])
        return moves

    def single_path(self, q, dq) -> bool:
        """Every tensor from `q` to `dq` is read once (by the next node): the pair can go without touching another reader."""
        return all(len(self.readers.get(node.output[0], ())) == 1 for node in [q, *self.moves_between(q, dq)])

    def dequantized_through(self, tensor: str):
        """`quantized_activation` of `tensor` or of the input of the ops it comes through that a DQ commutes
        with (nearest Resize, MaxPool, data movement): ModelOpt quantizes before an Upsample, not after."""
        node = self.producer(tensor)
        while node is not None and node.op_type in COMMUTING_OPS:
            tensor, node = node.input[0], self.producer(node.input[0])
        return self.quantized_activation(tensor)

    def gemm_behind(self, tensor: str, epilogue: tuple[str, ...] = ("Add",), single_use: bool = False):
        """The GEMM/Conv whose output `tensor` is, directly or through ops that fuse into it (`epilogue`:
        its bias Add; BatchNormalization and activations under the CNN rules). `single_use`: only if every
        tensor on the way has one consumer (a Conv whose output also feeds another layer cannot take an Add)."""
        node = self.producer(tensor)
        chain = [tensor]
        for _ in range(4):
            if node is None or node.op_type not in epilogue:
                break
            if node.op_type == "Add":
                chain.append(next((i for i in node.input if self.op(i) in GEMM_OPS), ""))
            else:
                chain.append(node.input[0])
            node = self.producer(chain[-1])
        if node is None or node.op_type not in GEMM_OPS:
            return None
        if single_use and any(len(self.readers.get(t, ())) != 1 for t in chain):
            return None
        return node

    def quantized_gemm(self, gemm) -> bool:
        """Its activation input is quantized."""
        return any(self.quantized_activation(i) for i in gemm.input[:1])

    def dq_of(self, tensor: str) -> str | None:
        """The output of an existing DQ(Q(tensor)) (a Q/DQ placed for another consumer), if any."""
        for q in self.consumers(tensor):
            if q.op_type != "QuantizeLinear":
                continue
            for dq in self.consumers(q.output[0]):
                if dq.op_type == "DequantizeLinear":
                    return dq.output[0]
        return None

    def residual_adds(self, epilogue: tuple[str, ...]):
        """(Add, [GEMM behind each input or None], [float tensor of each input]) for Adds of two computed
        tensors of which at least one is a GEMM/Conv output (mask Adds before Softmax excluded)."""
        masks = set(mask_adds(self))
        for node in self.nodes:
            if node.op_type != "Add" or len(node.input) != 2 or node.name in masks:
                continue
            if any(i in self.initializers or self.op(i) == "Constant" for i in node.input):
                continue
            floats = [pair[0].input[0] if (pair := self.quantized_activation(i)) else i for i in node.input]
            gemms = [self.gemm_behind(t, epilogue, single_use=True) for t in floats]
            if any(gemms):
                yield node, gemms, floats

    def rejected(self, rules: PlacementRules, source: str, consumer, dq_output: str) -> bool:
        """The rules reject a Q/DQ on this edge: the input of a float region, or a GEMM/Conv output
        before an op that fuses into it, except the one quantized input of a residual Add whose other
        input is the float output of another GEMM/Conv (that GEMM takes the Add)."""
        if consumer.op_type in rules.float_region_ops:
            return True
        if consumer.op_type not in rules.epilogue_ops or self.gemm_behind(source, rules.epilogue_ops, single_use=rules.residual_skip) is None:
            return False
        if consumer.op_type == "Add" and rules.residual_skip:
            other = [i for i in consumer.input if i != dq_output]
            return not (other and self.quantized_activation(other[0]) is None and self.gemm_behind(other[0], rules.epilogue_ops, single_use=True) is not None)
        return True


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
