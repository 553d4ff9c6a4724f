"""Decomposed LayerNorm -> LayerNormalization (opset >= 17), epsilon kept exactly.

    Add(Mul(Div(d, Sqrt(Add(ReduceMean(Pow(d, 2)), eps))), gamma), beta)  with d = Sub(x, ReduceMean(x))
      -> LayerNormalization(x, gamma, beta, axis=first reduced axis, epsilon=eps)

`Mul(d, d)` is accepted for `Pow(d, 2)`; without the trailing Mul/Add, gamma = 1 and beta = 0.
Both means must reduce the same trailing axes with keepdims. TensorRT fuses
LayerNormalization natively (its ONNX parser imports it as INormalizationLayer), where
the decomposed form leaves a chain of elementwise and reduce layers to match.
The epsilon is read from the graph as is: a rule that rounds 1e-12 to 0 is a bug.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from pipeline.optimize.engine import FUSION, Context, Rule


class FuseLayerNorm(Rule):
    """written-out LayerNorm (mean, variance, sqrt, gamma, beta) -> LayerNormalization"""

    name, anchor, priority, min_opset = "fuse-layernorm", "Div", FUSION, 17

    def check(self, node: ir.Node, ctx: Context) -> dict[str, Any] | str:
        centered, std = node.inputs
        sub = ctx.producer(centered, "Sub")
        sqrt = ctx.producer(std, "Sqrt")
        if sub is None or sqrt is None:
            return "not Div(Sub(...), Sqrt(...))"
        x, mean = sub.inputs
        mean_node = ctx.producer(mean, "ReduceMean")
        if mean_node is None or mean_node.inputs[0] is not x:
            return "Sub does not subtract ReduceMean of the same input"
        add_eps = ctx.producer(sqrt.inputs[0], "Add")
        if add_eps is None:
            return "Sqrt input is not Add(variance, eps)"
        variance, eps_value = add_eps.inputs
        epsilon = ctx.scalar(eps_value)
        if epsilon is None:
            variance, eps_value = eps_value, variance
            epsilon = ctx.scalar(eps_value)
        var_node = ctx.producer(variance, "ReduceMean")
        if epsilon is None or var_node is None:
            return "no constant epsilon added to a ReduceMean"
        square = ctx.producer(var_node.inputs[0])
        if square is None or not _is_square_of(square, centered, ctx):
            return "variance is not ReduceMean(Pow(d, 2)) of the centered input"
        axes = _reduced_axes(mean_node, ctx), _reduced_axes(var_node, ctx)
        rank = len(x.shape) if x.shape is not None else None
        if None in axes or rank is None:
            return "reduce axes or input rank unknown"
        normalized = sorted(a % rank for a in axes[0])
        if normalized != sorted(a % rank for a in axes[1]) or normalized != list(range(normalized[0], rank)):
            return "the means do not reduce the same trailing axes"
        inner = {sub, mean_node, square, var_node, add_eps, sqrt, node}
        if not (ctx.only_used_by(centered, {square, node}) and ctx.only_used_by(mean, {sub})
                and all(ctx.only_used_by(v, inner) for v in (square.outputs[0], variance, add_eps.outputs[0], std))):
            return "an intermediate value is used outside the pattern"
        bound = {"x": x, "epsilon": epsilon, "axis": normalized[0], "nodes": [mean_node, sub, square, var_node, add_eps, sqrt, node], "out": node.outputs[0]}
        return _affine(bound, ctx, tuple(x.shape)[normalized[0]:])

    def rewrite(self, node: ir.Node, bound: dict[str, Any], ctx: Context) -> None:
        dtype, shape = bound["x"].dtype.numpy(), bound["normalized_shape"]
        gamma = _as_value(bound["gamma"], np.ones(shape, dtype), f"{node.name}_gamma", ctx)
        beta = _as_value(bound["beta"], np.zeros(shape, dtype), f"{node.name}_beta", ctx)
        attributes = {"axis": bound["axis"], "epsilon": float(bound["epsilon"])}
        fused = ctx.fused_node("LayerNormalization", [bound["x"], gamma, beta], attributes, bound["nodes"][-1])
        ctx.replace(bound["nodes"], [fused], [bound["out"]], [fused.outputs[0]])


def _as_value(bound: ir.Value | np.ndarray | None, default: np.ndarray, name: str, ctx: Context) -> ir.Value:
    if isinstance(bound, ir.Value):
        return bound
    return ctx.initializer(default if bound is None else bound, name)


def _is_square_of(node: ir.Node, value: ir.Value, ctx: Context) -> bool:
    if node.op_type == "Pow":
        return node.inputs[0] is value and ctx.scalar(node.inputs[1]) == 2.0
    return node.op_type == "Mul" and node.inputs[0] is value and node.inputs[1] is value


def _reduced_axes(node: ir.Node, ctx: Context) -> tuple[int, ...] | None:
    if not node.attributes.get_int("keepdims", 1):
        return None
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = ctx.const(node.inputs[1])
        return None if axes is None else tuple(int(a) for a in axes.reshape(-1))
    axes = node.attributes.get_ints("axes")
    return tuple(axes) if axes else None


def _affine(bound: dict[str, Any], ctx: Context, normalized_shape: tuple) -> dict[str, Any] | str:
    """Extend the match over a following Mul(gamma) and Add(beta) with constant [normalized] shapes."""
    if not all(isinstance(d, int) for d in normalized_shape):
        return "normalized dims are not static"
    bound.update(gamma=None, beta=None, normalized_shape=normalized_shape)
    for op, key in (("Mul", "gamma"), ("Add", "beta")):
        uses = bound["out"].uses()
        if len(uses) != 1 or bound["out"].is_graph_output() or uses[0].node.op_type != op:
            break
        follower = uses[0].node
        other = follower.inputs[1 - uses[0].idx]
        constant = ctx.const(other)
        if constant is None or constant.shape[-len(normalized_shape):] != normalized_shape or constant.size != int(np.prod(normalized_shape)):
            break
        bound[key] = other if constant.shape == normalized_shape else constant.reshape(normalized_shape)
        bound["nodes"].append(follower)
        bound["out"] = follower.outputs[0]
    return bound


RULES = [FuseLayerNorm()]
