"""Where each Q and DQ goes in the engine [EQ]: into the layer reading the weight, the GEMM or convolution it
feeds, the producer it quantizes (a Q moving back over max pooling and reshapes), a Myelin kernel, or a layer of
its own with the rule that keeps it there (the lint's rejections, pipeline/core/qdq.py `QdqGraph.rejection`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.core.graph import INT4_TYPES, QDQ_OPS
from pipeline.core.qdq import FUSED_ATTENTION_HEAD_SIZES, FUSED_ATTENTION_MAX_SEQUENCE, PlacementRules
from trt.predict.graph import Node, PredictGraph
from trt.predict.parts import Group, Reason
from trt.predict.rules import MOVE_OPS

MAX_HOPS = 8  # reshapes and poolings a Q moves back over, DQ readers looked through
INT4_READERS = ("MatMul", "Gemm", "Gather", "Transpose", "Reshape", "Cast")  # [EQ] INT4 weights go to GEMMs (and Gather)


@dataclass
class Fate:
    kind: str  # "weight", "absorbed", "standalone", "merged"
    into: str | None = None  # the node whose layer takes it (weight, absorbed), or the Q/DQ it merged with
    rule: str | None = None  # standalone: why
    cause: str | None = None  # standalone: the node that keeps it there


@dataclass
class Quantization:
    fates: dict[str, Fate] = field(default_factory=dict)
    int8: set[str] = field(default_factory=set)  # compute nodes that run quantized (pooling moved between a DQ and a Q)
    reasons: list[Reason] = field(default_factory=list)

    def root(self, name: str) -> Fate:
        """The fate of `name`, or of the Q/DQ it merged with."""
        fate = self.fates[name]
        return self.fates[fate.into] if fate.kind == "merged" else fate


class Placement:
    """The fates of a graph's Q/DQ nodes, given the standard layers (`owner`) and the Myelin candidates."""

    def __init__(self, g: PredictGraph, rules: PlacementRules, owner: dict[str, Group], myelin: set[str], max_sequence: int | None):
        self.g, self.rules, self.owner, self.myelin = g, rules, owner, myelin
        self.result = Quantization()
        self.attention = _attention_matmuls(g, max_sequence) if any(n.op_type in QDQ_OPS for n in g.nodes) else {}

    def run(self) -> Quantization:
        g, fates = self.g, self.result.fates
        for name in g.weight_qdq:
            fates[name] = Fate("weight", into=self._weight_reader(g.by_name[name]))
        kept: dict[tuple, str] = {}
        qs = [n for n in g.nodes if n.op_type == "QuantizeLinear" and n.name not in fates]
        for q in qs:
            first = kept.setdefault(self._key(q), q.name)
            if first != q.name:
                fates[q.name] = Fate("merged", into=first)  # [EQ]: identical Q nodes on one tensor are one
        for q in qs:
            if q.name not in fates:
                fates[q.name] = self._q_fate(q.input[0], self._same_as(q))
        for dq in (n for n in g.nodes if n.op_type == "DequantizeLinear" and n.name not in fates):
            fates[dq.name] = self._dq_fate(dq)
        self._merge_standalone_dqs()
        self._float_reasons()
        return self.result

    # ------------------------------------------------------------ Q: fused into its producer, or standalone

    def _same_as(self, q: Node) -> set[str]:
        """`q` and the identical Qs merged with it."""
        merged = {n.name for n in self.g.consumers(q.input[0]) if (fate := self.result.fates.get(n.name)) is not None and fate.into == q.name}
        return merged | {q.name}

    def _key(self, q: Node) -> tuple:
        values = tuple(_value(self.g, t) for t in q.input[1:])
        axis = tuple((a.name, a.i) for a in q.attribute)
        return (q.input[0], values, axis)

    def _q_fate(self, tensor: str, qs: set[str], hops: int = 0) -> Fate:
        g = self.g
        producer = g.producer(tensor)
        if producer is None:
            return Fate("standalone", rule="qdq-network-input" if tensor in g.input_types else "qdq-not-absorbed", cause=tensor)
        others = [r for r in g.consumers(tensor) if r.name not in qs and r.name not in g.folded]  # a Shape reads no value
        if producer.name in self.myelin and all(r.name in self.myelin for r in others):
            return Fate("absorbed", into=producer.name)  # a Myelin kernel writes the quantized tensor too
        if others:
            return self._beside_float(tensor, others)
        group = self.owner.get(producer.name)
        if group is not None and group.output == tensor and group.kind in ("conv", "fc"):
            return self._q_after_gemm(group)
        if hops < MAX_HOPS and (producer.op_type == "MaxPool" or producer.name in g.erased):
            upstream = self._q_fate(producer.input[0], qs | {producer.name}, hops + 1)  # [EQ]: Q moves back over commuting ops
            if upstream.kind == "absorbed":
                self.result.int8.add(producer.name)
                return upstream
            if producer.name in g.erased:
                return upstream  # a reshape computes nothing: the reason lies before it
        if self._runs_int8(producer):
            self.result.int8.add(producer.name)
            return Fate("absorbed", into=producer.name)  # DQ -> op -> Q: a quantizable op in INT8 [EQ figures 1, 8]
        return Fate("standalone", rule="q-after-float-op", cause=producer.name)

    def _beside_float(self, tensor: str, readers: list[Node]) -> Fate:
        for reader in readers:
            group = self.owner.get(reader.name)
            if group is not None and group.residual == tensor:
                return Fate("standalone", rule="residual-skip-not-quantized", cause=reader.name)
        return Fate("standalone", rule="q-beside-float-reader", cause=readers[0].name)

    def _q_after_gemm(self, group: Group) -> Fate:
        anchor = self.g.by_name[group.anchor]
        if self._dq_before(anchor.input[0]) is None:
            return Fate("standalone", rule="q-after-float-op", cause=group.anchor)
        if group.residual is not None and self._dq_before(group.residual) is None:
            add = next(n for n in group.nodes if self.g.by_name[n].op_type == "Add" and group.residual in self.g.by_name[n].input)
            return Fate("standalone", rule="residual-skip-not-quantized", cause=add)
        group.int8_out = True
        return Fate("absorbed", into=group.anchor)

    def _runs_int8(self, node: Node) -> bool:
        """A quantizable op outside Myelin whose every computed input is dequantized."""
        computed = self.g.computed(node)
        return node.name not in self.myelin and bool(computed) and all(self._dq_before(t) is not None for t in computed)

    def _dq_before(self, tensor: str) -> Node | None:
        """The activation DQ `tensor` comes from, directly or through reshapes and max pooling (a DQ moves forward over them)."""
        g = self.g
        for _ in range(MAX_HOPS):
            pair = g.quantized_activation(tensor)
            if pair is not None:
                return pair[1]
            node = g.producer(tensor)
            if node is None or not (node.name in g.erased or node.op_type == "MaxPool"):
                return None
            tensor = node.input[0]
        return None

    # ------------------------------------------------------------ DQ: fused into its readers, or standalone

    def _dq_fate(self, dq: Node) -> Fate:
        g = self.g
        pair = g.quantized_activation(dq.output[0])
        source = pair[0].input[0] if pair else dq.input[0]
        into = None
        for reader, tensor in self._readers(dq.output[0]):
            rule = g.rejection(self.rules, source, reader, tensor) or self._dq_rule(reader, tensor)
            if rule is not None:
                return Fate("standalone", rule=rule, cause=self._float_cause(reader) if rule == "residual-dq-float-output" else reader.name)
            into = into or reader.name
        return Fate("absorbed", into=into)

    def _readers(self, tensor: str, hops: int = 0) -> list[tuple[Node, str]]:
        """The readers of a dequantized tensor, looking through the reshapes TensorRT erases (the DQ moves after them)."""
        found = []
        for reader in self.g.consumers(tensor):
            if reader.name in self.g.folded:
                continue  # a Shape reads no value
            if reader.name in self.g.erased and hops < MAX_HOPS:
                found += self._readers(reader.output[0], hops + 1)
            else:
                found.append((reader, tensor))
        return found

    def _dq_rule(self, reader: Node, tensor: str) -> str | None:
        """Why `reader` cannot take the dequantized `tensor` (None: it takes it)."""
        g = self.g
        if reader.name in self.attention:
            return None if self.attention[reader.name] else "attention-not-fusable"
        group = self.owner.get(reader.name)
        if group is not None and group.kind in ("conv", "fc") and reader.name == group.anchor:
            group.int8_in = True
            return None
        if group is not None and group.residual == tensor:
            return None if group.int8_out else "residual-dq-float-output"
        if reader.name in self.myelin or (g.is_weighted(reader) and tensor == reader.input[0]):
            return None
        if reader.op_type == "Concat" and self._unequal_scales(reader):
            return "concat-unequal-scales"
        if reader.name in self.result.int8 or (reader.op_type in MOVE_OPS and reader.op_type != "Transpose"):
            return None
        return "qdq-not-absorbed"

    def _float_cause(self, add: Node) -> str:
        """What keeps a residual block's output in float: the first reader of its output that is not a Q."""
        group = self.owner[add.name]
        readers = [r for r in self.g.consumers(group.output) if r.op_type != "QuantizeLinear"]
        return readers[0].name if readers else add.name

    def _unequal_scales(self, concat: Node) -> bool:
        scales = {_value(self.g, pair[1].input[1]) for t in concat.input if (pair := self.g.dequantized_through(t))}
        return len(scales) > 1

    def _weight_reader(self, node: Node) -> str | None:
        """The layer a weight's Q/DQ goes into: the first reader past the weight's Q/DQ chain."""
        tensor = node.output[0]
        for _ in range(MAX_HOPS):
            readers = self.g.consumers(tensor)
            if not readers:
                return None
            if readers[0].name not in self.g.weight_qdq:
                return readers[0].name
            tensor = readers[0].output[0]
        return None

    def _merge_standalone_dqs(self) -> None:
        """DQs of one merged Q that all run standalone are one layer."""
        fates, seen = self.result.fates, {}
        for dq in (n for n in self.g.nodes if n.op_type == "DequantizeLinear"):
            fate = fates[dq.name]
            q = self.g.producer(dq.input[0])
            if fate.kind != "standalone" or q is None or q.op_type != "QuantizeLinear":
                continue
            root = fates[q.name].into if fates[q.name].kind == "merged" else q.name
            first = seen.setdefault(root, dq.name)
            if first != dq.name:
                fates[dq.name] = Fate("merged", into=first)


    # ------------------------------------------------------------ layers left in float (the lint's other findings)

    def _float_reasons(self) -> None:
        g, reasons = self.g, self.result.reasons
        standalone = {(f.rule, f.cause) for f in self.result.fates.values() if f.kind == "standalone"}
        for add, gemms, _ in g.float_skips(self.rules):  # the lint's residual-skip question (pipeline/core/qdq.py)
            if ("residual-skip-not-quantized", add.name) not in standalone:
                reasons.append(Reason("float", "residual-skip-not-quantized", add.name, layer=gemms[-1].name))
        for node in g.nodes:
            reasons += self._node_reasons(node)

    def _node_reasons(self, node: Node) -> list[Reason]:
        """conv-weight-only, weight-without-dq, concat-unequal-scales, int4-*: what runs in float, or is not fused."""
        g, found = self.g, []
        if node.op_type in ("Conv", "ConvTranspose") and len(node.input) > 1 and g.op(node.input[1]) == "DequantizeLinear":
            if self._dq_before(node.input[0]) is None:
                found.append(Reason("float", "conv-weight-only", node.name, layer=node.name))
        if node.op_type in ("MatMul", "Gemm", "Conv", "ConvTranspose") and len(node.input) > 1 and self._dq_before(node.input[0]) is not None:
            if g.constant(node.input[1]) is not None:
                found.append(Reason("float", "weight-without-dq", node.name, layer=node.name))
        if node.op_type == "Concat" and self._unequal_scales(node):
            found.append(Reason("float", "concat-unequal-scales", node.name, layer=node.name))
        if node.op_type == "QuantizeLinear" and len(node.input) > 2 and g.initializer_type(node.input[2]) in INT4_TYPES and g.constant(node.input[0]) is None:
            found.append(Reason("float", "int4-activation", node.name, layer=node.name))
        if node.op_type == "DequantizeLinear" and g.initializer_type(node.input[0]) in INT4_TYPES:
            found += [Reason("float", "int4-not-gemm", r.name, layer=r.name) for r in g.consumers(node.output[0]) if r.op_type not in INT4_READERS]
        return found


def _value(g: PredictGraph, tensor: str):
    value = g.constant(tensor) if tensor else None
    return None if value is None else tuple(value.reshape(-1).tolist())


def _attention_matmuls(g: PredictGraph, max_sequence: int | None) -> dict[str, bool]:
    """Each attention MatMul (scores and context) -> whether fused INT8 attention takes its Q/DQ [FA]."""
    found = {}
    for matmul, head, sequence in g.attention():
        seq = max_sequence or sequence
        fusable = (head is None or head in FUSED_ATTENTION_HEAD_SIZES) and (seq is None or seq <= FUSED_ATTENTION_MAX_SEQUENCE)
        found[matmul.name] = fusable
        for context in _context_matmuls(g, matmul):
            found[context.name] = fusable
    return found


def _context_matmuls(g: PredictGraph, scores: Node) -> list[Node]:
    """The MatMuls reading the Softmax the score MatMul feeds (probabilities x V)."""
    frontier, found = [scores], []
    for _ in range(6):
        frontier = [r for n in frontier for t in n.output for r in g.consumers(t)]
        found += [n for n in frontier if n.op_type == "MatMul" and n is not scores]
        frontier = [n for n in frontier if n.op_type not in ("MatMul",)]
    return found
