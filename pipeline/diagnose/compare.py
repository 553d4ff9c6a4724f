"""Per-node divergence between two models of one network (FP32 vs FP16 / INT8).

Both models run on onnxruntime CPU with every intermediate tensor exposed as an output.
Tensors are joined by name; in a Q/DQ model the output of DequantizeLinear(QuantizeLinear(x))
is compared with x of the reference, so the error a Q/DQ adds shows at that pair. For each
node of the reference, `growth` is its output's error minus the largest error of its inputs:
the nodes where the error grows most are where precision is lost. Each row names the torch module
its node came from (pipeline/core/scopes.py), when the export recorded it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import InputError
from pipeline.core.graph import QDQ_OPS, GraphIndex
from pipeline.core.scopes import inline_functions_proto, module_name, node_scope

MIN_JOINED = 0.1  # share of the reference's tensors that must be found in the candidate


@dataclass(frozen=True)
class NodeError:
    node: str
    op_type: str
    tensor: str
    error: float  # max |b - a| / max |a| over the feeds
    input_error: float
    growth: float
    qdq: str | None  # the candidate's Q/DQ on this output, when the comparison goes through one
    module: str  # the torch module the node came from ("" when the export did not record it)


def _relative_error(a: list[np.ndarray], b: list[np.ndarray]) -> float | None:
    if any(x.shape != y.shape for x, y in zip(a, b, strict=True)):
        return None
    scale = max(float(np.max(np.abs(x))) if x.size else 0.0 for x in a) or 1.0
    return max(float(np.max(np.abs(x - y))) if x.size else 0.0 for x, y in zip(a, b, strict=True)) / scale


def compare_models(reference: Path, candidate: Path, feed_sets: list[dict[str, np.ndarray]], workdir: Path) -> dict[str, Any]:
    """Each reference node's error in the candidate over the feed sets, the nodes where it grows most first."""
    from pipeline.core.onnxfile import load_onnx
    from pipeline.diagnose.exposed import run_exposing_all

    ref_model, cand_model = inline_functions_proto(load_onnx(reference)), inline_functions_proto(load_onnx(candidate))
    a, b = run_exposing_all(reference, feed_sets, workdir), run_exposing_all(candidate, feed_sets, workdir)
    # in the candidate, DQ(Q(x)) stands for x: compare the dequantized tensor with the reference's x
    cand = GraphIndex.of(cand_model)
    stands_for, pair_of = {}, {}
    for dq in (n for n in cand.nodes if n.op_type == "DequantizeLinear"):
        q = cand.producer(dq.input[0])
        if q is not None and q.op_type == "QuantizeLinear":
            stands_for[q.input[0]] = dq.output[0]
            pair_of[q.input[0]] = q.name
    errors: dict[str, float] = {}
    for tensor in a:
        other = stands_for.get(tensor, tensor)
        if other in b:
            error = _relative_error(a[tensor], b[other])
            if error is not None:
                errors[tensor] = error
    if len(errors) < MIN_JOINED * len(a):
        raise InputError(f"{reference} and {candidate} share only {len(errors)} of {len(a)} float tensors by name: they are not "
                         "two precisions of one graph; compare models made from the same export (e.g. model.opt.onnx and model.int8.onnx)")
    rows = []
    for node in ref_model.graph.node:
        outs = [t for t in node.output if t in errors]
        if not outs:
            continue
        inputs = [errors[t] for t in node.input if t in errors]
        error = max(errors[t] for t in outs)
        base = max(inputs, default=0.0)
        worst = max(outs, key=lambda t: errors[t])
        scope = module_name(node_scope(node.name, {p.key: p.value for p in node.metadata_props}))
        rows.append(NodeError(node.name, node.op_type, worst, error, base, error - base, pair_of.get(worst), scope))
    rows.sort(key=lambda r: r.growth, reverse=True)
    outputs = {o.name: errors.get(o.name) for o in ref_model.graph.output}
    return {"reference": str(reference), "candidate": str(candidate), "feeds": len(feed_sets), "compared_tensors": len(errors),
            "outputs": outputs, "nodes": [asdict(r) for r in rows]}


# ---------------------------------------------------------------- alignment by execution

# max |B - A| / max |A| under which a pair counts as equal, by the precision of the pair's graphs
PRECISION_BANDS = {"fp32": 1e-4, "fp16": 2e-2, "int8": 0.1}


def shared_names(reference: Path, candidate: Path) -> tuple[int, int]:
    """(node results of A whose name B also makes, node results of A): the models are two precisions of one graph when most are shared."""
    from pipeline.core.onnxfile import load_onnx

    made = [{t for n in inline_functions_proto(load_onnx(p)).graph.node for t in n.output if t} for p in (reference, candidate)]
    return len(made[0] & made[1]), len(made[0])


def precision_of(steps: list) -> str:
    """int8 when the graph has Q/DQ nodes, fp16 when a result is float16, else fp32."""
    if any(s.op_type in QDQ_OPS for s in steps):
        return "int8"
    if any(s.kind == "result" and s.value.dtype == np.float16 for s in steps):
        return "fp16"
    return "fp32"


def _side(step) -> dict[str, Any]:
    return {"kind": step.kind, "name": step.name, "op": step.op_type, "node": step.node, "module": step.module,
            "dtype": step.dtype, "shape": list(step.shape), "fingerprint": step.summary()}


def align_models(reference: Path, candidate: Path, feeds: dict[str, np.ndarray], workdir: Path, nodes: str | None = None,
                 limit_mb: float | None = None, tolerance: float | None = None) -> dict[str, Any]:
    """Run both models on one sample with every result kept, align the two executions
    (align.py) and judge each pair; the first pair of float results that differ is the verdict."""
    from pipeline.diagnose.align import aligned_rows
    from pipeline.diagnose.trace import DEFAULT_LIMIT_MB, match_inputs, trace_model

    feeds_a, feeds_b, input_notes = match_inputs(reference, candidate, feeds)
    limit = limit_mb if limit_mb is not None else DEFAULT_LIMIT_MB
    a = trace_model(reference, feeds_a, workdir, nodes, limit)
    b = trace_model(candidate, feeds_b, workdir, nodes, limit)
    shared, total = shared_names(reference, candidate)
    by_name = shared >= MIN_JOINED * total
    precision = max(precision_of(a.steps), precision_of(b.steps), key=list(PRECISION_BANDS).index)
    band = tolerance if tolerance is not None else PRECISION_BANDS[precision]
    rows = aligned_rows(a.steps, b.steps, by_name, band)
    out_rows = []
    for number, row in enumerate(rows, 1):
        out_rows.append({"row": number, "mark": row.mark,
                         "a": _side(a.steps[row.a]) if row.a is not None else None, "b": _side(b.steps[row.b]) if row.b is not None else None,
                         "max_abs_diff": row.max_abs_diff, "relative": row.relative, "cosine": row.cosine})
    first = next((r for r, row in zip(out_rows, rows) if row.mark == "~" and row.max_abs_diff is not None and a.steps[row.a].is_float and b.steps[row.b].is_float), None)
    counts = Counter(row.mark for row in rows)
    return {"a": str(reference), "b": str(candidate), "aligned_by": "names, then execution" if by_name else "execution",
            "shared_names": shared, "a_results": total, "precision": precision, "tolerance": band, "inputs": input_notes,
            "not_exposed": {"a": a.not_exposed, "b": b.not_exposed}, "nodes": nodes,
            "trace_mib": {"a": round(a.nbytes / 2**20, 2), "b": round(b.nbytes / 2**20, 2)},
            "counts": {"equal": counts["="], "different": counts["~"], "only_a": counts["-"], "only_b": counts["+"]},
            "first_divergence": first, "rows": out_rows}
