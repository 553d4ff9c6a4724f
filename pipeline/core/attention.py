"""Attention in an ONNX graph, with its shapes: each score MatMul (Q x K^T, reaching a Softmax through the
scale and the mask), its head size and sequence length. The lint, the presets and the engine prediction ask
it ([FA] in pipeline/core/qdq.py: fused INT8 attention depends on both)."""

from __future__ import annotations

from pipeline.core.graph import GraphIndex, static_dims

# what lies between a score MatMul and its Softmax: the scale, the mask, a masked fill
SCORE_TO_SOFTMAX = ("Add", "Where", "Div", "Mul", "Sub")


def tensor_shapes(model) -> dict[str, list[int | None]]:
    """Every tensor's inferred shape (None for a dynamic dim), with the weights left out of the inference."""
    import onnx

    from pipeline.core.onnxfile import without_weights

    inferred = onnx.shape_inference.infer_shapes(without_weights(model), strict_mode=False)
    return {v.name: static_dims(v) for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}


def attention_scores(model, graph: GraphIndex, shapes: dict[str, list[int | None]] | None = None) -> list[tuple[object, int | None, int | None]]:
    """(score MatMul, head size, sequence length) of each attention: a MatMul reaching a Softmax."""
    shapes = tensor_shapes(model) if shapes is None else shapes
    found = []
    for softmax in (n for n in graph.nodes if n.op_type == "Softmax"):
        node = graph.producer(softmax.input[0])
        while node is not None and node.op_type in SCORE_TO_SOFTMAX:
            node = graph.producer(node.input[0])
        if node is None or node.op_type != "MatMul":
            continue
        query = shapes.get(node.input[0]) or []
        scores = shapes.get(node.output[0]) or []
        found.append((node, query[-1] if query else None, scores[-1] if scores else None))
    return found
