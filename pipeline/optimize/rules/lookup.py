"""Index lookups that are slices.

    Gather(data, Range(start, limit, delta), axis)  ->  Slice(data, [start], [limit], [axis], [delta])

Exporters write a position embedding table's lookup this way (Marian, Pegasus:
their encoders' `embed_positions.weight[arange(seq)]`). A Slice is a strided view TensorRT runs without
an index tensor, where a Gather reads one index per row. It also keeps onnxruntime's
GatherToSliceFusion away: that fusion (graph optimization level "extended") removes the Range even
when its output must stay (ModelOpt AutoCast's reference run exposes every tensor as an output, and
onnxruntime then refuses the model: "Failed to find node output ... producing output: arange").
Applies when delta is a positive constant and start is >= 0 (a Gather index counts from the end when
negative, a Slice bound differently): a constant, or a count read from a shape (a decoder's
`arange(past, past + seq)`, past the cache's length: a user's decoder failed its FP16 stage so), and the
Range feeds only Gathers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from pipeline.optimize.engine import CLEANUP, Context, Rule


class GatherOfRangeAsSlice(Rule):
    """Gather(data, Range(start, limit, delta), axis) -> Slice(data, [start], [limit], [axis], [delta])"""

    name, anchor, priority = "gather-of-range-as-slice", "Gather", CLEANUP

    def check(self, node: ir.Node, ctx: Context) -> dict[str, Any] | str:
        span = ctx.producer(node.inputs[1], "Range")
        if span is None:
            return "its indices are not a Range"
        delta = ctx.const(span.inputs[2])
        if delta is None:
            return "the Range's delta is not constant"
        if int(delta) <= 0 or not _non_negative(span.inputs[0], ctx):
            return "the Range counts down or from a start that may be negative (a Gather index counts from the end)"
        if not ctx.only_used_by(span.outputs[0], {use.node for use in span.outputs[0].uses() if use.node.op_type == "Gather"}):
            return "the Range's indices are used by other nodes or are a graph output"
        return {"data": node.inputs[0], "span": span, "delta": int(delta), "axis": node.attributes.get_int("axis", 0)}

    def rewrite(self, node: ir.Node, bound: dict[str, Any], ctx: Context) -> None:
        span = bound["span"]
        start, start_nodes = _one_int64(span.inputs[0], f"{node.name}_start", ctx)
        limit, limit_nodes = _one_int64(span.inputs[1], f"{node.name}_limit", ctx)
        axes = ctx.initializer(np.array([bound["axis"]], np.int64), f"{node.name}_axes")
        steps = ctx.initializer(np.array([bound["delta"]], np.int64), f"{node.name}_steps")
        piece = ir.node("Slice", [bound["data"], start, limit, axes, steps], name=node.name, metadata_props=dict(node.metadata_props))
        ctx.replace([node], [*start_nodes, *limit_nodes, piece], [node.outputs[0]], [piece.outputs[0]])


def _one_int64(value: ir.Value, base: str, ctx: Context) -> tuple[ir.Value, list[ir.Node]]:
    """`value` (a scalar) as a one-element int64 tensor, Slice's bound: a constant, or the nodes that reshape (and cast) it."""
    constant = ctx.const(value)
    if constant is not None:
        return ctx.initializer(np.array([int(constant)], np.int64), base), []
    reshape = ir.node("Reshape", [value, ctx.initializer(np.array([1], np.int64), f"{base}_one")], name=ctx.unique_name(base))
    if value.dtype == ir.DataType.INT64:
        return reshape.outputs[0], [reshape]
    cast = ir.node("Cast", [reshape.outputs[0]], {"to": ir.DataType.INT64}, name=ctx.unique_name(f"{base}_int64"))
    return cast.outputs[0], [reshape, cast]


COUNTING_OPS = ("Shape", "Size")  # their outputs are sizes, never negative
KEEPING_OPS = ("Gather", "Slice", "Squeeze", "Unsqueeze", "Reshape", "Cast", "Identity", "Concat")  # read sizes, write sizes


def _non_negative(value: ir.Value | None, ctx: Context, depth: int = 8) -> bool:
    """Whether `value` is >= 0 for every input: a non-negative constant, a size read from a shape, or a sum or
    product of such (the dynamo exporter's `sym_size` of a cache's length, plus the sequence's)."""
    constant = ctx.const(value)
    if constant is not None:
        return bool(np.all(constant >= 0))
    node = ctx.producer(value)
    if node is None or depth == 0:
        return False
    if node.op_type in COUNTING_OPS:
        return True
    if node.op_type in KEEPING_OPS:
        return _non_negative(node.inputs[0], ctx, depth - 1) and all(
            _non_negative(v, ctx, depth - 1) for v in node.inputs[1:] if node.op_type == "Concat")
    if node.op_type in ("Add", "Mul", "Max"):
        return all(_non_negative(v, ctx, depth - 1) for v in node.inputs)
    return False


RULES = [GatherOfRangeAsSlice()]
