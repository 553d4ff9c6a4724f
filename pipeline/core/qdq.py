"""TensorRT's Q/DQ rules as data, and the questions they ask of a Q/DQ graph: the one source of the
placement presets and the Q/DQ lint (quant/) and of the engine prediction (trt/predict/).

Sources (TensorRT Developer Guide; RULES.md of the fusion corpus lists them):
- [EQ] "Explicit Quantization": docs.nvidia.com/deeplearning/tensorrt/latest/inference-library/quantized-types-explicit-quantization.html
  (Q/DQ propagation, Q/DQ layer fusion, placement recommendations, figures 1-9)
- [FA] "Fused Attention": docs.nvidia.com/deeplearning/tensorrt/latest/inference-library/transformers-fused-attention.html
- [FC] "Layer Fusion Catalog": docs.nvidia.com/deeplearning/tensorrt/latest/performance/fusion-catalog.html
`RULES`: each rule the lint and the prediction name (what TensorRT does, where that is written, what to change).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pipeline.core.graph import FP8_TYPES, LAYOUT_OPS, GraphIndex

EQ = "TensorRT Developer Guide, Explicit Quantization"
FA = "TensorRT Developer Guide, Fused Attention"
FC = "TensorRT Developer Guide, Layer Fusion Catalog"

FUSED_ATTENTION_HEAD_SIZES = (16, 32, 64)
FUSED_ATTENTION_MAX_SEQUENCE = 512
GEMM_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose")
CONV_OPS = ("Conv", "ConvTranspose")
ACTIVATION_OPS = ("Relu", "Gelu", "Sigmoid", "Tanh", "Erf", "LeakyRelu", "Clip", "HardSigmoid", "Softplus", "HardSwish", "Mish", "Elu", "Selu", "PRelu")
FLOAT_REGION_OPS = ("LayerNormalization", "Softmax")
# Ops that fuse into the GEMM/Conv before them ([EQ] figures 4-5: Conv + BatchNorm + activation, GEMM + bias):
# a GEMM's output read through any chain of these is still "the GEMM's output"
EPILOGUE_OPS = ("BatchNormalization", *ACTIVATION_OPS)
# Ops a DQ commutes with ([EQ] Q/DQ propagation: TensorRT moves the DQ after them): a Concat input read through them is still quantized
COMMUTING_OPS = ("Resize", "MaxPool", *LAYOUT_OPS)


@dataclass(frozen=True)
class Rule:
    """One documented TensorRT behaviour: its id (the lint's and the prediction's), what TensorRT does, where that is written, the fix."""

    id: str
    behaviour: str
    source: str
    fix: str


RULES = {rule.id: rule for rule in (
    Rule("qdq-after-gemm", "a Q/DQ pair between a GEMM/Conv and the op that fuses into it (bias, BatchNorm, activation, residual Add) keeps "
         "that op out of the GEMM/Conv: the Q fuses into the GEMM's output and the DQ runs as its own layer",
         f"{EQ}: Q/DQ layer placement recommendations (quantize the inputs of weighted operations, not their outputs)",
         "remove this Q/DQ pair (quantize GEMM/Conv inputs, not outputs; preset trt-fusion, or cnn for convolutional networks, does this)"),
    Rule("residual-skip-not-quantized", "a Conv/GEMM + residual Add whose skip input is float runs with a float output, so the Q after it "
         "cannot fuse into it and runs as its own layer", f"{EQ}: figures 6 and 7 (a float residual input limits the fused convolution's "
         "output to float; quantized, the trailing Q fuses)", "quantize the residual Add's skip input (the Q/DQ its tensor already has for the "
         "next layer; preset cnn does this)"),
    Rule("qdq-into-float-region", "LayerNormalization and Softmax run in float inside the fused region: a DQ feeding one runs as its own layer",
         f"{FA}; {EQ}: placement recommendations", "remove this Q/DQ pair; quantize the GEMM inputs after the normalization instead"),
    Rule("attention-not-fusable", "fused INT8 attention needs head size 16, 32 or 64 and sequence <= 512; elsewhere the attention MatMuls' "
         "Q/DQ run as their own layers", f"{FA}; {EQ}", "leave attention in float: ModelOpt disable_mha_qdq=True (preset trt-fusion does this)"),
    Rule("weight-without-dq", "a GEMM/Conv with a quantized input takes its weight quantized only through a DequantizeLinear; a float weight "
         "runs the layer in float", f"{EQ}: quantized weights", "quantize the weight with a DequantizeLinear between the initializer and the layer"),
    Rule("concat-unequal-scales", "the quantized inputs of a Concat with unequal scales are requantized instead of written into one buffer",
         f"{EQ}: Q/DQ propagation through Concat; {FC}: concatenation elimination", "give the inputs one shared scale (preset cnn does this)"),
    Rule("conv-weight-only", "TensorRT has no weight-only convolution: a Conv with a dequantized weight and a float input runs in float",
         f"{EQ}: quantized weights", "quantize the Conv's activation input too, or leave its weight in float"),
    Rule("int4-activation", "INT4 is weight-only: an INT4 Q of a computed tensor does not build", f"{EQ}: INT4/FP4 weights",
         "quantize only weights to INT4; INT8 or FP8 for activations"),
    Rule("int4-not-gemm", "INT4 weights are for MatMul/Gemm (and Gather): elsewhere they are not fused", f"{EQ}: INT4/FP4 weights",
         "quantize this weight to INT8/FP8 with its input, or leave it in float"),
    # what the prediction names besides the lint's rules
    Rule("qdq-network-input", "a Q on a network input runs as its own layer: the input arrives in float and no layer before it absorbs it",
         f"{EQ}: Q/DQ layer fusion", "nothing to change (expected once per quantized network input)"),
    Rule("q-after-float-op", "a Q after an op that runs in float (a non-weighted op whose input is not quantized) runs as its own layer: "
         "a quantizable op runs INT8 only as DQ -> op -> Q", f"{EQ}: figures 1 and 8 (quantizable operators fuse with the DQ before and the Q after)",
         "quantize the op's input too, so it runs DQ -> op -> Q"),
    Rule("q-beside-float-reader", "a tensor read quantized and also in float: its producer writes float and the Q runs as its own layer",
         f"{EQ}: Q/DQ layer fusion (a Q fuses into its producer only when every reader takes the quantized tensor)",
         "quantize the float reader's input with the same Q/DQ, or keep both readers in float"),
    Rule("residual-dq-float-output", "a fused Conv + residual Add runs its residual input in its output's precision: a quantized residual into "
         "a block whose output stays float is dequantized by its own layer", f"{EQ}: figures 6 and 7",
         "quantize the block's output too (the input of the layer after it)"),
    Rule("qdq-not-absorbed", "a Q/DQ whose neighbours run in float and take no quantized tensor runs as its own layer",
         f"{EQ}: Q/DQ layer fusion", "remove this Q/DQ pair, or quantize the ops around it so they run in INT8"),
)}
LINT_RULES = ("qdq-after-gemm", "residual-skip-not-quantized", "qdq-into-float-region", "attention-not-fusable", "weight-without-dq",
              "concat-unequal-scales", "conv-weight-only", "int4-activation", "int4-not-gemm")


@dataclass(frozen=True)
class PlacementRules:
    """TensorRT's placement rules a preset applies and the lint checks (the one source of both)."""

    epilogue_ops: tuple[str, ...]  # fuse into the GEMM/Conv before them: no Q/DQ in between
    float_region_ops: tuple[str, ...]  # run in float inside a fused region: no Q/DQ on their input
    residual_skip: bool  # quantize the skip input of a residual Add (moved onto an existing Q/DQ of that tensor)
    share_concat_scales: bool  # the quantized inputs of a Concat get one scale (the largest)
    keep_float: tuple[str, ...] = ()  # parts left in higher precision: "lm_head", "kv_cache", "attention" (a decoder's), "rms_norm", "router"


TRANSFORMER_RULES = PlacementRules(("Add", *ACTIVATION_OPS), FLOAT_REGION_OPS, residual_skip=False, share_concat_scales=False,
                                   keep_float=("rms_norm", "router"))  # a written-out RMSNorm is a float region as LayerNormalization is
CNN_RULES = PlacementRules(("Add", *EPILOGUE_OPS), FLOAT_REGION_OPS, residual_skip=True, share_concat_scales=True)
DECODER_RULES = PlacementRules(("Add", *ACTIVATION_OPS), FLOAT_REGION_OPS, residual_skip=False, share_concat_scales=False,
                               keep_float=("lm_head", "kv_cache", "attention", "rms_norm", "router"))


def mask_adds(graph: GraphIndex) -> list[str]:
    """Names of the Adds that add a mask to attention scores: their output feeds a Softmax."""
    return [n.name for n in graph.nodes if n.op_type == "Add" and any(c.op_type == "Softmax" for c in graph.consumers(n.output[0]))]


class QdqGraph(GraphIndex):
    """The questions the presets, the lint and the prediction ask of a Q/DQ graph, on its index (`QdqGraph.of(model)`)."""

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

    def int8_quantize(self, node) -> bool:
        """A QuantizeLinear to INT8 (its zero point's type, INT8 when it has none), not to FP8."""
        if node.op_type != "QuantizeLinear":
            return False
        zero = self.initializers.get(node.input[2]) if len(node.input) > 2 else None
        return zero is None or zero.data_type not in FP8_TYPES

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

    def residual_adds(self, epilogue: tuple[str, ...]) -> Iterator[tuple]:
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

    def float_skips(self, rules: PlacementRules) -> Iterator[tuple]:
        """(Add, [GEMM/Conv], float skip tensor, or None for two quantized convolutions' float outputs under `residual_skip`)
        for each residual Add a quantized GEMM/Conv cannot take in INT8. Without `residual_skip` (transformers), only a skip
        that already has an INT8 Q counts: a new one would sit on a pre-LN transformer's LayerNorm input, which stays float,
        and the fusion it buys is INT8's (an FP8 transformer quantizes its GEMM inputs alone: quant/presets.py)."""
        for node, gemms, _ in self.residual_adds(rules.epilogue_ops):
            quantized = [self.quantized_activation(i) is not None for i in node.input]
            if all(gemms):
                if not any(quantized) and all(self.quantized_gemm(gemm) for gemm in gemms) and rules.residual_skip:
                    yield node, gemms, None
                continue
            side = 0 if gemms[0] is not None else 1
            gemm, skip = gemms[side], node.input[1 - side]
            if self.quantized_gemm(gemm) and not quantized[1 - side] and self.gemm_behind(skip, rules.epilogue_ops, single_use=True) is None \
                    and (rules.residual_skip or any(self.int8_quantize(reader) for reader in self.consumers(skip))):
                yield node, [gemm], skip

    def rejection(self, rules: PlacementRules, source: str, consumer, dq_output: str) -> str | None:
        """The id of the rule that rejects a Q/DQ on this edge (None: accepted): the input of a float region, or a GEMM/Conv
        output before an op that fuses into it, except the one quantized input of a residual Add whose other input is the
        float output of another GEMM/Conv (that GEMM takes the Add)."""
        if consumer.op_type in rules.float_region_ops:
            return "qdq-into-float-region"
        if consumer.op_type not in rules.epilogue_ops or self.gemm_behind(source, rules.epilogue_ops, single_use=rules.residual_skip) is None:
            return None
        if consumer.op_type == "Add" and rules.residual_skip:
            other = [i for i in consumer.input if i != dq_output]
            if other and self.quantized_activation(other[0]) is None and self.gemm_behind(other[0], rules.epilogue_ops, single_use=True) is not None:
                return None
        return "qdq-after-gemm"
