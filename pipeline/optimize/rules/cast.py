"""Casts: `CastLike(x, like) -> Cast(x, to=dtype(like))` when the type of `like` is known.

The dynamo exporter writes CastLike where torch casts to a tensor's type (the attention scale of
`scaled_dot_product_attention`, `output.type_as(x)` in RMSNorms). ModelOpt's AutoCast (0.47) types
a CastLike's output wrongly when it converts the graph to FP16, and onnxruntime then refuses the
model ("Type (tensor(float)) of output arg (InsertedPrecisionFreeCast_...) does not match expected
type (tensor(float16))"): seen on an nn.TransformerEncoder and on Gemma. A Cast names its type, so
AutoCast converts it like any other; one to x's own type is then removed as a no-op.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

from pipeline.optimize.engine import CLEANUP, Context, Rule


class CastLikeToCast(Rule):
    """CastLike(x, like) -> Cast(x, to=dtype(like))"""

    name, anchor, priority, min_opset = "castlike-to-cast", "CastLike", CLEANUP, 15

    def check(self, node: ir.Node, ctx: Context) -> dict[str, Any] | str:
        like = node.inputs[1] if len(node.inputs) > 1 else None
        if like is None or like.dtype is None:
            return "the type of its second input is unknown"
        return {"to": like.dtype}

    def rewrite(self, node: ir.Node, bound: dict[str, Any], ctx: Context) -> None:
        attributes: dict[str, Any] = {"to": bound["to"].value}
        saturate = node.attributes.get_int("saturate")
        if saturate is not None:  # float8 targets only; same meaning on Cast (opset 19+)
            attributes["saturate"] = saturate
        cast = ir.node("Cast", [node.inputs[0]], attributes, name=node.name, metadata_props=dict(node.metadata_props))
        ctx.replace([node], [cast], [node.outputs[0]], [cast.outputs[0]])


RULES = [CastLikeToCast()]
