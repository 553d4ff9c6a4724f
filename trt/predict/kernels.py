"""TensorRT 10.x/11.x: the kernels Myelin cuts a region into (`kernel-*` rules of trt/predict/rules.py):
fused attention, GEMMs (side by side on one input) with their epilogue, normalizations and reductions with
their prologue (a softmax in two passes), the pointwise ops left over, and the cast of INT64 indices.
Data movement and Q/DQ run inside the kernel beside them."""

from __future__ import annotations

from pipeline.core.attention import SCORE_TO_SOFTMAX
from pipeline.core.graph import QDQ_OPS
from trt.predict.graph import Node, PredictGraph
from trt.predict.myelin import components
from trt.predict.parts import Group
from trt.predict.rules import GEMM_OPS, INDEX_OPS, MOVE_OPS, POINTWISE_OPS, REDUCTIONS, SOFTMAX_OPS

PASS_THROUGH = MOVE_OPS | QDQ_OPS  # no kernel of their own: they run in the kernel beside them
LOADS = POINTWISE_OPS | {"Gather"}  # what a reduction's prologue computes (an embedding's gathers too)
PROBABILITY_OPS = ("Cast", "Where", "IsNaN", "Dropout", "Identity", *QDQ_OPS)  # between a Softmax and the context MatMul


class Kernels:
    """The kernels of one Myelin region (its nodes in graph order), with the node -> kernel map."""

    def __init__(self, g: PredictGraph, region: list[str], scores: set[str]):
        self.g, self.region, self.inside = g, region, set(region)
        self.scores = scores  # the graph's attention score MatMuls
        self.kernels: list[Group] = []
        self.of: dict[str, Group] = {}

    def build(self) -> list[Group]:
        nodes = [self.g.by_name[name] for name in self.region]
        for node in nodes:
            if node.name in self.scores and node.name not in self.of:
                self._attention(node)
        self._gemms(nodes)
        for node in nodes:
            if node.op_type in REDUCTIONS and node.name not in self.of:
                self._reduction(node)
        for node in nodes:  # a GEMM's or a reduction's epilogue, in graph order
            if node.op_type in POINTWISE_OPS and node.name not in self.of and not self._only_feeds_reduction(node):
                self._epilogue(node)
        for kernel in [k for k in self.kernels if k.kind == "reduction"]:
            self._prologue(kernel)
        self._leftovers(nodes)
        self._pass_through(nodes)
        return sorted(self.kernels, key=lambda k: self.g.position[k.anchor])

    def _new(self, kind: str, names: list[str], anchor: str, type_: str, label: str) -> Group:
        kernel = Group(kind, [], anchor, type=type_, label=label)
        self.kernels.append(kernel)
        for name in names:
            self._add(kernel, name)
        return kernel

    def _add(self, kernel: Group, name: str) -> None:
        kernel.nodes.append(name)
        self.of[name] = kernel

    # ------------------------------------------------------------ anchors

    def _attention(self, scores: Node) -> None:
        """[FA] MatMul -> (scale) -> (mask Add) -> Softmax -> MatMul: one kernel."""
        g, chain, node = self.g, [scores.name], scores
        while True:
            readers = [r for r in g.consumers(node.output[0]) if r.name in self.inside]
            nxt = next((r for r in readers if r.op_type in (*SCORE_TO_SOFTMAX, *SOFTMAX_OPS, *PASS_THROUGH)), None)
            if nxt is None or len(chain) > 8:
                return
            chain.append(nxt.name)
            node = nxt
            if nxt.op_type in SOFTMAX_OPS:
                break
        frontier = [node]
        for _ in range(4):
            frontier = [r for n in frontier for t in n.output for r in g.consumers(t) if r.name in self.inside]
            chain += [n.name for n in frontier if n.op_type in (*PROBABILITY_OPS, "MatMul") and n.name not in chain]
            frontier = [n for n in frontier if n.op_type in PROBABILITY_OPS]
        self._new("attention", [n for n in self.region if n in chain], scores.name, "kgen", "_gemm_mha_v2")

    def _gemms(self, nodes: list[Node]) -> None:
        """GEMMs with constant weights reading one tensor: one kernel [FC: horizontal fusion]; others alone."""
        by_input: dict[str, Group] = {}
        for node in nodes:
            if node.op_type not in (*GEMM_OPS, "Einsum") or node.name in self.of:
                continue
            source = self._source(node.input[0]) if self.g.is_weighted(node) else None
            kernel = by_input.get(source) if source else None
            if kernel is None:
                kernel = self._new("gemm", [], node.name, "gemm", "")
                if source:
                    by_input[source] = kernel
            self._add(kernel, node.name)
            kernel.label = "+".join(kernel.nodes)

    def _reduction(self, node: Node) -> None:
        """A normalization or reduction: one kernel, a written-out one (mean, then variance) with the reduction
        before it; a softmax in two passes, the second with the TopK/ArgMax reading it [FC: SoftMax and TopK]."""
        upstream = self._reduction_behind(node)
        if upstream is not None:
            self._add(upstream, node.name)
            return
        self._new("reduction", [node.name], node.name, "kgen", "")
        if node.op_type not in SOFTMAX_OPS:
            return
        second = self._new("normalize", [], node.name, "kgen", "")
        second.nodes.append(node.name)  # the softmax runs in both passes
        readers = self._readers(node.output[0])
        if len(readers) == 1 and readers[0].op_type in INDEX_OPS:
            self._add(second, readers[0].name)

    def _reduction_behind(self, node: Node) -> Group | None:
        """The kernel of a reduction on the same rows this one reduces, reached through pointwise ops only: the mean
        of a written-out normalization before its variance (its input is reached too: `Sub(x, mean(x))`)."""
        frontier, tensors, found = list(self.g.computed(node)), set(), []
        for _ in range(12):
            nxt = []
            for tensor in frontier:
                producer = self.g.producer(tensor)
                if tensor in tensors or producer is None or producer.name not in self.inside:
                    continue
                tensors.add(tensor)
                if producer.op_type in REDUCTIONS and producer.op_type not in SOFTMAX_OPS and producer.name in self.of:
                    found.append(producer)
                elif producer.op_type in POINTWISE_OPS or producer.op_type in PASS_THROUGH:
                    nxt += self.g.computed(producer)
            frontier = nxt
        return next((self.of[r.name] for r in found if r.input[0] in tensors), None)

    # ------------------------------------------------------------ what joins an anchor

    def _epilogue(self, node: Node) -> None:
        """A pointwise op on one GEMM's or reduction's kernel output joins it, its other inputs constants or tensors
        computed before that kernel starts (a residual: `GEMM + bias + Add`) [`kernel-gemm-epilogue`]."""
        origins = [self._origin(t) for t in self.g.computed(node)]
        kernels = {self.of[o] for o in origins if o in self.of and self.of[o].kind in ("gemm", "reduction", "normalize")}
        if not kernels:
            return
        kernel = max(kernels, key=self._start)  # the freshest output; every other input is ready before it starts
        if all(o is None or self.of.get(o) is kernel or self.g.position[o] < self._start(kernel) for o in origins):
            self._add(kernel, node.name)
            if kernel.kind == "gemm" and node.op_type != "Add":
                kernel.type, kernel.label = "fusion", "__myl_Fc"

    def _prologue(self, kernel: Group) -> None:
        """The pointwise ops (and gathers) feeding only this reduction kernel join it; a Gemm (bias inside) that
        feeds it directly has its bias added there [`kernel-reduction-prologue`]."""
        own = set(self.g.computed(self.g.by_name[kernel.anchor]))
        frontier = [t for name in list(kernel.nodes) for t in self.g.computed(self.g.by_name[name])]
        for _ in range(256):
            if not frontier:
                break
            tensor = frontier.pop()
            producer = self.g.producer(tensor)
            if producer is None or producer.name not in self.inside:
                continue
            if producer.name in self.of:
                if tensor in own and producer.op_type == "Gemm" and len(producer.input) > 2 and self.of[producer.name].kind == "gemm":
                    kernel.extra.append(producer.name)
                continue
            if producer.op_type in PASS_THROUGH:
                frontier += self.g.computed(producer)
            elif producer.op_type in LOADS and all(self.of.get(r.name) is kernel for r in self._readers(producer.output[0])):
                self._add(kernel, producer.name)
                frontier += self.g.computed(producer)

    def _leftovers(self, nodes: list[Node]) -> None:
        """Pointwise ops no kernel took: one generated kernel per connected group [`kernel-pointwise`]."""
        left = {n.name for n in nodes if n.name not in self.of and n.op_type not in PASS_THROUGH}
        for group in components(self.g, left):
            self._new("pointwise", group, group[0], "kgen", "")
        for node in nodes:
            if node.op_type in INDEX_OPS and node.name in self.of:  # [PARSER] INT64 indices cast by a kernel of their own
                self._new("cast", [], node.name, "kgen", "__myl_CastReshCast")

    def _pass_through(self, nodes: list[Node]) -> None:
        """Data movement and Q/DQ go into the kernel of their producer (a DQ: of its reader), else the other side's;
        a chain of them (a KV cache's Concat, then its Transpose) settles in a few passes."""
        for _ in range(4):
            left = [n for n in nodes if n.name not in self.of and n.op_type in PASS_THROUGH]
            for node in left:
                producer = self.g.producer(node.input[0]) if node.input else None
                readers = [r for t in node.output for r in self.g.consumers(t) if r.name in self.of]
                home = self.of.get(producer.name) if producer is not None and node.op_type != "DequantizeLinear" else None
                home = home or (self.of[readers[0].name] if readers else None) or (self.of.get(producer.name) if producer is not None else None)
                if home is not None:
                    self._add(home, node.name)
            if all(n.name in self.of for n in left):
                return

    # ------------------------------------------------------------ helpers

    def _start(self, kernel: Group) -> int:
        return min(self.g.position[name] for name in kernel.nodes)

    def _source(self, tensor: str) -> str:
        """The tensor behind data movement and Q/DQ: GEMMs reading it through them read the same data."""
        for _ in range(8):
            producer = self.g.producer(tensor)
            if producer is None or producer.op_type not in PASS_THROUGH or not producer.input:
                return tensor
            tensor = producer.input[0]
        return tensor

    def _origin(self, tensor: str) -> str | None:
        """The node that computes `tensor`, behind data movement and Q/DQ."""
        producer = self.g.producer(self._source(tensor))
        return producer.name if producer is not None else None

    def _readers(self, tensor: str) -> list[Node]:
        """The readers of `tensor`, looking through data movement and Q/DQ, each once: every data movement node is
        walked once (paths that split and join again, a Split's outputs concatenated back, would be walked once
        per path: exponential in the number of such diamonds in a row, bailing_hybrid's)."""
        found: dict[str, Node] = {}
        walked: set[str] = set()
        tensors = [tensor]
        while tensors:
            for reader in self.g.consumers(tensors.pop()):
                if reader.op_type in PASS_THROUGH and reader.name in self.inside:
                    if reader.name not in walked:
                        walked.add(reader.name)
                        tensors.extend(reader.output)
                else:
                    found.setdefault(reader.name, reader)
        return list(found.values())

    def _only_feeds_reduction(self, node: Node) -> bool:
        """Every reader is a normalization or reduction outside attention: the op is that kernel's prologue."""
        readers = [r for t in node.output for r in self._readers(t)]
        return bool(readers) and all(r.op_type in REDUCTIONS and r.name in self.inside and self.of.get(r.name, Group("", [], "")).kind != "attention"
                                     for r in readers)


def label(g: PredictGraph, kernel: Group) -> str:
    """A kernel's name stem as Myelin writes it: the GEMMs' names, or `__myl_` and its ops."""
    if kernel.label:
        return kernel.label
    ops = "".join(g.by_name[name].op_type[:4].capitalize() for name in kernel.nodes if g.by_name[name].op_type not in PASS_THROUGH)
    return f"__myl_{ops[:48] or 'Copy'}"
