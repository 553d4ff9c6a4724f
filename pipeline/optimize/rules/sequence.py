"""Sequence ops -> tensor ops: TensorRT's ONNX parser imports no sequence type.

    SequenceAt(SplitToSequence(x, split, axis), i) for constant i  ->  Split(x, lengths, axis)[i]
    the same with computed lengths  ->  Slice(x, sum(split[:i]), sum(split[:i + 1]), axis)

The dynamo exporter writes `tensor.split(size, dim)` (GPT-2's query/key/value) this way, and a
mixture of experts' `tokens.split(tokens_per_expert)` with lengths the router computes (JetMoE).
Applies when every use of the sequence is a SequenceAt with a constant index, and the lengths
are known (a constant 1-D `split`, or a constant scalar with a static size on `axis`) or a computed
1-D `split`. Besides TensorRT, ModelOpt AutoCast's reference run cannot handle a sequence-valued
tensor either (Polygraphy: "dtype is unsupported for objects of type: list").
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from pipeline.optimize.engine import CLEANUP, Context, Rule


class SplitToSequenceAsSplit(Rule):
    """SequenceAt(SplitToSequence(x, split, axis), i) -> Split(x, lengths, axis)[i]"""

    name, anchor, priority = "split-to-sequence-as-split", "SplitToSequence", CLEANUP

    def check(self, node: ir.Node, ctx: Context) -> dict[str, Any] | str:
        x = node.inputs[0]
        split = ctx.const(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
        if split is None:
            return "no constant split lengths"
        axis = node.attributes.get_int("axis", 0)
        if split.ndim == 1:
            lengths = [int(s) for s in split]
        else:
            if x.shape is None or not isinstance(x.shape[axis], int):
                return "scalar split over a dim that is not static"
            size, step = x.shape[axis], int(split)
            lengths = [step] * (size // step) + ([size % step] if size % step else [])
        readers = sequence_readers(node, ctx, len(lengths))
        if isinstance(readers, str):
            return readers
        return {"x": x, "axis": axis, "lengths": lengths, **readers}

    def rewrite(self, node: ir.Node, bound: dict[str, Any], ctx: Context) -> None:
        lengths = ctx.initializer(np.array(bound["lengths"], np.int64), f"{node.name}_lengths")
        split = ir.node("Split", [bound["x"], lengths], {"axis": bound["axis"]}, num_outputs=len(bound["lengths"]),
                        name=node.name, metadata_props=dict(node.metadata_props))
        readers = bound["readers"]
        ctx.replace([node, *readers], [split], [r.outputs[0] for r in readers], [split.outputs[p] for p in bound["positions"]])


class SplitToSequenceAsSlices(Rule):
    """SequenceAt(SplitToSequence(x, split, axis), i) -> Slice(x, sum(split[:i]), sum(split[:i + 1]), axis)"""

    name, anchor, priority = "split-to-sequence-as-slices", "SplitToSequence", CLEANUP

    def check(self, node: ir.Node, ctx: Context) -> dict[str, Any] | str:
        split = node.inputs[1] if len(node.inputs) > 1 else None
        if split is None or ctx.const(split) is not None:
            return "no computed split lengths (constant ones: split-to-sequence-as-split)"
        if split.shape is None or len(split.shape) != 1:
            return "computed split lengths of unknown rank (a scalar splits into equal parts)"
        count = split.shape[0] if isinstance(split.shape[0], int) else None
        readers = sequence_readers(node, ctx, count)
        if isinstance(readers, str):
            return readers
        return {"x": node.inputs[0], "split": split, "axis": node.attributes.get_int("axis", 0), **readers}

    def rewrite(self, node: ir.Node, bound: dict[str, Any], ctx: Context) -> None:
        split, nodes, parts = bound["split"], [], []
        zero, axes = ctx.initializer(np.array([0], np.int64), f"{node.name}_zero"), ctx.initializer(np.array([bound["axis"]], np.int64), f"{node.name}_axis")

        def add(op: str, inputs: list[ir.Value], **attributes: Any) -> ir.Value:
            nodes.append(ir.node(op, inputs, attributes, name=ctx.unique_name(f"{node.name}_{op}"), metadata_props=dict(node.metadata_props)))
            return nodes[-1].outputs[0]

        for position in bound["positions"]:
            at, after = (ctx.initializer(np.array([i], np.int64), f"{node.name}_at") for i in (position, position + 1))
            start = zero if position == 0 else add("ReduceSum", [add("Slice", [split, zero, at])], keepdims=1)  # the lengths before it
            end = add("Add", [start, add("Slice", [split, at, after])])
            parts.append(add("Slice", [bound["x"], start, end, axes]))
        readers = bound["readers"]
        ctx.replace([node, *readers], nodes, [r.outputs[0] for r in readers], parts)
        shape = bound["x"].shape  # not the SequenceAt's: shape inference gives every part one shape, and onnxruntime then reuses one's buffer for another
        for part in parts:
            part.shape = None if shape is None else ir.Shape([None if axis == bound["axis"] % len(shape) else dim for axis, dim in enumerate(shape)])


def sequence_readers(node: ir.Node, ctx: Context, count: int | None) -> dict[str, Any] | str:
    """The SequenceAt nodes reading `node`'s sequence and the part each takes (negative indices from the end of
    `count` parts), or why the sequence cannot be replaced."""
    sequence = node.outputs[0]
    if sequence.is_graph_output():
        return "the sequence is a graph output"
    readers = [use.node for use in sequence.uses()]
    if not readers or any(r.op_type != "SequenceAt" or r.inputs[0] is not sequence for r in readers):
        return "the sequence is used by something other than SequenceAt"
    indices = [ctx.scalar(r.inputs[1]) for r in readers]
    if any(i is None for i in indices):
        return "a SequenceAt index is not constant"
    if count is None and any(i < 0 for i in indices):
        return "a SequenceAt index counts from the end of a sequence of unknown length"
    return {"readers": readers, "positions": [int(i) % count if count else int(i) for i in indices]}


RULES = [SplitToSequenceAsSplit(), SplitToSequenceAsSlices()]
