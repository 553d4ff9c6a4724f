"""The predicted engine as the plan a real engine is read into (trt/plan.py): layers named and typed as TensorRT
names them, with the layers TensorRT adds, and the reasons for every standalone Q/DQ layer, layer left in float
and Myelin region boundary."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.graph import QDQ_OPS
from trt.plan import MAPPING_METADATA, EnginePlan, Layer
from trt.predict import kernels
from trt.predict.engine import Built
from trt.predict.graph import PredictGraph
from trt.predict.parts import Group, Reason

LAYER_TYPES = {"conv": "CaskConvolution", "fc": "CaskConvolution", "pool": "CaskPooling", "resize": "Resize", "scale": "Scale",
               "pointwise": "PointWise", "shuffle": "Shuffle", "softmax": "SoftMax", "norm": "Normalization", "reduce": "Reduce",
               "matmul": "MatrixMultiply", "qdq": "Reformat", "myelin": "Myelin"}


@dataclass(frozen=True)
class Target:
    """What the prediction is for: the TensorRT version, the precision asked for, and what follows from it."""

    trt_major: int
    precision: str  # as asked: auto (the ONNX's own types: a strongly typed build), fp32, fp16, int8, fp8, best
    typed: bool  # strongly typed: each tensor's precision is the ONNX's
    float_precision: str  # what float layers run in: FP32, FP16, BF16
    quantized: str | None  # INT8 or FP8 when the ONNX has activation Q/DQ
    weight_only: tuple[str, int] | None = None  # (stored type, GEMMs) of weight-only quantization (INT4 AWQ)

    @property
    def label(self) -> str:
        """The engine's precision as the prediction states it: FP32, "FP16 with INT4 weights", INT8, ..."""
        weights = f" with {self.weight_only[0]} weights" if self.weight_only else ""
        return self.quantized or f"{self.float_precision}{weights}"


def target_of(g: PredictGraph, precision: str, trt_major: int) -> Target:
    typed = precision == "auto"
    floats = g.float_type() if typed else "FP16" if precision in ("fp16", "best", "int8", "fp8") else "FP32"
    if not typed and precision in ("int8", "fp8") and g.quantized_type() is None:
        floats = "FP32"
    return Target(trt_major, precision, typed, floats, g.quantized_type(), g.weight_only())


class Assembly:
    def __init__(self, g: PredictGraph, built: Built, target: Target):
        self.g, self.built, self.target = g, built, target
        self.layers: list[Layer] = []
        self.layer_of: dict[str, Layer] = {}
        self.reasons: list[Reason] = []

    def plan(self, source: str) -> tuple[EnginePlan, list[Reason]]:
        items = [(self.g.position[group.anchor], 0, group) for group in self.built.groups]
        items += [(min(self.g.position[n] for n in nodes), 1, index) for index, nodes in enumerate(self.built.region_nodes)]
        for _, kind, item in sorted(items, key=lambda i: (i[0], i[1])):
            if kind == 0:
                self._group(item)
            else:
                for number, kernel in enumerate(self.built.regions[item]):
                    self._kernel(kernel, item, number)
        self._io_reformats()
        self._reasons()
        target = self.target
        fmt = f"prediction from the ONNX (TensorRT {target.trt_major}.x, {target.label}{', strongly typed' if target.typed else ''})"
        return EnginePlan(source, fmt, "detailed", self.layers).settle(), self.reasons

    # ------------------------------------------------------------ layers

    def _add(self, layer: Layer, nodes: list[str]) -> None:
        layer.mapping = MAPPING_METADATA
        self.layers.append(layer)
        for name in nodes:
            self.layer_of.setdefault(name, layer)

    def _group(self, group: Group) -> None:
        g = self.g
        if group.kind == "qdq":
            precision = self._precision(g.by_name[group.anchor].op_type == "QuantizeLinear")
            self._add(Layer(group.anchor, "Reformat", list(group.nodes), origin="QDQ", precision=precision), group.nodes)
            return
        compute = [n for n in group.nodes if g.by_name[n].op_type not in QDQ_OPS] or group.nodes
        name = f"PWN({', '.join(compute)})" if group.kind == "pointwise" else " + ".join(compute)
        layer_type = LAYER_TYPES.get(group.kind, g.by_name[group.anchor].op_type)
        quantized = group.int8_in or group.anchor in self.built.quantization.int8
        self._add(Layer(name, layer_type, list(group.nodes), precision=self._precision(quantized)), group.nodes)
        if group.kind == "fc":  # [PARSER] 8.x: the 1x1 convolution's output shuffled back to the GEMM's shape
            if not quantized:
                self._fc_format_copy(group)
            self._add(Layer(f"reshape_after_{group.anchor}", "NoOp", [], precision=self._precision(quantized)), [])

    def _fc_format_copy(self, group: Group) -> None:
        """[`fc-format-copy`] A float fully connected layer on what convolutions or pooling computed writes their
        vectorized format; the shuffle after it reads linear memory: a copy between them."""
        gemm = self.g.by_name[group.anchor]
        source = self._producing_layer(self.g.computed(gemm)[0]) if self.g.computed(gemm) else None
        if source is None or source.type not in ("CaskConvolution", "CaskPooling"):
            return
        name = f"Reformatting CopyNode for Input Tensor 0 to reshape_after_{group.anchor}"
        self._add(Layer(name, "NoOp", [], origin="REFORMAT", precision=self.target.float_precision), [])
        self.reasons.append(Reason("copy", "fc-format-copy", group.anchor, layer=name))

    def _precision(self, quantized: bool) -> str:
        return (self.target.quantized or "INT8") if quantized else self.target.float_precision

    def _kernel(self, kernel: Group, region: int, number: int) -> None:
        g = self.g
        weights = [n for n, f in self.built.quantization.fates.items() if f.kind == "weight" and f.into in kernel.nodes]
        nodes = sorted(set(kernel.nodes + weights), key=g.position.__getitem__) + [n for n in kernel.extra if n not in kernel.nodes]
        precision = self._precision(any(g.by_name[n].op_type == "DequantizeLinear" for n in kernel.nodes))
        if kernel.kind == "myelin":  # 8.x: the region is one layer
            name = f"{{ForeignNode[{kernel.nodes[0]}...{kernel.nodes[-1]}]}}"
            layer = Layer(name, "Myelin", nodes, precision=precision, myelin_graph=region, foreign_range=(kernel.nodes[0], kernel.nodes[-1]))
        else:
            layer = Layer(f"{kernels.label(g, kernel)}_myl{region}_{number}", kernel.type or "kgen", nodes, precision=precision, myelin_graph=region)
        self._add(layer, nodes)

    def _io_reformats(self) -> None:
        """[`io-reformat`] A weakly typed FP16/BF16 build converts FP32 network inputs and outputs in Reformat layers;
        a Myelin region's are named after the region, before its first kernel or after its last."""
        if self.target.typed or self.target.float_precision == "FP32":
            return
        for tensor, onnx_type in self.g.input_types.items():
            readers = [self.layer_of[r.name] for r in self.g.consumers(tensor) if r.name in self.layer_of]
            if onnx_type == 1 and readers and readers[0].origin != "QDQ":
                at, name = self._place_of(readers[0], first=True)
                self.layers.insert(at, Layer(f"Reformatting CopyNode for Input Tensor 0 to {name}", "Reformat", [], origin="REFORMAT",
                                             precision=readers[0].precision, mapping=MAPPING_METADATA))
        for tensor, onnx_type in self.g.output_types.items():
            producer = self._producing_layer(tensor)
            if onnx_type == 1 and producer is not None and producer.precision in ("FP16", "BF16"):
                at, name = self._place_of(producer, first=False)
                while at < len(self.layers) and self.layers[at].type == "NoOp":  # an 8.x FC's copy and shuffle come first
                    at, name = at + 1, self.layers[at].name
                self.layers.insert(at, Layer(f"Reformatting CopyNode for Output Tensor 0 to {name}", "Reformat", [], origin="REFORMAT",
                                             precision="FP32", mapping=MAPPING_METADATA))

    def _place_of(self, layer: Layer, first: bool) -> tuple[int, str]:
        """Where a reformat of `layer`'s input (`first`) or output goes, and the name it takes: a Myelin kernel's
        are its region's, `{ForeignNode[first...last]}`."""
        if not layer.myelin or layer.type == "Myelin":
            index = self.layers.index(layer)
            return (index if first else index + 1), layer.name
        kernels = [i for i, other in enumerate(self.layers) if other.myelin_graph == layer.myelin_graph]
        nodes = self.built.region_nodes[layer.myelin_graph]
        return (kernels[0] if first else kernels[-1] + 1), f"{{ForeignNode[{nodes[0]}...{nodes[-1]}]}}"

    def _producing_layer(self, tensor: str) -> Layer | None:
        for _ in range(8):
            node = self.g.producer(tensor)
            if node is None:
                return None
            if node.name in self.layer_of:
                return self.layer_of[node.name]
            tensor = node.input[0] if node.input else ""
        return None

    # ------------------------------------------------------------ reasons

    def _reasons(self) -> None:
        fates = self.built.quantization.fates
        for layer in self.layers:
            if layer.origin == "QDQ":
                fate = fates[layer.name]
                self.reasons.append(Reason("standalone", fate.rule, fate.cause, layer=layer.name))
        self.reasons += self.built.quantization.reasons
        self._boundaries()

    def _boundaries(self) -> None:
        """Each Myelin region's edges to layers outside it: the rule of the layer that cuts or bounds it."""
        g, fates = self.g, self.built.quantization.fates
        scope = "myelin-scope" if self.target.trt_major >= 10 else "myelin-offload-8x"
        for index, nodes in enumerate(self.built.region_nodes):
            inside, seen = set(nodes), set()
            for name in nodes:
                node = g.by_name[name]
                neighbours = [g.producer(t) for t in g.computed(node)] + [r for t in node.output for r in g.consumers(t)]
                for other in neighbours:
                    if other is None or other.name in inside or other.name not in self.layer_of:
                        continue
                    layer = self.layer_of[other.name]
                    if layer.myelin:
                        continue  # two regions meet where a layer outside both cut them: that layer's reason says why
                    if layer.origin == "QDQ":
                        fate = fates[layer.name]
                        key = ("cut", fate.rule, fate.cause, layer.name)
                        reason = Reason("cut", fate.rule, fate.cause, layer=layer.name, region=index)
                    else:
                        key = ("boundary", scope, other.name)
                        reason = Reason("boundary", scope, other.name, layer=layer.name, region=index)
                    if key not in seen:
                        seen.add(key)
                        self.reasons.append(reason)
