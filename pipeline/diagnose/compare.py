"""Per-node divergence between two models of one network (FP32 vs FP16 / INT8).

Both models run on onnxruntime CPU with every intermediate tensor exposed as an output.
Tensors are joined by name; in a Q/DQ model the output of DequantizeLinear(QuantizeLinear(x))
is compared with x of the reference, so the error a Q/DQ adds shows at that pair. For each
node of the reference, `growth` is its output's error minus the largest error of its inputs:
the nodes where the error grows most are where precision is lost. Each row names the torch module
its node came from (pipeline/core/scopes.py), when the export recorded it. `align_models` aligns two
executions instead (align.py). Both return a typed result with its `verdict` line (render.py writes them).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import InputError
from pipeline.core.graph import QDQ_OPS, GraphIndex
from pipeline.core.scopes import inline_functions_proto
from pipeline.diagnose.trace import node_modules

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
    index_change: float = 0.0  # share of the elements of its most changed integer input (indices, a top-k pick) that differ


VERDICT_OUTPUTS = 4  # the outputs a verdict names, largest error first


class Verdicted:
    """A result whose JSON is its fields and its one-line `verdict`."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"verdict": self.verdict}


@dataclass
class NodeComparison(Verdicted):
    """Two precisions of one graph compared tensor by tensor: the error at the outputs, and per node of A."""

    reference: str
    candidate: str
    feeds: int  # samples run
    compared_tensors: int
    outputs: dict[str, float | None]  # the error at each graph output (None: not compared)
    nodes: list[NodeError]  # where the error grows most first

    @property
    def verdict(self) -> str:
        outputs = self._output_errors()
        if not self.nodes or max(n.error for n in self.nodes) == 0:
            return f"B computes every one of the {self.compared_tensors} compared tensors exactly as A; {outputs}"
        top = self.nodes[0]
        where = f"{top.node} -> {top.qdq}" if top.qdq else top.node
        flipped = (f" (its integer input differs in {top.index_change:.1%} of elements: B picked other indices, e.g. another expert "
                   "of a top-k routing, so the error is a changed choice, not rounding)") if top.index_change else ""
        return (f"largest error growth at {where} ({top.op_type}, module {top.module or '-'}): input err {top.input_error:.3g}{flipped}, "
                f"output err {top.error:.3g}, growth {top.growth:.3g}; {outputs}")

    def _output_errors(self, shown: int = VERDICT_OUTPUTS) -> str:
        """The largest errors at the outputs (a decoder's 60 cache outputs made a 1,900-character first line), the rest counted."""
        ranked = sorted(self.outputs.items(), key=lambda item: -1.0 if item[1] is None else -item[1])
        text = ", ".join(f"{k} {v:.3g}" if v is not None else f"{k} -" for k, v in ranked[:shown])
        more = f" and {len(ranked) - shown} more (--format json has each)" if len(ranked) > shown else ""
        return f"error at the outputs: {text}{more}"


def compare_models(reference: Path, candidate: Path, feed_sets: list[dict[str, np.ndarray]], workdir: Path) -> NodeComparison:
    """Each reference node's error in the candidate over the feed sets, the nodes where it grows most first."""
    from pipeline.core.onnxfile import load_onnx
    from pipeline.diagnose.exposed import exposing_results

    ref_model, cand_model = inline_functions_proto(load_onnx(reference)), inline_functions_proto(load_onnx(candidate))
    # in the candidate, DQ(Q(x)) stands for x: compare the dequantized tensor with the reference's x
    cand = GraphIndex.of(cand_model)
    stands_for, pair_of = {}, {}
    for dq in (n for n in cand.nodes if n.op_type == "DequantizeLinear"):
        q = cand.producer(dq.input[0])
        if q is not None and q.op_type == "QuantizeLinear":
            stands_for[q.input[0]] = dq.output[0]
            pair_of[q.input[0]] = q.name
    a = exposing_results(reference, workdir, indices=True)
    errors, changed = _relative_errors(a, exposing_results(candidate, workdir, indices=True), feed_sets, stands_for)
    if len(errors) + len(changed) < MIN_JOINED * len(a.outputs):
        raise InputError(f"{reference} and {candidate} share only {len(errors) + len(changed)} of {len(a.outputs)} tensors by name: they are not "
                         "two precisions of one graph; compare models made from the same export (e.g. model.opt.onnx and model.int8.onnx)")
    rows = []
    for node, module in zip(ref_model.graph.node, node_modules(GraphIndex.of(ref_model), {})):
        outs = [t for t in node.output if t in errors]
        if not outs:
            continue
        inputs = [errors[t] for t in node.input if t in errors]
        error = max(errors[t] for t in outs)
        base = max(inputs, default=0.0)
        worst = max(outs, key=lambda t: errors[t])
        growth = 0.0 if error == base else error - base  # an Inf carried from an input is no growth (inf - inf)
        index_change = max((changed[t] for t in node.input if t in changed), default=0.0)
        rows.append(NodeError(node.name, node.op_type, worst, error, base, growth, pair_of.get(worst), module, index_change))
    rows.sort(key=lambda r: r.growth, reverse=True)
    outputs = {o.name: errors.get(o.name) for o in ref_model.graph.output}
    return NodeComparison(str(reference), str(candidate), len(feed_sets), len(errors), outputs, rows)


def _relative_errors(a: Any, b: Any, feed_sets: list[dict[str, np.ndarray]], stands_for: dict[str, str]) -> tuple[dict[str, float], dict[str, float]]:
    """For each float tensor of A that B computes too (under its name, or the DQ standing for it), max |b - a| / max |a|
    over the feed sets; infinite where b holds NaN or Inf that a does not (a value past b's range); left out where the
    shapes differ. For each integer or bool tensor, the largest share of its elements that differ in a feed set.
    Accumulated one feed set at a time: a decoder's tensors over all samples did not fit in memory."""
    largest: dict[str, float] = {}
    worst: dict[str, float] = {}
    changed: dict[str, float] = {}
    unequal_shapes: set[str] = set()
    for feeds in feed_sets:
        ran_b = b.run(feeds)
        for tensor, value in a.run(feeds).items():
            other = ran_b.get(stands_for.get(tensor, tensor))
            if other is None or tensor in unequal_shapes:
                continue
            if other.shape != value.shape:
                unequal_shapes.add(tensor)
                continue
            if not np.issubdtype(value.dtype, np.floating):
                changed[tensor] = max(changed.get(tensor, 0.0), float(np.mean(value != other)) if value.size else 0.0)
                continue
            x, y = np.asarray(value, np.float64), np.asarray(other, np.float64)
            largest[tensor] = max(largest.get(tensor, 0.0), float(np.max(np.abs(x))) if x.size else 0.0)
            gap = float("inf") if np.any(~np.isfinite(y) & np.isfinite(x)) else float(np.max(np.abs(x - y))) if x.size else 0.0
            worst[tensor] = max(worst.get(tensor, 0.0), gap)
    errors = {tensor: gap / (largest[tensor] or 1.0) for tensor, gap in worst.items() if tensor not in unequal_shapes}
    return errors, {tensor: share for tensor, share in changed.items() if tensor not in unequal_shapes}


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


@dataclass
class StepSide:
    """One side's step of an aligned row (trace.py's Step, without its values)."""

    kind: str  # "input", "initializer" or "result"
    name: str
    op: str
    node: str
    module: str
    dtype: str
    shape: list[int]
    fingerprint: str  # mean±std for floats, the values or their range otherwise

    @classmethod
    def of(cls, step) -> StepSide:
        return cls(step.kind, step.name, step.op_type, step.node, step.module, step.dtype, list(step.shape), step.summary())


@dataclass
class AlignedRow:
    row: int  # 1-based
    mark: str  # "=" equal, "~" different, "-" only in A, "+" only in B
    a: StepSide | None
    b: StepSide | None
    max_abs_diff: float | None
    relative: float | None  # max_abs_diff / max |A|
    cosine: float | None


@dataclass
class Alignment(Verdicted):
    """Two executions aligned step by step (align.py), each pair judged; the first pair of float results that differ is the verdict."""

    a: str
    b: str
    aligned_by: str  # "names, then execution" or "execution"
    shared_names: int
    a_results: int
    precision: str  # the band's: fp32, fp16 or int8
    tolerance: float
    inputs: list[str]  # notes on inputs fed by position
    not_exposed: dict[str, list[str]]
    nodes: str | None  # the --nodes pattern
    trace_mib: dict[str, float]
    counts: dict[str, int]  # equal, different, only_a, only_b
    first_divergence: AlignedRow | None
    rows: list[AlignedRow]

    @property
    def verdict(self) -> str:
        counts = self.counts
        tally = (f"{len(self.rows)} rows: {counts['equal']} equal, {counts['different']} different, "
                 f"{counts['only_a']} only in A, {counts['only_b']} only in B")
        first = self.first_divergence
        if first is None:
            return f"no divergence: every paired float result is equal within {self.tolerance:g}; {tally}"
        a, b = first.a, first.b
        cosine = f"{first.cosine:.6f}" if first.cosine is not None else "-"
        return (f"first divergence at row {first.row}: A {a.op or a.kind} {a.name!r} (module {a.module or '-'}) vs "
                f"B {b.op or b.kind} {b.name!r} (module {b.module or '-'}): max_abs_diff {first.max_abs_diff:.3g}, "
                f"cosine {cosine}; {tally}")


def align_models(reference: Path, candidate: Path, feeds: dict[str, np.ndarray], workdir: Path, nodes: str | None = None,
                 limit_mb: float | None = None, tolerance: float | None = None) -> Alignment:
    """Run both models on one sample with every result kept, align the two executions
    (align.py) and judge each pair; the first pair of float results that differ is the verdict."""
    from pipeline.diagnose.align import aligned_rows
    from pipeline.diagnose.trace import DEFAULT_LIMIT_MB, match_inputs, trace_model

    feeds_a, feeds_b, input_notes = match_inputs(reference, candidate, feeds)
    limit = limit_mb if limit_mb is not None else DEFAULT_LIMIT_MB
    a = trace_model(reference, feeds_a, workdir, nodes, limit)
    # ModelOpt's and AutoCast's models keep the node names but not their modules: B's nodes named as A's take A's
    b = trace_model(candidate, feeds_b, workdir, nodes, limit, {s.node: s.module for s in a.steps if s.kind == "result" and s.module})
    shared, total = shared_names(reference, candidate)
    by_name = shared >= MIN_JOINED * total
    precision = max(precision_of(a.steps), precision_of(b.steps), key=list(PRECISION_BANDS).index)
    band = tolerance if tolerance is not None else PRECISION_BANDS[precision]
    rows = aligned_rows(a.steps, b.steps, by_name, band)
    out_rows = [AlignedRow(number, row.mark, StepSide.of(a.steps[row.a]) if row.a is not None else None,
                           StepSide.of(b.steps[row.b]) if row.b is not None else None, row.max_abs_diff, row.relative, row.cosine)
                for number, row in enumerate(rows, 1)]
    first = next((r for r, row in zip(out_rows, rows) if row.mark == "~" and row.max_abs_diff is not None and a.steps[row.a].is_float and b.steps[row.b].is_float), None)
    counts = Counter(row.mark for row in rows)
    return Alignment(str(reference), str(candidate), "names, then execution" if by_name else "execution", shared, total, precision, band, input_notes,
                     {"a": a.not_exposed, "b": b.not_exposed}, nodes, {"a": round(a.nbytes / 2**20, 2), "b": round(b.nbytes / 2**20, 2)},
                     {"equal": counts["="], "different": counts["~"], "only_a": counts["-"], "only_b": counts["+"]}, first, out_rows)
