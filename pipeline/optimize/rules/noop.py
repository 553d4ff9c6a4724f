"""No-op removal: nodes that compute their input unchanged (each rule's docstring states its rewrite)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from pipeline.optimize.engine import CLEANUP, Context, Rule

BROADCASTING_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Where", "Max", "Min", "Equal", "Less", "Greater", "And", "Or"})


def _keeps_graph_output(node: ir.Node, source: ir.Value) -> str | None:
    """Why bypassing `node` would break the graph's outputs, if it would."""
    out = node.outputs[0]
    if out.is_graph_output() and (source.is_graph_input() or source.is_graph_output() or source.is_initializer()):
        return "its output is a graph output fed directly by an input or initializer"
    return None


class _Bypass(Rule):
    """A rule whose check binds `source`, the value the matched node's output equals."""

    def rewrite(self, node: ir.Node, bound: dict[str, Any], ctx: Context) -> None:
        ctx.bypass(node, bound["source"])


class RemoveIdentity(_Bypass):
    """Identity(x) -> x"""

    name, anchor, priority = "remove-identity", "Identity", CLEANUP

    def check(self, node: ir.Node, ctx: Context) -> dict[str, Any] | str:
        source = node.inputs[0]
        return _keeps_graph_output(node, source) or {"source": source}


class RemoveSameTypeCast(_Bypass):
    """Cast(x, to=dtype(x)) -> x"""

    name, anchor, priority = "remove-same-type-cast", "Cast", CLEANUP

    def check(self, node: ir.Node, ctx: Context) -> dict[str, Any] | str:
        source = node.inputs[0]
        if source.dtype is None:
            return "input type unknown"
        if node.attributes.get_int("to") != source.dtype.value:
            return "casts to another type"
        return _keeps_graph_output(node, source) or {"source": source}


class RemoveSameShapeReshape(_Bypass):
    """Reshape(x, shape) -> x, when the result has the static shape of x"""

    name, anchor, priority = "remove-same-shape-reshape", "Reshape", CLEANUP

    def check(self, node: ir.Node, ctx: Context) -> dict[str, Any] | str:
        source = node.inputs[0]
        shape_in = ctx.static_shape(source)
        if shape_in is None:
            return "input shape not static"
        target = ctx.const(node.inputs[1])
        if target is None:
            return "target shape not constant"
        resolved = [shape_in[i] if d == 0 and not node.attributes.get_int("allowzero", 0) else int(d) for i, d in enumerate(target.tolist())]
        if -1 in resolved:
            known = int(np.prod([d for d in resolved if d != -1]))
            resolved[resolved.index(-1)] = int(np.prod(shape_in)) // known if known else -1
        if tuple(resolved) != shape_in:
            return "changes the shape"
        return _keeps_graph_output(node, source) or {"source": source}


# The dynamo exporter writes an identity Transpose in SAM3-Lite's text projection: TensorRT runs it as a copy, and
# onnxruntime's GemmTransposeFusion folds it into the Gemm it feeds as if it swapped the axes, so the graph fails there
# at every shape once onnxruntime optimizes it ("GEMM: Dimension mismatch").
class RemoveIdentityTranspose(_Bypass):
    """Transpose(x, perm=[0, 1, ..]) -> x"""

    name, anchor, priority = "remove-identity-transpose", "Transpose", CLEANUP

    def check(self, node: ir.Node, ctx: Context) -> dict[str, Any] | str:
        perm = node.attributes.get_ints("perm")
        if perm is None:
            return "no perm: reverses the axes"
        if list(perm) != sorted(perm):
            return "moves axes"
        return _keeps_graph_output(node, node.inputs[0]) or {"source": node.inputs[0]}


class CancelTransposePair(Rule):
    """Transpose(Transpose(x, p), q) -> x when they cancel, else one Transpose"""

    name, anchor, priority = "cancel-transpose-pair", "Transpose", CLEANUP

    def check(self, node: ir.Node, ctx: Context) -> dict[str, Any] | str:
        first = ctx.producer(node.inputs[0], "Transpose")
        if first is None:
            return "input is not a Transpose"
        if not ctx.only_used_by(first.outputs[0], {node}):
            return "the first Transpose has other users"
        p, q = first.attributes.get_ints("perm"), node.attributes.get_ints("perm")
        if p is None or q is None:
            return "a Transpose without perm (rank unknown)"
        composed = [p[i] for i in q]
        if composed == sorted(composed) and (why := _keeps_graph_output(node, first.inputs[0])):
            return why
        return {"source": first.inputs[0], "first": first, "composed": composed}

    def rewrite(self, node: ir.Node, bound: dict[str, Any], ctx: Context) -> None:
        composed, first = bound["composed"], bound["first"]
        if composed == sorted(composed):
            ctx.bypass(node, bound["source"])
            ctx.graph.remove(first, safe=True)
            ctx.removed += 1
            return
        merged = ir.node("Transpose", [bound["source"]], {"perm": composed}, name=node.name, metadata_props=dict(node.metadata_props))
        ctx.replace([first, node], [merged], [node.outputs[0]], [merged.outputs[0]])


class RemoveDropout(_Bypass):
    """Dropout(x) -> x (inference, mask output unused)"""

    name, anchor, priority = "remove-dropout", "Dropout", CLEANUP

    def check(self, node: ir.Node, ctx: Context) -> dict[str, Any] | str:
        if len(node.outputs) > 1 and node.outputs[1].uses():
            return "its mask output is used"
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            training = ctx.const(node.inputs[2])
            if training is None or bool(training.reshape(-1)[0]):
                return "training_mode is not constant false"
        return _keeps_graph_output(node, node.inputs[0]) or {"source": node.inputs[0]}


class RemoveNoOpExpand(_Bypass):
    """Expand(x, shape) -> x, when x has that shape or the consumers broadcast it anyway"""

    name, anchor, priority = "remove-noop-expand", "Expand", CLEANUP

    def check(self, node: ir.Node, ctx: Context) -> dict[str, Any] | str:
        source, out = node.inputs[0], node.outputs[0]
        shape_in, shape_out = ctx.static_shape(source), ctx.static_shape(out)
        if shape_in is None or shape_out is None:
            return "shapes not static"
        if shape_in == shape_out:
            return _keeps_graph_output(node, source) or {"source": source}
        if out.is_graph_output() or not out.uses():
            return "changes the shape and is a graph output"
        for use in out.uses():
            if use.node.op_type not in BROADCASTING_OPS:
                return f"changes the shape and feeds {use.node.op_type}, which does not broadcast"
            others = [ctx.static_shape(v) for v in use.node.inputs if v is not None and v is not out]
            if any(o is None for o in others) or _broadcast([shape_in, *others]) != _broadcast([shape_out, *others]):
                return "a consumer's broadcast shape would change without it"
        return {"source": source}


def _broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        return None


RULES = [RemoveIdentity(), RemoveSameTypeCast(), RemoveSameShapeReshape(), RemoveIdentityTranspose(), CancelTransposePair(), RemoveDropout(), RemoveNoOpExpand()]
