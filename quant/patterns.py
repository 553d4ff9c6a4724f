"""What the presets and the lint recognize in a graph, on the core graph index: attention (the score
MatMul before a Softmax, its shapes, the mask Add, the context MatMuls after it, whether they are
quantized), a written-out RMSNorm, a mixture of experts' router, and the causal mask a decoder without its cache builds.
"""

from __future__ import annotations

from pipeline.core.attention import attention_scores
from pipeline.core.graph import GraphIndex

CAUSAL_COMPARISONS = ("Less", "LessOrEqual", "Greater", "GreaterOrEqual")


def builds_causal_mask(model, hops: int = 6) -> bool:
    """Whether the graph compares two position ranges (`key position <= query position`): how the
    exporters write a Hugging Face decoder's causal mask when the model has no KV cache inputs."""
    graph = GraphIndex.of(model)

    def from_range(name: str) -> bool:
        frontier = [name]
        for _ in range(hops):
            nodes = [graph.producer(n) for n in frontier if n in graph.producers]
            if any(n.op_type == "Range" for n in nodes):
                return True
            frontier = [i for n in nodes if n.op_type in ("Unsqueeze", "Reshape", "Cast", "Add", "Sub", "Expand", "Slice") for i in n.input[:1]]
        return False

    return any(n.op_type in CAUSAL_COMPARISONS and len(n.input) == 2 and all(from_range(i) for i in n.input) for n in graph.nodes)


def reads_token_ids(model) -> bool:
    """An integer graph input reaches, through Cast and reshapes, the indices of a Gather from a constant table: an
    embedding lookup, so the model reads tokens (a language model, whatever its layers), not pixels or features."""
    import onnx

    graph = GraphIndex.of(model)
    integer = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
    ids = {i.name for i in model.graph.input if i.type.HasField("tensor_type") and i.type.tensor_type.elem_type in integer}
    for node in graph.nodes:  # in graph order: a reshape of the ids comes before what reads it
        if node.op_type in ("Cast", "Reshape", "Flatten", "Squeeze", "Unsqueeze") and node.input and node.input[0] in ids:
            ids.update(node.output)
        elif node.op_type == "Gather" and len(node.input) > 1 and node.input[1] in ids and (
                node.input[0] in graph.initializers or graph.op(node.input[0]) in ("Constant", "DequantizeLinear")):
            return True
    return False


def attention_shapes(model) -> list[tuple[str, int | None, int | None]]:
    """(MatMul name, head size, sequence length) of each attention score MatMul (its output reaches a Softmax)."""
    return [(node.name, head, sequence) for node, head, sequence in attention_scores(model, GraphIndex.of(model))]


def attention_state(model) -> str:
    """Whether the attention MatMuls (score and context) of a Q/DQ model are "int8", "float" or "mixed"."""
    graph = GraphIndex.of(model)
    quantized = {graph.op(i) == "DequantizeLinear" for matmul in _attention_matmul_nodes(model, graph) for i in matmul.input}
    return "mixed" if len(quantized) == 2 else "int8" if quantized == {True} else "float"


def attention_matmuls(model) -> list[str]:
    """Names of the attention MatMuls: each score MatMul (Q x K^T, reaching a Softmax) and the context
    MatMuls reading that Softmax (probabilities x V)."""
    return sorted({matmul.name for matmul in _attention_matmul_nodes(model, GraphIndex.of(model))})


def _attention_matmul_nodes(model, graph: GraphIndex) -> list:
    found = []
    for scores, _, _ in attention_scores(model, graph):
        softmax = next((n for n in graph.nodes if n.op_type == "Softmax" and _reaches(graph, scores, n)), None)
        found += [scores, *(_matmuls_after(graph, softmax) if softmax else [])]
    return found


def rms_norm_nodes(model) -> list[str]:
    """Names of the nodes of each written-out RMSNorm, `x * 1/sqrt(mean(x^2) + eps) [* weight]`: the square
    (Pow(x, 2) or Mul(x, x)), the mean, the Add/Sqrt/Reciprocal/Div chain (or Pow(., -0.5): Gemma 3n's,
    Gemma 4's and EmbeddingGemma's `torch.pow(mean_squared, -0.5)`) and the Mul (or Div) that normalizes x.
    ModelOpt quantizes the per-row factor 1/sqrt(...) feeding that Mul, whose range spans orders of
    magnitude (1/sqrt(eps) for a zero row), and the square x^2, whose range is the square of x's."""
    graph = GraphIndex.of(model)
    found: list[str] = []
    for mean in (n for n in graph.nodes if n.op_type == "ReduceMean"):
        square = graph.producer(mean.input[0])
        if square is None or not (square.op_type == "Pow" or (square.op_type == "Mul" and square.input[0] == square.input[1])):
            continue
        x, chain, frontier, normalized = square.input[0], [square.name, mean.name], [mean], []
        for _ in range(4):
            following = [c for n in frontier for o in n.output for c in graph.consumers(o)]
            normalized += [c.name for c in following if c.op_type in ("Mul", "Div") and x in c.input]
            frontier = [c for c in following if c.op_type in ("Add", "Sqrt", "Reciprocal", "Div", "Pow") and x not in c.input]
            chain += [c.name for c in frontier]
        if normalized:
            found += chain + normalized
    return sorted(set(found))


# what lies between a router's GEMM and the TopK that picks the experts from its scores: a softmax or sigmoid, a bias
# (DeepSeek's e_score_correction_bias), a scale, casts and reshapes
ROUTER_PATH_OPS = ("Softmax", "Sigmoid", "Add", "Mul", "Div", "Cast", "Reshape", "Flatten", "Squeeze", "Unsqueeze")


def router_gemms(model, hops: int = 4) -> list[str]:
    """Names of the GEMMs whose scores a TopK picks from: a mixture of experts' routers. Rounded scores send tokens
    whose experts score close to other experts, a router is a small GEMM INT8 hardly speeds up, and ModelOpt's LLM
    quantization recipes leave routers unquantized (default_disabled_quantizers: `*mlp.gate.*`, `*block_sparse_moe.gate*`)."""
    graph = GraphIndex.of(model)
    found = []
    for gemm in (n for n in graph.nodes if n.op_type in ("MatMul", "Gemm")):
        frontier = [gemm]
        for _ in range(hops):
            following = [c for n in frontier for o in n.output for c in graph.consumers(o)]
            if any(c.op_type == "TopK" for c in following):
                found.append(gemm.name)
                break
            frontier = [c for c in following if c.op_type in ROUTER_PATH_OPS]
    return sorted(found)


def _reaches(graph: GraphIndex, start, target, hops: int = 4) -> bool:
    frontier = [start]
    for _ in range(hops):
        frontier = [c for n in frontier for o in n.output for c in graph.consumers(o)]
        if target in frontier:
            return True
    return False


# between a Softmax and its context MatMul: Q/DQ, casts, and the NaN guard of torch's SDPA export
# (Where(IsNaN(p), 0, p), written for fully masked rows)
SOFTMAX_PASS_THROUGH = ("QuantizeLinear", "DequantizeLinear", "Cast", "IsNaN", "Where", "Dropout", "Identity")


def _matmuls_after(graph: GraphIndex, softmax, hops: int = 4) -> list:
    found, frontier = [], [softmax]
    for _ in range(hops):
        frontier = [c for n in frontier for o in n.output for c in graph.consumers(o)]
        found += [n for n in frontier if n.op_type == "MatMul" and n not in found]
        frontier = [n for n in frontier if n.op_type in SOFTMAX_PASS_THROUGH]
    return found
