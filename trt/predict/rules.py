"""The fusion and Myelin rules the prediction applies, as data: which ops fuse into which layer, which run
in Myelin, how Myelin cuts a region into kernels. Each rule names the TensorRT behaviour it implements and
where that is written; the Q/DQ rules (what absorbs a Q or DQ, what leaves it standalone) are the lint's,
in pipeline/core/qdq.py `RULES`, and `rule(id)` reads both tables.

Sources: [FC] Layer Fusion Catalog, [EQ] Explicit Quantization, [FA] Fused Attention (TensorRT Developer
Guide; pipeline/core/qdq.py gives the addresses), [2576] TensorRT issue 2576 (the maintainers on when Myelin
is used), [PARSER] the ONNX parser's importers (onnx-tensorrt: the layers it adds, named in engines
`reshape_after_<Gemm>`, `copied_squeeze_after_...`, `ONNXTRT_castHelper`), [2136] TensorRT issue 2136 (why TensorRT
inserts Reformat layers).
"""

from __future__ import annotations

from pipeline.core.qdq import ACTIVATION_OPS, EQ, FA, FC, RULES, Rule

ISSUE_2576 = "TensorRT issue 2576 (maintainers: Myelin does the pointwise and MHA fusions; with an MHA pattern TensorRT offloads the network to it)"
PARSER = "the ONNX parser's importers (onnx-tensorrt), whose layers engines name"
ISSUE_2136 = ("TensorRT issue 2136 (maintainers: network I/O is linear FP32, many tactics need formats like NHWC8 or NC/32HW32, "
              "and TensorRT inserts Reformat layers between them)")

# ---------------------------------------------------------------- op families

# elementwise ops: fuse into a convolution's epilogue, a PointWise layer (`PWN(...)`) or a Myelin kernel [FC]
POINTWISE_OPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Exp", "Log", "Neg", "Abs", "Erf", "Tanh", "Sigmoid", "Relu", "LeakyRelu",
    "Clip", "Min", "Max", "Mod", "Gelu", "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Elu", "Selu", "Mish", "PRelu", "Sin", "Cos",
    "Floor", "Ceil", "Round", "Sign", "Where", "Cast", "CastLike", "Not", "And", "Or", "Xor", "Equal", "Greater", "Less", "GreaterOrEqual",
    "LessOrEqual", "IsNaN", "IsInf", "Expand", "Trilu", "Range", "BitwiseAnd", "BitwiseOr", "ThresholdedRelu", "Celu", "Swish",
})
ACTIVATIONS = frozenset(ACTIVATION_OPS)
# rearrange or select elements; erased, merged into a neighbour, or a Shuffle layer [FC: shuffle and reshape]
MOVE_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity", "Dropout", "Slice", "Gather", "GatherElements",
                      "GatherND", "Concat", "Split", "Tile", "Pad", "DepthToSpace", "SpaceToDepth", "ScatterND", "ScatterElements"})
ERASED_OPS = frozenset({"Identity", "Dropout"})  # nothing to compute at inference [FC: no-ops are erased]
RESHAPE_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})  # a no-op on contiguous memory [FC]
CONV_OPS = frozenset({"Conv", "ConvTranspose"})
GEMM_OPS = frozenset({"MatMul", "Gemm", "MatMulInteger"})
POOL_OPS = frozenset({"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool", "GlobalLpPool", "MaxRoiPool", "RoiAlign"})
# TensorRT layers of their own outside Myelin in the default build: convolutions, pooling, resampling [2576]
STANDARD_OPS = CONV_OPS | POOL_OPS | frozenset({"Resize", "Upsample", "LRN", "NonMaxSuppression", "GridSample", "InstanceNormalization",
                                                 "BatchNormalization"})
NORMALIZATION_OPS = frozenset({"LayerNormalization", "GroupNormalization", "RMSNormalization", "SkipLayerNormalization"})
REDUCE_OPS = frozenset({"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSumExp",
                        "ReduceSumSquare", "CumSum"})
INDEX_OPS = frozenset({"ArgMax", "ArgMin", "TopK"})  # reductions whose indices TensorRT computes in INT32
SOFTMAX_OPS = frozenset({"Softmax", "LogSoftmax"})
REDUCTIONS = NORMALIZATION_OPS | REDUCE_OPS | INDEX_OPS | SOFTMAX_OPS
# what makes a group of ops a Myelin region in TensorRT 10.x and 11.x: a GEMM, a normalization, a softmax, a reduction [2576]
MYELIN_ANCHORS = GEMM_OPS | REDUCTIONS | frozenset({"Einsum"})
# a Conv's epilogue: BatchNorm (a per-channel scale), activations, and the pointwise ops TensorRT fuses as `PWN(...)` [FC]
CONV_EPILOGUE = ACTIVATIONS | frozenset({"BatchNormalization"}) | POINTWISE_OPS - frozenset({"Cast", "Where", "Expand", "Range", "Trilu"})

# ---------------------------------------------------------------- the rules

FUSION_RULES = {r.id: r for r in (
    Rule("constant-folding", "nodes computed only from constants and shapes are folded at build time and run in no layer",
         f"{FC}: constants fold into their consumers", "nothing to change"),
    Rule("erase-no-op", "Identity and Dropout, and reshapes that only rename a contiguous tensor, are erased (a network output keeps its own)",
         f"{FC}: shuffle and reshape fusions (no-op reshapes are erased)", "nothing to change"),
    Rule("conv-epilogue", "a convolution takes the BatchNorm, activation and pointwise ops after it (`Conv + Relu`, `Conv + PWN(...)`)",
         f"{FC}: convolution and activation, convolution and scale, pointwise fusion", "nothing to change"),
    Rule("conv-residual-add", "a convolution takes the element-wise sum after it and the activation after that (`Conv + Add + Relu`); of two "
         "convolutions feeding the sum, the one whose output is not quantized, else the one computed last",
         f"{FC}: convolution and element-wise operation; {EQ}: figures 6 and 7", "nothing to change"),
    Rule("conv-pool-int8", "an INT8 convolution whose only reader is a max pooling running INT8 fuses with it (ConvActPool)",
         f"{FC}: convolution and pooling of equal precision (the TREx A100 engines fuse them only in INT8)", "nothing to change"),
    Rule("reduce-as-pooling", "an average or max reduction over the two spatial axes of an image becomes a pooling layer",
         f"{FC}: reduce to pooling (average reduce over H and W)", "nothing to change"),
    Rule("fc-as-convolution", "TensorRT 8.x runs a Gemm/MatMul with constant weights outside Myelin as a 1x1 convolution, with a NoOp shuffle "
         "back to the ONNX shape after it", f"{PARSER} (`reshape_after_<Gemm>`, `copied_squeeze_after_...`)", "nothing to change"),
    Rule("fc-format-copy", "TensorRT 8.x, float build: a fully connected layer run as a 1x1 convolution on what convolutions or pooling "
         "computed gets their channel-vectorized format (FP16 `channel % 8`, TF32 channel-major); the shuffle back to the GEMM's shape reads "
         "linear memory, so a copy to linear runs between them (`Reformatting CopyNode for Input Tensor 0 to reshape_after_<Gemm>`)",
         f"{ISSUE_2136}; every 8.x float engine with such a head: the corpus' ResNet-18 and ResNet-50 FP32 and FP16, TensorRT issue 3679 (FP16)",
         "nothing to change: a NoOp copy when the channels fill the vector (an INT8 head's format varies: none predicted)"),
    Rule("pointwise-fusion", "adjacent pointwise ops no other layer takes run as one PointWise layer `PWN(...)`",
         f"{FC}: pointwise fusion", "nothing to change"),
    Rule("shuffle-layer", "a Transpose (or a data movement) outside Myelin that no neighbour absorbs runs as a Shuffle layer",
         f"{FC}: shuffle and shuffle", "nothing to change"),
    Rule("io-reformat", "a reduced-precision layer reading or writing an FP32 network input or output gets a Reformat layer converting it",
         "TensorRT Developer Guide, I/O formats (reformat-free I/O only where the I/O types match)", "declare FP16 I/O, or accept the copy"),
    Rule("myelin-scope", "TensorRT 10.x/11.x gives GEMMs, normalizations, softmax, reductions and the pointwise ops between them to Myelin; "
         "convolutions, pooling and resampling run as TensorRT layers outside it", f"{ISSUE_2576}; the MNIST TensorRT 10.16 engines of the corpus",
         "nothing to change: a convolution ends a Myelin region"),
    Rule("myelin-offload-8x", "TensorRT 8.x gives Myelin the network's non-convolution ops when the network has an attention pattern, else none",
         ISSUE_2576, "nothing to change"),
    Rule("myelin-convex", "a Myelin region never contains two ops with a layer outside the region between them: such a layer cuts it",
         "the engine runs its layers in one order (a region that fed a layer feeding itself could not run)", "see the rule of the layer that cuts it"),
    Rule("kernel-attention", "MatMul -> (scale) -> (mask Add) -> Softmax -> MatMul runs as one fused attention kernel (MHA, GQA, MQA)",
         f"{FA}", "nothing to change"),
    Rule("kernel-gemm-horizontal", "GEMMs reading one tensor with constant weights run as one GEMM kernel (`key+query+value`)",
         f"{FC}: horizontal fusion of layers on one input (`A || B`)", "nothing to change"),
    Rule("kernel-gemm-epilogue", "a GEMM kernel applies its bias and the pointwise ops computed only from its output (`Fc`: GEMM + bias + GELU)",
         f"{FC}: matrix multiply and bias / activation; pointwise fusion", "nothing to change"),
    Rule("kernel-reduction-prologue", "a normalization or reduction kernel computes the pointwise ops feeding only it (a residual Add, an "
         "embedding's gathers and sums, a GEMM's bias when the GEMM feeds it directly)", f"{FC}: reduction and normalization fusions",
         "nothing to change"),
    Rule("kernel-softmax", "a softmax outside attention runs in two passes: its statistics, then its normalization with the TopK/ArgMax "
         "that reads it", f"{FC}: SoftMax and TopK", "nothing to change"),
    Rule("kernel-index-cast", "TensorRT computes ArgMax/ArgMin/TopK indices in INT32; the parser casts an INT64 output (`ONNXTRT_castHelper`), "
         "a kernel of its own", PARSER, "nothing to change"),
    Rule("kernel-pointwise", "pointwise ops no GEMM, attention or reduction kernel takes run as one generated kernel per connected group",
         f"{FC}: pointwise fusion", "nothing to change"),
)}


def rule(rule_id: str) -> Rule:
    """A rule of either table: the Q/DQ rules (shared with the lint) or the fusion and Myelin rules."""
    return RULES.get(rule_id) or FUSION_RULES[rule_id]
