"""Constant folding, including shape subgraphs.

- `op(c1, c2, ...) -> c` for constant inputs, evaluated with numpy exactly as ONNX defines
  the op; outputs above FOLD_LIMIT elements are folded only when their large constant inputs
  have no other user, so weights are never duplicated. QuantizeLinear / DequantizeLinear are
  never folded: TensorRT needs a DQ between a weight and its layer; nor is a large result of small
  inputs (GROWS), nor a graph output (GRAPH_OUTPUT).
- `Shape(x) -> c` and `Gather(Shape(x), i) -> c` where those dims of x are static.
- `Reshape(x, Concat(Unsqueeze(Gather(Shape(x), i)), ..., c)) -> Reshape(x, [0, ..., c])`: a
  piece that copies dim i of x into position i becomes 0 ("copy from input", allowzero=0),
  so the shape subgraph disappears even with dynamic dims (TensorRT wants shape inputs as
  initializers: TensorRT's ONNX parser operator notes).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from pipeline.optimize.engine import CLEANUP, Context, Rule

FOLD_LIMIT = 1 << 16  # elements
# A fold turns a node's output into an initializer, which would take the graph output's place (and
# name): the folds decline instead and say so in --stats.
GRAPH_OUTPUT = "its output is a graph output"
# ConstantOfShape, Expand, Tile, Range: small inputs, a large result. Folding would write the result
# into the file (onnx's "light" test models, whose weights are ConstantOfShape, grew from kilobytes
# to up to 575 MB): such folds decline.
GROWS = "a large result from small inputs (folding would grow the file)"
NEVER_FOLD = frozenset({"QuantizeLinear", "DequantizeLinear", "Constant", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial"})


def _attr(node: ir.Node, name: str, default: Any = None) -> Any:
    attr = node.attributes.get(name)
    return default if attr is None else attr.value


def _slice(data, starts, ends, axes=None, steps=None):
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    index = [slice(None)] * data.ndim
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        index[int(a)] = slice(int(s), int(e), int(st))
    return data[tuple(index)]


def _reshape(node, data, shape):
    shape = [data.shape[i] if d == 0 and not _attr(node, "allowzero", 0) else int(d) for i, d in enumerate(shape.tolist())]
    return data.reshape(shape)


def _div(node, a, b):
    if np.issubdtype(a.dtype, np.integer):
        return np.trunc(a / b).astype(a.dtype)  # ONNX integer Div truncates toward zero
    return (a / b).astype(a.dtype)


def _axes(node, inputs, position):
    axes = inputs[position] if len(inputs) > position and inputs[position] is not None else _attr(node, "axes")
    return None if axes is None else tuple(int(a) for a in np.asarray(axes).reshape(-1))


def _unsqueeze(node, data, *rest):
    out = data
    for axis in sorted(a % (data.ndim + len(_axes(node, [data, *rest], 1))) for a in _axes(node, [data, *rest], 1)):
        out = np.expand_dims(out, axis)
    return out


def _squeeze(node, data, *rest):
    axes = _axes(node, [data, *rest], 1)
    return np.squeeze(data, axis=axes) if axes is not None else np.squeeze(data)


def _constant_of_shape(node, shape):
    value = _attr(node, "value")
    fill = value.numpy().reshape(-1)[0] if value is not None else np.float32(0)
    return np.full(tuple(int(d) for d in shape), fill, dtype=np.asarray(fill).dtype)


EVALUATORS = {
    "Add": lambda n, a, b: np.add(a, b).astype(np.result_type(a, b) if a.dtype != b.dtype else a.dtype),
    "Sub": lambda n, a, b: np.subtract(a, b).astype(a.dtype),
    "Mul": lambda n, a, b: np.multiply(a, b).astype(a.dtype),
    "Div": _div,
    "Neg": lambda n, a: np.negative(a),
    "Sqrt": lambda n, a: np.sqrt(a),
    "Exp": lambda n, a: np.exp(a),  # CLIP's logit_scale.exp(): ModelOpt's INT8 fails on an Exp of an initializer (IndexError)
    "Reciprocal": lambda n, a: np.reciprocal(a),
    "Pow": lambda n, a, b: np.power(a, b).astype(a.dtype),
    "Cast": lambda n, a: a.astype(ir.DataType(_attr(n, "to")).numpy()),
    "Reshape": _reshape,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": lambda n, *xs: np.concatenate(xs, axis=_attr(n, "axis")),
    "Gather": lambda n, a, i: np.take(a, i, axis=_attr(n, "axis", 0)),
    "Slice": lambda n, d, s, e, a=None, st=None: _slice(d, s, e, a, st),
    "Transpose": lambda n, a: np.transpose(a, _attr(n, "perm")),
    "Equal": lambda n, a, b: np.equal(a, b),
    "Where": lambda n, c, a, b: np.where(c, a, b),
    "Not": lambda n, a: np.logical_not(a),
    "And": lambda n, a, b: np.logical_and(a, b),
    "Or": lambda n, a, b: np.logical_or(a, b),
    "Less": lambda n, a, b: np.less(a, b),
    "Greater": lambda n, a, b: np.greater(a, b),
    "Max": lambda n, *xs: np.maximum.reduce(xs),
    "Min": lambda n, *xs: np.minimum.reduce(xs),
    "Abs": lambda n, a: np.abs(a),
    "Floor": lambda n, a: np.floor(a),
    "Ceil": lambda n, a: np.ceil(a),
    "Identity": lambda n, a: a,
    "Expand": lambda n, a, s: a * np.ones(tuple(int(d) for d in s), dtype=a.dtype),
    "ConstantOfShape": _constant_of_shape,
    "Range": lambda n, s, l, d: np.arange(s, l, d, dtype=s.dtype),
    "Shape": lambda n, a: np.array(a.shape, dtype=np.int64)[_attr(n, "start", 0) : _attr(n, "end", None)],
}


class FoldConstants(Rule):
    """op(constants) -> constant, computed with numpy exactly as ONNX defines the op"""

    name, anchor, priority = "fold-constants", "*", CLEANUP

    def check(self, node: ir.Node, ctx: Context) -> dict[str, Any] | str:
        if node.op_type in NEVER_FOLD:
            return f"{node.op_type} is never folded"
        evaluate = EVALUATORS.get(node.op_type)
        if evaluate is None:
            return "no evaluator for this op"
        if any(out.is_graph_output() for out in node.outputs):
            return GRAPH_OUTPUT
        if len(node.outputs) != 1:
            return "several outputs"
        if not all(v is None or v.const_value is not None or ctx.producer(v, "Constant") is not None for v in node.inputs):
            return "an input is not constant"  # decided before any weight is read
        sizes = [_size(v) for v in node.inputs]
        large_shared = [v for v, n in zip(node.inputs, sizes, strict=True) if n > FOLD_LIMIT and len(v.uses()) > 1]
        out = node.outputs[0]
        if node.op_type in LAZY_OPS and max(sizes, default=0) > FOLD_LIMIT:
            if large_shared:
                return "folding would duplicate a large constant used elsewhere"
            if ctx.static_shape(out) is None or out.dtype is None:
                return "a large fold whose output shape or type is unknown"
            tensors = [ir.convenience.get_const_tensor(v) if v is not None else None for v in node.inputs]
            return {"lazy": (evaluate, node, tensors), "shape": ctx.static_shape(out), "dtype": out.dtype}
        known = ctx.static_shape(out)
        if known is not None and int(np.prod(known, dtype=np.int64)) > FOLD_LIMIT and max(sizes, default=0) <= FOLD_LIMIT:
            return GROWS
        inputs = [ctx.const(v) if v is not None else None for v in node.inputs]
        if any(v is not None and a is None for v, a in zip(node.inputs, inputs, strict=True)):
            return "an input is not constant"
        if not node.inputs:
            return "no inputs"
        try:
            with np.errstate(all="ignore"):
                result = np.asarray(evaluate(node, *inputs))
        except (ValueError, TypeError, IndexError, KeyError) as err:
            return f"numpy cannot evaluate it ({type(err).__name__})"
        if result.size > FOLD_LIMIT and large_shared:
            return "folding would duplicate a large constant used elsewhere"
        if result.size > FOLD_LIMIT and max(sizes, default=0) <= FOLD_LIMIT:
            return GROWS
        expected = node.outputs[0].dtype
        if expected is not None and expected.numpy() != result.dtype:
            result = result.astype(expected.numpy())
        return {"result": result}

    def rewrite(self, node: ir.Node, bound: dict[str, Any], ctx: Context) -> None:
        name = node.outputs[0].name or f"{node.name}_folded"
        if "lazy" in bound:
            folded = ctx.lazy_initializer(_deferred(*bound["lazy"], bound["dtype"]), bound["dtype"], bound["shape"], name)
        else:
            folded = ctx.initializer(bound["result"], name)
        ctx.bypass(node, folded)


# Layout ops whose large constant results are computed when the model is saved, not while the
# graph is analysed: the optimize call never reads weight bytes (they are copied once, on save).
LAZY_OPS = frozenset({"Transpose", "Cast", "Identity", "Reshape", "Squeeze", "Unsqueeze"})


def _size(value: ir.Value | None) -> int:
    """Elements of a constant input, from its metadata (no weight bytes are read)."""
    if value is None:
        return 0
    tensor = value.const_value
    dims = tensor.shape if tensor is not None else value.shape
    if dims is None or not all(isinstance(d, int) for d in dims):
        return 0
    return int(np.prod(tuple(dims), dtype=np.int64))


def _deferred(evaluate, node: ir.Node, tensors: list, dtype: ir.DataType):
    def compute() -> ir.TensorProtocol:
        arrays = [t.numpy() if t is not None else None for t in tensors]
        return ir.tensor(np.ascontiguousarray(np.asarray(evaluate(node, *arrays)), dtype=dtype.numpy()))

    return compute


class FoldStaticShape(Rule):
    """Shape(x) -> constant, when the dims of x are static"""

    name, anchor, priority = "fold-static-shape", "Shape", CLEANUP

    def check(self, node: ir.Node, ctx: Context) -> dict[str, Any] | str:
        if node.outputs[0].is_graph_output():
            return GRAPH_OUTPUT
        dims = _shape_dims(node.outputs[0], ctx)
        if dims is None:
            return "input shape unknown"
        if not all(isinstance(d, int) for d in dims):
            return "dims are symbolic"
        return {"result": np.array(dims, dtype=np.int64)}

    rewrite = FoldConstants.rewrite


class FoldStaticShapeElement(Rule):
    """Gather(Shape(x), i) -> constant, when those dims of x are static"""

    name, anchor, priority = "fold-static-shape-element", "Gather", CLEANUP

    def check(self, node: ir.Node, ctx: Context) -> dict[str, Any] | str:
        if node.outputs[0].is_graph_output():
            return GRAPH_OUTPUT
        dims = _shape_dims(node.inputs[0], ctx)
        index = ctx.const(node.inputs[1])
        if dims is None or index is None:
            return "not Gather(Shape(x), constant)"
        try:
            picked = [dims[int(i)] for i in index.reshape(-1)]
        except IndexError:
            return "index out of range"
        if not all(isinstance(d, int) for d in picked):
            return "the gathered dims are symbolic"
        return {"result": np.array(picked, dtype=np.int64).reshape(index.shape)}

    rewrite = FoldConstants.rewrite


class ReshapeCopiesInputDims(Rule):
    """Reshape(x, Concat(dims of x ..., c)) -> Reshape(x, [0, ..., c])"""

    name, anchor, priority = "reshape-copy-input-dims", "Reshape", CLEANUP

    def check(self, node: ir.Node, ctx: Context) -> dict[str, Any] | str:
        if ctx.const(node.inputs[1]) is not None:
            return "shape already constant"
        concat = ctx.producer(node.inputs[1], "Concat")
        if concat is None:
            return "shape is not a Concat"
        data = node.inputs[0]
        target: list[int] = []
        zero_literal = False
        for piece in concat.inputs:
            value = ctx.const(piece)
            if value is not None:
                literal = [int(v) for v in value.reshape(-1)]
                target += literal
                zero_literal = zero_literal or 0 in literal
                continue
            source = _piece_source(piece, ctx)
            if source is None or len(source[1]) != 1:
                return "a shape piece is neither constant nor one dim taken from a shape"
            (tensor, dims), position = source, len(target)
            same_tensor = tensor is data and dims[0][0] == position
            same_dim = data.shape is not None and position < len(data.shape) and ctx.same_dim(data.shape[position], dims[0][1])
            if not (same_tensor or same_dim):
                return "a shape piece does not copy the data's dim at the same position"
            target.append(0)
        if _attr(node, "allowzero", 0) and zero_literal:
            return "allowzero=1 with a literal 0 in the shape"
        return {"target": np.array(target, dtype=np.int64)}

    def rewrite(self, node: ir.Node, bound: dict[str, Any], ctx: Context) -> None:
        node.replace_input_with(1, ctx.initializer(bound["target"], f"{node.name}_shape"))
        if "allowzero" in node.attributes:  # no literal 0 left: 0 now means "copy" (allowzero=0)
            node.attributes.pop("allowzero")


def _shape_dims(value: ir.Value, ctx: Context) -> list[Any] | None:
    """The dims a Shape node reports (ints or symbolic dims), or None if `value` is no Shape output."""
    shape_node = ctx.producer(value, "Shape")
    if shape_node is None or shape_node.inputs[0].shape is None:
        return None
    return list(shape_node.inputs[0].shape)[_attr(shape_node, "start", 0) : _attr(shape_node, "end", None)]


def _peel_single_dim_wrappers(value: ir.Value, ctx: Context) -> tuple[ir.Value, bool]:
    """Skip Unsqueeze / Squeeze / Reshape-to-one-element around a single dim (the dynamo exporter
    writes Reshape(Squeeze(Shape(x)[i:i+1]), [-1])); return the inner value and whether the
    wrappers turned a scalar into the piece."""
    wrapped = False
    while (node := ctx.producer(value)) is not None:
        if node.op_type in ("Unsqueeze", "Squeeze"):
            value, wrapped = node.inputs[0], True
        elif node.op_type == "Reshape" and (target := ctx.const(node.inputs[1])) is not None and target.size == 1 and int(target.reshape(-1)[0]) in (1, -1):
            value, wrapped = node.inputs[0], True
        else:
            break
    return value, wrapped


def _piece_source(piece: ir.Value, ctx: Context) -> tuple[ir.Value, list[tuple[int, Any]]] | None:
    """(x, [(index, dim), ...]) for a Concat piece taken from x's shape:
    Shape(x)[a:b], Unsqueeze(Gather(Shape(x), i)) or Gather(Shape(x), [i])."""
    piece, scalar = _peel_single_dim_wrappers(piece, ctx)
    gather = ctx.producer(piece, "Gather")
    shape_value = gather.inputs[0] if gather is not None else piece
    shape_node = ctx.producer(shape_value, "Shape")
    if shape_node is None:
        return None
    tensor = shape_node.inputs[0]
    shape = tensor.shape
    begin, stop = _attr(shape_node, "start", 0), _attr(shape_node, "end", None)
    if shape is not None:
        positions: list[int] | None = list(range(len(shape)))[begin:stop]
    elif begin >= 0 and stop is not None and stop >= 0:
        positions = list(range(begin, stop))
    elif begin >= 0 and gather is not None:
        positions = None  # open-ended slice of an unknown rank: the Gather indices say which dims
    else:
        return None
    if gather is None:
        picked = positions
    else:
        index = ctx.const(gather.inputs[1])
        if index is None or index.size != 1 and scalar:
            return None
        offsets = [int(i) for i in index.reshape(-1)]
        if positions is None:
            picked = [begin + i for i in offsets] if all(i >= 0 for i in offsets) else None
        else:
            picked = [positions[i] for i in offsets] if all(-len(positions) <= i < len(positions) for i in offsets) else None
    if picked is None:
        return None
    return tensor, [(i, shape[i] if shape is not None else None) for i in picked]

RULES = [FoldConstants(), FoldStaticShape(), FoldStaticShapeElement(), ReshapeCopiesInputDims()]
