"""Index lookups that are slices.

    Gather(data, Range(start, limit, delta), axis)  ->  Slice(data, [start], [limit], [axis], [delta])

Exporters write a position embedding table's lookup this way (Marian, Pegasus:
their encoders' `embed_positions.weight[arange(seq)]`). A Slice is a strided view TensorRT runs without
an index tensor, where a Gather reads one index per row. It also keeps onnxruntime's
GatherToSliceFusion away: that fusion (graph optimization level "extended") removes the Range even
when its output must stay (ModelOpt AutoCast's reference run exposes every tensor as an output, and
onnxruntime then refuses the model: "Failed to find node output ... producing output: arange").
Applies when start and delta are constant, start >= 0 and delta > 0 (a Gather index counts from the end
when negative, a Slice bound differently), and the Range feeds only Gathers.
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
        start, delta = ctx.const(span.inputs[0]), ctx.const(span.inputs[2])
        if start is None or delta is None:
            return "the Range's start or delta is not constant"
        if int(start) < 0 or int(delta) <= 0:
            return "the Range counts down or from a negative start (a Gather index counts from the end)"
        if not ctx.only_used_by(span.outputs[0], {use.node for use in span.outputs[0].uses() if use.node.op_type == "Gather"}):
            return "the Range's indices are used by other nodes or are a graph output"
        return {"data": node.inputs[0], "span": span, "start": int(start), "delta": int(delta), "axis": node.attributes.get_int("axis", 0)}

    def rewrite(self, node: ir.Node, bound: dict[str, Any], ctx: Context) -> None:
        span = bound["span"]
        shape = ctx.initializer(np.array([1], np.int64), f"{node.name}_one")
        limit = ir.node("Reshape", [span.inputs[1], shape], name=ctx.unique_name(f"{node.name}_limit"))
        limit_1d = limit.outputs[0]
        if span.inputs[1].dtype != ir.DataType.INT64:  # Slice's bounds are one type: int64 with the constants
            cast = ir.node("Cast", [limit_1d], {"to": ir.DataType.INT64}, name=ctx.unique_name(f"{node.name}_limit_int64"))
            extra, limit_1d = [cast], cast.outputs[0]
        else:
            extra = []
        starts = ctx.initializer(np.array([bound["start"]], np.int64), f"{node.name}_starts")
        axes = ctx.initializer(np.array([bound["axis"]], np.int64), f"{node.name}_axes")
        steps = ctx.initializer(np.array([bound["delta"]], np.int64), f"{node.name}_steps")
        piece = ir.node("Slice", [bound["data"], starts, limit_1d, axes, steps], name=node.name, metadata_props=dict(node.metadata_props))
        ctx.replace([node], [limit, *extra, piece], [node.outputs[0]], [piece.outputs[0]])


RULES = [GatherOfRangeAsSlice()]
