"""A precision gate that repairs itself: when the FP16, BF16 or INT8 model fails its accuracy gate, the fewest
nodes to keep in higher precision for it to pass (issue 38; `--no-repair` turns it off).

The search is guided by compare's per-node error (pipeline/diagnose/compare.py) on one held-out sample: the
nodes where the error grows most come first, an overflow's origin (NaN/Inf where FP32 is finite) before
everything. It tries the first 1, 2, 4, ... of them (a trial: the conversion rerun with those nodes kept, and
the accuracy check), ranking again on a trial that still overflows (keeping one node can uncover the next),
then bisects between the last prefix that failed and the first that passed. Where that stalls (the error is spread
over many nodes), it tries every node of one op type at a time, the op types in the order of their worst node (every
Softmax, every LayerNormalization, ...), then halves of the group that passed. At most `MAX_SHARE` of the graph's
compute nodes are kept: past that, the gate fails as without repair; and the search stops before a trial would take
it past `BUDGET` times the failed attempt it repairs.
"""

from __future__ import annotations

import importlib
import itertools
import json
import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MAX_SHARE = 0.05  # of the graph's compute nodes, the most the repair keeps in higher precision
BUDGET = 3.0  # the search's cost, at most this many times the failed attempt (the conversion and its gate check)
STALL = 0.1  # a trial closing less of the gap to the gate than this share (twice in a row) ends the search
NOT_COMPUTE = frozenset({"Constant", "ConstantOfShape", "Identity", "Shape", "Size", "Cast", "QuantizeLinear", "DequantizeLinear"})


@dataclass(frozen=True)
class Trial:
    """A conversion with some nodes kept in higher precision, and its accuracy."""

    kept: tuple[str, ...]
    model: Path
    figures: dict[str, Any]
    passed: bool
    result: Any = None  # what the conversion returned (the stage's own record of it)


@dataclass(frozen=True)
class Repair:
    """The search's outcome: the nodes kept and why, what it cost against the failed attempt it repairs."""

    kept: tuple[str, ...]
    why: str
    kept_compute: int  # of `kept`, the compute nodes (a Constant kept with its readers is not one)
    compute_nodes: int
    trials: int
    search_seconds: float
    attempt_seconds: float  # the failed attempt: the conversion and its gate check
    passed: Trial | None  # None: no set within MAX_SHARE passes
    tried: tuple[tuple[int, float], ...] = ()  # (nodes kept, cosine_centered) of each trial, in order

    def metrics(self, profile_key: str) -> dict[str, Any]:
        return {"kept": list(self.kept), "why": self.why, "kept_compute_nodes": self.kept_compute, "compute_nodes": self.compute_nodes,
                "kept_share": round(self.kept_compute / max(1, self.compute_nodes), 4), "trials": self.trials,
                "search_seconds": round(self.search_seconds, 3), "attempt_seconds": round(self.attempt_seconds, 3),
                "cost_vs_attempt": round(self.search_seconds / max(self.attempt_seconds, 1e-9), 2),
                "tried": [[kept, None if math.isnan(cosine) else cosine] for kept, cosine in self.tried],
                "profile_key": profile_key, "pin": pin_line(profile_key, self.kept)}


def start_clock(library: str, log: Path) -> float:
    """The time the stage's attempt starts, `library` (the conversion's) imported first: the import is no part of what a
    trial repeats. It is imported with its output going to the stage's `log`, as the conversion would (ModelOpt binds its
    log handler to the stdout of the moment it is imported)."""
    from pipeline.core.quiet import captured

    with captured(log):
        importlib.import_module(library)
    return time.perf_counter()


def pin_line(profile_key: str, kept: tuple[str, ...]) -> str:
    """The profile line that keeps `kept` with no search next time ([quant] keys are regular expressions: exact names)."""
    from quant.fp16 import exact_names

    section, key = profile_key.split(".")
    return f"[{section}] {key} = {json.dumps(exact_names(kept))}"


def compute_ops(model) -> dict[str, str]:
    """The op type of each node of `model` that computes (not constants, shapes, casts, Q/DQ), by name, in graph order."""
    return {node.name: node.op_type for node in model.graph.node if node.op_type not in NOT_COMPUTE}


def ranked_nodes(reference: Path, candidate: Path, feeds: dict[str, np.ndarray], workdir: Path) -> tuple[list[tuple[str, ...]], str]:
    """The reference's nodes to keep in higher precision where the candidate's error grows, most first, in groups kept
    together, and why the first is first. A Constant that overflows goes with the nodes reading it (alone it changes
    nothing); a Q/DQ pair's error is kept off by not quantizing the nodes that read its tensor."""
    from pipeline.core.graph import GraphIndex
    from pipeline.core.onnxfile import load_onnx
    from pipeline.diagnose.compare import compare_models

    comparison = compare_models(reference, candidate, [feeds], workdir)
    rows = [r for r in comparison.nodes if r.growth > 0 and not math.isnan(r.growth)]
    graph = GraphIndex.of(load_onnx(reference))
    lowered = lowered_nodes(candidate)
    ranked: list[tuple[str, ...]] = []
    tops = []
    for row in rows:
        readers = [graph.nodes[i].name for i in graph.readers.get(row.tensor, ())] if row.op_type == "Constant" or row.qdq else []
        group = tuple(name for name in dict.fromkeys([*readers, *([] if row.qdq else [row.node])]) if name)
        if group and group not in ranked and (lowered is None or not lowered.isdisjoint(group)):
            ranked.append(group)
            tops.append(row)
    if not tops:
        return [], "no node that can be kept in higher precision adds error"
    top = tops[0]
    why = (f"NaN/Inf first at {top.node} ({top.op_type})" if math.isinf(top.error)
           else f"largest error growth at {top.node} ({top.op_type}): {top.input_error:.3g} -> {top.error:.3g}")
    return ranked, why


def lowered_nodes(candidate: Path) -> set[str] | None:
    """The nodes of a converted model that keeping in higher precision changes: in a Q/DQ model those reading a
    DequantizeLinear's output (its quantized nodes: its float parts stay as they are, FP16 too), else those reading
    or writing FP16/BF16 (an AutoCast model's); None where ONNX's shape inference cannot type the model. Keeping any
    other node is a trial that changes nothing (the error grows there from what came before: the default model's FP8
    repair ranked first an attention MatMul the preset leaves in float, and two such trials end the search)."""
    import onnx

    model = onnx.load(str(candidate), load_external_data=False)
    dequantized = {output for node in model.graph.node if node.op_type == "DequantizeLinear" for output in node.output}
    if dequantized:
        return {node.name for node in model.graph.node if not dequantized.isdisjoint(node.input)}
    try:
        typed = onnx.shape_inference.infer_shapes(model)
    except onnx.shape_inference.InferenceError:
        return None
    graph = typed.graph
    dtypes = {v.name: v.type.tensor_type.elem_type for v in (*graph.value_info, *graph.input, *graph.output)}
    dtypes.update({t.name: t.data_type for t in graph.initializer})
    low = {onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
    return {node.name for node in graph.node if any(dtypes.get(t) in low for t in (*node.input, *node.output))}


def _kept(groups: list[tuple[str, ...]]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(name for group in groups for name in group))


def search(attempt: Trial, attempt_seconds: float, rank: Callable[[Path], tuple[list[tuple[str, ...]], str]],
           trial: Callable[[tuple[str, ...]], Trial], compute: frozenset[str], gate: float, op_types: dict[str, str] | None = None) -> Repair:
    """The fewest of the ranked groups whose trial passes (doubling, then bisection), at most MAX_SHARE of the `compute` nodes
    (at least one); the prefixes end early when keeping more of them stalls (`stalled`), then whole op types are tried
    (`op_types`: each compute node's). No trial starts that would take the search past BUDGET times `attempt_seconds`."""
    started = time.perf_counter()
    ranked, why = rank(attempt.model)
    limit = max(1, int(MAX_SHARE * len(compute)))
    failed, passed, tried, k, spent = 0, None, [], 1, []

    def fitting(groups: list[tuple[str, ...]]) -> list[int]:
        return [k for k in range(1, len(groups) + 1) if len(compute.intersection(_kept(groups[:k]))) <= limit]

    def affordable() -> bool:
        elapsed = time.perf_counter() - started
        return elapsed + max([attempt_seconds, *spent]) <= BUDGET * attempt_seconds  # the next trial, as long as the longest yet

    def run(kept: tuple[str, ...]) -> Trial:
        trial_started = time.perf_counter()
        result = trial(kept)
        spent.append(time.perf_counter() - trial_started)
        tried.append((len(kept), result.figures["cosine_centered"]))
        return result

    fits = fitting(ranked)
    while fits and k <= fits[-1] and affordable():
        result = run(_kept(ranked[:k]))
        if result.passed:
            passed = result
            break
        failed = k
        if math.isnan(result.figures["cosine_centered"]):  # still an overflow: where, now that these are kept
            ranked = [*ranked[:k], *[g for g in rank(result.model)[0] if not set(g) <= set(result.kept)]]
            fits = fitting(ranked)
        if not fits or k >= fits[-1] or stalled([attempt.figures["cosine_centered"], *(c for _, c in tried)], gate):
            break
        k = min(2 * k, fits[-1])
    passed_at = k
    while passed is not None and passed_at - failed > 1 and affordable():
        middle = (failed + passed_at) // 2
        result = run(_kept(ranked[:middle]))
        if result.passed:
            passed, passed_at = result, middle
        else:
            failed = middle
    if passed is None and op_types:
        passed, why = _by_op_type(ranked, op_types, limit, run, affordable, why)
    kept = passed.kept if passed else _kept(ranked[:fits[-1]] if fits else [])
    return Repair(kept, why, len(compute.intersection(kept)), len(compute), len(tried), time.perf_counter() - started, attempt_seconds, passed,
                  tuple(tried))


def op_type_groups(ranked: list[tuple[str, ...]], op_types: dict[str, str], limit: int) -> list[tuple[str, tuple[str, ...]]]:
    """(op type, every compute node of it) for the op types of the ranked nodes, in the order of their first ranked node,
    those of at most `limit` nodes and more than one (a single node is a ranked prefix already)."""
    members: dict[str, list[str]] = {}
    for name, op in op_types.items():
        members.setdefault(op, []).append(name)
    order = dict.fromkeys(op_types[name] for group in ranked for name in group if name in op_types)
    return [(op, tuple(members[op])) for op in order if 1 < len(members[op]) <= limit]


def _by_op_type(ranked: list[tuple[str, ...]], op_types: dict[str, str], limit: int, run: Callable[[tuple[str, ...]], Trial],
                affordable: Callable[[], bool], why: str) -> tuple[Trial | None, str]:
    """The first op type (op_type_groups) whose nodes all kept pass, then its first half while that passes and the budget
    lasts; the trial that passed and why, or None."""
    for op, group in op_type_groups(ranked, op_types, limit):
        if not affordable():
            return None, why
        passed = run(group)
        if not passed.passed:
            continue
        while len(group) > 1 and affordable():
            half = run(group[:len(group) // 2])
            if not half.passed:
                break
            passed, group = half, half.kept
        return passed, f"{why}; the error is spread over the {op} nodes: {len(group)} of them kept"
    return None, why


def stalled(cosines: list[float], gate: float) -> bool:
    """The last two trials (after the attempt) each closed less than STALL of the gap to the gate the one before left, NaN
    aside: the error is spread over the graph, more of these nodes will not hold it (mobilevit's random weights, FP16
    subnormals in every layer)."""
    numbers = [c for c in cosines if not math.isnan(c)]
    return len(numbers) >= 3 and all(after - before < STALL * (gate - before) for before, after in zip(numbers[-3:-1], numbers[-2:]))


def ranking(reference: Path, batches: list[dict[str, np.ndarray]], workdir: Path) -> Callable[[Path], tuple[list[tuple[str, ...]], str]]:
    """`ranked_nodes` of a candidate against `reference` on the first held-out sample (row 0 of the first batch: the
    comparison keeps every tensor of the graph), or on the first batch where the model takes no single row."""
    from pipeline.core.errors import PipelineError

    def rank(candidate: Path) -> tuple[list[tuple[str, ...]], str]:
        try:
            return ranked_nodes(reference, candidate, {name: array[:1] for name, array in batches[0].items()}, workdir)
        except PipelineError:
            return ranked_nodes(reference, candidate, batches[0], workdir)

    return rank


def repair_gate(job, source: Path, batches: list[dict[str, np.ndarray]], minimum: float, first: Trial, started: float,
                convert_kept: Callable[[tuple[str, ...], Path], Any], figures_of: Callable[[Any, Path], dict[str, Any]]) -> Repair | None:
    """The search, when `first` (the stage's attempt, its model at `first.model`, begun at `started`: start_clock's time)
    fails the gate and repair is on (None otherwise). A trial is `convert_kept(kept, path)` (the stage's conversion with
    `kept` too) and `figures_of(result, path)` (its accuracy); the trial that passes replaces `first.model`."""
    from pipeline.core.fileio import external_data_file
    from pipeline.core.onnxfile import load_onnx

    attempt_seconds = time.perf_counter() - started
    if first.passed or not job.settings.repair:
        return None
    job.status("accuracy below the gate: searching for the nodes to keep in higher precision")
    numbers = itertools.count(1)

    def trial(kept: tuple[str, ...]) -> Trial:
        path = Path(folder) / f"trial.{next(numbers)}" / first.model.name  # the model's own name: its data file's name is in it
        path.parent.mkdir()
        job.status(f"repair: trying with {len(kept)} node{'s' * (len(kept) != 1)} kept in higher precision")
        result = convert_kept(kept, path)
        figures = figures_of(result, path)
        passed = figures["cosine_centered"] >= minimum
        return Trial(kept, path, figures, passed, result if passed else None)  # a failed trial's session and its arena go now

    with tempfile.TemporaryDirectory(dir=job.out, prefix=".repair-") as folder:
        ops = compute_ops(load_onnx(source))
        found = search(first, attempt_seconds, ranking(source, batches, Path(folder)), trial, frozenset(ops), minimum, ops)
        if found.passed is not None:
            if external_data_file(found.passed.model).is_file():
                os.replace(external_data_file(found.passed.model), external_data_file(first.model))
            os.replace(found.passed.model, first.model)
    return found


def recorded(found: Repair | None, profile_key: str) -> dict[str, Any]:
    """The manifest's `repair` metrics, when a repair passed the gate."""
    return {"repair": found.metrics(profile_key)} if found is not None and found.passed is not None else {}


def stage_note(metrics: dict[str, Any], kept_as: str) -> str:
    """The stage line's `3 nodes kept in FP32: a, b, c (why; pin: [quant] ...); ` when the repair kept any (`kept_as`: "in FP32")."""
    fix = metrics.get("repair")
    if not fix:
        return ""
    kept = fix["kept"]
    shown = ", ".join(kept[:5]) + (f" and {len(kept) - 5} more" if len(kept) > 5 else "")
    return f"{len(kept)} node{'s' * (len(kept) != 1)} kept {kept_as}: {shown} ({fix['why']}; pin: {fix['pin']}); "


def failed_note(found: Repair | None, kept_as: str) -> str:
    """What the gate's message adds when the search found no set within MAX_SHARE."""
    if found is None or found.passed is not None:
        return ""
    if not found.kept:
        return f" (repair: {found.why} in the per-node comparison, so none to keep)"
    return (f" (repair: keeping {kept_as} the nodes where the error grows most, or every node of one op type, does not pass: cosine_centered "
            f"{', '.join(f'{cosine:.5f} with {kept}' for kept, cosine in found.tried)}; at most {found.kept_compute} nodes, "
            f"{MAX_SHARE:.0%} of the {found.compute_nodes} compute nodes; {found.trials} trials in {found.search_seconds:.0f} s, "
            f"the attempt took {found.attempt_seconds:.0f} s, the search may take {BUDGET:g}x that)")
