"""The engine TensorRT will build from an ONNX model, predicted without TensorRT or a GPU, as the plan and report
a real engine is read into (so `report`, `diff` and the fusion map show it alike). Its rules are data: the lint's
Q/DQ rules (pipeline/core/qdq.py) and the fusion and Myelin rules (trt/predict/rules.py), each citing its source."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline.core.errors import InputError
from pipeline.core.qdq import CNN_RULES, PlacementRules
from trt.plan import paused_gc
from trt.predict.rules import rule
from trt.views import Report

PRECISIONS = ("auto", "fp32", "fp16", "int8", "fp8", "best")
TRT_VERSIONS = (8, 10, 11)
EXAMPLES = 6  # nodes a finding names before "and N more"


@dataclass
class Prediction(Report):
    """A predicted engine's report, with what it was predicted for and why its Q/DQ layers and region boundaries are where they are."""

    target: Any = None
    reasons: list = field(default_factory=list)
    graph: Any = field(default=None, repr=False)  # the ONNX graph it was predicted from (trt/onnx_graph.py), for scoring

    def to_json(self) -> dict[str, Any]:
        def reason(r) -> dict[str, Any]:
            known = rule(r.rule)
            return asdict(r) | {"behaviour": known.behaviour, "source": known.source, "fix": known.fix}

        return super().to_json() | {"predicted": True, "target": asdict(self.target), "reasons": [reason(r) for r in self.reasons]}

    @property
    def standalone_qdq(self) -> int:
        return len(self.breakdown.qdq_layers)

    @property
    def myelin_regions(self) -> int:
        return self.summary.myelin_graphs


def predict(model, rules: PlacementRules = CNN_RULES, precision: str = "auto", trt_major: int = 10, max_sequence: int | None = None,
            source: str = "model.onnx") -> Prediction:
    """The engine TensorRT `trt_major`.x builds from `model` (a ModelProto) at `precision` ("auto": the ONNX's own
    types, as a strongly typed build); `rules`: the placement rules the lint applies to this model's family."""
    from pipeline.core.scopes import inline_functions_proto
    from trt.onnx_graph import graph_of_model
    from trt.predict.assemble import Assembly, target_of
    from trt.predict.engine import build
    from trt.predict.graph import PredictGraph
    from trt.report import build_report

    if precision not in PRECISIONS or trt_major not in TRT_VERSIONS:
        raise InputError(f"predict: precision {precision!r} for TensorRT {trt_major}: use a precision of {', '.join(PRECISIONS)} "
                         f"and a TensorRT major version of {', '.join(map(str, TRT_VERSIONS))}")
    with paused_gc():
        g = PredictGraph(inline_functions_proto(model))  # TensorRT's parser inlines local functions
        target = target_of(g, precision, trt_major)
        plan, reasons = Assembly(g, build(g, rules, trt_major, max_sequence), target).plan(source)
        graph = graph_of_model(g.model, source)
        report = build_report(plan, graph)
    found = vars(report) | {"verdict": f"predicted {_weights(report.verdict, target)}", "findings": _findings(reasons) + report.findings}
    return Prediction(**found, target=target, reasons=reasons, graph=graph)


def _weights(verdict: str, target) -> str:
    """The verdict with a weight-only model's weights named: "FP32 engine with INT4 weights (72 GEMMs, ...): ..."."""
    from trt.parsers.prediction import weight_only_phrase

    head, sep, rest = verdict.partition(" engine: ")
    return f"{head} engine with {weight_only_phrase(*target.weight_only)}: {rest}" if target.weight_only and sep else verdict


def _findings(reasons: list) -> list[str]:
    """One line per (kind, rule): how many, which nodes, what to change."""
    lines = []
    groups: dict[tuple[str, str], list] = {}
    for reason in reasons:
        groups.setdefault((reason.kind, reason.rule), []).append(reason)
    what = {"standalone": ("standalone Q/DQ layer", "standalone Q/DQ layers"), "cut": ("Myelin region cut", "Myelin region cuts"),
            "float": ("layer left in float or unfused", "layers left in float or unfused"),
            "boundary": ("Myelin region boundary", "Myelin region boundaries"), "copy": ("format copy layer", "format copy layers")}
    for (kind, rule_id), found in groups.items():
        known = rule(rule_id)
        nodes = list(dict.fromkeys(f"{r.layer} (by {r.node})" if r.layer and r.layer != r.node else r.node for r in found))
        more = f" and {len(nodes) - EXAMPLES} more" if len(nodes) > EXAMPLES else ""
        fix = "" if known.fix.startswith("nothing to change") else f"; fix: {known.fix}"
        lines.append(f"{len(nodes)} {what[kind][len(nodes) != 1]} [{rule_id}]: {', '.join(nodes[:EXAMPLES])}{more}: "
                     f"{known.behaviour} ({known.source}){fix}")
    return lines


def counts(prediction: Prediction) -> dict[str, int]:
    """What the stage line says: layers, Myelin regions, standalone Q/DQ."""
    return {"layers": prediction.summary.layers, "myelin_regions": prediction.myelin_regions, "standalone_qdq": prediction.standalone_qdq,
            "reasons": dict(Counter(r.rule for r in prediction.reasons if r.kind in ("standalone", "cut", "float")))}
