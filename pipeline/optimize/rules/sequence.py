"""Sequence ops -> tensor ops: TensorRT's ONNX parser imports no sequence type.

    SequenceAt(SplitToSequence(x, split, axis), i) for constant i  ->  Split(x, lengths, axis)[i]

The dynamo exporter writes `tensor.split(size, dim)` (GPT-2's query/key/value) this way.
Applies when every use of the sequence is a SequenceAt with a constant index and the lengths
are known: a constant 1-D `split`, or a constant scalar with a static size on `axis`. Besides
TensorRT, ModelOpt AutoCast's reference run cannot handle a sequence-valued tensor either.
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
        x, sequence = node.inputs[0], node.outputs[0]
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
        if sequence.is_graph_output():
            return "the sequence is a graph output"
        readers = [use.node for use in sequence.uses()]
        if not readers or any(r.op_type != "SequenceAt" or r.inputs[0] is not sequence for r in readers):
            return "the sequence is used by something other than SequenceAt"
        indices = [ctx.scalar(r.inputs[1]) for r in readers]
        if any(i is None for i in indices):
            return "a SequenceAt index is not constant"
        positions = [int(i) % len(lengths) for i in indices]
        return {"x": x, "axis": axis, "lengths": lengths, "readers": readers, "positions": positions}

    def rewrite(self, node: ir.Node, bound: dict[str, Any], ctx: Context) -> None:
        lengths = ctx.initializer(np.array(bound["lengths"], np.int64), f"{node.name}_lengths")
        split = ir.node("Split", [bound["x"], lengths], {"axis": bound["axis"]}, num_outputs=len(bound["lengths"]),
                        name=node.name, metadata_props=dict(node.metadata_props))
        readers = bound["readers"]
        ctx.replace([node, *readers], [split], [r.outputs[0] for r in readers], [split.outputs[p] for p in bound["positions"]])


RULES = [SplitToSequenceAsSplit()]
