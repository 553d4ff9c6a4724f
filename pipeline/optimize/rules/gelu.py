"""Written-out GELU -> Gelu (opset >= 20 only; below that the graph is left alone).

    x * 0.5 * (1 + Erf(x / sqrt(2)))                                  -> Gelu(x)
    x * 0.5 * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))            -> Gelu(x, approximate="tanh")

The product may be written in any order or grouping (the Mul tree is flattened), `x / c`
or `x * (1/c)`, `Pow(x, 3)` or `x * x * x`. TensorRT's ONNX parser imports Gelu (opset 20)
as one activation, which fuses into the preceding GEMM; the written-out form is five
elementwise layers for the builder to rediscover.
"""

from __future__ import annotations

import math
from typing import Any

import onnx_ir as ir

from pipeline.optimize.engine import FUSION, Context, Rule

INV_SQRT2 = 1 / math.sqrt(2)
SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
CUBIC = 0.044715


def _close(value: float | None, target: float) -> bool:
    return value is not None and math.isclose(value, target, rel_tol=1e-5)


def _product(value: ir.Value, ctx: Context, nodes: list[ir.Node], top: bool = False) -> list[ir.Value]:
    """Factors of a Mul tree. An inner Mul may have other users (exporters share `x * 0.5`
    between GELUs): it is matched, and kept if something outside the pattern still needs it."""
    node = ctx.producer(value, "Mul")
    if node is None or (not top and value.is_graph_output()):
        return [value]
    nodes.append(node)
    return _product(node.inputs[0], ctx, nodes) + _product(node.inputs[1], ctx, nodes)


def _split_constant(factors: list[ir.Value], ctx: Context) -> tuple[float | None, list[ir.Value]]:
    constants = [f for f in factors if ctx.scalar(f) is not None]
    if len(constants) != 1:
        return None, factors
    return ctx.scalar(constants[0]), [f for f in factors if f is not constants[0]]


def _scaled_input(value: ir.Value, scale: float, ctx: Context, nodes: list[ir.Node]) -> ir.Value | None:
    """x for `x / (1/scale)` or `x * scale` (either operand order), else None."""
    div = ctx.producer(value, "Div")
    if div is not None and _close(ctx.scalar(div.inputs[1]), 1 / scale):
        nodes.append(div)
        return div.inputs[0]
    factors = _product(value, ctx, nodes, top=True)
    constant, rest = _split_constant(factors, ctx)
    return rest[0] if _close(constant, scale) and len(rest) == 1 else None


def _one_plus(value: ir.Value, op_type: str, ctx: Context, nodes: list[ir.Node]) -> ir.Node | None:
    add = ctx.producer(value, "Add")
    if add is None or len(value.uses()) != 1:
        return None
    for i in (0, 1):
        inner = ctx.producer(add.inputs[i], op_type)
        if inner is not None and _close(ctx.scalar(add.inputs[1 - i]), 1.0) and len(add.inputs[i].uses()) == 1:
            nodes += [add, inner]
            return inner
    return None


def _is_cube_of(value: ir.Value, x: ir.Value, ctx: Context, nodes: list[ir.Node]) -> bool:
    pow_node = ctx.producer(value, "Pow")
    if pow_node is not None:
        nodes.append(pow_node)
        return pow_node.inputs[0] is x and _close(ctx.scalar(pow_node.inputs[1]), 3.0)
    factors = _product(value, ctx, nodes, top=True)
    return len(factors) == 3 and all(f is x for f in factors)


class FuseGelu(Rule):
    """x * 0.5 * (1 + Erf(x / sqrt 2)), or the tanh form -> Gelu"""

    name, anchor, priority, min_opset = "fuse-gelu", "Mul", FUSION, 20

    def check(self, node: ir.Node, ctx: Context) -> dict[str, Any] | str:
        nodes: list[ir.Node] = []
        half, rest = _split_constant(_product(node.outputs[0], ctx, nodes, top=True), ctx)
        if not _close(half, 0.5) or len(rest) != 2:
            return "not a product of 0.5 and two factors"
        for x, other in (rest, rest[::-1]):
            inner_nodes = list(nodes)
            erf = _one_plus(other, "Erf", ctx, inner_nodes)
            if erf is not None and _scaled_input(erf.inputs[0], INV_SQRT2, ctx, inner_nodes) is x:
                return self._bound(x, "none", inner_nodes, node, ctx)
            inner_nodes = list(nodes)
            tanh = _one_plus(other, "Tanh", ctx, inner_nodes)
            if tanh is not None and self._tanh_argument(tanh.inputs[0], x, ctx, inner_nodes):
                return self._bound(x, "tanh", inner_nodes, node, ctx)
        return "no (1 + Erf(x/sqrt 2)) or (1 + Tanh(sqrt(2/pi)(x + 0.044715 x^3))) factor"

    @staticmethod
    def _tanh_argument(value: ir.Value, x: ir.Value, ctx: Context, nodes: list[ir.Node]) -> bool:
        inner = _scaled_input(value, SQRT_2_OVER_PI, ctx, nodes)
        add = ctx.producer(inner, "Add") if inner is not None else None
        if add is None:
            return False
        nodes.append(add)
        for i in (0, 1):
            if add.inputs[i] is x:
                cube_nodes: list[ir.Node] = []
                constant, rest = _split_constant(_product(add.inputs[1 - i], ctx, cube_nodes, top=True), ctx)
                if _close(constant, CUBIC) and len(rest) == 1 and _is_cube_of(rest[0], x, ctx, cube_nodes):
                    nodes += cube_nodes
                    return True
        return False

    @staticmethod
    def _bound(x: ir.Value, approximate: str, nodes: list[ir.Node], top: ir.Node, ctx: Context) -> dict[str, Any] | str:
        """Remove the matched nodes nothing else needs; a shared one stays (and what feeds it)."""
        matched = list(dict.fromkeys(nodes))
        removable = set(matched)
        changed = True
        while changed:
            changed = False
            for n in matched:
                if n in removable and n is not top and not all(ctx.only_used_by(v, removable) for v in n.outputs):
                    removable.discard(n)
                    changed = True
        if any(ctx.producer(v) in removable for n in matched if n not in removable for v in n.inputs):
            return "a kept node would lose its input"
        return {"x": x, "approximate": approximate, "nodes": [n for n in matched if n in removable]}

    def rewrite(self, node: ir.Node, bound: dict[str, Any], ctx: Context) -> None:
        attributes = {"approximate": "tanh"} if bound["approximate"] == "tanh" else {}
        fused = ctx.fused_node("Gelu", [bound["x"]], attributes, node)
        ctx.replace(bound["nodes"], [fused], [node.outputs[0]], [fused.outputs[0]])


RULES = [FuseGelu()]
