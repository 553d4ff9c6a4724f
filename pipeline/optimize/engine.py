"""The rule engine: rules are tried on every node, by priority, each priority to a fixed point.

A rule (onnxscript's model: pattern / check / rewrite) names the op type its pattern is
anchored at; `check` returns the bound values, or a string saying why it does not apply;
`rewrite` edits the graph through `Context`, which counts the nodes it adds and removes.

Rules see the main graph only: the bodies of If/Loop/Scan are written back as they were read
(with the types shape inference found), never rewritten. A main-graph rewrite still reaches
into them through values they read from the outer scope, which onnx_ir rewires with every use.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import numpy as np
import onnx_ir as ir

CLEANUP, FUSION, PLACEMENT = 0, 1, 2
PRIORITY_NAMES = {CLEANUP: "cleanup", FUSION: "fusion", PLACEMENT: "placement"}
MAX_PASSES = 20


class Rule:
    """Subclasses set `name`, `anchor` (op type), `priority`, `min_opset`; implement check and rewrite."""

    name: ClassVar[str]
    anchor: ClassVar[str]
    priority: ClassVar[int] = FUSION
    min_opset: ClassVar[int] = 1

    def check(self, node: ir.Node, ctx: Context) -> dict[str, Any] | str:
        raise NotImplementedError

    def rewrite(self, node: ir.Node, bound: dict[str, Any], ctx: Context) -> None:
        raise NotImplementedError


@dataclass
class RuleStats:
    rule: str
    priority: str
    tried: int = 0
    applied: int = 0
    nodes_added: int = 0
    nodes_removed: int = 0
    seconds: float = 0.0
    why_not: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"seconds": round(self.seconds, 5), "why_not": dict(self.why_not.most_common(3))}


class Context:
    """The graph being rewritten, plus helpers every rule uses."""

    def __init__(self, model: ir.Model):
        self.model = model
        self.graph = model.graph
        self.opset = model.opset_imports.get("", 1)
        self.added = 0
        self.removed = 0
        self.history: list[str] = []  # rule names in the order their rewrites were applied
        self.touched: dict[str, str] = {}  # node name -> the rule that last rewrote or rewired it
        self.initializers_are_inputs = model.ir_version < 4  # IR 3 lists every initializer among the graph inputs
        self._inputs_added: set[ir.Value] = set()  # the initializers the rules listed as inputs (IR 3)
        self._names = {n.name for n in self.graph if n.name} | {v.name for v in _values(self.graph) if v.name}

    # ---- reading the graph
    def producer(self, value: ir.Value | None, op_type: str | None = None) -> ir.Node | None:
        node = value.producer() if value is not None else None
        if node is None or (op_type is not None and (node.op_type != op_type or node.domain not in ("", "ai.onnx"))):
            return None
        return node

    @staticmethod
    def const(value: ir.Value | None) -> np.ndarray | None:
        """The value as a numpy array when it is an initializer or a Constant's output."""
        if value is None:
            return None
        tensor = ir.convenience.get_const_tensor(value)
        return None if tensor is None else tensor.numpy()

    def scalar(self, value: ir.Value | None) -> float | None:
        array = self.const(value)
        return float(array.reshape(-1)[0]) if array is not None and array.size == 1 else None

    @staticmethod
    def only_used_by(value: ir.Value, nodes: set[ir.Node]) -> bool:
        """True when every use of `value` is by one of `nodes` and it is no graph output."""
        return not value.is_graph_output() and all(use.node in nodes for use in value.uses())

    @staticmethod
    def same_dim(a: object, b: object) -> bool:
        """Equal static sizes, or the same named symbolic dim (unnamed dims are never equal)."""
        if isinstance(a, int) or isinstance(b, int):
            return a == b
        name_a, name_b = getattr(a, "value", None), getattr(b, "value", None)
        return name_a is not None and name_a == name_b

    @staticmethod
    def static_shape(value: ir.Value | None) -> tuple[int, ...] | None:
        if value is None or value.shape is None:
            return None
        dims = tuple(value.shape)
        return dims if all(isinstance(d, int) for d in dims) else None

    # ---- editing the graph
    def unique_name(self, base: str) -> str:
        name, i = base, 0
        while name in self._names:
            i += 1
            name = f"{base}_{i}"
        self._names.add(name)
        return name

    def fused_node(self, op_type: str, inputs: list[ir.Value], attributes: dict[str, Any], replacing: ir.Node) -> ir.Node:
        """An `op_type` node in the scope of the node it replaces ("/m/Div" -> "/m/Gelu"), with its metadata."""
        scope = replacing.name.rsplit("/", 1)[0] + "/" if "/" in replacing.name else ""
        return ir.node(op_type, inputs, attributes, name=self.unique_name(scope + op_type), metadata_props=dict(replacing.metadata_props))

    def initializer(self, array: np.ndarray, base: str) -> ir.Value:
        return self._add_initializer(ir.tensor(array), base)

    def lazy_initializer(self, compute, dtype: ir.DataType, shape: tuple[int, ...], base: str) -> ir.Value:
        """An initializer whose data `compute()` produces when the model is serialized."""
        return self._add_initializer(ir.LazyTensor(compute, dtype, ir.Shape(shape)), base)

    def _add_initializer(self, tensor: ir.TensorProtocol, base: str) -> ir.Value:
        value = ir.Value(name=self.unique_name(base), const_value=tensor)
        value.shape, value.dtype = ir.Shape(tensor.shape), tensor.dtype
        self.graph.register_initializer(value)
        if self.initializers_are_inputs:
            self.graph.inputs.append(value)
            self._inputs_added.add(value)
        return value

    def replace(self, old_nodes: list[ir.Node], new_nodes: list[ir.Node], old_values: list[ir.Value], new_values: list[ir.Value]) -> None:
        """Put `new_nodes` where the node producing the last old value was, rewire `old_values` to
        `new_values`, drop the old nodes. O(size of the pattern): the graph is sorted once at the end
        of `run_rules`, so no position in the whole graph is looked up here."""
        for old, new in zip(old_values, new_values, strict=True):
            if new.shape is None and old.shape is not None:
                new.shape = old.shape
            if new.type is None and old.type is not None:
                new.type = old.type
        anchor = old_values[-1].producer() if old_values and old_values[-1].producer() in old_nodes else old_nodes[-1]
        ir.convenience.replace_nodes_and_values(self.graph, anchor, old_nodes, new_nodes, old_values, new_values)
        self.added += len(new_nodes)
        self.removed += len(old_nodes)

    def bypass(self, node: ir.Node, source: ir.Value) -> None:
        """Remove a single-output node whose output equals `source`. A graph output keeps its name, type
        and shape: the producer of `source` then writes it directly."""
        out = node.outputs[0]
        if out.is_graph_output():
            out.replace_all_uses_with(source, replace_graph_outputs=True)
            source.name, out.name = out.name, None
            source.type = out.type or source.type
            source.shape = out.shape if out.shape is not None else source.shape
        else:
            out.replace_all_uses_with(source)
        self.graph.remove(node, safe=True)
        self.removed += 1

    def remove_unused(self) -> int:
        """Drop nodes whose outputs nobody uses (not graph outputs) and initializers nobody reads."""
        removed = 0
        outputs = set(self.graph.outputs)
        for node in reversed(list(self.graph)):
            if all(not v.uses() and v not in outputs for v in node.outputs):
                self.graph.remove(node, safe=True)
                removed += 1
        unused_added = {v for v in self._inputs_added if not v.uses() and v not in outputs}
        if unused_added:  # a fold's intermediate result in IR 3: no user fed it, none can use it
            self.graph.inputs[:] = [v for v in self.graph.inputs if v not in unused_added]
            self._inputs_added -= unused_added
        for name, value in list(self.graph.initializers.items()):
            if not value.uses() and value not in outputs and not value.is_graph_input():
                del self.graph.initializers[name]
        self.removed += removed
        return removed


def _values(graph: ir.Graph):
    yield from graph.inputs
    yield from graph.initializers.values()
    for node in graph:
        yield from node.outputs


def run_rules(model: ir.Model, rules: list[Rule]) -> tuple[list[RuleStats], list[str], dict[str, str]]:
    """Apply `rules` in place; return per-rule statistics, the order rewrites were applied in, and
    the rule that last touched each node (by name)."""
    ctx = Context(model)
    stats = {rule.name: RuleStats(rule.name, PRIORITY_NAMES[rule.priority]) for rule in rules}
    usable = [r for r in rules if ctx.opset >= r.min_opset]
    for rule in rules:
        if rule not in usable:
            stats[rule.name].why_not[f"needs opset >= {rule.min_opset}, model has {ctx.opset}"] += 1
    for priority in sorted({r.priority for r in usable}):
        by_anchor: dict[str, list[Rule]] = {}
        for rule in (r for r in usable if r.priority == priority):
            by_anchor.setdefault(rule.anchor, []).append(rule)
        for _ in range(MAX_PASSES):
            if not _one_pass(ctx, by_anchor, stats):
                break
        ctx.remove_unused()
    ctx.graph.sort()  # a moved node may now precede a Constant it reads (attention scale in dynamo exports)
    return list(stats.values()), ctx.history, ctx.touched


def _one_pass(ctx: Context, by_anchor: dict[str, list[Rule]], stats: dict[str, RuleStats]) -> bool:
    changed = False
    for node in list(ctx.graph):
        for rule in (*by_anchor.get(node.op_type, ()), *by_anchor.get("*", ())):
            if node.graph is None or node.domain not in ("", "ai.onnx"):
                break
            record = stats[rule.name]
            started, added, removed = time.perf_counter(), ctx.added, ctx.removed
            record.tried += 1
            bound = rule.check(node, ctx)
            if isinstance(bound, str):
                record.why_not[bound] += 1
            else:
                neighbours = [node, *(use.node for value in node.outputs for use in value.uses())]
                rule.rewrite(node, bound, ctx)
                ctx.history.append(rule.name)
                ctx.touched.update((n.name, rule.name) for n in neighbours if n.name)
                record.applied += 1
                changed = True
            record.nodes_added += ctx.added - added
            record.nodes_removed += ctx.removed - removed
            record.seconds += time.perf_counter() - started
    return changed
