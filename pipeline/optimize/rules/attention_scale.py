"""Attention scale moved before the first attention MatMul.

    Div(MatMul(Q, Kt), s) -> MatMul(Div(Q, s), Kt)      (also Mul(MatMul(Q, Kt), c) -> MatMul(Mul(Q, c), Kt))

BERT-style exports scale the scores after Q.Kt; TensorRT's fused multi-head attention
requires Q (or K) to be scaled before the first MatMul ("Fused Attention", TensorRT
developer guide; also required for INT8 fused attention, "Explicit Quantization").
Only attention is touched: the scaled scores must reach a Softmax (through at most a mask
Add/Where). The Div/Mul node itself is moved, keeping its name. When Q comes from a
DequantizeLinear, K is scaled instead; when both do, nothing moves: a node between a DQ
and the MatMul would break the Q/DQ fusion.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

from pipeline.optimize.engine import PLACEMENT, Context, Rule

MASK_OPS = frozenset({"Add", "Where", "Sub"})


def _reaches_softmax(value: ir.Value, hops: int = 2) -> bool:
    for use in value.uses():
        if use.node.op_type == "Softmax":
            return True
        if hops and use.node.op_type in MASK_OPS and _reaches_softmax(use.node.outputs[0], hops - 1):
            return True
    return False


class ScaleBeforeAttentionMatMul(Rule):
    """Div(MatMul(Q, Kt), s) -> MatMul(Div(Q, s), Kt) in attention"""

    name, anchor, priority = "scale-before-attention-matmul", "*", PLACEMENT

    def check(self, node: ir.Node, ctx: Context) -> dict[str, Any] | str:
        if node.op_type not in ("Div", "Mul"):
            return "not a Div or Mul"
        scores, scale = node.inputs
        matmul = ctx.producer(scores, "MatMul")
        if matmul is None and node.op_type == "Mul":
            scores, scale = scale, scores
            matmul = ctx.producer(scores, "MatMul")
        if matmul is None:
            return "does not scale a MatMul's output"
        if ctx.const(scale) is None or ctx.const(scale).size != 1:
            return "the scale is not a constant scalar"
        if len(scores.uses()) != 1 or scores.is_graph_output():
            return "the MatMul's output has other users"
        if not _reaches_softmax(node.outputs[0]):
            return "the scaled scores do not reach a Softmax (not attention)"
        for side in (0, 1):
            operand = matmul.inputs[side]
            if ctx.producer(operand, "DequantizeLinear") is None:
                return {"matmul": matmul, "side": side, "operand": operand, "scale": scale, "scores": scores}
        return "both MatMul inputs come from DequantizeLinear: a scale there would break the Q/DQ fusion"

    def rewrite(self, node: ir.Node, bound: dict[str, Any], ctx: Context) -> None:
        matmul, scores = bound["matmul"], bound["scores"]
        scaled = node.outputs[0]
        scaled.replace_all_uses_with(scores, replace_graph_outputs=True)
        node.replace_input_with(0, bound["operand"])
        node.replace_input_with(1, bound["scale"])
        matmul.replace_input_with(bound["side"], scaled)
        scaled.shape, scaled.type = bound["operand"].shape, bound["operand"].type
        ctx.graph.remove(node)
        ctx.graph.insert_before(matmul, node)


RULES = [ScaleBeforeAttentionMatMul()]
